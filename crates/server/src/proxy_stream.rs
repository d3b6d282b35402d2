//! The streamed answer: every upstream chunk is forwarded to the client as soon as it arrives while
//! the answer is assembled beside it. A client that goes away drops this stream, which drops the
//! upstream response and so cancels the upstream request; such a turn is not used for training.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use ps_sglang_client::raw::{self, Edit, RawObject};
use ps_sglang_client::{
    Answer, ChatEventStream, Choice, SglangError, StreamAssembler, StreamEvent, choices_of,
};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::error::{ApiError, error_body};
use crate::metrics as m;
use crate::plumbing::TurnContext;
use crate::request::{ChatRequest, Forwarded};
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
    pub fn of(client: &ChatRequest, forwarded: &Forwarded) -> Self {
        Self {
            logprobs: client.is_true("logprobs"),
            top_logprobs: client.u64_of("top_logprobs").unwrap_or(0),
            injected_token_ids: forwarded.return_token_ids
                && !client.contains_key("return_token_ids"),
            client_prompt_ids: client.is_true("return_prompt_token_ids"),
        }
    }

    fn needs_reshape(&self) -> bool {
        !self.logprobs || self.top_logprobs == 0 || self.injected_token_ids
    }

    /// Writes an answer or chunk (an object read raw) as [`Self::reshape`] would leave it, without
    /// building a tree: every part the client gets unchanged is copied as the upstream's bytes.
    /// `extra` is a field set on the top-level object (in place when present, else last).
    /// `choices` are the object's choices when already read.
    pub fn write(
        &self,
        obj: &RawObject<'_>,
        choices: Option<&[Choice<'_>]>,
        extra: Option<(&str, &[u8])>,
        out: &mut Vec<u8>,
    ) {
        let reshape = self.needs_reshape();
        let drop_prompt_ids = reshape && self.injected_token_ids && !self.client_prompt_ids;
        let read;
        let choices = match choices {
            Some(c) => Some(c),
            None if reshape => {
                read = choices_of(obj.get("choices"));
                read.as_deref()
            }
            None => None,
        };
        let choices = choices.filter(|_| reshape).map(|elems| {
            let len = obj.get("choices").map_or(0, |c| c.get().len());
            let mut b = Vec::with_capacity(len);
            b.push(b'[');
            for (i, (text, choice)) in elems.iter().enumerate() {
                if i > 0 {
                    b.push(b',');
                }
                self.write_choice(text, choice.as_ref(), &mut b);
            }
            b.push(b']');
            b
        });
        let append: Vec<(&str, &[u8])> = extra
            .filter(|(k, _)| !obj.contains_key(k))
            .into_iter()
            .collect();
        raw::write_object(
            out,
            obj,
            |k, _| match k {
                "prompt_token_ids" if drop_prompt_ids => Edit::Drop,
                "choices" if choices.is_some() => {
                    Edit::Replace(choices.as_deref().unwrap_or_default().into())
                }
                _ => match extra {
                    Some((key, v)) if key == k => Edit::Replace(v.into()),
                    _ => Edit::Keep,
                },
            },
            &append,
        );
    }

    /// Writes a non-streamed answer as [`Self::write`] writes an object read raw, from the
    /// entries the answer's single pass recorded (no part of it is read again, except the
    /// log-probs of a client that wants them without top lists).
    pub fn write_answer(&self, answer: &Answer, extra: Option<(&str, &[u8])>, out: &mut Vec<u8>) {
        let reshape = self.needs_reshape();
        let drop_prompt_ids = reshape && self.injected_token_ids && !self.client_prompt_ids;
        let append: Vec<(&str, &[u8])> = extra
            .filter(|(k, _)| !answer.contains_key(k))
            .into_iter()
            .collect();
        let choice = reshape.then_some(|k: &str, v: &[u8]| self.choice_edit(k, v));
        answer.write(
            out,
            |k, _| match k {
                "prompt_token_ids" if drop_prompt_ids => Edit::Drop,
                _ => match extra {
                    Some((key, v)) if key == k => Edit::Replace(v.into()),
                    _ => Edit::Keep,
                },
            },
            choice,
            &append,
        );
    }

    /// What [`Self::write_answer`] does with one entry of a choice.
    fn choice_edit(&self, key: &str, value: &[u8]) -> Edit<'static> {
        match key {
            "token_ids" | "response_token_ids" if self.injected_token_ids => Edit::Drop,
            "prompt_token_ids" if self.injected_token_ids && !self.client_prompt_ids => Edit::Drop,
            "logprobs" if !self.logprobs => Edit::Replace(b"null".as_slice().into()),
            "logprobs" if self.top_logprobs == 0 => {
                match serde_json::from_slice::<&RawValue>(value)
                    .ok()
                    .and_then(without_top_logprobs)
                {
                    Some(b) => Edit::Replace(b.into()),
                    None => Edit::Keep,
                }
            }
            _ => Edit::Keep,
        }
    }

    fn write_choice(&self, choice: &RawValue, obj: Option<&RawObject<'_>>, out: &mut Vec<u8>) {
        let Some(obj) = obj else {
            out.extend_from_slice(choice.get().as_bytes());
            return;
        };
        let logprobs = if !self.logprobs {
            obj.contains_key("logprobs").then(|| b"null".to_vec())
        } else if self.top_logprobs == 0 {
            obj.get("logprobs").and_then(without_top_logprobs)
        } else {
            None
        };
        raw::write_object(
            out,
            obj,
            |k, _| match k {
                "token_ids" | "response_token_ids" if self.injected_token_ids => Edit::Drop,
                "prompt_token_ids" if self.injected_token_ids && !self.client_prompt_ids => {
                    Edit::Drop
                }
                "logprobs" => match &logprobs {
                    Some(b) => Edit::Replace(b.as_slice().into()),
                    None => Edit::Keep,
                },
                _ => Edit::Keep,
            },
            &[],
        );
    }
}

