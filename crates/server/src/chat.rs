//! `POST /v1/chat/completions`: validate, admit, open the turn, forward, answer the client (streamed
//! or whole), and hand main turns to capture.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use ps_core::{Door, TurnType};
use ps_session_infer::PendingReply;
use ps_sglang_client::{Answer, synthesize_chunks};
use tokio::sync::OwnedSemaphorePermit;

use crate::admission;
use crate::client_shape::ClientShape;
use crate::error::ApiError;
use crate::metrics as m;
use crate::plumbing::{TurnContext, read_body};
use crate::proxy_stream::{ProxyStream, sse_bytes};
use crate::request::{self, ChatRequest, ForwardOptions, Forwarded};
use crate::state::AppState;
use ps_core::modes::TokenIdsMode;

/// The handler: counts the request by outcome; the router's edge logs an error answer.
pub async fn chat_completions(
    State(app): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Response {
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
            e.into_response()
        }
    }
}

async fn handle(
    app: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Response, TurnType), ApiError> {
    let handler_started = Instant::now();
    let bytes = read_body(headers, body, app.options().max_body_bytes).await?;
    serve(app, headers, bytes, Door::ChatCompletions, handler_started).await
}

/// Serves a chat-completions body that came through `door` (another API's request arrives here
/// translated): validate, admit, open the turn, forward, answer in chat completions' shape.
/// `handler_started`: when the request arrived, for the proxy-overhead histogram.
pub(crate) async fn serve(
    app: &AppState,
    headers: &HeaderMap,
    bytes: Bytes,
    door: Door,
    handler_started: Instant,
) -> Result<(Response, TurnType), ApiError> {
    let opts = app.options();
    let req = request::parse_limited(&bytes, headers, opts.max_messages)?;
    // A model not served here is refused before anything else is done for the request.
    let model = request::upstream_model(&req, &opts.served_model_name, &opts.model_names)?;
    let collect = admission::pause_gate(app).await?;
    let opened = open_turn(app, headers, &bytes, &req, collect, model, door);
    let (turn_type, session_header) = (
        opened.turn_type,
        HeaderValue::from_str(&opened.session_id).ok(),
    );
    let permit = admission::upstream_permit(app)?;
    let (mut resp, upstream) = if opened.upstream_stream {
        (streamed_answer(app, opened, permit).await?, None)
    } else {
        let (resp, upstream) = whole_answer(app, opened, req.stream, permit).await?;
        (resp, Some(upstream))
    };
    if let Some(v) = session_header {
        resp.headers_mut().insert("x-session-id", v);
    }
    if let Some(upstream) = upstream {
        let added = handler_started.elapsed().saturating_sub(upstream);
        metrics::histogram!(m::PROXY_OVERHEAD_SECONDS).record(added.as_secs_f64());
    }
    Ok((resp, turn_type))
}

/// A request admitted and turned into a turn: its session, its type, what goes upstream, and
/// (for a collected main turn) what capture needs.
struct OpenedTurn {
    session_id: String,
    turn_type: TurnType,
    turn: Option<TurnContext>,
    /// Registers our reply for session inference when the answer is complete.
    reply: Option<PendingReply>,
    forwarded: Forwarded,
    shape: ClientShape,
    /// Whether the upstream call streams.
    upstream_stream: bool,
    /// The API the request came through: its answer must translate before it counts.
    door: Door,
}

