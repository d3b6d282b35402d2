//! Assembling an answer: the assistant message and the sampled tokens' log-probs, from a non-streamed
//! response or from the chunks of a stream.
//!
//! Over ~700 lines on purpose: ~970 lines of code, because the whole answer ([`Answer`], read
//! from the one scan of its bytes) and the streamed chunks ([`StreamAssembler`]) must read every
//! field alike, and share the lenient readers of ids, log-probs and tool calls that make them so;
//! then ~270 lines of unit tests, one case per response shape the real builds send
//! (docs/upstream-protocols.md), kept beside the code they pin. The tree oracle they were checked
//! against is `ps_test_support::tree_oracle` (`tests/tree_equivalence.rs`).

use bytes::Bytes;
use ps_core::{EngineIds, FinishReason, RolloutResponse, SampledToken};
use serde::Deserialize;
use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use crate::SglangError;
use ps_json::scan;
use ps_json::{self as raw, Edit, Kind, Lax, RawObject};

/// How much of an unparsable body an error message quotes.
const SNIPPET_BYTES: usize = 80;

/// One `logprobs.content[]` entry: only its token text and log-prob are read; the rest (bytes, top
/// log-probs) is skipped without being built. An entry that is not an object reads as empty.
#[derive(Debug, Default)]
struct LogprobEntry {
    token: Option<String>,
    logprob: Option<f64>,
}

impl<'de> Deserialize<'de> for LogprobEntry {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LogprobEntry;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a log-prob entry")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut e = LogprobEntry::default();
                while let Some(key) = map.next_key::<raw::Key<'de>>()? {
                    match key.0.as_ref() {
                        "token" => e.token = map.next_value::<Lax<String>>()?.0,
                        "logprob" => e.logprob = map.next_value::<Lax<f64>>()?.0,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(e)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(LogprobEntry::default())
            }
            fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(LogprobEntry::default())
            }
            fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(LogprobEntry::default())
            }
            fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(LogprobEntry::default())
            }
            fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(LogprobEntry::default())
            }
            fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(LogprobEntry::default())
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
                Ok(LogprobEntry::default())
            }
        }
        d.deserialize_any(V)
    }
}

/// The object under `key` of `obj`, when it is one.
fn object<'a>(obj: &RawObject<'a>, key: &str) -> Option<RawObject<'a>> {
    RawObject::of(obj.get(key)?)
}

/// `logprobs` read in one pass: the entries of its `content` when that is an array (the last
/// `content` wins, as in a tree); anything else reads as no entries.
struct Logprobs(Option<Vec<LogprobEntry>>);

impl<'de> Deserialize<'de> for Logprobs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Content(Option<Vec<LogprobEntry>>);
        impl<'de> Deserialize<'de> for Content {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> Visitor<'de> for V {
                    type Value = Content;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str("any JSON value")
                    }
                    fn visit_seq<A: serde::de::SeqAccess<'de>>(
                        self,
                        mut seq: A,
                    ) -> Result<Self::Value, A::Error> {
                        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                        while let Some(e) = seq.next_element::<LogprobEntry>()? {
                            out.push(e);
                        }
                        Ok(Content(Some(out)))
                    }
                    fn visit_map<A: MapAccess<'de>>(
                        self,
                        mut map: A,
                    ) -> Result<Self::Value, A::Error> {
                        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                        Ok(Content(None))
                    }
                    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Self::Value, E> {
                        Ok(Content(None))
                    }
                    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Self::Value, E> {
                        Ok(Content(None))
                    }
                    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Self::Value, E> {
                        Ok(Content(None))
                    }
                    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Self::Value, E> {
                        Ok(Content(None))
                    }
                    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Self::Value, E> {
                        Ok(Content(None))
                    }
                    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
                        Ok(Content(None))
                    }
                }
                d.deserialize_any(V)
            }
        }
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Logprobs;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("log-probs")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut content = None;
                while let Some(key) = map.next_key::<raw::Key<'de>>()? {
                    if key.0 == "content" {
                        content = map.next_value::<Content>()?.0;
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(Logprobs(content))
            }
        }
        d.deserialize_map(V)
    }
}

/// Reads `logprobs.content[]` entries (the text of `logprobs`) into sampled tokens (entries
/// without a numeric log-prob are skipped: they carry nothing to align), in one pass without a
/// tree. An error is text a tree parse refuses (which the caller decides how to treat).
fn push_logprob_entries(
    logprobs: Option<&str>,
    out: &mut Vec<SampledToken>,
) -> serde_json::Result<()> {
    let Some(logprobs) = logprobs.filter(|l| Kind::of_text(l) == Kind::Object) else {
        return Ok(());
    };
    let Some(entries) = serde_json::from_str::<Logprobs>(logprobs)?.0 else {
        return Ok(());
    };
    out.reserve(entries.len());
    for e in entries {
        let Some(logprob) = e.logprob else {
            continue;
        };
        out.push(SampledToken {
            token: e.token.unwrap_or_default(),
            id: None,
            logprob,
        });
    }
    Ok(())
}

/// An object's entries as the text of their values: a [`RawObject`], or an object the answer's
/// single pass recorded.
trait Fields<'t> {
    fn field(&self, key: &str) -> Option<&'t str>;

    /// The object under `key`, when it is one.
    fn object(&self, key: &str) -> Option<RawObject<'t>> {
        let text = self.field(key)?;
        (Kind::of_text(text) == Kind::Object)
            .then(|| RawObject::parse(text).ok())
            .flatten()
    }
}

impl<'t> Fields<'t> for RawObject<'t> {
    fn field(&self, key: &str) -> Option<&'t str> {
        self.get(key).map(RawValue::get)
    }
}

/// An object of the answer, as the single pass recorded it.
#[derive(Clone, Copy)]
struct Scanned<'t> {
    bytes: &'t [u8],
    obj: &'t scan::Obj,
}

impl<'t> Fields<'t> for Scanned<'t> {
    fn field(&self, key: &str) -> Option<&'t str> {
        let node = self.obj.get(key)?;
        // The pass checked the whole answer as UTF-8; a part of it is too.
        std::str::from_utf8(self.bytes.get(node.span.clone())?).ok()
    }
}

