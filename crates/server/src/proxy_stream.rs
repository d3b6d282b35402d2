//! The streamed answer: every upstream chunk is forwarded to the client as soon as it arrives while
//! the answer is assembled beside it. A client that goes away drops this stream, which drops the
//! upstream response and so cancels the upstream request; such a turn is not used for training.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use ps_json::{self as raw, RawObject};
use ps_sglang_client::{ChatEventStream, SglangError, StreamAssembler, StreamEvent};
use serde_json::Value;

use crate::client_shape::ClientShape;
use crate::error::{ApiError, error_body};
use crate::metrics as m;
use crate::plumbing::TurnContext;
use crate::state::AppState;

/// One server-sent event carrying `data`: every line of it in a `data: ` line (an upstream event
/// of several `data:` lines arrives joined with `\n`, and JSON may hold newlines between tokens).
pub fn sse_bytes(data: &str) -> Bytes {
    let mut b = Vec::with_capacity(data.len() + 8);
    push_event(&mut b, data.as_bytes());
    Bytes::from(b)
}

fn push_event(out: &mut Vec<u8>, data: &[u8]) {
    for line in data.split(|&c| c == b'\n') {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line);
        out.push(b'\n');
    }
    out.push(b'\n');
}

pub struct ProxyStream {
    events: ChatEventStream,
    first: Option<StreamEvent>,
    app: AppState,
    turn: Option<TurnContext>,
    /// Registers our reply for session inference when the answer is complete.
    reply: Option<ps_session_infer::PendingReply>,
    assembler: Option<StreamAssembler>,
    /// Why the answer cannot be used for training, once known.
    unusable: Option<String>,
    shape: ClientShape,
    finished: bool,
    /// The request came through another door, whose client gets an error for an aborted answer
    /// or an error event (and stops reading): such a turn ends here, with its reason, never as
    /// a sample and never as a client that went away.
    door: ps_core::Door,
    span: tracing::Span,
    /// The upstream permit, released when the stream ends or is dropped.
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl ProxyStream {
    /// Waits for the first event before the answer is committed, so that a stream that fails at once
    /// still gets a proper error status.
    pub async fn start(
        mut events: ChatEventStream,
        app: AppState,
        turn: Option<TurnContext>,
        reply: Option<ps_session_infer::PendingReply>,
        shape: ClientShape,
        permit: tokio::sync::OwnedSemaphorePermit,
        door: ps_core::Door,
    ) -> Result<Self, ApiError> {
        let first = match events.next().await {
            Some(Ok(ev)) => ev,
            Some(Err(e)) => return Err(e.into()),
            None => {
                return Err(SglangError::Stream {
                    url: app.0.policy.chat_url().to_owned(),
                    detail: "the stream ended before its first event".into(),
                }
                .into());
            }
        };
        Ok(Self {
            events,
            first: Some(first),
            assembler: (turn.is_some() || reply.is_some()).then(StreamAssembler::new),
            turn,
            reply,
            app,
            unusable: None,
            shape,
            finished: false,
            door,
            span: tracing::Span::current(),
            _permit: permit,
        })
    }

    fn on_data(&mut self, data: String) -> Bytes {
        if self.door != ps_core::Door::ChatCompletions {
            self.end_if_the_door_fails(&data);
        }
        let needs_value = self.assembler.is_some() || self.shape.needs_reshape();
        if !needs_value {
            return sse_bytes(&data);
        }
        // A chunk is an object: read raw, assembled and reshaped without a tree.
        if let Ok(chunk) = RawObject::parse(&data)
            && !raw::needs_tree_check(data.as_bytes())
        {
            if let Some(a) = self.assembler.as_mut()
                && let Err(message) = a.feed_checked_raw(&chunk)
            {
                self.unusable.get_or_insert(message);
            }
            if !self.shape.needs_reshape() || chunk.contains_key("error") {
                return sse_bytes(&data);
            }
            if self.shape.drops_chunk(&chunk) {
                return Bytes::new();
            }
            let mut out = Vec::with_capacity(data.len() + 8);
            out.extend_from_slice(b"data: ");
            self.shape.write(&chunk, None, None, &mut out);
            if out.contains(&b'\n') {
                // Kept whitespace between values holds a newline: one `data: ` per line.
                let mut framed = Vec::with_capacity(out.len() + 16);
                push_event(&mut framed, &out[b"data: ".len()..]);
                return Bytes::from(framed);
            }
            out.extend_from_slice(b"\n\n");
            return Bytes::from(out);
        }
        // Not an object (not JSON, or JSON of another type): as a tree.
        let mut chunk: Value = match serde_json::from_str(&data) {
            Ok(v) => v,
            Err(e) => {
                self.unusable
                    .get_or_insert_with(|| format!("a chunk is not JSON: {e}"));
                return sse_bytes(&data);
            }
        };
        if let Some(a) = self.assembler.as_mut()
            && let Err(message) = a.feed_checked(&chunk)
        {
            self.unusable.get_or_insert(message);
        }
        if self.shape.needs_reshape() && chunk.get("error").is_none() {
            self.shape.reshape(&mut chunk);
            sse_bytes(&chunk.to_string())
        } else {
            sse_bytes(&data)
        }
    }

    /// Through another door, a chunk that says the answer was aborted, or an error event, makes
    /// the door's client an error and its translation stop reading: the turn ends here with its
    /// reason (`engine_aborted`, `stream_error`), no reply is registered, and the stream counts as
    /// finished (not as a client that went away).
    fn end_if_the_door_fails(&mut self, data: &str) {
        // A scan first: nearly every chunk names neither.
        if !data.contains("abort") && !data.contains("\"error\"") {
            return;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return;
        };
        let reason = if v.get("error").is_some() {
            "stream_error"
        } else if v["choices"][0]["finish_reason"] == "abort" {
            "engine_aborted"
        } else {
            return;
        };
        let _g = self.span.enter();
        if let Some(mut turn) = self.turn.take() {
            turn.guard.set_reason(reason);
        }
        self.reply = None;
        self.assembler = None;
        self.finished = true;
        metrics::counter!(m::CAPTURE_TOTAL, "outcome" => reason).increment(1);
        tracing::warn!(
            reason,
            door = self.door.as_str(),
            "the streamed answer ended in an error for the client ({reason}); turn not used for training"
        );
    }

    fn on_done(&mut self) {
        let _g = self.span.enter();
        let Some(assembler) = self.assembler.take() else {
            return;
        };
        if let Some(engine) = assembler.engine() {
            self.app.learn_engine(engine, "from the keys of its answer");
        }
        let finished = assembler.finished();
        let rollout = assembler.finish();
        // The client has the whole answer, whether or not it is captured (served while paused) or
        // ends with a finish reason: its next request continues from it. A stream that carried an
        // error event (or chunks we could not read) is a failure the client may retry: its reply is
        // not registered, so the retry is not a fork.
        if self.unusable.is_none() {
            crate::infer::complete(self.reply.take(), &rollout.message);
        }
        let Some(mut turn) = self.turn.take() else {
            return;
        };
        if let Some(reason) = self.unusable.take() {
            metrics::counter!(m::CAPTURE_TOTAL, "outcome" => "not_usable").increment(1);
            tracing::warn!(%reason, "streamed answer not used for training");
            turn.guard.set_reason("stream_error");
        } else if !finished {
            metrics::counter!(m::CAPTURE_TOTAL, "outcome" => "not_usable").increment(1);
            tracing::warn!("the stream ended without a finish reason; turn not used for training");
            turn.guard.set_reason("stream_unfinished");
        } else {
            turn.submit(self.app.capture(), rollout);
        }
    }

    fn on_broken(&mut self, e: SglangError) -> Bytes {
        let _g = self.span.enter();
        metrics::counter!(m::STREAM_BROKEN_TOTAL).increment(1);
        tracing::warn!(error = %e, "upstream stream broke after the answer started; turn not used for training");
        if let Some(turn) = self.turn.as_mut() {
            turn.guard.set_reason("stream_broken");
        }
        self.turn = None;
        let code = ApiError::from(e);
        let body = error_body(&code.to_string(), "upstream_error", code.code());
        let mut out = sse_bytes(&body.to_string()).to_vec();
        out.extend_from_slice(&sse_bytes("[DONE]"));
        Bytes::from(out)
    }
}

impl Stream for ProxyStream {
    type Item = Result<Bytes, std::convert::Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.finished {
            return Poll::Ready(None);
        }
        let ev = match this.first.take() {
            Some(ev) => Some(Ok(ev)),
            None => ready!(this.events.poll_next_unpin(cx)),
        };
        let out = match ev {
            Some(Ok(StreamEvent::Data(data))) => this.on_data(data),
            Some(Ok(StreamEvent::Done)) => {
                this.finished = true;
                this.on_done();
                sse_bytes("[DONE]")
            }
            Some(Err(e)) => {
                this.finished = true;
                this.on_broken(e)
            }
            None => {
                this.finished = true;
                let url = this.app.0.policy.chat_url().to_owned();
                this.on_broken(SglangError::Stream {
                    url,
                    detail: "the stream ended without `data: [DONE]`".into(),
                })
            }
        };
        Poll::Ready(Some(Ok(out)))
    }
}

impl Drop for ProxyStream {
    fn drop(&mut self) {
        if !self.finished {
            if let Some(turn) = self.turn.as_mut() {
                turn.guard.set_reason("client_cancelled");
            }
            let _g = self.span.enter();
            metrics::counter!(m::STREAM_CANCELLED_TOTAL).increment(1);
            tracing::info!(
                "client went away mid-stream; upstream request cancelled, turn not used for training"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_of_an_event_is_a_data_line() {
        assert_eq!(&sse_bytes("[DONE]")[..], b"data: [DONE]\n\n");
        assert_eq!(
            &sse_bytes("{\"a\":\n1}")[..],
            b"data: {\"a\":\ndata: 1}\n\n"
        );
        let mut framed = Vec::new();
        push_event(&mut framed, b"x\n\ny");
        assert_eq!(framed, b"data: x\ndata: \ndata: y\n\n");
    }
}
