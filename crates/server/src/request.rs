//! Reading a chat request: validation with clear errors, the session keys (headers or body), and the
//! body forwarded upstream.

use axum::http::HeaderMap;
use std::borrow::Cow;

use bytes::Bytes;
use ps_core::session::{SessionHeaders, TurnType, is_truthy};
use ps_json::{self as raw, Edit, Kind, RawObject};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::error::ApiError;

/// Body keys that are ours, not OpenAI's: read, then stripped before forwarding.
const SESSION_ID_KEY: &str = "session_id";
const SESSION_DONE_KEY: &str = "session_done";
const TURN_TYPE_KEY: &str = "turn_type";

/// Session id of a request that names none (as the reference).
pub const UNKNOWN_SESSION: &str = "unknown";
pub const SESSION_ID_HEADER: &str = "x-session-id";
pub const TURN_TYPE_HEADER: &str = "x-turn-type";
pub const SESSION_DONE_HEADER: &str = "x-session-done";

/// A validated chat request. The body is not parsed into a tree, nor copied: its top-level fields
/// are borrowed from the client's JSON text, in order, and only what the proxy reads is read from
/// them.
#[derive(Debug)]
pub struct ChatRequest<'a> {
    /// The client's body without our session keys, every other field as it came.
    fields: Vec<(Cow<'a, str>, &'a RawValue)>,
    /// Where `messages` is in `fields` (validated: a non-empty array of objects).
    messages_at: usize,
    /// The first content part that is not text (its drop reason and where it is): such a main
    /// turn gives no sample (`ps_core::message::unsupported_part`), found here from the parts'
    /// `type`s so that it is not queued for capture at all. `[0]`: the first of any kind; `[1]`:
    /// the first that is not an image (for a vision-language policy, whose images are captured).
    unsupported: [Option<(&'static str, String)>; 2],
    /// The messages after the last assistant message, as trees: what the request adds to the
    /// conversation it continues, from which the previous turn's next state is taken. Only the
    /// last message when there is no assistant message (a new conversation: nothing it adds is a
    /// next state, except to a keyed session's turn before it, which gets the last message, as in
    /// the reference).
    added: Vec<Value>,
    pub session: SessionHeaders,
    pub stream: bool,
}

fn wrong_type(field: &str, expected: &str, got: Kind) -> ApiError {
    ApiError::invalid(
        "invalid_type",
        format!("`{field}` must be {expected}, got {}", got.name()),
    )
}

/// Parses and validates the body, and reads the session keys (headers win over body keys).
#[cfg(test)]
pub fn parse<'a>(bytes: &'a [u8], headers: &HeaderMap) -> Result<ChatRequest<'a>, ApiError> {
    parse_limited(bytes, headers, usize::MAX)
}

/// The body's top-level object, or the error a client gets for a body that is not one.
fn top_object(bytes: &[u8]) -> Result<RawObject<'_>, ApiError> {
    let raw_error = match std::str::from_utf8(bytes) {
        Ok(text) => match RawObject::parse(text) {
            // Deep nesting and surrogate escapes are checked as a tree parse would.
            Ok(top) if !raw::needs_tree_check(bytes) => return Ok(top),
            Ok(top) => match serde_json::from_slice::<Value>(bytes) {
                Ok(_) => return Ok(top),
                Err(e) => return Err(ApiError::InvalidJson(e.to_string())),
            },
            Err(e) => e.to_string(),
        },
        Err(e) => e.to_string(),
    };
    // Not an object: the message a tree parse gives (not JSON), or the type it has.
    let kind = match serde_json::from_slice::<Value>(bytes) {
        Err(e) => return Err(ApiError::InvalidJson(e.to_string())),
        Ok(Value::Null) => Kind::Null,
        Ok(Value::Bool(_)) => Kind::Bool,
        Ok(Value::Number(_)) => Kind::Number,
        Ok(Value::String(_)) => Kind::String,
        Ok(Value::Array(_)) => Kind::Array,
        Ok(Value::Object(_)) => return Err(ApiError::InvalidJson(raw_error)),
    };
    Err(wrong_type("body", "a JSON object", kind))
}

