//! `POST /v1/responses`: the OpenAI Responses API's front door. The request is translated into the
//! chat-completions body of the same conversation (`ps_doors::responses`; a stored response's
//! conversation first when `previous_response_id` names one) and served by the one chat path
//! ([`chat::serve`]), then the answer is translated back into a `response` object, or its stream
//! event by event. A `store: true` response is kept in a bounded store
//! ([`crate::response_store::Store`]) for `previous_response_id`. Errors keep OpenAI's shape.

use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::BodyExt;
use ps_core::{Door, TurnType};
use ps_doors::responses::{EventStream, ResponseContext};

use crate::chat;
use crate::error::ApiError;
use crate::metrics as m;
use crate::plumbing::read_body;
use crate::response_store::STORE_MAX_RESPONSES;
use crate::state::AppState;

/// The handler.
pub async fn responses(State(app): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let result = handle(&app, &headers, body).await;
    let (outcome, turn_type, status) = match &result {
        Ok((resp, turn_type)) => ("ok", turn_type.as_str(), resp.status()),
        Err(e) if e.is_client_error() => ("client_error", "unknown", e.status_code()),
        Err(e) => ("upstream_error", "unknown", e.status_code()),
    };
    metrics::counter!(m::DOOR_REQUESTS_TOTAL, "door" => Door::Responses.as_str(), "outcome" => outcome)
        .increment(1);
    metrics::counter!(
        m::REQUESTS_TOTAL,
        "turn_type" => turn_type,
        "outcome" => outcome,
        "status" => status.as_u16().to_string()
    )
    .increment(1);
    match result {
        Ok((resp, _)) => resp,
        Err(e) => e.into_openai_response(),
    }
}

async fn handle(
    app: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Response, TurnType), ApiError> {
    #[derive(serde::Deserialize)]
    struct Previous {
        previous_response_id: Option<String>,
    }
    let started = Instant::now();
    let bytes = read_body(headers, body, app.options().max_body_bytes).await?;
    // Read only when the body names one (a scan, not a second parse of every request).
    let previous = memchr::memmem::find(&bytes, b"\"previous_response_id\"")
        .and_then(|_| serde_json::from_slice::<Previous>(&bytes).ok())
        .and_then(|p| p.previous_response_id);
    let prior = match previous {
        None => None,
        Some(id) => Some(app.0.responses.get(&id).ok_or_else(|| ApiError::NotFound {
            code: "previous_response_not_found",
            message: format!(
                "previous response {id:?} is not known here: only responses created with \
                 `store: true` by this process are kept (the last {STORE_MAX_RESPONSES}); send the \
                 conversation in `input` instead"
            ),
        })?),
    };
    let t = ps_doors::responses::to_chat(&bytes, prior.as_deref()).map_err(|e| {
        ApiError::InvalidRequest {
            code: e.code,
            message: e.message,
        }
    })?;
    crate::messages::count_dropped(app, Door::Responses, &t.dropped);
    let cx = ResponseContext {
        model: t.model.clone(),
        namespaces: t.namespaces.clone(),
        encrypted_reasoning: t.encrypted_reasoning,
        echo: t.echo.clone(),
    };
    let (stream, store, messages, size) = (t.stream, t.store, t.messages, t.body.len());
    let (resp, turn_type) =
        chat::serve(app, headers, Bytes::from(t.body), Door::Responses, started).await?;
    let (mut parts, body) = resp.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    if stream {
        let state = (
            body.into_data_stream(),
            EventStream::new(cx),
            false,
            app.clone(),
            Some(messages),
        );
        let translated = futures::stream::unfold(
            state,
            move |(mut data, mut events, ended, app, mut messages)| async move {
                if ended {
                    return None;
                }
                loop {
                    let (out, ended) = match data.next().await {
                        Some(Ok(bytes)) => (events.push(&bytes), false),
                        Some(Err(_)) | None => (events.finish(), true),
                    };
                    // A response the client got `response.failed` for is not read on (dropping
                    // the chat stream abandons the turn); a completed one is stored when asked.
                    let ended = ended || events.failed();
                    if store
                        && let Some((id, answer)) = events.completed()
                        && let Some(m) = messages.take()
                    {
                        app.0.responses.put(id, m, answer, size);
                    }
                    if !out.is_empty() {
                        let item = Ok::<_, std::convert::Infallible>(Bytes::from(out));
                        return Some((item, (data, events, ended, app, messages)));
                    }
                    if ended {
                        return None;
                    }
                }
            },
        );
        parts.headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        return Ok((
            Response::from_parts(parts, Body::from_stream(translated)),
            turn_type,
        ));
    }
    let chat_answer = body
        .collect()
        .await
        .map_err(|e| ApiError::Encode(format!("reading the chat answer: {e}")))?
        .to_bytes();
    let whole = ps_doors::responses::response_from_chat(&chat_answer, &cx, store).map_err(|e| {
        ApiError::Upstream(ps_sglang_client::SglangError::InvalidBody {
            url: app.0.policy.chat_url().to_owned(),
            detail: e.message,
        })
    })?;
    if store {
        let size = size + whole.body.len();
        app.0.responses.put(whole.id, messages, whole.message, size);
    }
    let out = whole.body;
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok((Response::from_parts(parts, Body::from(out)), turn_type))
}
