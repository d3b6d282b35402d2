//! A whole chat answer as a Messages answer, and the pieces the streamed translation shares with
//! it: the stop reason, the thinking block's signature, the error body.

use std::borrow::Cow;

use base64::Engine as _;
use serde::Serialize;
use serde_json::value::RawValue;

use crate::DoorError;
use crate::chunks::{ChatAnswer, Usage};

#[derive(Serialize)]
struct Message<'a> {
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: &'a str,
    content: Vec<OutBlock<'a>>,
    stop_reason: &'static str,
    stop_sequence: Option<String>,
    usage: OutUsage,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum OutBlock<'a> {
    Thinking {
        thinking: Cow<'a, str>,
        signature: String,
    },
    Text {
        text: Cow<'a, str>,
    },
    ToolUse {
        id: Cow<'a, str>,
        name: Cow<'a, str>,
        input: &'a RawValue,
    },
}

#[derive(Serialize, Clone, Copy)]
pub(crate) struct OutUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_creation_input_tokens: u64,
    pub cache_read_input_tokens: u64,
}

impl From<Usage> for OutUsage {
    fn from(u: Usage) -> Self {
        Self {
            input_tokens: u.prompt_tokens,
            output_tokens: u.completion_tokens,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: 0,
        }
    }
}

/// The prefix of a signature this proxy wrote; the rest is the thinking text in base64.
const SIGNATURE_PREFIX: &str = "ps1:";

/// The signature written on a thinking block this proxy produced: its text, encoded. A client that
/// asked for the text to be omitted (`thinking.display = "omitted"`) gets it back this way, and a
/// block sent back with empty text is restored from it, so the engine sees the same prompt.
pub fn thinking_signature(thinking: &str) -> String {
    let mut s = String::from(SIGNATURE_PREFIX);
    base64::engine::general_purpose::STANDARD.encode_string(thinking, &mut s);
    s
}

/// The thinking text a signature of [`thinking_signature`] carries; `None` for another's (the
/// Responses door seals a reasoning item's `encrypted_content` the same way).
pub fn thinking_from_signature(signature: &str) -> Option<String> {
    let b64 = signature.strip_prefix(SIGNATURE_PREFIX)?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    String::from_utf8(bytes).ok()
}

/// The Messages `stop_reason` (and `stop_sequence`) of a chat answer's finish: `tool_use` when it
/// called tools, `max_tokens` at the length limit, `refusal` for a content filter, `stop_sequence` when a stop string the client
/// gave ended it (SGLang's `matched_stop`, vLLM's `stop_reason`), `end_turn` otherwise.
pub fn stop_reason(
    finish_reason: Option<&str>,
    called_tools: bool,
    matched: Option<&RawValue>,
) -> (&'static str, Option<String>) {
    let matched_text = matched
        .filter(|m| m.get().starts_with('"'))
        .and_then(|m| serde_json::from_str::<String>(m.get()).ok());
    match finish_reason {
        Some("length") => ("max_tokens", None),
        Some("tool_calls") => ("tool_use", None),
        // The engine's safety filter (vLLM, providers): Anthropic's own word for it.
        Some("content_filter") => ("refusal", None),
        _ if called_tools => ("tool_use", None),
        _ => match matched_text {
            Some(s) => ("stop_sequence", Some(s)),
            None => ("end_turn", None),
        },
    }
}

/// An Anthropic error body: `{"type": "error", "error": {"type", "message"}}`.
pub fn error_body(kind: &str, message: &str) -> Vec<u8> {
    #[derive(Serialize)]
    struct Inner<'a> {
        #[serde(rename = "type")]
        kind: &'a str,
        message: &'a str,
    }
    #[derive(Serialize)]
    struct Outer<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        error: Inner<'a>,
    }
    serde_json::to_vec(&Outer {
        kind: "error",
        error: Inner { kind, message },
    })
    .unwrap_or_default()
}

/// The Messages id of a chat answer's id.
pub(crate) fn message_id(chat_id: Option<&str>) -> String {
    match chat_id {
        Some(id) if id.starts_with("msg_") => id.to_owned(),
        Some(id) if !id.is_empty() => format!("msg_{id}"),
        _ => "msg_policy_serving".to_owned(),
    }
}

