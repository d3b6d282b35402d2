//! The provider client against the in-process fake provider: success, key errors, the retry policy
//! (on tokio's paused clock), the shared concurrency cap, time-outs, metrics and logs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    io::Write,
    sync::{Arc, Mutex},
    time::Duration,
};

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use ps_config::ProviderSettings;
use ps_core::metric_names::{
    PROVIDER_GIVE_UPS_TOTAL, PROVIDER_RATE_LIMITED_TOTAL, PROVIDER_RETRIES_TOTAL,
    PROVIDER_UNAUTHORIZED_TOTAL,
};
use ps_fake_sglang::{FakeProvider, FakeProviderHandle, ProviderFault};
use ps_provider_client::{ProviderClient, ProviderConfig, ProviderError};
use serde_json::{Value, json};

const KEY: &str = "sk-test-5f2c9a71e0";
const VAR: &str = "TAOTOKEN_API_KEY";

async fn fake() -> FakeProviderHandle {
    FakeProvider::builder().api_key(KEY).spawn().await.unwrap()
}

fn config(chat_url: String) -> ProviderConfig {
    ProviderConfig {
        name: "taotoken".into(),
        chat_url,
        api_key: Some(KEY.into()),
        key_var: Some(VAR.into()),
        max_concurrency: 4,
        timeout: Duration::from_secs(30),
        max_retries: 2,
        deadline: None,
    }
}

fn client(p: &FakeProviderHandle) -> ProviderClient {
    ProviderClient::new(config(p.chat_url())).unwrap()
}

fn client_with(p: &FakeProviderHandle, f: impl FnOnce(&mut ProviderConfig)) -> ProviderClient {
    let mut c = config(p.chat_url());
    f(&mut c);
    ProviderClient::new(c).unwrap()
}

fn judge_prompt(next_state: &str) -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "You judge one step."}),
        json!({"role": "user", "content": format!("Next state: {next_state}")}),
    ]
}

async fn ask(c: &ProviderClient) -> Result<ps_provider_client::ChatAnswer, ProviderError> {
    c.chat(
        "judge-model",
        &judge_prompt("ok FAKE_VOTES=1"),
        Some(64),
        Some(0.6),
    )
    .await
}

#[tokio::test]
async fn a_root_with_or_without_v1_reaches_the_chat_path() {
    let p = fake().await;
    let root = p.base_url();
    for base in [
        root.clone(),
        format!("{root}/"),
        format!("{root}/v1"),
        format!("{root}/v1/"),
    ] {
        let settings = ProviderSettings {
            base_url: Some(base.clone()),
            ..ProviderSettings::default()
        };
        let url = settings.chat_completions_url().unwrap();
        assert_eq!(url, p.chat_url(), "{base}");
        let c = ProviderClient::new(config(url)).unwrap();
        ask(&c).await.unwrap();
    }
    let paths: Vec<String> = p.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, vec!["/v1/chat/completions"; 4]);
}

#[tokio::test]
async fn a_successful_call_sends_the_key_and_returns_the_first_choice() {
    let p = fake().await;
    let c = client(&p);
    let a = ask(&c).await.unwrap();
    assert!(
        a.content.as_deref().unwrap().ends_with("\\boxed{1}"),
        "{a:?}"
    );
    assert_eq!(a.reasoning, None);
    assert_eq!(a.finish_reason.as_deref(), Some("stop"));
    assert!(a.usage.unwrap().total_tokens > 0);
    assert_eq!(a.model.as_deref(), Some("judge-model"));
    let r = &p.requests()[0];
    assert_eq!(r.headers["authorization"], format!("Bearer {KEY}"));
    assert_eq!(r.body["model"], "judge-model");
    assert_eq!(r.body["messages"], json!(judge_prompt("ok FAKE_VOTES=1")));
    assert_eq!(r.body["max_tokens"], 64);
    assert_eq!(r.body["temperature"], 0.6);
    assert_eq!(r.body["stream"], false);
    // Unset sampling parameters are not sent.
    c.chat("m", &judge_prompt("x"), None, None).await.unwrap();
    let body = &p.requests()[1].body;
    assert!(body.get("max_tokens").is_none() && body.get("temperature").is_none());
    assert_eq!(c.available_permits(), 4, "permits are returned");
}

fn assert_names_provider_and_variable(err: &ProviderError, url: &str) {
    let text = err.to_string();
    assert!(text.contains("provider `taotoken`"), "{text}");
    assert!(text.contains(url), "{text}");
    assert!(text.contains(VAR), "{text}");
    assert!(!text.contains(KEY), "{text}");
    assert!(!format!("{err:?}").contains(KEY), "{err:?}");
}

