//! The real OpenClaw agent (npm `openclaw`, on Node 24) pointed at the built `policy-serving` with
//! the defaults: no session or turn-type header, every request ending with OpenClaw's context
//! message that the next request does not re-send (docs/upstream-protocols.md, section 8). Three
//! conversations interleaved must give three sessions, every turn but each conversation's last a
//! sample, and each turn's next state its own conversation's follow-up, never the context block.
//!
//! The policy is the in-process fake SGLang with the real Qwen3 tokenizer (`../shared/fixtures/
//! qwen3`), so that OpenClaw's context estimate is a real model's. Needs the agent:
//! `POLICY_SERVING_OPENCLAW` names the `openclaw` executable (Node 24 on `PATH`; `.ci/run`
//! installs both). Without it the test says so and passes, unless
//! `POLICY_SERVING_REQUIRE_OPENCLAW=1` (CI), which makes it fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "harness.rs"]
mod harness;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use harness::free_port;
use ps_chat_template::ChatTokenizer;
use ps_fake_sglang::FakeSglang;
use serde_json::{Value, json};

fn openclaw() -> Option<PathBuf> {
    let required = std::env::var("POLICY_SERVING_REQUIRE_OPENCLAW").as_deref() == Ok("1");
    match std::env::var_os("POLICY_SERVING_OPENCLAW").map(PathBuf::from) {
        Some(p) if p.exists() => Some(p),
        other => {
            assert!(
                !required,
                "POLICY_SERVING_REQUIRE_OPENCLAW=1 but POLICY_SERVING_OPENCLAW ({other:?}) names no \
                 executable: install it as .ci/run does (node@24 and openclaw@2026.9.6 from npm)"
            );
            eprintln!("skipped: no OpenClaw agent (set POLICY_SERVING_OPENCLAW, see .ci/run)");
            None
        }
    }
}

/// `../shared/fixtures/qwen3` (or `$POLICY_SERVING_SHARED/fixtures/qwen3`).
fn qwen3_dir() -> PathBuf {
    let shared = std::env::var_os("POLICY_SERVING_SHARED").map_or_else(
        || harness::workspace_root().join("../shared"),
        PathBuf::from,
    );
    let dir = shared.join("fixtures/qwen3");
    assert!(
        dir.join("tokenizer.json").exists(),
        "the real Qwen3 tokenizer is needed at {}",
        dir.display()
    );
    dir
}

