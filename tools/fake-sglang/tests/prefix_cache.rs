//! The prefix cache of prompt encodings changes the fake's CPU, never its answers: a cached fake, an
//! uncached one and one whose cache keeps only a prompt or two of the longest (so that it evicts
//! and reuses all the time) give the same ids, texts and log-probs for the same multi-turn
//! conversations, and the same `/generate` answers. The cache's counters show that a new session
//! reuses the shared system prompt and that a judge's concurrent votes encode once.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::sync::Arc;

use ps_chat_template::ChatTokenizer;
use ps_fake_sglang::{FakeHandle, FakeSglang};
use serde_json::{Value, json};

/// The mini model, and the real Qwen3 tokenizer from `../shared/fixtures/qwen3` (or
/// `$POLICY_SERVING_SHARED`) when it is there; its absence fails only with
/// `POLICY_SERVING_REQUIRE_FIXTURES=1`.
fn tokenizers() -> Vec<(&'static str, Arc<ChatTokenizer>)> {
    let mut out = vec![("mini", Arc::new(ChatTokenizer::mini()))];
    if let Some(dir) = ps_test_support::fixtures::qwen3_dir() {
        let tok = ChatTokenizer::from_dir(&dir).expect("qwen3 loads");
        assert!(tok.splices(), "Qwen3 splices at added tokens");
        out.push(("qwen3", Arc::new(tok)));
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

/// One request of the conversation, replayed in order on every fake.
#[derive(Clone)]
enum Request {
    Chat(Vec<Value>, Option<&'static str>),
    Generate(Value),
}

async fn send(fake: &FakeHandle, request: &Request) -> Value {
    match request {
        Request::Chat(messages, call) => comparable(ask(fake, messages, *call).await),
        Request::Generate(body) => {
            let mut a: Value = reqwest::Client::new()
                .post(fake.generate_url())
                .json(body)
                .send()
                .await
                .expect("send")
                .json()
                .await
                .expect("json");
            let meta = a["meta_info"].as_object_mut().expect("meta");
            meta.remove("id");
            meta.remove("e2e_latency");
            a
        }
    }
}

/// Four sessions that share a system prompt and tools, played turn by turn in an interleaved
/// order, each turn's answer appended (reasoning included) as an agent does; tool calls get a
/// result. Session 0's first user message is a text that also occurs in the system prompt. A
/// cached and an uncached fake give the same answers, and so does a fake whose bound (1.5 × the
/// last prompt's cost) keeps it evicting entries that later requests would reuse.
#[tokio::test]
async fn cached_uncached_and_evicting_fakes_give_the_same_ids() {
    for (name, tok) in tokenizers() {
        let fakes = [
            fake(&tok, ps_fake_sglang::DEFAULT_PREFIX_CACHE_BYTES).await,
            fake(&tok, 0).await,
        ];
        let stats = |f: &FakeHandle| f.state().prefix_cache_stats();
        let first_message = |s: usize| {
            if s == 0 {
                "work carefully".to_owned()
            } else {
                format!("Session {s}: look at the build [reply_words=40]")
            }
        };
        assert!(system_prompt().contains(&first_message(0)));
        let mut sessions: Vec<Vec<Value>> = (0..4)
            .map(|s| {
                vec![
                    json!({"role": "system", "content": system_prompt()}),
                    json!({"role": "user", "content": first_message(s)}),
                ]
            })
            .collect();
        // Every request and the answer both fakes gave, in order.
        let mut played: Vec<(Request, Value)> = Vec::new();
        let mut last_prompt_cost = 0;
        for turn in 0..5 {
            for (s, messages) in sessions.iter_mut().enumerate() {
                let call =
                    ((turn + s) % 2 == 0).then_some(if s == 1 { "run" } else { "read_file" });
                let request = Request::Chat(messages.clone(), call);
                let before = stats(&fakes[0]);
                let reference = send(&fakes[0], &request).await;
                let after = stats(&fakes[0]);
                assert_eq!(
                    send(&fakes[1], &request).await,
                    reference,
                    "{name}: session {s}, turn {turn}: the uncached fake differs"
                );
                if turn == 0
                    && s > 0
                    && let (Some(before), Some(after)) = (before, after)
                {
                    // A later session's first turn reuses the system prompt and tools kept by the
                    // first session's, even though that one's message occurs in the system
                    // prompt: one lookup, one hit.
                    assert_eq!(
                        (after.hits - before.hits, after.misses - before.misses),
                        (1, 0),
                        "{name}: session {s}'s first turn"
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
                // What the cache counts for an entry: its text, 4 bytes per id and 128 bytes.
                last_prompt_cost = prompt.len() + 4 * ids.len() + 128;
                let message = reference["choices"][0]["message"].clone();
                let tool_call = message["tool_calls"][0].clone();
                played.push((request, reference));
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
        let judge = Request::Generate(
            json!({"text": format!("{}<|im_start|>user\nJudge this [HINT_START]?<|im_end|>\n<|im_start|>assistant\n", system_prompt()),
            "return_logprob": true, "logprob_start_len": 0}),
        );
        for _ in 0..3 {
            let reference = send(&fakes[0], &judge).await;
            assert_eq!(
                send(&fakes[1], &judge).await,
                reference,
                "{name}: /generate"
            );
            played.push((judge.clone(), reference));
        }

        // A judge sends its votes on one turn together: concurrent requests with one new text
        // wait for one encode, and get the same answers as the uncached fake.
        // (A long text, so that the votes' encodes are likely to overlap and a broken coalescing
        // shows; the assertion holds either way.)
        let hinted = json!({"text": format!("{}<|im_start|>user\nA new turn to judge [HINT_START]?<|im_end|>\n<|im_start|>assistant\n", system_prompt().repeat(40)),
            "return_logprob": true, "logprob_start_len": 0, "rid": "same"});
        let vote = |f: &FakeHandle| {
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
        let before = stats(&fakes[0]);
        let (a, b, c) = tokio::join!(vote(&fakes[0]), vote(&fakes[0]), vote(&fakes[0]));
        let after = stats(&fakes[0]);
        let reference = vote(&fakes[1]).await;
        assert!(reference.as_array().is_some_and(|r| r.len() > 10), "{name}");
        assert!(a == reference && b == reference && c == reference, "{name}");
        assert_eq!(stats(&fakes[1]), None, "a bound of 0 turns the cache off");
        if let (Some(before), Some(after)) = (before, after) {
            // One miss whether or not the votes overlapped: one coalesced encode, or one miss
            // and then hits. Each vote encoding on its own would miss up to three times.
            assert_eq!(after.misses - before.misses, 1, "{name}: {after:?}");
        }
        if tok.splices() {
            let on = stats(&fakes[0]).expect("on");
            assert!(on.hits >= 14 && on.inserts > 0, "{name}: {on:?}");
        }

        // The evicting fake: room for one and a half of the longest prompts, so that entries keep
        // being evicted while the shorter early prompts still fit a few at a time.
        let bound = last_prompt_cost * 3 / 2;
        let evicting = fake(&tok, bound).await;
        let mut reused_after_eviction = false;
        for (i, (request, reference)) in played.iter().enumerate() {
            let before = stats(&evicting);
            assert_eq!(
                &send(&evicting, request).await,
                reference,
                "{name}: request {i}: the evicting fake differs"
            );
            if let (Some(before), Some(after)) = (before, stats(&evicting)) {
                reused_after_eviction |= before.evictions > 0 && after.hits > before.hits;
            }
        }
        if tok.splices() {
            let tiny = stats(&evicting).expect("on");
            assert!(
                tiny.evictions > 0 && reused_after_eviction,
                "{name}: bound {bound}: {tiny:?}"
            );
        }
    }
}
