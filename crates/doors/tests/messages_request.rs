//! A Messages request becomes the chat-completions body of the same conversation, or a clear
//! refusal naming the field.

use ps_doors::messages::{thinking_signature, to_chat};
use serde_json::{Value, json};

fn chat(body: &Value) -> Value {
    let t = to_chat(body.to_string().as_bytes()).unwrap_or_else(|e| panic!("refused: {e}"));
    serde_json::from_slice(&t.body).unwrap_or_else(|e| panic!("not JSON: {e}"))
}

fn refusal(body: &Value) -> ps_doors::DoorError {
    match to_chat(body.to_string().as_bytes()) {
        Ok(t) => panic!(
            "accepted: {}",
            String::from_utf8_lossy(&t.body)
                .chars()
                .take(400)
                .collect::<String>()
        ),
        Err(e) => e,
    }
}

/// The shape Claude Code 2.1 sends (recorded on this machine): system as three text blocks, two
/// with `cache_control`; a `system` message inside `messages` (a one-block list); tools, one with
/// `defer_loading`; adaptive thinking with its display omitted; betas' fields the engine has no use
/// for. All accepted; the conversation is the same in chat completions' terms.
#[test]
fn a_claude_code_request_becomes_the_same_conversation() {
    let body = json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "stream": true,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1"},
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
        ],
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "<env>cwd: /tmp</env>"}]},
            {"role": "user", "content": [
                {"type": "text", "text": "list the files", "cache_control": {"type": "ephemeral"}}
            ]}
        ],
        "tools": [
            {"name": "Bash", "description": "Run a command", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}},
            {"name": "WebFetch", "description": "Fetch", "input_schema": {"type": "object", "properties": {"url": {"type": "string"}}}, "defer_loading": true}
        ],
        "tool_choice": {"type": "auto"},
        "thinking": {"type": "adaptive", "display": "omitted"},
        "output_config": {"effort": "medium"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "metadata": {"user_id": "{\"session_id\":\"5b0c\"}"},
        "temperature": 1
    });
    let t = to_chat(body.to_string().as_bytes()).unwrap_or_else(|e| panic!("refused: {e}"));
    assert_eq!(t.model, "claude-sonnet-4-5");
    assert!(t.stream);
    assert!(t.thinking_omitted);
    assert!(t.dropped.is_empty());
    let c: Value = serde_json::from_slice(&t.body).unwrap_or_default();
    assert_eq!(
        c,
        json!({
            "model": "claude-sonnet-4-5",
            "messages": [
                {"role": "system", "content": [
                    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1"},
                    {"type": "text", "text": "You are Claude Code."},
                    {"type": "text", "text": "Be brief."}
                ]},
                {"role": "system", "content": [{"type": "text", "text": "<env>cwd: /tmp</env>"}]},
                {"role": "user", "content": [{"type": "text", "text": "list the files"}]}
            ],
            "tools": [
                {"type": "function", "function": {"name": "Bash", "description": "Run a command", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
                {"type": "function", "function": {"name": "WebFetch", "description": "Fetch", "parameters": {"type": "object", "properties": {"url": {"type": "string"}}}}}
            ],
            "tool_choice": "auto",
            "max_tokens": 32000,
            "temperature": 1,
            "stream": true,
            "stream_options": {"include_usage": true}
        })
    );
}

/// A tool round trip: the assistant's thinking, text and `tool_use` become `reasoning_content`,
/// `content` and a tool call whose arguments are the input as the engines' parsers write them
/// (Python's separators, key order kept, whatever spacing the client used: a template may render
/// the text as it is); the user's `tool_result` blocks become tool messages (string or blocks, an
/// error result's text kept), ahead of the user's own text.
#[test]
fn tool_use_and_tool_results_become_tool_calls_and_tool_messages() {
    let input = r#"{"path":"b.txt","a":[1,{"é":null}]}"#;
    let as_the_engine_wrote_it = r#"{"path": "b.txt", "a": [1, {"é": null}]}"#;
    let body = format!(
        r#"{{"model": "m", "max_tokens": 100, "messages": [
            {{"role": "user", "content": "read b.txt"}},
            {{"role": "assistant", "content": [
                {{"type": "thinking", "thinking": "I should read it.", "signature": "opaque"}},
                {{"type": "text", "text": "Reading."}},
                {{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {input}}},
                {{"type": "tool_use", "id": "toolu_2", "name": "Stat", "input": {{}}}}
            ]}},
            {{"role": "user", "content": [
                {{"type": "tool_result", "tool_use_id": "toolu_1", "content": "hello"}},
                {{"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true, "content": [{{"type": "text", "text": "no such file"}}]}},
                {{"type": "text", "text": "and now?"}}
            ]}}
        ]}}"#
    );
    let t = to_chat(body.as_bytes()).unwrap_or_else(|e| panic!("refused: {e}"));
    let c: Value = serde_json::from_slice(&t.body).unwrap_or_default();
    assert_eq!(
        c["messages"],
        json!([
            {"role": "user", "content": "read b.txt"},
            {"role": "assistant", "content": "Reading.", "reasoning_content": "I should read it.", "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "Read", "arguments": as_the_engine_wrote_it}},
                {"id": "toolu_2", "type": "function", "function": {"name": "Stat", "arguments": "{}"}}
            ]},
            {"role": "tool", "content": "hello", "tool_call_id": "toolu_1"},
            {"role": "tool", "content": [{"type": "text", "text": "no such file"}], "tool_call_id": "toolu_2"},
            {"role": "user", "content": [{"type": "text", "text": "and now?"}]}
        ])
    );
    // Only tool results: no empty user message after them.
    let only = chat(&json!({"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"x": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]}
    ]}));
    let roles: Vec<&str> = only["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["role"].as_str())
        .collect();
    assert_eq!(roles, ["user", "assistant", "tool"]);
    // A tool-call-only assistant message has null content, as OpenAI clients send it.
    assert_eq!(only["messages"][1]["content"], Value::Null);
}

