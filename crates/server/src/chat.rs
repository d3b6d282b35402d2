//! `POST /v1/chat/completions`: validate, forward, answer the client, and hand main turns to capture.

use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use ps_core::TurnType;
use ps_sglang_client::{rollout_from_response, synthesize_chunks};
use serde_json::{Map, Value, json};
use tracing::Instrument;

use crate::capture::CaptureJob;
use crate::error::ApiError;
use crate::metrics as m;
use crate::proxy_stream::{ClientShape, ProxyStream, sse_bytes};
use crate::request::{self, ForwardOptions};
use crate::state::AppState;

/// Session id of a request that names none (as the reference).
pub const UNKNOWN_SESSION: &str = "unknown";

/// What a main turn needs captured, taken from the request before it is forwarded.
pub(crate) struct TurnContext {
    pub guard: ps_core::TurnGuard,
    pub arrival_seq: u64,
    pub messages: Vec<Value>,
    pub tools: Option<Value>,
    pub template_kwargs: Option<Map<String, Value>>,
    pub session_done: bool,
    pub token_ids: crate::modes::TokenIdsMode,
    /// Whether the upstream call asked the engine for its ids.
    pub asked_for_ids: bool,
    pub trainer_weight_version: Option<String>,
    pub origin: ps_core::SessionOrigin,
}

impl TurnContext {
    pub fn job(self, rollout: ps_core::RolloutResponse) -> CaptureJob {
        CaptureJob {
            guard: self.guard,
            arrival_seq: self.arrival_seq,
            messages: self.messages,
            tools: self.tools,
            template_kwargs: self.template_kwargs,
            rollout,
            session_done: self.session_done,
            token_ids: self.token_ids,
            asked_for_ids: self.asked_for_ids,
            trainer_weight_version: self.trainer_weight_version,
            origin: self.origin,
        }
    }
}

pub async fn chat_completions(
    State(app): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let span = tracing::info_span!(
        "chat",
        session_id = tracing::field::Empty,
        turn_type = tracing::field::Empty,
        turn = tracing::field::Empty,
        seq = tracing::field::Empty
    );
    async move {
        match handle(&app, &headers, body).await {
            Ok((resp, turn_type)) => {
                metrics::counter!(
                    m::REQUESTS_TOTAL,
                    "turn_type" => turn_type.as_str(),
                    "outcome" => "ok",
                    "status" => resp.status().as_u16().to_string()
                )
                .increment(1);
                resp
            }
            Err(e) => {
                let outcome = if e.is_client_error() {
                    "client_error"
                } else {
                    "upstream_error"
                };
                metrics::counter!(
                    m::REQUESTS_TOTAL,
                    "turn_type" => "unknown",
                    "outcome" => outcome,
                    "status" => e.status_code().as_u16().to_string()
                )
                .increment(1);
                if e.is_client_error() {
                    tracing::info!(code = e.code(), error = %e, "rejected chat request");
                } else {
                    tracing::warn!(code = e.code(), error = %e, "chat request failed upstream");
                }
                e.into_response()
            }
        }
    }
    .instrument(span)
    .await
}

/// Reads a request body of at most `limit` bytes: a `Content-Length` over the limit is refused at
/// once, without waiting for bytes that may never come; a body that grows past it is cut off. The
/// 413 keeps the unread rest of the body, so that the answer lingers until the client has sent it
/// ([`crate::linger`]) and the client reads the 413 instead of a connection reset.
pub(crate) async fn read_body(
    headers: &HeaderMap,
    mut body: Body,
    limit: usize,
) -> Result<Bytes, ApiError> {
    use http_body_util::BodyExt as _;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let too_large = |read: u64, rest: Body| ApiError::PayloadTooLarge {
        limit,
        unread: crate::linger::Unread::keep(headers, declared, read, rest),
    };
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large(0, body));
    }
    let mut buf = Vec::with_capacity(declared.map_or(0, |n| n as usize));
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            ApiError::invalid(
                "body_read_failed",
                format!("reading the request body failed: {e}"),
            )
        })?;
        if let Some(data) = frame.data_ref() {
            if buf.len() + data.len() > limit {
                return Err(too_large((buf.len() + data.len()) as u64, body));
            }
            buf.extend_from_slice(data);
        }
    }
    Ok(Bytes::from(buf))
}