/// As [`parse`], with at most `max_messages` messages (`server.max_messages`).
pub fn parse_limited<'a>(
    bytes: &'a [u8],
    headers: &HeaderMap,
    max_messages: usize,
) -> Result<ChatRequest<'a>, ApiError> {
    let body = top_object(bytes)?;
    let messages = validate_messages(body.get("messages"))?;
    let count = messages.len();
    if count > max_messages {
        return Err(ApiError::invalid(
            "too_many_messages",
            format!(
                "the request has {count} messages; at most {max_messages} are accepted (`server.max_messages`)"
            ),
        ));
    }
    let stream = match body.get("stream") {
        None => false,
        Some(v) => match Kind::of(v) {
            Kind::Null => false,
            Kind::Bool => raw::as_bool(v) == Some(true),
            other => return Err(wrong_type("stream", "a boolean", other)),
        },
    };
    if let Some(tools) = body.get("tools")
        && !matches!(Kind::of(tools), Kind::Array | Kind::Null)
    {
        return Err(wrong_type("tools", "an array", Kind::of(tools)));
    }
    let session = session_keys(&body, headers)?;
    let is_assistant = |m: &RawValue| {
        RawObject::of(m)
            .and_then(|o| {
                o.get("role")
                    .and_then(raw::as_str)
                    .map(|r| r == "assistant")
            })
            .unwrap_or(false)
    };
    // Validated non-empty above.
    let from = match messages.iter().rposition(|m| is_assistant(m)) {
        Some(i) => i + 1,
        None => messages.len().saturating_sub(1),
    };
    let added = messages[from..]
        .iter()
        .map(|m| serde_json::from_str(m.get()))
        .collect::<Result<Vec<Value>, _>>()
        .map_err(|e| ApiError::InvalidJson(e.to_string()))?;
    let unsupported = first_unsupported_part(&messages);
    let fields: Vec<(Cow<'_, str>, &RawValue)> = body
        .into_entries()
        .filter(|(k, _)| ![SESSION_ID_KEY, SESSION_DONE_KEY, TURN_TYPE_KEY].contains(&k.as_ref()))
        .collect();
    let messages_at = fields
        .iter()
        .position(|(k, _)| k == "messages")
        .ok_or_else(|| ApiError::invalid("missing_messages", "`messages` is required"))?;
    Ok(ChatRequest {
        fields,
        messages_at,
        unsupported,
        added,
        session,
        stream,
    })
}

