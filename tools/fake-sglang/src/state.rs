//! The shared state of one fake server: configuration, request recorder, fault slots, the gate and the
//! in-flight counter.

use std::{
    collections::{HashMap, VecDeque},
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use axum::http::HeaderMap;
use ps_chat_template::ChatTokenizer;
use serde_json::Value;
use tokio::sync::watch;

use crate::Fault;

/// One request the fake received (chat completions, completions and `/generate` only).
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// `POST` or `PUT`.
    pub method: String,
    /// For example `/v1/chat/completions`.
    pub path: String,
    /// The parsed JSON body; a body that is not JSON is kept as a JSON string (empty body: `null`).
    pub body: Value,
    pub headers: HeaderMap,
}

/// How long a test waits for requests to reach the fake ([`FakeState::wait_for_in_flight`]):
/// far more than any request takes to arrive on a loaded machine, so reaching it means the
/// request never came.
pub const IN_FLIGHT_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

pub(crate) struct Config {
    pub tokenizer: Arc<ChatTokenizer>,
    pub model_name: String,
    pub latency: Duration,
    pub token_delay: Duration,
    pub api_key: Option<String>,
    pub reasoning: bool,
    /// Keep at most this many recorded requests (the most recent); `None`: all.
    pub record_limit: Option<usize>,
    pub quirks: crate::Quirks,
    /// Reported model and tokenizer directory; `None`: not reported.
    pub model_path: Option<String>,
    /// Reported `vocab_size`.
    pub vocab_size: Option<u64>,
    /// Whether `/get_model_info` exists.
    pub model_info_route: bool,
    /// Prompt encoding with the prefix cache.
    pub prompts: crate::encoder::PromptEncoder,
}

#[derive(Default)]
struct FaultSlots {
    persistent: Option<Fault>,
    queue: VecDeque<Fault>,
}

struct Inner {
    config: Config,
    requests: Mutex<VecDeque<RecordedRequest>>,
    recorded: watch::Sender<usize>,
    faults: Mutex<FaultSlots>,
    /// `true` while held.
    gate: watch::Sender<bool>,
    in_flight: watch::Sender<usize>,
    vote_calls: Mutex<HashMap<String, usize>>,
    next_id: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The state of one fake SGLang server: what [`crate::router`] serves and what tests control. Cheap to
/// clone (one `Arc`). [`crate::FakeHandle`] offers the same controls.
#[derive(Clone)]
pub struct FakeState {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for FakeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeState")
            .field("model_name", &self.inner.config.model_name)
            .field("in_flight", &self.in_flight())
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

impl FakeState {
    pub(crate) fn new(config: Config) -> Self {
        Self {
            inner: Arc::new(Inner {
                config,
                requests: Mutex::new(VecDeque::new()),
                recorded: watch::Sender::new(0),
                faults: Mutex::new(FaultSlots::default()),
                gate: watch::Sender::new(false),
                in_flight: watch::Sender::new(0),
                vote_calls: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
            }),
        }
    }

    pub(crate) fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The model name listed by `/v1/models`.
    pub fn model_name(&self) -> &str {
        &self.inner.config.model_name
    }

    /// The tokenizer the fake samples with (tests use it to compute expected tokens).
    pub fn tokenizer(&self) -> &Arc<ChatTokenizer> {
        &self.inner.config.tokenizer
    }

    /// Every recorded chat-completions, completions and `/generate` request, oldest first (with a
    /// record limit, only the most recent ones).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.inner.requests).iter().cloned().collect()
    }

    /// Forgets the recorded requests.
    pub fn clear_requests(&self) {
        lock(&self.inner.requests).clear();
        self.inner.recorded.send_replace(0);
    }

    /// Waits until at least `n` requests were recorded since the last [`Self::clear_requests`]
    /// (counting those a record limit has dropped since).
    pub async fn wait_for_requests(&self, n: usize) {
        let mut rx = self.inner.recorded.subscribe();
        let _ = rx.wait_for(|c| *c >= n).await;
    }

    /// Sets (or with `None` clears) a fault applied to every later request until cleared.
    pub fn set_fault(&self, fault: Option<Fault>) {
        lock(&self.inner.faults).persistent = fault;
    }

    /// Queues a fault for the next request only (queued faults are used before the persistent one).
    pub fn push_fault(&self, fault: Fault) {
        lock(&self.inner.faults).queue.push_back(fault);
    }

