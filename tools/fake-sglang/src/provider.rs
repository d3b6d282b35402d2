//! [`FakeProvider`]: an in-process stand-in for a hosted OpenAI-compatible provider (the judges'
//! external provider, `docs/upstream-protocols.md` section 4). It serves `POST /v1/chat/completions`
//! and `GET /v1/models` behind `Authorization: Bearer <key>` (401 with the nested OpenAI error body
//! otherwise), answers judge prompts like the fake's `/generate` does (`\boxed{…}`, hints for prompts
//! mentioning `[HINT_START]`, `FAKE_VOTES=…` scripting), and can be scripted with
//! [`ProviderFault`]s: error statuses with headers such as `Retry-After`, slow answers, garbage
//! bodies, rejected keys. It records every request with its headers and arrival time (tokio's clock,
//! so paused-time tests can read waits), counts requests in flight and the most seen at once, and
//! has a hold/release gate.
//!
//! Over ~600 lines: one self-contained fake server (routes, faults, recorder) and its unit tests.

use std::{
    collections::{HashMap, VecDeque},
    net::SocketAddr,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use axum::{
    Router,
    body::{Bytes, to_bytes},
    extract::{Request, State},
    http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use serde_json::{Value, json};
use tokio::{net::TcpListener, sync::oneshot, sync::watch};

use crate::model::{content_text, default_vote, judge_text, scripted_votes};
use crate::server_task::ServerTask;

/// Largest request body the fake accepts.
const MAX_BODY: usize = 16 * 1024 * 1024;

/// Entry point: `FakeProvider::builder().api_key("k").spawn().await`.
#[derive(Debug, Clone, Copy)]
pub struct FakeProvider;

impl FakeProvider {
    pub fn builder() -> FakeProviderBuilder {
        FakeProviderBuilder::default()
    }
}

/// A scripted misbehaviour of one request (or of every request, see [`FakeProviderHandle::set_fault`]).
#[derive(Debug, Clone, PartialEq)]
pub enum ProviderFault {
    /// Answer `status` with `body` and the extra `headers` (for example `Retry-After`).
    Status {
        status: u16,
        body: Value,
        headers: Vec<(String, String)>,
    },
    /// Wait this long, then answer normally.
    Slow(Duration),
    /// HTTP 200 with a body that is not JSON.
    Garbage,
    /// HTTP 401 `invalid_api_key`, whatever key was sent.
    Unauthorized,
    /// A normal answer whose `content` is null, the text in `reasoning_content` (DeepSeek-style).
    ReasoningOnly,
}

impl ProviderFault {
    /// `status` with an OpenAI-shaped error body fitting it.
    pub fn status(status: u16) -> Self {
        let (kind, code, message) = match status {
            400 => ("invalid_request_error", Value::Null, "bad request"),
            401 => (
                "invalid_request_error",
                json!("invalid_api_key"),
                "Incorrect API key provided",
            ),
            403 => (
                "permission_error",
                json!("unsupported_country_region_territory"),
                "Country, region, or territory not supported",
            ),
            404 => (
                "invalid_request_error",
                json!("model_not_found"),
                "The model does not exist or you do not have access to it.",
            ),
            408 => ("timeout", Value::Null, "Request timed out"),
            409 => ("conflict", Value::Null, "Conflict"),
            429 => (
                "requests",
                json!("rate_limit_exceeded"),
                "Rate limit reached for requests",
            ),
            529 => ("overloaded_error", Value::Null, "Overloaded"),
            _ => (
                "server_error",
                Value::Null,
                "The server had an error while processing your request.",
            ),
        };
        Self::Status {
            status,
            body: openai_error(message, kind, code),
            headers: Vec::new(),
        }
    }

    /// HTTP 429 `rate_limit_exceeded`, with `Retry-After: <retry_after>` when given.
    pub fn rate_limited(retry_after: Option<&str>) -> Self {
        let f = Self::status(429);
        match retry_after {
            Some(v) => f.with_header("retry-after", v),
            None => f,
        }
    }

    /// HTTP 429 `insufficient_quota` (not to be retried).
    pub fn insufficient_quota() -> Self {
        Self::Status {
            status: 429,
            body: openai_error(
                "You exceeded your current quota, please check your plan and billing details.",
                "insufficient_quota",
                json!("insufficient_quota"),
            ),
            headers: Vec::new(),
        }
    }

    /// The same fault with one more response header (only for [`ProviderFault::Status`]).
    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        if let Self::Status { headers, .. } = &mut self {
            headers.push((name.to_owned(), value.to_owned()));
        }
        self
    }
}

/// The nested OpenAI error body.
fn openai_error(message: &str, kind: &str, code: Value) -> Value {
    json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
}

/// One request the fake provider received.
#[derive(Debug, Clone)]
pub struct ProviderRequest {
    /// Arrival time on tokio's clock (paused-time tests can compare them).
    pub at: tokio::time::Instant,
    pub method: String,
    pub path: String,
    pub headers: HeaderMap,
    /// The parsed JSON body; a body that is not JSON is kept as a JSON string (empty: `null`).
    pub body: Value,
}

/// Configures a fake provider.
#[derive(Clone)]
pub struct FakeProviderBuilder {
    api_key: String,
    models: Vec<String>,
    strict_models: bool,
    latency: Duration,
}

impl Default for FakeProviderBuilder {
    fn default() -> Self {
        Self {
            api_key: "fake-provider-key".into(),
            models: vec!["fake-judge".into()],
            strict_models: false,
            latency: Duration::ZERO,
        }
    }
}

impl std::fmt::Debug for FakeProviderBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeProviderBuilder")
            .field("models", &self.models)
            .field("strict_models", &self.strict_models)
            .field("latency", &self.latency)
            .finish_non_exhaustive()
    }
}

