//! Property tests of stream assembly: no panic on any chunk text, and for well-formed streams the
//! assembled answer is exactly what the deltas carried (content, reasoning, tool-call arguments per
//! index, one sampled token per log-prob entry of choice 0).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use ps_sglang_client::{StreamAssembler, rollout_from_response, synthesize_chunks};
use serde_json::{Value, json};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        ..ProptestConfig::default()
    }
}

/// Any JSON value, a few levels deep, with the keys the assembler looks at over-represented.
fn json_value() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        Just("choices".to_owned()),
        Just("delta".to_owned()),
        Just("content".to_owned()),
        Just("reasoning_content".to_owned()),
        Just("tool_calls".to_owned()),
        Just("function".to_owned()),
        Just("arguments".to_owned()),
        Just("name".to_owned()),
        Just("index".to_owned()),
        Just("logprobs".to_owned()),
        Just("logprob".to_owned()),
        Just("token".to_owned()),
        Just("finish_reason".to_owned()),
        Just("matched_stop".to_owned()),
        Just("error".to_owned()),
        Just("message".to_owned()),
        Just("token_ids".to_owned()),
        Just("meta_info".to_owned()),
        Just("output_token_logprobs".to_owned()),
        "[a-z_]{1,8}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        (0u64..5).prop_map(|n| json!(n)),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 64, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key.clone(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// One piece of a well-formed stream.
#[derive(Debug, Clone)]
enum Piece {
    Content(String),
    Reasoning(String),
    Tool {
        index: u64,
        name: Option<String>,
        arguments: String,
    },
    /// A chunk of no interest: usage, role only, or another choice (must be ignored).
    Noise(u8),
}

fn piece() -> impl Strategy<Value = Piece> {
    let text = prop_oneof![".{0,8}", "[\\{\\}\":, a-z0-9]{0,8}", Just(String::new())];
    prop_oneof![
        3 => text.clone().prop_map(Piece::Content),
        2 => text.clone().prop_map(Piece::Reasoning),
        2 => (0u64..3, prop::option::of("[a-z_]{1,4}"), text)
            .prop_map(|(index, name, arguments)| Piece::Tool { index, name, arguments }),
        1 => (0u8..4).prop_map(Piece::Noise),
    ]
}

