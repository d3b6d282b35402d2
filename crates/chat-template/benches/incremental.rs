//! The cost of one turn's tokenization (render + split + encode) at turn 1 and turn 50 of a
//! 50-turn conversation, with the whole prompt encoded again (`split_turn`) and incrementally
//! (`split_turn_incremental` from the previous turn), in the same run; then the first turn of
//! sessions that share an agent-sized system prompt and 20 tools, without and with the cache of
//! shared prefixes (`split_turn_cached`). Uses the Qwen3 fixture
//! tokenizer when `../shared` is there, else the mini model.
//! Run: `cargo bench -p ps-chat-template --bench incremental`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Instant;

use ps_chat_template::{ChatTokenizer, EncodedPrefix, SharedPrefixCache, TurnInput};
use serde_json::{Value, json};

fn tokenizer() -> (ChatTokenizer, &'static str) {
    let dir = std::env::var_os("POLICY_SERVING_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
        .join("fixtures/qwen3");
    if dir.join("tokenizer.json").is_file() {
        let tok = ChatTokenizer::from_files(
            &dir.join("tokenizer.json"),
            &dir.join("tokenizer_config.json"),
        )
        .unwrap();
        (tok, "Qwen3")
    } else {
        (ChatTokenizer::mini(), "mini")
    }
}

fn main() {
    let (tok, name) = tokenizer();
    let turns = 50;
    let reps = 30;
    let mut messages =
        vec![json!({"role": "system", "content": "You are a coding agent. ".repeat(40)})];
    let mut per_turn: Vec<(Vec<Value>, Value)> = Vec::new();
    for i in 0..turns {
        messages.push(json!({"role": "user", "content": format!("Step {i}: please refactor module {i} and explain the change in two sentences.")}));
        let answer = json!({"role": "assistant", "content": format!("Refactored module {i}: extracted a helper and renamed two functions. Tests pass."),
                            "reasoning_content": "Look at the module, find the duplication, extract it."});
        per_turn.push((messages.clone(), answer.clone()));
        messages.push(answer);
    }
    let time = |f: &mut dyn FnMut()| {
        let started = Instant::now();
        for _ in 0..reps {
            f();
        }
        started.elapsed().as_secs_f64() * 1e3 / f64::from(reps)
    };
    let input = |k: usize| TurnInput {
        messages: &per_turn[k].0,
        tools: None,
        response_message: &per_turn[k].1,
        template_kwargs: None,
    };
    let full_1 = time(&mut || {
        tok.split_turn(&input(0)).unwrap();
    });
    let full_50 = time(&mut || {
        tok.split_turn(&input(turns - 1)).unwrap();
    });
    let prev_1: Option<EncodedPrefix> = None;
    let (_, prev_49) = tok.split_turn_incremental(&input(turns - 2), None).unwrap();
    let inc_1 = time(&mut || {
        tok.split_turn_incremental(&input(0), prev_1.as_ref())
            .unwrap();
    });
    let inc_50 = time(&mut || {
        tok.split_turn_incremental(&input(turns - 1), prev_49.as_ref())
            .unwrap();
    });
    let prompt_tokens = tok.split_turn(&input(turns - 1)).unwrap().prompt_ids.len();
    println!(
        "tokenization per turn, {name} tokenizer, {turns}-turn conversation ({prompt_tokens} prompt tokens at turn {turns}), ms:"
    );
    println!(
        "  full re-encode : turn 1 {full_1:.3}  turn {turns} {full_50:.3}  ratio {:.1}",
        full_50 / full_1
    );
    println!(
        "  incremental    : turn 1 {inc_1:.3}  turn {turns} {inc_50:.3}  ratio {:.1}  (target <= 2)",
        inc_50 / inc_1
    );
    println!(
        "  turn {turns}, incremental vs full: {:.1}x faster",
        full_50 / inc_50
    );

    // The whole conversation, turn after turn, as the capture workers see it: tokens per second
    // (prompt + response tokens of every turn), to compare with
    // `benches/transformers_compare.py` on the same conversation.
    let tokens: usize = (0..turns)
        .map(|k| {
            let t = tok.split_turn(&input(k)).unwrap();
            t.prompt_ids.len() + t.response_ids.len()
        })
        .sum();
    let full_all = time(&mut || {
        for k in 0..turns {
            tok.split_turn(&input(k)).unwrap();
        }
    });
    let inc_all = time(&mut || {
        let mut prev: Option<EncodedPrefix> = None;
        for k in 0..turns {
            prev = tok
                .split_turn_incremental(&input(k), prev.as_ref())
                .unwrap()
                .1;
        }
    });
    println!(
        "  whole conversation ({tokens} tokens): full {full_all:.1} ms ({:.0} tokens/s), incremental {inc_all:.1} ms ({:.0} tokens/s)",
        tokens as f64 / (full_all / 1e3),
        tokens as f64 / (inc_all / 1e3)
    );

    shared_prefix(&tok, name, reps);
}

/// The first turn of 64 sessions with the same ~13 kB system prompt and 20 tools (each session's
/// own user message), as capture encodes it without and with the cache of shared prefixes.
fn shared_prefix(tok: &ChatTokenizer, name: &str, reps: u32) {
    let system: String = (0..120)
        .map(|i| format!("Rule {i}: read the code and its tests before changing module {i}; explain each step. "))
        .collect();
    let tools = Value::Array(
        (0..20)
            .map(|i| json!({"type": "function", "function": {"name": format!("tool_{i}"),
                "description": format!("Tool number {i}: does one thing to the workspace and reports it."),
                "parameters": {"type": "object", "properties": {
                    "path": {"type": "string", "description": "A path relative to the workspace."},
                    "limit": {"type": "integer", "description": "At most this many results."}},
                    "required": ["path"]}}}))
            .collect(),
    );
    let sessions = 64;
    let firsts: Vec<(Vec<Value>, Value)> = (0..sessions)
        .map(|s| {
            (
                vec![
                    json!({"role": "system", "content": system}),
                    json!({"role": "user", "content": format!("Session {s}: find the bug in module {s} and fix it.")}),
                ],
                json!({"role": "assistant", "content": format!("Looking at module {s} first.")}),
            )
        })
        .collect();
    let input = |k: usize| TurnInput {
        messages: &firsts[k].0,
        tools: Some(&tools),
        response_message: &firsts[k].1,
        template_kwargs: None,
    };
    let time_all = |f: &mut dyn FnMut(usize)| {
        let started = Instant::now();
        for _ in 0..reps {
            for k in 0..sessions {
                f(k);
            }
        }
        started.elapsed().as_secs_f64() * 1e3 / f64::from(reps) / sessions as f64
    };
    let alone = time_all(&mut |k| {
        tok.split_turn_incremental(&input(k), None).unwrap();
    });
    let shared = SharedPrefixCache::default();
    let cached = time_all(&mut |k| {
        tok.split_turn_cached(&input(k), None, Some(&shared))
            .unwrap();
    });
    let prompt_tokens = tok.split_turn(&input(0)).unwrap().prompt_ids.len();
    println!(
        "first turn of {sessions} sessions sharing a system prompt and 20 tools ({prompt_tokens} prompt tokens), {name} tokenizer, ms per turn:"
    );
    println!(
        "  each session encodes it: {alone:.3}  shared prefix cache: {cached:.3}  ({:.1}x faster; {:?})",
        alone / cached,
        shared.stats()
    );
}
