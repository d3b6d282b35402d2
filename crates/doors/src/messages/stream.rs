//! A streamed chat answer, as the chat path writes it (`data: {chunk}` events and `data: [DONE]`),
//! translated event by event into the Messages API's stream: `message_start` and a `ping`, then
//! per content block `content_block_start`, its deltas (`thinking_delta` and a closing
//! `signature_delta`, `text_delta`, `input_json_delta`) and `content_block_stop`, then
//! `message_delta` (stop reason, usage) and `message_stop`. A chat stream that carries an error (the
//! engine's stream broke) ends with an `error` event; one that ends without `[DONE]` too.

use std::borrow::Cow;

use serde::Serialize;
use serde_json::value::RawValue;

use super::answer::{OutUsage, message_id, stop_reason, thinking_signature};
use crate::chunks::{Chunk, SseData, SseReader, ToolKeys, Usage};

/// A tool call's id and name, as its first delta gives them.
type ToolStart<'a> = (Option<Cow<'a, str>>, Option<Cow<'a, str>>);

/// The block being streamed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Open {
    Thinking,
    Text,
    /// A tool call, by its key ([`EventStream::tool_key`]).
    Tool(i64),
}

/// The translation of one streamed answer: fed the chat stream's bytes as they come
/// ([`EventStream::push`]), it returns the Messages events they make; [`EventStream::finish`] when
/// the chat stream ends.
#[derive(Debug)]
pub struct EventStream {
    model: String,
    thinking_omitted: bool,
    reader: SseReader,
    started: bool,
    /// `[DONE]` or an error was seen: nothing more is translated.
    ended: bool,
    /// It ended with an `error` event.
    failed: bool,
    open: Option<Open>,
    /// The index of the next content block.
    next_index: usize,
    /// The thinking text so far, for the signature.
    thinking: String,
    called_tools: bool,
    tool_keys: ToolKeys,
    finish_reason: Option<String>,
    matched_stop: Option<Box<RawValue>>,
    usage: Usage,
}

impl EventStream {
    /// A translation for an answer to `model`; `thinking_omitted`: thinking blocks go without their
    /// text (`thinking.display = "omitted"`).
    pub fn new(model: impl Into<String>, thinking_omitted: bool) -> Self {
        Self {
            model: model.into(),
            thinking_omitted,
            reader: SseReader::default(),
            started: false,
            ended: false,
            failed: false,
            open: None,
            next_index: 0,
            thinking: String::new(),
            called_tools: false,
            tool_keys: ToolKeys::default(),
            finish_reason: None,
            matched_stop: None,
            usage: Usage::default(),
        }
    }

    /// The Messages events the next bytes of the chat stream make (possibly none).
    pub fn push(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for data in self.reader.push(bytes) {
            if !self.ended {
                self.on_data(data, &mut out);
            }
        }
        out
    }

    /// The events that close the stream when the chat stream has ended: an `error` event when it
    /// ended without `[DONE]` (nothing when it already ended).
    pub fn finish(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        if !self.ended {
            self.fail("the answer's stream ended before it was complete", &mut out);
        }
        out
    }

