//! A whole chat answer becomes a Messages answer.

use ps_doors::messages::{message_from_chat, thinking_signature};
use serde_json::{Value, json};

fn message(chat: &Value, omitted: bool) -> Value {
    let out = message_from_chat(chat.to_string().as_bytes(), "claude-x", omitted)
        .unwrap_or_else(|e| panic!("refused: {e}"));
    serde_json::from_slice(&out).unwrap_or_default()
}

#[test]
fn reasoning_text_and_tool_calls_become_blocks_with_the_stop_reason_and_usage() {
    let args = r#"{"path": "a.txt", "n": 2}"#;
    let chat = json!({
        "id": "chatcmpl-7", "object": "chat.completion", "model": "policy", "session_id": "s",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "Reading it.", "reasoning_content": "Need the file.",
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "Read", "arguments": args}}]
        }}],
        "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150}
    });
    let m = message(&chat, false);
    assert_eq!(
        m,
        json!({
            "id": "msg_chatcmpl-7", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [
                {"type": "thinking", "thinking": "Need the file.", "signature": thinking_signature("Need the file.")},
                {"type": "text", "text": "Reading it."},
                {"type": "tool_use", "id": "call_1", "name": "Read", "input": {"path": "a.txt", "n": 2}}
            ],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 120, "output_tokens": 30, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        })
    );
    // The input keeps the engine's key order (what the agent sends back, and the template renders).
    let out = message_from_chat(chat.to_string().as_bytes(), "claude-x", false).unwrap_or_default();
    let text = String::from_utf8_lossy(&out);
    assert!(
        text.contains(r#""input":{"path": "a.txt", "n": 2}"#),
        "{text}"
    );
    // Omitted: the thinking block keeps its signature (which carries the text), not its text.
    let m = message(&chat, true);
    assert_eq!(m["content"][0]["thinking"], "");
    assert_eq!(
        m["content"][0]["signature"],
        thinking_signature("Need the file.")
    );
}

#[test]
fn each_finish_reason_has_its_stop_reason() {
    let answer = |finish: &str, extra: Value| {
        // SGLang writes `tool_calls: null` when there are none.
        let mut choice = json!({"index": 0, "finish_reason": finish, "message": {"role": "assistant", "content": "hi", "tool_calls": null}});
        if let (Some(c), Some(e)) = (choice.as_object_mut(), extra.as_object()) {
            c.extend(e.clone());
        }
        json!({"id": "x", "choices": [choice]})
    };
    let cases = [
        ("stop", json!({}), "end_turn", Value::Null),
        // SGLang ends on the eos token: its id, not a stop string.
        (
            "stop",
            json!({"matched_stop": 151645}),
            "end_turn",
            Value::Null,
        ),
        (
            "stop",
            json!({"matched_stop": "END"}),
            "stop_sequence",
            json!("END"),
        ),
        // vLLM's name for it.
        (
            "stop",
            json!({"stop_reason": "STOP"}),
            "stop_sequence",
            json!("STOP"),
        ),
        ("length", json!({}), "max_tokens", Value::Null),
        ("content_filter", json!({}), "refusal", Value::Null),
    ];
    for (finish, extra, reason, seq) in cases {
        let m = message(&answer(finish, extra.clone()), false);
        assert_eq!(m["stop_reason"], reason, "{finish} {extra}");
        assert_eq!(m["stop_sequence"], seq, "{finish} {extra}");
        assert_eq!(m["content"], json!([{"type": "text", "text": "hi"}]));
    }
    // vLLM's newer name for the reasoning is read too; an empty answer has no blocks.
    let m = message(
        &json!({"choices": [{"finish_reason": "stop", "message": {"role": "assistant", "content": "", "reasoning": "hm"}}]}),
        false,
    );
    assert_eq!(m["content"][0]["thinking"], "hm");
    assert_eq!(m["content"].as_array().map(Vec::len), Some(1));
    assert_eq!(m["id"], "msg_policy_serving");
}

/// Arguments that are not a JSON object cannot be a `tool_use` input: refused, never invented.
#[test]
fn a_tool_call_whose_arguments_are_not_an_object_is_refused() {
    for args in ["{\"path\": ", "[1]", "\"x\""] {
        let chat = json!({"choices": [{"finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "Read", "arguments": args}}]}}]});
        let e = message_from_chat(chat.to_string().as_bytes(), "m", false).err();
        assert_eq!(
            e.as_ref().map(|e| e.code),
            Some("tool_arguments_not_an_object"),
            "{args}"
        );
        assert!(e.is_some_and(|e| e.message.contains("Read")));
    }
    for bad in [
        &b"not json"[..],
        br#"{"choices": []}"#,
        br#"{"choices": [{}]}"#,
    ] {
        let e = message_from_chat(bad, "m", false).err();
        assert_eq!(e.map(|e| e.code), Some("upstream_invalid_response"));
    }
}
