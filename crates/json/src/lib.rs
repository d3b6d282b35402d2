//! JSON read without building a `serde_json::Value` tree: an object as its ordered entries, each
//! value kept as the raw text it arrived as (`&RawValue`, borrowed from the input), and the few
//! lenient readers the answer and the request need. Re-emitting an object writes its entries' raw
//! bytes back, so an answer is passed on with some fields removed or replaced without parsing the
//! rest of it (one object per sampled token) into a tree.
//!
//! One reader for the whole workspace: the server reads a client's request with it, the upstream
//! client the engine's answer ([`scan`]: one pass over a non-streamed answer).
//!
//! The semantics follow `serde_json::Map` with `preserve_order`, as the tree code did: a repeated
//! key keeps its first position and its last value; lookups of a key that is absent give `None`,
//! and a key whose value is `null` is present (its value is the raw `null`).

pub mod scan;

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// The JSON type of a raw value, from its first byte (raw values carry no surrounding whitespace).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

impl Kind {
    pub fn of(raw: &RawValue) -> Self {
        Self::of_text(raw.get())
    }

    /// The type of a value's text (valid JSON without surrounding whitespace).
    pub fn of_text(text: &str) -> Self {
        match text.as_bytes().first() {
            Some(b'{') => Self::Object,
            Some(b'[') => Self::Array,
            Some(b'"') => Self::String,
            Some(b't' | b'f') => Self::Bool,
            Some(b'n') => Self::Null,
            _ => Self::Number,
        }
    }

    /// As an error message names it ("a string", "an array", …).
    pub fn name(self) -> &'static str {
        match self {
            Self::Null => "null",
            Self::Bool => "a boolean",
            Self::Number => "a number",
            Self::String => "a string",
            Self::Array => "an array",
            Self::Object => "an object",
        }
    }
}

/// An object's entries in the order `serde_json::Map` with `preserve_order` keeps them: a repeated
/// key keeps its first place and takes its last value. Keys are found by a linear search while
/// there are few (faster for the few keys objects usually have) and through a hash index from
/// [`INDEX_FROM`] on (so that many keys stay linear overall). Shared by [`RawObject`] and the
/// answer's single pass (`scan::Obj`).
#[derive(Debug, Clone)]
pub(crate) struct Keyed<K, V> {
    entries: Vec<(K, V)>,
    index: Option<HashMap<K, usize>>,
}

/// From this many entries on, keys are found through a hash index.
const INDEX_FROM: usize = 16;