/// `sglext.<key>` ids of the first choice: a flat list, or one list per choice.
fn sglext_ids(sglext: Option<&str>, key: &str) -> Option<Vec<u32>> {
    let sglext = sglext.filter(|s| Kind::of_text(s) == Kind::Object)?;
    let v = RawObject::parse(sglext).ok()?.get(key)?;
    match raw::array(v)?.first() {
        Some(first) if Kind::of(first) == Kind::Array => raw::as_ids(first),
        _ => raw::as_ids(v),
    }
}

/// The engine a choice (of an answer or a chunk) comes from, by a key only one engine writes: vLLM
/// always writes `stop_reason` (`null` unless a stop string or id matched), SGLang `matched_stop`.
fn engine_of_choice<'t>(choice: &impl Fields<'t>) -> Option<ps_core::Engine> {
    if choice.field("stop_reason").is_some() {
        Some(ps_core::Engine::Vllm)
    } else if choice.field("matched_stop").is_some() {
        Some(ps_core::Engine::Sglang)
    } else {
        None
    }
}

/// The engine's sampled ids, where each build puts them (docs/upstream-protocols.md, 1.5): SGLang after
/// its August 2026 rename `choices[].response_token_ids`, earlier SGLang and vLLM
/// `choices[].token_ids`, `sglext.output_ids` (per choice or response-level), and the ids of
/// `meta_info.output_token_logprobs` (`return_meta_info`). Returns the ids and the field's name.
fn response_ids<'t>(
    resp: &impl Fields<'t>,
    choice: &impl Fields<'t>,
) -> Option<(Vec<u32>, &'static str)> {
    if let Some(ids) = choice
        .field("response_token_ids")
        .and_then(raw::as_ids_text)
    {
        return Some((ids, "response_token_ids"));
    }
    if let Some(ids) = choice.field("token_ids").and_then(raw::as_ids_text) {
        return Some((ids, "token_ids"));
    }
    if let Some(ids) = sglext_ids(choice.field("sglext"), "output_ids")
        .or_else(|| sglext_ids(resp.field("sglext"), "output_ids"))
    {
        return Some((ids, "sglext.output_ids"));
    }
    let triples = raw::array(choice.object("meta_info")?.get("output_token_logprobs")?)?;
    let ids: Option<Vec<u32>> = triples
        .iter()
        .map(|t| {
            raw::array(t)?
                .get(1)
                .and_then(|id| raw::as_u64(id))
                .and_then(|n| u32::try_from(n).ok())
        })
        .collect();
    ids.map(|ids| (ids, "meta_info.output_token_logprobs"))
}

/// The engine's prompt ids: `choices[].prompt_token_ids` (SGLang), the response-level
/// `prompt_token_ids` (vLLM), or `sglext.input_ids`.
fn prompt_ids<'t>(resp: &impl Fields<'t>, choice: &impl Fields<'t>) -> Option<Vec<u32>> {
    choice
        .field("prompt_token_ids")
        .and_then(raw::as_ids_text)
        .or_else(|| resp.field("prompt_token_ids").and_then(raw::as_ids_text))
        .or_else(|| sglext_ids(choice.field("sglext"), "input_ids"))
        .or_else(|| sglext_ids(resp.field("sglext"), "input_ids"))
}

fn engine_ids_of<'t>(resp: &impl Fields<'t>, choice: &impl Fields<'t>) -> Option<EngineIds> {
    let (response, field) = response_ids(resp, choice)?;
    let prompt = prompt_ids(resp, choice)?;
    Some(EngineIds {
        prompt,
        response,
        field: field.to_owned(),
    })
}

/// Both the engine's prompt and response ids, when it returned both.
pub fn engine_ids(resp: &Value) -> Option<EngineIds> {
    Answer::with_value(resp, Answer::engine_ids).flatten()
}

/// The policy version of a non-streamed answer: `metadata.weight_version` (chat), or
/// `meta_info.weight_version` of the first choice. An error is a value a tree parse refuses.
fn weight_version<'t>(
    resp: &impl Fields<'t>,
    choice: &impl Fields<'t>,
) -> serde_json::Result<Option<String>> {
    let Some(v) = resp
        .object("metadata")
        .and_then(|m| m.get("weight_version"))
        .or_else(|| choice.object("meta_info")?.get("weight_version"))
    else {
        return Ok(None);
    };
    Ok(match serde_json::from_str::<Value>(v.get())? {
        Value::String(s) => Some(s),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    })
}

/// The finish reason and matched stop of a choice. An error is a value a tree parse refuses.
fn finish_of<'t>(choice: &impl Fields<'t>) -> serde_json::Result<FinishReason> {
    let reason = match choice.field("finish_reason") {
        Some(text) if Kind::of_text(text) == Kind::String => {
            Some(serde_json::from_str::<String>(text)?)
        }
        _ => None,
    };
    // SGLang's `matched_stop`, vLLM's `stop_reason` (`null` for the end-of-turn token, a stop
    // token's id, or a stop string).
    let matched_stop = match choice
        .field("matched_stop")
        .or_else(|| choice.field("stop_reason"))
    {
        Some(text) => serde_json::from_str(text)?,
        None => Value::Null,
    };
    Ok(FinishReason {
        reason,
        matched_stop,
    })
}

/// A non-streamed chat answer: its bytes (shared, not copied) and where its parts are, found in
/// one pass over them ([`Answer::parse`]): the top-level entries, the elements of `choices` and
/// each object choice's entries. The client's copy is written from the bytes
/// ([`Answer::write`]); the rollout (sampled tokens, log-probs, the engine's ids) is read from
/// them only when asked ([`Answer::rollout`], on a capture thread).
#[derive(Debug, Clone)]
pub struct Answer {
    bytes: Bytes,
    top: scan::Obj,
}

/// One element of `choices`: its text, and its entries when it is an object.
pub type Choice<'a> = (&'a RawValue, Option<RawObject<'a>>);

