//! `/v1/inspect/*` (JSON, to be mounted behind the admin key) and `/ui` (the page's static assets,
//! open: they hold no data, and the page asks for the key before it reads any).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::{Json, Router};
use ps_core::{LogError, SampleLog};
use serde_json::json;

use crate::api::{Overview, SampleView, SessionList, SessionTimeline, StoreView};
use crate::history::{BUCKET_MS, InspectHistory, now_ms};
use crate::sample_view::sample_view;
use crate::{LiveStatus, TokenText};

/// What the endpoints read.
#[derive(Clone)]
pub struct Inspect {
    pub history: Arc<InspectHistory>,
    /// The sample store (`None`: the sample view answers 503 `store_unavailable`).
    pub log: Option<Arc<dyn SampleLog>>,
    pub live: Option<Arc<dyn LiveStatus>>,
    pub tokens: Option<Arc<dyn TokenText>>,
}

impl Inspect {
    /// Endpoints over `history` alone.
    pub fn new(history: Arc<InspectHistory>) -> Self {
        Self {
            history,
            log: None,
            live: None,
            tokens: None,
        }
    }
}

/// Why an inspect request failed.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error(
        "no {what} {id} is held (the history keeps recent sessions only; samples by seq come from the store)"
    )]
    NotFound { what: &'static str, id: String },
    #[error("query parameter {param}: {reason}")]
    InvalidQuery { param: &'static str, reason: String },
    #[error("this server has no sample store to read samples from")]
    NoStore,
    #[error("reading sample {seq} from the store failed: {source}")]
    Store {
        seq: u64,
        #[source]
        source: LogError,
    },
}

impl InspectError {
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::NotFound { .. } => (StatusCode::NOT_FOUND, "not_found"),
            Self::InvalidQuery { .. } => (StatusCode::BAD_REQUEST, "invalid_query"),
            Self::NoStore => (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable"),
            Self::Store { .. } => (StatusCode::BAD_GATEWAY, "store_error"),
        }
    }
}

impl IntoResponse for InspectError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let kind = if status.is_client_error() {
            "invalid_request_error"
        } else {
            "server_error"
        };
        let body = json!({"error": {"message": self.to_string(), "type": kind, "code": code}});
        (status, Json(body)).into_response()
    }
}

/// Default and bound of `limit` in the sessions list.
pub const DEFAULT_LIST_LIMIT: usize = 200;
pub const MAX_LIST_LIMIT: usize = 5000;

/// `GET /v1/inspect/overview`, `/v1/inspect/sessions`, `/v1/inspect/sessions/{id}`,
/// `/v1/inspect/samples/{seq}`. Generic over the state of the router it is merged into.
pub fn api_router<S: Clone + Send + Sync + 'static>(state: Inspect) -> Router<S> {
    Router::new()
        .route("/v1/inspect/overview", get(overview))
        .route("/v1/inspect/sessions", get(sessions))
        .route("/v1/inspect/sessions/{id}", get(session))
        .route("/v1/inspect/samples/{seq}", get(sample))
        .with_state(state)
}

async fn overview(State(st): State<Inspect>) -> Json<Overview> {
    let now = now_ms();
    let (totals, series, history) = st.history.overview_at(now);
    // The last minute: the twelve newest buckets (the newest one is still filling).
    let minute = (60_000 / BUCKET_MS) as usize;
    let recent = &series[series.len().saturating_sub(minute)..];
    let span_s = ((recent.len().saturating_sub(1)) as f64 * BUCKET_MS as f64
        + (now % BUCKET_MS) as f64)
        / 1000.0;
    let per_s = |f: fn(&crate::api::SeriesPoint) -> u64| {
        let n: u64 = recent.iter().map(f).sum();
        if span_s > 0.0 { n as f64 / span_s } else { 0.0 }
    };
    let (store, store_error) = match &st.log {
        Some(log) => match log.stats().await {
            Ok(s) => (Some(StoreView::from(s)), None),
            Err(e) => (None, Some(e.to_string())),
        },
        None => (None, None),
    };
    Json(Overview {
        now_ms: now,
        requests_per_s: per_s(|p| p.requests),
        samples_per_s: per_s(|p| p.samples),
        totals,
        bucket_ms: BUCKET_MS,
        series,
        live: st.live.as_ref().map(|l| l.live()),
        store,
        store_error,
        history,
    })
}

async fn sessions(
    State(st): State<Inspect>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Json<SessionList>, InspectError> {
    let limit = match q.get("limit") {
        None => DEFAULT_LIST_LIMIT,
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_LIST_LIMIT).contains(n))
            .ok_or_else(|| InspectError::InvalidQuery {
                param: "limit",
                reason: format!("{v:?} is not a number from 1 to {MAX_LIST_LIMIT}"),
            })?,
    };
    let query = q.get("q").map_or("", |s| s.trim());
    Ok(Json(st.history.sessions(query, limit)))
}

async fn session(
    State(st): State<Inspect>,
    Path(id): Path<String>,
) -> Result<Json<SessionTimeline>, InspectError> {
    st.history
        .session(&id)
        .map(Json)
        .ok_or(InspectError::NotFound {
            what: "session",
            id,
        })
}

async fn sample(
    State(st): State<Inspect>,
    Path(seq): Path<String>,
) -> Result<Json<SampleView>, InspectError> {
    let seq: u64 = seq.parse().map_err(|_| InspectError::InvalidQuery {
        param: "seq",
        reason: format!("{seq:?} is not a sample's seq (a positive integer)"),
    })?;
    let log = st.log.as_ref().ok_or(InspectError::NoStore)?;
    let stored = log
        .get(seq)
        .await
        .map_err(|source| InspectError::Store { seq, source })?
        .ok_or_else(|| InspectError::NotFound {
            what: "sample",
            id: seq.to_string(),
        })?;
    let mut view = sample_view(&stored, st.tokens.as_deref());
    if let Some(e) = &stored.sample.rollout_routed_experts {
        // Each block from the store (a block gone since the sample was read: no experts shown).
        let mut bytes = Vec::new();
        let mut complete = true;
        for b in &e.blocks {
            match log.blob(&b.hash).await {
                Ok(Some(block)) => bytes.extend_from_slice(&block),
                _ => {
                    complete = false;
                    break;
                }
            }
        }
        if complete {
            crate::sample_view::attach_experts(&mut view, e, &bytes);
        }
    }
    Ok(Json(view))
}

const INDEX_HTML: &str = include_str!("../assets/index.html");
const APP_JS: &str = include_str!("../assets/app.js");
const APP_CSS: &str = include_str!("../assets/app.css");

/// The page's own rules: nothing but its own assets and same-origin requests.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data: blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// `GET /ui` (the page) and its assets `/ui/app.js`, `/ui/app.css`. Generic over the state of
/// the router it is merged into.
pub fn ui_router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route(
            "/ui/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/ui/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/ui/app.css",
            get(|| async { asset("text/css; charset=utf-8", APP_CSS) }),
        )
}
