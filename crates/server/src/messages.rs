//! `POST /v1/messages`: the Anthropic Messages API's front door. The request is translated into
//! the chat-completions body of the same conversation (`ps_doors::messages`) and served by the one
//! chat path ([`chat::serve`]: the same session keys, admission, upstream call, capture and sample),
//! then the answer is translated back: a whole chat answer into a Messages answer, a streamed one
//! event by event into the Messages events. Errors answer in Anthropic's shape.

use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use bytes::Bytes;
use ps_core::{Door, TurnType};
use ps_doors::messages::{EventStream, Translated};

use crate::error::ApiError;
use crate::metrics as m;
use crate::plumbing::read_body;
use crate::state::AppState;
use crate::{chat, door_io};

/// The handler: answers in the Messages API's shape, errors included.
pub async fn messages(State(app): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let result = handle(&app, &headers, body).await;
    door_io::count(Door::Messages, &result);
    match result {
        Ok((resp, _)) => resp,
        Err(e) => e.into_messages_response(),
    }
}

async fn handle(
    app: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Response, TurnType), ApiError> {
    let started = Instant::now();
    let bytes = read_body(headers, body, app.options().max_body_bytes).await?;
    let translated = translate(app, &bytes)?;
    let (model, stream, omitted) = (
        translated.model,
        translated.stream,
        translated.thinking_omitted,
    );
    let chat_body = Bytes::from(translated.body);
    let (resp, turn_type) = chat::serve(app, headers, chat_body, Door::Messages, started).await?;
    let (parts, body) = resp.into_parts();
    if stream {
        let events = EventStream::new(model, omitted);
        let body = door_io::translated(body, events, |_| {});
        return Ok((door_io::answer(parts, "text/event-stream", body), turn_type));
    }
    let chat_answer = door_io::whole(body).await?;
    let message =
        ps_doors::messages::message_from_chat(&chat_answer, &model, omitted).map_err(|e| {
            ApiError::Upstream(ps_sglang_client::SglangError::InvalidBody {
                url: app.0.policy.chat_url().to_owned(),
                detail: e.message,
            })
        })?;
    Ok((
        door_io::answer(parts, "application/json", Body::from(message)),
        turn_type,
    ))
}

/// `POST /v1/messages/count_tokens`: the prompt tokens of a Messages request, counted exactly as
/// its turn's prompt would be (the policy's template and tokenizer, the generation prompt, image
/// pads): `{"input_tokens": n}`.
pub async fn count_tokens(State(app): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    match count(&app, &headers, body).await {
        Ok(resp) => resp,
        Err(e) => e.into_messages_response(),
    }
}

async fn count(app: &AppState, headers: &HeaderMap, body: Body) -> Result<Response, ApiError> {
    #[derive(serde::Deserialize)]
    struct Prompt {
        messages: Vec<serde_json::Value>,
        tools: Option<serde_json::Value>,
        chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    }
    let bytes = read_body(headers, body, app.options().max_body_bytes).await?;
    let t = ps_doors::messages::count_request_to_chat(&bytes).map_err(|e| {
        ApiError::InvalidRequest {
            code: e.code,
            message: e.message,
        }
    })?;
    let prompt: Prompt = serde_json::from_slice(&t.body)
        .map_err(|e| ApiError::Encode(format!("reading the translated request: {e}")))?;
    let capture = app.clone();
    let counted = tokio::task::spawn_blocking(move || {
        capture.capture().count_prompt_tokens(
            &prompt.messages,
            prompt.tools.as_ref(),
            prompt.chat_template_kwargs.as_ref(),
        )
    })
    .await
    .map_err(|e| ApiError::Encode(format!("counting the prompt's tokens: {e}")))?;
    let n = counted.map_err(|e| {
        ApiError::invalid(
            "prompt_unrenderable",
            format!("the prompt does not render with the policy's chat template: {e}"),
        )
    })?;
    let mut resp = Response::new(Body::from(format!("{{\"input_tokens\":{n}}}")));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

/// The request translated, what it left out counted and logged once per kind.
fn translate(app: &AppState, bytes: &[u8]) -> Result<Translated, ApiError> {
    let t = ps_doors::messages::to_chat(bytes).map_err(|e| ApiError::InvalidRequest {
        code: e.code,
        message: e.message,
    })?;
    count_dropped(app, Door::Messages, &t.dropped);
    Ok(t)
}

/// Counts (and logs once per door and kind) what a door's translation left out.
pub(crate) fn count_dropped(app: &AppState, door: Door, dropped: &ps_doors::Dropped) {
    let door = door.as_str();
    if !dropped.hosted_tools.is_empty() {
        metrics::counter!(m::DOOR_DROPPED_TOTAL, "door" => door, "what" => "hosted_tool")
            .increment(dropped.hosted_tools.len() as u64);
        if app.first_warning(&format!("\0door-hosted-tool-{door}")) {
            tracing::warn!(
                tools = ?dropped.hosted_tools,
                "a request names tools the policy engine cannot run (hosted tools: Anthropic's \
                 own, with a `type`, or the Responses API's web search and the like): left out of \
                 the engine's tool list (logged once; counted as \
                 door_dropped_total{{what=\"hosted_tool\"}})"
            );
        }
    }
    if dropped.redacted_thinking > 0 {
        metrics::counter!(m::DOOR_DROPPED_TOTAL, "door" => door, "what" => "redacted_thinking")
            .increment(dropped.redacted_thinking as u64);
        if app.first_warning(&format!("\0door-redacted-thinking-{door}")) {
            tracing::warn!(
                "a Messages request's history holds redacted_thinking blocks (another model's \
                 encrypted reasoning): left out of the prompt (logged once; counted as \
                 door_dropped_total{{what=\"redacted_thinking\"}})"
            );
        }
    }
}