/// A thinking block sent back without its text (the client asked for it omitted) is restored
/// from the signature this proxy wrote, so the engine sees the prompt it produced.
#[test]
fn thinking_sent_back_without_its_text_is_restored_from_the_signature() {
    let sig = thinking_signature("The user wants the file.");
    let c = chat(&json!({"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "", "signature": sig},
            {"type": "text", "text": "done"}
        ]},
        {"role": "user", "content": "again"}
    ]}));
    assert_eq!(
        c["messages"][1]["reasoning_content"],
        "The user wants the file."
    );
    // Another model's signature restores nothing: the (empty) text is kept as sent.
    let c = chat(&json!({"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "", "signature": "EqQBCkYIBxgCKkD"},
            {"type": "redacted_thinking", "data": "abc"},
            {"type": "text", "text": "done"}
        ]},
        {"role": "user", "content": "again"}
    ]}));
    assert_eq!(c["messages"][1]["reasoning_content"], "");
    let t = to_chat(
        json!({"model": "m", "max_tokens": 5, "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "abc"}, {"type": "text", "text": "x"}]},
            {"role": "user", "content": "again"}
        ]})
        .to_string()
        .as_bytes(),
    )
    .unwrap_or_else(|e| panic!("refused: {e}"));
    assert_eq!(t.dropped.redacted_thinking, 1);
}

#[test]
fn images_become_image_url_parts() {
    let c = chat(&json!({"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
            {"type": "image", "source": {"type": "url", "url": "https://example.invalid/a.png"}},
            {"type": "text", "text": "what is this?"}
        ]}
    ]}));
    assert_eq!(
        c["messages"][0]["content"],
        json!([
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            {"type": "image_url", "image_url": {"url": "https://example.invalid/a.png"}},
            {"type": "text", "text": "what is this?"}
        ])
    );
}

