//! A chat answer as a Responses `response` object: its output items (`reasoning`, an assistant
//! `message`, `function_call`s), status, usage and the request's settings. Shared by the whole
//! answer and the end of a stream ([`Built`]).

use serde_json::{Value, json};

use super::request::Namespaces;
use crate::DoorError;
use crate::messages::thinking_signature;

/// One output item of an answer, in the order it came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seg {
    Reasoning(String),
    Text(String),
    /// The `i`-th of [`Built::calls`].
    Call(usize),
}

/// What the answer's items are made of, whichever way the answer came: its segments in order (a
/// stream may give text after a call: a segment of its own, never the earlier text again).
#[derive(Debug, Clone, Default)]
pub(crate) struct Built {
    pub id: String,
    pub created: u64,
    pub segs: Vec<Seg>,
    /// `(call id, name as the engine called it, arguments)`.
    pub calls: Vec<(String, String, String)>,
    pub finish_reason: Option<String>,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// How the response object is written: the request's model name and settings.
#[derive(Debug, Clone)]
pub struct ResponseContext {
    pub model: String,
    pub namespaces: Namespaces,
    pub encrypted_reasoning: bool,
    /// The request's settings the response repeats ([`super::Translated::echo`]).
    pub echo: Value,
}

/// A response id for an answer whose engine gave none: unique in this process.
fn fresh_id() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("ps{t:x}{n:x}")
}

impl Built {
    /// Starts an answer with the engine's id (a fresh one when it gave none) and creation time.
    pub(crate) fn start(id: Option<&str>, created: Option<u64>) -> Self {
        Self {
            id: id
                .filter(|i| !i.is_empty())
                .map_or_else(fresh_id, str::to_owned),
            created: created.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs())
            }),
            ..Self::default()
        }
    }

    pub(crate) fn response_id(&self) -> String {
        if self.id.starts_with("resp_") {
            self.id.clone()
        } else {
            format!("resp_{}", self.id)
        }
    }

    /// The id of the segment at `i`.
    pub(crate) fn item_id(&self, i: usize) -> String {
        let base = self.id.trim_start_matches("chatcmpl-");
        let prefix = match self.segs.get(i) {
            Some(Seg::Reasoning(_)) => "rs",
            Some(Seg::Call(_)) => "fc",
            _ => "msg",
        };
        format!("{prefix}_{base}_{i}")
    }

    /// The output item of the segment at `i`, done or (a stream's first sight of it) in progress.
    pub(crate) fn item(&self, cx: &ResponseContext, i: usize, done: bool) -> Value {
        let status = if !done {
            "in_progress"
        } else if self.status() == "incomplete" && i + 1 == self.segs.len() {
            "incomplete"
        } else {
            "completed"
        };
        let id = self.item_id(i);
        match &self.segs[i] {
            Seg::Reasoning(text) => {
                let mut item =
                    json!({"id": id, "type": "reasoning", "summary": [], "status": status});
                if done {
                    item["content"] = json!([{"type": "reasoning_text", "text": text}]);
                    if cx.encrypted_reasoning {
                        item["encrypted_content"] = json!(thinking_signature(text));
                    }
                }
                item
            }
            Seg::Text(text) => {
                let content = if done {
                    json!([{"type": "output_text", "text": text, "annotations": [], "logprobs": []}])
                } else {
                    json!([])
                };
                json!({"id": id, "type": "message", "role": "assistant", "status": status, "content": content})
            }
            Seg::Call(c) => {
                let (call_id, name, args) = &self.calls[*c];
                let mut item = json!({
                    "id": id, "type": "function_call", "status": status,
                    "call_id": call_id, "name": name, "arguments": if done { args.as_str() } else { "" },
                });
                if let Some((ns, n)) = cx.namespaces.split(name) {
                    item["name"] = json!(n);
                    item["namespace"] = json!(ns);
                }
                item
            }
        }
    }

    /// The output items in order (an empty answer: one empty message).
    pub(crate) fn output(&self, cx: &ResponseContext) -> Vec<Value> {
        if self.segs.is_empty() {
            let mut empty = self.clone();
            empty.segs.push(Seg::Text(String::new()));
            return empty.output(cx);
        }
        (0..self.segs.len())
            .map(|i| self.item(cx, i, true))
            .collect()
    }

    /// `completed`, or `incomplete` when the answer hit the token limit.
    pub(crate) fn status(&self) -> &'static str {
        match self.finish_reason.as_deref() {
            Some("length") => "incomplete",
            _ => "completed",
        }
    }

    /// The response object (`in_progress`, with no output, for a stream's first events).
    pub(crate) fn response(&self, cx: &ResponseContext, finished: bool) -> Value {
        let mut r = json!({
            "id": self.response_id(), "object": "response", "created_at": self.created,
            "status": if finished { self.status() } else { "in_progress" },
            "error": null, "incomplete_details": null, "model": cx.model,
            "output": if finished { Value::Array(self.output(cx)) } else { json!([]) },
            "tools": [], "usage": null,
        });
        if let (Some(r), Some(echo)) = (r.as_object_mut(), cx.echo.as_object()) {
            for (k, v) in echo {
                r.insert(k.clone(), v.clone());
            }
        }
        if finished {
            if self.status() == "incomplete" {
                r["incomplete_details"] = json!({"reason": "max_output_tokens"});
            }
            r["usage"] = json!({
                "input_tokens": self.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": self.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.prompt_tokens + self.completion_tokens,
            });
        }
        r
    }

    /// The answer as the chat assistant message it was (its segments' texts concatenated, as the
    /// engine wrote them), for a stored response's conversation.
    pub(crate) fn chat_message(&self) -> Value {
        let (mut reasoning, mut text) = (String::new(), String::new());
        for s in &self.segs {
            match s {
                Seg::Reasoning(t) => reasoning.push_str(t),
                Seg::Text(t) => text.push_str(t),
                Seg::Call(_) => {}
            }
        }
        let mut m = json!({"role": "assistant",
            "content": if text.is_empty() && !self.calls.is_empty() { Value::Null } else { json!(text) }});
        if !reasoning.is_empty() {
            m["reasoning_content"] = json!(reasoning);
        }
        if !self.calls.is_empty() {
            m["tool_calls"] = self
                .calls
                .iter()
                .map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}))
                .collect();
        }
        m
    }
}