/// `logprobs` with every `content[]` entry's `top_logprobs` set to `[]`; `None` when there is no
/// `content` array (nothing changes).
fn without_top_logprobs(logprobs: &RawValue) -> Option<Vec<u8>> {
    let obj = RawObject::of(logprobs)?;
    let entries = obj.get("content").and_then(raw::array)?;
    let mut content = Vec::with_capacity(logprobs.get().len());
    raw::write_array(&mut content, &entries, |out, e| match RawObject::of(e) {
        Some(entry) => {
            let append: &[(&str, &[u8])] = if entry.contains_key("top_logprobs") {
                &[]
            } else {
                &[("top_logprobs", b"[]")]
            };
            raw::write_object(
                out,
                &entry,
                |k, _| match k {
                    "top_logprobs" => Edit::Replace(b"[]".as_slice().into()),
                    _ => Edit::Keep,
                },
                append,
            );
        }
        None => out.extend_from_slice(e.get().as_bytes()),
    });
    let mut out = Vec::with_capacity(content.len() + 64);
    raw::write_object(
        &mut out,
        &obj,
        |k, _| match k {
            "content" => Edit::Replace(content.as_slice().into()),
            _ => Edit::Keep,
        },
        &[],
    );
    Some(out)
}

impl ClientShape {
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
    use serde_json::json;

    fn shapes() -> Vec<ClientShape> {
        let mut out = Vec::new();
        for logprobs in [false, true] {
            for top_logprobs in [0, 2] {
                for injected_token_ids in [false, true] {
                    for client_prompt_ids in [false, true] {
                        out.push(ClientShape {
                            logprobs,
                            top_logprobs,
                            injected_token_ids,
                            client_prompt_ids,
                        });
                    }
                }
            }
        }
        out
    }