/// The first content part of `messages` (validated) that is not text, read from the parts' `type`
/// alone (a few bytes a part): its drop reason and where it is (`ps_core::message::part_reason`).
fn first_unsupported_part(messages: &[&RawValue]) -> [Option<(&'static str, String)>; 2] {
    let mut found = [None, None];
    for (i, m) in messages.iter().enumerate() {
        let Some(parts) = RawObject::of(m)
            .and_then(|o| o.get("content"))
            .and_then(raw::array)
        else {
            continue;
        };
        for (j, p) in parts.iter().enumerate() {
            let kind = RawObject::of(p).and_then(|o| o.get("type").and_then(raw::as_str));
            if let Some(reason) = ps_core::message::part_reason(kind.as_deref()) {
                let image = ps_core::message::is_image_kind(kind.as_deref());
                let at = || {
                    Some((
                        reason,
                        ps_core::message::unsupported_detail(i, j, kind.as_deref()),
                    ))
                };
                if found[0].is_none() {
                    found[0] = at();
                }
                if !image {
                    found[1] = at();
                    return found;
                }
            }
        }
    }
    found
}

/// Checks `messages` (a non-empty array of objects, each with a string `role` and a string, array
/// or null `content`) and returns its elements.
fn validate_messages(messages: Option<&RawValue>) -> Result<Vec<&RawValue>, ApiError> {
    let missing = || ApiError::invalid("missing_messages", "`messages` is required");
    let messages = messages.ok_or_else(missing)?;
    let messages = match Kind::of(messages) {
        Kind::Null => return Err(missing()),
        Kind::Array => raw::array(messages).unwrap_or_default(),
        other => return Err(wrong_type("messages", "an array", other)),
    };
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "empty_messages",
            "`messages` must hold at least one message",
        ));
    }
    for (i, m) in messages.iter().enumerate() {
        let Some(obj) = RawObject::of(m) else {
            return Err(wrong_type(
                &format!("messages[{i}]"),
                "an object",
                Kind::of(m),
            ));
        };
        match obj.get("role").map(Kind::of) {
            Some(Kind::String) => {}
            None => {
                return Err(ApiError::invalid(
                    "invalid_message",
                    format!("`messages[{i}].role` is required"),
                ));
            }
            Some(other) => {
                return Err(wrong_type(
                    &format!("messages[{i}].role"),
                    "a string",
                    other,
                ));
            }
        }
        if let Some(c) = obj.get("content").map(Kind::of)
            && !matches!(c, Kind::String | Kind::Array | Kind::Null)
        {
            return Err(wrong_type(
                &format!("messages[{i}].content"),
                "a string, an array of parts or null",
                c,
            ));
        }
    }
    Ok(messages)
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// A body key's value as text: a non-blank string (trimmed), a number (as a tree would write it)
/// or a boolean; `None` for other types. A value a tree parse refuses is the client's error.
fn body_str(v: Option<&RawValue>) -> Result<Option<String>, ApiError> {
    let Some(v) = v else { return Ok(None) };
    let invalid = |e: serde_json::Error| ApiError::InvalidJson(e.to_string());
    Ok(match Kind::of(v) {
        Kind::String => {
            let s: std::borrow::Cow<'_, str> = serde_json::from_str(v.get()).map_err(invalid)?;
            Some(s.trim().to_owned()).filter(|s| !s.is_empty())
        }
        Kind::Number => Some(
            serde_json::from_str::<serde_json::Number>(v.get())
                .map_err(invalid)?
                .to_string(),
        ),
        Kind::Bool => raw::as_bool(v).map(|b| b.to_string()),
        _ => None,
    })
}

fn session_keys(body: &RawObject<'_>, headers: &HeaderMap) -> Result<SessionHeaders, ApiError> {
    let body_id = body_str(body.get(SESSION_ID_KEY))?;
    let body_done = body_str(body.get(SESSION_DONE_KEY))?;
    let body_turn = body_str(body.get(TURN_TYPE_KEY))?;

    let session_id = header_str(headers, SESSION_ID_HEADER)
        .map(str::to_owned)
        .or(body_id);
    // Either key ends the session, as in the reference (`header or body`): a header `0` does not
    // cancel a body `true`.
    let done = header_str(headers, SESSION_DONE_HEADER).is_some_and(is_truthy)
        || body_done.as_deref().is_some_and(is_truthy);
    let turn_type = match header_str(headers, TURN_TYPE_HEADER)
        .map(str::to_owned)
        .or(body_turn)
    {
        None => None,
        Some(t) => Some(TurnType::parse(&t).ok_or_else(|| {
            ApiError::invalid(
                "invalid_turn_type",
                format!("turn type {t:?} is not `main` or `side` (header `X-Turn-Type` or body `turn_type`)"),
            )
        })?),
    };
    Ok(SessionHeaders {
        session_id,
        turn_type,
        done,
    })
}

