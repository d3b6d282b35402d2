//! Chat messages as clients send them, and the normalisation applied before rendering.
//!
//! Messages stay `serde_json::Value`s so that unknown fields (`tool_call_id`, `name`, …) and key order
//! survive untouched; the chat template ignores what it does not use.

use serde_json::{Map, Value};

/// Flattens a message content to text: a string stays as is; a list of parts becomes the `text` of its
/// `{"type": "text"}` parts joined by one space, a text part without a string `text` contributing
/// `""` as in the reference (so `[{"type":"text"},{"type":"text","text":"a"}]` is `" a"`); other
/// parts are dropped; anything else is `""`.
pub fn flatten_content(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
            .map(|p| p.get("text").and_then(Value::as_str).unwrap_or(""))
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

/// Normalises one request message the way the reference server does before rendering:
/// role `developer` becomes `system`; a content list is flattened with [`flatten_content`];
/// a `null` or missing content is left as it is (the template treats it as empty).
pub fn normalize_message(message: &Value) -> Value {
    let Some(obj) = message.as_object() else {
        return message.clone();
    };
    let mut out = Map::with_capacity(obj.len());
    for (k, v) in obj {
        let v = match (k.as_str(), v) {
            ("role", Value::String(r)) if r == "developer" => Value::String("system".into()),
            ("content", Value::Array(_)) => Value::String(flatten_content(v)),
            _ => v.clone(),
        };
        out.insert(k.clone(), v);
    }
    Value::Object(out)
}

/// Normalises every message of a request.
pub fn normalize_messages(messages: &[Value]) -> Vec<Value> {
    messages.iter().map(normalize_message).collect()
}

/// Normalises the assistant message returned by the upstream: a `null` or missing content becomes
/// `""` first, then [`normalize_message`] applies.
pub fn normalize_response_message(message: &Value) -> Value {
    let mut m = message.clone();
    if let Some(obj) = m.as_object_mut() {
        match obj.get("content") {
            None | Some(Value::Null) => {
                obj.insert("content".into(), Value::String(String::new()));
            }
            _ => {}
        }
    }
    normalize_message(&m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn developer_becomes_system_and_lists_flatten() {
        let m = json!({"role": "developer", "content": [
            {"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}, {"type": "text", "text": "b"}
        ], "name": "x"});
        let n = normalize_message(&m);
        assert_eq!(n, json!({"role": "system", "content": "a b", "name": "x"}));
        // key order is preserved
        let keys: Vec<_> = n
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        assert_eq!(keys, ["role", "content", "name"]);
    }

    #[test]
    fn list_without_text_is_empty_and_null_stays_null() {
        assert_eq!(flatten_content(&json!([{"type": "image_url"}])), "");
        assert_eq!(
            normalize_message(&json!({"role": "user", "content": null})),
            json!({"role": "user", "content": null})
        );
    }

    /// The reference joins `part.get("text", "")` of every text part: a text part without `text`
    /// still adds its separator, which changes the rendered prompt and so the token ids.
    #[test]
    fn a_text_part_without_text_contributes_an_empty_string() {
        let c = json!([{"type": "text"}, {"type": "text", "text": "a"}, {"type": "image_url"},
                       {"type": "text", "text": "b"}, {"type": "text", "text": null}]);
        assert_eq!(flatten_content(&c), " a b ");
        assert_eq!(
            normalize_message(&json!({"role": "user", "content": [{"type": "text"}]})),
            json!({"role": "user", "content": ""})
        );
    }

    #[test]
    fn response_null_content_becomes_empty() {
        let r = normalize_response_message(
            &json!({"role": "assistant", "content": null, "tool_calls": []}),
        );
        assert_eq!(r["content"], json!(""));
        let r = normalize_response_message(&json!({"role": "assistant"}));
        assert_eq!(r["content"], json!(""));
    }
}