fn lp_entry(i: usize) -> Value {
    json!({"token": format!("t{i}"), "bytes": [116], "logprob": -0.25 * (i as f64), "top_logprobs": []})
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn feeding_any_text_never_panics(chunks in prop::collection::vec(any::<String>(), 0..8)) {
        let mut a = StreamAssembler::new();
        for c in &chunks {
            // Not JSON (almost always): an error, never a panic.
            let _ = a.feed_str(c);
        }
        let r = a.finish();
        prop_assert!(r.streamed);
    }

    #[test]
    fn feeding_any_json_never_panics(chunks in prop::collection::vec(json_value(), 0..8)) {
        let mut a = StreamAssembler::new();
        for c in &chunks {
            let _ = a.feed_str(&c.to_string());
        }
        let _ = a.finished();
        let r = a.finish();
        prop_assert!(r.message.is_object());
        // The non-streamed paths take any JSON too.
        for c in &chunks {
            let _ = rollout_from_response(c);
            let _ = synthesize_chunks(c);
        }
    }

    #[test]
    fn well_formed_streams_assemble_exactly(
        pieces in prop::collection::vec((piece(), 0usize..3, 0usize..2), 0..40),
        finish in prop_oneof![Just("stop"), Just("length"), Just("tool_calls")],
    ) {
        let mut a = StreamAssembler::new();
        let mut content = String::new();
        let mut reasoning: Option<String> = None;
        // (index, name, arguments) in order of first appearance.
        let mut tools: Vec<(u64, String, String)> = Vec::new();
        let mut entries = 0usize;
        let first = json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]});
        a.feed_str(&first.to_string()).unwrap();
        for (p, n_entries, n_unscored) in &pieces {
            // Log-prob entries of choice 0, plus entries without a numeric log-prob (skipped).
            let mut lps: Vec<Value> = (0..*n_entries).map(|k| lp_entry(entries + k)).collect();
            for _ in 0..*n_unscored {
                lps.push(json!({"token": "x", "logprob": null}));
            }
            let logprobs = if lps.is_empty() { Value::Null } else { json!({"content": lps}) };
            let mut counted = true;
            let chunk = match p {
                Piece::Content(s) => {
                    content.push_str(s);
                    json!({"choices": [{"index": 0, "delta": {"content": s}, "logprobs": logprobs, "finish_reason": null}]})
                }
                Piece::Reasoning(s) => {
                    reasoning.get_or_insert_with(String::new).push_str(s);
                    json!({"choices": [{"index": 0, "delta": {"reasoning_content": s, "content": null}, "logprobs": logprobs}]})
                }
                Piece::Tool { index, name, arguments } => {
                    let pos = match tools.iter().position(|(i, _, _)| i == index) {
                        Some(p) => p,
                        None => {
                            tools.push((*index, String::new(), String::new()));
                            tools.len() - 1
                        }
                    };
                    if let Some(n) = name {
                        tools[pos].1.push_str(n);
                    }
                    tools[pos].2.push_str(arguments);
                    json!({"choices": [{"index": 0, "delta": {"tool_calls": [{
                        "index": index,
                        "id": name.as_ref().map(|_| format!("call_{index}")),
                        "type": "function",
                        "function": {"name": name, "arguments": arguments},
                    }]}, "logprobs": logprobs}]})
                }
                Piece::Noise(0) => {
                    counted = false;
                    json!({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}})
                }
                Piece::Noise(1) => {
                    // Another choice: its content and log-probs are not ours.
                    counted = false;
                    json!({"choices": [{"index": 1, "delta": {"content": "OTHER", "tool_calls": [{"index": 0, "function": {"arguments": "OTHER"}}]}, "logprobs": logprobs}]})
                }
                Piece::Noise(2) => {
                    json!({"choices": [{"index": 0, "delta": {}, "logprobs": logprobs}]})
                }
                Piece::Noise(_) => {
                    json!({"choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": logprobs, "finish_reason": null}]})
                }
            };
            if counted {
                entries += n_entries;
            }
            a.feed_str(&chunk.to_string()).unwrap();
        }
        prop_assert!(!a.finished());
        let last = json!({"choices": [{"index": 0, "delta": {}, "logprobs": null, "finish_reason": finish, "matched_stop": null}]});
        a.feed_str(&last.to_string()).unwrap();
        prop_assert!(a.finished());
        let r = a.finish();
        prop_assert_eq!(&r.message["content"], &json!(content));
        prop_assert_eq!(&r.message["reasoning_content"], &json!(reasoning));
        prop_assert_eq!(r.tokens.len(), entries, "one sampled token per log-prob entry fed");
        for (k, t) in r.tokens.iter().enumerate() {
            prop_assert_eq!(&t.token, &format!("t{k}"));
            prop_assert_eq!(t.logprob, -0.25 * (k as f64));
            prop_assert_eq!(t.id, None);
        }
        prop_assert_eq!(r.finish.reason.as_deref(), Some(finish));
        if tools.is_empty() {
            prop_assert_eq!(&r.message["tool_calls"], &Value::Null);
        } else {
            let calls = r.message["tool_calls"].as_array().unwrap();
            prop_assert_eq!(calls.len(), tools.len());
            for (call, (index, name, arguments)) in calls.iter().zip(&tools) {
                prop_assert_eq!(&call["index"], &json!(index));
                prop_assert_eq!(&call["function"]["name"], &json!(name));
                prop_assert_eq!(&call["function"]["arguments"], &json!(arguments));
            }
        }
    }

    #[test]
    fn a_non_streamed_answer_survives_synthesis_and_reassembly(
        content in ".{0,40}",
        reasoning in prop::option::of(".{0,20}"),
        n in 0usize..12,
        with_ids in any::<bool>(),
    ) {
        let entries: Vec<Value> = (0..n).map(lp_entry).collect();
        let mut choice = json!({"index": 0,
            "message": {"role": "assistant", "content": content, "reasoning_content": reasoning, "tool_calls": null},
            "logprobs": {"content": entries}, "finish_reason": "stop", "matched_stop": 2});
        if with_ids {
            choice["token_ids"] = json!((0..n as u64).collect::<Vec<_>>());
        }
        let resp = json!({"id": "x", "choices": [choice]});
        let direct = rollout_from_response(&resp);
        prop_assert_eq!(direct.tokens.len(), n);
        for (k, t) in direct.tokens.iter().enumerate() {
            prop_assert_eq!(t.id, with_ids.then_some(k as u32));
        }
        let mut a = StreamAssembler::new();
        for c in synthesize_chunks(&resp) {
            a.feed_str(&c.to_string()).unwrap();
        }
        prop_assert!(a.finished());
        let re = a.finish();
        prop_assert_eq!(&re.message["content"], &json!(content));
        prop_assert_eq!(&re.message["reasoning_content"], &json!(reasoning));
        prop_assert_eq!(re.tokens.len(), n);
        prop_assert_eq!(re.finish.reason.as_deref(), Some("stop"));
    }
}

#[test]
fn error_events_are_errors_whatever_their_shape() {
    for chunk in [
        json!({"error": null}),
        json!({"error": "x"}),
        json!({"error": {"message": 5}}),
        json!({"error": {"message": "boom"}, "choices": [{"index": 0, "delta": {"content": "c"}}]}),
    ] {
        let mut a = StreamAssembler::new();
        assert!(a.feed_str(&chunk.to_string()).is_err(), "{chunk}");
        assert_eq!(
            a.finish().message["content"],
            "",
            "an error event adds nothing"
        );
    }
}
