//! The real vision-language engine: the built `policy-serving` in front of vLLM 0.32 on this CPU
//! serving a tiny random-weight Qwen2-VL (`scripts/make_tiny_vl.py`: the real Qwen3 tokenizer
//! with a Qwen-VL template, transformers' own Qwen2-VL image processor inside vLLM), with image
//! turns: non-streamed and streamed on the engine's ids, and re-tokenized. Every image turn must
//! become a sample whose prompt ids are exactly the ones the engine used (asked of the engine
//! itself for the same messages), with each image's run of pads the length vLLM's processor made;
//! the drift check, which re-renders every engine-id turn with our template and our pad counts,
//! must find no drift, and no turn may be refused for its images.
//!
//! Needs the engine: `POLICY_SERVING_REAL_VL_URL` (`http://127.0.0.1:PORT`) and its model
//! directory `POLICY_SERVING_REAL_VL_MODEL_DIR` (`.ci/run` makes and starts both,
//! `scripts/real_vl_engine.sh`). Without them the test says so and passes, unless
//! `POLICY_SERVING_REQUIRE_REAL_ENGINE=1` (CI). The judges are the in-process fake's `/generate`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "harness.rs"]
mod harness;

use std::time::Duration;

use base64::Engine as _;
use harness::{KillOnDrop, free_port};
use ps_fake_sglang::FakeSglang;
use serde_json::{Value, json};

/// Every HTTP call, bounded (an answer with images takes seconds on this CPU).
fn http() -> reqwest::Client {
    harness::http(Duration::from_secs(300))
}

/// The engine's base URL and model directory, or `None` (the test then passes with a note,
/// unless required).
fn engine() -> Option<(String, String)> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    match (
        var("POLICY_SERVING_REAL_VL_URL"),
        var("POLICY_SERVING_REAL_VL_MODEL_DIR"),
    ) {
        (Some(u), Some(d)) => Some((u.trim().trim_end_matches('/').to_owned(), d)),
        _ => {
            assert!(
                std::env::var("POLICY_SERVING_REQUIRE_REAL_ENGINE").as_deref() != Ok("1"),
                "POLICY_SERVING_REQUIRE_REAL_ENGINE=1 but POLICY_SERVING_REAL_VL_URL or \
                 POLICY_SERVING_REAL_VL_MODEL_DIR is unset: start the engine with \
                 scripts/real_vl_engine.sh (see .ci/run)"
            );
            eprintln!("skipped: no real VL engine (POLICY_SERVING_REAL_VL_URL, see .ci/run)");
            None
        }
    }
}

const IMAGES: [(&str, &[u8]); 3] = [
    (
        "image/jpeg",
        include_bytes!("../crates/app/tests/fixtures/images/blue-300x200.jpg"),
    ),
    (
        "image/png",
        include_bytes!("../crates/app/tests/fixtures/images/red-64x48.png"),
    ),
    (
        "image/webp",
        include_bytes!("../crates/app/tests/fixtures/images/wide-900x120.webp"),
    ),
];