/// The elements of a raw `choices` value, each read as an object when it is one.
pub fn choices_of(choices: Option<&RawValue>) -> Option<Vec<Choice<'_>>> {
    let elems = raw::array(choices?)?;
    Some(elems.into_iter().map(|c| (c, RawObject::of(c))).collect())
}

impl Answer {
    /// Reads the upstream's answer body in one pass. Not JSON, or JSON but not an object: the error
    /// the proxy answers 502 with (`url` is the chat URL it came from). What that pass cannot decide
    /// alone (see [`scan`]) is decided by a tree parse, so that what a tree parse refuses is refused.
    pub fn parse(url: &str, body: Bytes) -> Result<Self, SglangError> {
        if std::str::from_utf8(&body).is_ok() {
            let tree_accepts = |b: &[u8]| serde_json::from_slice::<Value>(b).is_ok();
            let top = match scan::answer(&body, scan::DEPTH) {
                Ok((top, false)) => Some(top),
                Ok((top, true)) => tree_accepts(&body).then_some(top),
                // Accepted by the tree parse, the nesting is within its limit (128).
                Err(scan::Fail::Deep) if tree_accepts(&body) => {
                    scan::answer(&body, 2 * scan::DEPTH)
                        .ok()
                        .map(|(top, _)| top)
                }
                Err(_) => None,
            };
            if let Some(top) = top {
                return Ok(Self { bytes: body, top });
            }
        }
        // Not an object: the same errors as when the body was parsed into a tree.
        let detail = match serde_json::from_slice::<Value>(&body) {
            Err(e) => format!(
                "{e} (body starts with {:?})",
                ps_http::head(&body, SNIPPET_BYTES)
            ),
            Ok(_) => "the answer is not a JSON object".to_owned(),
        };
        Err(SglangError::InvalidBody {
            url: url.to_owned(),
            detail,
        })
    }

    /// Reads an answer's parts without refusing what only a tree parse refuses (a number out of
    /// range, a lone surrogate, deep nesting), for tests of what a rollout that cannot be read
    /// does. `None` when the pass itself refuses the body, or the body is not UTF-8 (a part that
    /// is not UTF-8 would otherwise read as absent).
    #[doc(hidden)]
    pub fn parse_unchecked(body: Bytes) -> Option<Self> {
        std::str::from_utf8(&body).ok()?;
        let (top, _) = scan::answer(&body, 2 * scan::DEPTH).ok()?;
        Some(Self { bytes: body, top })
    }

    /// The answer's bytes, as the upstream sent them.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    fn scanned<'t>(&'t self, obj: &'t scan::Obj) -> Scanned<'t> {
        Scanned {
            bytes: &self.bytes,
            obj,
        }
    }

    /// Whether the top-level object has `key`.
    pub fn contains_key(&self, key: &str) -> bool {
        self.top.get(key).is_some()
    }

    /// The first choice: `None` when `choices` is missing, not an array or empty; a choice that
    /// is not an object reads as an empty one (none of its fields exist).
    fn first_choice(&self) -> Option<Scanned<'_>> {
        let scan::Sub::Array(elems) = &self.top.get("choices")?.sub else {
            return None;
        };
        let obj = match &elems.first()?.sub {
            scan::Sub::Object(obj) => obj,
            _ => &scan::EMPTY,
        };
        Some(self.scanned(obj))
    }

    /// `choices[0].message`, when there is one.
    pub fn message(&self) -> Option<Value> {
        self.first_choice()?
            .field("message")
            .map(raw::to_value_text)
    }

    /// `choices[0].finish_reason`, when it is a string.
    pub fn finish_reason(&self) -> Option<String> {
        self.first_choice()?
            .field("finish_reason")
            .and_then(raw::as_str_text)
            .map(std::borrow::Cow::into_owned)
    }

    /// Both the engine's prompt and response ids, when it returned both.
    pub fn engine_ids(&self) -> Option<EngineIds> {
        engine_ids_of(&self.scanned(&self.top), &self.first_choice()?)
    }

    /// The engine whose answer this is, by the keys only one of them writes: vLLM's
    /// `choices[].stop_reason`, SGLang's `choices[].matched_stop`.
    pub fn engine(&self) -> Option<ps_core::Engine> {
        engine_of_choice(&self.first_choice()?)
    }

    /// The answer as a tree (for the rare paths that reshape it as one).
    /// The parse validated the answer as a tree parse would, so an error is not expected; the
    /// caller answers it as a body that is not the expected JSON, never as `null`.
    pub fn to_value(&self) -> serde_json::Result<Value> {
        serde_json::from_slice(&self.bytes)
    }

    /// Writes the answer: its top-level entries in order, `top` deciding per entry (key and value
    /// bytes) whether it is kept, left out or replaced, then the `append`ed entries. With
    /// `choice`, a `choices` array is written element by element, `choice` deciding for each entry
    /// of an object element (elements that are not objects are kept); without it, `choices` goes
    /// through `top` like any entry.
    pub fn write<'v>(
        &self,
        out: &mut Vec<u8>,
        mut top: impl FnMut(&str, &[u8]) -> Edit<'v>,
        mut choice: Option<impl FnMut(&str, &[u8]) -> Edit<'v>>,
        append: &[(&str, &[u8])],
    ) {
        let text = |n: &scan::Node| self.bytes.get(n.span.clone()).unwrap_or_default();
        out.push(b'{');
        let mut first = true;
        for (k, node) in self.top.entries() {
            let edit = match (&node.sub, choice.as_mut()) {
                (scan::Sub::Array(elems), Some(choice)) if k == "choices" => {
                    let mut b = Vec::with_capacity(node.span.len());
                    b.push(b'[');
                    for (i, elem) in elems.iter().enumerate() {
                        if i > 0 {
                            b.push(b',');
                        }
                        match &elem.sub {
                            scan::Sub::Object(obj) => {
                                write_entries(&mut b, obj, &self.bytes, &mut *choice, &[]);
                            }
                            _ => b.extend_from_slice(text(elem)),
                        }
                    }
                    b.push(b']');
                    Edit::Replace(b.into())
                }
                _ => top(k, text(node)),
            };
            push_entry(out, &mut first, k, text(node), edit);
        }
        for (k, v) in append {
            push_entry(out, &mut first, k, v, Edit::Replace((*v).into()));
        }
        out.push(b'}');
    }

    /// The answer of a non-streamed chat completion (first choice): the message, the sampled
    /// tokens with their log-probs, the engine's ids, the finish reason and the policy version,
    /// read from the bytes now. An error is a part that a tree parse refuses: [`Answer::parse`]
    /// refuses such answers, so it is not expected; the caller must not make a sample of it.
    pub fn rollout(&self) -> serde_json::Result<RolloutResponse> {
        let resp = self.scanned(&self.top);
        let Some(choice) = self.first_choice() else {
            return Ok(RolloutResponse::default());
        };
        let mut tokens = Vec::new();
        push_logprob_entries(choice.field("logprobs"), &mut tokens)?;
        let response = response_ids(&resp, &choice);
        if let Some((ids, _)) = &response {
            // Ids are only trusted when they cover the reported tokens one for one.
            if ids.len() == tokens.len() {
                for (t, id) in tokens.iter_mut().zip(ids) {
                    t.id = Some(*id);
                }
            }
        }
        let engine_ids = response.and_then(|(response, field)| {
            Some(EngineIds {
                prompt: prompt_ids(&resp, &choice)?,
                response,
                field: field.to_owned(),
            })
        });
        let mut message = match choice.field("message") {
            Some(text) => serde_json::from_str(text)?,
            None => Value::Null,
        };
        ps_core::message::reasoning_to_content_key(&mut message);
        let experts = crate::experts::from_sglext(resp.field("sglext"))
            .or_else(|| crate::experts::from_choice(choice.field("routed_experts")));
        let (routed_experts, routed_experts_error) = split(experts);
        Ok(RolloutResponse {
            routed_experts,
            routed_experts_encoded: None,
            routed_experts_error,
            message,
            tokens,
            finish: finish_of(&choice)?,
            streamed: false,
            engine_ids,
            weight_version: weight_version(&resp, &choice)?,
            unexplained_chars: 0,
            prompt_tokens: resp
                .object("usage")
                .and_then(|u| u.get("prompt_tokens"))
                .and_then(|v| v.get().parse().ok()),
        })
    }

    /// Reads a tree (an object; `None` otherwise) the same way, through its text.
    fn with_value<T>(resp: &Value, f: impl FnOnce(&Answer) -> T) -> Option<T> {
        if !resp.is_object() {
            return None;
        }
        let answer = Answer::parse("", Bytes::from(resp.to_string())).ok()?;
        Some(f(&answer))
    }
}