impl<K, V> Keyed<K, V> {
    /// No entries.
    pub(crate) const fn new() -> Self {
        Self {
            entries: Vec::new(),
            index: None,
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &(K, V)> {
        self.entries.iter()
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn into_iter(self) -> impl Iterator<Item = (K, V)> {
        self.entries.into_iter()
    }
}

impl<K, V> Default for Keyed<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: std::borrow::Borrow<str> + std::hash::Hash + Eq + Clone, V> Keyed<K, V> {
    pub(crate) fn insert(&mut self, key: K, value: V) {
        if let Some(i) = self.position(key.borrow()) {
            self.entries[i].1 = value;
            return;
        }
        if let Some(index) = self.index.as_mut() {
            index.insert(key.clone(), self.entries.len());
        }
        self.entries.push((key, value));
        if self.index.is_none() && self.entries.len() > INDEX_FROM {
            self.index = Some(
                self.entries
                    .iter()
                    .enumerate()
                    .map(|(i, (k, _))| (k.clone(), i))
                    .collect(),
            );
        }
    }

    fn position(&self, key: &str) -> Option<usize> {
        match &self.index {
            Some(index) => index.get(key).copied(),
            None => self.entries.iter().position(|(k, _)| k.borrow() == key),
        }
    }

    pub(crate) fn get(&self, key: &str) -> Option<&V> {
        self.position(key).map(|i| &self.entries[i].1)
    }
}

/// A JSON object as its entries in order, values unparsed.
#[derive(Debug, Clone, Default)]
pub struct RawObject<'a> {
    entries: Keyed<Cow<'a, str>, &'a RawValue>,
}

impl<'a> RawObject<'a> {
    /// Reads `raw` as an object; `None` when it is another JSON type.
    pub fn of(raw: &'a RawValue) -> Option<Self> {
        if Kind::of(raw) != Kind::Object {
            return None;
        }
        serde_json::from_str(raw.get()).ok()
    }

    /// Parses a whole document that must be an object.
    pub fn parse(text: &'a str) -> serde_json::Result<Self> {
        serde_json::from_str(text)
    }

    /// An object of these entries (a repeated key keeps its first place and its last value).
    pub fn from_entries(entries: impl IntoIterator<Item = (Cow<'a, str>, &'a RawValue)>) -> Self {
        let mut obj = Self::default();
        for (k, v) in entries {
            obj.insert(k, v);
        }
        obj
    }

    fn insert(&mut self, key: Cow<'a, str>, value: &'a RawValue) {
        self.entries.insert(key, value);
    }

    pub fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.entries.get(key).copied()
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    pub fn entries(&self) -> impl Iterator<Item = (&str, &'a RawValue)> {
        self.entries.iter().map(|(k, v)| (k.as_ref(), *v))
    }

    /// The entries, by value: keys keep their borrow of the text (or their unescaped copy).
    pub fn into_entries(self) -> impl Iterator<Item = (Cow<'a, str>, &'a RawValue)> {
        self.entries.into_iter()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.len() == 0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for RawObject<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = RawObject<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut obj = RawObject::default();
                while let Some(key) = map.next_key::<Key<'de>>()? {
                    let value: &'de RawValue = map.next_value()?;
                    obj.insert(key.0, value);
                }
                Ok(obj)
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// An object key, borrowed unless it had escapes.
pub struct Key<'a>(pub Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// Whether `text` nests deeper than 100 levels, holds a `\u` escape of a UTF-16 surrogate or a
/// number that may be out of range: the raw reading skips values without building them, and so
/// would accept what a tree parse refuses (serde_json's recursion limit, lone surrogates, `1e400`).
/// Such text must be checked by a tree parse; the scan itself is one pass over the bytes.
///
/// A number may be out of range when its exponent has three digits or more, or it has more than
/// 200 characters (a long run of digits); everything else is within an `f64`'s range. The check is
/// conservative: `1e100` with leading zeros in the exponent is sent to the tree parse, which accepts it.
/// Inside strings it jumps from one quote or backslash to the next (`memchr2`).
pub fn needs_tree_check(text: &[u8]) -> bool {
    let (mut depth, mut in_str, mut i) = (0usize, false, 0usize);
    // Outside strings: the start of the current number, and where its exponent's digits start.
    let (mut num_start, mut exp_start): (Option<usize>, Option<usize>) = (None, None);
    while let Some(&b) = text.get(i) {
        if in_str {
            // Inside a string only a quote or an escape matters: jump to the next one.
            let Some(n) = memchr::memchr2(b'"', b'\\', &text[i..]) else {
                break;
            };
            i += n;
            if text[i] == b'"' {
                in_str = false;
                i += 1;
                continue;
            }
            match surrogate_at(text, i) {
                // A high surrogate directly followed by a low one is a valid pair (an emoji
                // from an `ensure_ascii` client): nothing for the tree to refuse.
                Some(Surrogate::High) if surrogate_at(text, i + 6) == Some(Surrogate::Low) => {
                    i += 12;
                }
                Some(_) => return true,
                None => i += 2,
            }
            continue;
        }
        match (num_start, b) {
            (None, b'-' | b'0'..=b'9') => num_start = Some(i),
            (Some(_), b'e' | b'E') => exp_start = Some(i + 1),
            (Some(_), b'+' | b'-') if exp_start == Some(i) => exp_start = Some(i + 1),
            (Some(_), b'0'..=b'9' | b'.') => {}
            (Some(start), _) => {
                if number_may_overflow(start, exp_start, i) {
                    return true;
                }
                (num_start, exp_start) = (None, None);
            }
            (None, _) => {}
        }
        match b {
            b'"' => in_str = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > 100 {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    num_start.is_some_and(|start| number_may_overflow(start, exp_start, text.len()))
}

#[derive(Clone, Copy, PartialEq)]
enum Surrogate {
    High,
    Low,
}

/// The surrogate escape (`\uD800`–`\uDBFF` high, `\uDC00`–`\uDFFF` low) starting at `i`, if any.
fn surrogate_at(text: &[u8], i: usize) -> Option<Surrogate> {
    if text.get(i) != Some(&b'\\')
        || text.get(i + 1) != Some(&b'u')
        || !matches!(text.get(i + 2), Some(b'd' | b'D'))
    {
        return None;
    }
    match text.get(i + 3) {
        Some(b'8'..=b'9' | b'a' | b'b' | b'A' | b'B') => Some(Surrogate::High),
        Some(b'c'..=b'f' | b'C'..=b'F') => Some(Surrogate::Low),
        _ => None,
    }
}

fn number_may_overflow(start: usize, exp_start: Option<usize>, end: usize) -> bool {
    end - start > 200 || exp_start.is_some_and(|e| end.saturating_sub(e) >= 3)
}

/// The elements of a raw array; `None` when it is another JSON type.
pub fn array(raw: &RawValue) -> Option<Vec<&RawValue>> {
    array_text(raw.get())
}

/// [`array`] of a value's text.
pub fn array_text(text: &str) -> Option<Vec<&RawValue>> {
    if Kind::of_text(text) != Kind::Array {
        return None;
    }
    serde_json::from_str(text).ok()
}

/// A string value (escapes decoded); `None` for any other type (`Value::as_str`).
/// Borrowed from the raw text unless it has escapes (serde's `Cow<str>` always allocates).
pub fn as_str(raw: &RawValue) -> Option<Cow<'_, str>> {
    as_str_text(raw.get())
}

/// [`as_str`] of a value's text.
pub fn as_str_text(text: &str) -> Option<Cow<'_, str>> {
    if Kind::of_text(text) != Kind::String {
        return None;
    }
    match text.get(1..text.len() - 1) {
        // A raw string value is valid JSON: without a backslash, its content is the string.
        Some(inner) if !inner.contains('\\') => Some(Cow::Borrowed(inner)),
        _ => serde_json::from_str::<String>(text).ok().map(Cow::Owned),
    }
}

/// A boolean value (`Value::as_bool`).
pub fn as_bool(raw: &RawValue) -> Option<bool> {
    match raw.get() {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

/// A non-negative integer that fits in a `u64` (`Value::as_u64`).
pub fn as_u64(raw: &RawValue) -> Option<u64> {
    if Kind::of(raw) != Kind::Number {
        return None;
    }
    serde_json::from_str::<u64>(raw.get()).ok()
}

/// A list of token ids: every element a non-negative integer that fits in a `u32`.
pub fn as_ids(raw: &RawValue) -> Option<Vec<u32>> {
    as_ids_text(raw.get())
}

/// [`as_ids`] of a value's text: what `serde_json::from_str::<Vec<u32>>` reads, without its generic
/// path. A plain array of small non-negative integers (the engine's 10,000–20,000 prompt ids) is
/// read byte by byte into one `Vec` sized by its commas; anything else (a sign, a fraction, an
/// exponent, a leading zero, a value past `u32::MAX`, another type) goes to serde, which decides.
pub fn as_ids_text(text: &str) -> Option<Vec<u32>> {
    if Kind::of_text(text) != Kind::Array {
        return None;
    }
    ids_fast(text.as_bytes()).or_else(|| serde_json::from_str::<Vec<u32>>(text).ok())
}

/// The plain case of [`as_ids_text`]; `None` sends the text to serde (it is not necessarily an
/// error).
fn ids_fast(b: &[u8]) -> Option<Vec<u32>> {
    let is_ws = |c: u8| matches!(c, b' ' | b'\n' | b'\t' | b'\r');
    let commas = b.iter().filter(|&&c| c == b',').count();
    let mut ids = Vec::with_capacity(commas + 1);
    let mut i = 1; // past `[`
    while b.get(i).copied().is_some_and(is_ws) {
        i += 1;
    }
    if b.get(i) == Some(&b']') {
        return b[i + 1..].iter().all(|&c| is_ws(c)).then_some(ids);
    }
    loop {
        while b.get(i).copied().is_some_and(is_ws) {
            i += 1;
        }
        let start = i;
        let mut n: u64 = 0;
        while let Some(&c @ b'0'..=b'9') = b.get(i) {
            n = n * 10 + u64::from(c - b'0');
            i += 1;
            if i - start > 10 {
                return None;
            }
        }
        let digits = i - start;
        if digits == 0 || (digits > 1 && b[start] == b'0') {
            return None;
        }
        ids.push(u32::try_from(n).ok()?);
        while b.get(i).copied().is_some_and(is_ws) {
            i += 1;
        }
        match b.get(i) {
            Some(b',') => i += 1,
            Some(b']') => {
                return b[i + 1..].iter().all(|&c| is_ws(c)).then_some(ids);
            }
            _ => return None,
        }
    }
}

/// The value as a tree (for the small parts kept as `Value`: a message, a stop).
pub fn to_value(raw: &RawValue) -> serde_json::Value {
    to_value_text(raw.get())
}

/// [`to_value`] of a value's text.
pub fn to_value_text(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or(serde_json::Value::Null)
}

/// Writes an object: its entries in order, `edit` deciding per entry whether it is kept as it came
/// (`Keep`), left out (`Drop`) or written with other bytes (`Replace`); then `append`ed entries.
pub fn write_object<'v>(
    out: &mut Vec<u8>,
    obj: &RawObject<'_>,
    mut edit: impl FnMut(&str, &RawValue) -> Edit<'v>,
    append: &[(&str, &[u8])],
) {
    out.push(b'{');
    let mut first = true;
    let mut sep = |out: &mut Vec<u8>| {
        if !std::mem::take(&mut first) {
            out.push(b',');
        }
    };
    for (k, v) in obj.entries() {
        let bytes: Cow<'_, [u8]> = match edit(k, v) {
            Edit::Keep => Cow::Borrowed(v.get().as_bytes()),
            Edit::Drop => continue,
            Edit::Replace(b) => b,
        };
        sep(out);
        write_key(out, k);
        out.extend_from_slice(&bytes);
    }
    for (k, v) in append {
        sep(out);
        write_key(out, k);
        out.extend_from_slice(v);
    }
    out.push(b'}');
}

/// What [`write_object`] does with one entry.
pub enum Edit<'v> {
    Keep,
    Drop,
    Replace(Cow<'v, [u8]>),
}

fn write_key(out: &mut Vec<u8>, key: &str) {
    // A string always serializes.
    let _ = serde_json::to_writer(&mut *out, key);
    out.push(b':');
}

/// Writes an array of raw elements, each through `elem`.
pub fn write_array(
    out: &mut Vec<u8>,
    elems: &[&RawValue],
    mut elem: impl FnMut(&mut Vec<u8>, &RawValue),
) {
    out.push(b'[');
    for (i, e) in elems.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        elem(out, e);
    }
    out.push(b']');
}

/// A value read leniently: `Some` when it has the type `T` reads, `None` (and consumed) otherwise.
/// Unlike `Option<T>`, a value of another type is not an error.
#[derive(Debug, Clone, Copy, Default)]
pub struct Lax<T>(pub Option<T>);

macro_rules! ignore_others {
    () => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok(Lax(None))
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Lax(None))
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Lax(None))
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(Lax(None))
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(Lax(None))
        }
    };
}

