//! A Messages request as the chat-completions body of the same conversation.
//!
//! Read with borrowed strings and raw values (a tool's `input_schema`, a `tool_use` block's
//! `input`), written once: a 100 kB agent request costs one pass in and one out, no tree.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::{DoorError, Dropped};

/// A Messages request translated.
#[derive(Debug, Clone)]
pub struct Translated {
    /// The chat-completions body (JSON).
    pub body: Vec<u8>,
    /// The client's model name, which the answer carries back.
    pub model: String,
    pub stream: bool,
    /// What was left out because the engine cannot honour it.
    pub dropped: Dropped,
    /// `thinking.display = "omitted"`: thinking blocks are answered without their text (the
    /// signature carries it, and restores it when the client sends the block back).
    pub thinking_omitted: bool,
}

#[derive(Deserialize)]
struct Request<'a> {
    #[serde(borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow)]
    system: Option<&'a RawValue>,
    #[serde(borrow)]
    messages: Option<Vec<Message<'a>>>,
    #[serde(borrow)]
    max_tokens: Option<&'a RawValue>,
    #[serde(borrow)]
    stop_sequences: Option<Vec<Cow<'a, str>>>,
    #[serde(borrow)]
    temperature: Option<&'a RawValue>,
    #[serde(borrow)]
    top_p: Option<&'a RawValue>,
    #[serde(borrow)]
    top_k: Option<&'a RawValue>,
    #[serde(borrow)]
    tools: Option<Vec<Tool<'a>>>,
    #[serde(borrow)]
    tool_choice: Option<ToolChoice<'a>>,
    #[serde(borrow)]
    thinking: Option<Thinking<'a>>,
    stream: Option<bool>,
    #[serde(borrow)]
    output_config: Option<OutputConfig<'a>>,
    // The proxy's own session body keys, passed on as they are.
    #[serde(borrow)]
    session_id: Option<&'a RawValue>,
    #[serde(borrow)]
    turn_type: Option<&'a RawValue>,
    #[serde(borrow)]
    session_done: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(borrow)]
    content: &'a RawValue,
}

/// A content block: every field any block type uses (a tagged enum would buffer the raw values).
#[derive(Deserialize)]
struct Block<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    text: Option<Cow<'a, str>>,
    /// An image's source, read when the block is an image.
    #[serde(borrow)]
    source: Option<&'a RawValue>,
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    input: Option<&'a RawValue>,
    #[serde(borrow)]
    tool_use_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    content: Option<&'a RawValue>,
    #[serde(borrow)]
    thinking: Option<Cow<'a, str>>,
    #[serde(borrow)]
    signature: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Source<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    media_type: Option<Cow<'a, str>>,
    #[serde(borrow)]
    data: Option<Cow<'a, str>>,
    #[serde(borrow)]
    url: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Tool<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    description: Option<Cow<'a, str>>,
    #[serde(borrow)]
    input_schema: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ToolChoice<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
    disable_parallel_tool_use: Option<bool>,
}

#[derive(Deserialize)]
struct Thinking<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    display: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct OutputConfig<'a> {
    #[serde(borrow)]
    format: Option<OutputFormat<'a>>,
}

#[derive(Deserialize)]
struct OutputFormat<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    schema: Option<&'a RawValue>,
}

// What is written: a chat-completions body.

#[derive(Serialize)]
struct ChatBody<'a> {
    model: &'a str,
    messages: Vec<ChatMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<ChatTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<ChatToolChoice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop: Option<&'a [Cow<'a, str>]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_k: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    chat_template_kwargs: Option<TemplateKwargs>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<ResponseFormat<'a>>,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session_id: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    turn_type: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session_done: Option<&'a RawValue>,
}

#[derive(Serialize)]
struct ChatMessage<'a> {
    role: &'static str,
    /// `null` for an assistant message of tool calls only, as OpenAI clients send it.
    content: Option<ChatContent<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<ChatToolCall<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<Cow<'a, str>>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum ChatContent<'a> {
    Text(Cow<'a, str>),
    Parts(Vec<ChatPart<'a>>),
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ChatPart<'a> {
    Text { text: Cow<'a, str> },
    ImageUrl { image_url: ImageUrl<'a> },
}

#[derive(Serialize)]
struct ImageUrl<'a> {
    url: Cow<'a, str>,
}

#[derive(Serialize)]
struct ChatToolCall<'a> {
    id: Cow<'a, str>,
    #[serde(rename = "type")]
    kind: &'static str,
    function: ChatFunctionCall<'a>,
}

#[derive(Serialize)]
struct ChatFunctionCall<'a> {
    name: Cow<'a, str>,
    /// The block's `input` written as the engines' tool-call parsers write arguments
    /// ([`python_json`]), whatever spacing the client re-serialised it with.
    arguments: String,
}

#[derive(Serialize)]
struct ChatTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: ChatFunction<'a>,
}

