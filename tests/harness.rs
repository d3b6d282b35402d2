//! The black-box tests of the built binaries: the end-to-end suite of policy-serving. Each test
//! here spawns the real `policy-serving` executable on a free loopback port (in front of the
//! in-process fake SGLang) and talks to it over HTTP, as an operator or a trainer would:
//!
//! | test | what it shows |
//! |---|---|
//! | `crash.rs` | `kill -9` under load loses no sample whose submission completed |
//! | `check.rs` | `policy-serving check` against good and broken services |
//! | `observability.rs` | metrics and log lines of a served conversation; no secret in the logs |
//! | `operators.rs` | the operators' settings and trainer-side files start the server as they are |
//! | `inspect.rs` | the inspection page of `demo` in headless chromium: what a person sees |
//! | `prometheus.rs` | Debian's Prometheus scrapes `demo` and evaluates every dashboard query |
//! | `real_engine.rs` | the real vLLM (`../shared/real-engine/`) in every mode: samples equal the engine's answers, no drift |
//! | `real_openclaw.rs` | the real npm OpenClaw agent with the defaults: its conversations become sessions and samples |
//! | `real_claude_code.rs` | the real npm Claude Code through the Messages door: a tool call run and a `--continue`, one session, samples |
//! | `real_codex.rs` | the real npm Codex through the Responses door: a tool call run and an `exec resume`, one session, samples |
//!
//! Per-crate tests stay beside their crates (`crates/*/tests`); only tests of the executables
//! live here.
//!
//! **Finding the binary.** These files are the integration tests of the `policy-serving` package
//! (`bins/policy-serving/Cargo.toml` lists them with paths into this directory), so cargo builds
//! the binary before it runs them and gives its path as `CARGO_BIN_EXE_policy-serving`, for every
//! profile, target and target directory. Each test file includes this file as its `harness`
//! module.
//!
//! Also shared: [`KillOnDrop`] (a failing assertion never leaves a server running),
//! [`free_port`] and [`Demo`] (the demo serving on after its conversation).
// Each test file uses only some of these helpers.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::path::Path;
use std::process::Command;

/// Kills the child when dropped, so a failing assertion never leaves a server running.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback port free right now.
/// Runs an agent's `cmd` to its end, stdin closed, its output in the file `out` and its errors in
/// `err` (the same path: one log); killed if it outlives `limit`, which only turns a hung agent
/// into a clear failure naming `what`. Its exit status, output and errors.
pub async fn run_agent(
    cmd: &mut Command,
    out: &Path,
    err: &Path,
    limit: std::time::Duration,
    what: &str,
) -> (std::process::ExitStatus, String, String) {
    use std::process::Stdio;
    let out_file = std::fs::File::create(out).unwrap();
    let err_file = if err == out {
        out_file.try_clone().unwrap()
    } else {
        std::fs::File::create(err).unwrap()
    };
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out_file)
        .stderr(err_file)
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let deadline = tokio::time::Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what} hung");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let errors = if err == out { String::new() } else { read(err) };
    (status, read(out), errors)
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The workspace's root directory (these tests belong to `bins/policy-serving`).
pub fn workspace_root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// An HTTP client whose every call is bounded by `timeout`: a server that accepts and then stalls
/// fails the test instead of hanging it.
pub fn http(timeout: std::time::Duration) -> reqwest::Client {
    reqwest::Client::builder().timeout(timeout).build().unwrap()
}