/// Tools the engine cannot run (Anthropic's own, with a `type`) are left out and reported; the
/// choice among tools is renamed; with no engine tool left, no choice is sent.
#[test]
fn hosted_tools_are_left_out_and_tool_choice_is_renamed() {
    let tools = json!([
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
        {"type": "custom", "name": "f", "input_schema": {"type": "object"}},
        {"name": "g", "input_schema": {"type": "object"}}
    ]);
    let t = to_chat(
        json!({"model": "m", "max_tokens": 5, "tools": tools, "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
               "messages": [{"role": "user", "content": "x"}]})
        .to_string()
        .as_bytes(),
    )
    .unwrap_or_else(|e| panic!("refused: {e}"));
    assert_eq!(t.dropped.hosted_tools, ["web_search"]);
    let c: Value = serde_json::from_slice(&t.body).unwrap_or_default();
    let names: Vec<&str> = c["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert_eq!(names, ["f", "g"]);
    assert_eq!(c["tool_choice"], "required");
    assert_eq!(c["parallel_tool_calls"], false);
    for (choice, expected) in [
        (json!({"type": "auto"}), json!("auto")),
        (json!({"type": "none"}), json!("none")),
        (
            json!({"type": "tool", "name": "g"}),
            json!({"type": "function", "function": {"name": "g"}}),
        ),
    ] {
        let c = chat(
            &json!({"model": "m", "max_tokens": 5, "tools": tools, "tool_choice": choice, "messages": [{"role": "user", "content": "x"}]}),
        );
        assert_eq!(c["tool_choice"], expected, "{choice}");
    }
    // Claude Code's title request: `tools: []`, a JSON schema for the answer.
    let c = chat(
        &json!({"model": "claude-haiku-4-5", "max_tokens": 32000, "tools": [], "tool_choice": {"type": "auto"},
        "output_config": {"format": {"type": "json_schema", "schema": {"type": "object", "properties": {"title": {"type": "string"}}}}},
        "messages": [{"role": "user", "content": "title this"}]}),
    );
    assert!(
        c.get("tools").is_none() && c.get("tool_choice").is_none(),
        "{c}"
    );
    assert_eq!(
        c["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "output", "schema": {"type": "object", "properties": {"title": {"type": "string"}}}}})
    );
}

#[test]
fn sampling_settings_thinking_and_session_keys_are_carried() {
    let c = chat(
        &json!({"model": "m", "max_tokens": 7, "stop_sequences": ["END"], "temperature": 0.7, "top_p": 0.9, "top_k": 20,
        "thinking": {"type": "disabled"}, "session_id": "s-1", "turn_type": "main", "session_done": true,
        "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(c["max_tokens"], 7);
    assert_eq!(c["stop"], json!(["END"]));
    assert_eq!(c["temperature"], 0.7);
    assert_eq!(c["top_p"], 0.9);
    assert_eq!(c["top_k"], 20);
    assert_eq!(c["chat_template_kwargs"], json!({"enable_thinking": false}));
    assert_eq!(c["stream"], false);
    assert!(c.get("stream_options").is_none());
    assert_eq!(
        (&c["session_id"], &c["turn_type"], &c["session_done"]),
        (&json!("s-1"), &json!("main"), &json!(true))
    );
    let enabled = chat(
        &json!({"model": "m", "max_tokens": 7, "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": [{"role": "user", "content": "x"}]}),
    );
    assert!(enabled.get("chat_template_kwargs").is_none(), "{enabled}");
}

/// Every bad input names its field; none is answered by a guess.
#[test]
fn bad_requests_are_refused_with_the_field_named() {
    let user = json!([{"role": "user", "content": "x"}]);
    let cases = [
        (
            json!({"max_tokens": 5, "messages": user}),
            "invalid_request",
            "`model`",
        ),
        (
            json!({"model": "m", "messages": user}),
            "invalid_request",
            "`max_tokens`",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": []}),
            "invalid_request",
            "`messages`",
        ),
        (
            json!({"model": "m", "max_tokens": 5}),
            "invalid_request",
            "`messages`",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}),
            "invalid_request",
            "messages[0].role",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "Sure,"}]}),
            "unsupported_content",
            "prefill",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document", "source": {"type": "text", "data": "x"}}]}]}),
            "unsupported_content",
            "messages[0].content[0]",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}]}),
            "unsupported_content",
            "source.type",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": 5}]}),
            "invalid_request",
            "messages[0].content",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}, {"role": "user", "content": "y"}]}),
            "unsupported_content",
            "messages[1].content[0]",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}),
            "invalid_request",
            "tool_use_id",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "tools": [{"name": "f"}], "messages": user}),
            "invalid_request",
            "input_schema",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "tool"}, "messages": user}),
            "invalid_request",
            "tool_choice",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "thinking": {"type": "sometimes"}, "messages": user}),
            "invalid_request",
            "thinking.type",
        ),
    ];
    for (body, code, names) in cases {
        let e = refusal(&body);
        assert_eq!(e.code, code, "{body}: {e}");
        assert!(e.message.contains(names), "{body}: {e}");
    }
    // A count of tokens is a Messages request without `max_tokens`, and may end with the
    // assistant (what a prefill would cost).
    let count = ps_doors::messages::count_request_to_chat(
        json!({"model": "m", "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "Sure,"}]})
            .to_string()
            .as_bytes(),
    );
    assert!(count.is_ok(), "{:?}", count.err());
    let e = to_chat(b"{\"model\": ").err();
    assert_eq!(e.map(|e| e.code), Some("invalid_json"));
    let e = to_chat(b"[1, 2]").err();
    assert_eq!(e.map(|e| e.code), Some("invalid_json"));
}
