//! A streamed chat answer translated event by event into the Responses API's stream:
//! `response.created` and `response.in_progress`, then per output item `response.output_item.added`,
//! its deltas (`response.reasoning_text.delta`, `response.content_part.added` and
//! `response.output_text.delta`, `response.function_call_arguments.delta`), their `.done` events
//! and `response.output_item.done`; then `response.completed` (or `response.incomplete` at the token
//! limit). A broken or aborted stream ends with `response.failed`. Every event carries its
//! `sequence_number`, from 0.

use serde_json::{Value, json};

use super::answer::{Built, ResponseContext, Seg};
use crate::chunks::{Chunk, SseData, SseReader, ToolKeys};

/// The kind of item being streamed (its segment is the last of [`Built::segs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Reasoning,
    Message,
    /// A call, by its key.
    Call(i64),
}

/// The translation of one streamed answer ([`crate::messages::EventStream`]'s twin).
#[derive(Debug)]
pub struct EventStream {
    cx: ResponseContext,
    reader: SseReader,
    built: Built,
    seq: u64,
    started: bool,
    ended: bool,
    failed: bool,
    open: Option<Open>,
    output_index: usize,
    tool_keys: ToolKeys,
}

impl EventStream {
    pub fn new(cx: ResponseContext) -> Self {
        Self {
            cx,
            reader: SseReader::default(),
            // Replaced by the first chunk's id and time; a stream that fails before any chunk
            // still answers with an id and a time of its own.
            built: Built::start(None, None),
            seq: 0,
            started: false,
            ended: false,
            failed: false,
            open: None,
            output_index: 0,
            tool_keys: ToolKeys::default(),
        }
    }

    /// The Responses events the next bytes of the chat stream make (possibly none).
    pub fn push(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for data in self.reader.push(bytes) {
            if !self.ended {
                self.on_data(data, &mut out);
            }
        }
        out
    }

    /// The events that close the stream when the chat stream has ended (`response.failed` when it
    /// ended without `[DONE]`).
    pub fn finish(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        if !self.ended {
            self.fail("the answer's stream ended before it was complete", &mut out);
        }
        out
    }

    /// Whether the stream ended with `response.failed`.
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// The completed answer as a chat assistant message and its response id (for a stored
    /// response), once the stream completed.
    pub fn completed(&self) -> Option<(String, Value)> {
        (self.ended && !self.failed).then(|| (self.built.response_id(), self.built.chat_message()))
    }

