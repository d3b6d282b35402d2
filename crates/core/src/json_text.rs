//! JSON kept as its text while it waits, parsed into a tree only where a consumer needs one.
//!
//! A captured turn's request parts (`messages`, `tools`, `chat_template_kwargs`) are held from
//! capture until the turn becomes a sample, for the records and the teacher, which read them at
//! most once: as a `serde_json::Value` tree (with `preserve_order`) a 56 kB `messages` array takes
//! ~4–5 times its text (docs/benchmarks-history.md, "Memory, round two").

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A `T` held as JSON text: what `serde_json` writes for it, or the text it was parsed from.
/// Cloning shares the text.
///
/// Serialized as the `T` it holds (parsed, then serialized), so that every format (JSON records,
/// the MessagePack of persisted pending turns) sees exactly what a `T` field wrote. The text is
/// what `serde_json` writes for the `T` ([`JsonText::new`]), or the very text the `T` was parsed
/// from ([`JsonText::from_parsed_text`]); either way parsing it gives that `T` back unchanged
/// (numbers included: `float_roundtrip`). Two are equal when they hold the same `T` written
/// alike: key order and the form of numbers (`1` and `1.0`, `0.0` and `-0.0`) count, as they do
/// in what a consumer writes.
pub struct JsonText<T> {
    text: Arc<str>,
    of: PhantomData<fn() -> T>,
}

impl<T: Serialize + DeserializeOwned> JsonText<T> {
    /// `value` as its compact JSON text.
    pub fn new(value: &T) -> Self {
        // Cannot fail for the JSON types held here (string keys, finite numbers: a non-finite
        // f64 is written as `null` by `serde_json`).
        let text = serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned());
        Self::from_text(text)
    }

    /// `text`, the JSON text the caller parsed its `T` from (`serde_json::from_str::<T>(text)`
    /// succeeded): held as it is, without writing the `T` again. What the capture does with the
    /// client's own `messages` text, parsed on the capture thread.
    pub fn from_parsed_text(text: &str) -> Self {
        debug_assert!(
            serde_json::from_str::<T>(text).is_ok(),
            "JsonText::from_parsed_text: the text does not read as the type it holds"
        );
        // Straight into the shared allocation: one copy, not two through a `String`.
        Self {
            text: Arc::from(text),
            of: PhantomData,
        }
    }

    /// The tree, parsed from the text.
    ///
    /// # Errors
    /// Only if the text does not read as a `T`, which `new` and `Deserialize` never produce, nor
    /// `from_parsed_text` given the text its `T` was parsed from.
    pub fn parse(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(&self.text)
    }
}

impl<T> JsonText<T> {
    fn from_text(text: String) -> Self {
        Self {
            text: text.into(),
            of: PhantomData,
        }
    }

    /// The JSON text.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl<T: Serialize + DeserializeOwned> From<T> for JsonText<T> {
    fn from(value: T) -> Self {
        Self::new(&value)
    }
}

impl<T> Clone for JsonText<T> {
    fn clone(&self) -> Self {
        Self {
            text: Arc::clone(&self.text),
            of: PhantomData,
        }
    }
}

impl<T: Serialize + DeserializeOwned> PartialEq for JsonText<T> {
    /// The same text, or texts that parse to the same `T` (written the same way: keys in the same
    /// order, numbers alike), as a client's own text and what `serde_json` writes for its parse.
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
            || matches!(
                (self.parse(), other.parse()),
                (Ok(a), Ok(b)) if matches!(
                    (serde_json::to_string(&a), serde_json::to_string(&b)),
                    (Ok(x), Ok(y)) if x == y
                )
            )
    }
}

impl<T> fmt::Debug for JsonText<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl<T: Serialize + DeserializeOwned> Serialize for JsonText<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.parse()
            .map_err(serde::ser::Error::custom)?
            .serialize(serializer)
    }
}

