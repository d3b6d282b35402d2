//! The Responses door's translations: the requests Codex 0.169.1 sent (recorded on this machine,
//! `tests/fixtures/real/codex-0.169.1.jsonl`), whole answers and streams.

use ps_doors::messages::thinking_signature;
use ps_doors::responses::{EventStream, ResponseContext, response_from_chat, to_chat};
use serde_json::{Value, json};

fn recorded() -> Vec<Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/real/codex-0.169.1.jsonl");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or(Value::Null)["body"].clone())
        .collect()
}

fn chat_of(body: &Value) -> (ps_doors::responses::Translated, Value) {
    let t = to_chat(body.to_string().as_bytes(), None).unwrap_or_else(|e| panic!("refused: {e}"));
    let c: Value = serde_json::from_slice(&t.body).unwrap_or_default();
    (t, c)
}

/// Every request Codex sent is accepted: its developer prompts are system messages (no
/// `instructions`), its namespace's functions flattened for the engine, `web_search` left out and
/// reported; a later request's reasoning, assistant message and calls are one assistant message,
/// the call into a namespace under its flattened name, each output a tool message.
#[test]
fn codex_requests_become_the_same_conversation() {
    let bodies = recorded();
    assert_eq!(bodies.len(), 4);
    for b in &bodies {
        let (t, c) = chat_of(b);
        assert_eq!(t.dropped.hosted_tools, ["web_search"]);
        assert!(!t.store);
        assert!(t.encrypted_reasoning);
        assert!(c["stream"] == true && c["stream_options"]["include_usage"] == true);
        let roles: Vec<&str> = c["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["role"].as_str())
            .collect();
        assert_eq!(
            &roles[..4],
            ["system", "system", "user", "user"],
            "{roles:?}"
        );
        let names: Vec<&str> = c["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["function"]["name"].as_str())
            .collect();
        assert!(names.contains(&"exec_command"));
        assert!(
            names.iter().any(|n| n.starts_with("multi_agent_v1__")),
            "{names:?}"
        );
        assert!(!names.contains(&"web_search"));
        assert_eq!(c["tool_choice"], "auto");
        assert_eq!(c["parallel_tool_calls"], true);
    }
    let (_, last) = chat_of(&bodies[3]);
    let m = last["messages"].as_array().cloned().unwrap_or_default();
    let tail: Vec<Value> = m[4..].to_vec();
    assert_eq!(tail[0]["role"], "assistant");
    assert_eq!(
        tail[0]["tool_calls"][0]["function"],
        json!({"name": "exec_command", "arguments": "{\"cmd\": \"ls\"}"})
    );
    // The stub's reasoning was sealed by another server ("ENC123"): nothing to restore.
    assert!(tail[0].get("reasoning_content").is_none(), "{}", tail[0]);
    assert_eq!(tail[1]["role"], "tool");
    assert_eq!(tail[1]["tool_call_id"], "call_1");
    assert_eq!(
        tail[2],
        json!({"role": "assistant", "content": "Hello from the stub (2)."})
    );
    assert_eq!(
        tail[4]["tool_calls"][0]["function"]["name"],
        "multi_agent_v1__list_agents"
    );
    assert_eq!(tail[5]["role"], "tool");
}

#[test]
fn instructions_strings_images_and_reasoning_sealed_here_are_translated() {
    let sealed = thinking_signature("I will look first.");
    let (_, c) = chat_of(
        &json!({"model": "m", "instructions": "Be terse.", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "what is this?"}, {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": null, "encrypted_content": sealed},
        {"type": "function_call", "call_id": "c1", "name": "look", "arguments": "{\"at\": 1}"},
        {"type": "function_call_output", "call_id": "c1", "output": "a cat"}
    ], "max_output_tokens": 99, "temperature": 0.2, "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}}),
    );
    assert_eq!(
        c["messages"],
        json!([
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]},
            {"role": "assistant", "content": null, "reasoning_content": "I will look first.",
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "look", "arguments": "{\"at\": 1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "a cat"}
        ])
    );
    assert_eq!(c["max_tokens"], 99);
    assert_eq!(c["temperature"], 0.2);
    assert_eq!(
        c["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}})
    );
    let (_, s) = chat_of(&json!({"model": "m", "input": "hi"}));
    assert_eq!(s["messages"], json!([{"role": "user", "content": "hi"}]));
    // A continued response: its conversation first, then the new items.
    let prior = vec![
        json!({"role": "user", "content": "hi"}),
        json!({"role": "assistant", "content": "hello"}),
    ];
    let t = to_chat(
        json!({"model": "m", "input": "again", "previous_response_id": "resp_1"})
            .to_string()
            .as_bytes(),
        Some(&prior),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.previous_response_id.as_deref(), Some("resp_1"));
    assert_eq!(t.messages.len(), 3);
}

#[test]
fn bad_requests_are_refused_with_the_field_named() {
    for (body, code, names) in [
        (json!({"input": "x"}), "invalid_request", "`model`"),
        (json!({"model": "m"}), "invalid_request", "`input`"),
        (
            json!({"model": "m", "input": [{"type": "item_reference", "id": "x"}]}),
            "unsupported_content",
            "input[0]",
        ),
        (
            json!({"model": "m", "input": [{"role": "tool", "content": "x"}]}),
            "invalid_request",
            "input[0].role",
        ),
        (
            json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}),
            "unsupported_content",
            "input_file",
        ),
        (
            json!({"model": "m", "input": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "Sure"}]}),
            "unsupported_content",
            "assistant",
        ),
        (
            json!({"model": "m", "input": [{"type": "function_call", "name": "f"}]}),
            "invalid_request",
            "call_id",
        ),
        (
            json!({"model": "m", "input": "x", "tools": [{"name": "f"}]}),
            "invalid_request",
            "`type`",
        ),
        (
            json!({"model": "m", "input": "x", "text": {"format": {"type": "yaml"}}}),
            "unsupported_content",
            "text.format",
        ),
        (
            json!({"model": "m", "input": "x", "tools": [{"type": "teleport"}]}),
            "unsupported_content",
            "teleport",
        ),
    ] {
        let e = to_chat(body.to_string().as_bytes(), None)
            .err()
            .unwrap_or_else(|| panic!("accepted {body}"));
        assert_eq!(e.code, code, "{body}: {e}");
        assert!(e.message.contains(names), "{body}: {e}");
    }
}

