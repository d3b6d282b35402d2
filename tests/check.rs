//! `policy-serving check --config FILE` as a real process against the in-process fake SGLang: exit
//! code 0 when every check passes (with the operators' `settings.json` shape, `taotoken` section
//! included), 1 with a FAIL line and its cause when one fails, 2 on a configuration error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::harness;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ps_fake_sglang::FakeSglang;
use serde_json::{Value, json};

fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The operators' settings.json, pointed at `chat_url` / `router_url` and at directories in `dir`.
fn operator_settings(dir: &Path, chat_url: &str, router_url: &str) -> Value {
    json!({
        "server":   {"host": "0.0.0.0", "port": closed_port(), "submission_enabled": true,
                     "session_timeout_sec": 600},
        "sglang":   {"chat_url": chat_url, "api_key": "EMPTY", "timeout_sec": 120, "stream": true},
        "prm":      {"router_url": router_url, "num_votes": 3, "timeout_sec": 60},
        "taotoken": {"base_url": "https://taotoken.net/api", "api_key_env": "TAOTOKEN_API_KEY",
                     "hint_model": "claude-sonnet-4-20250514",
                     "teacher_model": "claude-sonnet-4-20250514",
                     "max_concurrency": 4, "timeout_sec": 90},
        "opd":      {"eval_mode": "opd_prm", "top_k": 20, "select_best_hint": true,
                     "drop_without_next_state": true},
        "logging":  {"level": "INFO", "prm_record_dir": dir.join("records/prm"),
                     "opd_record_dir": dir.join("records/opd")},
        "store":    {"path": dir.join("store")},
    })
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Runs `policy-serving check --config FILE` with an empty environment (no legacy overrides leak in).
async fn check(config: PathBuf) -> Output {
    tokio::task::spawn_blocking(move || {
        Command::new(harness::policy_serving())
            .args(["check", "--config"])
            .arg(config)
            .env_clear()
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_exits_zero_when_everything_passes_and_non_zero_with_a_fail_line() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let tmp = tempfile::tempdir().unwrap();

    let good = operator_settings(tmp.path(), &fake.chat_url(), &fake.generate_url());
    let out = check(write(tmp.path(), "settings.json", &good.to_string())).await;
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert_eq!(stdout.lines().count(), 12, "{stdout}");
    for line in [
        "ok   client auth",
        "ok   turn types",
        "ok   sglang health",
        "ok   policy tokenizer",
        "ok   sglang chat logprobs",
        "ok   prm judge /generate",
        "ok   directories writable",
        "skip submission state",
    ] {
        assert!(
            stdout.lines().any(|l| l.starts_with(line)),
            "{line}\n{stdout}"
        );
    }
    assert!(
        stdout.ends_with("all 11 checks passed (4 skipped)\n"),
        "{stdout}"
    );

    let refused = format!("http://127.0.0.1:{}/generate", closed_port());
    let bad = operator_settings(tmp.path(), &fake.chat_url(), &refused);
    let out = check(write(tmp.path(), "bad.json", &bad.to_string())).await;
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    let at = stdout
        .lines()
        .position(|l| l.starts_with("FAIL prm judge /generate"))
        .unwrap_or_else(|| panic!("{stdout}"));
    let cause = stdout.lines().nth(at + 1).unwrap();
    assert_eq!(
        cause,
        format!(
            "     cause: nothing listens at {refused} (connection refused) — fix: start the judge \
             or set prm.router_url"
        )
    );
    assert!(
        stdout.ends_with("1 of 11 checks FAILED (4 skipped)\n"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_error_exits_two() {
    let tmp = tempfile::tempdir().unwrap();
    let path = write(
        tmp.path(),
        "settings.json",
        r#"{"sglang": {"chat_ur": "http://127.0.0.1:1/v1/chat/completions"}}"#,
    );
    let out = check(path).await;
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    assert!(stderr.contains("sglang.chat_ur"), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
}
