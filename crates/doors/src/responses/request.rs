//! A Responses request as the chat-completions body of the same conversation.
//!
//! Items become messages: `message` items by role (`developer` as `system`, as the chat template
//! sees it), and each run of output items (`reasoning`, an assistant `message`, `function_call`s)
//! one assistant message, as the engine answered it; `function_call_output` a tool message.
//! `namespace` tools are flattened (`{namespace}__{name}`) and their calls mapped back by
//! [`Namespaces`]; tools the engine cannot run (hosted ones) are left out and reported.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::{DoorError, Dropped};

/// The tool types the Responses API runs itself (or that take free-form input): left out of the
/// engine's tools, counted. Matched as prefixes (`web_search_preview`, `computer_use_preview`).
const HOSTED_TOOLS: &[&str] = &[
    "web_search",
    "file_search",
    "code_interpreter",
    "computer_use",
    "image_generation",
    "mcp",
    "local_shell",
    "shell",
    "apply_patch",
    "custom",
];

/// The separator of a flattened namespace tool's name.
pub const NAMESPACE_SEPARATOR: &str = "__";

/// The namespace tools of a request: the flattened name the engine sees, and what it stands for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Namespaces(Vec<(String, String, String)>);

impl Namespaces {
    /// `(namespace, name)` of a flattened name the engine called; `None` for a plain function.
    pub fn split<'a>(&'a self, flat: &str) -> Option<(&'a str, &'a str)> {
        self.0
            .iter()
            .find(|(f, _, _)| f == flat)
            .map(|(_, ns, name)| (ns.as_str(), name.as_str()))
    }
}

/// The flattened name of a namespace's function.
pub fn flat_name(namespace: &str, name: &str) -> String {
    format!("{namespace}{NAMESPACE_SEPARATOR}{name}")
}

/// A Responses request translated.
#[derive(Debug, Clone)]
pub struct Translated {
    /// The chat-completions body (JSON).
    pub body: Vec<u8>,
    /// The chat messages of that body but the instructions (the conversation so far), kept by the
    /// server for a `store: true` response that a later `previous_response_id` continues.
    pub messages: Vec<Value>,
    pub model: String,
    pub stream: bool,
    pub dropped: Dropped,
    pub namespaces: Namespaces,
    /// `include` asks for `reasoning.encrypted_content`.
    pub encrypted_reasoning: bool,
    /// `store` (the API's default: true).
    pub store: bool,
    pub previous_response_id: Option<String>,
    /// The request's settings the response object repeats (`tool_choice`, `parallel_tool_calls`,
    /// `temperature`, `top_p`, `instructions`, `metadata`, `max_output_tokens`), as JSON.
    pub echo: Value,
}

#[derive(Deserialize)]
struct Request<'a> {
    #[serde(borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow)]
    instructions: Option<Cow<'a, str>>,
    #[serde(borrow)]
    input: Option<&'a RawValue>,
    #[serde(borrow)]
    tools: Option<Vec<Tool<'a>>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    #[serde(borrow)]
    max_output_tokens: Option<&'a RawValue>,
    #[serde(borrow)]
    temperature: Option<&'a RawValue>,
    #[serde(borrow)]
    top_p: Option<&'a RawValue>,
    stream: Option<bool>,
    store: Option<bool>,
    #[serde(borrow)]
    previous_response_id: Option<Cow<'a, str>>,
    #[serde(default)]
    include: Option<Vec<String>>,
    text: Option<TextConfig>,
    metadata: Option<Value>,
    #[serde(borrow)]
    session_id: Option<&'a RawValue>,
    #[serde(borrow)]
    turn_type: Option<&'a RawValue>,
    #[serde(borrow)]
    session_done: Option<&'a RawValue>,
    #[serde(borrow)]
    prompt_cache_key: Option<&'a RawValue>,
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
    parameters: Option<&'a RawValue>,
    strict: Option<bool>,
    /// A namespace's functions.
    #[serde(borrow)]
    tools: Option<Vec<Tool<'a>>>,
}

