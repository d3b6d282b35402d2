//! The real Codex (npm `@openai/codex`, `codex exec`) pointed at the built `policy-serving` through
//! the Responses door (a provider with `wire_api = "responses"`), its model name mapped to the
//! policy (`server.model_names`) and no header of ours: a prompt that makes the policy call a tool
//! (Codex runs `echo` in its sandbox and sends the output back), then `exec resume --last`. Every
//! request must be answered without error; the three main turns must be one session recognised
//! from the history, the first two samples, all through the Responses door. Codex's own requests
//! carry a namespace tool and a hosted `web_search`, which the door flattens and leaves out.
//!
//! Needs the agent: `POLICY_SERVING_CODEX` names the `codex` executable (`.ci/run` installs it).
//! Without it the test says so and passes, unless `POLICY_SERVING_REQUIRE_CODEX=1` (CI), which
//! makes it fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "harness.rs"]
mod harness;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ps_fake_sglang::FakeSglang;

fn codex() -> Option<PathBuf> {
    let required = std::env::var("POLICY_SERVING_REQUIRE_CODEX").as_deref() == Ok("1");
    match std::env::var_os("POLICY_SERVING_CODEX").map(PathBuf::from) {
        Some(p) if p.exists() => Some(p),
        other => {
            assert!(
                !required,
                "POLICY_SERVING_REQUIRE_CODEX=1 but POLICY_SERVING_CODEX ({other:?}) names no \
                 executable: install it as .ci/run does (@openai/codex from npm)"
            );
            eprintln!("skipped: no Codex (set POLICY_SERVING_CODEX, see .ci/run)");
            None
        }
    }
}

/// One prompt: `codex exec TEXT`, or `codex exec resume --last TEXT`, as a user runs it; its
/// last message.
async fn prompt(codex: &Path, home: &Path, work: &Path, text: &str, resume: bool) -> String {
    let out_path = home.join("codex-output.txt");
    let err_path = home.join("codex-stderr.txt");
    let mut cmd = Command::new(codex);
    cmd.args(["exec", "--skip-git-repo-check"]);
    if resume {
        cmd.args(["resume", "--last"]);
    }
    cmd.arg(text);
    cmd.current_dir(work)
        .env("HOME", home)
        .env("CODEX_HOME", home.join(".codex"))
        .env("POLICY_KEY", "sk-policy-serving-test");
    // A prompt takes seconds here (Codex retries a failing request five times before it gives
    // up).
    let (status, out, err) = harness::run_agent(
        &mut cmd,
        &out_path,
        &err_path,
        Duration::from_secs(180),
        &format!("codex on: {text}"),
    )
    .await;
    assert!(
        status.success() && !err.contains("ERROR"),
        "codex failed ({status:?}):\n{out}\n{err}"
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_codex_trains_through_the_responses_door() {
    let Some(codex) = codex() else {
        return;
    };
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (_server, base) = harness::serve_agent_proxy(
        dir.path(),
        &fake.chat_url(),
        &fake.generate_url(),
        "model_names = { \"gpt-5-codex\" = \"default\" }",
    )
    .await;
    let (home, work) = (dir.path().join("home"), dir.path().join("work"));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&work).unwrap();

    std::fs::create_dir_all(home.join(".codex")).unwrap();
    std::fs::write(
        home.join(".codex/config.toml"),
        format!(
            "model = \"gpt-5-codex\"\nmodel_provider = \"policy\"\n\n[model_providers.policy]\n\
             name = \"policy\"\nbase_url = \"{base}/v1\"\nenv_key = \"POLICY_KEY\"\nwire_api = \"responses\"\n"
        ),
    )
    .unwrap();

    // The policy calls Codex's first tool, `exec_command`, with the prompt's first words as the
    // command (the fake calls a tool when the prompt says `[call_tool]`): `echo hello there`.
    let first = prompt(&codex, &home, &work, "echo hello there [call_tool]", false).await;
    assert!(first.contains("The tool returned"), "{first}");
    prompt(&codex, &home, &work, "Thanks, now summarise it", true).await;

    // The policy saw Responses requests only, translated: every one asked for log-probs, none
    // named a hosted tool.
    let chats: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .map(|r| r.body)
        .collect();
    assert!(chats.iter().all(|b| {
        b["tools"]
            .as_array()
            .is_none_or(|t| t.iter().all(|t| t["type"] == "function"))
    }));
    harness::an_agents_tool_call_and_follow_up_became_samples(&base, &chats, "responses").await;
}
