//! The application state shared by every handler, and the router.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use ps_config::PauseMode;
use ps_core::{AlignPolicy, TurnType};
use ps_sglang_client::PolicyClient;
use subtle::ConstantTimeEq;

use crate::capture::CaptureQueue;
use crate::error::ApiError;

/// Defaults, named.
pub const DEFAULT_MAX_BODY_BYTES: usize = 16 * 1024 * 1024;
pub const DEFAULT_SERVED_MODEL_NAME: &str = "default";
/// Session ids remembered for the once-per-session warning before the set is cleared.
const WARNED_SESSIONS_CAP: usize = 10_000;

/// What the server needs to know, already validated (the binary maps the settings file to this).
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Turn type of a request that names none (`server.default_turn_type`).
    pub default_turn_type: TurnType,
    /// Filled into `model` when a request has none (`server.served_model_name`).
    pub served_model_name: String,
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
    pub token_ids: ps_config::TokenIdsMode,
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
}

/// `Retry-After` of a request refused while paused.
pub const PAUSED_RETRY_AFTER_SECS: u64 = 5;

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            default_turn_type: TurnType::Side,
            served_model_name: DEFAULT_SERVED_MODEL_NAME.into(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            client_api_key: None,
            submission_enabled: true,
            upstream_stream: true,
            token_ids: ps_config::TokenIdsMode::Auto,
            align_policy: AlignPolicy::default(),
            pause_mode: PauseMode::Reject,
            pause_hold_max: Duration::from_secs(30),
            admin_api_key: None,
            shutdown_grace: Duration::from_secs(30),
            max_messages: 4096,
            max_upstream: 256,
            inference: crate::infer::InferenceOptions::default(),
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
    pub rollout: Option<crate::rollout::Rollout>,
    /// Permits for upstream chat requests, held until a streamed body ends.
    pub upstream_permits: Arc<tokio::sync::Semaphore>,
    warned: Mutex<HashSet<String>>,
    /// The policy version the trainer announced at its last resume (`{"weight_version": ..}`).
    trainer_weight_version: Mutex<Option<String>>,
    /// The conversations answered, for requests without a session key (none when inference is off).
    pub matcher: Option<Arc<ps_session_infer::SessionMatcher>>,
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
        rollout: Option<crate::rollout::Rollout>,
    ) -> Self {
        Self(Arc::new(Inner {
            submission: tokio::sync::watch::Sender::new(options.submission_enabled),
            upstream_permits: Arc::new(tokio::sync::Semaphore::new(options.max_upstream.max(1))),
            matcher: options.inference.matcher(),
            rollout,
            options,
            policy,
            capture,
            metrics,
            arrival: AtomicU64::new(1),
            warned: Mutex::new(HashSet::new()),
            trainer_weight_version: Mutex::new(None),
        }))
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
    pub fn rollout(&self) -> Option<&crate::rollout::Rollout> {
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

/// Whether the request carries `Authorization: Bearer <key>` (constant-time comparison).
fn bearer_matches(req: &Request, key: &str) -> bool {
    let given = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or_default();
    bool::from(given.as_bytes().ct_eq(key.as_bytes()))
}

async fn check_key(key: Option<&str>, req: Request, next: Next) -> Response {
    if let Some(key) = key
        && !bearer_matches(&req, key)
    {
        tracing::warn!(path = %req.uri().path(), "rejected a request without a valid API key");
        metrics::counter!(
            ps_core::metric_names::REQUESTS_TOTAL,
            "turn_type" => "unknown",
            "outcome" => "client_error",
            "status" => "401"
        )
        .increment(1);
        return ApiError::Unauthorized.into_response();
    }
    next.run(req).await
}

/// The client key (`server.api_key_env`) guards the chat routes.
async fn require_key(State(app): State<AppState>, req: Request, next: Next) -> Response {
    check_key(
        app.0
            .options
            .client_api_key
            .as_ref()
            .map(ps_core::Secret::expose),
        req,
        next,
    )
    .await
}

/// The admin key (`server.admin_key_env`) guards the rollout routes: a chat client's key is not enough.
async fn require_admin_key(State(app): State<AppState>, req: Request, next: Next) -> Response {
    check_key(
        app.0
            .options
            .admin_api_key
            .as_ref()
            .map(ps_core::Secret::expose),
        req,
        next,
    )
    .await
}

/// The router: `/v1/*` behind the client key, health and metrics open.
pub fn build_router(app: AppState) -> Router {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(crate::chat::chat_completions))
        .route("/v1/models", get(crate::health::models))
        .route_layer(middleware::from_fn_with_state(app.clone(), require_key));
    let rollout = Router::new()
        .route("/v1/rollout/samples", get(crate::rollout::samples))
        .route("/v1/rollout/commit", post(crate::rollout::commit))
        .route("/v1/rollout/pause", post(crate::rollout::pause))
        .route("/v1/rollout/resume", post(crate::rollout::resume))
        .route("/v1/rollout/status", get(crate::rollout::status))
        .route(
            "/v1/rollout/eval-scores/drain",
            post(crate::rollout::drain_eval_scores),
        )
        .route_layer(middleware::from_fn_with_state(
            app.clone(),
            require_admin_key,
        ));
    Router::new()
        .merge(v1)
        .merge(rollout)
        .route("/health", get(crate::health::health))
        .route("/healthz", get(crate::health::health))
        .route("/metrics", get(crate::health::metrics))
        // Last, so that they cover every route above.
        .fallback(crate::health::not_found)
        .method_not_allowed_fallback(crate::health::method_not_allowed)
        .with_state(app)
}
