//! A chat answer as a Responses `response` object: its output items (`reasoning`, an assistant
//! `message`, `function_call`s), status, usage and the request's settings. Shared by the whole
//! answer and the end of a stream ([`Built`]).

use serde_json::{Value, json};

use super::request::Namespaces;
use crate::DoorError;
use crate::messages::thinking_signature;

/// Why an answer the engine aborted is not a response.
pub(crate) const ABORTED: &str = "the engine aborted the answer (finish_reason \"abort\": a pause or \
     a weight update); retry the request";

/// What the answer's items are made of, whichever way the answer came.
#[derive(Debug, Clone, Default)]
pub(crate) struct Built {
    pub id: String,
    pub created: u64,
    pub reasoning: String,
    pub text: String,
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

impl Built {
    pub(crate) fn response_id(&self) -> String {
        if self.id.starts_with("resp_") {
            self.id.clone()
        } else {
            format!("resp_{}", self.id)
        }
    }

    pub(crate) fn item_id(&self, prefix: &str, i: usize) -> String {
        let base = self.id.trim_start_matches("chatcmpl-");
        format!("{prefix}_{base}_{i}")
    }

    pub(crate) fn reasoning_item(&self, cx: &ResponseContext, done: bool) -> Value {
        let mut item = json!({
            "id": self.item_id("rs", 0), "type": "reasoning", "summary": [],
        });
        if done {
            item["content"] = json!([{"type": "reasoning_text", "text": self.reasoning}]);
            item["status"] = json!("completed");
            if cx.encrypted_reasoning {
                item["encrypted_content"] = json!(thinking_signature(&self.reasoning));
            }
        } else {
            item["status"] = json!("in_progress");
        }
        item
    }

    pub(crate) fn message_item(&self, done: bool) -> Value {
        let content = if done {
            json!([{"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}])
        } else {
            json!([])
        };
        json!({
            "id": self.item_id("msg", 0), "type": "message", "role": "assistant",
            "status": if done { "completed" } else { "in_progress" }, "content": content,
        })
    }

    pub(crate) fn call_item(&self, cx: &ResponseContext, i: usize, done: bool) -> Value {
        let (call_id, name, args) = &self.calls[i];
        let mut item = json!({
            "id": self.item_id("fc", i), "type": "function_call",
            "status": if done { "completed" } else { "in_progress" },
            "call_id": call_id, "name": name, "arguments": if done { args.as_str() } else { "" },
        });
        if let Some((ns, n)) = cx.namespaces.split(name) {
            item["name"] = json!(n);
            item["namespace"] = json!(ns);
        }
        item
    }

    /// The output items in order.
    pub(crate) fn output(&self, cx: &ResponseContext) -> Vec<Value> {
        let mut out = Vec::new();
        if !self.reasoning.is_empty() {
            out.push(self.reasoning_item(cx, true));
        }
        if !self.text.is_empty() || (self.calls.is_empty() && self.reasoning.is_empty()) {
            out.push(self.message_item(true));
        }
        for i in 0..self.calls.len() {
            out.push(self.call_item(cx, i, true));
        }
        out
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

    /// The answer as the chat assistant message it was, for a stored response's conversation.
    pub(crate) fn chat_message(&self) -> Value {
        let mut m = json!({"role": "assistant",
            "content": if self.text.is_empty() && !self.calls.is_empty() { Value::Null } else { json!(self.text) }});
        if !self.reasoning.is_empty() {
            m["reasoning_content"] = json!(self.reasoning);
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
) -> Result<(Vec<u8>, Value), DoorError> {
    let v: Value = serde_json::from_slice(chat).map_err(|e| {
        DoorError::new(
            "upstream_invalid_response",
            format!("the engine's answer does not read as a chat completion: {e}"),
        )
    })?;
    let choice = v["choices"].get(0).ok_or_else(|| {
        DoorError::new(
            "upstream_invalid_response",
            "the engine's answer has no choice",
        )
    })?;
    let finish = choice["finish_reason"].as_str().map(str::to_owned);
    if finish.as_deref() == Some("abort") {
        return Err(DoorError::new("engine_aborted", ABORTED));
    }
    let m = &choice["message"];
    let text_of = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let reasoning = match text_of(&m["reasoning_content"]) {
        r if r.is_empty() => text_of(&m["reasoning"]),
        r => r,
    };
    let calls = m["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| {
            (
                c["id"]
                    .as_str()
                    .map_or_else(|| format!("call_{i}"), str::to_owned),
                text_of(&c["function"]["name"]),
                c["function"]["arguments"]
                    .as_str()
                    .unwrap_or("{}")
                    .to_owned(),
            )
        })
        .collect();
    let built = Built {
        id: v["id"].as_str().unwrap_or("policy_serving").to_owned(),
        created: v["created"].as_u64().unwrap_or(0),
        reasoning,
        text: text_of(&m["content"]),
        calls,
        finish_reason: finish,
        prompt_tokens: v["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
        completion_tokens: v["usage"]["completion_tokens"].as_u64().unwrap_or(0),
    };
    let body = serde_json::to_vec(&built.response(cx, true))
        .map_err(|e| DoorError::new("encode_failed", format!("writing the answer: {e}")))?;
    Ok((body, built.chat_message()))
}

/// Whether a whole chat answer can be a response (an aborted one cannot), checked before the turn
/// is captured.
pub fn check_answer(chat: &[u8]) -> Result<(), DoorError> {
    // Read without a tree: an answer's log-probs are an object per token.
    #[derive(serde::Deserialize)]
    struct Answer<'a> {
        #[serde(borrow, default, deserialize_with = "crate::null_as_default")]
        choices: Vec<Choice<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct Choice<'a> {
        #[serde(borrow)]
        finish_reason: Option<std::borrow::Cow<'a, str>>,
    }
    let a: Answer<'_> = serde_json::from_slice(chat).map_err(|e| {
        DoorError::new(
            "upstream_invalid_response",
            format!("the engine's answer does not read as a chat completion: {e}"),
        )
    })?;
    match a.choices.first().and_then(|c| c.finish_reason.as_deref()) {
        Some("abort") => Err(DoorError::new("engine_aborted", ABORTED)),
        _ => Ok(()),
    }
}

/// The response id a whole chat answer gets.
pub fn response_id_of(chat: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(chat).ok()?;
    let b = Built {
        id: v["id"].as_str()?.to_owned(),
        ..Built::default()
    };
    Some(b.response_id())
}

/// An OpenAI error body: `{"error": {"message", "type", "code"}}` (the Responses API's shape).
pub fn error_body(kind: &str, code: &str, message: &str) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"error": {"message": message, "type": kind, "code": code, "param": null}}),
    )
    .unwrap_or_default()
}
