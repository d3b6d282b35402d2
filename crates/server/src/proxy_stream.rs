//! The streamed answer: every upstream chunk is forwarded to the client as soon as it arrives while
//! the answer is assembled beside it. A client that goes away drops this stream, which drops the
//! upstream response and so cancels the upstream request; such a turn is not used for training.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use ps_sglang_client::{ChatEventStream, SglangError, StreamAssembler, StreamEvent};
use serde_json::{Map, Value};

use crate::error::{ApiError, error_body};
use crate::metrics as m;
use crate::plumbing::TurnContext;
use crate::state::AppState;

/// One server-sent event carrying `data`.
pub fn sse_bytes(data: &str) -> Bytes {
    let mut b = Vec::with_capacity(data.len() + 8);
    b.extend_from_slice(b"data: ");
    b.extend_from_slice(data.as_bytes());
    b.extend_from_slice(b"\n\n");
    Bytes::from(b)
}

/// What the client asked for, so that what we added for training (log-probs, top log-probs, token
/// ids) is taken out again and the answer keeps the shape the client expects.
#[derive(Debug, Clone, Copy)]
pub struct ClientShape {
    logprobs: bool,
    top_logprobs: u64,
    injected_token_ids: bool,
    /// The client asked for `return_prompt_token_ids` itself: its prompt ids stay.
    client_prompt_ids: bool,
}

impl ClientShape {
    pub fn of(client: &Map<String, Value>, forwarded: &Value) -> Self {
        Self {
            logprobs: client.get("logprobs").and_then(Value::as_bool) == Some(true),
            top_logprobs: client
                .get("top_logprobs")
                .and_then(Value::as_u64)
                .unwrap_or(0),
            injected_token_ids: forwarded.get("return_token_ids") == Some(&Value::Bool(true))
                && !client.contains_key("return_token_ids"),
            client_prompt_ids: client.get("return_prompt_token_ids") == Some(&Value::Bool(true)),
        }
    }

    fn needs_reshape(&self) -> bool {
        !self.logprobs || self.top_logprobs == 0 || self.injected_token_ids
    }

    /// Removes from an answer or chunk what the client did not ask for.
    pub fn reshape(&self, answer: &mut Value) {
        if !self.needs_reshape() {
            return;
        }
        if self.injected_token_ids
            && !self.client_prompt_ids
            && let Some(top) = answer.as_object_mut()
        {
            // vLLM answers the prompt ids at the response level.
            top.remove("prompt_token_ids");
        }
        let Some(choices) = answer.get_mut("choices").and_then(Value::as_array_mut) else {
            return;
        };
        for choice in choices {
            let Some(choice) = choice.as_object_mut() else {
                continue;
            };
            if self.injected_token_ids {
                // Wherever the build put them (docs/upstream-protocols.md, 1.5).
                choice.remove("token_ids");
                choice.remove("response_token_ids");
                if !self.client_prompt_ids {
                    choice.remove("prompt_token_ids");
                }
            }
            if !self.logprobs {
                if choice.contains_key("logprobs") {
                    choice.insert("logprobs".into(), Value::Null);
                }
            } else if self.top_logprobs == 0 {
                let entries = choice
                    .get_mut("logprobs")
                    .and_then(|l| l.get_mut("content"))
                    .and_then(Value::as_array_mut);
                for e in entries.into_iter().flatten() {
                    if let Some(e) = e.as_object_mut() {
                        e.insert("top_logprobs".into(), Value::Array(Vec::new()));
                    }
                }
            }
        }
    }
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
            span: tracing::Span::current(),
            _permit: permit,
        })
    }

    fn on_data(&mut self, data: String) -> Bytes {
        let needs_value = self.assembler.is_some() || self.shape.needs_reshape();
        if !needs_value {
            return sse_bytes(&data);
        }
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

    fn on_done(&mut self) {
        let _g = self.span.enter();
        let Some(assembler) = self.assembler.take() else {
            return;
        };
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
            self.app.capture().submit(turn.job(rollout));
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