impl<'de> Deserialize<'de> for Lax<f64> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Lax<f64>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                Ok(Lax(Some(v)))
            }
            #[allow(clippy::cast_precision_loss)]
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(Lax(Some(v as f64)))
            }
            #[allow(clippy::cast_precision_loss)]
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(Lax(Some(v as f64)))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(Lax(None))
            }
            ignore_others!();
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for Lax<String> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Lax<String>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Lax(Some(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Lax(Some(v)))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Lax(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Lax(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Lax(None))
            }
            ignore_others!();
        }
        d.deserialize_any(V)
    }
}

/// JSON text with what a `Value` never writes: repeated and escaped keys, whitespace (newlines
/// too), numbers out of range, surrogate escapes, nesting over the limits. For property tests
/// that require the raw and the tree readers to accept, refuse and read the same inputs alike.
#[cfg(any(test, feature = "test-support"))]
pub mod text_gen {
    use proptest::prelude::*;

    fn ws() -> impl Strategy<Value = &'static str> {
        prop_oneof![Just(""), Just(""), Just(" "), Just("\n"), Just("\t\r\n ")]
    }

    /// A key from `keys`, plain or with its first character escaped; sometimes a surrogate.
    fn key(keys: &'static [&'static str]) -> impl Strategy<Value = String> {
        prop_oneof![
            6 => prop::sample::select(keys).prop_map(|k| format!("\"{k}\"")),
            2 => prop::sample::select(keys).prop_map(|k| {
                let mut c = k.chars();
                let first = c.next().map_or(0, u32::from);
                format!("\"\\u{first:04x}{}\"", c.as_str())
            }),
            1 => "[a-z]{1,3}".prop_map(|k| format!("\"{k}\"")),
            1 => prop_oneof![
                Just(r#""\ud800""#.to_owned()),
                Just(r#""\ud83d\ude00""#.to_owned()),
                Just(r#""a\"\n""#.to_owned()),
            ],
        ]
    }

    fn leaf() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("false".to_owned()),
            any::<i64>().prop_map(|n| n.to_string()),
            (0u64..5).prop_map(|n| n.to_string()),
            any::<f64>().prop_map(|f| serde_json::Number::from_f64(f)
                .map_or_else(|| "0.5".to_owned(), |n| n.to_string())),
            prop::sample::select(
                &[
                    "1e400",
                    "-1e400",
                    "1E+999",
                    "2.5e-999",
                    "1e308",
                    "2e308",
                    "1.7976931348623157e308",
                    "-0.0e-0",
                    "12.50",
                    "1e1",
                ][..]
            )
            .prop_map(str::to_owned),
            (150usize..400).prop_map(|n| "9".repeat(n)),
            ".{0,8}".prop_map(|s| serde_json::to_string(&s).unwrap_or_default()),
            prop::sample::select(
                &[
                    r#""a\u00e9\n\"\\""#,
                    r#""\ud800""#,
                    r#""\udc00x""#,
                    r#""\ud83d\ude00""#,
                    r#""\uD83D""#,
                    r#""tab\t""#,
                ][..]
            )
            .prop_map(str::to_owned),
        ]
    }

    /// Any value as text, keys drawn from `keys`.
    pub fn value(keys: &'static [&'static str]) -> impl Strategy<Value = String> {
        let v = leaf().prop_recursive(4, 48, 5, move |inner| {
            prop_oneof![
                (prop::collection::vec((inner.clone(), ws()), 0..5), ws()).prop_map(
                    |(elems, w)| {
                        let body: Vec<String> = elems
                            .into_iter()
                            .map(|(e, w)| format!("{w}{e}{w}"))
                            .collect();
                        format!("[{w}{}]", body.join(","))
                    }
                ),
                object_of(keys, inner),
            ]
        });
        (
            v,
            prop_oneof![8 => Just(0usize), 1 => Just(99), 1 => Just(101), 1 => Just(130)],
        )
            .prop_map(|(v, d)| format!("{}{v}{}", "[".repeat(d), "]".repeat(d)))
    }

    /// An object of `values`, keys drawn from `keys` (often repeated).
    pub fn object_of(
        keys: &'static [&'static str],
        values: impl Strategy<Value = String>,
    ) -> impl Strategy<Value = String> {
        (
            prop::collection::vec((key(keys), values, ws(), ws()), 0..6),
            ws(),
        )
            .prop_map(|(entries, w)| {
                let body: Vec<String> = entries
                    .into_iter()
                    .map(|(k, v, a, b)| format!("{a}{k}{b}:{a}{v}{b}"))
                    .collect();
                format!("{{{w}{}}}", body.join(","))
            })
    }

    /// An object as text, the top of a body.
    pub fn object(keys: &'static [&'static str]) -> impl Strategy<Value = String> {
        object_of(keys, value(keys))
    }
}

#[cfg(test)]
mod tests;