impl FakeProviderBuilder {
    /// The key clients must send as `Authorization: Bearer <key>` (default `fake-provider-key`).
    pub fn api_key(mut self, key: &str) -> Self {
        self.api_key = key.to_owned();
        self
    }

    /// The models `/v1/models` lists (default `["fake-judge"]`).
    pub fn models(mut self, models: &[&str]) -> Self {
        self.models = models.iter().map(|m| (*m).to_owned()).collect();
        self
    }

    /// Answer 404 `model_not_found` for a model not in [`Self::models`] (default: accept any).
    pub fn strict_models(mut self, strict: bool) -> Self {
        self.strict_models = strict;
        self
    }

    /// Wait before every chat answer.
    pub fn latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// Binds `127.0.0.1:0` and serves in the background.
    pub async fn spawn(self) -> std::io::Result<FakeProviderHandle> {
        let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let state = ProviderState::new(self);
        let app = provider_router(state.clone());
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stop_rx.await;
                })
                .await
        });
        tracing::debug!(%addr, "fake provider listening");
        Ok(FakeProviderHandle {
            state,
            addr,
            server: ServerTask::new("fake provider", stop_tx, task),
        })
    }
}

struct Inner {
    config: FakeProviderBuilder,
    requests: Mutex<Vec<ProviderRequest>>,
    recorded: watch::Sender<usize>,
    queue: Mutex<VecDeque<ProviderFault>>,
    persistent: Mutex<Option<ProviderFault>>,
    gate: watch::Sender<bool>,
    in_flight: watch::Sender<usize>,
    max_in_flight: AtomicUsize,
    vote_calls: Mutex<HashMap<String, usize>>,
    next_id: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The shared state of one fake provider. Cheap to clone.
#[derive(Clone)]
struct ProviderState {
    inner: Arc<Inner>,
}

impl ProviderState {
    fn new(config: FakeProviderBuilder) -> Self {
        Self {
            inner: Arc::new(Inner {
                config,
                requests: Mutex::new(Vec::new()),
                recorded: watch::Sender::new(0),
                queue: Mutex::new(VecDeque::new()),
                persistent: Mutex::new(None),
                gate: watch::Sender::new(false),
                in_flight: watch::Sender::new(0),
                max_in_flight: AtomicUsize::new(0),
                vote_calls: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
            }),
        }
    }

    fn record(&self, method: &str, path: &str, headers: &HeaderMap, body: Value) {
        let mut requests = lock(&self.inner.requests);
        requests.push(ProviderRequest {
            at: tokio::time::Instant::now(),
            method: method.to_owned(),
            path: path.to_owned(),
            headers: headers.clone(),
            body,
        });
        self.inner.recorded.send_replace(requests.len());
    }

    fn enter(&self) -> InFlight {
        let mut now = 0;
        self.inner.in_flight.send_modify(|c| {
            *c += 1;
            now = *c;
        });
        self.inner.max_in_flight.fetch_max(now, Ordering::SeqCst);
        InFlight {
            state: self.clone(),
        }
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        let expected = format!("Bearer {}", self.inner.config.api_key);
        headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v == expected)
    }

