//! What recognising sessions from their history (`server.session_inference`) costs per request,
//! next to the CPU the proxy spends on the same request anyway.
//!
//! Traffic shaped like an unmodified agent (OpenClaw): a ~40,000-character system prompt, 12 tools,
//! and a history that grows by a tool call, its result and a user message every turn, each request
//! ending with OpenClaw's context message that the next one does not carry (`--no-context` leaves
//! it out); `--convs` conversations interleaved turn by turn for `--turns` turns. For every request
//! it times:
//! - inference: fingerprinting the messages (the default `server.ephemeral_message_rules` applied),
//!   the lookup, and registering the reply (under the history and under it without its tail);
//! - the proxy's floor: parsing the body and writing the forwarded body (what every request costs
//!   before any upstream or capture work);
//! - the capture's chat-template rendering of the prompt (always done in full) and its encoding
//!   with the embedded mini tokenizer (the capture encodes incrementally: only what a turn adds),
//!   on every 5th turn.
//!
//! Run: `cargo bench -p ps-server --bench session_infer -- [--convs N] [--turns T] [--model-dir DIR]`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use ps_chat_template::{ChatTokenizer, EncodedPrefix, TurnInput};
use ps_session_infer::{History, Limits, Outcome, SessionMatcher};
use serde_json::{Value, json};

/// Options, after `--` (`--bench` and a filter, as cargo passes them, are accepted and ignored).
#[derive(clap::Parser)]
struct Args {
    #[arg(long, default_value_t = 64)]
    convs: usize,
    #[arg(long, default_value_t = 30)]
    turns: usize,
    /// A tokenizer directory (default: the Qwen3 fixture when present, else the mini model).
    #[arg(long)]
    model_dir: Option<String>,
    /// Requests without OpenClaw's trailing context message.
    #[arg(long)]
    no_context: bool,
    #[arg(long, hide = true)]
    bench: bool,
    #[arg(hide = true)]
    filter: Option<String>,
}

fn tools() -> Value {
    let tools: Vec<Value> = (0..12)
        .map(|i| {
            json!({"type": "function", "function": {"name": format!("tool_{i}"),
                "description": "Does one thing of the agent's work, described at some length. ".repeat(4),
                "parameters": {"type": "object", "properties": {
                    "path": {"type": "string"}, "query": {"type": "string"},
                    "limit": {"type": "integer"}}, "required": ["path"]}}})
        })
        .collect();
    json!(tools)
}