    fn emit(&mut self, kind: &str, mut data: Value, out: &mut Vec<u8>) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(kind.as_bytes());
        out.extend_from_slice(b"\ndata: ");
        let _ = serde_json::to_writer(&mut *out, &data);
        out.extend_from_slice(b"\n\n");
    }

    fn on_data(&mut self, data: SseData, out: &mut Vec<u8>) {
        let data = match data {
            SseData::Done => return self.complete(out),
            SseData::Unreadable(why) => return self.fail(why, out),
            SseData::Json(d) => d,
        };
        let chunk: Chunk<'_> = match serde_json::from_str(&data) {
            Ok(c) => c,
            Err(e) => return self.fail(&format!("an event of the answer does not read: {e}"), out),
        };
        if let Some(err) = chunk.error {
            let message = err
                .message
                .as_deref()
                .unwrap_or("the engine's stream failed")
                .to_owned();
            return self.fail(&message, out);
        }
        if !self.started {
            self.built = Built::start(chunk.id.as_deref(), chunk.created);
            self.start(out);
        }
        if let Some(u) = chunk.usage {
            self.built.prompt_tokens = u.prompt_tokens;
            self.built.completion_tokens = u.completion_tokens;
        }
        let Some(choice) = chunk.choices.into_iter().next() else {
            return;
        };
        if let Some(delta) = choice.delta {
            if let Some(t) = delta
                .reasoning_content
                .or(delta.reasoning)
                .filter(|t| !t.is_empty())
            {
                self.open_item(Open::Reasoning, None, out);
                self.append(&t);
                let d = json!({"item_id": self.built.item_id(self.output_index), "output_index": self.output_index,
                    "content_index": 0, "delta": t});
                self.emit("response.reasoning_text.delta", d, out);
            }
            if let Some(t) = delta.content.filter(|t| !t.is_empty()) {
                self.open_item(Open::Message, None, out);
                self.append(&t);
                let d = json!({"item_id": self.built.item_id(self.output_index), "output_index": self.output_index,
                    "content_index": 0, "delta": t, "logprobs": []});
                self.emit("response.output_text.delta", d, out);
            }
            for (position, call) in delta.tool_calls.into_iter().enumerate() {
                let (name, args) = match call.function {
                    Some(f) => (f.name, f.arguments),
                    None => (None, None),
                };
                let open = match self.open {
                    Some(Open::Call(k)) => Some(k),
                    _ => None,
                };
                let starts = call.id.is_some() || name.is_some();
                let Some(key) = self.tool_keys.key(call.index, position, starts, open) else {
                    return self.fail(
                        "the engine's stream went back to a tool call whose item had ended",
                        out,
                    );
                };
                if open != Some(key) {
                    let i = self.built.calls.len();
                    let call = (
                        call.id
                            .map_or_else(|| format!("call_{i}"), |c| c.into_owned()),
                        name.map(|n| n.into_owned()).unwrap_or_default(),
                        String::new(),
                    );
                    self.open_item(Open::Call(key), Some(call), out);
                }
                if let Some(a) = args.filter(|a| !a.is_empty()) {
                    self.append(&a);
                    let d = json!({"item_id": self.built.item_id(self.output_index), "output_index": self.output_index, "delta": a});
                    self.emit("response.function_call_arguments.delta", d, out);
                }
            }
        }
        if let Some(f) = choice.finish_reason {
            self.built.finish_reason = Some(f.into_owned());
            // An aborted answer fails at once, before the chat stream's end, which the caller
            // then does not read: the turn is not trained on, its reply not registered.
            if self.built.finish_reason.as_deref() == Some("abort") {
                self.fail(crate::error::ABORTED, out);
            }
        }
    }

    /// Appends to the open segment's text (a call's arguments).
    fn append(&mut self, t: &str) {
        match self.built.segs.last_mut() {
            Some(Seg::Reasoning(s) | Seg::Text(s)) => s.push_str(t),
            Some(Seg::Call(i)) => {
                let i = *i;
                self.built.calls[i].2.push_str(t);
            }
            None => {}
        }
    }

    fn start(&mut self, out: &mut Vec<u8>) {
        self.started = true;
        let r = self.built.response(&self.cx, false);
        self.emit("response.created", json!({"response": r}), out);
        let r = self.built.response(&self.cx, false);
        self.emit("response.in_progress", json!({"response": r}), out);
    }

    /// Makes `want` the open item: closes another, starts a new segment (`call`: a new call's
    /// id, name and empty arguments).
    fn open_item(&mut self, want: Open, call: Option<(String, String, String)>, out: &mut Vec<u8>) {
        if self.open == Some(want) {
            return;
        }
        self.close_item(out);
        let seg = match (want, call) {
            (Open::Reasoning, _) => Seg::Reasoning(String::new()),
            (Open::Message, _) => Seg::Text(String::new()),
            (Open::Call(_), call) => {
                self.built.calls.push(call.unwrap_or_default());
                Seg::Call(self.built.calls.len() - 1)
            }
        };
        self.built.segs.push(seg);
        let oi = self.output_index;
        let item = self.built.item(&self.cx, oi, false);
        self.emit(
            "response.output_item.added",
            json!({"output_index": oi, "item": item}),
            out,
        );
        if want == Open::Message {
            let d = json!({"item_id": self.built.item_id(oi), "output_index": oi, "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}});
            self.emit("response.content_part.added", d, out);
        }
        self.open = Some(want);
    }

    fn close_item(&mut self, out: &mut Vec<u8>) {
        if self.open.take().is_none() {
            return;
        }
        let oi = self.output_index;
        let id = self.built.item_id(oi);
        let item = self.built.item(&self.cx, oi, true);
        match self.built.segs.get(oi).cloned() {
            Some(Seg::Reasoning(text)) => {
                let d =
                    json!({"item_id": id, "output_index": oi, "content_index": 0, "text": text});
                self.emit("response.reasoning_text.done", d, out);
            }
            Some(Seg::Text(text)) => {
                let d = json!({"item_id": id, "output_index": oi, "content_index": 0, "text": text, "logprobs": []});
                self.emit("response.output_text.done", d, out);
                let part =
                    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
                let d =
                    json!({"item_id": id, "output_index": oi, "content_index": 0, "part": part});
                self.emit("response.content_part.done", d, out);
            }
            Some(Seg::Call(i)) => {
                let args = self.built.calls[i].2.clone();
                let d = json!({"item_id": id, "output_index": oi, "arguments": args, "name": item["name"]});
                self.emit("response.function_call_arguments.done", d, out);
            }
            None => {}
        }
        self.emit(
            "response.output_item.done",
            json!({"output_index": oi, "item": item}),
            out,
        );
        self.output_index += 1;
    }

    fn complete(&mut self, out: &mut Vec<u8>) {
        match self.built.finish_reason.as_deref() {
            None => return self.fail("the answer's stream ended without a finish reason", out),
            Some("abort") => {
                return self.fail(crate::error::ABORTED, out);
            }
            Some(_) => {}
        }
        if !self.started {
            self.start(out);
        }
        self.close_item(out);
        let r = self.built.response(&self.cx, true);
        let kind = if self.built.status() == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        self.emit(kind, json!({"response": r}), out);
        self.ended = true;
    }

    fn fail(&mut self, message: &str, out: &mut Vec<u8>) {
        if !self.started {
            self.start(out);
        }
        let mut r = self.built.response(&self.cx, false);
        r["status"] = json!("failed");
        r["error"] = json!({"code": "server_error", "message": message});
        self.emit("response.failed", json!({"response": r}), out);
        self.ended = true;
        self.failed = true;
    }
}