    fn take_fault(&self) -> Option<ProviderFault> {
        lock(&self.inner.queue)
            .pop_front()
            .or_else(|| lock(&self.inner.persistent).clone())
    }

    fn next_vote_call(&self, text: &str) -> usize {
        let mut calls = lock(&self.inner.vote_calls);
        let c = calls.entry(text.to_owned()).or_insert(0);
        let n = *c;
        *c += 1;
        n
    }
}

struct InFlight {
    state: ProviderState,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.state
            .inner
            .in_flight
            .send_modify(|c| *c = c.saturating_sub(1));
    }
}

/// A running fake provider. Dropping it stops the server (and releases the gate).
pub struct FakeProviderHandle {
    state: ProviderState,
    addr: SocketAddr,
    server: ServerTask,
}

impl std::fmt::Debug for FakeProviderHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeProviderHandle")
            .field("addr", &self.addr)
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

impl FakeProviderHandle {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The provider root, `http://127.0.0.1:PORT` (what `provider.base_url` holds).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://127.0.0.1:PORT/v1/chat/completions`
    pub fn chat_url(&self) -> String {
        format!("{}/v1/chat/completions", self.base_url())
    }

    /// The key the fake accepts.
    pub fn api_key(&self) -> &str {
        &self.state.inner.config.api_key
    }

    /// Every recorded request (chat completions and models), oldest first.
    pub fn requests(&self) -> Vec<ProviderRequest> {
        lock(&self.state.inner.requests).clone()
    }

    /// The recorded `POST /v1/chat/completions` requests, oldest first.
    pub fn chat_requests(&self) -> Vec<ProviderRequest> {
        self.requests()
            .into_iter()
            .filter(|r| r.path == "/v1/chat/completions")
            .collect()
    }

    /// Forgets the recorded requests and the most-in-flight mark.
    pub fn clear_requests(&self) {
        lock(&self.state.inner.requests).clear();
        self.state.inner.recorded.send_replace(0);
        self.state
            .inner
            .max_in_flight
            .store(self.in_flight(), Ordering::SeqCst);
    }

    /// Waits until at least `n` requests are recorded.
    pub async fn wait_for_requests(&self, n: usize) {
        let mut rx = self.state.inner.recorded.subscribe();
        let _ = rx.wait_for(|c| *c >= n).await;
    }

    /// Queues a fault for the next chat request only (queued faults go before the persistent one).
    pub fn push_fault(&self, fault: ProviderFault) {
        lock(&self.state.inner.queue).push_back(fault);
    }

    /// Sets (or with `None` clears) a fault applied to every later chat request.
    pub fn set_fault(&self, fault: Option<ProviderFault>) {
        *lock(&self.state.inner.persistent) = fault;
    }

    /// Closes the gate: chat requests that arrive now wait (recorded and counted in flight).
    pub fn hold(&self) {
        self.state.inner.gate.send_replace(true);
    }

    /// Opens the gate.
    pub fn release(&self) {
        self.state.inner.gate.send_replace(false);
    }

    /// Chat requests being handled now.
    pub fn in_flight(&self) -> usize {
        *self.state.inner.in_flight.borrow()
    }

