//! `run_checks` against the in-process fake SGLang, the fake provider, tiny misbehaving servers and
//! a real proxy: every check passes on a fake-backed configuration (RL and OPD), and each operator
//! failure is a FAIL line naming its cause and the key or variable to fix.
//!
//! Long because each operator failure has its own case (one check, one cause, one fix).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use axum::routing::{get, post};
use axum::{Json, Router};
use ps_check::{CheckId, CheckReport, Outcome, TEACHER_PROBE_TOKENS, run_checks};
use ps_config::{Mode, PrmBackend, Settings};
use ps_fake_sglang::{FakeHandle, FakeProvider, FakeSglang, Fault, MINI_MODEL_DIR, ProviderFault};
use serde_json::{Value, json};

/// A port nothing listens on.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn no_env(_: &str) -> Option<String> {
    None
}

/// Serves `router` on loopback; returns `http://127.0.0.1:PORT`.
async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

/// RL against the fake: chat and judge on the fake, directories in `tmp`, no proxy running.
fn rl_settings(fake: &FakeHandle, tmp: &Path) -> Settings {
    let mut s = Settings::default();
    s.sglang.chat_url = fake.chat_url();
    s.prm.router_url = fake.generate_url();
    s.prm.timeout_sec = 5;
    s.store.path = tmp.join("store");
    s.logging.record_dir = Some(tmp.join("records"));
    s.logging.opd_record_dir = Some(tmp.join("opd-records"));
    s.server.port = closed_port();
    s.validate().unwrap();
    s
}

fn opd_settings(fake: &FakeHandle, tmp: &Path) -> Settings {
    let mut s = rl_settings(fake, tmp);
    s.server.mode = Mode::Opd;
    s.teacher.url = Some(fake.generate_url());
    s.opd.top_k = 2;
    s.validate().unwrap();
    s
}

fn outcome(r: &CheckReport, id: CheckId) -> &Outcome {
    &r.get(id).unwrap().outcome
}

/// The cause and fix of a failed check, or a panic showing the report.
fn failure(r: &CheckReport, id: CheckId) -> (String, String) {
    match outcome(r, id) {
        Outcome::Fail { cause, fix } => (cause.clone(), fix.clone()),
        other => panic!("{id:?} did not fail: {other:?}\n{}", r.render()),
    }
}

fn detail(r: &CheckReport, id: CheckId) -> String {
    match outcome(r, id) {
        Outcome::Ok { detail } => detail.clone(),
        other => panic!("{id:?} is not ok: {other:?}\n{}", r.render()),
    }
}

#[tokio::test]
async fn every_check_passes_against_the_fake_in_rl_mode() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let s = rl_settings(&fake, tmp.path());
    let r = run_checks(&s, &no_env).await;
    assert!(r.all_passed(), "{}", r.render());
    let ids: Vec<CheckId> = r.checks.iter().map(|c| c.id).collect();
    assert_eq!(ids, CheckId::ALL);
    assert!(outcome(&r, CheckId::KeyVariables).is_skip());
    assert!(outcome(&r, CheckId::Provider).is_skip());
    assert!(detail(&r, CheckId::SglangHealth).contains("/health answered 200"));
    assert!(detail(&r, CheckId::ChatLogprobs).contains("tokens with log-probs"));
    assert!(detail(&r, CheckId::PrmGenerate).contains("\\boxed{"));
    assert!(outcome(&r, CheckId::Teacher).is_skip());
    let dirs = detail(&r, CheckId::Directories);
    assert!(
        dirs.contains("store.path") && dirs.contains("logging.opd_record_dir"),
        "{dirs}"
    );
    assert!(tmp.path().join("store").is_dir());
    assert!(tmp.path().join("records/prm").is_dir());
    let Outcome::Skip { reason } = outcome(&r, CheckId::Submission) else {
        panic!("{}", r.render())
    };
    assert!(reason.contains("the proxy is not running"), "{reason}");
    // The probes were the tiny ones the checklist describes.
    let chat = fake
        .requests()
        .into_iter()
        .find(|q| q.path.ends_with("/chat/completions"))
        .unwrap();
    assert_eq!(chat.body["max_tokens"], 8);
    assert_eq!(chat.body["logprobs"], true);
    assert_eq!(chat.body["top_logprobs"], 1);
}

