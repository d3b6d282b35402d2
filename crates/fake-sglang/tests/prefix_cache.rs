//! The prefix cache of prompt encodings changes the fake's CPU, never its answers: a cached fake, an
//! uncached one and one whose cache is too small to keep more than a prompt or two (so that it
//! evicts all the time) give the same ids, texts and log-probs for the same multi-turn
//! conversations, and the same `/generate` answers.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::{path::PathBuf, sync::Arc};

use ps_chat_template::ChatTokenizer;
use ps_fake_sglang::{FakeHandle, FakeSglang};
use serde_json::{Value, json};

/// The mini model, and the real Qwen3 tokenizer from `../shared/fixtures/qwen3` (or
/// `$POLICY_SERVING_SHARED`) when it is there; its absence fails only with
/// `POLICY_SERVING_REQUIRE_FIXTURES=1`.
fn tokenizers() -> Vec<(&'static str, Arc<ChatTokenizer>)> {
    let mut out = vec![("mini", Arc::new(ChatTokenizer::mini()))];
    let shared = std::env::var_os("POLICY_SERVING_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    let dir = shared.join("fixtures/qwen3");
    if dir.join("tokenizer.json").is_file() {
        let tok = ChatTokenizer::from_dir(&dir).expect("qwen3 loads");
        assert!(tok.splices(), "Qwen3 splices at added tokens");
        out.push(("qwen3", Arc::new(tok)));
    } else {
        let required = std::env::var("POLICY_SERVING_REQUIRE_FIXTURES").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "POLICY_SERVING_REQUIRE_FIXTURES=1 but {dir:?} is missing"
        );
    }
    out
}

async fn fake(tok: &Arc<ChatTokenizer>, cache_bytes: usize) -> FakeHandle {
    FakeSglang::builder()
        .tokenizer(tok.clone())
        .prefix_cache_bytes(cache_bytes)
        .spawn()
        .await
        .expect("spawn fake")
}

fn system_prompt() -> String {
    (0..12)
        .map(|i| format!("Rule {i}: work carefully, say what you changed and why. "))
        .collect()
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "read_file", "description": "Reads a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                "required": ["path"]}}},
        {"type": "function", "function": {"name": "run", "description": "Runs a command.",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"},
                "timeout": {"type": "integer"}}, "required": ["cmd"]}}},
    ])
}

/// The answer without what differs between servers and calls (ids of the response, times).
fn comparable(mut answer: Value) -> Value {
    let o = answer.as_object_mut().expect("object");
    o.remove("id");
    o.remove("created");
    if let Some(meta) = o["choices"][0]
        .get_mut("meta_info")
        .and_then(Value::as_object_mut)
    {
        meta.remove("id");
        meta.remove("e2e_latency");
    }
    answer
}

async fn ask(fake: &FakeHandle, messages: &[Value], call: Option<&str>) -> Value {
    let mut body = json!({
        "model": "m", "messages": messages, "tools": tools(),
        "logprobs": true, "top_logprobs": 2,
        "return_prompt_token_ids": true, "return_token_ids": true, "return_meta_info": true,
    });
    if let Some(name) = call {
        body["tool_choice"] = json!({"type": "function", "function": {"name": name}});
    }
    let resp = reqwest::Client::new()
        .post(fake.chat_url())
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    resp.json().await.expect("json")
}

