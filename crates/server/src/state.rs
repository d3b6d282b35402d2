//! The application state shared by every handler: [`AppState`], the validated [`ServerOptions`],
//! and the rollout parts ([`Rollout`]). A leaf among the server's modules: it names no handler and
//! no route (the router is `crate::router`).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use ps_core::modes::PauseMode;
use ps_core::ports::PauseHook;
use ps_core::{AlignPolicy, TurnEvent, TurnObserver};
use ps_sglang_client::PolicyClient;

use ps_core::SampleLog;

use ps_capture::CaptureQueue;

/// Defaults, named.
pub const DEFAULT_MAX_BODY_BYTES: usize = 16 * 1024 * 1024;
pub const DEFAULT_SERVED_MODEL_NAME: &str = "default";
/// Session ids remembered for the once-per-session warning before the set is cleared.
const WARNED_SESSIONS_CAP: usize = 10_000;

/// What the server needs to know, already validated (the binary maps the settings file to this).
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Turn type of a request that names none (`server.default_turn_type`).
    pub default_turn_type: ps_core::DefaultTurnType,
    /// Filled into `model` when a request has none (`server.served_model_name`).
    pub served_model_name: String,
    /// Other names a client may ask for, each with the name sent upstream in its place
    /// (`server.model_names`; empty: every name forwarded as sent).
    pub model_names: std::collections::BTreeMap<String, String>,
    /// Largest accepted request body (`server.max_body_bytes`).
    pub max_body_bytes: usize,
    /// Bearer key clients must send, when set.
    pub client_api_key: Option<ps_core::Secret>,
    pub submission_enabled: bool,
    /// Stream upstream when the client streams (`sglang.stream`); otherwise the answer is fetched whole
    /// and sent as synthesised chunks.
    pub upstream_stream: bool,
    /// Where main turns' token ids come from (`sglang.token_ids`); unless `retokenize`, non-streamed
    /// calls ask the engine for its ids.
    pub token_ids: ps_core::modes::TokenIdsMode,
    pub align_policy: AlignPolicy,
    /// What chat requests get while submission is paused (`server.pause_mode`).
    pub pause_mode: PauseMode,
    /// Longest wait of a held request (`server.pause_hold_max_sec`).
    pub pause_hold_max: Duration,
    /// Bearer key of the `/v1/rollout/*` routes, when set (`server.admin_key_env`).
    pub admin_api_key: Option<ps_core::Secret>,
    /// How long shutdown waits for scoring and submission (`server.shutdown_grace_sec`).
    pub shutdown_grace: Duration,
    /// Most messages in one request (`server.max_messages`).
    pub max_messages: usize,
    /// Cap on concurrent upstream chat requests (`sglang.max_concurrency`).
    pub max_upstream: usize,
    /// Sessions of requests without a key, and side turns by shape (`crate::infer`).
    pub inference: crate::infer::InferenceOptions,
    /// The engine behind the upstream URL (`sglang.engine`): vLLM is asked for its ids on
    /// streamed calls too.
    pub engine: ps_core::EngineSetting,
    /// What main turns are sampled with (`capture.sampling`).
    pub sampling: ps_core::SamplingMode,
    /// Ask for routed experts (`return_routed_experts: true`) on main turns to an engine other
    /// than vLLM (which returns them unasked): `capture.routed_experts = "require"`, or `auto` and
    /// SGLang said it returns them.
    pub ask_routed_experts: bool,
}

/// `Retry-After` of a request refused while paused.
pub const PAUSED_RETRY_AFTER_SECS: u64 = 5;

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            default_turn_type: ps_core::DefaultTurnType::Auto,
            served_model_name: DEFAULT_SERVED_MODEL_NAME.into(),
            model_names: std::collections::BTreeMap::new(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            client_api_key: None,
            submission_enabled: true,
            upstream_stream: true,
            token_ids: ps_core::modes::TokenIdsMode::Auto,
            align_policy: AlignPolicy::default(),
            pause_mode: PauseMode::Reject,
            pause_hold_max: Duration::from_secs(30),
            admin_api_key: None,
            shutdown_grace: Duration::from_secs(30),
            max_messages: 4096,
            max_upstream: 256,
            inference: crate::infer::InferenceOptions::default(),
            engine: ps_core::EngineSetting::Auto,
            sampling: ps_core::SamplingMode::AsSent,
            ask_routed_experts: false,
        }
    }
}

