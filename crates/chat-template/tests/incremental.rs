//! Incremental tokenization gives exactly the full encode: on multi-turn conversations with the
//! mini model and (when the fixtures are there) the real Qwen3 tokenizer and both templates, and on
//! random contents that try to break the split (special-token text inside messages, combining
//! characters that NFC composes, think tags, tool messages). The same holds when sessions share
//! their system prompt and tools through a [`SharedPrefixCache`], also while it evicts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use ps_chat_template::{ChatTokenizer, EncodedPrefix, SharedPrefixCache, TurnInput};
use serde_json::{Value, json};

use crate::common;
use common::qwen3;

/// Plays a conversation turn by turn (each turn: `user[i]`, then the assistant's answer) and checks
/// that the incremental split equals the full one at every turn. Returns how many turns reused.
fn check_conversation(
    tok: &ChatTokenizer,
    users: &[String],
    answers: &[Value],
    tools: Option<&Value>,
) -> usize {
    let mut messages: Vec<Value> =
        vec![json!({"role": "system", "content": "You are a careful agent."})];
    let mut prev: Option<EncodedPrefix> = None;
    let mut reused = 0;
    for (user, answer) in users.iter().zip(answers) {
        messages.push(json!({"role": if user.starts_with("tool:") { "tool" } else { "user" }, "content": user}));
        let input = TurnInput {
            messages: &messages,
            tools,
            response_message: answer,
            template_kwargs: None,
        };
        let full = tok.split_turn(&input).unwrap();
        // Reuse happens when the common prefix with the previous prompt reaches past an added-token
        // boundary that covers most of this prompt's ids.
        if prev.as_ref().is_some_and(|p| {
            let common = p
                .text
                .bytes()
                .zip(full.prompt_text.bytes())
                .take_while(|(a, b)| a == b)
                .count();
            p.boundaries
                .iter()
                .any(|(end, n)| *end <= common && *n * 2 > full.prompt_ids.len())
        }) {
            reused += 1;
        }
        let (inc, next) = tok.split_turn_incremental(&input, prev.as_ref()).unwrap();
        assert_eq!(inc, full, "turn {} differs", messages.len());
        if let Some(p) = &next {
            assert_eq!(
                p.ids,
                tok.encode(&p.text).unwrap(),
                "the kept ids are the text's own"
            );
            for (end, n) in &p.boundaries {
                let expected = tok.encode(&p.text[..*end]).unwrap();
                assert_eq!(&p.ids[..*n], expected.as_slice(), "boundary {end}");
            }
        }
        prev = next;
        messages.push(answer.clone());
    }
    reused
}

fn answers(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| match i % 3 {
            0 => json!({"role": "assistant", "content": format!("Step {i} done."), "reasoning_content": "Think first."}),
            1 => json!({"role": "assistant", "content": "", "tool_calls": [{"id": format!("call_{i}"), "type": "function",
                        "function": {"name": "search", "arguments": "{\"q\": \"paris\"}"}}]}),
            _ => json!({"role": "assistant", "content": format!("Answer {i} with <think>inline</think> text")}),
        })
        .collect()
}