impl<'de, T: Serialize + DeserializeOwned> Deserialize<'de> for JsonText<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(deserializer).map(|v| Self::new(&v))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Map, Value, json};

    use super::*;

    fn messages() -> Vec<Value> {
        vec![
            json!({"role": "system", "content": "Be brief. \u{e9}\"quoted\"\n", "z": 1, "a": 2}),
            json!({"role": "user", "content": [{"type": "text", "text": "x"}], "n": 0.1, "big": 1e300,
                   "neg": -7, "u": 18_446_744_073_709_551_615_u64, "nothing": null}),
        ]
    }

    #[test]
    fn the_tree_comes_back_unchanged_keys_in_order() {
        let held = JsonText::new(&messages());
        let back = held.parse().unwrap();
        assert_eq!(back, messages());
        // Key order is kept (serde_json's `preserve_order`), so the re-serialized text is the same.
        assert_eq!(
            serde_json::to_string(&back).unwrap(),
            serde_json::to_string(&messages()).unwrap()
        );
        assert_eq!(held.as_str(), serde_json::to_string(&messages()).unwrap());
    }

    #[test]
    fn it_serializes_exactly_as_the_tree_in_json_and_messagepack() {
        let kwargs: Map<String, Value> =
            serde_json::from_value(json!({"enable_thinking": false, "b": [1, 2.5]})).unwrap();
        let held = JsonText::new(&kwargs);
        assert_eq!(
            serde_json::to_vec(&held).unwrap(),
            serde_json::to_vec(&kwargs).unwrap()
        );
        let held = JsonText::new(&messages());
        assert_eq!(
            rmp_serde::to_vec_named(&held).unwrap(),
            rmp_serde::to_vec_named(&messages()).unwrap()
        );
        // What a tree field wrote reads back into the text form, and the other way round.
        let bytes = rmp_serde::to_vec_named(&messages()).unwrap();
        let read: JsonText<Vec<Value>> = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(read, held);
        let text = serde_json::to_string(&held).unwrap();
        let tree: Vec<Value> = serde_json::from_str(&text).unwrap();
        assert_eq!(tree, messages());
    }

    #[test]
    fn a_clients_own_text_is_held_as_is_and_reads_and_writes_as_its_tree() {
        // Spaces, escapes serde_json would not write, a repeated key, a float of many digits.
        let text = "[ {\"role\" : \"user\", \"content\": \"caf\\u00e9 \\/ x\", \"n\": 0.1000, \
                    \"k\": 1, \"k\": 2},\n {\"role\": \"assistant\", \"content\": null} ]";
        let tree: Vec<Value> = serde_json::from_str(text).unwrap();
        let held = JsonText::<Vec<Value>>::from_parsed_text(text);
        assert_eq!(held.as_str(), text);
        assert_eq!(held.parse().unwrap(), tree);
        let written = JsonText::new(&tree);
        assert_ne!(held.as_str(), written.as_str());
        // Equal as what they hold, and every format sees exactly the tree.
        assert_eq!(held, written);
        assert_eq!(
            serde_json::to_vec(&held).unwrap(),
            serde_json::to_vec(&tree).unwrap()
        );
        assert_eq!(
            rmp_serde::to_vec_named(&held).unwrap(),
            rmp_serde::to_vec_named(&tree).unwrap()
        );
        // Another tree is another value, however close its text.
        let other = JsonText::<Vec<Value>>::from_parsed_text(&text.replace("0.1000", "0.1001"));
        assert_ne!(held, other);
        let reordered = JsonText::new(&serde_json::from_str::<Vec<Value>>(
            r#"[{"content": "café / x", "role": "user", "n": 0.1, "k": 2}, {"role": "assistant", "content": null}]"#,
        ).unwrap());
        assert_ne!(
            held, reordered,
            "keys in another order are written differently"
        );
        // Written and read back (a persisted pending turn): another text, the same value.
        let back: JsonText<Vec<Value>> =
            rmp_serde::from_slice(&rmp_serde::to_vec_named(&held).unwrap()).unwrap();
        assert_ne!(back.as_str(), held.as_str());
        assert_eq!(back, held);
    }

    #[test]
    fn clones_share_the_text() {
        let held = JsonText::new(&json!({"a": 1}));
        let copy = held.clone();
        assert!(std::ptr::eq(held.as_str(), copy.as_str()));
        assert_eq!(format!("{held:?}"), r#"{"a":1}"#);
    }
}