/// `policy-serving serve --config CONFIG` on `port`, logging warnings and errors only (a test's
/// log stays readable; a drift or a failed vote shows) and without the caller's `RUST_LOG` or
/// `SGLANG_API_KEY`, once it answers `/health` (bounded: 120 s, so that a server that never
/// listens fails clearly; it may ask a real engine for its model and load a real tokenizer
/// first). Returns the server and its base URL.
pub async fn serve(config: &Path, port: u16) -> (KillOnDrop, String) {
    let child = KillOnDrop(
        Command::new(policy_serving())
            .args(["serve", "--config"])
            .arg(config)
            .env_remove("RUST_LOG")
            .env_remove("SGLANG_API_KEY")
            .env("POLICY_SERVING_LOGGING__LEVEL", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let mut child = child;
    let base = format!("http://127.0.0.1:{port}");
    let client = http(std::time::Duration::from_secs(10));
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
    while client.get(format!("{base}/health")).send().await.is_err() {
        if let Some(status) = child.0.try_wait().unwrap() {
            panic!("serve exited before it answered /health: {status} (its log is above)");
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "serve never answered /health"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    (child, base)
}

/// `GET /v1/rollout/status` of the server at `base` (no key).
pub async fn status(base: &str) -> serde_json::Value {
    http(std::time::Duration::from_secs(60))
        .get(format!("{base}/v1/rollout/status"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// `serve` with the defaults but the fake engine (`chat_url`, `generate_url`), the store in `dir`
/// and `server_lines` (more `[server]` settings) on a free port: the server and its base URL.
pub async fn serve_agent_proxy(
    dir: &Path,
    chat_url: &str,
    generate_url: &str,
    server_lines: &str,
) -> (KillOnDrop, String) {
    let port = free_port();
    let config = dir.join("settings.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nport = {port}\n{server_lines}\n[sglang]\nchat_url = \"{chat_url}\"\n\
             [prm]\nrouter_url = \"{generate_url}\"\n[store]\npath = \"{}\"\n",
            dir.join("store").display(),
        ),
    )
    .unwrap();
    serve(&config, port).await
}

/// What a real agent's two prompts through a door must give (`tests/real_claude_code.rs`,
/// `tests/real_codex.rs`): the engine asked for log-probs every time (`engine_bodies`: its chat
/// requests) and three main requests among them (a tool call, the tool's result, a follow-up);
/// then, bounded (judging is local), two samples (the follow-up waits for its next state) of one
/// session recognised from the history, nothing dropped, each through `door`, the first's response
/// the tool call the agent ran.
pub async fn an_agents_tool_call_and_follow_up_became_samples(
    base: &str,
    engine_bodies: &[serde_json::Value],
    door: &str,
) {
    use serde_json::Value;
    assert!(engine_bodies.iter().all(|b| b["logprobs"] == true));
    let main = engine_bodies
        .iter()
        .filter(|b| b["tools"].as_array().is_some_and(|t| !t.is_empty()))
        .count();
    assert_eq!(
        main, 3,
        "three main requests (tool call, tool result, follow-up)"
    );
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
    let st = loop {
        let st = status(base).await;
        if st["samples"]["submitted"] == 2 {
            break st;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "samples missing: {st}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!(st["turns_dropped"], 0, "{st}");
    assert_eq!(st["turns_abandoned"], 0, "{st}");
    let si = &st["session_inference"];
    assert_eq!(si["inferred_sessions"], 1, "one conversation: {st}");
    assert_eq!(si["continued"], 2, "{st}");
    assert_eq!(si["forks"], 0, "{st}");
    let page: Value = http(std::time::Duration::from_secs(60))
        .get(format!("{base}/v1/rollout/samples?after=0&max=10"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let samples: Vec<&Value> = page["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["sample"])
        .collect();
    assert_eq!(samples.len(), 2);
    for x in &samples {
        assert_eq!(x["metadata"]["door"], door, "{}", x["metadata"]);
        assert_eq!(x["metadata"]["session_source"], "inferred");
        assert_eq!(x["session_id"], samples[0]["session_id"]);
    }
    assert!(
        samples[0]["response"]
            .as_str()
            .unwrap()
            .contains("<tool_call>"),
        "the first turn's response is the tool call the agent ran: {}",
        samples[0]["response"]
    );
}

/// The `policy-serving` executable cargo built for this test run.
pub fn policy_serving() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_policy-serving"))
}

/// `policy-serving demo` (keeping on serving after its conversation), started and read until it
/// prints the inspection page's URL.
pub struct Demo {
    /// The proxy, `http://127.0.0.1:PORT`.
    pub base: String,
    /// What it printed before the URL (the conversation and the samples).
    pub printed: String,
    _child: KillOnDrop,
}

impl Demo {
    /// Starts the demo in `mode` (`rl`, `opd`, `combine`) and waits for its URL (bounded).
    pub fn start(mode: &str) -> Demo {
        use std::io::{BufRead, BufReader};
        let mut child = Command::new(policy_serving())
            .args(["demo", "--mode", mode])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("starting policy-serving demo");
        let stdout = child.stdout.take().expect("the demo's stdout");
        let child = KillOnDrop(child);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut printed = String::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                printed.push_str(&line);
                printed.push('\n');
                if let Some(url) = line
                    .strip_prefix("inspection page: ")
                    .and_then(|r| r.split_whitespace().next())
                {
                    let _ = tx.send((url.to_owned(), printed.clone()));
                }
            }
        });
        let (url, printed) = rx
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("the demo printed its inspection page's URL");
        let base = url.trim_end_matches('/').trim_end_matches("/ui").to_owned();
        Demo {
            base,
            printed,
            _child: child,
        }
    }
}