/// A tool call's arguments as a `tool_use` block's `input`: the engine's text when it is a JSON
/// object, else `None` (the caller decides).
pub(crate) fn tool_input(arguments: &str) -> Option<Box<RawValue>> {
    let raw: Box<RawValue> = serde_json::from_str(arguments.trim()).ok()?;
    raw.get().starts_with('{').then_some(raw)
}

/// Whether a whole chat answer can be a Messages answer, checked before the turn is captured or
/// answered (so that an answer the client never gets is not trained on): `message` is its
/// `choices[0].message`, `finish_reason` its finish. The same refusals as [`message_from_chat`]:
/// an aborted answer, a tool call whose arguments are not a JSON object.
pub fn check_answer(
    message: Option<&serde_json::Value>,
    finish_reason: Option<&str>,
) -> Result<(), DoorError> {
    if finish_reason == Some("abort") {
        return Err(DoorError::aborted());
    }
    let calls = message
        .and_then(|m| m.get("tool_calls"))
        .and_then(serde_json::Value::as_array);
    for call in calls.into_iter().flatten() {
        let f = &call["function"];
        let args = f["arguments"].as_str().unwrap_or("{}");
        if tool_input(args).is_none() {
            return Err(DoorError::new(
                "tool_arguments_not_an_object",
                format!(
                    "the engine called {:?} with arguments that are not a JSON object, which a \
                     tool_use block cannot carry: {args:?}",
                    f["name"].as_str().unwrap_or_default()
                ),
            ));
        }
    }
    Ok(())
}

/// A whole chat answer (`chat`: its JSON) as a Messages answer (JSON) for `model`. The first choice
/// is the answer (the Messages API has one). A tool call whose arguments are not a JSON object is
/// refused: the Messages API cannot carry it, and an invented input would be a silent change.
pub fn message_from_chat(
    chat: &[u8],
    model: &str,
    thinking_omitted: bool,
) -> Result<Vec<u8>, DoorError> {
    let answer: ChatAnswer<'_> = serde_json::from_slice(chat).map_err(|e| {
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
    if choice.finish_reason.as_deref() == Some("abort") {
        return Err(DoorError::aborted());
    }
    let message = choice.message.ok_or_else(|| {
        DoorError::new(
            "upstream_invalid_response",
            "the engine's answer has no message",
        )
    })?;
    let mut content = Vec::new();
    if let Some(thinking) = message
        .reasoning_content
        .or(message.reasoning)
        .filter(|t| !t.is_empty())
    {
        let signature = thinking_signature(&thinking);
        let thinking = if thinking_omitted {
            Cow::Borrowed("")
        } else {
            thinking
        };
        content.push(OutBlock::Thinking {
            thinking,
            signature,
        });
    }
    if let Some(text) = message.content.filter(|t| !t.is_empty()) {
        content.push(OutBlock::Text { text });
    }
    let mut inputs = Vec::with_capacity(message.tool_calls.len());
    let mut calls = Vec::with_capacity(message.tool_calls.len());
    for (i, call) in message.tool_calls.into_iter().enumerate() {
        let f = call.function.ok_or_else(|| {
            DoorError::new(
                "upstream_invalid_response",
                format!("the engine's tool call {i} has no function"),
            )
        })?;
        let name = f.name.unwrap_or_default();
        let arguments = f.arguments.unwrap_or(Cow::Borrowed("{}"));
        let input = tool_input(&arguments).ok_or_else(|| {
            DoorError::new(
                "tool_arguments_not_an_object",
                format!(
                    "the engine called {name:?} with arguments that are not a JSON object, which \
                     a tool_use block cannot carry: {arguments:?}"
                ),
            )
        })?;
        inputs.push(input);
        calls.push((call.id.unwrap_or(Cow::Owned(format!("toolu_{i}"))), name));
    }
    for ((id, name), input) in calls.into_iter().zip(&inputs) {
        content.push(OutBlock::ToolUse {
            id,
            name,
            input: input.as_ref(),
        });
    }
    let (stop_reason, stop_sequence) = stop_reason(
        choice.finish_reason.as_deref(),
        !inputs.is_empty(),
        choice.matched_stop.or(choice.stop_reason),
    );
    let out = Message {
        id: message_id(answer.id.as_deref()),
        kind: "message",
        role: "assistant",
        model,
        content,
        stop_reason,
        stop_sequence,
        usage: answer.usage.unwrap_or_default().into(),
    };
    serde_json::to_vec(&out)
        .map_err(|e| DoorError::new("encode_failed", format!("writing the answer: {e}")))
}