pub(crate) struct Inner {
    pub options: ServerOptions,
    pub policy: Arc<dyn PolicyClient>,
    pub capture: CaptureQueue,
    pub metrics: Option<PrometheusHandle>,
    pub arrival: AtomicU64,
    /// `true` while submission is enabled; watched by held requests.
    pub submission: tokio::sync::watch::Sender<bool>,
    pub rollout: Option<Rollout>,
    /// Permits for upstream chat requests, held until a streamed body ends.
    pub upstream_permits: Arc<tokio::sync::Semaphore>,
    warned: Mutex<HashSet<String>>,
    /// The policy version the trainer announced at its last resume (`{"weight_version": ..}`).
    trainer_weight_version: Mutex<Option<String>>,
    /// The conversations answered, for requests without a session key (none when inference is off).
    pub matcher: Option<Arc<ps_session_infer::SessionMatcher>>,
    /// Told about every chat request (the inspection page's history), once set.
    observer: std::sync::OnceLock<Arc<dyn TurnObserver>>,
    /// The engine in effect: `sglang.engine`, or learned (`AppState::learn_engine`).
    engine: ps_core::EngineCell,
    /// Chat requests held while submission is paused (`pause_mode = "hold"`), and trainer pulls
    /// waiting for a sample (`wait_ms`), now: `/v1/rollout/status` shows both.
    pub(crate) held_requests: AtomicUsize,
    pub(crate) waiting_pulls: AtomicUsize,
    /// Responses kept for `previous_response_id` (the Responses door).
    pub(crate) responses: crate::response_store::Store,
}

/// Counts one waiter in a counter of [`AppState`] for as long as it lives.
pub(crate) struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    pub(crate) fn new(counter: &'a AtomicUsize) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        Self(counter)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Cloneable handle on the state (one `Arc`).
#[derive(Clone)]
pub struct AppState(pub(crate) Arc<Inner>);

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("options", &self.0.options)
            .finish_non_exhaustive()
    }
}

impl AppState {
    pub fn new(
        options: ServerOptions,
        policy: Arc<dyn PolicyClient>,
        capture: CaptureQueue,
        metrics: Option<PrometheusHandle>,
    ) -> Self {
        Self::with_rollout(options, policy, capture, metrics, None)
    }

    /// As [`AppState::new`], with the rollout API (store and session buffer) enabled.
    pub fn with_rollout(
        options: ServerOptions,
        policy: Arc<dyn PolicyClient>,
        capture: CaptureQueue,
        metrics: Option<PrometheusHandle>,
        rollout: Option<Rollout>,
    ) -> Self {
        Self(Arc::new(Inner {
            submission: tokio::sync::watch::Sender::new(options.submission_enabled),
            upstream_permits: Arc::new(tokio::sync::Semaphore::new(options.max_upstream.max(1))),
            matcher: options.inference.matcher(),
            engine: ps_core::EngineCell::new(options.engine),
            held_requests: AtomicUsize::new(0),
            waiting_pulls: AtomicUsize::new(0),
            responses: crate::response_store::Store::default(),
            rollout,
            options,
            policy,
            capture,
            metrics,
            arrival: AtomicU64::new(1),
            warned: Mutex::new(HashSet::new()),
            trainer_weight_version: Mutex::new(None),
            observer: std::sync::OnceLock::new(),
        }))
    }

    /// Who is told about every chat request (its session, turn, type and source) and about
    /// sessions the client ends: the inspection page's history. Set once, before serving.
    #[must_use]
    pub fn with_observer(self, observer: Arc<dyn TurnObserver>) -> Self {
        let _ = self.0.observer.set(observer);
        self
    }

    /// The matcher of conversations without a session key (none when `server.session_inference`
    /// is off), for the composition root to tell when the session buffer closes a session.
    pub fn session_matcher(&self) -> Option<Arc<ps_session_infer::SessionMatcher>> {
        self.0.matcher.clone()
    }

    /// Tells the observer, if any (it returns at once).
    pub(crate) fn tell(&self, event: TurnEvent<'_>) {
        if let Some(o) = self.0.observer.get() {
            o.observe(event);
        }
    }