#[tokio::test]
async fn every_check_passes_against_the_fake_in_opd_mode_with_token_ids() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut s = opd_settings(&fake, tmp.path());
    s.sglang.token_ids = ps_config::TokenIdsMode::Engine;
    let r = run_checks(&s, &no_env).await;
    assert!(r.all_passed(), "{}", r.render());
    let chat = detail(&r, CheckId::ChatLogprobs);
    assert!(
        chat.contains("token ids: from the engine (response_token_ids"),
        "{chat}"
    );
    let teacher = detail(&r, CheckId::Teacher);
    assert!(
        teacher.contains(&format!("{TEACHER_PROBE_TOKENS} log-probs and top-2"))
            && teacher.contains("echoed ids match"),
        "{teacher}"
    );
    let generate = fake
        .requests()
        .into_iter()
        .find(|q| q.path == "/generate" && q.body.get("input_ids").is_some())
        .unwrap();
    assert_eq!(generate.body["return_logprob"], true);
}

#[tokio::test]
async fn a_refused_judge_names_its_url_and_prm_router_url() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut s = rl_settings(&fake, tmp.path());
    let port = closed_port();
    s.prm.router_url = format!("http://127.0.0.1:{port}/generate");
    let r = run_checks(&s, &no_env).await;
    assert!(!r.all_passed());
    let (cause, fix) = failure(&r, CheckId::PrmGenerate);
    assert_eq!(
        cause,
        format!("nothing listens at http://127.0.0.1:{port}/generate (connection refused)")
    );
    assert_eq!(fix, "start the judge or set prm.router_url");
    // Only the judge failed.
    assert_eq!(r.failures().count(), 1, "{}", r.render());
}

#[tokio::test]
async fn an_unhealthy_sglang_fails_the_health_check() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    fake.set_fault(Some(Fault::Status(503, Fault::status_body(503))));
    let tmp = tempfile::tempdir().unwrap();
    let s = rl_settings(&fake, tmp.path());
    let r = run_checks(&s, &no_env).await;
    let (cause, fix) = failure(&r, CheckId::SglangHealth);
    assert!(
        cause.contains("HTTP 503") && cause.contains("/health"),
        "{cause}"
    );
    assert!(fix.contains("loaded the model"), "{fix}");
}

#[tokio::test]
async fn sglang_not_listening_names_sglang_chat_url() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut s = rl_settings(&fake, tmp.path());
    s.sglang.chat_url = format!("http://127.0.0.1:{}/v1/chat/completions", closed_port());
    let r = run_checks(&s, &no_env).await;
    for id in [CheckId::SglangHealth, CheckId::ChatLogprobs] {
        let (cause, fix) = failure(&r, id);
        assert!(cause.starts_with("nothing listens at"), "{cause}");
        assert!(fix.contains("sglang.chat_url"), "{fix}");
    }
}

/// A chat server that answers without log-probs (and without token ids).
async fn chat_without_logprobs() -> String {
    let app = Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/chat/completions",
            post(|Json(body): Json<Value>| async move {
                // Asked for token ids: log-probs but no ids (an older SGLang). Otherwise: neither
                // (a server that ignores `logprobs`).
                let logprobs = if body.get("return_token_ids").is_some() {
                    json!({"content": [{"token": "OK", "logprob": -0.1, "top_logprobs": []}]})
                } else {
                    Value::Null
                };
                Json(json!({
                    "id": "x", "object": "chat.completion", "model": "m",
                    "choices": [{"index": 0, "finish_reason": "stop", "logprobs": logprobs,
                                 "message": {"role": "assistant", "content": "OK"}}],
                }))
            }),
        );
    serve(app).await
}

#[tokio::test]
async fn a_chat_without_logprobs_fails() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let upstream = chat_without_logprobs().await;
    let tmp = tempfile::tempdir().unwrap();
    let mut s = rl_settings(&fake, tmp.path());
    s.sglang.chat_url = format!("{upstream}/v1/chat/completions");
    // Not asking for ids: the stub then answers without log-probs.
    s.sglang.token_ids = ps_config::TokenIdsMode::Retokenize;
    let r = run_checks(&s, &no_env).await;
    assert!(outcome(&r, CheckId::SglangHealth).is_ok());
    let (cause, fix) = failure(&r, CheckId::ChatLogprobs);
    assert!(cause.contains("without per-token log-probs"), "{cause}");
    assert!(fix.contains("sglang.chat_url"), "{fix}");
}