/// Three sessions that share a system prompt and tools, played turn by turn in an interleaved
/// order, each turn's answer appended (reasoning included) as an agent does; tool calls get a
/// result. Every answer of every fake must be the same.
#[tokio::test]
async fn cached_uncached_and_evicting_fakes_give_the_same_ids() {
    for (name, tok) in tokenizers() {
        let fakes = [
            fake(&tok, ps_fake_sglang::DEFAULT_PREFIX_CACHE_BYTES).await,
            fake(&tok, 0).await,
            // Room for about one prompt of this conversation: the cache evicts on every turn.
            fake(&tok, 6_000).await,
        ];
        let mut sessions: Vec<Vec<Value>> = (0..3)
            .map(|s| vec![json!({"role": "system", "content": system_prompt()}),
                json!({"role": "user", "content": format!("Session {s}: look at the build [reply_words=40]")})])
            .collect();
        for turn in 0..5 {
            for (s, messages) in sessions.iter_mut().enumerate() {
                let call =
                    ((turn + s) % 2 == 0).then_some(if s == 1 { "run" } else { "read_file" });
                let mut answers = Vec::new();
                for f in &fakes {
                    answers.push(ask(f, messages, call).await);
                }
                let reference = comparable(answers[0].clone());
                for (i, a) in answers.into_iter().enumerate().skip(1) {
                    assert_eq!(
                        comparable(a),
                        reference,
                        "{name}: session {s}, turn {turn}: fake {i} differs"
                    );
                }
                let ids = reference["choices"][0]["prompt_token_ids"]
                    .as_array()
                    .expect("prompt ids")
                    .iter()
                    .map(|v| v.as_u64().unwrap() as u32)
                    .collect::<Vec<_>>();
                // And the same as a full encode of the rendered prompt.
                let prompt = tok
                    .render(messages, Some(&tools()), true, None)
                    .expect("renders");
                assert_eq!(ids, tok.encode(&prompt).expect("encodes"), "{name}");
                let message = reference["choices"][0]["message"].clone();
                let tool_call = message["tool_calls"][0].clone();
                messages.push(json!({
                    "role": "assistant",
                    "content": message["content"],
                    "reasoning_content": message["reasoning_content"],
                    "tool_calls": message["tool_calls"],
                }));
                if tool_call.is_object() {
                    messages.push(json!({"role": "tool", "tool_call_id": tool_call["id"],
                        "content": format!("result {turn} of session {s}: ok [reply_words=20]")}));
                } else {
                    messages.push(json!({"role": "user",
                        "content": format!("Turn {turn} of session {s}: next step please")}));
                }
            }
        }
        let judge = json!({"text": format!("{}<|im_start|>user\nJudge this [HINT_START]?<|im_end|>\n<|im_start|>assistant\n", system_prompt()),
            "return_logprob": true, "logprob_start_len": 0});
        for _ in 0..3 {
            let mut answers = Vec::new();
            for f in &fakes {
                let mut a: Value = reqwest::Client::new()
                    .post(f.generate_url())
                    .json(&judge)
                    .send()
                    .await
                    .expect("send")
                    .json()
                    .await
                    .expect("json");
                let meta = a["meta_info"].as_object_mut().expect("meta");
                meta.remove("id");
                meta.remove("e2e_latency");
                answers.push(a);
            }
            assert_eq!(answers[1], answers[0], "{name}: /generate");
            assert_eq!(answers[2], answers[0], "{name}: /generate");
        }
        // A judge sends its votes on one turn together: concurrent requests with one new text
        // wait for one encode, and get the same answers as the uncached fake.
        let hinted = json!({"text": format!("{}<|im_start|>user\nA new turn to judge [HINT_START]?<|im_end|>\n<|im_start|>assistant\n", system_prompt()),
            "return_logprob": true, "logprob_start_len": 0, "rid": "same"});
        let send = |f: &FakeHandle| {
            let (url, body) = (f.generate_url(), hinted.clone());
            async move {
                let a: Value = reqwest::Client::new()
                    .post(url)
                    .json(&body)
                    .send()
                    .await
                    .expect("send")
                    .json()
                    .await
                    .expect("json");
                a["meta_info"]["input_token_logprobs"].clone()
            }
        };
        let (a, b, c) = tokio::join!(send(&fakes[0]), send(&fakes[0]), send(&fakes[0]));
        let reference = send(&fakes[1]).await;
        assert!(reference.as_array().is_some_and(|r| r.len() > 10), "{name}");
        assert!(a == reference && b == reference && c == reference, "{name}");
        let stats = |f: &FakeHandle| f.state().prefix_cache_stats();
        assert_eq!(stats(&fakes[1]), None, "a bound of 0 turns the cache off");
        if tok.splices() {
            let on = stats(&fakes[0]).expect("on");
            assert!(on.hits >= 14 && on.inserts > 0, "{name}: {on:?}");
            let tiny = stats(&fakes[2]).expect("on");
            assert!(
                tiny.evictions > 0 && tiny.bytes <= 6_000,
                "{name}: {tiny:?}"
            );
        }
    }
}
