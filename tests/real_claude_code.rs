//! The real Claude Code (npm `@anthropic-ai/claude-code`, print mode) pointed at the built
//! `policy-serving` through the Messages door (`ANTHROPIC_BASE_URL`), with its model names mapped
//! to the policy (`server.model_names`) and no header of ours: a prompt that makes the policy call
//! a tool (Claude Code runs it and sends the result back), then `--continue`. Every request must be
//! answered without error, the three main turns must be one session recognised from the history,
//! the first two samples (their next states the tool result and the follow-up), all through the
//! Messages door.
//!
//! Needs the agent: `POLICY_SERVING_CLAUDE_CODE` names the `claude` executable (`.ci/run` installs
//! it). Without it the test says so and passes, unless `POLICY_SERVING_REQUIRE_CLAUDE_CODE=1` (CI),
//! which makes it fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "harness.rs"]
mod harness;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ps_fake_sglang::FakeSglang;
use serde_json::Value;

fn claude_code() -> Option<PathBuf> {
    let required = std::env::var("POLICY_SERVING_REQUIRE_CLAUDE_CODE").as_deref() == Ok("1");
    match std::env::var_os("POLICY_SERVING_CLAUDE_CODE").map(PathBuf::from) {
        Some(p) if p.exists() => Some(p),
        other => {
            assert!(
                !required,
                "POLICY_SERVING_REQUIRE_CLAUDE_CODE=1 but POLICY_SERVING_CLAUDE_CODE ({other:?}) \
                 names no executable: install it as .ci/run does (@anthropic-ai/claude-code from npm)"
            );
            eprintln!("skipped: no Claude Code (set POLICY_SERVING_CLAUDE_CODE, see .ci/run)");
            None
        }
    }
}

/// One prompt in print mode, as a user runs it: `claude -p TEXT [--continue]`, only the `Read`
/// tool available (the fake policy calls the first tool it is offered). Its JSON result.
async fn prompt(
    claude: &Path,
    home: &Path,
    work: &Path,
    base: &str,
    text: &str,
    cont: bool,
) -> Value {
    let out_path = home.join("claude-output.json");
    let err_path = home.join("claude-stderr.txt");
    let mut cmd = Command::new(claude);
    cmd.args(["-p", text, "--output-format", "json", "--tools", "Read"]);
    if cont {
        cmd.arg("--continue");
    }
    cmd.current_dir(work)
        .env("HOME", home)
        .env("ANTHROPIC_BASE_URL", base)
        .env("ANTHROPIC_API_KEY", "sk-policy-serving-test")
        .env("ANTHROPIC_MODEL", "claude-sonnet-4-5")
        .env("ANTHROPIC_SMALL_FAST_MODEL", "claude-haiku-4-5")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_AUTOUPDATER", "1");
    // A prompt takes a few seconds here.
    let (status, out, err) = harness::run_agent(
        &mut cmd,
        &out_path,
        &err_path,
        Duration::from_secs(180),
        &format!("claude on: {text}"),
    )
    .await;
    assert!(
        status.success(),
        "claude failed ({status:?}):\n{out}\n{err}"
    );
    let result: Value = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("claude's output is not its JSON result ({e}):\n{out}\n{err}"));
    assert_eq!(result["is_error"], false, "{result}");
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_claude_code_trains_through_the_messages_door() {
    let Some(claude) = claude_code() else {
        return;
    };
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (_server, base) = harness::serve_agent_proxy(
        dir.path(),
        &fake.chat_url(),
        &fake.generate_url(),
        "model_names = { \"claude-sonnet-4-5\" = \"default\", \"claude-haiku-4-5\" = \"default\" }\n\
         side_turn_rules = [ { name = \"titles\", model = \"claude-haiku-4-5\" } ]",
    )
    .await;
    let (home, work) = (dir.path().join("home"), dir.path().join("work"));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&work).unwrap();

    // The policy calls Read (the fake calls a tool when the prompt says `[call_tool]`); Claude Code
    // runs it and sends its result back: two requests, then one for the follow-up.
    let first = prompt(
        &claude,
        &home,
        &work,
        &base,
        "Look at notes.txt please [call_tool]",
        false,
    )
    .await;
    assert_eq!(
        first["num_turns"], 2,
        "a tool call and the answer after it: {first}"
    );
    prompt(
        &claude,
        &home,
        &work,
        &base,
        "Thanks, now summarise it",
        true,
    )
    .await;

    // The policy saw Messages requests only, translated: every one asked for log-probs.
    let chats: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .map(|r| r.body)
        .collect();
    harness::an_agents_tool_call_and_follow_up_became_samples(&base, &chats, "messages").await;
}