#[tokio::test]
async fn missing_token_ids_name_the_setting_to_turn_off() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let upstream = chat_without_logprobs().await;
    let tmp = tempfile::tempdir().unwrap();
    let mut s = rl_settings(&fake, tmp.path());
    s.sglang.chat_url = format!("{upstream}/v1/chat/completions");
    s.sglang.token_ids = ps_config::TokenIdsMode::Engine;
    let r = run_checks(&s, &no_env).await;
    let (cause, fix) = failure(&r, CheckId::ChatLogprobs);
    assert!(cause.contains("without token ids"), "{cause}");
    assert!(fix.contains("sglang.token_ids = \"auto\""), "{fix}");
    // With `auto` the same server passes, and check says the samples will be re-tokenized.
    s.sglang.token_ids = ps_config::TokenIdsMode::Auto;
    let r = run_checks(&s, &no_env).await;
    let chat = detail(&r, CheckId::ChatLogprobs);
    assert!(chat.contains("token ids: re-tokenized"), "{chat}");
}

#[tokio::test]
async fn a_judge_answering_garbage_fails() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let judge = FakeSglang::builder().spawn().await.unwrap();
    judge.set_fault(Some(Fault::Garbage));
    let tmp = tempfile::tempdir().unwrap();
    let mut s = rl_settings(&fake, tmp.path());
    s.prm.router_url = judge.generate_url();
    let r = run_checks(&s, &no_env).await;
    let (cause, fix) = failure(&r, CheckId::PrmGenerate);
    assert!(cause.contains("not SGLang /generate JSON"), "{cause}");
    assert!(fix.contains("prm.router_url"), "{fix}");
}

#[tokio::test]
async fn a_judge_answer_without_a_box_points_at_max_new_tokens_and_the_model() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let judge = serve(Router::new().route(
        "/generate",
        post(|| async {
            Json(json!({"text": "Let me think about whether the answer is", "meta_info": {}}))
        }),
    ))
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let mut s = rl_settings(&fake, tmp.path());
    s.prm.router_url = format!("{judge}/generate");
    s.prm.max_new_tokens = 32;
    let r = run_checks(&s, &no_env).await;
    let (cause, fix) = failure(&r, CheckId::PrmGenerate);
    assert!(
        cause.contains("without a \\boxed{1}") && cause.contains("whether the answer is"),
        "{cause}"
    );
    assert!(
        fix.contains("prm.max_new_tokens (now 32)") && fix.contains("judge model"),
        "{fix}"
    );
}

/// A teacher `/generate` that scores every token but echoes the last one shifted by one.
async fn shifted_teacher() -> String {
    serve(Router::new().route(
        "/generate",
        post(|Json(body): Json<Value>| async move {
            let ids: Vec<u64> = body["input_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            let start = body["logprob_start_len"].as_u64().unwrap() as usize;
            let last = ids.len() - 1;
            let entries: Vec<Value> = (start..ids.len())
                .map(|i| {
                    let id = if i == last { ids[i] + 1 } else { ids[i] };
                    let lp = if i == start { Value::Null } else { json!(-0.5) };
                    json!([lp, id, null])
                })
                .collect();
            Json(json!({"text": "", "meta_info": {"input_token_logprobs": entries}}))
        }),
    ))
    .await
}

#[tokio::test]
async fn a_teacher_with_another_tokenizer_is_a_named_mismatch() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let teacher = shifted_teacher().await;
    let tmp = tempfile::tempdir().unwrap();
    let mut s = opd_settings(&fake, tmp.path());
    s.opd.top_k = 0;
    s.teacher.url = Some(format!("{teacher}/generate"));
    let r = run_checks(&s, &no_env).await;
    let (cause, fix) = failure(&r, CheckId::Teacher);
    let position = TEACHER_PROBE_TOKENS - 1;
    assert!(
        cause.starts_with(&format!(
            "the teacher's tokenizer differs from the policy's (first differing position {position}:"
        )),
        "{cause}"
    );
    assert!(
        cause.contains("our ids come from") && cause.contains("source: policy server"),
        "{cause}"
    );
    assert!(fix.contains("policy's tokenizer"), "{fix}");
    assert_eq!(r.failures().count(), 1, "{}", r.render());
}