fn cx(encrypted: bool) -> ResponseContext {
    let (t, _) = chat_of(&json!({"model": "gpt-x", "input": "x", "tools": [
        {"type": "namespace", "name": "agents", "tools": [{"type": "function", "name": "spawn", "parameters": {"type": "object"}}]}]}));
    ResponseContext {
        model: "gpt-x".into(),
        namespaces: t.namespaces,
        encrypted_reasoning: encrypted,
        echo: t.echo,
    }
}

#[test]
fn a_whole_answer_is_a_response_with_its_items_and_namespaced_calls_mapped_back() {
    let chat = json!({"id": "chatcmpl-9", "created": 7, "choices": [{"finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "On it.", "reasoning_content": "Spawn one.",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "agents__spawn", "arguments": "{\"n\": 1}"}}]}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 4}});
    let whole = response_from_chat(chat.to_string().as_bytes(), &cx(true), true)
        .unwrap_or_else(|e| panic!("{e}"));
    let (out, answer) = (whole.body, whole.message);
    let r: Value = serde_json::from_slice(&out).unwrap_or_default();
    assert_eq!(r["id"], "resp_chatcmpl-9");
    assert_eq!(whole.id, "resp_chatcmpl-9");
    assert_eq!(r["created_at"], 7);
    assert_eq!(r["object"], "response");
    assert_eq!(r["status"], "completed");
    assert_eq!(r["model"], "gpt-x");
    let types: Vec<&str> = r["output"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["type"].as_str())
        .collect();
    assert_eq!(types, ["reasoning", "message", "function_call"]);
    assert_eq!(
        r["output"][0]["encrypted_content"],
        thinking_signature("Spawn one.")
    );
    assert_eq!(r["output"][1]["content"][0]["text"], "On it.");
    assert_eq!(r["output"][2]["name"], "spawn");
    assert_eq!(r["output"][2]["namespace"], "agents");
    assert_eq!(r["output"][2]["call_id"], "call_1");
    assert_eq!(r["usage"]["total_tokens"], 14);
    assert_eq!(answer["tool_calls"][0]["function"]["name"], "agents__spawn");
    // Sent back as Codex sends it (content dropped, the sealed text kept), the reasoning returns.
    let mut items = vec![json!({"role": "user", "content": "go"})];
    items.extend(
        r["output"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .map(|mut i| {
                if i["type"] == "reasoning" {
                    i["content"] = Value::Null;
                }
                i
            }),
    );
    items.push(json!({"type": "function_call_output", "call_id": "call_1", "output": "ok"}));
    let (_, c) = chat_of(&json!({"model": "m", "input": items}));
    assert_eq!(
        c["messages"][1],
        json!({"role": "assistant", "content": "On it.", "reasoning_content": "Spawn one.",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "agents__spawn", "arguments": "{\"n\": 1}"}}]})
    );
    // The token limit: incomplete; an abort: refused.
    let cut = json!({"id": "c", "choices": [{"finish_reason": "length", "message": {"role": "assistant", "content": "par"}}]});
    let cut = response_from_chat(cut.to_string().as_bytes(), &cx(false), true)
        .unwrap_or_else(|e| panic!("{e}"));
    let r: Value = serde_json::from_slice(&cut.body).unwrap_or_default();
    assert_eq!(r["status"], "incomplete");
    assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(r["output"][0]["status"], "incomplete");
    // An engine that gives no id: a fresh one each time (a stored response must be findable).
    let no_id = json!({"choices": [{"finish_reason": "stop", "message": {"role": "assistant", "content": "x"}}]});
    let a = response_from_chat(no_id.to_string().as_bytes(), &cx(false), true)
        .unwrap_or_else(|e| panic!("{e}"));
    let b = response_from_chat(no_id.to_string().as_bytes(), &cx(false), true)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_ne!(a.id, b.id);
    let aborted = json!({"choices": [{"finish_reason": "abort", "message": {"role": "assistant", "content": "p"}}]});
    assert_eq!(
        response_from_chat(aborted.to_string().as_bytes(), &cx(false), true)
            .err()
            .map(|e| e.code),
        Some("engine_aborted")
    );
    assert_eq!(
        ps_doors::responses::check_answer(Some("abort"))
            .err()
            .map(|e| e.code),
        Some("engine_aborted")
    );
}