    /// The engine serving the policy, when known.
    pub fn engine(&self) -> Option<ps_core::Engine> {
        self.0.engine.get()
    }

    /// Records the engine serving the policy (`sglang.engine = "auto"`): from what the policy
    /// server reported at start (`how`), or from the shape of its answers. The first report wins;
    /// it is logged once, and an answer of another engine's shape is warned about once (naming
    /// `sglang.engine`).
    pub fn learn_engine(&self, engine: ps_core::Engine, how: &str) {
        if let Some(known) = self.0.engine.get()
            && known != engine
        {
            if self.first_warning("\0engine-disagrees") {
                tracing::warn!(
                    engine = known.as_str(),
                    observed = engine.as_str(),
                    "the policy engine is taken to be {} (sglang.engine = \"{}\"), but an answer has \
                     {}'s shape ({how}): set sglang.engine to the engine behind sglang.chat_url \
                     (logged once)",
                    known.as_str(),
                    self.0.options.engine.as_str(),
                    engine.as_str(),
                );
            }
            return;
        }
        if self.0.engine.learn(engine) {
            tracing::info!(
                engine = engine.as_str(),
                "the policy engine is {} ({how}){}",
                engine.as_str(),
                if engine.streams_token_ids() {
                    ": streamed main turns ask it for their token ids too"
                } else {
                    ""
                }
            );
        }
    }

    /// The engine refused what only vLLM accepts (`return_token_ids` on a stream): it is SGLang,
    /// whatever was set or learned. Warned about once, naming `sglang.engine`.
    pub(crate) fn engine_refused_streamed_ids(&self) {
        self.0.engine.correct(ps_core::Engine::Sglang);
        if self.first_warning("\0engine-refused-ids") {
            tracing::warn!(
                "the policy engine answered 400 to a streamed call asking for its token ids \
                 (return_token_ids), as SGLang does: the call was sent again without them, and \
                 streamed calls no longer ask for them. Set sglang.engine = \"sglang\" (it is \
                 \"{}\") (logged once)",
                self.0.options.engine.as_str()
            );
        }
    }

    pub fn capture(&self) -> &CaptureQueue {
        &self.0.capture
    }

    pub fn options(&self) -> &ServerOptions {
        &self.0.options
    }

    pub(crate) fn next_arrival(&self) -> u64 {
        self.0.arrival.fetch_add(1, Ordering::Relaxed)
    }

    pub fn submission_enabled(&self) -> bool {
        *self.0.submission.borrow()
    }

    pub(crate) fn set_submission(&self, enabled: bool) {
        self.0.submission.send_replace(enabled);
    }

    /// The policy version the trainer announced last, for answers that carry none (streamed).
    pub fn trainer_weight_version(&self) -> Option<String> {
        self.0
            .trainer_weight_version
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn set_trainer_weight_version(&self, version: Option<String>) {
        *self
            .0
            .trainer_weight_version
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = version;
    }

    /// The rollout parts (store, session buffer), when enabled.
    pub fn rollout(&self) -> Option<&Rollout> {
        self.0.rollout.as_ref()
    }

    /// Waits until submission is enabled again, at most `max`. Returns whether it is.
    pub(crate) async fn wait_submission(&self, max: Duration) -> bool {
        let mut rx = self.0.submission.subscribe();
        tokio::time::timeout(max, rx.wait_for(|enabled| *enabled))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Whether this is the first time `key` is seen (for once-per-session warnings). The set is bounded.
    pub(crate) fn first_warning(&self, key: &str) -> bool {
        let mut w = self.0.warned.lock().unwrap_or_else(|p| p.into_inner());
        if w.contains(key) {
            return false;
        }
        if w.len() >= WARNED_SESSIONS_CAP {
            w.clear();
        }
        w.insert(key.to_owned());
        true
    }
}

/// What the rollout routes work on.
#[derive(Clone)]
pub struct Rollout {
    pub store: Arc<dyn SampleLog>,
    /// The session buffer, through its port (the server links none of it).
    pub buffer: Arc<dyn ps_core::RolloutControl>,
    pub on_pause: Option<Arc<dyn PauseHook>>,
}

impl std::fmt::Debug for Rollout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rollout")
            .field("store", &self.store.describe())
            .finish_non_exhaustive()
    }
}