impl<'a> ChatRequest<'a> {
    /// A top-level field as the client sent it (our session keys are gone).
    pub fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.fields.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// `messages`, as the client sent it (a validated array).
    pub fn messages_json(&self) -> &'a RawValue {
        self.fields[self.messages_at].1
    }

    /// `messages` as trees (session inference; capture parses them on its own threads). The body
    /// was validated as a tree parse would, so an error here is a bug the caller reports.
    pub fn messages(&self) -> serde_json::Result<Vec<Value>> {
        serde_json::from_str(self.messages_json().get())
    }

    /// The messages after the last assistant message, as trees (only the last message when there
    /// is none): what the request adds to the conversation it continues.
    pub fn added_messages(&self) -> &[Value] {
        &self.added
    }

    /// The first content part that is not text (not text nor an image when `images_captured`:
    /// the policy is a vision-language model whose images are captured): its drop reason and
    /// where it is.
    pub fn unsupported_part(&self, images_captured: bool) -> Option<&(&'static str, String)> {
        self.unsupported[usize::from(images_captured)].as_ref()
    }

    /// The body as a tree without our session keys (tests: what [`Self::shape_view`] stands for).
    #[cfg(test)]
    pub fn body_map(&self) -> serde_json::Result<Map<String, Value>> {
        self.fields
            .iter()
            .map(|(k, v)| Ok((k.to_string(), serde_json::from_str(v.get())?)))
            .collect()
    }

    /// What the side-turn shape rules read, as a small tree: `messages` as its first message and
    /// its last user message (the only ones the rules look at, in their order), `tools` as an
    /// empty or one-element stand-in of the same kind, `max_tokens`, `max_completion_tokens` and
    /// `model`.
    /// The other messages are scanned for their role, never built. The last user message is the
    /// last one `ephemeral` does not name (a client's context block sent once is not what the
    /// user asked). An error as for [`Self::messages`].
    pub fn shape_view(
        &self,
        ephemeral: &[ps_session_infer::EphemeralRule],
    ) -> serde_json::Result<Map<String, Value>> {
        let elems: Vec<&RawValue> = serde_json::from_str(self.messages_json().get())?;
        let is_user = |m: &RawValue| {
            RawObject::parse(m.get())
                .ok()
                .and_then(|o| o.get("role").and_then(raw::as_str).map(|r| r == "user"))
                .unwrap_or(false)
        };
        let mut last_user = None;
        for (i, m) in elems.iter().enumerate().rev().filter(|(_, m)| is_user(m)) {
            let message = serde_json::from_str::<Value>(m.get())?;
            if !ps_session_infer::ephemeral::is_ephemeral(ephemeral, &message) {
                last_user = Some((i, message));
                break;
            }
        }
        let mut messages = Vec::new();
        if let Some(first) = elems.first() {
            messages.push(serde_json::from_str::<Value>(first.get())?);
        }
        if let Some((_, m)) = last_user.filter(|&(i, _)| i > 0) {
            messages.push(m);
        }
        let mut view = Map::new();
        view.insert("messages".into(), Value::Array(messages));
        if let Some(tools) = self.get("tools") {
            let stand_in = match Kind::of(tools) {
                Kind::Array if raw::array(tools).is_some_and(|t| t.is_empty()) => {
                    Value::Array(vec![])
                }
                Kind::Array => Value::Array(vec![Value::Null]),
                Kind::Null => Value::Null,
                _ => Value::Bool(true),
            };
            view.insert("tools".into(), stand_in);
        }
        for key in ["max_tokens", "max_completion_tokens", "model"] {
            if let Some(v) = self.get(key) {
                view.insert(key.into(), serde_json::from_str(v.get())?);
            }
        }
        Ok(view)
    }

    /// `tools`, unless absent or null.
    pub fn tools_json(&self) -> Option<&'a RawValue> {
        self.get("tools").filter(|t| Kind::of(t) != Kind::Null)
    }

    /// `chat_template_kwargs`, when it is an object.
    pub fn template_kwargs_json(&self) -> Option<&'a RawValue> {
        self.get("chat_template_kwargs")
            .filter(|t| Kind::of(t) == Kind::Object)
    }

    /// `key` is `true`.
    pub fn is_true(&self, key: &str) -> bool {
        self.get(key).and_then(raw::as_bool) == Some(true)
    }

    /// `key` as a non-negative integer.
    pub fn u64_of(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(raw::as_u64)
    }

    /// `key` as a number: `Ok(None)` when absent or null; a number written as a string (the
    /// engines' validators take `"0.9"`) is read; anything else is `Err`.
    fn number(&self, key: &str) -> Result<Option<f64>, ()> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        match serde_json::from_str::<Value>(v.get()) {
            Ok(Value::Null) => Ok(None),
            Ok(Value::Number(n)) => n.as_f64().map(Some).ok_or(()),
            Ok(Value::String(t)) => t.trim().parse::<f64>().map(Some).map_err(|_| ()),
            _ => Err(()),
        }
    }

    /// The sampling parameters this request sets (each `None` when absent or null: the engine's
    /// default applies); one the proxy cannot read as a number marks the whole `unreadable`.
    pub fn sampling(&self) -> ps_core::Sampling {
        let mut unreadable = false;
        let mut read = |key| {
            self.number(key).unwrap_or_else(|()| {
                unreadable = true;
                None
            })
        };
        let temperature = read("temperature");
        let top_p = read("top_p");
        let top_k = read("top_k");
        let min_p = read("min_p");
        ps_core::Sampling {
            temperature,
            top_p,
            // -1 and 20.0 alike; a fraction is no engine's top-k and reads as unreadable.
            top_k: top_k.and_then(|k| {
                if k.fract() == 0.0 && k.abs() < 1e15 {
                    Some(k as i64)
                } else {
                    unreadable = true;
                    None
                }
            }),
            min_p,
            rewritten: false,
            unreadable,
        }
    }
}