/// Writes one `"key":value` entry of an object being written, as `edit` says.
fn push_entry(out: &mut Vec<u8>, first: &mut bool, key: &str, value: &[u8], edit: Edit<'_>) {
    let bytes: std::borrow::Cow<'_, [u8]> = match edit {
        Edit::Keep => value.into(),
        Edit::Drop => return,
        Edit::Replace(b) => b,
    };
    if !std::mem::take(first) {
        out.push(b',');
    }
    // A string always serializes.
    let _ = serde_json::to_writer(&mut *out, key);
    out.push(b':');
    out.extend_from_slice(&bytes);
}

/// Writes an object the pass recorded, each entry through `edit`, then `append`.
fn write_entries<'v>(
    out: &mut Vec<u8>,
    obj: &scan::Obj,
    bytes: &[u8],
    edit: &mut impl FnMut(&str, &[u8]) -> Edit<'v>,
    append: &[(&str, &[u8])],
) {
    out.push(b'{');
    let mut first = true;
    for (k, node) in obj.entries() {
        let value = bytes.get(node.span.clone()).unwrap_or_default();
        let e = edit(k, value);
        push_entry(out, &mut first, k, value, e);
    }
    for (k, v) in append {
        push_entry(out, &mut first, k, v, Edit::Replace((*v).into()));
    }
    out.push(b'}');
}

/// The answer of a non-streamed chat completion (first choice), from a tree.
pub fn rollout_from_response(resp: &Value) -> RolloutResponse {
    Answer::with_value(resp, |a| a.rollout().unwrap_or_default()).unwrap_or_default()
}

#[derive(Debug, Default)]
struct ToolCallAcc {
    id: Option<String>,
    kind: Option<String>,
    name: String,
    arguments: String,
}

/// Accumulates the chunks of a streamed chat completion (first choice).
#[derive(Debug, Default)]
pub struct StreamAssembler {
    content: String,
    reasoning: Option<String>,
    tool_calls: Vec<(u64, ToolCallAcc)>,
    tokens: Vec<SampledToken>,
    finish: FinishReason,
    chunks: usize,
    /// Chunks with answer text but no log-probs.
    /// Characters of answer text received, and of the reported tokens' texts.
    text_chars: usize,
    token_chars: usize,
    /// Streamed routed experts, undecoded (SGLang: `sglext` of the final `choices: []` chunk;
    /// `None` inside: not a string).
    experts: Option<Option<String>>,
    /// Streamed `sglext` ids (a final `choices: []` chunk before `[DONE]`).
    sglext_prompt: Option<Vec<u32>>,
    sglext_response: Option<Vec<u32>>,
    /// vLLM's streamed ids (`return_token_ids`): the prompt's on the first chunk (response level),
    /// each chunk's sampled ids on its choice (`token_ids`), gathered in order.
    stream_prompt: Option<Vec<u32>>,
    stream_response: Option<Vec<u32>>,
    /// A chunk's ids and log-probs did not pair one for one (ids without their log-probs, or
    /// log-probs without their ids once ids were coming): the streamed ids cannot be trusted to sit
    /// beside the right log-probs, so none are used.
    stream_ids_unpaired: bool,
    /// The engine the chunks' shape shows, once one did.
    engine: Option<ps_core::Engine>,
    /// `usage.prompt_tokens` of a usage chunk.
    prompt_tokens: Option<u64>,
}

