//! The router: every route and the layers around them. It sits above the handlers (`chat`,
//! `health`, `rollout`) and the state; nothing below names it.
//!
//! Two layers of its own: the client and admin keys (`server.api_key_env`, `server.admin_key_env`)
//! guard `/v1/*` (as a Bearer token, or Anthropic's `x-api-key`) and `/v1/rollout/*` (Bearer only), and [`edge`] runs every request in one span and logs an
//! error answer there, once, whichever route gave it.

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use subtle::ConstantTimeEq;
use tracing::Instrument;

use crate::error::{ApiError, ErrorReport};
use crate::state::AppState;
use crate::{chat, health, messages, responses, rollout};

/// Whether the request carries `Authorization: Bearer <key>` (constant-time comparison), or, where
/// `x_api_key` allows it (the client routes: Anthropic's clients send it), `x-api-key: <key>`.
fn key_matches(req: &Request, key: &str, x_api_key: bool) -> bool {
    let header = |name| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let matches =
        |given: Option<&str>| given.is_some_and(|g| bool::from(g.as_bytes().ct_eq(key.as_bytes())));
    let bearer = header(http::header::AUTHORIZATION.as_str())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    // Either header may carry it: a client that sends both (an SDK's default Bearer beside its
    // `x-api-key`) is let in when one of them holds the key.
    matches(bearer) || (x_api_key && matches(header("x-api-key")))
}

async fn check_key(key: Option<&str>, x_api_key: bool, req: Request, next: Next) -> Response {
    if let Some(key) = key
        && !key_matches(&req, key, x_api_key)
    {
        metrics::counter!(
            ps_core::metric_names::REQUESTS_TOTAL,
            "turn_type" => "unknown",
            "outcome" => "client_error",
            "status" => "401"
        )
        .increment(1);
        if req.uri().path().starts_with(MESSAGES_PATH) {
            return ApiError::Unauthorized.into_messages_response();
        }
        return ApiError::Unauthorized.into_response();
    }
    next.run(req).await
}

/// The client key (`server.api_key_env`) guards the chat routes.
async fn require_key(State(app): State<AppState>, req: Request, next: Next) -> Response {
    check_key(
        app.options()
            .client_api_key
            .as_ref()
            .map(ps_core::Secret::expose),
        true,
        req,
        next,
    )
    .await
}

/// The admin key (`server.admin_key_env`) guards the rollout routes: a chat client's key is not enough.
async fn require_admin_key(State(app): State<AppState>, req: Request, next: Next) -> Response {
    check_key(
        app.options()
            .admin_api_key
            .as_ref()
            .map(ps_core::Secret::expose),
        false,
        req,
        next,
    )
    .await
}

/// Routes the composition root adds to the server's (the inspection page): `admin` ones behind the
/// admin key like `/v1/rollout/*`, `open` ones beside `/health`. Empty by default.
#[derive(Default)]
pub struct ExtraRoutes {
    pub admin: Router<AppState>,
    pub open: Router<AppState>,
}

impl std::fmt::Debug for ExtraRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtraRoutes").finish_non_exhaustive()
    }
}

/// The router: `/v1/*` behind the client key, health and metrics open.
pub fn build_router(app: AppState) -> Router {
    build_router_with(app, ExtraRoutes::default())
}

/// As [`build_router`], with `extra` routes: the admin ones behind the admin key (a chat client's
/// key does not open them), the open ones without a key.
pub fn build_router_with(app: AppState, extra: ExtraRoutes) -> Router {
    let v1 = Router::new()
        .route(CHAT_PATH, post(chat::chat_completions))
        .route(MESSAGES_PATH, post(messages::messages))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route(RESPONSES_PATH, post(responses::responses))
        .route("/v1/models", get(health::models))
        .route_layer(middleware::from_fn_with_state(app.clone(), require_key));
    let rollout = Router::new()
        .route("/v1/rollout/samples", get(rollout::samples))
        .route("/v1/rollout/commit", post(rollout::commit))
        .route("/v1/rollout/pause", post(rollout::pause))
        .route("/v1/rollout/resume", post(rollout::resume))
        .route("/v1/rollout/status", get(rollout::status))
        .route("/v1/rollout/blobs/{hash}", get(rollout::blob))
        .route(
            "/v1/rollout/eval-scores/drain",
            post(rollout::drain_eval_scores),
        )
        .merge(extra.admin)
        .route_layer(middleware::from_fn_with_state(
            app.clone(),
            require_admin_key,
        ));
    Router::new()
        .merge(v1)
        .merge(rollout)
        .merge(extra.open)
        .route("/health", get(health::health))
        .route("/healthz", get(health::health))
        .route("/metrics", get(health::metrics))
        // Last, so that they cover every route above.
        .fallback(health::not_found)
        .method_not_allowed_fallback(health::method_not_allowed)
        // Outermost: around the key checks and the fallbacks too.
        .layer(middleware::from_fn(edge))
        .with_state(app)
}

/// The chat completions route.
const CHAT_PATH: &str = "/v1/chat/completions";
/// The Anthropic Messages route (its clients add `?beta=true`, which routing ignores).
const MESSAGES_PATH: &str = "/v1/messages";
/// The OpenAI Responses route.
const RESPONSES_PATH: &str = "/v1/responses";

/// Runs the request in its span (the chat path records the session id, turn type, turn and
/// arrival sequence into it) and logs an error answer ([`ErrorReport`]) there, once. The chat
/// route keeps the span name and messages it has always had (`chat`, "rejected chat request",
/// "chat request failed upstream"), so operators' filters keep matching.
async fn edge(req: Request, next: Next) -> Response {
    let chat = matches!(req.uri().path(), CHAT_PATH | MESSAGES_PATH | RESPONSES_PATH);
    let span = if chat {
        tracing::info_span!(
            "chat",
            session_id = tracing::field::Empty,
            turn_type = tracing::field::Empty,
            turn = tracing::field::Empty,
            seq = tracing::field::Empty
        )
    } else {
        tracing::info_span!("request")
    };
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let resp = next.run(req).instrument(span.clone()).await;
    if let Some(report) = resp.extensions().get::<ErrorReport>() {
        span.in_scope(|| report.log(&method, &path, chat));
    }
    resp
}