#[tokio::test]
async fn a_rejected_key_is_not_retried_and_names_the_variable_not_the_key() {
    // The fake expects another key and echoes the one it got in its message.
    let p = FakeProvider::builder()
        .api_key("the-right-key")
        .spawn()
        .await
        .unwrap();
    let c = client(&p);
    let err = ask(&c).await.unwrap_err();
    assert!(
        matches!(err, ProviderError::Unauthorized { status: 401, .. }),
        "{err:?}"
    );
    assert!(err.is_fatal());
    assert_names_provider_and_variable(&err, &p.chat_url());
    assert!(
        err.to_string().contains("(HTTP 401)")
            && err
                .to_string()
                .contains("check that the variable holds a valid key"),
        "{err}"
    );
    assert!(
        err.to_string().contains("<redacted>"),
        "the echoed key is redacted: {err}"
    );
    assert_eq!(p.requests().len(), 1, "401 is not retried");
}

#[tokio::test]
async fn forbidden_is_not_retried_either() {
    let p = fake().await;
    p.push_fault(ProviderFault::status(403));
    let err = ask(&client(&p)).await.unwrap_err();
    assert!(
        matches!(err, ProviderError::Unauthorized { status: 403, .. }),
        "{err:?}"
    );
    assert_names_provider_and_variable(&err, &p.chat_url());
    assert!(err.to_string().contains("HTTP 403"), "{err}");
    assert_eq!(p.requests().len(), 1);
}

#[tokio::test]
async fn without_a_key_the_message_says_which_setting_to_fill() {
    let p = fake().await;
    let c = client_with(&p, |c| {
        c.api_key = None;
        c.key_var = None;
    });
    let err = ask(&c).await.unwrap_err();
    assert!(err.to_string().contains("provider.api_key_env"), "{err}");
    assert!(p.requests()[0].headers.get("authorization").is_none());
}

