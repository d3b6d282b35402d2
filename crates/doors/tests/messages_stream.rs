//! A streamed chat answer becomes the Messages API's events, in its order, whatever the byte
//! boundaries it arrives in; a broken stream ends with an `error` event.

use ps_doors::messages::{EventStream, message_from_chat, thinking_signature};
use serde_json::{Value, json};

fn sse(chunks: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    for c in chunks {
        out.extend_from_slice(format!("data: {c}\n\n").as_bytes());
    }
    out.extend_from_slice(b"data: [DONE]\n\n");
    out
}

/// The events (name, data) of a Messages stream.
fn events(bytes: &[u8]) -> Vec<(String, Value)> {
    let text = String::from_utf8_lossy(bytes);
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let name = e
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap_or_default();
            let data = e
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap_or_default();
            let v: Value = serde_json::from_str(data).unwrap_or(Value::Null);
            assert_eq!(v["type"], name, "the event's name is its data's type: {e}");
            (name.to_owned(), v)
        })
        .collect()
}

fn chunk(delta: Value, finish: Option<&str>) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

fn translate_in_pieces(bytes: &[u8], piece: usize, omitted: bool) -> Vec<u8> {
    let mut s = EventStream::new("claude-x", omitted);
    let mut out = Vec::new();
    for p in bytes.chunks(piece) {
        out.extend(s.push(p));
    }
    out.extend(s.finish());
    out
}

/// The content a Messages stream's events build (what the SDK's accumulator does).
fn accumulate(events: &[(String, Value)]) -> Value {
    let mut blocks: Vec<Value> = Vec::new();
    let mut partial: Vec<String> = Vec::new();
    let mut stop = Value::Null;
    let mut usage = Value::Null;
    for (name, v) in events {
        match name.as_str() {
            "content_block_start" => {
                assert_eq!(v["index"], blocks.len());
                blocks.push(v["content_block"].clone());
                partial.push(String::new());
            }
            "content_block_delta" => {
                let i = v["index"].as_u64().unwrap_or(u64::MAX) as usize;
                assert_eq!(i + 1, blocks.len(), "deltas go to the open block");
                let d = &v["delta"];
                let b = &mut blocks[i];
                match d["type"].as_str().unwrap_or_default() {
                    "text_delta" => {
                        b["text"] = json!(format!(
                            "{}{}",
                            b["text"].as_str().unwrap_or_default(),
                            d["text"].as_str().unwrap_or_default()
                        ))
                    }
                    "thinking_delta" => {
                        b["thinking"] = json!(format!(
                            "{}{}",
                            b["thinking"].as_str().unwrap_or_default(),
                            d["thinking"].as_str().unwrap_or_default()
                        ))
                    }
                    "signature_delta" => b["signature"] = d["signature"].clone(),
                    "input_json_delta" => {
                        partial[i].push_str(d["partial_json"].as_str().unwrap_or_default())
                    }
                    other => panic!("unknown delta {other}"),
                }
            }
            "content_block_stop" => {
                let i = v["index"].as_u64().unwrap_or(u64::MAX) as usize;
                if blocks[i]["type"] == "tool_use" && !partial[i].is_empty() {
                    blocks[i]["input"] = serde_json::from_str(&partial[i]).unwrap_or(Value::Null);
                }
            }
            "message_delta" => {
                stop = v["delta"].clone();
                usage = v["usage"].clone();
            }
            _ => {}
        }
    }
    json!({"content": blocks, "stop": stop, "usage": usage})
}

#[test]
fn a_streamed_answer_with_thinking_text_and_tool_calls_gives_the_events_in_order() {
    let chunks = [
        chunk(json!({"role": "assistant", "content": ""}), None),
        chunk(json!({"reasoning_content": "Need "}), None),
        chunk(json!({"reasoning_content": "the file."}), None),
        chunk(json!({"content": "Reading"}), None),
        chunk(json!({"content": " it."}), None),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "Read", "arguments": ""}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"path\": "}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"a.txt\"}"}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 1, "id": "call_2", "type": "function", "function": {"name": "Stat", "arguments": "{}"}}]}),
            None,
        ),
        chunk(json!({}), Some("tool_calls")),
        json!({"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 20}}),
    ];
    let bytes = sse(&chunks);
    let whole = translate_in_pieces(&bytes, bytes.len(), false);
    // Any byte boundaries give the same events.
    for piece in [1, 3, 17, 64] {
        assert_eq!(
            translate_in_pieces(&bytes, piece, false),
            whole,
            "pieces of {piece}"
        );
    }
    let ev = events(&whole);
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    assert_eq!(ev[0].1["message"]["id"], "msg_chatcmpl-1");
    assert_eq!(ev[0].1["message"]["model"], "claude-x");
    assert_eq!(ev[5].1["delta"]["type"], "signature_delta");
    // What the events build equals the whole answer's translation.
    let built = accumulate(&ev);
    let non_streamed = json!({"id": "chatcmpl-1", "choices": [{"finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "Reading it.", "reasoning_content": "Need the file.",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "Read", "arguments": "{\"path\": \"a.txt\"}"}},
            {"id": "call_2", "type": "function", "function": {"name": "Stat", "arguments": "{}"}}
        ]}}], "usage": {"prompt_tokens": 50, "completion_tokens": 20}});
    let whole_answer: Value = serde_json::from_slice(
        &message_from_chat(non_streamed.to_string().as_bytes(), "claude-x", false)
            .unwrap_or_default(),
    )
    .unwrap_or_default();
    assert_eq!(built["content"], whole_answer["content"]);
    assert_eq!(
        built["stop"],
        json!({"stop_reason": "tool_use", "stop_sequence": null})
    );
    assert_eq!(built["usage"], whole_answer["usage"]);
    assert_eq!(
        built["content"][0]["signature"],
        thinking_signature("Need the file.")
    );
}