fn events(bytes: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(bytes)
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let name = e
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap_or_default();
            let v: Value = serde_json::from_str(
                e.lines()
                    .find_map(|l| l.strip_prefix("data: "))
                    .unwrap_or_default(),
            )
            .unwrap_or_default();
            assert_eq!(v["type"], name);
            v
        })
        .collect()
}

#[test]
fn a_stream_gives_the_events_in_order_numbered_and_ends_with_the_whole_response() {
    let chunk = |delta: Value, finish: Option<&str>| json!({"id": "chatcmpl-9", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    let chunks = [
        chunk(json!({"role": "assistant", "content": ""}), None),
        chunk(json!({"reasoning_content": "Spawn "}), None),
        chunk(json!({"reasoning_content": "one."}), None),
        chunk(json!({"content": "On it."}), None),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "agents__spawn", "arguments": "{\"n\": "}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
            None,
        ),
        chunk(json!({}), Some("tool_calls")),
        json!({"id": "chatcmpl-9", "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 4}}),
    ];
    let mut bytes = Vec::new();
    for c in &chunks {
        bytes.extend_from_slice(format!("data: {c}\n\n").as_bytes());
    }
    bytes.extend_from_slice(b"data: [DONE]\n\n");
    let mut s = EventStream::new(cx(true));
    let mut out = Vec::new();
    for p in bytes.chunks(13) {
        out.extend(s.push(p));
    }
    out.extend(s.finish());
    let ev = events(&out);
    let kinds: Vec<&str> = ev.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (i, e) in ev.iter().enumerate() {
        assert_eq!(e["sequence_number"], i, "{e}");
    }
    // The completed response equals the whole answer's.
    let whole = json!({"id": "chatcmpl-9", "choices": [{"finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "On it.", "reasoning_content": "Spawn one.",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "agents__spawn", "arguments": "{\"n\": 1}"}}]}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 4}});
    let w = response_from_chat(whole.to_string().as_bytes(), &cx(true), true)
        .unwrap_or_else(|e| panic!("{e}"));
    let w: Value = serde_json::from_slice(&w.body).unwrap_or_default();
    let last = &ev[ev.len() - 1]["response"];
    assert_eq!(last["output"], w["output"]);
    assert_eq!(last["usage"], w["usage"]);
    assert!(last["created_at"].as_u64().unwrap_or(0) > 0, "{last}");
    // Each item's done event carries the item the completed response lists.
    let done: Vec<&Value> = ev
        .iter()
        .filter(|e| e["type"] == "response.output_item.done")
        .map(|e| &e["item"])
        .collect();
    assert_eq!(done.len(), 3);
    for (i, item) in done.iter().enumerate() {
        assert_eq!(**item, last["output"][i]);
    }
    assert!(s.completed().is_some());
    // A broken stream: response.failed, nothing completed.
    let mut s = EventStream::new(cx(false));
    let mut out =
        s.push(format!("data: {}\n\n", chunk(json!({"content": "par"}), None)).as_bytes());
    out.extend(s.push(b"data: {\"error\": {\"message\": \"upstream broke\"}}\n\ndata: [DONE]\n\n"));
    out.extend(s.finish());
    let ev = events(&out);
    let last = &ev[ev.len() - 1];
    assert_eq!(last["type"], "response.failed");
    assert_eq!(last["response"]["error"]["message"], "upstream broke");
    assert!(s.failed() && s.completed().is_none());
}