#[tokio::test]
async fn a_refused_teacher_names_teacher_url() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut s = opd_settings(&fake, tmp.path());
    s.teacher.url = Some(format!("http://127.0.0.1:{}/generate", closed_port()));
    let r = run_checks(&s, &no_env).await;
    let (cause, fix) = failure(&r, CheckId::Teacher);
    assert!(cause.starts_with("nothing listens at"), "{cause}");
    assert_eq!(fix, "start the teacher or set teacher.url");
}

#[tokio::test]
async fn a_store_path_under_a_regular_file_names_store_path() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("plain-file");
    std::fs::write(&file, "x").unwrap();
    let mut s = rl_settings(&fake, tmp.path());
    s.store.path = file.join("store");
    let r = run_checks(&s, &no_env).await;
    let (cause, fix) = failure(&r, CheckId::Directories);
    assert!(
        cause.starts_with(&format!(
            "cannot write in store.path = {}",
            file.join("store").display()
        )),
        "{cause}"
    );
    assert!(fix.contains("set store.path"), "{fix}");
    assert_eq!(r.failures().count(), 1, "{}", r.render());
}

/// A provider-backed PRM against the fake provider; the key is read from `PS_CHECK_PROVIDER_KEY`.
fn provider_settings(fake: &FakeHandle, tmp: &Path, base_url: &str) -> Settings {
    let mut s = rl_settings(fake, tmp);
    s.prm.backend = PrmBackend::Provider;
    s.prm.model = Some("fake-judge".into());
    s.provider.base_url = Some(base_url.to_owned());
    s.provider.api_key_env = Some("PS_CHECK_PROVIDER_KEY".into());
    // The fake provider answers in milliseconds; a long timeout (the check caps it at 10 s) keeps
    // a loaded machine from failing a healthy check. The slow-provider test sets its own.
    s.provider.timeout_sec = 30;
    s.validate().unwrap();
    s
}

fn key_env(key: &'static str) -> impl Fn(&str) -> Option<String> {
    move |name: &str| (name == "PS_CHECK_PROVIDER_KEY").then(|| key.to_owned())
}

#[tokio::test]
async fn the_provider_passes_with_a_good_key_and_one_token() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let provider = FakeProvider::builder()
        .api_key("sk-good")
        .spawn()
        .await
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let s = provider_settings(&fake, tmp.path(), &provider.base_url());
    let r = run_checks(&s, &key_env("sk-good")).await;
    assert!(r.all_passed(), "{}", r.render());
    assert!(detail(&r, CheckId::KeyVariables).contains("PS_CHECK_PROVIDER_KEY"));
    let d = detail(&r, CheckId::Provider);
    assert!(
        d.contains("fake-judge") && d.contains("key from PS_CHECK_PROVIDER_KEY accepted"),
        "{d}"
    );
    // The judge check defers to the provider check for a provider-backed PRM.
    assert!(outcome(&r, CheckId::PrmGenerate).is_skip());
    let calls = provider.chat_requests();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].body["max_tokens"], 1);
    assert!(!r.render().contains("sk-good"));
}

#[tokio::test]
async fn a_missing_key_variable_is_named_by_both_checks() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let provider = FakeProvider::builder()
        .api_key("sk-good")
        .spawn()
        .await
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let s = provider_settings(&fake, tmp.path(), &provider.base_url());
    let r = run_checks(&s, &no_env).await;
    let (cause, fix) = failure(&r, CheckId::KeyVariables);
    assert!(
        cause.contains("PS_CHECK_PROVIDER_KEY (named by provider.api_key_env"),
        "{cause}"
    );
    assert!(cause.contains("is not set"), "{cause}");
    assert!(fix.contains("export PS_CHECK_PROVIDER_KEY"), "{fix}");
    let (cause, fix) = failure(&r, CheckId::Provider);
    assert!(
        cause.contains("HTTP 401")
            && cause.contains("PS_CHECK_PROVIDER_KEY")
            && cause.contains("not set"),
        "{cause}"
    );
    assert!(fix.contains("export PS_CHECK_PROVIDER_KEY"), "{fix}");
}