/// A whole chat answer as a Responses response: its JSON, and the answer as a chat assistant
/// message (what a stored response's conversation continues with).
pub fn response_from_chat(
    chat: &[u8],
    cx: &ResponseContext,
    keep: bool,
) -> Result<Whole, DoorError> {
    // Read with borrowed strings: no tree of the answer.
    let answer: crate::chunks::ChatAnswer<'_> = serde_json::from_slice(chat).map_err(|e| {
        DoorError::new(
            "upstream_invalid_response",
            format!("the engine's answer does not read as a chat completion: {e}"),
        )
    })?;
    let choice = answer.choices.into_iter().next().ok_or_else(|| {
        DoorError::new(
            "upstream_invalid_response",
            "the engine's answer has no choice",
        )
    })?;
    let finish = choice.finish_reason.map(std::borrow::Cow::into_owned);
    if finish.as_deref() == Some("abort") {
        return Err(DoorError::aborted());
    }
    let m = choice.message.ok_or_else(|| {
        DoorError::new(
            "upstream_invalid_response",
            "the engine's answer has no message",
        )
    })?;
    let reasoning = m
        .reasoning_content
        .filter(|r| !r.is_empty())
        .or(m.reasoning)
        .unwrap_or_default();
    let calls = m
        .tool_calls
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let f = c.function;
            (
                c.id.map_or_else(|| format!("call_{i}"), std::borrow::Cow::into_owned),
                f.as_ref()
                    .and_then(|f| f.name.as_deref())
                    .unwrap_or_default()
                    .to_owned(),
                f.as_ref()
                    .and_then(|f| f.arguments.as_deref())
                    .unwrap_or("{}")
                    .to_owned(),
            )
        })
        .collect();
    let mut built = Built::start(answer.id.as_deref(), answer.created);
    let text = m.content.unwrap_or_default();
    if !reasoning.is_empty() {
        built.segs.push(Seg::Reasoning(reasoning.into_owned()));
    }
    if !text.is_empty() {
        built.segs.push(Seg::Text(text.into_owned()));
    }
    built.calls = calls;
    built.segs.extend((0..built.calls.len()).map(Seg::Call));
    built.finish_reason = finish;
    let usage = answer.usage.unwrap_or_default();
    built.prompt_tokens = usage.prompt_tokens;
    built.completion_tokens = usage.completion_tokens;
    let body = serde_json::to_vec(&built.response(cx, true))
        .map_err(|e| DoorError::new("encode_failed", format!("writing the answer: {e}")))?;
    Ok(Whole {
        body,
        id: built.response_id(),
        message: if keep {
            built.chat_message()
        } else {
            Value::Null
        },
    })
}

/// A whole answer translated: the response's JSON, its id, and the answer as a chat assistant
/// message (what a stored response's conversation continues with).
#[derive(Debug, Clone)]
pub struct Whole {
    pub body: Vec<u8>,
    pub id: String,
    pub message: Value,
}

/// Whether a whole chat answer can be a response (an aborted one cannot), from its finish
/// reason, checked before the turn is captured.
pub fn check_answer(finish_reason: Option<&str>) -> Result<(), DoorError> {
    match finish_reason {
        Some("abort") => Err(DoorError::aborted()),
        _ => Ok(()),
    }
}

/// An OpenAI error body: `{"error": {"message", "type", "code"}}` (the Responses API's shape).
pub fn error_body(kind: &str, code: &str, message: &str) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"error": {"message": message, "type": kind, "code": code, "param": null}}),
    )
    .unwrap_or_default()
}