#[derive(Serialize)]
struct ChatFunction<'a> {
    name: Cow<'a, str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<Cow<'a, str>>,
    parameters: &'a RawValue,
}

#[derive(Serialize)]
#[serde(untagged)]
enum ChatToolChoice<'a> {
    Mode(&'static str),
    Named {
        #[serde(rename = "type")]
        kind: &'static str,
        function: NamedFunction<'a>,
    },
}

#[derive(Serialize)]
struct NamedFunction<'a> {
    name: Cow<'a, str>,
}

#[derive(Serialize)]
struct TemplateKwargs {
    enable_thinking: bool,
}

#[derive(Serialize)]
struct ResponseFormat<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    json_schema: JsonSchema<'a>,
}

#[derive(Serialize)]
struct JsonSchema<'a> {
    name: &'static str,
    schema: &'a RawValue,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

/// The Messages request `body` as a chat-completions body. Refused with a [`DoorError`] naming the
/// field when it is not a Messages request this proxy can serve exactly.
pub fn to_chat(body: &[u8]) -> Result<Translated, DoorError> {
    translate(body, true)
}

/// A `count_tokens` request (a Messages request without `max_tokens`) as the chat-completions body
/// whose prompt is counted.
pub fn count_request_to_chat(body: &[u8]) -> Result<Translated, DoorError> {
    translate(body, false)
}

