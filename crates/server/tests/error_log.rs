//! Errors are logged once, at the router's edge, inside the request span, whichever route gave
//! them: here a rollout route whose sample store fails (a 500 that used to leave no log line).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use ps_chat_template::ChatTokenizer;
use ps_core::{
    CapturedTurn, LogError, PendingStore, PendingTurn, SampleLog, SampleSink, SinkError,
    StoreStats, StoredSample, TurnSink,
};
use ps_server::rollout::Rollout;
use ps_server::{AppState, CaptureQueue, ServerOptions};
use ps_session_buffer::{BufferConfig, BufferMode, OpdOptions, SessionBuffer};
use ps_sglang_client::{SglangClient, SglangClientConfig};
use tower::ServiceExt as _;

const FAILURE: &str = "the disk is on fire";

/// A sample store every call of which fails.
struct FailingStore;

#[async_trait::async_trait]
impl SampleSink for FailingStore {
    async fn submit(&self, _sample: &ps_core::sample::Sample) -> Result<u64, SinkError> {
        Err(SinkError::Store(FAILURE.into()))
    }
}

#[async_trait::async_trait]
impl PendingStore for FailingStore {
    async fn save_pending(&self, _turns: Vec<PendingTurn>) -> Result<usize, SinkError> {
        Err(SinkError::Store(FAILURE.into()))
    }
    async fn take_pending(&self) -> Result<Vec<PendingTurn>, SinkError> {
        Err(SinkError::Store(FAILURE.into()))
    }
}

#[async_trait::async_trait]
impl SampleLog for FailingStore {
    async fn read(&self, _: u64, _: usize, _: &str) -> Result<Vec<StoredSample>, LogError> {
        Err(LogError::store(FAILURE))
    }
    async fn get(&self, _: u64) -> Result<Option<StoredSample>, LogError> {
        Err(LogError::store(FAILURE))
    }
    async fn wait_newer(&self, _: u64, _: Duration) -> Result<u64, LogError> {
        Err(LogError::store(FAILURE))
    }
    async fn commit(&self, _: u64, _: &str) -> Result<(), LogError> {
        Err(LogError::store(FAILURE))
    }
    async fn stats(&self) -> Result<StoreStats, LogError> {
        Err(LogError::store(FAILURE))
    }
    async fn close(&self) -> Result<(), LogError> {
        Ok(())
    }
    fn describe(&self) -> String {
        "failing test store".into()
    }
}

struct NoSink;

impl TurnSink for NoSink {
    fn accept(&self, _turn: CapturedTurn) {}
}

/// The log lines written while the test runs (this thread's subscriber).
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn app() -> AppState {
    let store = Arc::new(FailingStore);
    let buffer = SessionBuffer::new(
        BufferConfig {
            mode: BufferMode::Rl,
            opd: OpdOptions::default(),
            prm_enabled: false,
            session_timeout: Duration::from_secs(60),
            max_sessions: 16,
            max_judge_backlog: 16,
        },
        None,
        store.clone(),
        None,
    );
    let policy = SglangClient::new(SglangClientConfig {
        // Never called: only the rollout routes are.
        chat_url: "http://127.0.0.1:9/v1/chat/completions".into(),
        api_key: None,
        timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(1),
    })
    .unwrap();
    let capture = CaptureQueue::start(
        Arc::new(ChatTokenizer::mini()),
        Arc::new(NoSink),
        ServerOptions::default().align_policy,
        ps_server::capture::DriftCheck::new(0, 0),
        4,
        1,
    )
    .unwrap();
    let rollout = Rollout {
        store,
        buffer: std::sync::Arc::new(buffer),
        on_pause: None,
    };
    AppState::with_rollout(
        ServerOptions::default(),
        Arc::new(policy),
        capture,
        None,
        Some(rollout),
    )
}

#[tokio::test]
async fn a_rollout_store_failure_is_a_500_logged_once_in_the_request_span() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    // A current-thread runtime: the handler runs on this thread, under this subscriber.
    let _guard = tracing::subscriber::set_default(subscriber);
    let router = ps_server::build_router(app());
    let resp = router
        .oneshot(
            http::Request::get("/v1/rollout/status")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), http::StatusCode::INTERNAL_SERVER_ERROR);
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"]["code"], "store_error");

    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let logged: Vec<&str> = text.lines().filter(|l| l.contains(FAILURE)).collect();
    assert_eq!(logged.len(), 1, "logged once, got:\n{text}");
    let line = logged[0];
    assert!(line.contains("ERROR"), "at error level: {line}");
    assert!(line.contains("request:"), "inside the request span: {line}");
    assert!(line.contains("code=\"store_error\""), "{line}");
    assert!(line.contains("path=\"/v1/rollout/status\""), "{line}");
    assert!(line.contains("status=500"), "{line}");
}

/// The chat route keeps its span name and message ("rejected chat request"), which operators filter
/// on, while the other routes share the edge's generic ones.
#[tokio::test]
async fn a_rejected_chat_request_keeps_its_span_and_message() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let router = ps_server::build_router(app());
    let resp = router
        .oneshot(
            http::Request::post("/v1/chat/completions")
                .header("content-type", "application/json")
                .body(Body::from("{not json"))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), http::StatusCode::BAD_REQUEST);
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let logged: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("rejected chat request"))
        .collect();
    assert_eq!(logged.len(), 1, "logged once, got:\n{text}");
    assert!(
        logged[0].contains("chat:"),
        "inside the chat span: {}",
        logged[0]
    );
    assert!(
        !text.contains("request rejected"),
        "no generic line for the chat route:\n{text}"
    );
}