#[test]
fn a_long_conversation_reuses_every_prefix_and_equals_the_full_encode() {
    let users: Vec<String> = (0..40)
        .map(|i| {
            if i % 3 == 2 {
                format!("tool:{{\"result\": {i}}}")
            } else {
                format!("Request number {i}: go on.")
            }
        })
        .collect();
    let tools = json!([{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]);
    let mini = ChatTokenizer::mini();
    let mut tokenizers = vec![&mini];
    tokenizers.extend(qwen3());
    for tok in &tokenizers {
        let reused = check_conversation(tok, &users, &answers(users.len()), Some(&tools));
        assert!(
            reused >= users.len() / 2,
            "the incremental path ran on most turns ({reused}) for {tok:?}"
        );
    }
}

/// Plays `sessions` conversations one after the other, session `s` with the system prompt
/// `systems[s % len]`, every turn through `shared` (and the session's own previous prompt), and
/// checks each turn against the plain full split.
fn check_shared_sessions(
    tok: &ChatTokenizer,
    shared: &SharedPrefixCache,
    systems: &[String],
    sessions: usize,
    users: &[String],
    answers: &[Value],
    tools: Option<&Value>,
) {
    for s in 0..sessions {
        let mut messages = vec![json!({"role": "system", "content": systems[s % systems.len()]})];
        let mut prev: Option<EncodedPrefix> = None;
        for (t, (user, answer)) in users.iter().zip(answers).enumerate() {
            messages.push(json!({"role": "user", "content": format!("{user} (session {s})")}));
            let input = TurnInput {
                messages: &messages,
                tools,
                response_message: answer,
                template_kwargs: None,
            };
            let full = tok.split_turn(&input).unwrap();
            let (cached, next) = tok
                .split_turn_cached(&input, prev.as_ref(), Some(shared))
                .unwrap();
            assert_eq!(cached, full, "session {s} turn {t} differs ({tok:?})");
            // Without the session's own prefix (as after its expiry): the shared one alone.
            let (alone, _) = tok.split_turn_cached(&input, None, Some(shared)).unwrap();
            assert_eq!(
                alone, full,
                "session {s} turn {t} from the shared prefix alone"
            );
            prev = next;
            messages.push(answer.clone());
        }
    }
}

fn long_system(variant: usize) -> String {
    format!(
        "You are agent number {variant}. {}",
        "Read the code before changing it; run the tests; explain every step. ".repeat(8)
    )
}

fn agent_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "search", "description": "Search the web.",
         "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}},
        {"type": "function", "function": {"name": "read_file", "description": "Read a file.",
         "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
    ])
}

#[test]
fn sessions_with_one_system_prompt_encode_it_once_and_equal_the_full_encode() {
    let users: Vec<String> = (0..4).map(|i| format!("Request {i}: go on.")).collect();
    let tools = agent_tools();
    let mini = ChatTokenizer::mini();
    let mut tokenizers = vec![&mini];
    tokenizers.extend(qwen3());
    for tok in &tokenizers {
        let shared = SharedPrefixCache::default();
        check_shared_sessions(
            tok,
            &shared,
            &[long_system(0)],
            6,
            &users,
            &answers(users.len()),
            Some(&tools),
        );
        let stats = shared.stats();
        // The first session's first turn kept the prefix; every later lookup found it.
        assert_eq!(stats.inserts, 1, "{stats:?} for {tok:?}");
        assert_eq!(stats.entries, 1);
        assert!(stats.hits >= 6 * 4 - 1, "{stats:?}");
        assert_eq!(stats.misses, 1, "{stats:?}");
    }
}

#[test]
fn an_evicting_shared_cache_still_equals_the_full_encode() {
    let users: Vec<String> = (0..3).map(|i| format!("Request {i}: go on.")).collect();
    let tools = agent_tools();
    let systems: Vec<String> = (0..3).map(long_system).collect();
    let mini = ChatTokenizer::mini();
    let mut tokenizers = vec![&mini];
    tokenizers.extend(qwen3());
    for tok in &tokenizers {
        // Room for one system prompt and tools (with the mini model's long ids), not two.
        let one = {
            let probe = SharedPrefixCache::default();
            check_shared_sessions(
                tok,
                &probe,
                &systems[..1],
                1,
                &users[..1],
                &answers(1),
                Some(&tools),
            );
            probe.stats().bytes
        };
        let shared = SharedPrefixCache::new(one + one / 2);
        check_shared_sessions(
            tok,
            &shared,
            &systems,
            9,
            &users,
            &answers(users.len()),
            Some(&tools),
        );
        let stats = shared.stats();
        assert!(stats.evictions >= 8, "{stats:?} for {tok:?}");
        assert_eq!(stats.entries, 1);
        assert!(stats.bytes <= stats.max_bytes);
    }
}