#[derive(Deserialize)]
struct TextConfig {
    format: Option<Value>,
}

/// An input item: every field any item type uses.
#[derive(Deserialize)]
struct Item<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    role: Option<Cow<'a, str>>,
    #[serde(borrow)]
    content: Option<&'a RawValue>,
    #[serde(borrow)]
    call_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    namespace: Option<Cow<'a, str>>,
    #[serde(borrow)]
    arguments: Option<Cow<'a, str>>,
    #[serde(borrow)]
    output: Option<&'a RawValue>,
    #[serde(borrow)]
    encrypted_content: Option<Cow<'a, str>>,
    #[serde(borrow)]
    summary: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Part<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow)]
    image_url: Option<Cow<'a, str>>,
    #[serde(borrow)]
    refusal: Option<Cow<'a, str>>,
}

#[derive(Serialize)]
struct ChatBody<'a> {
    model: &'a str,
    messages: &'a [Value],
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<Value>,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session_id: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    turn_type: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session_done: Option<&'a RawValue>,
    /// Carried as a chat client sends it (engines accept it): an agent's conversation key
    /// (`server.agent_session_keys`).
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_cache_key: Option<&'a RawValue>,
}

/// The assistant message being built from a run of output items.
#[derive(Default)]
struct Assistant {
    reasoning: Vec<String>,
    text: Vec<String>,
    calls: Vec<Value>,
    started: bool,
}

impl Assistant {
    fn flush(&mut self, out: &mut Vec<Value>) {
        if !std::mem::take(&mut self.started) {
            return;
        }
        let mut m = serde_json::Map::new();
        m.insert("role".into(), "assistant".into());
        let text = std::mem::take(&mut self.text);
        let calls = std::mem::take(&mut self.calls);
        m.insert(
            "content".into(),
            match text.len() {
                0 if !calls.is_empty() => Value::Null,
                // The segments of one answer: the engine's text is their concatenation.
                _ => Value::String(text.concat()),
            },
        );
        let reasoning = std::mem::take(&mut self.reasoning);
        if !reasoning.is_empty() {
            m.insert("reasoning_content".into(), reasoning.concat().into());
        }
        if !calls.is_empty() {
            m.insert("tool_calls".into(), calls.into());
        }
        out.push(Value::Object(m));
    }
}

/// The text parts of a message's content, or its parts as chat content parts (images too).
fn content(raw: &RawValue, at: &str, user_side: bool) -> Result<Value, DoorError> {
    let text = raw.get();
    if text.starts_with('"') {
        let s: String =
            serde_json::from_str(text).map_err(|e| DoorError::invalid(format!("{at}: {e}")))?;
        return Ok(Value::String(s));
    }
    let parts: Vec<Part<'_>> =
        serde_json::from_str(text).map_err(|e| DoorError::invalid(format!("{at}: {e}")))?;
    let mut out = Vec::with_capacity(parts.len());
    for (j, p) in parts.into_iter().enumerate() {
        let at = format!("{at}[{j}]");
        match p.kind.as_ref() {
            "input_text" | "output_text" | "text" | "summary_text" | "reasoning_text" => {
                let t = p
                    .text
                    .ok_or_else(|| DoorError::invalid(format!("{at}: `text` is required")))?;
                out.push(serde_json::json!({"type": "text", "text": t}));
            }
            "refusal" => {
                let t = p.refusal.or(p.text).unwrap_or_default();
                out.push(serde_json::json!({"type": "text", "text": t}));
            }
            "input_image" if user_side => {
                let url = p.image_url.ok_or_else(|| {
                    DoorError::unsupported(format!(
                        "{at}: an input_image needs `image_url` (a data URL or a URL); file ids are not supported"
                    ))
                })?;
                out.push(serde_json::json!({"type": "image_url", "image_url": {"url": url}}));
            }
            other => {
                return Err(DoorError::unsupported(format!(
                    "{at}: a {other:?} content part is not supported here (input_text, output_text, input_image)"
                )));
            }
        }
    }
    Ok(Value::Array(out))
}

