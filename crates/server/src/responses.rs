//! `POST /v1/responses`: the OpenAI Responses API's front door. The request is translated into the
//! chat-completions body of the same conversation (`ps_doors::responses`; a stored response's
//! conversation first when `previous_response_id` names one) and served by the one chat path
//! ([`chat::serve`]), then the answer is translated back into a `response` object, or its stream
//! event by event. A `store: true` response is kept in a bounded store ([`Store`]) for
//! `previous_response_id`. Errors keep OpenAI's shape.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
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
use serde_json::Value;

use crate::chat;
use crate::error::ApiError;
use crate::metrics as m;
use crate::plumbing::read_body;
use crate::state::AppState;

/// Stored responses kept for `previous_response_id` (the oldest go first).
pub const STORE_MAX_RESPONSES: usize = 1024;
/// Their messages' JSON, at most (the oldest go first).
pub const STORE_MAX_BYTES: usize = 64 << 20;

/// The conversations of `store: true` responses, by response id: what a later request's
/// `previous_response_id` continues. In memory and bounded ([`STORE_MAX_RESPONSES`],
/// [`STORE_MAX_BYTES`]): a restart forgets them (the client then gets a clear 404).
#[derive(Debug, Default)]
pub struct Store(Mutex<StoreInner>);

#[derive(Debug, Default)]
struct StoreInner {
    by_id: HashMap<String, (Vec<Value>, usize)>,
    order: VecDeque<String>,
    bytes: usize,
}

impl Store {
    fn get(&self, id: &str) -> Option<Vec<Value>> {
        let g = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        g.by_id.get(id).map(|(m, _)| m.clone())
    }

    /// Keeps `messages` and the `answer` under `id`; `size`: their JSON's length, about (the
    /// chat body's).
    fn put(&self, id: String, mut messages: Vec<Value>, answer: Value, size: usize) {
        messages.push(answer);
        let mut g = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, old)) = g.by_id.insert(id.clone(), (messages, size)) {
            g.bytes -= old;
            g.order.retain(|o| o != &id);
        }
        g.bytes += size;
        g.order.push_back(id);
        while g.order.len() > STORE_MAX_RESPONSES
            || (g.bytes > STORE_MAX_BYTES && g.order.len() > 1)
        {
            let Some(oldest) = g.order.pop_front() else {
                break;
            };
            if let Some((_, n)) = g.by_id.remove(&oldest) {
                g.bytes -= n;
            }
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The store keeps at most its bound of responses, the oldest going first; a response put
    /// again under its id replaces itself.
    #[test]
    fn the_store_forgets_the_oldest_beyond_its_bounds() {
        let store = Store::default();
        let msg = |i: usize| vec![json!({"role": "user", "content": format!("m{i}")})];
        for i in 0..STORE_MAX_RESPONSES + 10 {
            store.put(
                format!("r{i}"),
                msg(i),
                json!({"role": "assistant", "content": "a"}),
                100,
            );
        }
        assert!(store.get("r0").is_none() && store.get("r9").is_none());
        let kept = store.get("r10").unwrap_or_default();
        assert_eq!(kept.len(), 2, "the conversation and the answer");
        assert!(
            store
                .get(&format!("r{}", STORE_MAX_RESPONSES + 9))
                .is_some()
        );
        // Bytes: one response over the bound evicts every older one, never itself.
        store.put("big".into(), msg(0), json!({}), STORE_MAX_BYTES + 1);
        assert!(store.get("big").is_some());
        assert!(
            store
                .get(&format!("r{}", STORE_MAX_RESPONSES + 9))
                .is_none()
        );
        store.put("big".into(), msg(1), json!({}), 10);
        assert_eq!(
            store.get("big").map(|m| m[0]["content"].clone()),
            Some(json!("m1"))
        );
    }
}