impl StreamAssembler {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one chunk's `data:` payload. Returns an error message when the payload is not JSON or is
    /// an upstream error event; the stream is then not usable for training.
    pub fn feed_str(&mut self, data: &str) -> Result<(), String> {
        match RawObject::parse(data) {
            Ok(chunk) if !raw::needs_tree_check(data.as_bytes()) => self.feed_checked_raw(&chunk),
            _ => {
                // Not an object: not JSON (the error), or JSON of another type (nothing to read).
                let chunk: Value =
                    serde_json::from_str(data).map_err(|e| format!("chunk is not JSON: {e}"))?;
                self.feed_checked(&chunk)
            }
        }
    }

    /// Feeds one parsed chunk; an upstream error event is returned as an error message.
    pub fn feed_checked(&mut self, chunk: &Value) -> Result<(), String> {
        match Self::raw_of(chunk) {
            Some(text) => match RawObject::parse(&text) {
                Ok(raw) => self.feed_checked_raw(&raw),
                Err(_) => Ok(()),
            },
            None => {
                self.chunks += 1;
                Ok(())
            }
        }
    }

    /// Feeds one chunk read as a raw object; an upstream error event is returned as an error
    /// message.
    pub fn feed_checked_raw(&mut self, chunk: &RawObject<'_>) -> Result<(), String> {
        if let Some(err) = chunk.get("error") {
            let message = RawObject::of(err)
                .and_then(|e| e.get("message"))
                .and_then(raw::as_str)
                .map_or_else(|| raw::to_value(err).to_string(), |m| m.into_owned());
            return Err(message);
        }
        self.feed_raw(chunk);
        Ok(())
    }

    /// Feeds one parsed chunk.
    pub fn feed(&mut self, chunk: &Value) {
        match Self::raw_of(chunk) {
            Some(text) => {
                if let Ok(raw) = RawObject::parse(&text) {
                    self.feed_raw(&raw);
                }
            }
            None => self.chunks += 1,
        }
    }

    /// The text of a chunk that is an object.
    fn raw_of(chunk: &Value) -> Option<String> {
        chunk.is_object().then(|| chunk.to_string())
    }

    /// Feeds one chunk read as a raw object.
    pub fn feed_raw(&mut self, chunk: &RawObject<'_>) {
        self.chunks += 1;
        let sglext = chunk.get("sglext").map(RawValue::get);
        // Kept as text: decoding megabytes is the capture thread's work, not the chat path's.
        if let Some(experts) = crate::experts::encoded_in_sglext(sglext) {
            self.experts = Some(experts);
        }
        if let Some(ids) = sglext_ids(sglext, "output_ids") {
            self.sglext_response = Some(ids);
        }
        if let Some(ids) = sglext_ids(sglext, "input_ids") {
            self.sglext_prompt = Some(ids);
        }
        if let Some(ids) = chunk.get("prompt_token_ids").and_then(raw::as_ids) {
            self.stream_prompt = Some(ids);
        }
        if let Some(n) = chunk
            .get("usage")
            .and_then(RawObject::of)
            .and_then(|u| u.get("prompt_tokens").and_then(raw::as_u64))
        {
            self.prompt_tokens = Some(n);
        }
        let Some(choice) = chunk.get("choices").and_then(raw::array).and_then(|cs| {
            cs.iter().find_map(|c| {
                // A choice that is not an object counts as choice 0 (it has no `index`).
                let c = RawObject::of(c).unwrap_or_default();
                let index = c.get("index").and_then(raw::as_u64).unwrap_or(0);
                (index == 0).then_some(c)
            })
        }) else {
            return; // usage chunk or another choice
        };
        if let Some(ids) = sglext_ids(choice.field("sglext"), "output_ids") {
            self.sglext_response = Some(ids);
        }
        if self.engine.is_none() {
            self.engine = engine_of_choice(&choice);
        }
        let chunk_ids = choice.get("token_ids").and_then(raw::as_ids);
        if choice.contains_key("delta") {
            let delta = object(&choice, "delta").unwrap_or_default();
            let content = delta.get("content").and_then(raw::as_str);
            // SGLang's `reasoning_content`, vLLM's `reasoning` (one or the other per build).
            let reasoning = delta
                .get("reasoning_content")
                .and_then(raw::as_str)
                .or_else(|| delta.get("reasoning").and_then(raw::as_str));
            let calls = delta
                .get("tool_calls")
                .and_then(raw::array)
                .unwrap_or_default();
            let calls: Vec<RawObject<'_>> = calls
                .iter()
                .map(|c| RawObject::of(c).unwrap_or_default())
                .collect();
            for s in [&content, &reasoning].into_iter().flatten() {
                self.text_chars += s.chars().count();
            }
            for call in &calls {
                if let Some(a) = object(call, "function")
                    .and_then(|f| f.get("arguments"))
                    .and_then(raw::as_str)
                {
                    self.text_chars += a.chars().count();
                }
            }
            if let Some(s) = content {
                self.content.push_str(&s);
            }
            if let Some(s) = reasoning {
                self.reasoning.get_or_insert_with(String::new).push_str(&s);
            }
            for call in &calls {
                self.feed_tool_call(call);
            }
        }
        let before = self.tokens.len();
        // A chunk a tree parse refuses was not read raw: no error here.
        let _ = push_logprob_entries(choice.field("logprobs"), &mut self.tokens);
        // vLLM sends each chunk's sampled ids beside that chunk's log-probs: they are paired chunk
        // by chunk, not only counted at the end.
        let logprobs_here = self.tokens.len() - before;
        match chunk_ids {
            Some(ids) => {
                // Log-probs that came before any id have no id beside them.
                let unpaired_before = self.stream_response.is_none() && before > 0;
                if ids.len() != logprobs_here || unpaired_before {
                    self.stream_ids_unpaired = true;
                }
                self.stream_response
                    .get_or_insert_with(Vec::new)
                    .extend_from_slice(&ids);
            }
            None if logprobs_here > 0 && self.stream_response.is_some() => {
                self.stream_ids_unpaired = true;
            }
            None => {}
        }
        self.token_chars += self.tokens[before..]
            .iter()
            .map(|t| t.token.chars().count())
            .sum::<usize>();
        if let Some(reason) = choice.get("finish_reason").and_then(raw::as_str) {
            self.finish.reason = Some(reason.into_owned());
            self.finish.matched_stop = choice
                .get("matched_stop")
                .or_else(|| choice.get("stop_reason"))
                .map_or(Value::Null, raw::to_value);
        }
    }

