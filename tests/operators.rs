//! The real binary with the operators' own set-up: their trainer-side `config.toml` and the
//! `SGLANG_API_KEY=EMPTY` of their `env.sh`. What `serve` says at start is what they read.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::harness;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use ps_fake_sglang::{FakeHandle, FakeSglang};

use harness::{KillOnDrop, free_port};

/// Starts `policy-serving serve --config <config>` in `dir` with `env`, and returns it with the
/// log lines it wrote up to and including "policy-serving listening". Generous bound (a shared
/// 2-core machine): 60 s to start.
fn serve(config: &Path, dir: &Path, env: &[(&str, String)]) -> (KillOnDrop, Vec<String>) {
    let mut cmd = Command::new(harness::policy_serving());
    cmd.args(["serve", "--config"])
        .arg(config)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .env_remove("SGLANG_API_KEY")
        .env_remove("_RJEM_MALLOC_CONF")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = KillOnDrop(cmd.spawn().unwrap());
    let stderr = child.0.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    // Drain the server's log for its whole life: once `serve` returns nobody reads the lines, but
    // a reader that stopped would close the pipe and the server's next log line (the first
    // request's) would fail to write, taking that request's connection with it.
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut lines = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => {
                let done = line.contains("policy-serving listening");
                lines.push(line);
                if done {
                    return (child, lines);
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("serve did not start within 60 s:\n{}", lines.join("\n"))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                panic!("serve exited before listening:\n{}", lines.join("\n"))
            }
        }
    }
}

fn operators_config() -> String {
    let path = harness::workspace_root().join("crates/config/tests/fixtures/operators_config.toml");
    std::fs::read_to_string(path).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_the_operators_config_toml_reports_its_trainer_side_keys_in_one_line() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The operators' file; only its teacher points at one that scores given tokens (their hosted
    // chat model cannot, and `serve` says so: see the config crate's tests).
    let text = operators_config().replace(
        "teacher_base_url = \"https://taotoken.net/api\"",
        &format!("teacher_base_url = \"{}\"", fake.generate_url()),
    );
    let config = dir.path().join("config.toml");
    std::fs::write(&config, text).unwrap();
    let port = free_port();
    // As the operators' env.sh does: the port and judge URL as variables, the teacher's key.
    let (_server, lines) = serve(
        &config,
        dir.path(),
        &[
            ("OPENCLAW_PORT", port.to_string()),
            ("PRM_ROUTER_URL", fake.generate_url()),
            ("POLICY_SERVING_SGLANG__CHAT_URL", fake.chat_url()),
            ("TAOTOKEN_API_KEY", "t-key".to_owned()),
        ],
    );
    let log = lines.join("\n");
    let trainer: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("trainer-side keys"))
        .collect();
    assert_eq!(trainer.len(), 1, "{log}");
    assert!(
        trainer[0].contains(
            "trainer-side keys in the settings file, left to the trainer: rollout.mode, \
             rollout.output_queue_size, policy.tp_size; read by both sides: \
             rollout.api_server_url, rollout.sample_timeout_sec, policy.model_name"
        ),
        "{log}"
    );
    assert!(trainer[0].contains(" INFO "), "{log}");
    assert!(!log.contains("ERROR") && !log.contains("WARN"), "{log}");
    assert!(log.contains("mode=opd"), "{log}");
    // It listens where the operators' variables say, and it serves.
    let health = reqwest::get(format!("http://127.0.0.1:{port}/health"))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_says_at_start_that_sglang_api_key_empty_means_bearer_empty() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = dir.path().join("settings.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nport = {port}\n[sglang]\nchat_url = \"{}\"\n[prm]\nrouter_url = \"{}\"\n",
            fake.chat_url(),
            fake.generate_url()
        ),
    )
    .unwrap();
    let (_server, lines) = serve(&config, dir.path(), &[("SGLANG_API_KEY", "EMPTY".into())]);
    let log = lines.join("\n");
    let curl = format!("curl -H \"Authorization: Bearer EMPTY\" http://127.0.0.1:{port}/v1/models");
    let said: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("SGLANG_API_KEY=EMPTY"))
        .collect();
    assert_eq!(said.len(), 1, "{log}");
    assert!(
        said[0].contains(
            "SGLANG_API_KEY=EMPTY is set, so clients must send `Authorization: Bearer EMPTY`"
        ) && said[0].ends_with(&curl),
        "{log}"
    );
    // The line is true: the curl it gives works, and the operators' keyless curl gets 401.
    let http = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/v1/models");
    let keyless = http.get(&url).send().await.unwrap();
    assert_eq!(keyless.status(), 401);
    let with_key = http.get(&url).bearer_auth("EMPTY").send().await.unwrap();
    assert_eq!(with_key.status(), 200);
}

/// The allocator line `serve` logs at start (debug level) in a fresh process with `env`.
fn allocator_line(fake: &FakeHandle, env: &[(&str, String)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("settings.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nport = {}\n[sglang]\nchat_url = \"{}\"\n[prm]\nrouter_url = \"{}\"\n\
             [logging]\nlevel = \"debug\"\n",
            free_port(),
            fake.chat_url(),
            fake.generate_url()
        ),
    )
    .unwrap();
    let (_server, lines) = serve(&config, dir.path(), env);
    let allocator: Vec<&String> = lines.iter().filter(|l| l.contains("allocator:")).collect();
    assert_eq!(allocator.len(), 1, "{}", lines.join("\n"));
    allocator[0].clone()
}

/// The value of `field=` in a log line, whole (so that `arenas=2` does not match `arenas=24`).
fn field<'l>(line: &'l str, field: &str) -> Option<&'l str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(field)?.strip_prefix('='))
}

/// Two arenas and 4 KiB thread caches are compiled in, and an operator's `_RJEM_MALLOC_CONF`
/// (jemalloc's own variable, read after them) still wins, as README's "Memory" says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jemalloc_runs_with_two_arenas_unless_the_operator_sets_its_own_variable() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let line = allocator_line(&fake, &[]);
    if !cfg!(all(feature = "jemalloc", not(feature = "system-alloc"))) {
        assert_eq!(field(&line, "allocator"), Some("\"system\""), "{line}");
        assert_eq!(field(&line, "arenas"), None, "{line}");
        return;
    }
    assert_eq!(field(&line, "allocator"), Some("\"jemalloc\""), "{line}");
    assert_eq!(field(&line, "arenas"), Some("2"), "{line}");
    assert_eq!(field(&line, "tcache_max"), Some("4096"), "{line}");
    assert_eq!(field(&line, "dirty_decay_ms"), Some("100"), "{line}");
    let line = allocator_line(
        &fake,
        &[("_RJEM_MALLOC_CONF", "narenas:3,tcache_max:8192".to_owned())],
    );
    assert_eq!(field(&line, "arenas"), Some("3"), "{line}");
    assert_eq!(field(&line, "tcache_max"), Some("8192"), "{line}");
    assert_eq!(
        field(&line, "dirty_decay_ms"),
        Some("100"),
        "the rest compiled in stays: {line}"
    );
}
