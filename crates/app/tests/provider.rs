//! Judges on the external provider through the real server: `prm.backend = "provider"` and
//! `opd.hint_backend = "provider"` against the in-process fake provider (policy and teacher on the
//! fake SGLang).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::{Server, sorted_votes, user};
use ps_config::{Mode, PrmBackend, Settings};
use ps_fake_sglang::{FakeHandle, FakeProvider, FakeProviderHandle, FakeSglang};
use serde_json::{Value, json};

const KEY_VAR: &str = "TEST_PROVIDER_KEY";
const KEY: &str = "sk-provider-test-93d1";

fn settings(fake: &FakeHandle, provider: &FakeProviderHandle, dir: &Path) -> Settings {
    let mut s = common::settings(fake, &dir.join("store"));
    s.prm.backend = PrmBackend::Provider;
    s.provider.base_url = Some(format!("{}/v1/", provider.base_url()));
    s.provider.api_key_env = Some(KEY_VAR.into());
    s.provider.prm_model = Some("judge-model".into());
    s.provider.timeout_sec = 5;
    s.provider.max_retries = 0;
    s.logging.prm_record_dir = Some(dir.join("prm"));
    s
}

async fn start(settings: &Settings, key: &str) -> Server {
    let key = key.to_owned();
    let env = move |name: &str| (name == KEY_VAR).then(|| key.clone());
    Server::start(settings, &env).await
}

/// Turn 1, then turn 2 carrying `next` as turn 1's next state; turn 2 ends the session.
async fn two_turns(s: &Server, session: &str, next: &str) {
    let a = s
        .chat(session, json!([user("Plan a weekend in Rome.")]), false)
        .await;
    let history = json!([
        user("Plan a weekend in Rome."),
        a["choices"][0]["message"],
        user(next)
    ]);
    s.chat(session, history, true).await;
}

/// The JSONL records under `dir`, waiting for them to be written.
async fn records(dir: &Path, at_least: usize) -> Vec<Value> {
    for _ in 0..200 {
        let lines: Vec<Value> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flat_map(|f| {
                let text = std::fs::read_to_string(f.unwrap().path()).unwrap_or_default();
                text.lines()
                    .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                    .collect::<Vec<_>>()
            })
            .collect();
        if lines.len() >= at_least {
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("no records in {}", dir.display());
}

#[tokio::test]
async fn rl_samples_are_scored_by_provider_votes() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let provider = FakeProvider::builder().api_key(KEY).spawn().await.unwrap();
    let s = start(&settings(&fake, &provider, dir.path()), KEY).await;
    two_turns(&s, "p1", "Great, that worked. FAKE_VOTES=1,1,-1").await;
    let samples = s.settle(2).await;
    assert_eq!(samples.len(), 2);
    let first = &samples[0];
    assert_eq!(first["turn"], 1);
    assert_eq!(first["reward"], json!({"score": 1.0}));
    assert_eq!(sorted_votes(&first["metadata"]["votes"]), vec![-1, 1, 1]);

    let calls = provider.chat_requests();
    assert_eq!(calls.len(), 3, "one provider call per vote");
    for c in &calls {
        assert_eq!(c.headers["authorization"], format!("Bearer {KEY}"));
        assert_eq!(c.body["model"], "judge-model");
        assert_eq!(c.body["stream"], false);
    }
    let prompt = calls[0].body["messages"][1]["content"].as_str().unwrap();
    assert!(prompt.contains("Great, that worked."), "{prompt}");
    assert!(
        fake.requests().iter().all(|r| r.path != "/generate"),
        "the SGLang judge is not called"
    );
    s.stop().await;
}

#[tokio::test]
async fn a_rejected_key_fails_the_votes_and_the_record_names_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let provider = FakeProvider::builder()
        .api_key("another-key")
        .spawn()
        .await
        .unwrap();
    let s = start(&settings(&fake, &provider, dir.path()), KEY).await;
    two_turns(&s, "p2", "Thanks. FAKE_VOTES=1,1,1").await;
    let samples = s.settle(2).await;
    // The turn stays accounted for: three failed votes, scored 0 (kept as the session's
    // at-least-one sample).
    let first = &samples[0];
    assert_eq!(first["reward"], json!({"score": 0.0}));
    assert_eq!(first["metadata"]["votes"], json!([null, null, null]));
    assert_eq!(provider.chat_requests().len(), 3, "401 is not retried");

    let prm = records(&dir.path().join("prm"), 1).await;
    let failures = prm[0]["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 3);
    let reason = failures[0].as_str().unwrap();
    assert!(
        reason.contains("provider `provider`") && reason.contains(KEY_VAR),
        "{reason}"
    );
    assert!(!reason.contains(KEY), "{reason}");
    s.stop().await;
}

#[tokio::test]
async fn opd_hints_come_from_the_provider() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let provider = FakeProvider::builder().api_key(KEY).spawn().await.unwrap();
    let mut set = settings(&fake, &provider, dir.path());
    set.server.mode = Mode::Opd;
    set.prm.backend = PrmBackend::Sglang;
    set.opd.hint_backend = PrmBackend::Provider;
    set.provider.hint_model = Some("hint-model".into());
    set.teacher.url = Some(fake.generate_url());
    set.teacher.timeout_sec = 5;
    let s = start(&set, KEY).await;
    two_turns(&s, "o1", "I wanted museums, not food. FAKE_VOTES=1,1,1").await;
    let samples = s.settle(2).await;
    assert_eq!(samples.len(), 1, "turn 2 had no next state and is dropped");
    assert_eq!(samples[0]["reward"]["score"], 1.0);
    let calls = provider.chat_requests();
    assert_eq!(calls.len(), 3, "one provider call per hint vote");
    assert!(calls.iter().all(|c| c.body["model"] == "hint-model"));
    let teacher_calls = fake
        .requests()
        .into_iter()
        .filter(|r| r.path == "/generate")
        .count();
    assert!(teacher_calls >= 1, "the teacher still runs on SGLang");
    s.stop().await;
}
