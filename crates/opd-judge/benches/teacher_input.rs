//! The teacher's input of one OPD turn, built as before (render the hinted conversation, encode all
//! of it) and from the turn's encoded prompt (`teacher_input_ids`: only the hinted message and what
//! the prompt does not hold are encoded), in the same run, beside what capture spends on the same
//! turn in RL mode. Agent-shaped sessions, as `loadgen agent` sends them: its system prompt and 20
//! tools, user asks, tool calls with 2–4 kB results, replies of a few hundred words. Both kinds of
//! turn: re-tokenized (the prompt ids are the capture's exact encode) and engine ids (the prompt is
//! encoded from the session's previous one, as the session buffer keeps it). The Qwen3 tokenizer of
//! `../shared/fixtures/qwen3` when present, else the embedded mini model.
//! Run: `cargo bench -p ps-opd-judge --bench teacher_input -- [--asks N] [--reps R]`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use ps_chat_template::{ChatTokenizer, EncodedPrefix, SharedPrefixCache, TurnInput};
use ps_opd_judge::{TeacherResponse, teacher_input_ids, teacher_input_text};
use serde_json::{Value, json};

/// Options, after `--` (`--bench` and a filter, as cargo passes them, are accepted and ignored).
#[derive(clap::Parser)]
struct Args {
    #[arg(long, default_value_t = 20)]
    asks: usize,
    #[arg(long, default_value_t = 7)]
    reps: usize,
    #[arg(long, hide = true)]
    bench: bool,
    #[arg(hide = true)]
    filter: Option<String>,
}

fn tokenizer() -> (ChatTokenizer, &'static str) {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/qwen3");
    match ChatTokenizer::from_dir(&dir) {
        Ok(t) => (t, "Qwen3 (../shared/fixtures/qwen3)"),
        Err(_) => (ChatTokenizer::mini(), "the embedded mini model"),
    }
}

const HINT: &str = "Before answering, run the failing test and quote its first error line.";

fn reply(words: usize, seed: usize) -> String {
    const WORDS: &[&str] = &[
        "the", "handler", "retries", "after", "a", "503", "so", "we", "check", "config", "loader",
        "and", "its", "error", "path;", "then", "the", "test", "passes.",
    ];
    (0..words)
        .map(|i| WORDS[(i * 7 + seed) % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// One main turn: the request's messages and the model's answer.
struct Turn {
    messages: Vec<Value>,
    answer: Value,
}

/// The main turns of one agent session of `asks` user asks: after each ask the model calls a
/// tool 6 times in 10, its result comes back and the model answers (two main turns), else it
/// answers at once (one).
fn session(asks: usize) -> Vec<Turn> {
    let tools_names = ["read_file", "run_command", "search_code"];
    let mut history =
        vec![json!({"role": "system", "content": ps_loadgen::agent::system_prompt()})];
    let mut turns = Vec::new();
    for i in 0..asks {
        history.push(json!({"role": "user", "content": ps_loadgen::agent::user_message(1, 0, i)}));
        let answer = json!({"role": "assistant", "content": reply(120 + (i * 53) % 300, i),
                            "reasoning_content": reply(40, i + 1)});
        if i % 10 < 6 {
            let tool = tools_names[i % tools_names.len()];
            let call = json!({"role": "assistant", "content": "", "reasoning_content": reply(30, i + 2),
                "tool_calls": [{"id": format!("call_{i}"), "type": "function",
                    "function": {"name": tool, "arguments": "{\"path\": \"src/service/module_3.rs\"}"}}]});
            turns.push(Turn {
                messages: history.clone(),
                answer: call.clone(),
            });
            history.push(call);
            history.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"),
                                "content": ps_loadgen::agent::tool_result(1, 0, i, tool)}));
        }
        turns.push(Turn {
            messages: history.clone(),
            answer: answer.clone(),
        });
        history.push(answer);
    }
    turns
}