    /// Whether the stream ended with an `error` event: the answer the client got is not complete
    /// (the caller stops reading the chat stream, which abandons the turn).
    pub fn failed(&self) -> bool {
        self.failed
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
                .unwrap_or(Cow::Borrowed("the engine's stream failed"));
            return self.fail(&message, out);
        }
        if !self.started {
            self.start(chunk.id.as_deref(), out);
        }
        if let Some(u) = chunk.usage {
            self.usage = u;
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
                self.open_block(Open::Thinking, None, out);
                self.thinking.push_str(&t);
                if !self.thinking_omitted {
                    self.delta(&BlockDelta::Thinking { thinking: &t }, out);
                }
            }
            if let Some(t) = delta.content.filter(|t| !t.is_empty()) {
                self.open_block(Open::Text, None, out);
                self.delta(&BlockDelta::Text { text: &t }, out);
            }
            for (position, call) in delta.tool_calls.into_iter().enumerate() {
                let f = call.function;
                let (name, args) = match f {
                    Some(f) => (f.name, f.arguments),
                    None => (None, None),
                };
                let starts = call.id.is_some() || name.is_some();
                let open = match self.open {
                    Some(Open::Tool(k)) => Some(k),
                    _ => None,
                };
                let Some(key) = self.tool_keys.key(call.index, position, starts, open) else {
                    return self.fail(
                        "the engine's stream went back to a tool call whose block had ended",
                        out,
                    );
                };
                self.called_tools = true;
                self.open_block(Open::Tool(key), Some((call.id, name)), out);
                if let Some(a) = args.filter(|a| !a.is_empty()) {
                    self.delta(&BlockDelta::InputJson { partial_json: &a }, out);
                }
            }
        }
        if let Some(f) = choice.finish_reason {
            self.finish_reason = Some(f.into_owned());
            self.matched_stop = choice
                .matched_stop
                .or(choice.stop_reason)
                .map(|m| m.to_owned());
            // An aborted answer fails at once, before the chat stream's end, which the caller
            // then does not read: the turn is not trained on, its reply not registered.
            if self.finish_reason.as_deref() == Some("abort") {
                self.fail(crate::error::ABORTED, out);
            }
        }
    }

    fn start(&mut self, id: Option<&str>, out: &mut Vec<u8>) {
        self.started = true;
        let message = StartMessage {
            id: message_id(id),
            kind: "message",
            role: "assistant",
            model: &self.model,
            content: [],
            stop_reason: None,
            stop_sequence: None,
            usage: OutUsage::from(Usage::default()),
        };
        write_event("message_start", &Event::MessageStart { message }, out);
        write_event("ping", &Event::Ping, out);
    }

    /// Makes `want` the open block: closes another, starts it when new.
    fn open_block(&mut self, want: Open, tool: Option<ToolStart<'_>>, out: &mut Vec<u8>) {
        if self.open.as_ref() == Some(&want) {
            return;
        }
        self.close_block(out);
        let index = self.next_index;
        let block = match &want {
            Open::Thinking => StartBlock::Thinking {
                thinking: "",
                signature: "",
            },
            Open::Text => StartBlock::Text { text: "" },
            Open::Tool(i) => {
                let (id, name) = tool.unwrap_or((None, None));
                StartBlock::ToolUse {
                    id: id.unwrap_or(Cow::Owned(format!("toolu_{i}"))),
                    name: name.unwrap_or_default(),
                    input: Empty {},
                }
            }
        };
        write_event(
            "content_block_start",
            &Event::ContentBlockStart {
                index,
                content_block: block,
            },
            out,
        );
        self.open = Some(want);
    }

    fn close_block(&mut self, out: &mut Vec<u8>) {
        let Some(open) = self.open.take() else {
            return;
        };
        if open == Open::Thinking {
            // Each thinking block's signature carries its own text.
            let signature = thinking_signature(&std::mem::take(&mut self.thinking));
            self.open = Some(open);
            self.delta(
                &BlockDelta::Signature {
                    signature: &signature,
                },
                out,
            );
            self.open = None;
        }
        write_event(
            "content_block_stop",
            &Event::ContentBlockStop {
                index: self.next_index,
            },
            out,
        );
        self.next_index += 1;
    }

    fn delta(&self, delta: &BlockDelta<'_>, out: &mut Vec<u8>) {
        write_event(
            "content_block_delta",
            &Event::ContentBlockDelta {
                index: self.next_index,
                delta,
            },
            out,
        );
    }

    fn complete(&mut self, out: &mut Vec<u8>) {
        if self.finish_reason.is_none() {
            return self.fail("the answer's stream ended without a finish reason", out);
        }
        if self.finish_reason.as_deref() == Some("abort") {
            return self.fail(crate::error::ABORTED, out);
        }
        if !self.started {
            self.start(None, out);
        }
        self.close_block(out);
        let (stop_reason, stop_sequence) = stop_reason(
            self.finish_reason.as_deref(),
            self.called_tools,
            self.matched_stop.as_deref(),
        );
        write_event(
            "message_delta",
            &Event::MessageDelta {
                delta: StopDelta {
                    stop_reason,
                    stop_sequence,
                },
                usage: self.usage.into(),
            },
            out,
        );
        write_event("message_stop", &Event::MessageStop, out);
        self.ended = true;
    }

    fn fail(&mut self, message: &str, out: &mut Vec<u8>) {
        write_event(
            "error",
            &Event::Error {
                error: ErrorInner {
                    kind: "api_error",
                    message,
                },
            },
            out,
        );
        self.ended = true;
        self.failed = true;
    }
}

fn write_event(name: &str, event: &Event<'_>, out: &mut Vec<u8>) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    // Serialising these plain structs cannot fail.
    let _ = serde_json::to_writer(&mut *out, event);
    out.extend_from_slice(b"\n\n");
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Event<'a> {
    MessageStart {
        message: StartMessage<'a>,
    },
    Ping,
    ContentBlockStart {
        index: usize,
        content_block: StartBlock<'a>,
    },
    ContentBlockDelta {
        index: usize,
        delta: &'a BlockDelta<'a>,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        delta: StopDelta,
        usage: OutUsage,
    },
    MessageStop,
    Error {
        error: ErrorInner<'a>,
    },
}

#[derive(Serialize)]
struct StartMessage<'a> {
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: &'a str,
    content: [(); 0],
    stop_reason: Option<&'static str>,
    stop_sequence: Option<String>,
    usage: OutUsage,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum StartBlock<'a> {
    Thinking {
        thinking: &'static str,
        signature: &'static str,
    },
    Text {
        text: &'static str,
    },
    ToolUse {
        id: Cow<'a, str>,
        name: Cow<'a, str>,
        input: Empty,
    },
}

#[derive(Serialize)]
struct Empty {}

#[derive(Serialize)]
#[serde(tag = "type")]
enum BlockDelta<'a> {
    #[serde(rename = "thinking_delta")]
    Thinking { thinking: &'a str },
    #[serde(rename = "signature_delta")]
    Signature { signature: &'a str },
    #[serde(rename = "text_delta")]
    Text { text: &'a str },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: &'a str },
}

#[derive(Serialize)]
struct StopDelta {
    stop_reason: &'static str,
    stop_sequence: Option<String>,
}

#[derive(Serialize)]
struct ErrorInner<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    message: &'a str,
}
