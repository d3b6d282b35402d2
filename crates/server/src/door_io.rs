//! What the doors' handlers (`messages`, `responses`) share around the one chat path: counting a
//! request by door and outcome, reading the chat answer whole, translating its stream event by
//! event, and writing the door's answer.

use axum::body::Body;
use axum::http::{HeaderValue, header, response::Parts};
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::BodyExt;
use ps_core::{Door, TurnType};

use crate::error::ApiError;
use crate::metrics as m;

/// A door's stream translation, fed the chat answer's bytes as they come.
pub(crate) trait Translator: Send + 'static {
    /// The door's events the next bytes make (possibly none).
    fn push(&mut self, bytes: &[u8]) -> Vec<u8>;
    /// The events that close the door's stream when the chat stream has ended.
    fn finish(&mut self) -> Vec<u8>;
    /// Whether the door's client got an error for this answer.
    fn failed(&self) -> bool;
}

impl Translator for ps_doors::messages::EventStream {
    fn push(&mut self, bytes: &[u8]) -> Vec<u8> {
        ps_doors::messages::EventStream::push(self, bytes)
    }
    fn finish(&mut self) -> Vec<u8> {
        ps_doors::messages::EventStream::finish(self)
    }
    fn failed(&self) -> bool {
        ps_doors::messages::EventStream::failed(self)
    }
}

impl Translator for ps_doors::responses::EventStream {
    fn push(&mut self, bytes: &[u8]) -> Vec<u8> {
        ps_doors::responses::EventStream::push(self, bytes)
    }
    fn finish(&mut self) -> Vec<u8> {
        ps_doors::responses::EventStream::finish(self)
    }
    fn failed(&self) -> bool {
        ps_doors::responses::EventStream::failed(self)
    }
}

/// Counts a door's request by outcome, and (as the chat route counts its own) in
/// `requests_total`.
pub(crate) fn count(door: Door, result: &Result<(Response, TurnType), ApiError>) {
    let (outcome, turn_type, status) = match result {
        Ok((resp, turn_type)) => ("ok", turn_type.as_str(), resp.status()),
        Err(e) if e.is_client_error() => ("client_error", "unknown", e.status_code()),
        Err(e) => ("upstream_error", "unknown", e.status_code()),
    };
    metrics::counter!(m::DOOR_REQUESTS_TOTAL, "door" => door.as_str(), "outcome" => outcome)
        .increment(1);
    metrics::counter!(
        m::REQUESTS_TOTAL,
        "turn_type" => turn_type,
        "outcome" => outcome,
        "status" => status.as_u16().to_string()
    )
    .increment(1);
}

/// The chat answer's body, whole.
pub(crate) async fn whole(body: Body) -> Result<Bytes, ApiError> {
    Ok(body
        .collect()
        .await
        .map_err(|e| ApiError::Encode(format!("reading the chat answer: {e}")))?
        .to_bytes())
}

/// The door's answer: the chat answer's status and headers, the door's body and content type.
pub(crate) fn answer(mut parts: Parts, content_type: &'static str, body: Body) -> Response {
    parts.headers.remove(header::CONTENT_LENGTH);
    parts
        .headers
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    Response::from_parts(parts, body)
}

/// The chat answer's stream (chat chunks, relayed or synthesised from a whole answer) translated
/// event by event; `after` sees the translator after each piece (a completed response is stored
/// there). Once the translator failed (its client got an error), the chat stream is not read on:
/// dropping it ends the turn (no sample of an answer the client did not get).
pub(crate) fn translated<T: Translator>(
    body: Body,
    translator: T,
    after: impl FnMut(&T) + Send + 'static,
) -> Body {
    let stream = futures::stream::unfold(
        (body.into_data_stream(), translator, after, false),
        |(mut data, mut t, mut after, ended)| async move {
            if ended {
                return None;
            }
            loop {
                let (out, ended) = match data.next().await {
                    Some(Ok(bytes)) => (t.push(&bytes), false),
                    // The chat body does not fail (an upstream break is an error chunk in it);
                    // its end closes the door's stream (an error when the answer was not
                    // complete).
                    Some(Err(_)) | None => (t.finish(), true),
                };
                let ended = ended || t.failed();
                after(&t);
                if !out.is_empty() {
                    let item = Ok::<_, std::convert::Infallible>(Bytes::from(out));
                    return Some((item, (data, t, after, ended)));
                }
                if ended {
                    return None;
                }
            }
        },
    );
    Body::from_stream(stream)
}