#[tokio::test]
async fn a_refused_key_names_the_provider_and_the_variable_never_the_key() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let provider = FakeProvider::builder()
        .api_key("sk-good")
        .spawn()
        .await
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let s = provider_settings(&fake, tmp.path(), &provider.base_url());
    let r = run_checks(&s, &key_env("sk-wrong-key-123")).await;
    let (cause, fix) = failure(&r, CheckId::Provider);
    assert!(
        cause.contains(&provider.base_url())
            && cause.contains("refused the key from PS_CHECK_PROVIDER_KEY (HTTP 401"),
        "{cause}"
    );
    assert!(fix.contains("PS_CHECK_PROVIDER_KEY"), "{fix}");
    assert!(!r.render().contains("sk-wrong-key-123"), "{}", r.render());
}

#[tokio::test]
async fn a_rate_limited_provider_says_so_with_retry_after() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let provider = FakeProvider::builder()
        .api_key("k-123")
        .spawn()
        .await
        .unwrap();
    provider.push_fault(ProviderFault::rate_limited(Some("7")));
    let tmp = tempfile::tempdir().unwrap();
    let s = provider_settings(&fake, tmp.path(), &provider.base_url());
    let r = run_checks(&s, &key_env("k-123")).await;
    let (cause, fix) = failure(&r, CheckId::Provider);
    assert!(
        cause.contains("rate-limited the call (HTTP 429, Retry-After 7 s)"),
        "{cause}"
    );
    assert!(fix.contains("provider.max_concurrency (now 4)"), "{fix}");
    // One call: the check does not retry.
    assert_eq!(provider.chat_requests().len(), 1);
}

#[tokio::test]
async fn an_exhausted_quota_is_not_called_a_rate_limit() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let provider = FakeProvider::builder()
        .api_key("k-123")
        .spawn()
        .await
        .unwrap();
    provider.push_fault(ProviderFault::insufficient_quota());
    let tmp = tempfile::tempdir().unwrap();
    let s = provider_settings(&fake, tmp.path(), &provider.base_url());
    let r = run_checks(&s, &key_env("k-123")).await;
    let (cause, fix) = failure(&r, CheckId::Provider);
    assert!(cause.contains("quota is exhausted"), "{cause}");
    assert!(fix.contains("add credit"), "{fix}");
}

#[tokio::test]
async fn a_failing_provider_reports_the_status() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let provider = FakeProvider::builder()
        .api_key("k-123")
        .spawn()
        .await
        .unwrap();
    provider.push_fault(ProviderFault::status(500));
    let tmp = tempfile::tempdir().unwrap();
    let s = provider_settings(&fake, tmp.path(), &provider.base_url());
    let r = run_checks(&s, &key_env("k-123")).await;
    let (cause, fix) = failure(&r, CheckId::Provider);
    assert!(
        cause.contains("failed (HTTP 500: The server had an error"),
        "{cause}"
    );
    assert!(fix.contains("provider.max_retries"), "{fix}");
}

#[tokio::test]
async fn a_slow_provider_times_out_within_the_configured_timeout() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let provider = FakeProvider::builder()
        .api_key("k-123")
        .spawn()
        .await
        .unwrap();
    // The provider would answer only after a minute.
    let slow = Duration::from_secs(60);
    provider.push_fault(ProviderFault::Slow(slow));
    let tmp = tempfile::tempdir().unwrap();
    let mut s = provider_settings(&fake, tmp.path(), &provider.base_url());
    s.provider.timeout_sec = 1;
    let r = run_checks(&s, &key_env("k-123")).await;
    let (cause, fix) = failure(&r, CheckId::Provider);
    assert!(
        cause.contains("did not answer a one-token call within 1 s"),
        "{cause}"
    );
    assert!(fix.contains("provider.timeout_sec (now 1)"), "{fix}");
    // It waited for the 1 s timeout, and gave up long before the answer: 30 s is a generous bound
    // for a 1 s timeout on a loaded machine, and half the provider's delay.
    let latency = r.get(CheckId::Provider).unwrap().latency.unwrap();
    assert!(
        latency >= Duration::from_secs(1) && latency < slow / 2,
        "{latency:?}"
    );
}