/// Finds the request's session and turn type (warning once when they had to be guessed), records
/// them in the request span, and opens the turn in the session buffer: a main turn that is
/// collected gets a guard and its capture context; a main turn served while paused only moves its
/// session on.
fn open_turn(
    app: &AppState,
    headers: &HeaderMap,
    body: &Bytes,
    req: &ChatRequest<'_>,
    collect: bool,
    // The name sent upstream in place of the client's (`request::upstream_model`).
    model: Option<&str>,
    door: Door,
) -> OpenedTurn {
    let opts = app.options();
    let inference = &opts.inference;
    // `auto`: main when the session is recognised from the history (an unmodified agent), side
    // when the client keys its sessions (as the reference's clients, which name their main turns).
    let agent_key = crate::infer::agent_key(&inference.agent_keys, headers, req);
    let default = opts
        .default_turn_type
        .for_request(inference.unmodified_agent(req, agent_key.as_deref()));
    let turn_type = req.session.turn_type.unwrap_or_else(|| {
        crate::infer::turn_type_by_shape(
            &inference.side_rules,
            &inference.ephemeral_rules,
            req,
            default,
        )
    });
    let found = crate::infer::find_session(
        app.0.matcher.as_ref(),
        inference,
        headers,
        req,
        turn_type,
        agent_key.as_deref(),
    );
    let (session_id, mut origin, reply) = (found.session_id, found.origin, found.reply);
    origin.door = door;
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
        None if turn_type != default => turn_type,
        None => {
            if app.first_warning(warn_key) {
                let setting = opts.default_turn_type.as_str();
                if default == TurnType::Side {
                    tracing::warn!(
                        session_id = %session_id,
                        default = setting,
                        "requests of this session carry no turn type (`X-Turn-Type: main|side`); \
                         `server.default_turn_type = \"{setting}\"` makes them side turns, so they \
                         produce NO training data (send `X-Turn-Type: main`, or leave out the \
                         session key so that `auto` trains them)"
                    );
                } else {
                    tracing::info!(
                        session_id = %session_id,
                        default = setting,
                        "requests of this session carry no turn type (`X-Turn-Type: main|side`); \
                         `server.default_turn_type = \"{setting}\"` makes them main turns: they \
                         are trained on"
                    );
                }
            }
            default
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
    // What the request adds to its conversation, without the messages a client sends once; none
    // when that holds a part that is not text, which a judge would not see (counted, logged once).
    let next_state = || {
        let (added, rules) = (req.added_messages(), &inference.ephemeral_rules);
        // A vision-language policy's judges read each image of the next state as a stated
        // placeholder (they read text); a text policy's turn gets no next state from it.
        let placeholders = app
            .0
            .capture
            .images_captured()
            .then(|| ps_core::message::images_as_placeholders(added))
            .flatten();
        let added = placeholders.as_deref().unwrap_or(added);
        if let Some(reason) =
            ps_session_infer::ephemeral::unusable_next_state(added, rules, found.ephemeral_tail)
        {
            metrics::counter!(m::NEXT_STATE_UNUSABLE_TOTAL, "reason" => reason).increment(1);
            if app.first_warning(&format!("\0next-state-{reason}")) {
                tracing::warn!(
                    reason,
                    "a request adds a message with a part that is not text ({reason}): the \
                     previous turn gets no next state rather than a judgement of its text alone \
                     (logged once; counted as next_state_unusable_total)"
                );
            }
            return None;
        }
        ps_session_infer::next_state(added, rules, found.ephemeral_tail)
    };
    // A turn refused at once (a prompt with a part that is not text): answered as usual, never
    // queued for capture, abandoned with its reason once it is opened (capture would refuse it the
    // same way, after holding its text in the queue).
    let mut refused = None;
    let guard = if turn_type == TurnType::Main && collect {
        let turn_no = sink.begin(&session_id, next_state().as_ref(), req.session.done);
        span.record("turn", turn_no);
        let mut guard = ps_core::TurnGuard::new(sink, session_id.clone(), turn_no);
        guard.set_reason("upstream_failed");
        match req.unsupported_part(app.0.capture.images_captured()) {
            Some((reason, detail)) => {
                guard.set_reason(reason);
                metrics::counter!(m::CAPTURE_TOTAL, "outcome" => *reason).increment(1);
                if app.first_warning(&format!("\0unsupported-{reason}")) {
                    tracing::warn!(
                        reason,
                        "turn not trained on: it cannot become a correct sample: {detail} (logged \
                         once per reason; counted in /v1/rollout/status turns_abandoned_by_reason)"
                    );
                }
                refused = Some((guard, turn_no));
                None
            }
            None => Some((guard, turn_no)),
        }
    } else {
        if turn_type == TurnType::Main {
            // Served while paused: not captured, but the session still moves on, so the previous
            // turn's next state is this request's message and not one from after the resume.
            sink.advance(&session_id, next_state().as_ref(), req.session.done);
        } else if req.session.done {
            sink.end_session(&session_id);
        }
        None
    };
    app.tell(ps_core::TurnEvent::Opened {
        session: &session_id,
        turn: guard.as_ref().or(refused.as_ref()).map(|(_, n)| *n),
        turn_type,
        source: origin.source,
        streamed: req.stream,
        door,
    });
    if req.session.done {
        app.tell(ps_core::TurnEvent::SessionClosed {
            session: &session_id,
            reason: "done",
        });
    }
    // Abandoned with its reason, now that it is opened.
    drop(refused);
    let upstream_stream = req.stream && opts.upstream_stream;
    // SGLang refuses `return_token_ids` on a streamed request; vLLM answers it chunk by chunk.
    let asks_for_ids = opts.token_ids != TokenIdsMode::Retokenize
        && (!upstream_stream || app.engine().is_some_and(ps_core::Engine::streams_token_ids));
    // Only turns that become samples are sampled from the full distribution: side turns and
    // turns served while paused keep the client's parameters.
    let full_distribution =
        guard.is_some() && opts.sampling == ps_core::SamplingMode::FullDistribution;
    let sent = req.sampling();
    let sampling = if full_distribution {
        if app.first_warning("\0full-distribution") {
            tracing::info!(
                client_top_p = sent.top_p,
                client_top_k = sent.top_k,
                client_min_p = sent.min_p,
                "capture.sampling = \"full_distribution\": main turns are sent upstream with top_p \
                 1, top_k -1, min_p 0 in place of the client's (the temperature is kept), so \
                 their log-probs are of the full distribution the trainer recomputes (logged once)"
            );
        }
        ps_core::Sampling::full_distribution(sent.temperature)
    } else {
        sent
    };
    let forward_opts = ForwardOptions {
        served_model_name: &opts.served_model_name,
        model,
        stream: upstream_stream,
        return_token_ids: asks_for_ids,
        full_distribution,
        // Only for turns that become samples; vLLM returns them unasked (and refuses nothing
        // for it, but would not use the flag either).
        routed_experts: guard.is_some()
            && opts.ask_routed_experts
            && app.engine() != Some(ps_core::Engine::Vllm),
    };
    let forwarded = request::forward_body(req, &forward_opts);
    let turn = guard.map(|(guard, _)| TurnContext {
        guard,
        arrival_seq,
        // Slices of the client's body, which capture keeps instead of a copy.
        messages: body.slice_ref(req.messages_json().get().as_bytes()),
        tools: req.tools_json().map(|t| body.slice_ref(t.get().as_bytes())),
        template_kwargs: req
            .template_kwargs_json()
            .map(|k| body.slice_ref(k.get().as_bytes())),
        session_done: req.session.done,
        token_ids: opts.token_ids,
        // What was really sent: a client's own `return_token_ids: false` is kept.
        asked_for_ids: forwarded.return_token_ids,
        trainer_weight_version: app.trainer_weight_version(),
        origin,
        sampling,
    });
    OpenedTurn {
        shape: ClientShape::of(req, &forwarded),
        session_id,
        turn_type,
        turn,
        reply,
        forwarded,
        upstream_stream,
        door,
    }
}

/// The streamed answer: relayed event by event ([`ProxyStream`]), which holds the permit until the
/// body ends and hands the assembled turn to capture.
async fn streamed_answer(
    app: &AppState,
    t: OpenedTurn,
    permit: OwnedSemaphorePermit,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let events = match app.0.policy.chat_stream(t.forwarded.body.clone()).await {
        // Only vLLM streams ids: an engine that refuses the flag (SGLang, 400) is sent the request
        // again as the client sent it, and never asked again (the chat path does not fail for a
        // flag it added for training).
        Err(ps_sglang_client::SglangError::Status { status: 400, .. })
            if t.forwarded.injected_ids =>
        {
            app.engine_refused_streamed_ids();
            let body = request::without_injected_ids(&t.forwarded.body);
            app.0.policy.chat_stream(body).await?
        }
        other => other?,
    };
    metrics::histogram!(m::UPSTREAM_SECONDS).record(started.elapsed().as_secs_f64());
    let stream = ProxyStream::start(
        events,
        app.clone(),
        t.turn,
        t.reply,
        t.shape,
        permit,
        t.door,
    )
    .await?;
    Ok(sse_response(Body::from_stream(stream)))
}

/// The whole answer: fetched at once, handed to capture, and sent as JSON (with the session id and
/// a `Server-Timing` header) or, to a streaming client, as synthesised chunks. Also returns the
/// upstream wait.
async fn whole_answer(
    app: &AppState,
    mut t: OpenedTurn,
    client_streams: bool,
    permit: OwnedSemaphorePermit,
) -> Result<(Response, Duration), ApiError> {
    let started = Instant::now();
    // The body is kept for the wait only when it may be sent again (below).
    let body = if t.forwarded.injected_experts {
        t.forwarded.body.clone()
    } else {
        std::mem::take(&mut t.forwarded.body)
    };
    let bytes = match app.0.policy.chat(body).await {
        // Routed experts take layers × top-k × 16/3 bytes a token in SGLang's base64: a long
        // answer asked for them can pass the answer's size bound. The flag was ours, for
        // training: the request is sent again without it (the turn then has no experts, counted).
        Err(ps_sglang_client::SglangError::TooLarge { limit, .. })
            if t.forwarded.injected_experts =>
        {
            if app.first_warning("\0experts-too-large") {
                tracing::warn!(
                    limit,
                    "an answer with the routed experts the proxy asked for was larger than the \
                     answer bound (raise sglang.max_answer_mib): sent again without them, the turn \
                     gets no experts (counted in /v1/rollout/status routed_experts.missing; logged \
                     once)"
                );
            }
            app.0
                .policy
                .chat(request::without_injected_experts(&t.forwarded.body))
                .await?
        }
        other => other?,
    };
    drop(permit);
    let upstream = started.elapsed();
    metrics::histogram!(m::UPSTREAM_SECONDS).record(upstream.as_secs_f64());
    // Read once, without a tree: where its parts are; the client's copy is written from its bytes.
    let answer = Answer::parse(app.0.policy.chat_url(), bytes)?;
    if let Some(engine) = answer.engine() {
        app.learn_engine(engine, "from the keys of its answer");
    }
    // An answer another door cannot give its client is refused before it counts: no reply
    // registered for session inference, no sample of an answer the client never got.
    if let Err(e) = door_check(t.door, &answer) {
        // An aborted answer keeps its own reason; any other is one the door cannot carry.
        let reason = if e.code == "engine_aborted" {
            "engine_aborted"
        } else {
            "door_untranslatable"
        };
        if let Some(mut turn) = t.turn {
            turn.guard.set_reason(reason);
        }
        metrics::counter!(m::CAPTURE_TOTAL, "outcome" => reason).increment(1);
        return Err(ApiError::Upstream(
            ps_sglang_client::SglangError::InvalidBody {
                url: app.0.policy.chat_url().to_owned(),
                detail: e.message,
            },
        ));
    }
    if t.reply.is_some()
        && let Some(message) = answer.message()
    {
        crate::infer::complete(t.reply, &message);
    }
    if client_streams {
        let mut tree =
            answer
                .to_value()
                .map_err(|e| ps_sglang_client::SglangError::InvalidBody {
                    url: app.0.policy.chat_url().to_owned(),
                    detail: e.to_string(),
                })?;
        // The rollout (tokens, log-probs, the engine's ids) is read on the capture thread.
        if let Some(turn) = t.turn {
            turn.submit_answer(app.capture(), answer);
        }
        t.shape.reshape(&mut tree);
        let mut out = Vec::new();
        for chunk in synthesize_chunks(&tree) {
            out.extend_from_slice(&sse_bytes(&chunk.to_string()));
        }
        out.extend_from_slice(&sse_bytes("[DONE]"));
        return Ok((sse_response(Body::from(out)), upstream));
    }
    let session_id = serde_json::to_vec(&t.session_id).unwrap_or_else(|_| b"null".to_vec());
    let mut out = Vec::with_capacity(answer.bytes().len() + session_id.len() + 16);
    t.shape
        .write_answer(&answer, Some(("session_id", &session_id)), &mut out);
    // The rollout (tokens, log-probs, the engine's ids) is read on the capture thread, from the
    // same bytes.
    if let Some(turn) = t.turn {
        turn.submit_answer(app.capture(), answer);
    }
    let mut resp = Response::new(Body::from(out));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    // Standard `Server-Timing` (ms): lets a client subtract the upstream wait from its latency.
    let timing = format!("upstream;dur={:.3}", upstream.as_secs_f64() * 1e3);
    if let Ok(v) = HeaderValue::from_str(&timing) {
        resp.headers_mut().insert("server-timing", v);
    }
    Ok((resp, upstream))
}

/// Whether a whole answer can be answered through `door` (chat completions: always). Read from
/// the answer's scan: its finish reason and message, never its log-probs again.
fn door_check(door: Door, answer: &Answer) -> Result<(), ps_doors::DoorError> {
    let finish = answer.finish_reason();
    match door {
        Door::ChatCompletions => Ok(()),
        Door::Messages => {
            ps_doors::messages::check_answer(answer.message().as_ref(), finish.as_deref())
        }
        Door::Responses => ps_doors::responses::check_answer(finish.as_deref()),
    }
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