/// The text of content parts (an assistant's).
fn joined_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The Responses request `body` as a chat-completions body; `prior`: the conversation a
/// `previous_response_id` continues (its chat messages, the answer included), put first.
pub fn to_chat(body: &[u8], prior: Option<&[Value]>) -> Result<Translated, DoorError> {
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
    let input = req
        .input
        .ok_or_else(|| DoorError::invalid("`input` is required (a string or a list of items)"))?;
    let mut dropped = Dropped::default();
    // The conversation without the instructions, which are this request's alone (a continued
    // response's instructions are not carried over, as the API says).
    let mut messages: Vec<Value> = prior.map(<[Value]>::to_vec).unwrap_or_default();
    if input.get().starts_with('"') {
        let s: String = serde_json::from_str(input.get())
            .map_err(|e| DoorError::invalid(format!("input: {e}")))?;
        messages.push(serde_json::json!({"role": "user", "content": s}));
    } else {
        let items: Vec<Item<'_>> = serde_json::from_str(input.get())
            .map_err(|e| DoorError::invalid(format!("input: {e}")))?;
        if items.is_empty() && prior.is_none() {
            return Err(DoorError::invalid("`input` holds no item"));
        }
        let mut assistant = Assistant::default();
        for (i, item) in items.into_iter().enumerate() {
            let at = format!("input[{i}]");
            let kind = item.kind.as_deref().unwrap_or("message");
            match kind {
                "message" => {
                    let role = item
                        .role
                        .as_deref()
                        .ok_or_else(|| DoorError::invalid(format!("{at}: `role` is required")))?;
                    let raw = item.content.ok_or_else(|| {
                        DoorError::invalid(format!("{at}: `content` is required"))
                    })?;
                    match role {
                        "assistant" => {
                            let c = content(raw, &format!("{at}.content"), false)?;
                            assistant.started = true;
                            assistant.text.push(joined_text(&c));
                        }
                        "user" | "system" | "developer" => {
                            assistant.flush(&mut messages);
                            let c = content(raw, &format!("{at}.content"), role == "user")?;
                            let role = if role == "user" { "user" } else { "system" };
                            messages.push(serde_json::json!({"role": role, "content": c}));
                        }
                        other => {
                            return Err(DoorError::invalid(format!(
                                "{at}.role: {other:?} is not user, assistant, system or developer"
                            )));
                        }
                    }
                }
                "reasoning" => {
                    assistant.started = true;
                    let restored = item
                        .encrypted_content
                        .as_deref()
                        .and_then(crate::messages::thinking_from_signature);
                    let from_content = item
                        .content
                        .filter(|c| c.get() != "null")
                        .map(|c| content(c, &format!("{at}.content"), false))
                        .transpose()?
                        .map(|c| joined_text(&c));
                    // The text itself when the client kept it, else the text this proxy sealed in
                    // `encrypted_content`; a summary is not the reasoning and is not rendered.
                    if let Some(t) = from_content.filter(|t| !t.is_empty()).or(restored) {
                        assistant.reasoning.push(t);
                    }
                    let _ = item.summary;
                }
                "function_call" => {
                    assistant.started = true;
                    let name = item
                        .name
                        .ok_or_else(|| DoorError::invalid(format!("{at}: `name` is required")))?;
                    let name = match item.namespace.as_deref() {
                        Some(ns) => flat_name(ns, &name),
                        None => name.into_owned(),
                    };
                    let call_id = item.call_id.ok_or_else(|| {
                        DoorError::invalid(format!("{at}: `call_id` is required"))
                    })?;
                    assistant.calls.push(serde_json::json!({
                        "id": call_id, "type": "function",
                        "function": {"name": name, "arguments": item.arguments.unwrap_or(Cow::Borrowed("{}"))}
                    }));
                }
                "function_call_output" => {
                    assistant.flush(&mut messages);
                    let call_id = item.call_id.ok_or_else(|| {
                        DoorError::invalid(format!("{at}: `call_id` is required"))
                    })?;
                    let output = match item.output {
                        None => Value::String(String::new()),
                        Some(o) => content(o, &format!("{at}.output"), true)?,
                    };
                    messages.push(
                        serde_json::json!({"role": "tool", "tool_call_id": call_id, "content": output}),
                    );
                }
                other => {
                    return Err(DoorError::unsupported(format!(
                        "{at}: a {other:?} item is not supported (message, reasoning, function_call, \
                         function_call_output)"
                    )));
                }
            }
        }
        assistant.flush(&mut messages);
    }
    if messages.last().is_some_and(|m| m["role"] == "assistant") {
        return Err(DoorError::unsupported(
            "the input ends with the assistant's output: this proxy does not continue a started \
             answer; end it with a user message or a function_call_output",
        ));
    }
    let (tools, namespaces) = tools(req.tools.as_deref().unwrap_or_default(), &mut dropped)?;
    let asked_choice = req.tool_choice.clone();
    let tool_choice = match req.tool_choice {
        None => None,
        Some(Value::String(s)) if matches!(s.as_str(), "auto" | "none" | "required") => {
            Some(Value::String(s))
        }
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| DoorError::invalid("tool_choice: a function choice needs `name`"))?;
            let name = match o.get("namespace").and_then(Value::as_str) {
                Some(ns) => flat_name(ns, name),
                None => name.to_owned(),
            };
            Some(serde_json::json!({"type": "function", "function": {"name": name}}))
        }
        Some(other) => {
            return Err(DoorError::unsupported(format!(
                "tool_choice {other} is not supported (auto, none, required, or a function)"
            )));
        }
    };
    let (tool_choice, parallel) = if tools.is_empty() {
        (None, None)
    } else {
        (tool_choice, req.parallel_tool_calls)
    };
    let response_format = match req.text.and_then(|t| t.format) {
        None => None,
        Some(f) => match f.get("type").and_then(Value::as_str) {
            Some("text") => None,
            Some("json_object") => Some(serde_json::json!({"type": "json_object"})),
            Some("json_schema") => {
                let mut schema = serde_json::Map::new();
                schema.insert(
                    "name".into(),
                    f.get("name").cloned().unwrap_or_else(|| "output".into()),
                );
                schema.insert(
                    "schema".into(),
                    f.get("schema").cloned().ok_or_else(|| {
                        DoorError::invalid("text.format: a json_schema format needs `schema`")
                    })?,
                );
                if let Some(s) = f.get("strict") {
                    schema.insert("strict".into(), s.clone());
                }
                Some(serde_json::json!({"type": "json_schema", "json_schema": schema}))
            }
            _ => {
                return Err(DoorError::unsupported(format!(
                    "text.format {f} is not supported (text, json_object, json_schema)"
                )));
            }
        },
    };
    let stream = req.stream.unwrap_or(false);
    let instructions = req.instructions.as_deref().filter(|i| !i.is_empty());
    // The instructions first, for the body only (put in and taken out again: no copy of the
    // conversation).
    if let Some(i) = instructions {
        messages.insert(0, serde_json::json!({"role": "system", "content": i}));
    }
    let chat = ChatBody {
        model,
        messages: &messages,
        tools,
        tool_choice,
        parallel_tool_calls: parallel,
        max_tokens: req.max_output_tokens,
        temperature: req.temperature,
        top_p: req.top_p,
        response_format,
        stream,
        stream_options: stream.then(|| serde_json::json!({"include_usage": true})),
        session_id: req.session_id,
        turn_type: req.turn_type,
        session_done: req.session_done,
        prompt_cache_key: req.prompt_cache_key,
    };
    let body = serde_json::to_vec(&chat)
        .map_err(|e| DoorError::new("encode_failed", format!("writing the chat body: {e}")))?;
    drop(chat);
    if instructions.is_some() {
        messages.remove(0);
    }
    let raw_num = |r: Option<&RawValue>| {
        r.and_then(|r| serde_json::from_str::<Value>(r.get()).ok())
            .unwrap_or(Value::Null)
    };
    let echo = serde_json::json!({
        "instructions": req.instructions,
        "metadata": req.metadata.unwrap_or_else(|| serde_json::json!({})),
        "tool_choice": asked_choice.unwrap_or_else(|| "auto".into()),
        "parallel_tool_calls": req.parallel_tool_calls.unwrap_or(true),
        "temperature": raw_num(req.temperature),
        "top_p": raw_num(req.top_p),
        "max_output_tokens": raw_num(req.max_output_tokens),
    });
    Ok(Translated {
        body,
        model: model.to_owned(),
        stream,
        dropped,
        namespaces,
        encrypted_reasoning: req
            .include
            .iter()
            .flatten()
            .any(|i| i == "reasoning.encrypted_content"),
        store: req.store.unwrap_or(true),
        previous_response_id: req.previous_response_id.map(Cow::into_owned),
        echo,
        messages,
    })
}

