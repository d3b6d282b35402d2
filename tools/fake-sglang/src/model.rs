//! The fake "model": what it samples for a chat request or a `/generate` prompt, as text and as tokens of
//! the configured tokenizer. Pure functions of the request (plus the per-text vote counter of
//! `/generate`), and blocking (tokenization), so callers run them off the async executor.
//!
//! Over ~600 lines: the sampling rules for chat, judge and teacher prompts are one table of behaviours
//! that tests script against; splitting them would scatter one contract over several files.

use ps_chat_template::{ChatTemplateError, ChatTokenizer};
use serde_json::{Map, Value, json};

use crate::det::{alternatives, hash_str, hex_id, mix, policy_logprob};
use crate::encoder::PromptEncoder;

/// What a sampled token belongs to, as the simulated reasoning and tool-call parsers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    /// `<think>` / `</think>`: swallowed by the reasoning parser.
    ThinkMarker,
    /// Whitespace around the think block: stripped by the parsers.
    Pad,
    Reasoning,
    Content,
    /// `<tool_call>`, newlines, the closing `}` and `</tool_call>`: swallowed by the tool parser.
    ToolMarkup,
    /// `{"name": "NAME", "arguments": ` — its last token releases the first tool-call fragment.
    ToolHead,
    ToolArgs,
    Eos,
}

#[derive(Debug, Clone)]
pub(crate) struct SampledToken {
    pub id: u32,
    pub part: Part,
    /// `token_text(id)`: the token decoded on its own.
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ToolCall {
    pub id: String,
    pub name: String,
    /// JSON-encoded arguments (Python `json.dumps` spacing, as SGLang's parser re-serialises them).
    pub arguments: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    Stop,
    ToolCalls,
    Length,
}

impl Finish {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::ToolCalls => "tool_calls",
            Finish::Length => "length",
        }
    }
}

/// The parsed fields of a chat request that the fake uses.
#[derive(Debug, Clone)]
pub(crate) struct ChatParams {
    pub model: String,
    pub messages: Vec<Value>,
    pub tools: Option<Value>,
    pub tool_choice: Value,
    pub logprobs: bool,
    pub top_logprobs: usize,
    pub stream: bool,
    pub include_usage: bool,
    pub max_tokens: Option<usize>,
    pub template_kwargs: Option<Map<String, Value>>,
    pub return_token_ids: bool,
    pub return_prompt_token_ids: bool,
    pub return_meta_info: bool,
    /// SGLang's ask for routed experts.
    pub return_routed_experts: bool,
    /// vLLM's `structured_outputs.regex` spells a whole `<tool_call>`: the grammar forces a call
    /// (the real engine's tests force one so), answered as `tool_choice: "required"` is.
    pub forced_tool_call: bool,
}

/// Validates a chat request the way SGLang does (the message becomes a flat 400 error body);
/// `streams_ids`: the id flags are accepted on streams (vLLM), else refused (SGLang).
pub(crate) fn parse_chat(body: &Value, streams_ids: bool) -> Result<ChatParams, String> {
    let obj = body
        .as_object()
        .ok_or_else(|| "request body must be a JSON object".to_owned())?;
    let messages = match obj.get("messages") {
        None | Some(Value::Null) => return Err("messages: Field required".into()),
        Some(Value::Array(m)) => m.clone(),
        Some(_) => return Err("messages: Input should be a valid list".into()),
    };
    if messages.is_empty() {
        return Err("Messages cannot be empty. Please provide at least one message.".into());
    }
    for (i, m) in messages.iter().enumerate() {
        if m.get("role").and_then(Value::as_str).is_none() {
            return Err(format!("messages.{i}.role: Field required"));
        }
    }
    let flag = |k: &str| obj.get(k).and_then(Value::as_bool).unwrap_or(false);
    let uint = |k: &str| -> Result<Option<usize>, String> {
        match obj.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .map(|n| Some(n as usize))
                .ok_or_else(|| format!("{k}: Input should be a non-negative integer")),
        }
    };
    let stream = flag("stream");
    if stream && !streams_ids {
        for k in [
            "return_token_ids",
            "return_prompt_token_ids",
            "return_meta_info",
        ] {
            if flag(k) {
                return Err(format!("{k} is not supported with streaming"));
            }
        }
    }
    let tools = obj
        .get("tools")
        .filter(|t| t.as_array().is_some_and(|a| !a.is_empty()))
        .cloned();
    let tool_choice = obj.get("tool_choice").cloned().unwrap_or(Value::Null);
    if tools.is_none() && tool_choice.as_str() == Some("required") {
        return Err("Tool usage has been required but no tools are provided.".into());
    }
    let max_tokens = match uint("max_completion_tokens")? {
        Some(n) => Some(n),
        None => uint("max_tokens")?,
    };
    Ok(ChatParams {
        model: obj
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_owned(),
        messages,
        tools,
        tool_choice,
        logprobs: flag("logprobs"),
        top_logprobs: uint("top_logprobs")?.unwrap_or(0),
        stream,
        include_usage: obj
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false),
        max_tokens,
        template_kwargs: obj
            .get("chat_template_kwargs")
            .and_then(Value::as_object)
            .cloned(),
        return_token_ids: flag("return_token_ids"),
        return_prompt_token_ids: flag("return_prompt_token_ids"),
        return_meta_info: flag("return_meta_info"),
        return_routed_experts: flag("return_routed_experts"),
        forced_tool_call: obj
            .get("structured_outputs")
            .and_then(|s| s.get("regex"))
            .and_then(Value::as_str)
            .is_some_and(|r| r.contains("<tool_call>")),
    })
}

