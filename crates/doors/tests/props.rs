//! Any input, however malformed, is translated or refused with a known code: never a panic, never
//! a body that is not a chat request; any chat stream, however cut, ends in a closing event.

use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// JSON trees whose keys and strings come mostly from the doors' own vocabulary, so that deep
/// paths (blocks inside messages, items inside input) are reached, not only the top-level checks.
fn value() -> impl Strategy<Value = Value> {
    let words = prop_oneof![
        Just("type"),
        Just("role"),
        Just("content"),
        Just("text"),
        Just("user"),
        Just("assistant"),
        Just("system"),
        Just("developer"),
        Just("tool_use"),
        Just("tool_result"),
        Just("thinking"),
        Just("image"),
        Just("source"),
        Just("base64"),
        Just("input"),
        Just("name"),
        Just("id"),
        Just("tool_use_id"),
        Just("message"),
        Just("function_call"),
        Just("function_call_output"),
        Just("reasoning"),
        Just("call_id"),
        Just("arguments"),
        Just("output"),
        Just("input_text"),
        Just("namespace"),
        Just("tools"),
        Just("encrypted_content"),
        Just("signature"),
        Just("x"),
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(|n| json!(n)),
        words.clone().prop_map(|w| json!(w)),
        ".{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((words.clone(), inner), 0..6).prop_map(|kv| Value::Object(
                kv.into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect::<Map<_, _>>()
            )),
        ]
    })
}

const CODES: &[&str] = &["invalid_json", "invalid_request", "unsupported_content"];

fn check_chat_body(body: &[u8]) -> Result<(), TestCaseError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert!(
        v["messages"].as_array().is_some_and(|m| !m.is_empty()),
        "{v}"
    );
    prop_assert!(v["model"].is_string());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn any_messages_request_is_translated_or_refused_with_a_known_code(
        messages in prop::collection::vec(value(), 0..4),
        extra in value(),
    ) {
        let mut body = json!({"model": "m", "max_tokens": 5, "messages": messages});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                if k != "model" {
                    b.insert(k.clone(), v.clone());
                }
            }
        }
        match ps_doors::messages::to_chat(body.to_string().as_bytes()) {
            Ok(t) => check_chat_body(&t.body)?,
            Err(e) => prop_assert!(CODES.contains(&e.code), "{}: {e}", e.code),
        }
    }

    #[test]
    fn any_responses_request_is_translated_or_refused_with_a_known_code(
        input in prop::collection::vec(value(), 0..4),
        extra in value(),
    ) {
        let mut body = json!({"model": "m", "input": input});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                if k != "model" {
                    b.insert(k.clone(), v.clone());
                }
            }
        }
        match ps_doors::responses::to_chat(body.to_string().as_bytes(), None) {
            Ok(t) => check_chat_body(&t.body)?,
            Err(e) => prop_assert!(CODES.contains(&e.code), "{}: {e}", e.code),
        }
    }

    /// A chat stream cut anywhere, or carrying anything as data, ends in the door's closing event
    /// (`message_stop` or `error`; `response.completed`, `.incomplete` or `.failed`), exactly once.
    #[test]
    fn any_chat_stream_ends_in_one_closing_event(
        chunks in prop::collection::vec(value(), 0..6),
        cut in any::<prop::sample::Index>(),
        done in any::<bool>(),
    ) {
        let mut bytes = Vec::new();
        for c in &chunks {
            bytes.extend_from_slice(format!("data: {c}\n\n").as_bytes());
        }
        if done {
            bytes.extend_from_slice(b"data: [DONE]\n\n");
        }
        let bytes = &bytes[..cut.index(bytes.len() + 1)];
        let mut m = ps_doors::messages::EventStream::new("m", false);
        let out = [m.push(bytes), m.finish()].concat();
        let text = String::from_utf8_lossy(&out);
        let closing = text.matches("event: message_stop").count() + text.matches("event: error").count();
        prop_assert_eq!(closing, 1, "{}", text);
        let cx = ps_doors::responses::ResponseContext {
            model: "m".into(), namespaces: Default::default(), encrypted_reasoning: true, echo: Value::Null,
        };
        let mut r = ps_doors::responses::EventStream::new(cx);
        let out = [r.push(bytes), r.finish()].concat();
        let text = String::from_utf8_lossy(&out);
        let closing = ["response.completed", "response.incomplete", "response.failed"]
            .iter()
            .map(|k| text.matches(&format!("event: {k}\n")).count())
            .sum::<usize>();
        prop_assert_eq!(closing, 1, "{}", text);
    }
}