    fn feed_tool_call(&mut self, call: &RawObject<'_>) {
        let index = call.get("index").and_then(raw::as_u64).unwrap_or(0);
        let pos = match self.tool_calls.iter().position(|(i, _)| *i == index) {
            Some(p) => p,
            None => {
                self.tool_calls.push((index, ToolCallAcc::default()));
                self.tool_calls.len() - 1
            }
        };
        let acc = &mut self.tool_calls[pos].1;
        if let Some(id) = call.get("id").and_then(raw::as_str) {
            acc.id = Some(id.into_owned());
        }
        if let Some(t) = call.get("type").and_then(raw::as_str) {
            acc.kind = Some(t.into_owned());
        }
        if let Some(f) = object(call, "function") {
            if let Some(n) = f.get("name").and_then(raw::as_str) {
                acc.name.push_str(&n);
            }
            if let Some(a) = f.get("arguments").and_then(raw::as_str) {
                acc.arguments.push_str(&a);
            }
        }
    }

    /// The engine the chunks came from, when their shape showed it ([`Answer::engine`]).
    pub fn engine(&self) -> Option<ps_core::Engine> {
        self.engine
    }

    /// Whether a finish reason arrived.
    pub fn finished(&self) -> bool {
        self.finish.reason.is_some()
    }

    /// The assembled answer.
    pub fn finish(self) -> RolloutResponse {
        let mut message = Map::new();
        message.insert("role".into(), json!("assistant"));
        message.insert("content".into(), Value::String(self.content));
        message.insert(
            "reasoning_content".into(),
            self.reasoning.map_or(Value::Null, Value::String),
        );
        let calls: Vec<Value> = self
            .tool_calls
            .into_iter()
            .map(|(index, c)| {
                json!({
                    "id": c.id,
                    "index": index,
                    "type": c.kind.unwrap_or_else(|| "function".into()),
                    "function": {"name": c.name, "arguments": c.arguments},
                })
            })
            .collect();
        message.insert(
            "tool_calls".into(),
            if calls.is_empty() {
                Value::Null
            } else {
                Value::Array(calls)
            },
        );
        let engine_ids = match (
            self.sglext_prompt,
            self.sglext_response,
            self.stream_prompt,
            self.stream_response,
        ) {
            (Some(prompt), Some(response), _, _) => Some(EngineIds {
                prompt,
                response,
                field: "sglext.output_ids".into(),
            }),
            (_, _, Some(prompt), Some(response)) if !self.stream_ids_unpaired => Some(EngineIds {
                prompt,
                response,
                field: "token_ids".into(),
            }),
            _ => None,
        };
        let (routed_experts_encoded, routed_experts_error) = match self.experts {
            Some(Some(text)) => (Some(text), None),
            Some(None) => (
                None,
                Some(format!("{} is not a string", crate::experts::SGLANG_FIELD)),
            ),
            None => (None, None),
        };
        RolloutResponse {
            routed_experts: None,
            routed_experts_encoded,
            routed_experts_error,
            message: Value::Object(message),
            tokens: self.tokens,
            finish: self.finish,
            streamed: true,
            engine_ids,
            weight_version: None,
            unexplained_chars: self.text_chars.saturating_sub(self.token_chars),
            prompt_tokens: self.prompt_tokens,
        }
    }
}

/// Chunks for a client that asked for a stream when the upstream was called without one
/// (`sglang.stream = false`): a delta with the whole message (and its log-probs), then a delta with the
/// finish reason (and usage). The caller adds `data: [DONE]`.
pub fn synthesize_chunks(resp: &Value) -> Vec<Value> {
    let choice = resp
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .cloned()
        .unwrap_or(Value::Null);
    let message = choice.get("message").cloned().unwrap_or(Value::Null);
    let mut delta = Map::new();
    delta.insert("role".into(), json!("assistant"));
    delta.insert(
        "content".into(),
        message.get("content").cloned().unwrap_or(Value::Null),
    );
    for key in ["reasoning_content", "reasoning", "tool_calls"] {
        if let Some(v) = message.get(key).filter(|v| !v.is_null()) {
            delta.insert(key.into(), v.clone());
        }
    }
    let head = |choices: Value| {
        let mut c = Map::new();
        for key in ["id", "created", "model"] {
            if let Some(v) = resp.get(key) {
                c.insert(key.into(), v.clone());
            }
        }
        c.insert("object".into(), json!("chat.completion.chunk"));
        c.insert("choices".into(), choices);
        c
    };
    let first = head(json!([{
        "index": 0,
        "delta": delta,
        "logprobs": choice.get("logprobs").cloned().unwrap_or(Value::Null),
        "finish_reason": null,
    }]));
    let mut last = head(json!([{
        "index": 0,
        "delta": {},
        "logprobs": null,
        "finish_reason": choice.get("finish_reason").cloned().unwrap_or(Value::Null),
        "matched_stop": choice.get("matched_stop").cloned().unwrap_or(Value::Null),
    }]));
    if let Some(u) = resp.get("usage") {
        last.insert("usage".into(), u.clone());
    }
    vec![Value::Object(first), Value::Object(last)]
}

