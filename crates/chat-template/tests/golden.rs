//! Golden cases: every line of the Qwen3 fixtures must match transformers exactly.
//!
//! The fixtures live outside the repository (`$POLICY_SERVING_SHARED/fixtures/qwen3`, default
//! `<crate>/../../../shared`). Without them the tests print `SKIPPED` and pass, unless
//! `POLICY_SERVING_REQUIRE_FIXTURES=1` (CI), in which case they fail.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ps_chat_template::{ChatTokenizer, SharedPrefixCache, TurnInput, TurnTokens};
use serde_json::Value;

use ps_test_support::fixtures::qwen3_dir;

/// Runs every golden line of `golden` with `config` and panics with a list of the mismatching
/// fields of every case that differs.
fn run_golden(config: &str, golden: &str) {
    let Some(dir) = qwen3_dir() else { return };
    let tok = ChatTokenizer::from_files(&dir.join("tokenizer.json"), &dir.join(config)).unwrap();
    let text = std::fs::read_to_string(dir.join(golden)).unwrap();
    let mut total = 0;
    let mut failures = Vec::new();
    // Every case again through the cache of prefixes shared across sessions: a large one (each
    // case twice, so the second time reuses what the first kept), then one a byte too small for
    // all that the large one kept, so that it evicts. Each must give the same tokens as the plain
    // split.
    let large = SharedPrefixCache::default();
    let mut split = Vec::new();
    // Whether some case took the one-render path (its decoded prompt starts the whole render).
    let mut one_render = false;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        total += 1;
        let case: Value = serde_json::from_str(line).unwrap();
        let id = case["id"].as_str().unwrap_or("?").to_owned();
        let messages = case["messages"].as_array().unwrap();
        let input = TurnInput {
            messages,
            tools: case.get("tools"),
            response_message: &case["response_message"],
            template_kwargs: case.get("chat_template_kwargs").and_then(Value::as_object),
        };
        let got = match tok.split_turn(&input) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{id}: error {e}"));
                continue;
            }
        };
        let want: TurnTokens = serde_json::from_value(case.clone()).unwrap();
        for pass in ["shared", "shared again"] {
            match tok.split_turn_cached(&input, None, Some(&large)) {
                Ok((t, _)) if t == got => {}
                Ok(_) => failures.push(format!("{id}: {pass} cache gives other tokens")),
                Err(e) => failures.push(format!("{id}: {pass} cache: error {e}")),
            }
        }
        // An engine-id turn: its prompt text is the golden prompt ids decoded (what an engine
        // with this template sent), and one render of the conversation must give every text
        // exactly as transformers does.
        let known = tok.decode_verbatim(&want.prompt_ids, false);
        one_render |= got.prompt_is_prefix && known == got.prompt_text;
        match tok.render_turn_after(&input, Some(known)) {
            Ok(t)
                if (
                    &t.prompt_text,
                    &t.full_text,
                    &t.response_text,
                    t.prompt_is_prefix,
                ) == (
                    &want.prompt_text,
                    &want.full_text,
                    &want.response_text,
                    want.prompt_is_prefix,
                ) => {}
            Ok(t) => failures.push(format!(
                "{id}: rendered after the decoded prompt: {:?}, want {:?}",
                (&t.prompt_text, &t.response_text, t.prompt_is_prefix),
                (
                    &want.prompt_text,
                    &want.response_text,
                    want.prompt_is_prefix
                )
            )),
            Err(e) => failures.push(format!(
                "{id}: rendered after the decoded prompt: error {e}"
            )),
        }
        split.push((id.clone(), case.clone(), got.clone()));
        let mut bad = Vec::new();
        if got.prompt_text != want.prompt_text {
            bad.push(format!(
                "prompt_text\n  got  {:?}\n  want {:?}",
                got.prompt_text, want.prompt_text
            ));
        }
        if got.full_text != want.full_text {
            bad.push(format!(
                "full_text\n  got  {:?}\n  want {:?}",
                got.full_text, want.full_text
            ));
        }
        if got.response_text != want.response_text {
            bad.push("response_text".to_owned());
        }
        if got.prompt_is_prefix != want.prompt_is_prefix {
            bad.push("prompt_is_prefix".to_owned());
        }
        if got.prompt_ids != want.prompt_ids {
            bad.push("prompt_ids".to_owned());
        }
        if got.response_ids != want.response_ids {
            bad.push("response_ids".to_owned());
        }
        if !bad.is_empty() {
            failures.push(format!("{id}: {}", bad.join("; ")));
        }
    }
    let small = SharedPrefixCache::new(large.stats().bytes.saturating_sub(1));
    for _ in 0..2 {
        for (id, case, got) in &split {
            let input = TurnInput {
                messages: case["messages"].as_array().unwrap(),
                tools: case.get("tools"),
                response_message: &case["response_message"],
                template_kwargs: case.get("chat_template_kwargs").and_then(Value::as_object),
            };
            match tok.split_turn_cached(&input, None, Some(&small)) {
                Ok((t, _)) if &t == got => {}
                Ok(_) => failures.push(format!("{id}: the evicting cache gives other tokens")),
                Err(e) => failures.push(format!("{id}: the evicting cache: error {e}")),
            }
        }
    }
    eprintln!(
        "{golden} with {config}: {}/{total} cases match; shared prefixes {:?}, evicting {:?}",
        total - failures.len(),
        large.stats(),
        small.stats()
    );
    let (large, small) = (large.stats(), small.stats());
    assert!(
        large.inserts > 0 && large.hits > 0,
        "the shared cache was used: {large:?}"
    );
    assert!(small.evictions > 0, "the small cache evicted: {small:?}");
    assert!(
        one_render,
        "no case's decoded prompt starts its whole render"
    );
    assert!(total > 0, "{golden} has no cases");
    assert!(
        failures.is_empty(),
        "{} of {total} golden cases differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn golden_public_main_config() {
    run_golden("tokenizer_config.json", "golden_public.jsonl");
}

#[test]
fn golden_public_thinking_2507_config() {
    run_golden(
        "tokenizer_config.qwen3-4b-thinking-2507.json",
        "golden_public_thinking2507.jsonl",
    );
}