fn image(i: usize) -> Value {
    let (mime, bytes) = IMAGES[i];
    json!({"type": "image_url", "image_url": {"url": format!(
        "data:{mime};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )}})
}

/// The engine's prompt ids for `messages` (asked directly, one token generated).
async fn engine_prompt_ids(engine: &str, model: &str, messages: &Value) -> Vec<u64> {
    let body = json!({"model": model, "messages": messages, "max_tokens": 1,
        "return_token_ids": true, "chat_template_kwargs": {"enable_thinking": false}});
    let a: Value = http()
        .post(format!("{engine}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    a["prompt_token_ids"]
        .as_array()
        .or(a["choices"][0]["prompt_token_ids"].as_array())
        .unwrap_or_else(|| panic!("no prompt ids: {a}"))
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

/// One conversation through the proxy: an image in the first user message, two in the third;
/// returns the messages of each request, in order.
async fn conversation(base: &str, model: &str, session: &str, stream: bool) -> Vec<Value> {
    let mut messages = vec![json!({"role": "user", "content": [
        {"type": "text", "text": "What is in"}, image(0), {"type": "text", "text": "this picture?"}]})];
    let mut sent = Vec::new();
    for turn in 0..3 {
        let body = json!({"model": model, "messages": messages, "max_tokens": 12,
            "stream": stream, "chat_template_kwargs": {"enable_thinking": false}});
        sent.push(json!(messages));
        let r = http()
            .post(format!("{base}/v1/chat/completions"))
            .header("X-Session-Id", session)
            .header("X-Turn-Type", "main")
            .header("X-Session-Done", if turn == 2 { "1" } else { "0" })
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{session}");
        let content = if stream {
            r.text()
                .await
                .unwrap()
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter(|d| *d != "[DONE]")
                .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                .filter_map(|c| {
                    c["choices"][0]["delta"]["content"]
                        .as_str()
                        .map(str::to_owned)
                })
                .collect::<String>()
        } else {
            let v: Value = r.json().await.unwrap();
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        };
        messages.push(json!({"role": "assistant", "content": content}));
        messages.push(if turn == 0 {
            json!({"role": "user", "content": "And its colour?"})
        } else {
            json!({"role": "user", "content": [image(1), {"type": "text", "text": "Compare with"}, image(2)]})
        });
    }
    sent
}

#[tokio::test]
async fn image_turns_on_a_real_vl_engine_are_captured_with_its_own_prompt_ids() {
    let Some((engine, model_dir)) = engine() else {
        return;
    };
    let models: Value = http()
        .get(format!("{engine}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let model = models["data"][0]["id"].as_str().unwrap().to_owned();
    let judge = FakeSglang::builder().spawn().await.unwrap();
    // (sglang.token_ids, client stream, where the ids must come from)
    for (token_ids, stream, source) in [
        ("auto", false, "engine"),
        ("auto", true, "engine"),
        ("retokenize", false, "retokenized"),
    ] {
        let what = format!("token_ids {token_ids}, stream {stream}");
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let config = dir.path().join("settings.toml");
        std::fs::write(
            &config,
            format!(
                "[server]\nport = {port}\nmodel_dir = \"{model_dir}\"\n\
                 [sglang]\nchat_url = \"{engine}/v1/chat/completions\"\ntimeout_sec = 300\n\
                 token_ids = \"{token_ids}\"\n\
                 [prm]\nrouter_url = \"{}\"\n[capture]\ndrift_check_first = 1000000\n\
                 [store]\npath = \"{}\"\n",
                judge.generate_url(),
                dir.path().join("store").display()
            ),
        )
        .unwrap();
        let (child, base): (KillOnDrop, String) = harness::serve(&config, port).await;
        let sent = conversation(&base, &model, "vl", stream).await;
        // Settled: three samples, nothing pending.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
        let st = loop {
            let st: Value = http()
                .get(format!("{base}/v1/rollout/status"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let done = st["stored"].as_u64().unwrap()
                + st["turns_abandoned"].as_u64().unwrap()
                + st["turns_dropped"].as_u64().unwrap();
            if done >= 3 && st["live_sessions"] == 0 {
                break st;
            }
            assert!(tokio::time::Instant::now() < deadline, "{what}: {st}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert_eq!(
            st["turns_abandoned"], 0,
            "{what}: no image turn refused: {st}"
        );
        let t = &st["token_ids"];
        assert_eq!(t[source], 3, "{what}: {st}");
        if source == "engine" {
            assert_eq!(t["drift_checked"], 3, "{what}: {st}");
            assert_eq!(
                t["drift"], 0,
                "{what}: our template and pad counts render the engine's prompt: {}",
                t["last_drift"]
            );
        }
        let page: Value = http()
            .get(format!("{base}/v1/rollout/samples?after=0&max=10"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let samples = page["samples"].as_array().unwrap();
        assert_eq!(samples.len(), 3, "{what}: {st}");
        for s in samples {
            let s = &s["sample"];
            let turn = s["turn"].as_u64().unwrap() as usize;
            let tokens: Vec<u64> = serde_json::from_value(s["tokens"].clone()).unwrap();
            let n = tokens.len() - s["response_length"].as_u64().unwrap() as usize;
            let want = engine_prompt_ids(&engine, &model, &sent[turn - 1]).await;
            assert_eq!(
                tokens[..n],
                want[..],
                "{what}: turn {turn}: the engine's own prompt ids"
            );
            let counts: Vec<u64> = s["images"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["tokens"].as_u64().unwrap())
                .collect();
            assert_eq!(counts.len(), if turn == 3 { 3 } else { 1 }, "{what}");
            // Qwen2-VL's image pad (151655), one run per image, as long as its count.
            let runs: Vec<u64> = tokens[..n]
                .chunk_by(|a, b| a == b)
                .filter(|r| r[0] == 151_655)
                .map(|r| r.len() as u64)
                .collect();
            assert_eq!(runs, counts, "{what}: turn {turn}");
        }
        drop(child);
    }
}