/// Experts read, or why they could not be.
fn split(
    experts: Option<Result<ps_core::EngineExperts, String>>,
) -> (Option<ps_core::EngineExperts>, Option<String>) {
    match experts {
        Some(Ok(e)) => (Some(e), None),
        Some(Err(e)) => (None, Some(e)),
        None => (None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lp(token: &str, logprob: f64) -> Value {
        json!({"token": token, "bytes": token.as_bytes(), "logprob": logprob, "top_logprobs": []})
    }

    #[test]
    fn non_streamed_answer_with_token_ids() {
        let resp = json!({"choices": [{"index": 0,
            "message": {"role": "assistant", "content": "Hi", "reasoning_content": null, "tool_calls": null},
            "logprobs": {"content": [lp("Hi", -0.5), lp("<|im_end|>", -0.1)]},
            "finish_reason": "stop", "matched_stop": 151645, "token_ids": [13048, 151645]}]});
        let r = rollout_from_response(&resp);
        assert_eq!(r.tokens.len(), 2);
        assert_eq!(r.tokens[0].id, Some(13048));
        assert_eq!(r.tokens[1].logprob, -0.1);
        assert_eq!(r.finish.reason.as_deref(), Some("stop"));
        assert_eq!(r.finish.matched_stop, json!(151645));
        assert_eq!(r.message["content"], "Hi");
        assert!(!r.streamed);
    }

    #[test]
    fn ids_of_another_length_are_ignored() {
        let resp = json!({"choices": [{"message": {"content": "Hi"},
            "logprobs": {"content": [lp("Hi", -0.5)]}, "token_ids": [1, 2]}]});
        let r = rollout_from_response(&resp);
        assert_eq!(r.tokens[0].id, None);
    }

    #[test]
    fn meta_info_ids_are_used() {
        let resp = json!({"choices": [{"message": {"content": "Hi"},
            "logprobs": {"content": [lp("Hi", -0.5)]},
            "meta_info": {"output_token_logprobs": [[-0.5, 77, null]]}}]});
        assert_eq!(rollout_from_response(&resp).tokens[0].id, Some(77));
    }

    #[test]
    fn stream_chunks_assemble_content_reasoning_tools_and_logprobs() {
        let mut a = StreamAssembler::new();
        let chunks = [
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]}),
            json!({"choices": [{"index": 0, "delta": {"reasoning_content": "think"}, "logprobs": {"content": [lp("think", -0.2)]}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": "Hel"}, "logprobs": {"content": [lp("Hel", -0.3)]}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": "lo", "reasoning_content": null}, "logprobs": {"content": [lp("lo", -0.4)]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "get", "arguments": ""}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": null, "type": "function", "function": {"name": null, "arguments": "{\"a\": 1}"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {}, "logprobs": null, "finish_reason": "tool_calls", "matched_stop": null}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 1}}),
        ];
        for c in &chunks {
            a.feed_str(&c.to_string()).expect("valid chunk");
        }
        assert!(a.finished());
        let r = a.finish();
        assert!(r.streamed);
        assert_eq!(r.message["content"], "Hello");
        assert_eq!(r.message["reasoning_content"], "think");
        assert_eq!(
            r.message["tool_calls"],
            json!([{"id": "call_1", "index": 0, "type": "function", "function": {"name": "get", "arguments": "{\"a\": 1}"}}])
        );
        let toks: Vec<_> = r.tokens.iter().map(|t| t.token.as_str()).collect();
        assert_eq!(toks, ["think", "Hel", "lo"]);
        assert_eq!(r.finish.reason.as_deref(), Some("tool_calls"));
    }

    #[test]
    fn error_event_and_garbage_are_reported() {
        let mut a = StreamAssembler::new();
        let e = a
            .feed_str(r#"{"error": {"object": "error", "message": "boom", "code": 400}}"#)
            .expect_err("error event");
        assert_eq!(e, "boom");
        assert!(a.feed_str("not json").is_err());
        assert!(!a.finished());
    }

    #[test]
    fn synthesized_chunks_carry_message_and_finish() {
        let resp = json!({"id": "x", "created": 1, "model": "m", "choices": [{"index": 0,
            "message": {"role": "assistant", "content": "Hi", "reasoning_content": null, "tool_calls": null},
            "logprobs": {"content": [lp("Hi", -0.5)]}, "finish_reason": "stop", "matched_stop": 2}],
            "usage": {"prompt_tokens": 3}});
        let chunks = synthesize_chunks(&resp);
        assert_eq!(chunks.len(), 2);
        assert_eq!(
            chunks[0]["choices"][0]["delta"],
            json!({"role": "assistant", "content": "Hi"})
        );
        assert_eq!(chunks[1]["choices"][0]["finish_reason"], "stop");
        assert_eq!(chunks[1]["usage"]["prompt_tokens"], 3);
        // Re-assembling the synthesized chunks gives the same answer back.
        let mut a = StreamAssembler::new();
        for c in &chunks {
            a.feed(c);
        }
        let r = a.finish();
        assert_eq!(r.message["content"], "Hi");
        assert_eq!(r.tokens.len(), 1);
    }

    fn answer_with(choice_extra: Value, top_extra: Value) -> Value {
        let mut choice = json!({
            "index": 0,
            "message": {"role": "assistant", "content": "Hi"},
            "logprobs": {"content": [lp("Hi", -0.1), lp("<|im_end|>", -0.2)]},
            "finish_reason": "stop",
            "matched_stop": 2,
        });
        for (k, v) in choice_extra.as_object().cloned().unwrap_or_default() {
            choice[k] = v;
        }
        let mut resp = json!({"choices": [choice]});
        for (k, v) in top_extra.as_object().cloned().unwrap_or_default() {
            resp[k] = v;
        }
        resp
    }

    /// Every place a build puts its ids is read, in the documented order of preference.
    #[test]
    fn engine_ids_are_read_from_each_builds_field() {
        let cases = [
            // SGLang after the August 2026 rename
            (
                json!({"prompt_token_ids": [1, 2], "response_token_ids": [7, 9]}),
                json!({}),
                "response_token_ids",
            ),
            // SGLang between the two PRs
            (
                json!({"prompt_token_ids": [1, 2], "token_ids": [7, 9]}),
                json!({}),
                "token_ids",
            ),
            // vLLM: prompt ids at the response level
            (
                json!({"token_ids": [7, 9]}),
                json!({"prompt_token_ids": [1, 2]}),
                "token_ids",
            ),
            // sglext, response-level, one list per choice
            (
                json!({}),
                json!({"sglext": {"input_ids": [1, 2], "output_ids": [[7, 9]]}}),
                "sglext.output_ids",
            ),
            // the renamed field wins over a stale one
            (
                json!({"prompt_token_ids": [1, 2], "response_token_ids": [7, 9], "token_ids": [5]}),
                json!({}),
                "response_token_ids",
            ),
        ];
        for (choice, top, field) in cases {
            let r = rollout_from_response(&answer_with(choice.clone(), top.clone()));
            let ids = r
                .engine_ids
                .unwrap_or_else(|| panic!("no ids from {choice} {top}"));
            assert_eq!((ids.prompt, ids.response), (vec![1, 2], vec![7, 9]));
            assert_eq!(ids.field, field);
            assert_eq!(r.tokens[1].id, Some(9), "ids attached to the log-probs");
        }
        // Response ids without prompt ids are not engine ids (the sample needs both).
        let r = rollout_from_response(&answer_with(json!({"token_ids": [7, 9]}), json!({})));
        assert!(r.engine_ids.is_none());
        assert_eq!(r.tokens[0].id, Some(7));
        assert!(
            rollout_from_response(&answer_with(json!({}), json!({})))
                .engine_ids
                .is_none()
        );
    }

    #[test]
    fn the_weight_version_is_read_from_metadata() {
        let r = rollout_from_response(&answer_with(
            json!({}),
            json!({"metadata": {"weight_version": "v7"}}),
        ));
        assert_eq!(r.weight_version.as_deref(), Some("v7"));
        let r = rollout_from_response(&answer_with(
            json!({}),
            json!({"metadata": {"weight_version": 3}}),
        ));
        assert_eq!(r.weight_version.as_deref(), Some("3"));
        assert!(
            rollout_from_response(&answer_with(json!({}), json!({})))
                .weight_version
                .is_none()
        );
    }

    /// Builds with a parser before mid-2026 send reasoning and tool-call chunks with
    /// `logprobs: null`: those sampled tokens are unexplained, and counted.
    #[test]
    fn text_that_no_reported_token_explains_is_counted() {
        let mut a = StreamAssembler::new();
        a.feed(&json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null}]}));
        a.feed(&json!({"choices": [{"index": 0, "delta": {"reasoning_content": "thinking hard"}, "logprobs": null}]}));
        a.feed(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}, "logprobs": null}]}));
        a.feed(&json!({"choices": [{"index": 0, "delta": {"content": "Hi"}, "logprobs": {"content": [lp("Hi", -0.1)]}}]}));
        a.feed(&json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "matched_stop": 2}]}));
        let r = a.finish();
        assert_eq!(r.unexplained_chars, "thinking hard{}".len());
        assert_eq!(r.tokens.len(), 1);
        // Builds after mid-2026: a later chunk of the same step carries text without log-probs
        // (the step's log-probs rode on its first chunk), and a standalone chunk with an empty
        // delta carries a step that emitted no text: nothing is unexplained.
        let mut a = StreamAssembler::new();
        a.feed(&json!({"choices": [{"index": 0, "delta": {"content": "He"}, "logprobs": {"content": [lp("Hello", -0.1)]}}]}));
        a.feed(&json!({"choices": [{"index": 0, "delta": {"content": "llo"}, "logprobs": null}]}));
        a.feed(&json!({"choices": [{"index": 0, "delta": {}, "logprobs": {"content": [lp("<|im_end|>", -0.2)]}}]}));
        let r = a.finish();
        assert_eq!((r.unexplained_chars, r.tokens.len()), (0, 2));
    }

    /// Streamed `sglext` ids arrive in a final `choices: []` chunk.
    #[test]
    fn streamed_sglext_ids_are_engine_ids() {
        let mut a = StreamAssembler::new();
        a.feed(&json!({"choices": [{"index": 0, "delta": {"content": "Hi"}, "logprobs": {"content": [lp("Hi", -0.1), lp("!", -0.3)]}}]}));
        a.feed(&json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}));
        a.feed(&json!({"choices": [], "sglext": {"input_ids": [1, 2, 3], "output_ids": [[5, 6]]}}));
        let ids = a.finish().engine_ids.expect("ids");
        assert_eq!((ids.prompt, ids.response), (vec![1, 2, 3], vec![5, 6]));
    }

    /// vLLM's streamed ids are paired with the log-probs of their own chunk: a chunk whose ids and
    /// log-probs differ in number, or log-probs without ids once ids came (or before), makes the
    /// streamed ids unusable even when the totals agree (every later position would get its
    /// neighbour's log-prob).
    #[test]
    fn streamed_vllm_ids_pair_chunk_by_chunk() {
        let first = json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
            "prompt_token_ids": [1, 2]});
        let chunk = |text: &str, ids: Value, lps: Value| json!({"choices": [{"index": 0, "delta": {"content": text}, "logprobs": lps, "token_ids": ids}]});
        let last = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "length", "stop_reason": null, "token_ids": []}]});
        let run = |chunks: &[Value]| {
            let mut a = StreamAssembler::new();
            a.feed(&first);
            for c in chunks {
                a.feed(c);
            }
            a.feed(&last);
            a.finish().engine_ids
        };
        let paired = run(&[
            chunk("A", json!([7]), json!({"content": [lp("A", -0.1)]})),
            chunk("B", json!([8]), json!({"content": [lp("B", -0.2)]})),
        ]);
        assert_eq!(paired.map(|e| e.response), Some(vec![7, 8]));
        // The same totals, shifted by a chunk: ids without log-probs, then log-probs without ids.
        let shifted = run(&[
            chunk("A", json!([7]), Value::Null),
            chunk("B", json!([8]), json!({"content": [lp("A", -0.1)]})),
            chunk("", Value::Null, json!({"content": [lp("B", -0.2)]})),
        ]);
        assert_eq!(shifted, None);
        // Log-probs before the first ids.
        let late = run(&[
            chunk("A", Value::Null, json!({"content": [lp("A", -0.1)]})),
            chunk("B", json!([7, 8]), json!({"content": [lp("B", -0.2)]})),
        ]);
        assert_eq!(late, None);
    }
}