#[test]
fn omitted_thinking_streams_only_its_signature() {
    let bytes = sse(&[
        chunk(json!({"reasoning_content": "secret plan"}), None),
        // SGLang writes `tool_calls: null` in its deltas.
        chunk(json!({"content": "ok", "tool_calls": null}), Some("stop")),
    ]);
    let ev = events(&translate_in_pieces(&bytes, 5, true));
    assert!(
        !ev.iter()
            .any(|(_, v)| v["delta"]["type"] == "thinking_delta"),
        "no thinking text"
    );
    let built = accumulate(&ev);
    assert_eq!(built["content"][0]["thinking"], "");
    assert_eq!(
        built["content"][0]["signature"],
        thinking_signature("secret plan")
    );
    assert_eq!(built["content"][1], json!({"type": "text", "text": "ok"}));
    assert_eq!(built["stop"]["stop_reason"], "end_turn");
}

/// A stop string the client gave ends the answer: `stop_sequence`, with the string.
#[test]
fn a_matched_stop_string_is_the_stop_sequence() {
    let mut last = chunk(json!({}), Some("stop"));
    last["choices"][0]["matched_stop"] = json!("END");
    let bytes = sse(&[chunk(json!({"content": "a"}), None), last]);
    let built = accumulate(&events(&translate_in_pieces(&bytes, 1000, false)));
    assert_eq!(
        built["stop"],
        json!({"stop_reason": "stop_sequence", "stop_sequence": "END"})
    );
}

/// The chat path ends a broken stream with an error chunk and `[DONE]`; a stream may also just
/// stop. Either way the client gets an `error` event, never a `message_stop` it would take for a
/// complete answer.
#[test]
fn a_broken_stream_ends_with_an_error_event() {
    let mut broken = sse(&[chunk(json!({"content": "par"}), None)]);
    broken.truncate(broken.len() - b"data: [DONE]\n\n".len());
    broken.extend_from_slice(
        b"data: {\"error\":{\"message\":\"upstream stream broke\",\"type\":\"upstream_error\",\"code\":\"upstream_stream_broken\"}}\n\ndata: [DONE]\n\n",
    );
    let ev = events(&translate_in_pieces(&broken, 7, false));
    let last = ev.last().map(|(n, v)| (n.clone(), v.clone()));
    assert_eq!(
        last.as_ref().map(|(n, _)| n.as_str()),
        Some("error"),
        "{ev:?}"
    );
    assert_eq!(
        last.map(|(_, v)| v["error"].clone()),
        Some(json!({"type": "api_error", "message": "upstream stream broke"}))
    );
    assert!(!ev.iter().any(|(n, _)| n == "message_stop"));
    // Cut off: no [DONE].
    let cut = format!("data: {}\n\n", chunk(json!({"content": "par"}), None));
    let ev = events(&translate_in_pieces(cut.as_bytes(), 4, false));
    assert_eq!(ev.last().map(|(n, _)| n.as_str()), Some("error"));
    // [DONE] without a finish reason is not a complete answer either.
    let ev = events(&translate_in_pieces(
        &sse(&[chunk(json!({"content": "par"}), None)]),
        4,
        false,
    ));
    assert_eq!(ev.last().map(|(n, _)| n.as_str()), Some("error"));
}