/// Why a chat request could not be answered after validation.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SampleError {
    /// The chat template rejected the conversation (SGLang answers 400).
    #[error("chat template error: {0}")]
    Template(#[source] ChatTemplateError),
    /// Tokenization failed (500).
    #[error("tokenization failed: {0}")]
    Tokenize(#[source] ChatTemplateError),
    /// An image the engine cannot load (400, as a real engine refuses it).
    #[error("image could not be loaded: {0}")]
    Image(String),
}

/// One sampled chat answer, already cut to `max_tokens`.
#[derive(Debug, Clone)]
pub(crate) struct ChatSample {
    pub prompt_ids: Vec<u32>,
    pub tokens: Vec<SampledToken>,
    pub finish: Finish,
    pub matched_stop: Option<u32>,
    /// `message.reasoning_content` (None when reasoning is off or empty).
    pub reasoning: Option<String>,
    /// `message.content` (`""` when empty, as SGLang).
    pub content: String,
    /// The parsed tool call (None when the markup was cut by `max_tokens`).
    pub tool_call: Option<ToolCall>,
    /// The tool call the model started, even if cut (what a streaming parser announces).
    pub planned_tool: Option<ToolCall>,
}

impl ChatSample {
    /// The sampled ids, end-of-turn token included (what builds return as response ids).
    pub(crate) fn sampled_ids(&self) -> Vec<u32> {
        self.tokens.iter().map(|t| t.id).collect()
    }
}

/// The text of a message's `content`: a string, or the `text` parts of a list joined with one space.
pub(crate) fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

/// Printable-ASCII words of `text` (other characters dropped), so the echoed text tokenizes cleanly.
fn ascii_words(text: &str) -> Vec<String> {
    text.split_whitespace()
        .map(|w| {
            w.chars()
                .filter(|c| c.is_ascii_graphic())
                .map(|c| if c == '"' || c == '\\' { '\'' } else { c })
                .collect::<String>()
        })
        .filter(|w| !w.is_empty())
        .collect()
}

fn snippet(words: &[String], n: usize) -> String {
    if words.is_empty() {
        return "(nothing)".into();
    }
    let mut s = words.iter().take(n).cloned().collect::<Vec<_>>().join(" ");
    if words.len() > n {
        s.push_str("...");
    }
    s
}

/// Largest `[reply_words=N]` honoured: a long reply, not an unbounded one.
const MAX_REPLY_WORDS: usize = 4096;

/// The `N` of a `[reply_words=N]` directive in `text`.
fn reply_words(text: &str) -> Option<usize> {
    let rest = &text[text.find("[reply_words=")? + "[reply_words=".len()..];
    let n: usize = rest[..rest.find(']')?].trim().parse().ok()?;
    Some(n.min(MAX_REPLY_WORDS))
}

/// ` w1 w2 … wn.`: `n` words of `words` (directives left out), cycled.
fn elaborate(words: &[String], n: usize) -> String {
    let pool: Vec<&str> = words
        .iter()
        .map(String::as_str)
        .filter(|w| !w.starts_with('['))
        .collect();
    if pool.is_empty() || n == 0 {
        return String::new();
    }
    let mut out = String::new();
    for w in pool.iter().cycle().take(n) {
        out.push(' ');
        out.push_str(w);
    }
    out.push('.');
    out
}

/// JSON with Python `json.dumps` spacing (`{"a": 1, "b": [1, 2]}`).
pub(crate) fn py_json(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("[{}]", a.iter().map(py_json).collect::<Vec<_>>().join(", ")),
        Value::Object(o) => format!(
            "{{{}}}",
            o.iter()
                .map(|(k, v)| format!("{}: {}", Value::String(k.clone()), py_json(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => other.to_string(),
    }
}

fn tool_name(tool: &Value) -> Option<&str> {
    tool.get("function")
        .and_then(|f| f.get("name"))
        .and_then(Value::as_str)
}

/// The tool the fake calls, if the request asks for one (see the crate docs).
fn chosen_tool(p: &ChatParams) -> Option<(String, Option<&Value>)> {
    let tools = p.tools.as_ref()?.as_array()?;
    let first = tools.first()?;
    match &p.tool_choice {
        Value::String(s) if s == "none" => None,
        _ if p.forced_tool_call => {
            Some((tool_name(first).unwrap_or("tool").to_owned(), Some(first)))
        }
        Value::String(s) if s == "required" => {
            Some((tool_name(first).unwrap_or("tool").to_owned(), Some(first)))
        }
        Value::Object(o) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)?;
            let tool = tools.iter().find(|t| tool_name(t) == Some(name));
            Some((name.to_owned(), tool))
        }
        _ => {
            let last = p.messages.last()?;
            let is_user = last.get("role").and_then(Value::as_str) == Some("user");
            (is_user && content_text(last.get("content")).contains("[call_tool]"))
                .then(|| (tool_name(first).unwrap_or("tool").to_owned(), Some(first)))
        }
    }
}

/// Deterministic arguments for a tool from its JSON schema.
fn tool_arguments(tool: Option<&Value>, words: &[String], seed: u64) -> Value {
    let params = tool
        .and_then(|t| t.get("function"))
        .and_then(|f| f.get("parameters"));
    let props = params
        .and_then(|p| p.get("properties"))
        .and_then(Value::as_object);
    let required: Vec<&str> = params
        .and_then(|p| p.get("required"))
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut args = Map::new();
    let Some(props) = props else {
        return Value::Object(args);
    };
    for (i, (name, schema)) in props.iter().enumerate() {
        if !required.is_empty() && !required.contains(&name.as_str()) {
            continue;
        }
        let value = if let Some(first) = schema
            .get("enum")
            .and_then(Value::as_array)
            .and_then(|e| e.first())
        {
            first.clone()
        } else {
            match schema.get("type").and_then(Value::as_str) {
                Some("integer") => json!(mix(seed, i as u64) % 10 + 1),
                Some("number") => json!(1.5),
                Some("boolean") => json!(true),
                Some("array") => json!([]),
                Some("object") => json!({}),
                _ => {
                    let w = words
                        .iter()
                        .filter(|w| !w.starts_with('['))
                        .take(3)
                        .cloned()
                        .collect::<Vec<_>>();
                    if w.is_empty() {
                        json!("example")
                    } else {
                        json!(w.join(" "))
                    }
                }
            }
        };
        args.insert(name.clone(), value);
    }
    Value::Object(args)
}

/// Is thinking on for this request?
pub(crate) fn thinking_enabled(default_on: bool, kwargs: Option<&Map<String, Value>>) -> bool {
    default_on
        && kwargs
            .and_then(|k| k.get("enable_thinking"))
            .and_then(Value::as_bool)
            != Some(false)
}

/// Flattens list contents to text (what SGLang does for templates that read content as a
/// string); a template that loops over a message's content gets the lists as they are ("openai"
/// content format: it joins text parts and writes each image's placeholder itself).
fn template_messages(messages: &[Value], keep_lists: bool) -> Vec<Value> {
    messages
        .iter()
        .map(|m| {
            let mut m = m.clone();
            if let Some(obj) = m.as_object_mut()
                && obj.get("content").is_some_and(Value::is_array)
                && !keep_lists
            {
                let text = content_text(obj.get("content"));
                obj.insert("content".into(), Value::String(text));
            }
            m
        })
        .collect()
}

fn push_segment(
    tok: &ChatTokenizer,
    out: &mut Vec<SampledToken>,
    part: Part,
    text: &str,
) -> Result<(), SampleError> {
    if text.is_empty() {
        return Ok(());
    }
    for id in tok.encode(text).map_err(SampleError::Tokenize)? {
        out.push(SampledToken {
            id,
            part,
            text: tok.token_text(id),
        });
    }
    Ok(())
}

fn push_eos(tok: &ChatTokenizer, out: &mut Vec<SampledToken>) {
    if let Some(id) = tok.eos_token_id() {
        out.push(SampledToken {
            id,
            part: Part::Eos,
            text: tok.token_text(id),
        });
    }
}

/// For a conversation's first turn (one message after the leading system/developer messages),
/// the length of `prompt_text`'s start that every conversation with the same system messages and
/// tools shares (`ChatTokenizer::leading_system_prefix_len`, as capture's shared prefix cache
/// finds it). `None` for later turns (they find their previous prompt instead) or when the render
/// fails.
fn shared_system_prefix(
    tok: &ChatTokenizer,
    templated: &[Value],
    tools: Option<&Value>,
    kwargs: Option<&Map<String, Value>>,
    prompt_text: &str,
) -> Option<usize> {
    let leading = ps_chat_template::leading_system_messages(templated);
    if templated.len() != leading + 1 {
        return None;
    }
    tok.leading_system_prefix_len(&templated[..leading], tools, kwargs, prompt_text)
}

/// How many pad tokens a Qwen-VL engine expands an image part to: the image's size from its
/// header, or 28x28 when the fake cannot read it (a real engine fetches remote images and reads
/// more formats than the proxy, whose own refusals are what tests see).
pub(crate) fn image_pads(vision: &ps_chat_template::Vision, part: &Value) -> Result<usize, String> {
    let (w, h) = ps_vision::read_image_part(part, &ps_vision::ImageLimits::unbounded())
        .map_or((28, 28), |i| (i.width, i.height));
    vision.processor.pad_tokens(w, h).map_err(|e| e.to_string())
}

/// Samples the fake answer to a chat request. The prompt is encoded through `prompts`, which
/// reuses encoded prefixes of earlier prompts (the ids are those of a full encode either way).
pub(crate) fn sample_chat(
    tok: &ChatTokenizer,
    prompts: &PromptEncoder,
    p: &ChatParams,
    reasoning_default: bool,
) -> Result<ChatSample, SampleError> {
    let kwargs = p.template_kwargs.as_ref();
    let templated = template_messages(&p.messages, tok.keeps_content_lists());
    let prompt_text = tok
        .render(&templated, p.tools.as_ref(), true, kwargs)
        .map_err(SampleError::Template)?;
    let shared = shared_system_prefix(tok, &templated, p.tools.as_ref(), kwargs, &prompt_text);
    let mut prompt_ids = prompts
        .encode(tok, &prompt_text, shared)
        .map_err(SampleError::Tokenize)?;
    if prompt_text.contains(PROMPT_DRIFT) {
        drift_prompt(&mut prompt_ids);
    }
    // A Qwen-VL engine expands each image's one pad to the image's token count (its processor on
    // the decoded image; here the same rule from the image's header, `image_pads`).
    if let Some(v) = tok.vision() {
        let counts = ps_chat_template::image_parts(&p.messages)
            .map(|part| image_pads(v, part).map_err(SampleError::Image))
            .collect::<Result<Vec<usize>, _>>()?;
        if !counts.is_empty() {
            prompt_ids = tok
                .expand_image_pads(&prompt_ids, &counts)
                .map_err(SampleError::Template)?;
        }
    }

    let last = p.messages.last();
    let last_role = last
        .and_then(|m| m.get("role"))
        .and_then(Value::as_str)
        .unwrap_or("user");
    let last_text = content_text(last.and_then(|m| m.get("content")));
    let words = ascii_words(&last_text);
    let turn = 1 + p
        .messages
        .iter()
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
        .count();
    let seed = mix(hash_str(&last_text), turn as u64);
    let (who, verb) = if last_role == "tool" {
        ("The tool", "returned")
    } else {
        ("The user", "said")
    };
    let reasoning_on = thinking_enabled(reasoning_default, kwargs);
    let tool = chosen_tool(p);
    let reasoning = match &tool {
        Some((name, _)) => format!(
            "{who} {verb}: \"{}\". I should call the {name} tool.",
            snippet(&words, 8)
        ),
        None => format!(
            "{who} {verb}: \"{}\". This is turn {turn}, so I will answer briefly.",
            snippet(&words, 8)
        ),
    };
    // `[reply_words=N]` in the last message: the reasoning (the content without it) goes on for N
    // more words of that message, so a benchmark gets replies of a chosen length.
    let elaboration = reply_words(&last_text)
        .map(|n| elaborate(&words, n))
        .unwrap_or_default();
    let reasoning = if reasoning_on {
        format!("{reasoning}{elaboration}")
    } else {
        reasoning
    };
    const OPENERS: [&str; 4] = ["Noted.", "Understood.", "Got it.", "Okay."];
    let opener = OPENERS[(seed % OPENERS.len() as u64) as usize];
    let content = format!(
        "{opener} {} {verb} \"{}\" (turn {turn}).",
        if last_role == "tool" {
            "The tool"
        } else {
            "You"
        },
        snippet(&words, 12)
    );
    let content = if reasoning_on {
        content
    } else {
        format!("{content}{elaboration}")
    };

    let mut tokens = Vec::new();
    if reasoning_on {
        push_segment(tok, &mut tokens, Part::ThinkMarker, "<think>")?;
        push_segment(tok, &mut tokens, Part::Pad, "\n")?;
        // The reasoning and the newline that closes it are one run of text, as a model samples it:
        // BPE merges across that boundary (".\n" is one Qwen token), so they are encoded together.
        push_segment(tok, &mut tokens, Part::Reasoning, &format!("{reasoning}\n"))?;
        push_segment(tok, &mut tokens, Part::ThinkMarker, "</think>")?;
        push_segment(tok, &mut tokens, Part::Pad, "\n\n")?;
    }
    let tool_call = match &tool {
        Some((name, schema)) => {
            let args = py_json(&tool_arguments(*schema, &words, seed));
            let head = format!(
                "{{\"name\": {}, \"arguments\": ",
                Value::String(name.clone())
            );
            push_segment(tok, &mut tokens, Part::ToolMarkup, "<tool_call>")?;
            push_segment(tok, &mut tokens, Part::ToolMarkup, "\n")?;
            push_segment(tok, &mut tokens, Part::ToolHead, &head)?;
            push_segment(tok, &mut tokens, Part::ToolArgs, &args)?;
            push_segment(tok, &mut tokens, Part::ToolMarkup, "}")?;
            push_segment(tok, &mut tokens, Part::ToolMarkup, "\n")?;
            push_segment(tok, &mut tokens, Part::ToolMarkup, "</tool_call>")?;
            Some(ToolCall {
                id: format!("call_{}", hex_id(mix(seed, hash_str(name)), 24)),
                name: name.clone(),
                arguments: args,
            })
        }
        None => {
            push_segment(tok, &mut tokens, Part::Content, &content)?;
            None
        }
    };
    push_eos(tok, &mut tokens);

    let full_len = tokens.len();
    // Tokens up to the end of the tool-call markup (everything but the eos).
    let body_len = tokens
        .iter()
        .rposition(|t| t.part != Part::Eos)
        .map_or(0, |i| i + 1);
    let cut = p.max_tokens.is_some_and(|m| m < full_len);
    if let Some(m) = p.max_tokens {
        tokens.truncate(m);
    }
    let text_of = |part: Part, toks: &[SampledToken]| -> String {
        toks.iter()
            .filter(|t| t.part == part)
            .map(|t| t.text.as_str())
            .collect()
    };
    let sample = if cut {
        let tool_done = tool_call.is_some() && tokens.len() >= body_len;
        let r = text_of(Part::Reasoning, &tokens);
        ChatSample {
            prompt_ids,
            finish: Finish::Length,
            matched_stop: None,
            reasoning: (reasoning_on && !r.is_empty()).then_some(r),
            content: text_of(Part::Content, &tokens),
            planned_tool: tool_call.clone(),
            tool_call: if tool_done { tool_call } else { None },
            tokens,
        }
    } else {
        let matched_stop = tokens.last().filter(|t| t.part == Part::Eos).map(|t| t.id);
        ChatSample {
            prompt_ids,
            finish: if tool_call.is_some() {
                Finish::ToolCalls
            } else {
                Finish::Stop
            },
            matched_stop,
            reasoning: reasoning_on.then_some(reasoning),
            content: if tool_call.is_some() {
                String::new()
            } else {
                content
            },
            planned_tool: tool_call.clone(),
            tool_call,
            tokens,
        }
    };
    Ok(sample)
}

/// One `logprobs.content` item of the chat API.
pub(crate) fn chat_logprob_entry(
    tok: &ChatTokenizer,
    t: &SampledToken,
    position: usize,
    top_k: usize,
) -> Value {
    let lp = policy_logprob(t.id, position);
    let item =
        |text: &str, lp: f64| json!({"token": text, "bytes": text.as_bytes(), "logprob": lp});
    let mut top = Vec::with_capacity(top_k);
    if top_k > 0 {
        top.push(item(&t.text, lp));
        for (j, alt) in alternatives(t.id, top_k - 1).into_iter().enumerate() {
            top.push(item(&tok.token_text(alt), lp - 1.0 - 0.5 * j as f64));
        }
    }
    let mut entry = item(&t.text, lp);
    if let Some(o) = entry.as_object_mut() {
        o.insert("top_logprobs".into(), Value::Array(top));
    }
    entry
}

/// A `/generate` logprob triple `[logprob, id, text|null]`.
pub(crate) fn triple(tok: &ChatTokenizer, lp: Option<f64>, id: u32, with_text: bool) -> Value {
    json!([lp, id, with_text.then(|| tok.token_text(id))])
}

/// The directive that makes a chat prompt's reported ids differ from the encoding of its text.
pub const PROMPT_DRIFT: &str = "FAKE_PROMPT_DRIFT";

/// A prompt's ids as an engine whose template or tokenizer differs from the proxy's would report
/// them: the last id (the generation prompt's last token, an ordinary one) is the next id.
pub fn drift_prompt(ids: &mut [u32]) {
    if let Some(last) = ids.last_mut() {
        *last += 1;
    }
}

/// A parsed `FAKE_VOTES=…` list: `Some(v)` answers `\boxed{v}`, `None` answers without a boxed value.
/// The LAST directive of the prompt counts: a judge prompt shows the response before the next state,
/// and a response may quote an earlier message's directive.
pub(crate) fn scripted_votes(text: &str) -> Option<Vec<Option<i64>>> {
    let start = text.rfind("FAKE_VOTES=")? + "FAKE_VOTES=".len();
    let list: String = text[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || matches!(c, ',' | '-' | '+' | 'x' | 'X'))
        .collect();
    let votes: Vec<Option<i64>> = list
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<i64>().ok())
        .collect();
    (!votes.is_empty()).then_some(votes)
}

const HINTS: [&str; 4] = [
    "Check the user's latest correction before answering again.",
    "Ask which file the user means before editing anything.",
    "Use the tool output instead of guessing the value, and say where it came from.",
    "Keep the answer short.",
];

/// The judge's answer to a `/generate` prompt (`vote` is the scripted or hashed vote).
pub(crate) fn judge_text(prompt: &str, vote: Option<i64>, call: usize, thinking: bool) -> String {
    let hint_judge = prompt.contains("[HINT_START]");
    let mut out = String::new();
    if thinking {
        out.push_str("<think>\nLet me compare the response with the next state.\n</think>\n\n");
    }
    match (hint_judge, vote) {
        (true, Some(1)) => {
            let hint = HINTS[(mix(hash_str(prompt), call as u64) % HINTS.len() as u64) as usize];
            out.push_str(&format!(
                "The next state contains a correction the assistant could have used.\n\
                 [HINT_START]{hint}[HINT_END]\n\\boxed{{1}}"
            ));
        }
        (true, Some(v)) => out.push_str(&format!(
            "The next state gives no useful hint for this response.\n\\boxed{{{v}}}"
        )),
        (false, Some(v)) => out.push_str(&format!(
            "Judging the response by the next state, my score is:\n\\boxed{{{v}}}"
        )),
        (_, None) => out.push_str("I cannot decide on a score for this response."),
    }
    out
}

/// The default (unscripted) vote for a judge prompt: a function of the text only.
pub(crate) fn default_vote(prompt: &str) -> i64 {
    let h = mix(hash_str(prompt), 0x766f_7465);
    if prompt.contains("[HINT_START]") {
        [1, 1, 1, -1][(h % 4) as usize]
    } else {
        [1, 1, -1, 0][(h % 4) as usize]
    }
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parse_chat_sglang(body: &Value) -> Result<ChatParams, String> {
        parse_chat(body, false)
    }

    #[test]
    fn py_json_matches_python_spacing() {
        let v = json!({"city": "Paris", "days": [1, 2], "x": {"a": null}});
        assert_eq!(
            py_json(&v),
            r#"{"city": "Paris", "days": [1, 2], "x": {"a": null}}"#
        );
    }

    #[test]
    fn reply_words_lengthen_the_reasoning() {
        assert_eq!(reply_words("look here [reply_words=5] please"), Some(5));
        assert_eq!(reply_words("[reply_words=99999]"), Some(MAX_REPLY_WORDS));
        assert_eq!(reply_words("[reply_words=x]"), None);
        assert_eq!(reply_words("nothing"), None);
        let words = ascii_words("alpha beta [reply_words=5]");
        assert_eq!(elaborate(&words, 5), " alpha beta alpha beta alpha.");
        assert_eq!(elaborate(&words, 0), "");
        let tok = ChatTokenizer::mini();
        let ask = |text: &str| {
            parse_chat_sglang(&json!({"messages": [{"role": "user", "content": text}]}))
                .expect("valid")
        };
        let prompts = PromptEncoder::new(0);
        let short = sample_chat(&tok, &prompts, &ask("tell me more"), true).expect("sampled");
        let long = sample_chat(&tok, &prompts, &ask("tell me more [reply_words=200]"), true)
            .expect("sampled");
        assert!(long.tokens.len() > short.tokens.len() + 200);
        let reasoning = long.reasoning.expect("reasoning on");
        assert!(reasoning.ends_with(" more tell me."), "{reasoning}");
    }

    #[test]
    fn scripted_votes_parse() {
        assert_eq!(
            scripted_votes("FAKE_VOTES=-1 quoted, then blah FAKE_VOTES=1,-1,x,0 more"),
            Some(vec![Some(1), Some(-1), None, Some(0)])
        );
        assert_eq!(scripted_votes("no directive"), None);
    }

    #[test]
    fn judge_text_has_boxed_and_hint() {
        let t = judge_text("use [HINT_START]", Some(1), 0, true);
        assert!(t.contains("[HINT_START]") && t.ends_with("\\boxed{1}"));
        let t = judge_text("prm", Some(-1), 0, false);
        assert!(t.ends_with("\\boxed{-1}"));
        assert!(!judge_text("prm", None, 0, false).contains("boxed"));
    }

    #[test]
    fn parse_chat_rejects_what_sglang_rejects() {
        assert!(parse_chat_sglang(&json!({})).is_err());
        assert!(parse_chat_sglang(&json!({"messages": []})).is_err());
        assert!(
            parse_chat_sglang(&json!({"messages": [{"role":"user","content":"hi"}], "stream": true, "return_token_ids": true}))
                .is_err()
        );
        assert!(
            parse_chat_sglang(
                &json!({"messages": [{"role":"user","content":"hi"}], "tool_choice": "required"})
            )
            .is_err()
        );
        // vLLM streams the ids it is asked for.
        let streamed = json!({"messages": [{"role":"user","content":"hi"}], "stream": true, "return_token_ids": true});
        assert!(
            parse_chat(&streamed, true)
                .expect("vLLM accepts it")
                .return_token_ids
        );
        let p = parse_chat_sglang(&json!({"messages": [{"role":"user","content":"hi"}], "max_tokens": 5, "max_completion_tokens": 7}))
            .expect("valid");
        assert_eq!(p.max_tokens, Some(7));
        assert_eq!(p.model, "default");
    }
}