fn content() -> impl Strategy<Value = String> {
    let pieces = prop::sample::select(vec![
        "hello",
        " world",
        "\n",
        "\n\n",
        "<|im_end|>",
        "<|im_start|>",
        "<think>",
        "</think>",
        "<tool_call>",
        "e\u{301}",
        "\u{1100}\u{1161}",
        "é",
        "数字123",
        "🙂",
        " ",
        "\t",
        "\\boxed{1}",
        "assistant",
    ]);
    prop::collection::vec(pieces, 0..12).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn random_contents_encode_incrementally_exactly(users in prop::collection::vec(content(), 1..6),
                                                    replies in prop::collection::vec(content(), 6)) {
        let answers: Vec<Value> = replies.iter().map(|r| json!({"role": "assistant", "content": r})).collect();
        let mini = ChatTokenizer::mini();
        let mut tokenizers = vec![&mini];
        tokenizers.extend(qwen3());
        for tok in &tokenizers {
            check_conversation(tok, &users, &answers[..users.len()], None);
        }
    }

    #[test]
    fn encode_incremental_equals_encode_for_any_prefix_history(a in content(), b in content()) {
        let tok = ChatTokenizer::mini();
        let first = format!("<|im_start|>user\n{a}<|im_end|>\n<|im_start|>assistant\n");
        let (ids1, prefix) = tok.encode_incremental(&first, None).unwrap();
        prop_assert_eq!(&ids1, &tok.encode(&first).unwrap());
        // The next text shares a prefix, then differs (as a re-rendered history can).
        let second = format!("<|im_start|>user\n{a}<|im_end|>\n<|im_start|>assistant\n{b}<|im_end|>\n<|im_start|>user\n{a}{b}<|im_end|>\n");
        let (ids2, _) = tok.encode_incremental(&second, prefix.as_ref()).unwrap();
        prop_assert_eq!(ids2, tok.encode(&second).unwrap());
    }
}

// Fewer cases: every case plays several sessions with both Qwen3 configs and the mini model.
proptest! {
    #![proptest_config(ProptestConfig { cases: 16, .. ProptestConfig::default() })]

    #[test]
    fn random_system_prompts_through_a_small_shared_cache_encode_exactly(
        systems in prop::collection::vec(content(), 1..4),
        users in prop::collection::vec(content(), 1..4),
        replies in prop::collection::vec(content(), 4),
        bound in 0usize..6_000,
    ) {
        // Long enough to be kept (the contents themselves try to break the boundaries).
        let systems: Vec<String> = systems.iter().map(|s| format!("{s}{}", long_system(0))).collect();
        let answers: Vec<Value> = replies.iter().map(|r| json!({"role": "assistant", "content": r})).collect();
        let tools = agent_tools();
        let mini = ChatTokenizer::mini();
        let mut tokenizers = vec![&mini];
        tokenizers.extend(qwen3());
        for tok in &tokenizers {
            let shared = SharedPrefixCache::new(bound);
            check_shared_sessions(tok, &shared, &systems, 4, &users, &answers[..users.len()], Some(&tools));
            let shared = SharedPrefixCache::new(bound);
            check_shared_sessions(tok, &shared, &systems, 3, &users, &answers[..users.len()], None);
        }
    }

    #[test]
    fn encode_cached_equals_encode_after_any_shared_prefix(a in content(), b in content()) {
        let tok = ChatTokenizer::mini();
        let shared = SharedPrefixCache::default();
        let system = format!("<|im_start|>system\n{a}{}<|im_end|>\n", long_system(1));
        let first = format!("{system}<|im_start|>user\n{b}<|im_end|>\n<|im_start|>assistant\n");
        let (ids, next) = tok.encode_cached(&first, None, Some(&shared)).unwrap();
        prop_assert_eq!(&ids, &tok.encode(&first).unwrap());
        // Keep the system part at its last boundary, as split_turn_cached does.
        let next = next.unwrap();
        let (end, n) = *next.boundaries.iter().rev().find(|(end, _)| *end <= system.len()).unwrap();
        shared.insert(&first[..end], &next.ids[..n]);
        let second = format!("{system}<|im_start|>user\n{a}{b}<|im_end|>\n");
        let (ids2, _) = tok.encode_cached(&second, None, Some(&shared)).unwrap();
        prop_assert_eq!(ids2, tok.encode(&second).unwrap());
    }
}