/// Parallel tool calls as engines stream them: SGLang's `-1` index (some of its parsers), vLLM's
/// whole-answer calls without an index (two in one chunk), a real index; each call its own block
/// with its own id, name and arguments.
#[test]
fn parallel_tool_calls_each_get_their_block_whatever_the_engine_writes_as_index() {
    let call = |index: Option<i64>, id: Option<&str>, name: Option<&str>, args: &str| {
        let mut c = json!({"type": "function", "function": {"arguments": args}});
        if let Some(i) = index {
            c["index"] = json!(i);
        }
        if let Some(id) = id {
            c["id"] = json!(id);
        }
        if let Some(n) = name {
            c["function"]["name"] = json!(n);
        }
        c
    };
    let expected = json!([
        {"type": "tool_use", "id": "a", "name": "Read", "input": {"p": 1}},
        {"type": "tool_use", "id": "b", "name": "Stat", "input": {"q": 2}}
    ]);
    let cases = [
        // vLLM's whole answer synthesised into one chunk: no indices.
        vec![chunk(
            json!({"tool_calls": [call(None, Some("a"), Some("Read"), "{\"p\": 1}"), call(None, Some("b"), Some("Stat"), "{\"q\": 2}")]}),
            Some("tool_calls"),
        )],
        // SGLang's -1, each call whole.
        vec![
            chunk(
                json!({"tool_calls": [call(Some(-1), Some("a"), Some("Read"), "{\"p\": 1}")]}),
                None,
            ),
            chunk(
                json!({"tool_calls": [call(Some(-1), Some("b"), Some("Stat"), "{\"q\": 2}")]}),
                Some("tool_calls"),
            ),
        ],
        // Streamed with real indices, arguments in fragments; -1 continuing the open call.
        vec![
            chunk(
                json!({"tool_calls": [call(Some(0), Some("a"), Some("Read"), "")]}),
                None,
            ),
            chunk(
                json!({"tool_calls": [call(Some(0), None, None, "{\"p\": ")]}),
                None,
            ),
            chunk(
                json!({"tool_calls": [call(Some(-1), None, None, "1}")]}),
                None,
            ),
            chunk(
                json!({"tool_calls": [call(Some(1), Some("b"), Some("Stat"), "{\"q\": 2}")]}),
                Some("tool_calls"),
            ),
        ],
    ];
    for (i, chunks) in cases.iter().enumerate() {
        let ev = events(&translate_in_pieces(&sse(chunks), 9, false));
        let built = accumulate(&ev);
        assert_eq!(built["content"], expected, "case {i}: {ev:?}");
        assert_eq!(built["stop"]["stop_reason"], "tool_use");
    }
    // Back to a call whose block has ended: an error, never a block glued to another.
    let back = [
        chunk(
            json!({"tool_calls": [call(Some(0), Some("a"), Some("Read"), "{}")]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [call(Some(1), Some("b"), Some("Stat"), "{}")]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [call(Some(0), None, None, "x")]}),
            Some("tool_calls"),
        ),
    ];
    let mut s = EventStream::new("m", false);
    let ev = events(&[s.push(&sse(&back)), s.finish()].concat());
    assert_eq!(ev.last().map(|(n, _)| n.as_str()), Some("error"));
    assert!(s.failed());
}

/// Thinking after text (a second thinking block): each block's signature carries its own text.
#[test]
fn each_thinking_block_signs_its_own_text() {
    let bytes = sse(&[
        chunk(json!({"reasoning_content": "first"}), None),
        chunk(json!({"content": "middle"}), None),
        chunk(json!({"reasoning_content": "second"}), None),
        chunk(json!({"content": "end"}), Some("stop")),
    ]);
    let built = accumulate(&events(&translate_in_pieces(&bytes, 11, false)));
    let blocks = built["content"].as_array().cloned().unwrap_or_default();
    assert_eq!(blocks.len(), 4, "{built}");
    assert_eq!(blocks[0]["signature"], thinking_signature("first"));
    assert_eq!(blocks[2]["signature"], thinking_signature("second"));
}

/// SGLang's `abort` (a pause or weight update cut the answer) is not a complete answer: an error
/// event, never `message_stop`; a whole answer aborted is refused. CRLF-separated events with
/// several `data:` lines read as the standard says; `null` usage counts read as none.
#[test]
fn an_aborted_answer_is_an_error_and_events_are_read_as_the_standard_says() {
    let ev = events(&translate_in_pieces(
        &sse(&[chunk(json!({"content": "par"}), Some("abort"))]),
        6,
        false,
    ));
    assert_eq!(ev.last().map(|(n, _)| n.as_str()), Some("error"), "{ev:?}");
    assert!(!ev.iter().any(|(n, _)| n == "message_stop"));
    let whole = json!({"choices": [{"finish_reason": "abort", "message": {"role": "assistant", "content": "par"}}]});
    let e = message_from_chat(whole.to_string().as_bytes(), "m", false).err();
    assert_eq!(e.map(|e| e.code), Some("engine_aborted"));
    // One event over two data lines, CRLF line ends and separators.
    let c = chunk(json!({"content": "hi"}), Some("stop"));
    let text = serde_json::to_string_pretty(&c).unwrap_or_default();
    let mut crlf = String::new();
    for line in text.lines() {
        crlf.push_str(&format!("data: {line}\r\n"));
    }
    crlf.push_str("\r\n");
    crlf.push_str("data: {\"choices\": [], \"usage\": {\"prompt_tokens\": 3, \"completion_tokens\": null}}\r\n\r\n");
    crlf.push_str("data: [DONE]\r\n\r\n");
    let ev = events(&translate_in_pieces(crlf.as_bytes(), 5, false));
    let built = accumulate(&ev);
    assert_eq!(
        built["content"],
        json!([{"type": "text", "text": "hi"}]),
        "{ev:?}"
    );
    assert_eq!(built["usage"]["input_tokens"], 3);
    assert_eq!(built["usage"]["output_tokens"], 0);
}
