//! The application state shared by every handler, and the router.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;
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
    pub client_api_key: Option<String>,
    pub submission_enabled: bool,
    /// Stream upstream when the client streams (`sglang.stream`); otherwise the answer is fetched whole
    /// and sent as synthesised chunks.
    pub upstream_stream: bool,
    /// Ask for sampled token ids on non-streamed calls (`sglang.return_token_ids`).
    pub return_token_ids: bool,
    pub align_policy: AlignPolicy,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            default_turn_type: TurnType::Side,
            served_model_name: DEFAULT_SERVED_MODEL_NAME.into(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            client_api_key: None,
            submission_enabled: true,
            upstream_stream: true,
            return_token_ids: false,
            align_policy: AlignPolicy::default(),
        }
    }
}

pub(crate) struct Inner {
    pub options: ServerOptions,
    pub policy: Arc<dyn PolicyClient>,
    pub capture: CaptureQueue,
    pub metrics: Option<PrometheusHandle>,
    pub arrival: AtomicU64,
    pub submission_enabled: AtomicBool,
    warned: Mutex<HashSet<String>>,
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
        Self(Arc::new(Inner {
            submission_enabled: AtomicBool::new(options.submission_enabled),
            options,
            policy,
            capture,
            metrics,
            arrival: AtomicU64::new(1),
            warned: Mutex::new(HashSet::new()),
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

    pub(crate) fn submission_enabled(&self) -> bool {
        self.0.submission_enabled.load(Ordering::Relaxed)
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

/// Requires `Authorization: Bearer <key>` when a client key is configured (constant-time comparison).
async fn require_key(State(app): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(key) = &app.0.options.client_api_key {
        let given = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .unwrap_or_default();
        if !bool::from(given.as_bytes().ct_eq(key.as_bytes())) {
            tracing::warn!(path = %req.uri().path(), "rejected a request without a valid API key");
            return ApiError::Unauthorized.into_response();
        }
    }
    next.run(req).await
}

/// The router: `/v1/*` behind the client key, health and metrics open.
pub fn build_router(app: AppState) -> Router {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(crate::chat::chat_completions))
        .route("/v1/models", get(crate::health::models))
        .route_layer(middleware::from_fn_with_state(app.clone(), require_key));
    Router::new()
        .merge(v1)
        .route("/health", get(crate::health::health))
        .route("/healthz", get(crate::health::health))
        .route("/metrics", get(crate::health::metrics))
        .with_state(app)
}