/// A custom provider at the proxy, as the README's OpenClaw steps write it. The context window is a
/// real model's, so that two short turns never make OpenClaw compact its history.
fn write_openclaw_config(home: &Path, base: &str) {
    let dir = home.join(".openclaw");
    std::fs::create_dir_all(&dir).unwrap();
    let config = json!({
        "agents": {"defaults": {"model": {"primary": "policy/qwen3-4b"}}},
        "models": {"mode": "merge", "providers": {"policy": {
            "baseUrl": format!("{base}/v1"),
            "apiKey": "EMPTY",
            "api": "openai-completions",
            "models": [{"id": "qwen3-4b", "name": "qwen3-4b", "reasoning": false, "input": ["text"],
                "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                "contextWindow": 131072, "maxTokens": 4096}]
        }}}
    });
    std::fs::write(dir.join("openclaw.json"), config.to_string()).unwrap();
}

/// One turn: `openclaw agent --local --session-id ID -m TEXT`, as a user runs it.
async fn turn(openclaw: &Path, home: &Path, session: &str, text: &str) {
    let out_path = home.join("openclaw-output.txt");
    let mut cmd = Command::new(openclaw);
    cmd.args(["agent", "--local", "--session-id", session, "-m", text])
        .env("HOME", home)
        .env("OPENCLAW_STATE_DIR", home.join(".openclaw"))
        .env_remove("OPENCLAW_CONFIG_PATH");
    // An agent turn takes ~20 s of Node start-up and plugin loading on this 2-core machine.
    let (status, output, _) = harness::run_agent(
        &mut cmd,
        &out_path,
        &out_path,
        Duration::from_secs(300),
        &format!("openclaw on {session}: {text}"),
    )
    .await;
    assert!(
        status.success() && !output.contains("couldn't generate a response"),
        "openclaw failed on {session} ({status:?}):\n{output}"
    );
}

/// The flattened text of a message's content.
fn text(m: &Value) -> String {
    content_text(&m["content"])
}

fn content_text(c: &Value) -> String {
    match c {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_openclaw_agent_trains_with_the_defaults() {
    let Some(openclaw) = openclaw() else {
        return;
    };
    let qwen3 = qwen3_dir();
    let tok = Arc::new(ChatTokenizer::from_dir(&qwen3).unwrap());
    let fake = FakeSglang::builder()
        .tokenizer(tok)
        .model_path(Some(qwen3.to_str().unwrap()))
        .model_name("qwen3-4b")
        .spawn()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let records = dir.path().join("records");
    // The defaults, but where the upstream, the judge, the store and the records are.
    let config = dir.path().join("settings.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nport = {port}\n[sglang]\nchat_url = \"{}\"\n[prm]\nrouter_url = \"{}\"\n\
             [store]\npath = \"{}\"\n[logging]\nrecord_dir = \"{}\"\n",
            fake.chat_url(),
            fake.generate_url(),
            dir.path().join("store").display(),
            records.display()
        ),
    )
    .unwrap();
    let (_server, base) = harness::serve(&config, port).await;

    let conversations: [(&str, &[&str]); 3] = [
        (
            "oc-fruit",
            &[
                "Please list three fruits.",
                "Now sort them by colour.",
                "Which one is sweetest?",
            ],
        ),
        (
            "oc-capital",
            &[
                "What is the capital of France?",
                "And of Italy?",
                "Which is older?",
            ],
        ),
        (
            "oc-poem",
            &["Write a two-line poem about rain.", "Make it rhyme."],
        ),
    ];
    // The three conversations at once, each turn after the one before it in its conversation, so
    // that the proxy sees them interleaved (each agent start takes ~15 s of Node on this machine:
    // one after the other the eight turns took ~2 minutes of CI). Each conversation has a home of
    // its own, as three users would: OpenClaw keeps its sessions' state there.
    let conversation = |(session, messages): (&'static str, &'static [&'static str])| {
        let home = dir.path().join(format!("home-{session}"));
        write_openclaw_config(&home, &base);
        let openclaw = openclaw.clone();
        async move {
            for m in messages {
                turn(&openclaw, &home, session, m).await;
            }
        }
    };
    let [a, b, c] = conversations;
    tokio::join!(conversation(a), conversation(b), conversation(c));
    let turns: usize = conversations.iter().map(|(_, m)| m.len()).sum();
    let samples = turns - conversations.len();

    // Every turn but each conversation's last becomes a sample (bounded: judging is local).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let st = loop {
        let st = harness::status(&base).await;
        if st["samples"]["submitted"] == samples {
            break st;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "samples missing: {st}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let si = &st["session_inference"];
    assert_eq!(si["inferred_sessions"], conversations.len(), "{st}");
    assert_eq!(si["continued"], samples, "{st}");
    assert_eq!(si["unmatched_continuations"], 0, "{st}");
    assert_eq!(si["forks"], 0, "{st}");
    assert_eq!(
        st["pending"]["waiting_next_state"],
        conversations.len(),
        "each conversation's last turn waits for its next state: {st}"
    );

    // Each captured turn's next state is its own conversation's next user message.
    let mut checked = 0;
    for entry in std::fs::read_dir(records.join("conversations")).unwrap() {
        let body = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for line in body.lines() {
            let r: Value = serde_json::from_str(line).unwrap();
            let messages = r["messages"].as_array().unwrap();
            let first_user = messages
                .iter()
                .find(|m| m["role"] == "user")
                .map(text)
                .unwrap();
            let (session, asked) = conversations
                .iter()
                .find(|(_, m)| first_user.contains(m[0]))
                .unwrap_or_else(|| panic!("a record of no conversation: {first_user}"));
            // How many of the conversation's messages this turn's request carried.
            let k = asked
                .iter()
                .filter(|m| {
                    messages
                        .iter()
                        .any(|x| x["role"] == "user" && text(x).contains(**m))
                })
                .count();
            let next = &r["next_state"];
            match asked.get(k) {
                Some(follow_up) => {
                    assert_eq!(next["role"], "user", "{session} turn {k}: {next}");
                    assert!(
                        text(next).contains(follow_up) && !text(next).contains("OPENCLAW_INTERNAL"),
                        "{session} turn {k}: the next state is not the user's follow-up: {next}"
                    );
                    checked += 1;
                }
                None => {
                    assert!(
                        next.is_null(),
                        "{session}: the last turn has no next state yet: {next}"
                    )
                }
            }
            // The sample's prompt keeps the context message the policy saw.
            assert!(
                messages
                    .last()
                    .is_some_and(|m| text(m).starts_with("<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>")),
                "{session}: the captured request ends with OpenClaw's context message"
            );
        }
    }
    assert_eq!(checked, samples, "one conversation record per judged turn");
}