/// `serving`: the request is to be answered (a count only renders its prompt): it needs
/// `max_tokens` and must not end with an assistant message.
fn translate(body: &[u8], serving: bool) -> Result<Translated, DoorError> {
    let text = std::str::from_utf8(body).map_err(|e| {
        DoorError::new(
            "invalid_json",
            format!("the request body is not UTF-8: {e}"),
        )
    })?;
    let req: Request<'_> = serde_json::from_str(text).map_err(|e| DoorError::json(&e))?;
    let model = req
        .model
        .as_deref()
        .filter(|m| !m.trim().is_empty())
        .ok_or_else(|| DoorError::invalid("`model` is required (a model name)"))?;
    let max_tokens = req.max_tokens;
    if serving && max_tokens.is_none() {
        return Err(DoorError::invalid(
            "`max_tokens` is required by the Messages API",
        ));
    }
    let Some(source) = req.messages.as_deref().filter(|m| !m.is_empty()) else {
        return Err(DoorError::invalid(
            "`messages` is required and holds at least one message",
        ));
    };
    let mut dropped = Dropped::default();
    let mut messages = Vec::with_capacity(source.len() + 1);
    if let Some(system) = req.system {
        messages.push(ChatMessage {
            role: "system",
            content: Some(system_content(system, "system")?),
            reasoning_content: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
        });
    }
    for (i, m) in source.iter().enumerate() {
        let at = format!("messages[{i}]");
        match m.role.as_ref() {
            "user" => user_messages(m.content, &at, &mut messages)?,
            "assistant" => messages.push(assistant_message(m.content, &at, &mut dropped)?),
            // Claude Code sends its environment as a system message inside `messages`.
            "system" => messages.push(ChatMessage {
                role: "system",
                content: Some(system_content(m.content, &at)?),
                reasoning_content: None,
                tool_calls: Vec::new(),
                tool_call_id: None,
            }),
            other => {
                return Err(DoorError::invalid(format!(
                    "{at}.role: {other:?} is not a Messages role (`user` or `assistant`; `system` is also accepted)"
                )));
            }
        }
    }
    if serving && source.last().is_some_and(|m| m.role == "assistant") {
        return Err(DoorError::unsupported(
            "the last message is an assistant message (a prefill): this proxy does not continue a \
             started answer; end `messages` with a user message",
        ));
    }
    let mut tools = Vec::new();
    for (i, t) in req.tools.iter().flatten().enumerate() {
        let name = t
            .name
            .clone()
            .ok_or_else(|| DoorError::invalid(format!("tools[{i}].name is required")))?;
        match t.kind.as_deref() {
            None | Some("custom") => {}
            // A tool Anthropic's servers or clients define (web search, code execution, the
            // computer, the text editor, …): the engine cannot run it, and has no schema for it.
            Some(_) => {
                dropped.hosted_tools.push(name.into_owned());
                continue;
            }
        }
        let parameters = t.input_schema.ok_or_else(|| {
            DoorError::invalid(format!("tools[{i}] ({name}): `input_schema` is required"))
        })?;
        tools.push(ChatTool {
            kind: "function",
            function: ChatFunction {
                name,
                description: t.description.clone(),
                parameters,
            },
        });
    }
    let (tool_choice, parallel_tool_calls) = match &req.tool_choice {
        None => (None, None),
        Some(c) => {
            let mode = match c.kind.as_ref() {
                "auto" => ChatToolChoice::Mode("auto"),
                "any" => ChatToolChoice::Mode("required"),
                "none" => ChatToolChoice::Mode("none"),
                "tool" => ChatToolChoice::Named {
                    kind: "function",
                    function: NamedFunction {
                        name: c.name.clone().ok_or_else(|| {
                            DoorError::invalid(
                                "tool_choice: `name` is required when its type is `tool`",
                            )
                        })?,
                    },
                },
                other => {
                    return Err(DoorError::invalid(format!(
                        "tool_choice.type {other:?} is not one of auto, any, tool, none"
                    )));
                }
            };
            let parallel = c.disable_parallel_tool_use.filter(|d| *d).map(|_| false);
            (Some(mode), parallel)
        }
    };
    // Without tools for the engine (none sent, or only hosted ones), no choice among them.
    let (tool_choice, parallel_tool_calls) = if tools.is_empty() {
        (None, None)
    } else {
        (tool_choice, parallel_tool_calls)
    };
    let chat_template_kwargs = match req.thinking.as_ref().map(|t| t.kind.as_ref()) {
        Some("disabled") => Some(TemplateKwargs {
            enable_thinking: false,
        }),
        Some("enabled" | "adaptive") | None => None,
        Some(other) => {
            return Err(DoorError::invalid(format!(
                "thinking.type {other:?} is not one of enabled, adaptive, disabled"
            )));
        }
    };
    let response_format = match req.output_config.as_ref().and_then(|c| c.format.as_ref()) {
        None => None,
        Some(f) if f.kind == "json_schema" => Some(ResponseFormat {
            kind: "json_schema",
            json_schema: JsonSchema {
                name: "output",
                schema: f.schema.ok_or_else(|| {
                    DoorError::invalid(
                        "output_config.format: `schema` is required for a json_schema format",
                    )
                })?,
            },
        }),
        Some(f) => {
            return Err(DoorError::invalid(format!(
                "output_config.format.type {:?} is not supported (json_schema is)",
                f.kind
            )));
        }
    };
    let stream = req.stream.unwrap_or(false);
    let chat = ChatBody {
        model,
        messages,
        tools,
        tool_choice,
        parallel_tool_calls,
        max_tokens,
        stop: req.stop_sequences.as_deref().filter(|s| !s.is_empty()),
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        chat_template_kwargs,
        response_format,
        stream,
        stream_options: stream.then_some(StreamOptions {
            include_usage: true,
        }),
        session_id: req.session_id,
        turn_type: req.turn_type,
        session_done: req.session_done,
    };
    let body = serde_json::to_vec(&chat)
        .map_err(|e| DoorError::new("encode_failed", format!("writing the chat body: {e}")))?;
    Ok(Translated {
        body,
        model: model.to_owned(),
        stream,
        dropped,
        thinking_omitted: req
            .thinking
            .as_ref()
            .is_some_and(|t| t.display.as_deref() == Some("omitted")),
    })
}

enum Content<'a> {
    Text(Cow<'a, str>),
    Blocks(Vec<Block<'a>>),
}

fn blocks_or_text<'a>(raw: &'a RawValue, at: &str) -> Result<Content<'a>, DoorError> {
    let text = raw.get();
    let parsed = match text.as_bytes().first() {
        Some(b'"') => serde_json::from_str(text).map(Content::Text),
        Some(b'[') => serde_json::from_str(text).map(Content::Blocks),
        _ => {
            return Err(DoorError::invalid(format!(
                "{at}.content must be a string or a list of content blocks"
            )));
        }
    };
    parsed.map_err(|e| DoorError::invalid(format!("{at}.content: {e}")))
}

