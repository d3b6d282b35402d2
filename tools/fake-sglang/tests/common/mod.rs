//! Helpers shared by the integration tests.
#![allow(dead_code, clippy::expect_used)]

use ps_fake_sglang::{FakeHandle, FakeSglang};
use serde_json::{Value, json};

pub async fn spawn() -> FakeHandle {
    FakeSglang::builder().spawn().await.expect("spawn fake")
}

pub fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

pub async fn chat(fake: &FakeHandle, body: Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(fake.chat_url())
        .json(&body)
        .send()
        .await
        .expect("send chat")
}

pub async fn generate(fake: &FakeHandle, body: Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(fake.generate_url())
        .json(&body)
        .send()
        .await
        .expect("send generate")
}

/// The `data:` payloads of an SSE body, without `[DONE]`; each parsed as JSON (or the raw text).
pub fn sse_events(body: String) -> Vec<Result<Value, String>> {
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").expect("data: prefix"))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).map_err(|_| d.to_owned()))
        .collect()
}
