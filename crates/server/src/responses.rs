//! `POST /v1/responses`: the OpenAI Responses API's front door. The request is translated into the
//! chat-completions body of the same conversation (`ps_doors::responses`; a stored response's
//! conversation first when `previous_response_id` names one) and served by the one chat path
//! ([`chat::serve`]), then the answer is translated back into a `response` object, or its stream
//! event by event. A `store: true` response is kept in a bounded store
//! ([`crate::response_store::Store`]) for `previous_response_id`. Errors keep OpenAI's shape.

use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use ps_core::{Door, TurnType};
use ps_doors::responses::{EventStream, ResponseContext};

use crate::error::ApiError;
use crate::plumbing::read_body;
use crate::response_store::STORE_MAX_RESPONSES;
use crate::state::AppState;
use crate::{chat, door_io};

/// The handler.
pub async fn responses(State(app): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let result = handle(&app, &headers, body).await;
    door_io::count(Door::Responses, &result);
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
    let (parts, body) = resp.into_parts();
    if stream {
        // A completed response is stored when asked, once.
        let (app, mut messages) = (app.clone(), Some(messages));
        let body = door_io::translated(body, EventStream::new(cx), move |events| {
            if store
                && let Some((id, answer)) = events.completed()
                && let Some(m) = messages.take()
            {
                let size = size + serde_json::to_vec(&answer).map_or(0, |a| a.len());
                app.0.responses.put(id, m, answer, size);
            }
        });
        return Ok((door_io::answer(parts, "text/event-stream", body), turn_type));
    }
    let chat_answer = door_io::whole(body).await?;
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
    Ok((
        door_io::answer(parts, "application/json", Body::from(whole.body)),
        turn_type,
    ))
}