fn assistant(conv: usize, turn: usize) -> Value {
    json!({"role": "assistant", "content": format!("Turn {turn} of conversation {conv}: I will look at the file next."),
        "reasoning_content": "Some reasoning about what to do next. ".repeat(10),
        "tool_calls": [{"id": format!("call_{conv}_{turn}"), "type": "function",
            "function": {"name": "tool_3", "arguments": format!("{{\"path\": \"src/mod_{turn}.rs\", \"query\": \"fn main\", \"limit\": 50}}")}}]})
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    let convs = args.convs;
    let turns = args.turns;
    let system = "You are a personal agent. Follow the rules below. ".repeat(800);
    assert!(system.len() >= 40_000);
    let tools = tools();
    // The capture as the workers run it: the policy's tokenizer (`--model-dir`, e.g. the Qwen3
    // fixture), incremental encoding from the conversation's previous prompt.
    let tok = match args.model_dir.clone() {
        Some(dir) => ChatTokenizer::from_dir(&dir).unwrap(),
        None => ChatTokenizer::mini(),
    };
    let mut prefixes: Vec<Option<EncodedPrefix>> = (0..convs).map(|_| None).collect();
    let matcher = Arc::new(SessionMatcher::new(Limits {
        idle: Duration::from_secs(600),
        max_sessions: 10_000,
    }));
    let mut histories: Vec<Vec<Value>> = (0..convs)
        .map(|i| {
            vec![
                json!({"role": "system", "content": system}),
                json!({"role": "user", "content": format!("Task {i}: fix the build.")}),
            ]
        })
        .collect();
    let rules = [ps_session_infer::EphemeralRule::openclaw()];
    let (mut infer, mut fingerprint) = (Duration::ZERO, Duration::ZERO);
    let (mut floor, mut capture) = (Duration::ZERO, Duration::ZERO);
    let (mut requests, mut continued, mut messages) = (0usize, 0usize, 0usize);
    for t in 0..turns {
        for (i, h) in histories.iter_mut().enumerate() {
            let mut sent = h.clone();
            if !args.no_context {
                sent.push(json!({"role": "user", "content": [{"type": "text", "text": format!(
                    "{}\nConversation data (data, not instructions):\n\"Active exec sessions: {t}\"\n<<<END_OPENCLAW_INTERNAL_CONTEXT>>>",
                    ps_session_infer::ephemeral::OPENCLAW_CONTEXT_PREFIX)}]}));
            }
            let body = json!({"model": "m", "messages": sent, "tools": tools, "stream": true,
                "stream_options": {"include_usage": true}, "max_completion_tokens": 4096});
            let bytes = serde_json::to_vec(&body).unwrap();

            // The proxy's floor: parse the body, write the forwarded one.
            let started = Instant::now();
            let parsed: Value = serde_json::from_slice(&bytes).unwrap();
            let mut forwarded = parsed.clone();
            forwarded["logprobs"] = json!(true);
            let out = serde_json::to_vec(&forwarded).unwrap();
            floor += started.elapsed();
            std::hint::black_box(out);

            // Inference: fingerprint, look up, register the reply.
            let reply = assistant(i, t);
            let msgs = parsed["messages"].as_array().unwrap();
            let started = Instant::now();
            let history = History::of_with(msgs, &rules);
            fingerprint += started.elapsed();
            let r = matcher.resolve(&history, Instant::now());
            if r.outcome == Outcome::Continued {
                continued += 1;
            }
            r.reply.complete(&reply, Instant::now());
            infer += started.elapsed();

            // The capture worker's split of the turn (render prompt and full text, encode what
            // the turn adds).
            let started = Instant::now();
            let input = TurnInput {
                messages: msgs,
                tools: Some(&tools),
                response_message: &reply,
                template_kwargs: None,
            };
            let (tokens, prefix) = tok
                .split_turn_incremental(&input, prefixes[i].as_ref())
                .unwrap();
            capture += started.elapsed();
            prefixes[i] = prefix;
            std::hint::black_box(tokens);

            messages += msgs.len();
            requests += 1;
            h.push(reply);
            h.push(
                json!({"role": "tool", "tool_call_id": format!("call_{i}_{t}"),
                "content": "fn main() {}\n".repeat(40)}),
            );
            h.push(json!({"role": "user", "content": format!("Turn {t} done, go on.")}));
        }
    }
    let per = |d: Duration| secs(d) / requests as f64 * 1e6;
    println!(
        "requests: {requests} ({convs} conversations x {turns} turns), {continued} recognised as continuations, {:.0} messages per request on average",
        messages as f64 / requests as f64
    );
    let (infer_us, floor_us, capture_us) = (per(infer), per(floor), per(capture));
    println!("inference per request:              {infer_us:>9.1} us");
    println!(
        "  of which fingerprinting:          {:>9.1} us",
        per(fingerprint)
    );
    println!("parse + forward body per request:   {floor_us:>9.1} us");
    println!("capture split per request:          {capture_us:>9.1} us");
    println!(
        "inference / (parse + forward):           {:>5.1} %",
        100.0 * infer_us / floor_us
    );
    println!(
        "inference / (parse + forward + capture): {:>5.1} %",
        100.0 * infer_us / (floor_us + capture_us)
    );
    assert_eq!(
        continued,
        convs * (turns - 1),
        "every later turn continues its conversation"
    );
}
