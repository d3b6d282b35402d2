//! What the full-app tests share (each `tests/*.rs` file declares `mod common;`): the settings of
//! the app in front of the in-process fake SGLang, starting and stopping it, the keys of a guarded
//! server, and reading its rollout status and samples.
// Each test file uses only some of these helpers.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::path::Path;
use std::time::Duration;

use ps_config::Settings;
use ps_fake_sglang::FakeHandle;
use serde_json::{Value, json};

/// Every HTTP call of the full-app tests: bounded (longer than any long poll they make, 30 s),
/// so that a server that accepts and then stalls fails the test instead of hanging it.
pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// The variables `server.admin_key_env` and `server.api_key_env` name in the tests that set them.
pub const ADMIN_VAR: &str = "TEST_ADMIN_KEY";
pub const CLIENT_VAR: &str = "TEST_CLIENT_KEY";

/// The app in front of `fake`: a free port, requests without `X-Turn-Type` train, the PRM judge
/// on the fake's `/generate` with a 5 s bound, the sample store at `store`. Everything else at its
/// default.
pub fn settings(fake: &FakeHandle, store: &Path) -> Settings {
    let mut s = Settings::default();
    s.server.port = 0;
    s.server.default_turn_type = ps_core::DefaultTurnType::Main;
    s.sglang.chat_url = fake.chat_url();
    s.prm.router_url = fake.generate_url();
    s.prm.timeout_sec = 5;
    s.store.path = store.to_path_buf();
    s
}

/// The environment of a server with both keys: [`ADMIN_VAR`] is `admin-secret`, [`CLIENT_VAR`]
/// `client-secret`.
pub fn keys_env(name: &str) -> Option<String> {
    match name {
        ADMIN_VAR => Some("admin-secret".to_owned()),
        CLIENT_VAR => Some("client-secret".to_owned()),
        _ => None,
    }
}

/// No variable set.
pub fn no_env(_: &str) -> Option<String> {
    None
}

/// The app started on `settings`, reading variables from `env`.
pub async fn spawn(settings: &Settings, env: ps_config::EnvLookup<'_>) -> ps_app::Running {
    ps_app::spawn(settings, env, None).await.unwrap()
}

/// A started app and its URL; [`Server::stop`] shuts it down.
pub struct Server {
    pub url: String,
    running: Option<ps_app::Running>,
}

impl Server {
    pub async fn start(settings: &Settings, env: ps_config::EnvLookup<'_>) -> Self {
        let running = spawn(settings, env).await;
        Self {
            url: running.url().to_owned(),
            running: Some(running),
        }
    }

    pub async fn stop(mut self) {
        self.running.take().unwrap().stop().await.unwrap();
    }

    /// A non-streamed turn of `session` (`done` ends it) with `messages`; its answer, which must
    /// be a 200.
    pub async fn chat(&self, session: &str, messages: Value, done: bool) -> Value {
        let r = http()
            .post(format!("{}/v1/chat/completions", self.url))
            .header("x-session-id", session)
            .header("x-session-done", if done { "1" } else { "0" })
            .json(&serde_json::json!({"messages": messages}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.json().await.unwrap()
    }

    pub async fn status(&self) -> Value {
        status(&self.url).await
    }

    /// The rollout status once `done` holds for it (bounded: 30 s, so that a turn that never
    /// resolves fails the test rather than hanging it).
    pub async fn status_when(&self, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let st = self.status().await;
            if done(&st) {
                return st;
            }
            assert!(tokio::time::Instant::now() < deadline, "not reached: {st}");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Waits until every turn is resolved (submitted or dropped), then pulls every sample.
    pub async fn settle(&self, turns: u64) -> Vec<Value> {
        self.settle_counting(turns, &["turns_dropped"]).await
    }

    /// [`Server::settle`] counting abandoned turns as resolved too (turns refused for their
    /// content, say).
    pub async fn resolved(&self, turns: u64) -> Vec<Value> {
        self.settle_counting(turns, &["turns_dropped", "turns_abandoned"])
            .await
    }

    async fn settle_counting(&self, turns: u64, also: &[&str]) -> Vec<Value> {
        for _ in 0..400 {
            let st = self.status().await;
            let done = st["samples"]["submitted"].as_u64().unwrap()
                + also.iter().map(|k| st[*k].as_u64().unwrap()).sum::<u64>();
            if done >= turns {
                let v: Value = http()
                    .get(format!("{}/v1/rollout/samples?after=0&max=100", self.url))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                return v["samples"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s["sample"].clone())
                    .collect();
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("turns did not settle: {}", self.status().await);
    }
}

/// The assistant message of a streamed answer, as a client assembles it.
pub fn assemble_sse(text: &str) -> Value {
    let mut content = String::new();
    let mut reasoning = String::new();
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(data).unwrap();
        let delta = &chunk["choices"][0]["delta"];
        if let Some(c) = delta["content"].as_str() {
            content.push_str(c);
        }
        if let Some(r) = delta["reasoning_content"].as_str() {
            reasoning.push_str(r);
        }
    }
    let mut m = json!({"role": "assistant", "content": content});
    if !reasoning.is_empty() {
        m["reasoning_content"] = json!(reasoning);
    }
    m
}

/// `GET /v1/rollout/status` of the server at `url` (no key).
pub async fn status(url: &str) -> Value {
    http()
        .get(format!("{url}/v1/rollout/status"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Turns waiting somewhere in the pipeline.
pub fn pending(st: &Value) -> u64 {
    [
        "waiting_capture",
        "waiting_next_state",
        "scoring",
        "waiting_order",
    ]
    .iter()
    .map(|k| st["pending"][k].as_u64().unwrap())
    .sum()
}

/// Main turns that reached an end: submitted as samples (kept or excluded), abandoned, dropped.
pub fn accounted(st: &Value) -> u64 {
    st["samples"]["submitted"].as_u64().unwrap()
        + st["samples"]["dropped"].as_u64().unwrap()
        + st["turns_abandoned"].as_u64().unwrap()
        + st["turns_dropped"].as_u64().unwrap()
}

pub fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

/// Votes run in parallel, so which scripted answer each got depends on arrival order.
pub fn sorted_votes(v: &Value) -> Vec<i64> {
    let mut votes: Vec<i64> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect();
    votes.sort_unstable();
    votes
}

/// A MessagePack page (`format=msgpack`) as the trainer decodes it.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct MsgpackPage {
    pub samples: Vec<ps_core::StoredSample>,
    pub last_seq: u64,
}

/// Checks that `bytes`, a MessagePack page written from the store's records, is exactly what
/// encoding its samples writes, each with `index` and `group_index` equal to its seq; returns how
/// many samples it holds.
pub fn assert_msgpack_page_is_the_samples_encoded(bytes: &[u8]) -> usize {
    let typed: MsgpackPage = rmp_serde::from_slice(bytes).unwrap();
    for s in &typed.samples {
        assert_eq!((s.sample.index, s.sample.group_index), (s.seq, s.seq));
    }
    assert!(rmp_serde::to_vec_named(&typed).unwrap() == bytes);
    typed.samples.len()
}