#[tokio::test(start_paused = true)]
async fn a_429_with_retry_after_waits_that_long_then_succeeds() {
    let p = fake().await;
    p.push_fault(ProviderFault::rate_limited(Some("1")));
    let a = ask(&client(&p)).await.unwrap();
    assert!(a.content.is_some());
    let r = p.requests();
    assert_eq!(r.len(), 2, "one retry");
    let waited = r[1].at - r[0].at;
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_millis(1100),
        "waited {waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn retry_after_ms_and_an_http_date_are_honoured() {
    let p = fake().await;
    p.push_fault(ProviderFault::status(503).with_header("retry-after-ms", "2500"));
    // The client reads an HTTP date against the real clock (`SystemTime`), which runs on while
    // this test's tokio clock is paused. A date 30 s ahead (whole seconds) leaves any real delay
    // up to 10 s between here and the answer as margin, and no back-off (at most 8 s) reaches 20 s.
    let in_30s = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(30));
    p.push_fault(ProviderFault::rate_limited(Some(&in_30s)));
    ask(&client(&p)).await.unwrap();
    let r = p.requests();
    assert_eq!(r.len(), 3);
    let first = r[1].at - r[0].at;
    assert_eq!(first, Duration::from_millis(2500));
    let second = r[2].at - r[1].at;
    assert!(
        second > Duration::from_secs(20) && second <= Duration::from_secs(30),
        "{second:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_gives_up_at_its_deadline_however_many_retries_are_left() {
    let p = fake().await;
    p.set_fault(Some(
        ProviderFault::status(503).with_header("retry-after", "2"),
    ));
    let c = client_with(&p, |c| {
        c.max_retries = 50;
        c.deadline = Some(Duration::from_secs(5));
    });
    let started = tokio::time::Instant::now();
    let err = ask(&c).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    assert!(
        matches!(err, ProviderError::Deadline { attempts: 3, .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("provider.deadline_sec"), "{text}");
    assert!(text.contains(&p.chat_url()), "{text}");
    assert_eq!(p.requests().len(), 3, "at 0 s, 2 s and 4 s");
}

#[tokio::test]
async fn insufficient_quota_is_not_retried() {
    let p = fake().await;
    p.push_fault(ProviderFault::insufficient_quota());
    let err = ask(&client(&p)).await.unwrap_err();
    assert!(matches!(err, ProviderError::Quota { .. }), "{err:?}");
    assert!(err.to_string().contains("insufficient_quota"), "{err}");
    assert_eq!(p.requests().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn persistent_5xx_gives_up_after_max_retries_with_backoff() {
    let p = fake().await;
    p.set_fault(Some(ProviderFault::status(500)));
    let err = ask(&client(&p)).await.unwrap_err();
    assert!(
        matches!(
            err,
            ProviderError::Status {
                status: 500,
                attempts: 3,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("HTTP 500 after 3 attempt(s)"),
        "{err}"
    );
    let r = p.requests();
    assert_eq!(r.len(), 3, "max_retries = 2");
    // 0.5 s then 1 s, each shortened by at most 25 %.
    let waits = [r[1].at - r[0].at, r[2].at - r[1].at];
    assert!(
        waits[0] >= Duration::from_millis(375) && waits[0] <= Duration::from_millis(500),
        "{waits:?}"
    );
    assert!(
        waits[1] >= Duration::from_millis(750) && waits[1] <= Duration::from_millis(1000),
        "{waits:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn other_retryable_statuses_are_retried() {
    let p = fake().await;
    for s in [408, 409, 502, 529] {
        p.push_fault(ProviderFault::status(s));
    }
    let c = client_with(&p, |c| c.max_retries = 4);
    ask(&c).await.unwrap();
    assert_eq!(p.requests().len(), 5);
}

#[tokio::test]
async fn bad_requests_and_unknown_models_are_not_retried() {
    let p = FakeProvider::builder()
        .api_key(KEY)
        .strict_models(true)
        .spawn()
        .await
        .unwrap();
    let err = ask(&client(&p)).await.unwrap_err();
    assert!(
        matches!(err, ProviderError::Rejected { status: 404, .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("model_not_found") && text.contains("judge-model"),
        "{text}"
    );
    p.push_fault(ProviderFault::status(400));
    let err = c_ok_model(&p).await.unwrap_err();
    assert!(
        matches!(err, ProviderError::Rejected { status: 400, .. }),
        "{err:?}"
    );
    assert_eq!(p.requests().len(), 2);
}

async fn c_ok_model(
    p: &FakeProviderHandle,
) -> Result<ps_provider_client::ChatAnswer, ProviderError> {
    client(p)
        .chat("fake-judge", &judge_prompt("x"), None, None)
        .await
}

#[tokio::test]
async fn x_should_retry_false_stops_a_5xx_retry() {
    let p = fake().await;
    p.push_fault(ProviderFault::status(500).with_header("x-should-retry", "false"));
    let err = ask(&client(&p)).await.unwrap_err();
    assert!(
        matches!(
            err,
            ProviderError::Status {
                status: 500,
                attempts: 1,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(p.requests().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn x_should_retry_true_retries_a_400() {
    let p = fake().await;
    p.push_fault(ProviderFault::status(400).with_header("x-should-retry", "true"));
    ask(&client(&p)).await.unwrap();
    assert_eq!(p.requests().len(), 2);
}

#[tokio::test]
async fn a_garbage_body_is_an_error() {
    let p = fake().await;
    p.push_fault(ProviderFault::Garbage);
    let err = ask(&client(&p)).await.unwrap_err();
    assert!(matches!(err, ProviderError::InvalidBody { .. }), "{err:?}");
    assert!(err.to_string().contains("not a chat completion"), "{err}");
    assert_eq!(p.requests().len(), 1);
}

#[tokio::test]
async fn the_cap_is_shared_by_all_concurrent_calls() {
    let p = fake().await;
    let c = Arc::new(client_with(&p, |c| c.max_concurrency = 2));
    p.hold();
    let calls: Vec<_> = (0..10)
        .map(|i| {
            let c = c.clone();
            tokio::spawn(async move {
                c.chat("m", &judge_prompt(&format!("call {i}")), None, None)
                    .await
            })
        })
        .collect();
    p.wait_for_in_flight(2).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(p.in_flight(), 2, "the others wait for a permit");
    assert_eq!(p.requests().len(), 2);
    assert_eq!(c.available_permits(), 0);
    p.release();
    for r in futures::future::join_all(calls).await {
        r.unwrap().unwrap();
    }
    assert_eq!(p.requests().len(), 10);
    assert_eq!(p.max_in_flight(), 2);
    assert_eq!(c.available_permits(), 2);
}

#[tokio::test(start_paused = true)]
async fn permits_are_not_held_while_waiting_to_retry() {
    let p = fake().await;
    let c = Arc::new(client_with(&p, |c| c.max_concurrency = 1));
    p.push_fault(ProviderFault::rate_limited(Some("30")));
    let first = {
        let c = c.clone();
        tokio::spawn(async move { c.chat("m", &judge_prompt("a"), None, None).await })
    };
    p.wait_for_requests(1).await;
    // While the first call sleeps 30 s before its retry, a second call gets the permit at once.
    let started = tokio::time::Instant::now();
    c.chat("m", &judge_prompt("b"), None, None).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(1));
    first.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_slow_provider_times_out() {
    let p = fake().await;
    p.set_fault(Some(ProviderFault::Slow(Duration::from_secs(60))));
    let c = client_with(&p, |c| {
        c.timeout = Duration::from_secs(2);
        c.max_retries = 1;
    });
    let started = tokio::time::Instant::now();
    let err = ask(&c).await.unwrap_err();
    assert!(
        matches!(err, ProviderError::Timeout { attempts: 2, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("provider.timeout_sec"), "{err}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(4) && took < Duration::from_secs(5),
        "two 2 s attempts and one back-off: {took:?}"
    );
    // A slow first attempt is retried.
    p.set_fault(None);
    p.push_fault(ProviderFault::Slow(Duration::from_secs(60)));
    ask(&c).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_refused_connection_is_retried_then_named() {
    let p = fake().await;
    let url = p.chat_url();
    p.shutdown().await;
    let c = ProviderClient::new(config(url.clone())).unwrap();
    let err = ask(&c).await.unwrap_err();
    assert!(
        matches!(err, ProviderError::Connect { attempts: 3, .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&url) && text.contains("provider.base_url"),
        "{text}"
    );
}

/// One counter: `(name, labels, value)`.
type Count = (String, Vec<(String, String)>, u64);

/// The counters recorded since the last call (a debugging snapshot drains them), as
/// `(name, labels, value)`.
fn drain(snap: &Snapshotter) -> Vec<Count> {
    snap.snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(k, _, _, v)| match v {
            DebugValue::Counter(n) if n > 0 => Some((
                k.key().name().to_owned(),
                k.key()
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect(),
                n,
            )),
            _ => None,
        })
        .collect()
}

fn c(name: &str, labels: &[(&str, &str)], n: u64) -> Count {
    (
        name.to_owned(),
        labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        n,
    )
}

fn sorted(mut v: Vec<Count>) -> Vec<Count> {
    v.sort();
    v
}

#[tokio::test(start_paused = true)]
async fn retries_429s_give_ups_and_rejected_keys_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let p = fake().await;
    let client = client(&p);

    p.push_fault(ProviderFault::rate_limited(None));
    p.push_fault(ProviderFault::status(502));
    ask(&client).await.unwrap();
    assert_eq!(
        sorted(drain(&snap)),
        sorted(vec![
            c(PROVIDER_RATE_LIMITED_TOTAL, &[("code", "rate_limit")], 1),
            c(PROVIDER_RETRIES_TOTAL, &[("reason", "429")], 1),
            c(PROVIDER_RETRIES_TOTAL, &[("reason", "5xx")], 1),
        ])
    );

    p.push_fault(ProviderFault::insufficient_quota());
    ask(&client).await.unwrap_err();
    assert_eq!(
        sorted(drain(&snap)),
        sorted(vec![
            c(
                PROVIDER_RATE_LIMITED_TOTAL,
                &[("code", "insufficient_quota")],
                1
            ),
            c(PROVIDER_GIVE_UPS_TOTAL, &[("reason", "quota")], 1),
        ])
    );

    p.set_fault(Some(ProviderFault::status(500)));
    ask(&client).await.unwrap_err();
    assert_eq!(
        sorted(drain(&snap)),
        sorted(vec![
            c(PROVIDER_RETRIES_TOTAL, &[("reason", "5xx")], 2),
            c(PROVIDER_GIVE_UPS_TOTAL, &[("reason", "5xx")], 1),
        ])
    );

    p.set_fault(Some(ProviderFault::Unauthorized));
    ask(&client).await.unwrap_err();
    assert_eq!(
        sorted(drain(&snap)),
        sorted(vec![
            c(PROVIDER_UNAUTHORIZED_TOTAL, &[], 1),
            c(PROVIDER_GIVE_UPS_TOTAL, &[("reason", "unauthorized")], 1),
        ])
    );
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Buffer {
    type Writer = Buffer;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[tokio::test(start_paused = true)]
async fn the_key_never_reaches_the_logs() {
    let buffer = Buffer::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(buffer.clone())
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let p = fake().await;
    let c = client(&p);
    // A retried failure, then a rejected key that the provider echoes back.
    p.push_fault(ProviderFault::rate_limited(Some("1")));
    p.push_fault(ProviderFault::Unauthorized);
    let err = ask(&c).await.unwrap_err();
    tracing::error!(error = %err, client = ?c, "judge call failed");
    let logs = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("provider call failed; retrying"), "{logs}");
    assert!(logs.contains(VAR), "the variable is named: {logs}");
    assert!(!logs.contains(KEY), "the key leaked into the logs:\n{logs}");
}