#[tokio::test]
async fn an_unknown_model_names_the_model_key() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let provider = FakeProvider::builder()
        .api_key("k-123")
        .models(&["other-model"])
        .strict_models(true)
        .spawn()
        .await
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let s = provider_settings(&fake, tmp.path(), &provider.base_url());
    let r = run_checks(&s, &key_env("k-123")).await;
    let (cause, fix) = failure(&r, CheckId::Provider);
    assert!(cause.contains("HTTP 404"), "{cause}");
    assert_eq!(
        fix,
        "check the model name in prm.model (now \"fake-judge\")"
    );
}

#[tokio::test]
async fn a_wrong_provider_root_names_provider_base_url() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let provider = FakeProvider::builder()
        .api_key("k-123")
        .spawn()
        .await
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    // A path under the root that has no chat route.
    let base = format!("{}/api", provider.base_url());
    let s = provider_settings(&fake, tmp.path(), &base);
    let r = run_checks(&s, &key_env("k-123")).await;
    let (cause, fix) = failure(&r, CheckId::Provider);
    assert!(
        cause.contains("HTTP 404") || cause.contains("not with an OpenAI"),
        "{cause}"
    );
    assert!(fix.contains("provider.base_url"), "{fix}");
}

#[tokio::test]
async fn the_submission_state_of_a_running_proxy_is_reported() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut s = rl_settings(&fake, tmp.path());
    s.store.path = tmp.path().join("proxy-store");
    let app = ps_app::build_app(&s, &no_env, None).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    s.server.port = listener.local_addr().unwrap().port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let app = ps_app::App {
        state: app,
        routes: Default::default(),
    };
    let server = tokio::spawn(ps_app::serve(listener, app, async {
        let _ = stopped.await;
    }));
    let r = run_checks(&s, &no_env).await;
    assert!(r.all_passed(), "{}", r.render());
    assert!(detail(&r, CheckId::Submission).contains("submission enabled"));

    let base = format!("http://127.0.0.1:{}", s.server.port);
    let paused = reqwest::Client::new()
        .post(format!("{base}/v1/rollout/pause"))
        .send()
        .await
        .unwrap();
    assert!(paused.status().is_success(), "{paused:?}");
    let r = run_checks(&s, &no_env).await;
    let (cause, fix) = failure(&r, CheckId::Submission);
    assert!(cause.starts_with("submission is paused"), "{cause}");
    assert!(
        fix.starts_with(&format!("POST {base}/v1/rollout/resume")),
        "{fix}"
    );
    assert_eq!(r.failures().count(), 1, "{}", r.render());

    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn the_report_prints_one_line_per_check_and_one_per_failure() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut s = rl_settings(&fake, tmp.path());
    s.prm.router_url = format!("http://127.0.0.1:{}/generate", closed_port());
    let r = run_checks(&s, &no_env).await;
    let text = r.render();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), CheckId::ALL.len() + 1, "{text}");
    let mut checks = lines.iter().filter(|l| !l.starts_with("     cause: "));
    for id in CheckId::ALL {
        let line = checks.next().unwrap();
        let c = r.get(id).unwrap();
        assert!(line.starts_with(c.outcome.status()), "{line}");
        assert_eq!(&line[5..5 + id.name().len()], id.name(), "{line}");
        if c.outcome.is_skip() {
            assert!(line.contains("       -  "), "{line}");
        } else {
            assert!(line.contains(" ms"), "{line}");
        }
    }
    let fail_at = lines
        .iter()
        .position(|l| l.starts_with("FAIL prm judge /generate"))
        .unwrap();
    assert!(
        lines[fail_at + 1].starts_with("     cause: nothing listens at")
            && lines[fail_at + 1].contains(" — fix: start the judge or set prm.router_url"),
        "{text}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("ok   sglang health")),
        "{text}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("skip teacher logprobs")),
        "{text}"
    );
    assert_eq!(r.summary(), "1 of 11 checks FAILED (4 skipped)");
}

