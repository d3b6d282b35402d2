//! The real binary: its Prometheus catalogue after a conversation, and no secret in its logs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::harness;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use ps_fake_sglang::FakeSglang;
use serde_json::json;

const CLIENT_KEY: &str = "client-key-5b1f0c9e";
const ADMIN_KEY: &str = "admin-key-77aa01d3";
const UPSTREAM_KEY: &str = "upstream-key-c0ffee42";

use harness::{KillOnDrop, free_port};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_cover_the_pipeline_and_logs_never_show_a_secret() {
    let fake = FakeSglang::builder()
        .api_key(Some(UPSTREAM_KEY.into()))
        .spawn()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = dir.path().join("settings.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nport = {port}\ndefault_turn_type = \"main\"\napi_key_env = \"T_CLIENT_KEY\"\n\
             admin_key_env = \"T_ADMIN_KEY\"\n[sglang]\nchat_url = \"{}\"\napi_key_env = \"T_UPSTREAM_KEY\"\n\
             [prm]\nrouter_url = \"{}\"\n[store]\npath = \"{}\"\n[logging]\nlevel = \"debug\"\n",
            fake.chat_url(),
            fake.generate_url(),
            dir.path().join("store").display()
        ),
    )
    .unwrap();
    let mut server = KillOnDrop(
        Command::new(harness::policy_serving())
            .args(["serve", "--config"])
            .arg(&config)
            .env("T_CLIENT_KEY", CLIENT_KEY)
            .env("T_ADMIN_KEY", ADMIN_KEY)
            .env("T_UPSTREAM_KEY", UPSTREAM_KEY)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // The debug log is read while the server runs: a pipe holds only so much, and a server whose
    // log nobody reads blocks on its next write.
    let mut stderr = server.0.stderr.take().unwrap();
    let log_reader = std::thread::spawn(move || {
        let mut logs = String::new();
        stderr.read_to_string(&mut logs).unwrap();
        logs
    });
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    // A generous bound on the start, only so that a server that never listens fails clearly.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while http.get(format!("{base}/health")).send().await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server never answered /health"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A rejected key, then a two-turn session.
    let r = http
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth("wrong-key")
        .json(&json!({"messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let mut history = vec![json!({"role": "user", "content": "Plan a trip. FAKE_VOTES=1"})];
    for turn in 0..2 {
        let v: serde_json::Value = http
            .post(format!("{base}/v1/chat/completions"))
            .bearer_auth(CLIENT_KEY)
            .header("x-session-id", "obs-session-7")
            .header("x-session-done", if turn == 1 { "1" } else { "0" })
            .json(&json!({"messages": history}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        history.push(v["choices"][0]["message"].clone());
        history.push(json!({"role": "user", "content": "thanks FAKE_VOTES=1"}));
    }
    // A request without a session key: its session is recognised from its history (counted).
    let r = http
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(CLIENT_KEY)
        .json(&json!({"messages": [{"role": "user", "content": "no key here"}]}))
        .send()
        .await
        .unwrap();
    assert!(
        r.headers()["x-session-id"]
            .to_str()
            .unwrap()
            .starts_with("inferred-")
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let text = loop {
        let text = http
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if text.contains("policy_serving_samples_submitted_total")
            && text.contains("outcome=\"effective\"")
        {
            break text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no effective sample was submitted:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for name in [
        "policy_serving_requests_total",
        "policy_serving_upstream_seconds",
        "policy_serving_proxy_overhead_seconds",
        "policy_serving_capture_total",
        "policy_serving_prm_votes_total",
        "policy_serving_samples_submitted_total",
        "policy_serving_live_sessions",
        "policy_serving_pending_turns",
        "policy_serving_store_samples",
        "policy_serving_store_lag_samples",
        "policy_serving_submission_enabled",
        "policy_serving_session_inference_total{outcome=\"new\"} 1",
        "policy_serving_inferred_sessions_live 1",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics:\n{text}");
    }
    assert!(
        text.contains("status=\"401\""),
        "requests are labelled by status"
    );
    assert!(
        !text.contains("obs-session-7"),
        "session ids are never labels"
    );

    server.0.kill().unwrap();
    server.0.wait().unwrap();
    let logs = log_reader.join().unwrap();
    assert!(
        logs.contains("obs-session-7"),
        "debug logs carry the session id"
    );
    assert!(
        logs.contains("session_inference=\"when_missing\"")
            && logs.contains("side-turn rule active")
            && logs.contains("openclaw_memory_flush")
            && logs.contains("openclaw_internal_context"),
        "serve logs at start how sessions without a key are found, which side-turn rules and which \
         rules for messages sent once are active"
    );
    for secret in [CLIENT_KEY, ADMIN_KEY, UPSTREAM_KEY] {
        assert!(!logs.contains(secret), "a secret leaked into the logs");
    }
}
