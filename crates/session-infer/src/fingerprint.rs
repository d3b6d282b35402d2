//! Fingerprints of chat messages that survive what clients change when they send a history again,
//! chained along the message list so that every prefix of a conversation has its own key.
//!
//! A message's fingerprint covers:
//! - its role (`developer` counts as `system`, as the chat template sees it);
//! - its content flattened to text ([`ps_core::message::flatten_content`]: a string equals a
//!   one-part text list), with white space trimmed at both ends; images, in order, by their
//!   content ([`ps_core::message::image_identity`]: the same image in any part shape); other
//!   non-text parts, in order, as canonical JSON;
//! - for each tool call, the function name and its arguments parsed and written back canonically
//!   (object keys sorted, no white space), so re-serialised argument JSON matches; arguments that
//!   are not JSON are compared as trimmed text.
//!
//! Left out on purpose: reasoning (`reasoning_content`, which clients drop or keep), tool-call and
//! tool-result ids (some clients rewrite them), `name`, and every other key.

use serde_json::Value;
use xxhash_rust::xxh3::{Xxh3, xxh3_128};

/// A 128-bit key (xxh3-128).
pub type Key = u128;

/// The key of the empty conversation: the start of every chain.
pub const EMPTY: Key = 0;

/// The fingerprint of one message.
pub fn message_key(message: &Value) -> Key {
    let mut h = Xxh3::new();
    let obj = message.as_object();
    let role = obj
        .and_then(|o| o.get("role"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let role = if role == "developer" { "system" } else { role };
    field(&mut h, b'r', role.as_bytes());
    let content = obj.and_then(|o| o.get("content")).unwrap_or(&Value::Null);
    match content {
        // The common case, without copying the text (a system prompt can be 40,000 characters).
        Value::String(s) => field(&mut h, b'c', s.trim().as_bytes()),
        other => field(
            &mut h,
            b'c',
            ps_core::message::flatten_content(other).trim().as_bytes(),
        ),
    }
    if let Value::Array(parts) = content {
        for p in parts {
            if p.get("type").and_then(Value::as_str) == Some("text") {
                continue;
            }
            // An image by its content (the same bytes re-sent in another shape, with or without
            // `detail`, match; a 1 MB data URL is hashed, not copied); other parts as JSON.
            match ps_core::message::image_identity(p).filter(|_| ps_core::message::is_image_part(p))
            {
                Some(id) => field(&mut h, b'i', id.as_bytes()),
                None => field(&mut h, b'p', canonical(p).as_bytes()),
            }
        }
    }
    let calls = obj
        .and_then(|o| o.get("tool_calls"))
        .and_then(Value::as_array);
    for call in calls.into_iter().flatten() {
        let f = call.get("function").unwrap_or(&Value::Null);
        let name = f.get("name").and_then(Value::as_str).unwrap_or("");
        field(&mut h, b'n', name.trim().as_bytes());
        let mut args = Vec::new();
        match f.get("arguments") {
            Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                Ok(v) => write_canonical(&v, &mut args),
                Err(_) => args.extend_from_slice(s.trim().as_bytes()),
            },
            None | Some(Value::Null) => {}
            Some(v) => write_canonical(v, &mut args),
        }
        field(&mut h, b'a', &args);
    }
    h.digest128()
}

/// The key of a conversation extended by one message: `chain(key of the prefix, message)`.
pub fn chain(prefix: Key, message: &Value) -> Key {
    chain_key(prefix, message_key(message))
}

/// The key of a conversation whose key is `prefix`, extended by a message whose key is `message`.
pub fn chain_key(prefix: Key, message: Key) -> Key {
    let mut buf = [0u8; 32];
    buf[..16].copy_from_slice(&prefix.to_le_bytes());
    buf[16..].copy_from_slice(&message.to_le_bytes());
    xxh3_128(&buf)
}

/// One tagged, length-prefixed field, so that no two different messages feed the same bytes.
fn field(h: &mut Xxh3, tag: u8, bytes: &[u8]) {
    h.update(&[tag]);
    h.update(&(bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

/// JSON with object keys sorted and no white space: the same text for the same value, whatever key
/// order or spacing the client used.
pub fn canonical(v: &Value) -> String {
    let mut out = Vec::new();
    write_canonical(v, &mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// [`canonical`] into a byte buffer, without a string per key or scalar.
fn write_canonical(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                // Writing a string or a number to a Vec cannot fail.
                let _ = serde_json::to_writer(&mut *out, k);
                out.push(b':');
                write_canonical(v, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        other => {
            let _ = serde_json::to_writer(&mut *out, other);
        }
    }
}

/// Longest trailing tail a reply is also registered without ([`History::tail_bases`]).
pub const MAX_EPHEMERAL_TAIL: usize = 2;

/// The keys of every prefix of a request's messages, computed in one pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct History {
    /// `keys[i]` is the key of `messages[..=i]` (messages an ephemeral rule names left out).
    keys: Vec<Key>,
    /// Indices of the assistant messages: where an answered conversation can end.
    assistant_at: Vec<usize>,
    /// The key of the messages up to and including the first user message (the system prompt and
    /// the task), when there is a user message.
    opening: Option<Key>,
    /// Keys of the request without a short trailing tail, with the tail's length
    /// ([`History::tail_bases`]).
    tails: Vec<(Key, usize)>,
}

impl History {
    pub fn of(messages: &[Value]) -> Self {
        Self::of_with(messages, &[])
    }

    /// The keys of `messages`, those `rules` name left out (a message sent once and never again
    /// must not break the chain: crate::ephemeral).
    pub fn of_with(messages: &[Value], rules: &[crate::EphemeralRule]) -> Self {
        let mut keys = Vec::with_capacity(messages.len());
        let mut assistant_at = Vec::new();
        let mut opening = None;
        let mut key = EMPTY;
        let mut visible = Vec::new();
        for (i, m) in messages.iter().enumerate() {
            if crate::ephemeral::is_ephemeral(rules, m) {
                keys.push(key);
                continue;
            }
            key = chain(key, m);
            keys.push(key);
            let role = m.get("role").and_then(Value::as_str);
            match role {
                Some("assistant") => {
                    assistant_at.push(i);
                    visible.clear();
                }
                Some("user") if opening.is_none() => opening = Some(key),
                _ => {}
            }
            if role != Some("assistant") {
                visible.push((i, matches!(role, Some("user" | "tool"))));
            }
        }
        // What the request adds after its last assistant message (or all of it): its reply is
        // also registered without the last 1..=MAX_EPHEMERAL_TAIL of those messages, when one of
        // them is left and the kept part ends as a prompt does (a user or tool message).
        let tails = (1..=MAX_EPHEMERAL_TAIL)
            .filter(|&j| visible.len() > j)
            .filter_map(|j| {
                let (at, prompt_end) = visible[visible.len() - 1 - j];
                prompt_end.then(|| (keys[at], j))
            })
            .collect();
        Self {
            keys,
            assistant_at,
            opening,
            tails,
        }
    }

    /// The keys of the request without its last `j` messages (after its last assistant message,
    /// at least one of those kept), each with `j`: the histories a client that sent those `j`
    /// messages only once continues from. Our reply is registered under each of them too.
    pub fn tail_bases(&self) -> &[(Key, usize)] {
        &self.tails
    }

    /// The key of the whole request.
    pub fn key(&self) -> Key {
        self.keys.last().copied().unwrap_or(EMPTY)
    }

    /// The key of the request followed by `reply`: what the next request's prefix must match.
    pub fn with_reply(&self, reply: &Value) -> Key {
        chain(self.key(), reply)
    }

    /// Keys of the prefixes that end with an assistant message, longest first, leaving out the
    /// whole request (a continuation adds at least one message after the reply it continues).
    pub fn answered_prefixes(&self) -> impl Iterator<Item = Key> + '_ {
        let n = self.keys.len();
        self.assistant_at
            .iter()
            .rev()
            .filter(move |&&i| i + 1 < n)
            .map(|&i| self.keys[i])
    }

    /// Whether the request carries earlier turns (an assistant message).
    pub fn has_history(&self) -> bool {
        !self.assistant_at.is_empty()
    }

    pub fn opening(&self) -> Option<Key> {
        self.opening
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn what_clients_change_does_not_change_the_key() {
        let ours = json!({"role": "assistant", "content": "  Sure.\n", "reasoning_content": "think",
            "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "search", "arguments": "{\"q\": \"rust\", \"n\": 3}"}}]});
        let resent = json!({"role": "assistant", "content": [{"type": "text", "text": "Sure."}],
            "tool_calls": [{"id": "other", "type": "function",
                "function": {"name": "search", "arguments": "{\"n\":3,\"q\":\"rust\"}"}}]});
        assert_eq!(message_key(&ours), message_key(&resent));
        let as_object = json!({"role": "assistant", "content": "Sure.",
            "tool_calls": [{"function": {"name": "search", "arguments": {"q": "rust", "n": 3}}}]});
        assert_eq!(message_key(&ours), message_key(&as_object));
        // null, missing and empty content are the same
        assert_eq!(
            message_key(&json!({"role": "assistant", "content": null})),
            message_key(&json!({"role": "assistant"}))
        );
        assert_eq!(
            message_key(&json!({"role": "developer", "content": "x"})),
            message_key(&json!({"role": "system", "content": "x"}))
        );
    }

    #[test]
    fn an_image_is_known_by_its_content_in_any_shape() {
        let with = |part: Value| json!({"role": "user", "content": [{"type": "text", "text": "see"}, part]});
        let a = message_key(&with(
            json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}),
        ));
        for same in [
            json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "high"}}),
            json!({"type": "image_url", "image_url": "data:image/png;base64,AAAA"}),
            json!({"type": "input_image", "image_url": "data:image/png;base64,AAAA"}),
            json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}),
        ] {
            assert_eq!(message_key(&with(same.clone())), a, "{same}");
        }
        let other = message_key(&with(
            json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAB"}}),
        ));
        assert_ne!(other, a, "another image");
        assert_ne!(message_key(&json!({"role": "user", "content": "see"})), a);
    }

    #[test]
    fn what_matters_changes_the_key() {
        let base = json!({"role": "user", "content": "hello"});
        for other in [
            json!({"role": "user", "content": "hello!"}),
            json!({"role": "assistant", "content": "hello"}),
            json!({"role": "user", "content": [{"type": "text", "text": "hello"},
                {"type": "image_url", "image_url": {"url": "a.png"}}]}),
            json!({"role": "user", "content": "hello", "tool_calls": [
                {"function": {"name": "f", "arguments": "{}"}}]}),
        ] {
            assert_ne!(message_key(&base), message_key(&other), "{other}");
        }
        let call = |args: &str| {
            json!({"role": "assistant", "content": "",
                "tool_calls": [{"function": {"name": "f", "arguments": args}}]})
        };
        assert_ne!(
            message_key(&call(r#"{"a":1}"#)),
            message_key(&call(r#"{"a":2}"#))
        );
        // field boundaries are not ambiguous
        assert_ne!(
            message_key(&json!({"role": "us", "content": "er"})),
            message_key(&json!({"role": "use", "content": "r"}))
        );
    }

    #[test]
    fn canonical_sorts_keys_at_every_depth() {
        let v: Value = serde_json::from_str(r#"{ "b": [ {"y":1, "x":2} ], "a": "s" }"#).unwrap();
        assert_eq!(canonical(&v), r#"{"a":"s","b":[{"x":2,"y":1}]}"#);
    }

    #[test]
    fn history_keys_are_prefix_keys() {
        let msgs = vec![
            json!({"role": "system", "content": "S"}),
            json!({"role": "user", "content": "u1"}),
            json!({"role": "assistant", "content": "a1"}),
            json!({"role": "user", "content": "u2"}),
        ];
        let h = History::of(&msgs);
        let first = History::of(&msgs[..2]);
        assert_eq!(first.with_reply(&msgs[2]), History::of(&msgs[..3]).key());
        assert_eq!(
            h.answered_prefixes().collect::<Vec<_>>(),
            [first.with_reply(&msgs[2])]
        );
        assert_eq!(h.opening(), Some(first.key()));
        assert!(h.has_history() && !first.has_history());
        // a request that ends with an assistant message does not continue itself
        assert_eq!(History::of(&msgs[..3]).answered_prefixes().count(), 0);
    }
}