async fn handle(
    app: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Response, TurnType), ApiError> {
    let handler_started = Instant::now();
    let opts = app.options();
    let bytes = read_body(headers, body, opts.max_body_bytes).await?;
    let req = request::parse_limited(&bytes, headers, opts.max_messages)?;
    // While the trainer has paused submission: refuse, hold, or serve without collecting.
    let mut collect = true;
    if !app.submission_enabled() {
        let paused = ApiError::Paused {
            retry_after_secs: crate::state::PAUSED_RETRY_AFTER_SECS,
        };
        match opts.pause_mode {
            crate::modes::PauseMode::Reject => return Err(paused),
            crate::modes::PauseMode::Hold => {
                if !app.wait_submission(opts.pause_hold_max).await {
                    return Err(paused);
                }
            }
            crate::modes::PauseMode::Serve => collect = false,
        }
    }

    let inference = &opts.inference;
    let turn_type = req.session.turn_type.unwrap_or_else(|| {
        crate::infer::turn_type_by_shape(&inference.side_rules, &req, opts.default_turn_type)
    });
    let found = crate::infer::find_session(
        app.0.matcher.as_ref(),
        inference.mode,
        headers,
        &req,
        turn_type,
    );
    let (session_id, origin, reply) = (found.session_id, found.origin, found.reply);
    if origin.source == ps_core::SessionSource::Unknown && app.first_warning("\0no-session-id") {
        tracing::warn!(
            "a chat request carries no session id (`X-Session-Id` header or `session_id` key); such requests share the session \"unknown\""
        );
    }
    // Inferred sessions are new for every conversation: warn once for all of them.
    let warn_key = if reply.is_some() {
        "\0inferred"
    } else {
        session_id.as_str()
    };
    let turn_type = match req.session.turn_type {
        Some(t) => t,
        None if turn_type != opts.default_turn_type => turn_type,
        None => {
            if app.first_warning(warn_key) {
                tracing::warn!(
                    session_id = %session_id,
                    default = opts.default_turn_type.as_str(),
                    "requests of this session carry no turn type (`X-Turn-Type: main|side`); using `server.default_turn_type` ({}), so {}",
                    opts.default_turn_type.as_str(),
                    if opts.default_turn_type == TurnType::Side { "they produce NO training data" } else { "they are trained on" },
                );
            }
            opts.default_turn_type
        }
    };
    let arrival_seq = app.next_arrival();
    let span = tracing::Span::current();
    span.record("session_id", session_id.as_str());
    span.record("turn_type", turn_type.as_str());
    span.record("seq", arrival_seq);
    if req.session.done {
        tracing::debug!("session marked done by the client");
    }

    let sink = app.capture().sink().clone();
    let last_message = || {
        req.body
            .get("messages")
            .and_then(Value::as_array)
            .and_then(|m| m.last())
            .cloned()
            .unwrap_or(Value::Null)
    };
    let turn = if turn_type == TurnType::Main && collect {
        let turn_no = sink.begin(&session_id, &last_message(), req.session.done);
        span.record("turn", turn_no);
        let mut guard = ps_core::TurnGuard::new(sink, session_id.clone(), turn_no);
        guard.set_reason("upstream_failed");
        Some(guard)
    } else {
        if turn_type == TurnType::Main {
            // Served while paused: not captured, but the session still moves on, so the previous
            // turn's next state is this request's message and not one from after the resume.
            sink.advance(&session_id, &last_message(), req.session.done);
        } else if req.session.done {
            sink.end_session(&session_id);
        }
        None
    };
    let upstream_stream = req.stream && opts.upstream_stream;
    let asks_for_ids = !upstream_stream && opts.token_ids != crate::modes::TokenIdsMode::Retokenize;
    let forward_opts = ForwardOptions {
        served_model_name: &opts.served_model_name,
        stream: upstream_stream,
        return_token_ids: asks_for_ids,
    };
    let forwarded = request::forward_body(&req.body, &forward_opts);
    let turn = turn.map(|guard| TurnContext {
        guard,
        arrival_seq,
        messages: req
            .body
            .get("messages")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
        tools: req.body.get("tools").filter(|t| !t.is_null()).cloned(),
        template_kwargs: req
            .body
            .get("chat_template_kwargs")
            .and_then(Value::as_object)
            .cloned(),
        session_done: req.session.done,
        token_ids: opts.token_ids,
        // What was really sent: a client's own `return_token_ids: false` is kept.
        asked_for_ids: forwarded.get("return_token_ids") == Some(&Value::Bool(true)),
        trainer_weight_version: app.trainer_weight_version(),
        origin,
    });
    let shape = ClientShape::of(&req.body, &forwarded);
    let session_header = HeaderValue::from_str(&session_id).ok();

    // A permit per upstream request, held until the answer (or the streamed body) ends.
    let permit = app
        .0
        .upstream_permits
        .clone()
        .try_acquire_owned()
        .map_err(|_| ApiError::Overloaded {
            limit: opts.max_upstream,
        })?;
    let started = Instant::now();
    let mut overhead = None;
    let mut resp = if upstream_stream {
        let events = app.0.policy.chat_stream(&forwarded).await?;
        metrics::histogram!(m::UPSTREAM_SECONDS).record(started.elapsed().as_secs_f64());
        let stream = ProxyStream::start(events, app.clone(), turn, reply, shape, permit).await?;
        sse_response(Body::from_stream(stream))
    } else {
        let mut answer = app.0.policy.chat(&forwarded).await?;
        drop(permit);
        let upstream = started.elapsed();
        metrics::histogram!(m::UPSTREAM_SECONDS).record(upstream.as_secs_f64());
        overhead = Some(upstream);
        if !answer.is_object() {
            return Err(ps_sglang_client::SglangError::InvalidBody {
                url: app.0.policy.chat_url().to_owned(),
                detail: "the answer is not a JSON object".into(),
            }
            .into());
        }
        if let Some(message) = crate::infer::answer_message(&answer) {
            crate::infer::complete(reply, message);
        }
        if let Some(turn) = turn {
            app.capture()
                .submit(turn.job(rollout_from_response(&answer)));
        }
        shape.reshape(&mut answer);
        if req.stream {
            let mut out = Vec::new();
            for chunk in synthesize_chunks(&answer) {
                out.extend_from_slice(&sse_bytes(&chunk.to_string()));
            }
            out.extend_from_slice(&sse_bytes("[DONE]"));
            sse_response(Body::from(out))
        } else {
            if let Some(obj) = answer.as_object_mut() {
                obj.insert("session_id".into(), json!(session_id));
            }
            let mut resp = axum::Json(answer).into_response();
            // Standard `Server-Timing` (ms): lets a client subtract the upstream wait from its latency.
            let timing = format!("upstream;dur={:.3}", upstream.as_secs_f64() * 1e3);
            if let Ok(v) = HeaderValue::from_str(&timing) {
                resp.headers_mut().insert("server-timing", v);
            }
            resp
        }
    };
    if let Some(v) = session_header {
        resp.headers_mut().insert("x-session-id", v);
    }
    if let Some(upstream) = overhead {
        let added = handler_started.elapsed().saturating_sub(upstream);
        metrics::histogram!(m::PROXY_OVERHEAD_SECONDS).record(added.as_secs_f64());
    }
    Ok((resp, turn_type))
}

fn sse_response(body: Body) -> Response {
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}