/// A system prompt: a string, or text blocks (`cache_control` and citations ignored).
fn system_content<'a>(raw: &'a RawValue, at: &str) -> Result<ChatContent<'a>, DoorError> {
    Ok(match blocks_or_text(raw, at)? {
        Content::Text(t) => ChatContent::Text(t),
        Content::Blocks(blocks) => ChatContent::Parts(
            blocks
                .into_iter()
                .enumerate()
                .map(|(j, b)| match (b.kind.as_ref(), b.text) {
                    ("text", Some(text)) => Ok(ChatPart::Text { text }),
                    ("text", None) => Err(DoorError::invalid(format!(
                        "{at}.content[{j}]: `text` is required"
                    ))),
                    (other, _) => Err(DoorError::unsupported(format!(
                        "{at}.content[{j}]: a system prompt holds text blocks only, not {other:?}"
                    ))),
                })
                .collect::<Result<_, _>>()?,
        ),
    })
}

/// An image block as an `image_url` part: a base64 source as a data URL, a URL as it is.
fn image_part<'a>(b: Block<'a>, at: &str) -> Result<ChatPart<'a>, DoorError> {
    let source = b
        .source
        .ok_or_else(|| DoorError::invalid(format!("{at}: an image block needs a `source`")))?;
    let source: Source<'a> = serde_json::from_str(source.get())
        .map_err(|e| DoorError::invalid(format!("{at}.source: {e}")))?;
    let url = match source.kind.as_ref() {
        "base64" => {
            let (Some(media), Some(data)) = (source.media_type, source.data) else {
                return Err(DoorError::invalid(format!(
                    "{at}.source: a base64 image needs `media_type` and `data`"
                )));
            };
            Cow::Owned(format!("data:{media};base64,{data}"))
        }
        "url" => source
            .url
            .ok_or_else(|| DoorError::invalid(format!("{at}.source: a url image needs `url`")))?,
        other => {
            return Err(DoorError::unsupported(format!(
                "{at}.source.type {other:?} is not supported (base64 and url are)"
            )));
        }
    };
    Ok(ChatPart::ImageUrl {
        image_url: ImageUrl { url },
    })
}

/// A content part of a user message or a tool result: text or an image (`allowed` names the
/// block types of the place, for the error).
fn user_part<'a>(b: Block<'a>, at: &str, allowed: &str) -> Result<ChatPart<'a>, DoorError> {
    match b.kind.as_ref() {
        "text" => Ok(ChatPart::Text {
            text: b
                .text
                .ok_or_else(|| DoorError::invalid(format!("{at}: `text` is required")))?,
        }),
        "image" => image_part(b, at),
        other => Err(DoorError::unsupported(format!(
            "{at}: a {other:?} block is not supported here ({allowed})"
        ))),
    }
}

/// A user message: its `tool_result` blocks as tool messages (first, as chat completions wants
/// them right after the assistant's calls), the rest as one user message.
fn user_messages<'a>(
    raw: &'a RawValue,
    at: &str,
    out: &mut Vec<ChatMessage<'a>>,
) -> Result<(), DoorError> {
    let blocks = match blocks_or_text(raw, at)? {
        Content::Text(text) => {
            out.push(ChatMessage {
                role: "user",
                content: Some(ChatContent::Text(text)),
                reasoning_content: None,
                tool_calls: Vec::new(),
                tool_call_id: None,
            });
            return Ok(());
        }
        Content::Blocks(blocks) => blocks,
    };
    let mut parts = Vec::new();
    let had_blocks = !blocks.is_empty();
    for (j, b) in blocks.into_iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        if b.kind == "tool_result" {
            let id = b
                .tool_use_id
                .ok_or_else(|| DoorError::invalid(format!("{at}: `tool_use_id` is required")))?;
            let content = match b.content {
                None => ChatContent::Text(Cow::Borrowed("")),
                Some(c) => match blocks_or_text(c, &at)? {
                    Content::Text(t) => ChatContent::Text(t),
                    Content::Blocks(inner) => ChatContent::Parts(
                        inner
                            .into_iter()
                            .enumerate()
                            .map(|(k, b)| {
                                user_part(b, &format!("{at}.content[{k}]"), "text, image")
                            })
                            .collect::<Result<_, _>>()?,
                    ),
                },
            };
            out.push(ChatMessage {
                role: "tool",
                content: Some(content),
                reasoning_content: None,
                tool_calls: Vec::new(),
                tool_call_id: Some(id),
            });
        } else {
            parts.push(user_part(b, &at, "text, image, tool_result")?);
        }
    }
    if !parts.is_empty() || !had_blocks {
        out.push(ChatMessage {
            role: "user",
            content: Some(ChatContent::Parts(parts)),
            reasoning_content: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
        });
    }
    Ok(())
}