    /// Closes the gate: requests that arrive now wait (after being recorded and counted in flight)
    /// until [`Self::release`].
    pub fn hold(&self) {
        self.inner.gate.send_replace(true);
    }

    /// Opens the gate: held requests proceed.
    pub fn release(&self) {
        self.inner.gate.send_replace(false);
    }

    /// Whether the gate is closed.
    pub fn is_held(&self) -> bool {
        *self.inner.gate.borrow()
    }

    /// Chat-completions and `/generate` requests being handled now (a stream counts until its body ends).
    pub fn in_flight(&self) -> usize {
        *self.inner.in_flight.borrow()
    }

    /// Waits until at least `n` requests are in flight. Bounded by [`IN_FLIGHT_WAIT`]: a request
    /// that never comes panics with what arrived, instead of hanging the test.
    pub async fn wait_for_in_flight(&self, n: usize) {
        let mut rx = self.inner.in_flight.subscribe();
        if tokio::time::timeout(IN_FLIGHT_WAIT, rx.wait_for(|c| *c >= n))
            .await
            .is_err()
        {
            panic!(
                "fake-sglang: {} requests in flight after {IN_FLIGHT_WAIT:?}, {n} awaited",
                self.in_flight()
            );
        }
    }

    /// Waits until at most `n` requests are in flight (the others ended or were cancelled).
    /// Bounded by [`IN_FLIGHT_WAIT`], as [`FakeState::wait_for_in_flight`].
    pub async fn wait_for_in_flight_at_most(&self, n: usize) {
        let mut rx = self.inner.in_flight.subscribe();
        if tokio::time::timeout(IN_FLIGHT_WAIT, rx.wait_for(|c| *c <= n))
            .await
            .is_err()
        {
            panic!(
                "fake-sglang: {} requests still in flight after {IN_FLIGHT_WAIT:?}, at most {n} awaited",
                self.in_flight()
            );
        }
    }

    pub(crate) fn record(&self, method: &str, path: &str, headers: &HeaderMap, body: Value) {
        let mut requests = lock(&self.inner.requests);
        requests.push_back(RecordedRequest {
            method: method.to_owned(),
            path: path.to_owned(),
            body,
            headers: headers.clone(),
        });
        if let Some(limit) = self.inner.config.record_limit {
            while requests.len() > limit {
                requests.pop_front();
            }
        }
        self.inner.recorded.send_modify(|n| *n += 1);
    }

    pub(crate) fn enter(&self) -> InFlightGuard {
        self.inner.in_flight.send_modify(|c| *c += 1);
        InFlightGuard {
            state: self.clone(),
        }
    }

    pub(crate) async fn pass_gate(&self) {
        let mut rx = self.inner.gate.subscribe();
        let _ = rx.wait_for(|held| !*held).await;
    }

    /// The fault for the request being handled: the next queued one, else the persistent one.
    pub(crate) fn take_fault(&self) -> Option<Fault> {
        let mut slots = lock(&self.inner.faults);
        slots.queue.pop_front().or_else(|| slots.persistent.clone())
    }

    /// `/health*` answer 503 while the persistent fault is `Status(503, _)`.
    pub(crate) fn unhealthy(&self) -> bool {
        matches!(
            lock(&self.inner.faults).persistent,
            Some(Fault::Status(503, _))
        )
    }

    pub(crate) fn authorized(&self, headers: &HeaderMap) -> bool {
        let Some(key) = &self.inner.config.api_key else {
            return true;
        };
        headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|given| given.trim() == key)
    }

    /// How many times a judge prompt with this exact text was answered before (then counts this call).
    pub(crate) fn next_vote_call(&self, text: &str) -> usize {
        let mut calls = lock(&self.inner.vote_calls);
        let c = calls.entry(text.to_owned()).or_insert(0);
        let n = *c;
        *c += 1;
        n
    }

    /// What the prefix cache of prompt encodings holds and has done (`None`: the cache is off).
    pub fn prefix_cache_stats(&self) -> Option<ps_chat_template::SharedPrefixStats> {
        self.inner.config.prompts.stats()
    }

    /// A fresh sequence number for response ids.
    pub(crate) fn next_seq(&self) -> u64 {
        self.inner.next_id.fetch_add(1, Ordering::Relaxed)
    }
}

/// Counts a request in flight until dropped.
pub(crate) struct InFlightGuard {
    state: FakeState,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.state
            .inner
            .in_flight
            .send_modify(|c| *c = c.saturating_sub(1));
    }
}