fn input_of<'a>(t: &'a Turn, tools: &'a Value) -> TurnInput<'a> {
    TurnInput {
        messages: &t.messages,
        tools: Some(tools),
        response_message: &t.answer,
        template_kwargs: None,
    }
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e3
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    let asks = args.asks;
    let reps = args.reps;
    let (tok, which) = tokenizer();
    let tools = ps_loadgen::agent::tools();
    let turns = session(asks);
    let input = |t| input_of(t, tools);
    let splits: Vec<_> = turns
        .iter()
        .map(|t| tok.split_turn(&input(t)).unwrap())
        .collect();
    println!(
        "OPD teacher input per turn, {which}: one agent session of {asks} asks ({} main turns, \
         {} to {} prompt tokens); median of {reps} runs, ms",
        turns.len(),
        splits[0].prompt_ids.len(),
        splits[splits.len() - 1].prompt_ids.len()
    );
    // Exactness first: the new path gives the ids of the old one for every turn.
    let mut prev: Option<EncodedPrefix> = None;
    let shared = SharedPrefixCache::default();
    for (t, s) in turns.iter().zip(&splits) {
        let old = tok
            .encode(
                &teacher_input_text(&tok, &t.messages, Some(tools), HINT, &s.response_text, None)
                    .unwrap(),
            )
            .unwrap();
        let prompt = tok.encoded_from(s.prompt_text.clone(), s.prompt_ids.clone());
        let response = tok.encoded_from(s.response_text.clone(), s.response_ids.clone());
        let new = teacher_input_ids(
            &tok,
            &t.messages,
            Some(tools),
            HINT,
            TeacherResponse::Text(&response),
            None,
            &prompt,
        )
        .unwrap();
        assert_eq!(old, new, "re-tokenized");
        let canonical = tok
            .encode_prompt_cached(&input(t), &s.prompt_text, prev.as_ref(), Some(&shared))
            .unwrap();
        assert_eq!(canonical, prompt, "the engine path's prompt");
        prev = Some(canonical);
    }

    // Per turn, every path over the whole session, `reps` times; each path's times per turn.
    let n = turns.len();
    let mut times: Vec<[Vec<Duration>; 6]> = (0..n).map(|_| Default::default()).collect();
    for _ in 0..reps {
        let shared = SharedPrefixCache::default();
        let mut capture_prev: Option<EncodedPrefix> = None;
        let mut teacher_prev: Option<EncodedPrefix> = None;
        for (k, (t, s)) in turns.iter().zip(&splits).enumerate() {
            let timed = |f: &mut dyn FnMut()| {
                let started = Instant::now();
                f();
                started.elapsed()
            };
            // RL capture, re-tokenized: render prompt and full text, encode what the turn adds.
            times[k][0].push(timed(&mut || {
                capture_prev = tok
                    .split_turn_incremental(&input(t), capture_prev.as_ref())
                    .unwrap()
                    .1;
            }));
            // RL capture, engine ids: render only.
            times[k][1].push(timed(&mut || {
                std::hint::black_box(tok.render_turn(&input(t)).unwrap());
            }));
            // The teacher's input before: render the hinted conversation, encode all of it.
            times[k][2].push(timed(&mut || {
                let text = teacher_input_text(
                    &tok,
                    &t.messages,
                    Some(tools),
                    HINT,
                    &s.response_text,
                    None,
                )
                .unwrap();
                std::hint::black_box(tok.encode(&text).unwrap());
            }));
            times[k][3].push(timed(&mut || {
                let text =
                    teacher_input_text(&tok, &t.messages, Some(tools), HINT, "", None).unwrap();
                let mut ids = tok.encode(&text).unwrap();
                ids.extend_from_slice(&s.response_ids);
                std::hint::black_box(ids);
            }));
            // After, re-tokenized: from the turn's own prompt ids.
            times[k][4].push(timed(&mut || {
                let prompt = tok.encoded_from(s.prompt_text.clone(), s.prompt_ids.clone());
                let response = tok.encoded_from(s.response_text.clone(), s.response_ids.clone());
                std::hint::black_box(
                    teacher_input_ids(
                        &tok,
                        &t.messages,
                        Some(tools),
                        HINT,
                        TeacherResponse::Text(&response),
                        None,
                        &prompt,
                    )
                    .unwrap(),
                );
            }));
            // After, engine ids: the prompt from the session's previous one, then the hinted one.
            times[k][5].push(timed(&mut || {
                let prompt = tok
                    .encode_prompt_cached(
                        &input(t),
                        &s.prompt_text,
                        teacher_prev.as_ref(),
                        Some(&shared),
                    )
                    .unwrap();
                std::hint::black_box(
                    teacher_input_ids(
                        &tok,
                        &t.messages,
                        Some(tools),
                        HINT,
                        TeacherResponse::EngineIds(&s.response_ids),
                        None,
                        &prompt,
                    )
                    .unwrap(),
                );
                teacher_prev = Some(prompt);
            }));
        }
    }
    let medians: Vec<[f64; 6]> = times.into_iter().map(|t| t.map(median)).collect();
    println!(
        "| main turn | prompt tokens | RL capture, re-tokenized | RL capture, engine ids | teacher before, re-tokenized | teacher before, engine ids | teacher after, re-tokenized | teacher after, engine ids |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let shown: Vec<usize> = [0, n / 4, n / 2, 3 * n / 4, n - 1]
        .into_iter()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    for k in shown {
        let m = medians[k];
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            k + 1,
            splits[k].prompt_ids.len(),
            m[0],
            m[1],
            m[2],
            m[3],
            m[4],
            m[5]
        );
    }
    let total = |i: usize| medians.iter().map(|m| m[i]).sum::<f64>();
    println!(
        "| whole session | | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
        total(0),
        total(1),
        total(2),
        total(3),
        total(4),
        total(5)
    );
    println!(
        "OPD per turn (capture + teacher) over RL (capture), whole session: re-tokenized {:.2} before, {:.2} after; \
         engine ids {:.2} before, {:.2} after",
        (total(0) + total(2)) / total(0),
        (total(0) + total(4)) / total(0),
        (total(1) + total(3)) / total(1),
        (total(1) + total(5)) / total(1),
    );
}