/// The engine's tools: functions as they are, a namespace's functions flattened, hosted tools left
/// out (reported in `dropped`).
fn tools(tools: &[Tool<'_>], dropped: &mut Dropped) -> Result<(Vec<Value>, Namespaces), DoorError> {
    let mut out = Vec::new();
    let mut namespaces = Namespaces::default();
    let function = |t: &Tool<'_>, name: String, at: &str| -> Result<Value, DoorError> {
        let mut f = serde_json::Map::new();
        f.insert("name".into(), name.into());
        if let Some(d) = &t.description {
            f.insert("description".into(), Value::String(d.to_string()));
        }
        let params = match t.parameters {
            Some(p) => serde_json::from_str(p.get())
                .map_err(|e| DoorError::invalid(format!("{at}: {e}")))?,
            None => serde_json::json!({"type": "object", "properties": {}}),
        };
        f.insert("parameters".into(), params);
        if let Some(s) = t.strict {
            f.insert("strict".into(), s.into());
        }
        Ok(serde_json::json!({"type": "function", "function": f}))
    };
    for (i, t) in tools.iter().enumerate() {
        let at = format!("tools[{i}]");
        match t.kind.as_deref() {
            Some("function") => {
                let name = t
                    .name
                    .as_deref()
                    .ok_or_else(|| DoorError::invalid(format!("{at}: `name` is required")))?;
                out.push(function(t, name.to_owned(), &at)?);
            }
            Some("namespace") => {
                let ns = t
                    .name
                    .as_deref()
                    .ok_or_else(|| DoorError::invalid(format!("{at}: a namespace needs `name`")))?;
                for (j, inner) in t.tools.iter().flatten().enumerate() {
                    let at = format!("{at}.tools[{j}]");
                    let name = inner
                        .name
                        .as_deref()
                        .ok_or_else(|| DoorError::invalid(format!("{at}: `name` is required")))?;
                    match inner.kind.as_deref() {
                        Some("function") | None => {}
                        Some(other) => {
                            dropped.hosted_tools.push(format!("{ns}.{name} ({other})"));
                            continue;
                        }
                    }
                    let flat = flat_name(ns, name);
                    namespaces
                        .0
                        .push((flat.clone(), ns.to_owned(), name.to_owned()));
                    out.push(function(inner, flat, &at)?);
                }
            }
            // Hosted tools (web search, file search, code interpreter, computer use, image
            // generation, MCP servers, local shell) and freeform custom tools: nothing the
            // engine can call as a function.
            Some(other) if HOSTED_TOOLS.iter().any(|h| other.starts_with(h)) => dropped
                .hosted_tools
                .push(t.name.as_deref().unwrap_or(other).to_owned()),
            Some(other) => {
                return Err(DoorError::unsupported(format!(
                    "{at}: a tool of type {other:?} is not supported (function, namespace; hosted \
                     tools such as web_search are left out)"
                )));
            }
            None => return Err(DoorError::invalid(format!("{at}: `type` is required"))),
        }
    }
    Ok((out, namespaces))
}