    fn answers() -> Vec<Value> {
        let entry = |t: &str| json!({"token": t, "bytes": [104], "logprob": -0.25, "top_logprobs": [{"token": t, "logprob": -0.25}]});
        vec![
            json!({"id": "x", "object": "chat.completion", "choices": [{"index": 0,
                "message": {"role": "assistant", "content": "Hi"},
                "logprobs": {"content": [entry("Hi"), {"token": "!", "logprob": -1.5}, 7]},
                "finish_reason": "stop", "matched_stop": 151645,
                "response_token_ids": [1, 2], "prompt_token_ids": [3]}],
                "usage": {"prompt_tokens": 1}, "metadata": {"weight_version": "v1"}}),
            // vLLM: prompt ids at the response level, `token_ids` per choice
            json!({"prompt_token_ids": [3, 4], "choices": [{"index": 0, "message": {"content": "a"},
                "logprobs": {"content": [entry("a")]}, "token_ids": [5]}], "session_id": "old"}),
            // a chunk, a choice without log-probs, one that is not an object
            json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "c"},
                "logprobs": null}, 3, {"index": 1, "logprobs": {"content": "x"}}]}),
            json!({"choices": "none", "prompt_token_ids": [1]}),
            json!({"choices": [], "usage": {}}),
        ]
    }

    /// The raw writer leaves every answer as reshaping its tree did (the same keys and values);
    /// the session id is set in place or added last.
    #[test]
    fn writing_raw_equals_reshaping_the_tree() {
        for shape in shapes() {
            for answer in answers() {
                let mut expected = answer.clone();
                shape.reshape(&mut expected);
                let text = answer.to_string();
                let obj = RawObject::parse(&text).expect("object");
                let mut out = Vec::new();
                shape.write(&obj, None, None, &mut out);
                let got: Value = serde_json::from_slice(&out).expect("JSON");
                assert_eq!(got, expected, "{shape:?} {answer}");
                if let Some(o) = expected.as_object_mut() {
                    o.insert("session_id".into(), json!("s\"1"));
                }
                let mut out = Vec::new();
                let choices = choices_of(obj.get("choices"));
                shape.write(
                    &obj,
                    choices.as_deref(),
                    Some(("session_id", br#""s\"1""#)),
                    &mut out,
                );
                let got: Value = serde_json::from_slice(&out).expect("JSON");
                assert_eq!(got, expected, "{shape:?} {answer}");
                // Keys the client keeps keep the upstream's order (removals do not reorder); an
                // added session id comes last. Read from the written text, not from a tree.
                let key_order = |text: &str| -> Vec<String> {
                    RawObject::parse(text)
                        .expect("object")
                        .entries()
                        .map(|(k, _)| k.to_owned())
                        .collect()
                };
                let got_keys = key_order(std::str::from_utf8(&out).expect("utf-8"));
                let kept = expected.as_object().expect("object");
                let mut want_keys: Vec<String> = key_order(&text)
                    .into_iter()
                    .filter(|k| kept.contains_key(k))
                    .collect();
                if !want_keys.iter().any(|k| k == "session_id") {
                    want_keys.push("session_id".into());
                }
                assert_eq!(got_keys, want_keys, "{shape:?} {answer}");
                // A whole answer, read in one pass, is written alike.
                let whole = Answer::parse("u", Bytes::from(text.clone())).expect("an answer");
                let mut written = Vec::new();
                shape.write_answer(&whole, Some(("session_id", br#""s\"1""#)), &mut written);
                assert_eq!(written, out, "{shape:?} {answer}");
            }
        }
    }

    /// An event whose data has several lines (an upstream event of several `data:` lines, or JSON
    /// with newlines between tokens) is written with `data: ` before every line.
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

    /// Nothing to take out: the answer's bytes go to the client as they came.
    #[test]
    fn an_answer_the_client_asked_for_whole_is_passed_on_byte_for_byte() {
        let shape = ClientShape {
            logprobs: true,
            top_logprobs: 1,
            injected_token_ids: false,
            client_prompt_ids: false,
        };
        let text = r#"{"id":"x","choices":[{"index":0,"logprobs":{"content":[{"token":"a","logprob":-0.10000000000000001,"top_logprobs":[]}]}}]}"#;
        let obj = RawObject::parse(text).expect("object");
        let mut out = Vec::new();
        shape.write(&obj, None, Some(("session_id", b"\"s\"")), &mut out);
        assert_eq!(
            std::str::from_utf8(&out).expect("utf-8"),
            &format!("{},\"session_id\":\"s\"}}", &text[..text.len() - 1])
        );
        let whole = Answer::parse("u", Bytes::from_static(text.as_bytes())).expect("an answer");
        let mut written = Vec::new();
        shape.write_answer(&whole, Some(("session_id", b"\"s\"")), &mut written);
        assert_eq!(written, out);
    }
}