    /// The most chat requests seen in flight at once.
    pub fn max_in_flight(&self) -> usize {
        self.state.inner.max_in_flight.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` chat requests are in flight. Bounded by
    /// [`crate::state::IN_FLIGHT_WAIT`]: a request that never comes panics instead of hanging.
    pub async fn wait_for_in_flight(&self, n: usize) {
        let mut rx = self.state.inner.in_flight.subscribe();
        let wait = crate::state::IN_FLIGHT_WAIT;
        if tokio::time::timeout(wait, rx.wait_for(|c| *c >= n))
            .await
            .is_err()
        {
            panic!("fake provider: fewer than {n} requests in flight after {wait:?}");
        }
    }

    /// Stops accepting, releases the gate and waits for in-flight requests to finish.
    pub async fn shutdown(mut self) {
        self.release();
        self.server.shutdown().await;
    }
}

impl Drop for FakeProviderHandle {
    fn drop(&mut self) {
        self.release();
        // Dropping `server` stops and aborts the serving task.
    }
}

fn provider_router(state: ProviderState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .fallback(not_found)
        .with_state(state)
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn unauthorized(sent: Option<&str>) -> Response {
    // Hosted providers echo (part of) the key they got; echo it whole so clients must redact it.
    let message = match sent {
        Some(key) => format!("Incorrect API key provided: {key}."),
        None => "You didn't provide an API key.".to_owned(),
    };
    json_response(
        StatusCode::UNAUTHORIZED,
        &openai_error(&message, "invalid_request_error", json!("invalid_api_key")),
    )
}

fn sent_key(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.strip_prefix("Bearer ").unwrap_or(v))
}

fn bad_request(message: &str) -> Response {
    json_response(
        StatusCode::BAD_REQUEST,
        &openai_error(message, "invalid_request_error", Value::Null),
    )
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn chat(State(state): State<ProviderState>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = to_bytes(body, MAX_BODY)
        .await
        .unwrap_or_else(|_| Bytes::new());
    let parsed: Result<Value, String> = if bytes.is_empty() {
        Err("empty body".into())
    } else {
        serde_json::from_slice(&bytes).map_err(|e| e.to_string())
    };
    let recorded = match &parsed {
        Ok(v) => v.clone(),
        Err(_) if bytes.is_empty() => Value::Null,
        Err(_) => Value::String(String::from_utf8_lossy(&bytes).into_owned()),
    };
    state.record(
        parts.method.as_str(),
        parts.uri.path(),
        &parts.headers,
        recorded,
    );
    let _guard = state.enter();
    let mut gate = state.inner.gate.subscribe();
    let _ = gate.wait_for(|held| !*held).await;
    if !state.authorized(&parts.headers) {
        return unauthorized(sent_key(&parts.headers));
    }
    if !state.inner.config.latency.is_zero() {
        tokio::time::sleep(state.inner.config.latency).await;
    }
    let mut reasoning_only = false;
    match state.take_fault() {
        Some(ProviderFault::Status {
            status,
            body,
            headers,
        }) => {
            let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut resp = json_response(code, &body);
            for (k, v) in headers {
                if let (Ok(k), Ok(v)) = (HeaderName::try_from(k), HeaderValue::try_from(v)) {
                    resp.headers_mut().insert(k, v);
                }
            }
            return resp;
        }
        Some(ProviderFault::Slow(d)) => tokio::time::sleep(d).await,
        Some(ProviderFault::Garbage) => {
            return (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                "<html>this is not a chat completion",
            )
                .into_response();
        }
        Some(ProviderFault::Unauthorized) => return unauthorized(sent_key(&parts.headers)),
        Some(ProviderFault::ReasoningOnly) => reasoning_only = true,
        None => {}
    }
    let body = match parsed {
        Ok(v) => v,
        Err(e) => return bad_request(&format!("We could not parse the JSON body: {e}")),
    };
    let Some(model) = body.get("model").and_then(Value::as_str) else {
        return bad_request("you must provide a model parameter");
    };
    let cfg = &state.inner.config;
    if cfg.strict_models && !cfg.models.iter().any(|m| m == model) {
        return json_response(
            StatusCode::NOT_FOUND,
            &openai_error(
                &format!("The model `{model}` does not exist or you do not have access to it."),
                "invalid_request_error",
                json!("model_not_found"),
            ),
        );
    }
    let messages = match body.get("messages").and_then(Value::as_array) {
        Some(m) if !m.is_empty() => m,
        _ => return bad_request("'messages' must be a non-empty array"),
    };
    if body.get("stream").and_then(Value::as_bool) == Some(true) {
        return bad_request("the fake provider does not stream");
    }
    let prompt = messages
        .iter()
        .map(|m| content_text(m.get("content")))
        .collect::<Vec<_>>()
        .join("\n");
    let (vote, call) = match scripted_votes(&prompt) {
        Some(list) => {
            let call = state.next_vote_call(&prompt);
            (list[call % list.len()], call)
        }
        None => (Some(default_vote(&prompt)), 0),
    };
    let mut text = judge_text(&prompt, vote, call, false);
    let mut finish = "stop";
    let words: Vec<&str> = text.split_whitespace().collect();
    let max_tokens = body
        .get("max_completion_tokens")
        .or_else(|| body.get("max_tokens"))
        .and_then(Value::as_u64)
        .and_then(|n| usize::try_from(n).ok());
    let mut completion_tokens = words.len();
    if let Some(max) = max_tokens
        && words.len() > max
    {
        text = words[..max].join(" ");
        completion_tokens = max;
        finish = "length";
    }
    let prompt_tokens = prompt.split_whitespace().count();
    let message = if reasoning_only {
        json!({"role": "assistant", "content": null, "reasoning_content": text})
    } else {
        json!({"role": "assistant", "content": text})
    };
    let id = state.inner.next_id.fetch_add(1, Ordering::Relaxed);
    json_response(
        StatusCode::OK,
        &json!({
            "id": format!("chatcmpl-fake-{id}"),
            "object": "chat.completion",
            "created": now_secs(),
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }),
    )
}

async fn models(State(state): State<ProviderState>, headers: HeaderMap) -> Response {
    state.record("GET", "/v1/models", &headers, Value::Null);
    if !state.authorized(&headers) {
        return unauthorized(sent_key(&headers));
    }
    let created = now_secs();
    let data: Vec<Value> = state
        .inner
        .config
        .models
        .iter()
        .map(|m| json!({"id": m, "object": "model", "created": created, "owned_by": "fake-provider"}))
        .collect();
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

async fn not_found() -> Response {
    json_response(
        StatusCode::NOT_FOUND,
        &openai_error(
            "Invalid URL: the fake provider serves /v1/chat/completions and /v1/models",
            "invalid_request_error",
            Value::Null,
        ),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    async fn post(p: &FakeProviderHandle, key: Option<&str>, body: Value) -> (u16, Value) {
        let mut req = reqwest::Client::new().post(p.chat_url()).json(&body);
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    fn judge_body(text: &str) -> Value {
        json!({"model": "m", "messages": [{"role": "system", "content": "judge"}, {"role": "user", "content": text}]})
    }

    #[tokio::test]
    async fn answers_judge_prompts_behind_the_key() {
        let p = FakeProvider::builder().api_key("k1").spawn().await.unwrap();
        let (s, v) = post(&p, Some("k1"), judge_body("FAKE_VOTES=-1")).await;
        assert_eq!(s, 200);
        let content = v["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(content.ends_with("\\boxed{-1}"), "{content}");
        assert_eq!(v["model"], "m");
        let (s, v) = post(
            &p,
            Some("k1"),
            judge_body("hint please [HINT_START] FAKE_VOTES=1"),
        )
        .await;
        assert_eq!(s, 200);
        let content = v["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(content.contains("[HINT_END]"), "{content}");

        let (s, v) = post(&p, Some("wrong"), judge_body("x")).await;
        assert_eq!(s, 401);
        assert_eq!(v["error"]["code"], "invalid_api_key");
        let (s, _) = post(&p, None, judge_body("x")).await;
        assert_eq!(s, 401);
        let r = p.requests();
        assert_eq!(r.len(), 4);
        assert_eq!(r[0].headers["authorization"], "Bearer k1");

        let models: Value = reqwest::Client::new()
            .get(format!("{}/v1/models", p.base_url()))
            .bearer_auth("k1")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(models["data"][0]["id"], "fake-judge");
    }

    #[tokio::test]
    async fn faults_and_limits() {
        let p = FakeProvider::builder()
            .api_key("k")
            .strict_models(true)
            .spawn()
            .await
            .unwrap();
        p.push_fault(ProviderFault::rate_limited(Some("1")));
        p.push_fault(ProviderFault::Garbage);
        p.push_fault(ProviderFault::ReasoningOnly);
        let resp = reqwest::Client::new()
            .post(p.chat_url())
            .bearer_auth("k")
            .json(&judge_body("x"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 429);
        assert_eq!(resp.headers()["retry-after"], "1");
        let (s, v) = post(&p, Some("k"), judge_body("x")).await;
        assert_eq!(s, 200);
        assert!(v.is_string(), "garbage: {v}");
        let mut body = judge_body("x");
        body["model"] = json!("fake-judge");
        let (s, v) = post(&p, Some("k"), body.clone()).await;
        assert_eq!(s, 200);
        assert!(v["choices"][0]["message"]["content"].is_null());
        assert!(v["choices"][0]["message"]["reasoning_content"].is_string());
        let (s, v) = post(&p, Some("k"), judge_body("x")).await;
        assert_eq!((s, &v["error"]["code"]), (404, &json!("model_not_found")));
        body["max_tokens"] = json!(1);
        let (s, v) = post(&p, Some("k"), body).await;
        assert_eq!(
            (s, &v["choices"][0]["finish_reason"]),
            (200, &json!("length"))
        );
        assert_eq!(v["usage"]["completion_tokens"], 1);
        assert_eq!(p.max_in_flight(), 1);
    }
}