#[tokio::test]
async fn check_shows_which_tokenizer_serve_would_use_and_why() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut s = rl_settings(&fake, tmp.path());
    let r = run_checks(&s, &no_env).await;
    let d = detail(&r, CheckId::PolicyTokenizer);
    assert!(d.starts_with(MINI_MODEL_DIR), "{d}");
    assert!(
        d.contains(&format!(
            "(source: policy server, reported by {}/get_model_info; server.model_dir is unset)",
            fake.base_url()
        )),
        "{d}"
    );
    s.server.model_dir = Some(MINI_MODEL_DIR.into());
    let r = run_checks(&s, &no_env).await;
    let d = detail(&r, CheckId::PolicyTokenizer);
    assert!(d.contains("(source: setting server.model_dir)"), "{d}");

    // A policy server that does not say what it serves: `serve` would refuse, so the check fails.
    let silent = FakeSglang::builder()
        .model_path(None)
        .spawn()
        .await
        .unwrap();
    let s = rl_settings(&silent, tmp.path());
    let r = run_checks(&s, &no_env).await;
    let (cause, fix) = failure(&r, CheckId::PolicyTokenizer);
    assert!(cause.contains("does not report its model path"), "{cause}");
    assert!(fix.starts_with("set server.model_dir"), "{fix}");
}

#[tokio::test]
async fn check_shows_that_sglang_api_key_empty_means_bearer_empty_with_the_curl_line_that_works() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let s = rl_settings(&fake, tmp.path());
    let env = |k: &str| (k == "SGLANG_API_KEY").then(|| "EMPTY".to_owned());
    let r = run_checks(&s, &env).await;
    let d = detail(&r, CheckId::ClientAuth);
    assert!(
        d.starts_with(
            "SGLANG_API_KEY=EMPTY is set, so clients must send `Authorization: Bearer EMPTY`"
        ),
        "{d}"
    );
    assert!(
        d.ends_with(&format!(
            "curl -H \"Authorization: Bearer EMPTY\" http://127.0.0.1:{}/v1/models",
            s.server.port
        )),
        "{d}"
    );
    let r = run_checks(&s, &no_env).await;
    let d = detail(&r, CheckId::ClientAuth);
    assert!(d.starts_with("clients need no key"), "{d}");
    // Another key's value is never printed.
    let env = |k: &str| (k == "SGLANG_API_KEY").then(|| "sk-secret-value".to_owned());
    let r = run_checks(&s, &env).await;
    let text = r.render();
    assert!(!text.contains("sk-secret-value"), "{text}");
    assert!(
        detail(&r, CheckId::ClientAuth).contains("Bearer $SGLANG_API_KEY"),
        "{text}"
    );
}

/// `check` says plainly which requests train: by default an unmodified agent's (no session key)
/// do and keyed requests without a turn type do not; with `default_turn_type = "side"` nothing
/// without a turn type trains, and the line says what to change.
#[tokio::test]
async fn check_says_which_requests_train() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut s = rl_settings(&fake, tmp.path());
    s.server.default_turn_type = ps_config::DefaultTurnType::Auto;
    let r = run_checks(&s, &no_env).await;
    let d = detail(&r, CheckId::TurnTypes);
    assert!(
        d.contains("without a session key they are main turns: they train")
            && d.contains("with one they are side turns: they never train")
            && d.contains("openclaw_memory_flush"),
        "{d}"
    );
    s.server.default_turn_type = ps_config::DefaultTurnType::Side;
    let d = detail(&run_checks(&s, &no_env).await, CheckId::TurnTypes);
    assert!(
        d.contains("without a session key they are side turns: they never train")
            && d.contains("unmodified agents produce no samples"),
        "{d}"
    );
    s.server.default_turn_type = ps_config::DefaultTurnType::Main;
    let d = detail(&run_checks(&s, &no_env).await, CheckId::TurnTypes);
    assert!(
        d.contains("without a session key they are main turns: they train")
            && d.contains("with one they are main turns: they train"),
        "{d}"
    );
}