/// An assistant message: its text blocks as `content` (concatenated: they are one answer's text,
/// split where a stream interleaved other blocks), `thinking` as `reasoning_content`, `tool_use`
/// as tool calls.
fn assistant_message<'a>(
    raw: &'a RawValue,
    at: &str,
    dropped: &mut Dropped,
) -> Result<ChatMessage<'a>, DoorError> {
    let blocks = match blocks_or_text(raw, at)? {
        Content::Text(text) => {
            return Ok(ChatMessage {
                role: "assistant",
                content: Some(ChatContent::Text(text)),
                reasoning_content: None,
                tool_calls: Vec::new(),
                tool_call_id: None,
            });
        }
        Content::Blocks(blocks) => blocks,
    };
    let (mut texts, mut thinking, mut calls) = (Vec::new(), Vec::new(), Vec::new());
    for (j, b) in blocks.into_iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        match b.kind.as_ref() {
            "text" => texts.push(
                b.text
                    .ok_or_else(|| DoorError::invalid(format!("{at}: `text` is required")))?,
            ),
            "thinking" => {
                let text = b.thinking.unwrap_or_default();
                // A block whose text the client left out (`display: "omitted"`) is restored from
                // the signature this proxy wrote on it.
                let text = match (text.is_empty(), b.signature.as_deref()) {
                    (true, Some(sig)) => match super::answer::thinking_from_signature(sig) {
                        Some(t) => Cow::Owned(t),
                        None => text,
                    },
                    _ => text,
                };
                thinking.push(text);
            }
            "redacted_thinking" => dropped.redacted_thinking += 1,
            "tool_use" => {
                let id =
                    b.id.ok_or_else(|| DoorError::invalid(format!("{at}: `id` is required")))?;
                let name = b
                    .name
                    .ok_or_else(|| DoorError::invalid(format!("{at}: `name` is required")))?;
                let input = b
                    .input
                    .ok_or_else(|| DoorError::invalid(format!("{at}: `input` is required")))?;
                calls.push(ChatToolCall {
                    id,
                    kind: "function",
                    function: ChatFunctionCall {
                        name,
                        arguments: python_json(input)
                            .map_err(|e| DoorError::invalid(format!("{at}.input: {e}")))?,
                    },
                });
            }
            other => {
                return Err(DoorError::unsupported(format!(
                    "{at}: a {other:?} block is not supported in an assistant message (text, \
                     thinking, redacted_thinking, tool_use)"
                )));
            }
        }
    }
    let content = match texts.len() {
        0 if !calls.is_empty() => None,
        0 => Some(ChatContent::Text(Cow::Borrowed(""))),
        1 => texts.pop().map(ChatContent::Text),
        // The blocks of one answer (a stream's text after a tool call is a block of its own): the
        // engine's text is their concatenation.
        _ => Some(ChatContent::Text(Cow::Owned(texts.concat()))),
    };
    let reasoning_content = match thinking.len() {
        0 => None,
        1 => thinking.pop(),
        _ => Some(Cow::Owned(thinking.concat())),
    };
    Ok(ChatMessage {
        role: "assistant",
        content,
        reasoning_content,
        tool_calls: calls,
        tool_call_id: None,
    })
}

/// A JSON value written as Python's `json.dumps` writes it (`", "` and `": "` between items, key
/// order kept, non-ASCII as it is): the text SGLang's and vLLM's tool-call parsers give a call's
/// arguments. A chat client sends that text back as it got it; an Anthropic client sends the
/// parsed `input` back, re-serialised its own way (often without spaces). Written back in the
/// engines' form, the arguments are the text the engine produced, so that an engine (or a
/// template) that renders the string as it is sees the prompt it sampled.
pub(crate) fn python_json(raw: &RawValue) -> Result<String, serde_json::Error> {
    let value: serde_json::Value = serde_json::from_str(raw.get())?;
    let mut out = Vec::with_capacity(raw.get().len() + 16);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonFormatter);
    value.serialize(&mut ser)?;
    // Serialised from a `Value`, the bytes are UTF-8.
    Ok(String::from_utf8(out).unwrap_or_default())
}

/// `json.dumps`'s default separators.
struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        // The same separator between an object's entries as between an array's values.
        self.begin_array_value(writer, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}