fn sse_of(chunks: &[Value], done: bool) -> Vec<u8> {
    let mut bytes = Vec::new();
    for c in chunks {
        bytes.extend_from_slice(format!("data: {c}\n\n").as_bytes());
    }
    if done {
        bytes.extend_from_slice(b"data: [DONE]\n\n");
    }
    bytes
}

/// Text after a tool call (a newline, say) is an item of its own with only its own text; sent
/// back, the items give the engine's message again (texts concatenated).
#[test]
fn text_after_a_call_is_its_own_item_and_the_message_comes_back_whole() {
    let chunk = |delta: Value, finish: Option<&str>| json!({"id": "chatcmpl-5", "created": 9, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    let bytes = sse_of(
        &[
            chunk(json!({"content": "Calling."}), None),
            chunk(
                json!({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "look", "arguments": "{}"}}]}),
                None,
            ),
            chunk(json!({"content": "\n"}), Some("tool_calls")),
        ],
        true,
    );
    let mut s = EventStream::new(cx(false));
    let mut out = s.push(&bytes);
    out.extend(s.finish());
    let ev = events(&out);
    let r = &ev[ev.len() - 1]["response"];
    let items = r["output"].as_array().cloned().unwrap_or_default();
    assert_eq!(items.len(), 3);
    assert_eq!(items[0]["content"][0]["text"], "Calling.");
    assert_eq!(items[2]["content"][0]["text"], "\n");
    let ids: std::collections::BTreeSet<String> = items
        .iter()
        .filter_map(|i| i["id"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(ids.len(), 3, "distinct item ids: {ids:?}");
    let mut input = vec![json!({"role": "user", "content": "go"})];
    input.extend(items);
    input.push(json!({"type": "function_call_output", "call_id": "c1", "output": "ok"}));
    let (_, c) = chat_of(&json!({"model": "m", "input": input}));
    assert_eq!(c["messages"][1]["content"], "Calling.\n");
    assert_eq!(
        s.completed().map(|(_, m)| m["content"].clone()),
        Some(json!("Calling.\n"))
    );
}

/// Parallel calls sent back as Codex orders them (calls, then outputs) are one assistant message.
#[test]
fn parallel_calls_and_their_outputs_are_one_assistant_message_then_tool_messages() {
    let (_, c) = chat_of(&json!({"model": "m", "input": [
        {"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "b", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "a", "output": "1"},
        {"type": "function_call_output", "call_id": "b", "output": "2"}
    ]}));
    let m = c["messages"].as_array().cloned().unwrap_or_default();
    assert_eq!(m.len(), 4);
    assert_eq!(m[1]["tool_calls"].as_array().map(Vec::len), Some(2));
    assert_eq!(
        (m[2]["tool_call_id"].clone(), m[3]["tool_call_id"].clone()),
        (json!("a"), json!("b"))
    );
}

/// An aborted stream fails at the chunk that says so, before the stream's end (which the caller
/// then does not read: no sample of it).
#[test]
fn an_aborted_stream_fails_at_once() {
    let chunk = json!({"id": "x", "choices": [{"index": 0, "delta": {"content": "par"}, "finish_reason": "abort"}]});
    let mut s = EventStream::new(cx(false));
    let ev = events(&s.push(&sse_of(std::slice::from_ref(&chunk), false)));
    assert_eq!(
        ev.last().map(|e| e["type"].clone()),
        Some(json!("response.failed"))
    );
    assert!(s.failed());
    let mut m = ps_doors::messages::EventStream::new("m", false);
    let out = String::from_utf8_lossy(&m.push(&sse_of(&[chunk], false))).into_owned();
    assert!(out.contains("event: error") && m.failed(), "{out}");
}
