//! Crash safety with a real process: `kill -9` of the server under load loses no sample whose
//! submission completed (every sample the trainer could already see is served again after restart,
//! with its original seq), and new samples continue the sequence. The start after the kill says
//! that it checks the store's file (the store commits without redb's quick repair); a start after
//! a graceful stop does not.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::harness;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ps_fake_sglang::FakeSglang;
use serde_json::{Value, json};

use harness::{KillOnDrop, free_port};

/// The server on `config`; its log (warnings and errors) goes to `log`.
fn spawn_server(config: &std::path::Path, log: &std::path::Path) -> Child {
    Command::new(harness::policy_serving())
        .args(["serve", "--config"])
        .arg(config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// What the store logs when it finds its file not closed cleanly.
const STORE_CHECKED: &str = "the sample store was not closed cleanly";

async fn wait_healthy(base: &str) {
    for _ in 0..200 {
        if let Ok(r) = harness::http(Duration::from_secs(10))
            .get(format!("{base}/health"))
            .send()
            .await
            && r.status() == 200
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the server did not come up at {base}");
}

async fn pull_all(base: &str, after: u64) -> BTreeMap<u64, Value> {
    let mut out = BTreeMap::new();
    let mut after = after;
    loop {
        let v: Value = harness::http(Duration::from_secs(30))
            .get(format!("{base}/v1/rollout/samples?after={after}&max=500"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let samples = v["samples"].as_array().unwrap();
        if samples.is_empty() {
            return out;
        }
        for s in samples {
            let seq = s["seq"].as_u64().unwrap();
            out.insert(seq, s["sample"].clone());
            after = seq;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_under_load_loses_no_submitted_sample() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = dir.path().join("settings.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nhost = \"127.0.0.1\"\nport = {port}\ndefault_turn_type = \"main\"\n\
             [sglang]\nchat_url = \"{}\"\n[prm]\nrouter_url = \"{}\"\n[store]\npath = \"{}\"\n",
            fake.chat_url(),
            fake.generate_url(),
            dir.path().join("store").display()
        ),
    )
    .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let log = |n: u32| dir.path().join(format!("server-{n}.log"));
    let mut server = KillOnDrop(spawn_server(&config, &log(1)));
    wait_healthy(&base).await;

    // Load: 8 agents, each running two-turn sessions back to back. Until the kill every request
    // must be answered whole; after it, failures are expected and end the agent. Each agent
    // returns the failures it saw before the kill.
    let killed = Arc::new(AtomicBool::new(false));
    let mut agents = Vec::new();
    for a in 0..8 {
        let (killed, url) = (killed.clone(), format!("{base}/v1/chat/completions"));
        agents.push(tokio::spawn(async move {
            // Bounded: a request the server never answers is a failure, not a hang.
            let http = harness::http(Duration::from_secs(30));
            let mut failures = Vec::new();
            let mut n = 0;
            'agent: while !killed.load(Ordering::Relaxed) {
                n += 1;
                let session = format!("agent{a}-{n}");
                let mut history = vec![json!({"role": "user", "content": format!("task {n}")})];
                for turn in 0..2 {
                    let answer = async {
                        let r = http
                            .post(&url)
                            .header("x-session-id", &session)
                            .header("x-session-done", if turn == 1 { "1" } else { "0" })
                            .json(&json!({"messages": history}))
                            .send()
                            .await
                            .map_err(|e| e.to_string())?;
                        if r.status() != 200 {
                            return Err(format!("HTTP {}", r.status()));
                        }
                        r.json::<Value>().await.map_err(|e| e.to_string())
                    }
                    .await;
                    match answer {
                        Ok(v) => {
                            history.push(v["choices"][0]["message"].clone());
                            history.push(json!({"role": "user", "content": "thanks FAKE_VOTES=1"}));
                        }
                        Err(e) => {
                            if !killed.load(Ordering::Relaxed) {
                                failures.push(format!("{session} turn {turn}: {e}"));
                            }
                            break 'agent;
                        }
                    }
                }
            }
            failures
        }));
    }

    // The trainer side sees samples as they are submitted; kill once it has seen enough.
    let mut seen = BTreeMap::new();
    for _ in 0..600 {
        let after = seen.keys().next_back().copied().unwrap_or(0);
        seen.extend(pull_all(&base, after).await);
        if seen.len() >= 40 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(seen.len() >= 40, "only {} samples under load", seen.len());
    // Everything stored by now was submitted (a sample counts as submitted once it is in the
    // store): all of it must survive, not only what the trainer had already pulled. Samples
    // stored between this read and the kill only add to it.
    let stored: Value = harness::http(Duration::from_secs(30))
        .get(format!("{base}/v1/rollout/status"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let stored = stored["last_seq"].as_u64().unwrap();
    assert!(stored >= *seen.keys().next_back().unwrap());
    killed.store(true, Ordering::Relaxed);
    server.0.kill().unwrap(); // SIGKILL
    server.0.wait().unwrap();
    for a in agents {
        let failures = a.await.unwrap();
        assert!(failures.is_empty(), "before the kill: {failures:?}");
    }

    let mut server = KillOnDrop(spawn_server(&config, &log(2)));
    wait_healthy(&base).await;
    let restarted_log = std::fs::read_to_string(log(2)).unwrap();
    assert!(
        restarted_log.contains(STORE_CHECKED)
            && restarted_log.contains("no committed sample is lost"),
        "the start after kill -9 says that it checks the store: {restarted_log}"
    );
    let after_restart = pull_all(&base, 0).await;
    let missing: Vec<u64> = (1..=stored)
        .filter(|s| !after_restart.contains_key(s))
        .collect();
    assert!(
        missing.is_empty(),
        "stored before the kill, lost after it: {missing:?}"
    );
    for (seq, sample) in &seen {
        assert_eq!(
            after_restart.get(seq),
            Some(sample),
            "sample {seq} survived with its seq and content"
        );
    }
    let last = after_restart.keys().next_back().copied().unwrap();
    assert!(last >= *seen.keys().next_back().unwrap());

    // New samples continue the sequence.
    let http = harness::http(Duration::from_secs(30));
    http.post(format!("{base}/v1/chat/completions"))
        .header("x-session-id", "after-restart")
        .header("x-session-done", "1")
        .json(&json!({"messages": [{"role": "user", "content": "hello again"}]}))
        .send()
        .await
        .unwrap();
    let mut newer = BTreeMap::new();
    for _ in 0..200 {
        newer = pull_all(&base, last).await;
        if !newer.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(newer.keys().all(|s| *s > last), "seqs are never reused");
    assert!(!newer.is_empty());

    // A graceful stop (SIGTERM) closes the store: the next start finds nothing to check.
    let pid = server.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = server.0.wait().unwrap();
    assert!(status.success(), "a graceful stop: {status:?}");
    let mut server = KillOnDrop(spawn_server(&config, &log(3)));
    wait_healthy(&base).await;
    assert!(pull_all(&base, 0).await.len() >= after_restart.len() + newer.len());
    let clean_log = std::fs::read_to_string(log(3)).unwrap();
    assert!(
        !clean_log.contains(STORE_CHECKED),
        "no check after a graceful stop: {clean_log}"
    );
    server.0.kill().unwrap();
    server.0.wait().unwrap();
}
