//! The cost of one turn's tokenization (render + split + encode) at turn 1 and turn 50 of a
//! 50-turn conversation, with the whole prompt encoded again (`split_turn`) and incrementally
//! (`split_turn_incremental` from the previous turn), in the same run. Uses the Qwen3 fixture
//! tokenizer when `../shared` is there, else the mini model.
//! Run: `cargo bench -p ps-chat-template --bench incremental`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Instant;

use ps_chat_template::{ChatTokenizer, EncodedPrefix, TurnInput};
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
}