/// The model name sent upstream in place of the client's (`server.model_names`), or the refusal
/// of a name that is not served here. `None`: forwarded as sent (no map configured, the served
/// name, or no name: [`forward_body`] fills in the served one).
pub fn upstream_model<'m>(
    req: &ChatRequest<'_>,
    served: &str,
    names: &'m std::collections::BTreeMap<String, String>,
) -> Result<Option<&'m str>, ApiError> {
    if names.is_empty() {
        return Ok(None);
    }
    let Some(asked) = req.get("model").and_then(raw::as_str) else {
        return Ok(None);
    };
    if asked.is_empty() || asked == served {
        return Ok(None);
    }
    match names.get(asked.as_ref()) {
        Some(upstream) => Ok(Some(upstream.as_str())),
        None => Err(ApiError::NotFound {
            code: "model_not_found",
            message: format!(
                "the model {asked:?} is not served here: ask for {served:?} \
                 (server.served_model_name) or one of server.model_names ({})",
                names
                    .keys()
                    .map(|n| format!("{n:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }),
    }
}

/// Options that shape the forwarded body.
#[derive(Debug, Clone)]
pub struct ForwardOptions<'a> {
    pub served_model_name: &'a str,
    /// The name sent in place of the client's `model` ([`upstream_model`]).
    pub model: Option<&'a str>,
    pub stream: bool,
    /// Ask the engine for its ids (`return_token_ids: true`) unless the client set the flag. The
    /// caller decides: never on a streamed call to SGLang, which refuses it (vLLM streams them).
    pub return_token_ids: bool,
    /// Send `top_p: 1`, `top_k: -1`, `min_p: 0` in place of the client's (`capture.sampling =
    /// "full_distribution"`, main turns that are captured).
    pub full_distribution: bool,
    /// Ask for routed experts (`return_routed_experts: true`) unless the client set the flag.
    pub routed_experts: bool,
}

/// The body sent upstream, as JSON text.
#[derive(Debug, Clone)]
pub struct Forwarded {
    pub body: Bytes,
    /// Whether it asks for the engine's ids (`return_token_ids: true`, ours or the client's).
    pub return_token_ids: bool,
    /// Whether the ask is ours (the client did not set the flag): it is the body's last entry.
    pub injected_ids: bool,
    /// Whether we asked for routed experts (the client did not set `return_routed_experts`).
    pub injected_experts: bool,
}

/// What `capture.sampling = "full_distribution"` sends: no truncation by `top_p`, `top_k` (-1 is
/// "all" to SGLang and vLLM alike) or `min_p`; the temperature is the client's.
const FULL_DISTRIBUTION: [(&str, &[u8]); 3] = [("top_p", b"1"), ("top_k", b"-1"), ("min_p", b"0")];

/// The ids flag `forward_body` adds, the last entry of the body it writes.
const INJECTED_IDS: &[u8] = br#","return_token_ids":true}"#;

/// `body` (written by [`forward_body`] with the ids flag added) without that flag: the body as the
/// client sent it otherwise.
pub fn without_injected_ids(body: &Bytes) -> Bytes {
    match body.strip_suffix(INJECTED_IDS) {
        Some(rest) => {
            let mut b = Vec::with_capacity(rest.len() + 1);
            b.extend_from_slice(rest);
            b.push(b'}');
            Bytes::from(b)
        }
        None => body.clone(),
    }
}

/// The routed-experts flag `forward_body` adds, before the ids flag.
const INJECTED_EXPERTS: &[u8] = br#","return_routed_experts":true"#;

/// `body` (written by [`forward_body`] with the experts flag added) without that flag. A JSON
/// string cannot hold the flag's bytes (its quotes would be escaped), and the client's own flag
/// would have kept us from adding ours, so its last occurrence is the one we added.
pub fn without_injected_experts(body: &Bytes) -> Bytes {
    match memchr::memmem::rfind(body, INJECTED_EXPERTS) {
        Some(at) => {
            let mut b = Vec::with_capacity(body.len());
            b.extend_from_slice(&body[..at]);
            b.extend_from_slice(&body[at + INJECTED_EXPERTS.len()..]);
            Bytes::from(b)
        }
        None => body.clone(),
    }
}

/// The body sent upstream: log-probs forced on (`top_logprobs` at least 1), `model` filled when absent,
/// `stream` set as decided, every other field untouched. Written from the client's own text: fields
/// keep their order and bytes; a field we set keeps its place, one we add comes last.
pub fn forward_body(req: &ChatRequest<'_>, opts: &ForwardOptions<'_>) -> Forwarded {
    let top = req.u64_of("top_logprobs").unwrap_or(0).max(1).to_string();
    let model_ok = req
        .get("model")
        .and_then(raw::as_str)
        .is_some_and(|m| !m.is_empty());
    let model = serde_json::to_string(opts.served_model_name).unwrap_or_else(|_| "\"\"".into());
    let renamed = opts
        .model
        .map(|m| serde_json::to_string(m).unwrap_or_else(|_| "\"\"".into()));
    let stream: &[u8] = if opts.stream { b"true" } else { b"false" };
    let add_ids = opts.return_token_ids && !req.contains_key("return_token_ids");
    let return_token_ids = add_ids || req.is_true("return_token_ids");
    let fields = RawObject::from_entries(
        req.fields
            .iter()
            .map(|(k, v)| (Cow::Borrowed(k.as_ref()), *v)),
    );
    let mut append: Vec<(&str, &[u8])> = Vec::new();
    if !req.contains_key("logprobs") {
        append.push(("logprobs", b"true"));
    }
    if !req.contains_key("top_logprobs") {
        append.push(("top_logprobs", top.as_bytes()));
    }
    if !req.contains_key("model") {
        append.push(("model", model.as_bytes()));
    }
    if !req.contains_key("stream") {
        append.push(("stream", stream));
    }
    if opts.full_distribution {
        for (key, value) in FULL_DISTRIBUTION {
            if !req.contains_key(key) {
                append.push((key, value));
            }
        }
    }
    let add_experts = opts.routed_experts && !req.contains_key("return_routed_experts");
    if add_experts {
        append.push(("return_routed_experts", b"true"));
    }
    // Last: `without_injected_ids` takes it off the end again.
    if add_ids {
        append.push(("return_token_ids", b"true"));
    }
    let mut out = Vec::with_capacity(
        req.fields
            .iter()
            .map(|(k, v)| k.len() + v.get().len() + 4)
            .sum::<usize>()
            + 128,
    );
    raw::write_object(
        &mut out,
        &fields,
        |k, _| match k {
            "logprobs" => Edit::Replace(b"true".as_slice().into()),
            "top_logprobs" => Edit::Replace(top.as_bytes().into()),
            "model" if renamed.is_some() => {
                Edit::Replace(renamed.as_deref().unwrap_or_default().as_bytes().into())
            }
            "model" if !model_ok => Edit::Replace(model.as_bytes().into()),
            "stream" => Edit::Replace(stream.into()),
            "stream_options" if !opts.stream => Edit::Drop,
            k if opts.full_distribution => FULL_DISTRIBUTION
                .iter()
                .find(|(key, _)| *key == k)
                .map_or(Edit::Keep, |(_, v)| Edit::Replace((*v).into())),
            _ => Edit::Keep,
        },
        &append,
    );
    Forwarded {
        body: Bytes::from(out),
        return_token_ids,
        injected_ids: add_ids,
        injected_experts: add_experts,
    }
}

#[cfg(test)]
mod tests;
