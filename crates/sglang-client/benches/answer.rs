//! The chat path's single pass over a non-streamed answer (`Answer::parse`) on an agent-shaped
//! answer (the engine's prompt ids, the response ids and a log-prob per response token, each
//! entry with its `bytes` and a top-1 list, as `loadgen agent` gets them from the fake), against
//! `serde_json`'s validating skip of the same bytes (`IgnoredAny`) and a full tree parse,
//! measured in the same run; then what the capture thread reads from it (`Answer::rollout`,
//! engine ids included).
//! Run: `cargo bench -p ps-sglang-client --bench answer -- [--prompt-ids N] [--reps R]`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use ps_sglang_client::Answer;
use serde_json::{Value, json};

/// Options, after `--` (`--bench` and a filter, as cargo passes them, are accepted and ignored).
#[derive(clap::Parser)]
struct Args {
    #[arg(long, default_value_t = 12_000)]
    prompt_ids: usize,
    #[arg(long, default_value_t = 400)]
    reps: usize,
    #[arg(long, hide = true)]
    bench: bool,
    #[arg(hide = true)]
    filter: Option<String>,
}

/// An answer with `prompt` prompt ids and `response` sampled tokens.
fn answer(prompt: usize, response: usize) -> Bytes {
    // Ids spread like a real vocabulary's (1 to 6 digits).
    let id = |i: usize| ((i * 7919 + 13) % 151_000) as u64;
    // Entries as the engines write them (and the fake): the token, its bytes, a log-prob with
    // all its digits, and the top-1 list repeating them.
    let content: Vec<Value> = (0..response)
        .map(|i| {
            let (token, logprob) = (format!("w{i}"), -((i % 97) as f64) / 31.0 - 1e-3 / 7.0);
            json!({"token": token, "bytes": token.as_bytes(), "logprob": logprob,
                "top_logprobs": [{"token": token, "bytes": token.as_bytes(), "logprob": logprob}]})
        })
        .collect();
    let text: String = (0..response).map(|i| format!("w{i}")).collect();
    let body = json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "policy",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text, "reasoning_content": null, "tool_calls": null},
            "logprobs": {"content": content},
            "finish_reason": "stop",
            "matched_stop": 151645,
            "prompt_token_ids": (0..prompt).map(id).collect::<Vec<_>>(),
            "response_token_ids": (0..response).map(|i| id(i + prompt)).collect::<Vec<_>>(),
        }],
        "usage": {"prompt_tokens": prompt, "completion_tokens": response, "total_tokens": prompt + response},
        "metadata": {"weight_version": "default"},
    });
    Bytes::from(serde_json::to_vec(&body).unwrap())
}

/// The median time of one call of `f`, over `reps` calls.
fn median(reps: usize, mut f: impl FnMut()) -> Duration {
    let mut times: Vec<Duration> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    let prompt = args.prompt_ids;
    let reps = args.reps;
    let body = answer(prompt, 450);
    let mib = body.len() as f64 / (1 << 20) as f64;
    println!(
        "answer: {} bytes ({prompt} prompt ids, 450 tokens with log-probs); median of {reps} calls",
        body.len()
    );
    let rows: [(&str, Duration); 4] = [
        (
            "Answer::parse (the chat path's single pass)",
            median(reps, || {
                std::hint::black_box(Answer::parse("u", body.clone()).unwrap());
            }),
        ),
        (
            "serde_json IgnoredAny (validating skip)",
            median(reps, || {
                std::hint::black_box(
                    serde_json::from_slice::<serde::de::IgnoredAny>(&body).unwrap(),
                );
            }),
        ),
        (
            "serde_json Value (tree)",
            median(reps, || {
                std::hint::black_box(serde_json::from_slice::<Value>(&body).unwrap());
            }),
        ),
        ("Answer::rollout (the capture thread's read)", {
            let parsed = Answer::parse("u", body.clone()).unwrap();
            median(reps, || {
                std::hint::black_box(parsed.rollout().unwrap());
            })
        }),
    ];
    let base = rows[1].1.as_secs_f64();
    for (name, t) in rows {
        println!(
            "{name:<46} {:>8.1} µs  {:>7.0} MiB/s  {:>5.2} × IgnoredAny",
            t.as_secs_f64() * 1e6,
            mib / t.as_secs_f64(),
            t.as_secs_f64() / base
        );
    }
}
