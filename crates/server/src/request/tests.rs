//! Unit tests of reading a chat request: the forwarded body, the limits, the typed view.

use super::*;
use axum::http::HeaderValue;
use serde_json::json;

/// The forwarded body as a tree, for assertions.
fn forward_body(req: &ChatRequest<'_>, opts: &ForwardOptions<'_>) -> Value {
    serde_json::from_slice(&super::forward_body(req, opts).body).expect("JSON")
}

fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(*k, HeaderValue::from_static(v));
    }
    h
}

#[test]
fn headers_win_and_body_keys_are_stripped() {
    let body = br#"{"messages":[{"role":"user","content":"hi"}],"session_id":"b","turn_type":"side","session_done":"yes","x_extra":1}"#;
    let r = parse(
        body,
        &headers(&[("x-session-id", "h"), ("x-turn-type", "main")]),
    )
    .expect("valid");
    assert_eq!(r.session.session_id.as_deref(), Some("h"));
    assert_eq!(r.session.turn_type, Some(TurnType::Main));
    assert!(r.session.done);
    let body = r.body_map().expect("readable");
    assert!(!body.contains_key("session_id"));
    assert!(!body.contains_key("turn_type"));
    assert!(!body.contains_key("session_done"));
    assert_eq!(body["x_extra"], 1);
}

#[test]
fn session_done_is_the_or_of_header_and_body() {
    let with_body = |done: &str| {
        format!(r#"{{"messages":[{{"role":"user","content":"hi"}}],"session_done":{done}}}"#)
    };
    let cases: &[(&str, Option<&'static str>, bool)] = &[
        // a header `0` does not cancel a body `true` (the reference ORs them)
        ("true", Some("0"), true),
        ("false", Some("1"), true),
        ("\"yes\"", None, true),
        ("false", Some("no"), false),
        ("0", None, false),
    ];
    for (body, header, want) in cases {
        let h = match header {
            Some(v) => headers(&[("x-session-done", v)]),
            None => HeaderMap::new(),
        };
        let body_text = with_body(body);
        let r = parse(body_text.as_bytes(), &h).expect("valid");
        assert_eq!(r.session.done, *want, "body {body}, header {header:?}");
    }
}

#[test]
fn body_keys_used_without_headers() {
    let body =
        br#"{"messages":[{"role":"user","content":"hi"}],"session_id":"b","turn_type":"MAIN"}"#;
    let r = parse(body, &HeaderMap::new()).expect("valid");
    assert_eq!(r.session.session_id.as_deref(), Some("b"));
    assert_eq!(r.session.turn_type, Some(TurnType::Main));
    assert!(!r.session.done);
}

#[test]
fn bad_inputs_have_clear_codes() {
    let cases: &[(&[u8], &str)] = &[
        (b"{not json", "invalid_json"),
        (b"[1]", "invalid_type"),
        (b"{}", "missing_messages"),
        (br#"{"messages":"hi"}"#, "invalid_type"),
        (br#"{"messages":[]}"#, "empty_messages"),
        (br#"{"messages":[1]}"#, "invalid_type"),
        (br#"{"messages":[{"content":"x"}]}"#, "invalid_message"),
        (
            br#"{"messages":[{"role":"user","content":5}]}"#,
            "invalid_type",
        ),
        (
            br#"{"messages":[{"role":"user","content":"x"}],"stream":"yes"}"#,
            "invalid_type",
        ),
        (
            br#"{"messages":[{"role":"user","content":"x"}],"tools":{}}"#,
            "invalid_type",
        ),
        (
            br#"{"messages":[{"role":"user","content":"x"}],"turn_type":"other"}"#,
            "invalid_turn_type",
        ),
    ];
    for (body, code) in cases {
        let e = parse(body, &HeaderMap::new()).expect_err("must fail");
        assert_eq!(e.code(), *code, "{}", String::from_utf8_lossy(body));
    }
}

#[test]
fn forward_body_forces_logprobs_and_keeps_unknown_fields() {
    let r = parse(
        br#"{"messages":[{"role":"user","content":"hi"}],"top_logprobs":5,"foo":{"bar":1},"stream_options":{"include_usage":true}}"#,
        &HeaderMap::new(),
    )
    .expect("valid");
    let opts = ForwardOptions {
        served_model_name: "qwen3-4b",
        model: None,
        stream: false,
        return_token_ids: true,
        full_distribution: false,
        routed_experts: false,
    };
    let f = forward_body(&r, &opts);
    assert_eq!(f["logprobs"], true);
    assert_eq!(f["top_logprobs"], 5);
    assert_eq!(f["model"], "qwen3-4b");
    assert_eq!(f["foo"], json!({"bar": 1}));
    assert_eq!(f["return_token_ids"], true);
    assert!(f.get("stream_options").is_none());
    // The chat path asks a streamed call for ids only when the engine streams them (vLLM;
    // SGLang refuses the flag on streams).
    let streamed = forward_body(
        &r,
        &ForwardOptions {
            stream: true,
            return_token_ids: false,
            full_distribution: false,
            routed_experts: false,
            ..opts
        },
    );
    assert_eq!(streamed["stream"], true);
    assert_eq!(streamed["top_logprobs"], 5);
    assert!(streamed.get("return_token_ids").is_none());
    assert_eq!(streamed["stream_options"], json!({"include_usage": true}));
    let vllm_stream = forward_body(
        &r,
        &ForwardOptions {
            stream: true,
            ..opts
        },
    );
    assert_eq!(vllm_stream["return_token_ids"], true);
    // Without the flag it added, the body is the one written without asking.
    let asked = super::forward_body(
        &r,
        &ForwardOptions {
            stream: true,
            ..opts
        },
    );
    let unasked = super::forward_body(
        &r,
        &ForwardOptions {
            stream: true,
            return_token_ids: false,
            full_distribution: false,
            routed_experts: false,
            ..opts
        },
    );
    assert!(asked.injected_ids && !unasked.injected_ids);
    assert_eq!(without_injected_ids(&asked.body), unasked.body);
    assert_eq!(without_injected_ids(&unasked.body), unasked.body);
}

#[test]
fn model_kept_when_given() {
    let r = parse(
        br#"{"model":"mine","messages":[{"role":"user","content":"hi"}]}"#,
        &HeaderMap::new(),
    )
    .expect("valid");
    let f = forward_body(
        &r,
        &ForwardOptions {
            served_model_name: "x",
            model: None,
            stream: false,
            return_token_ids: false,
            full_distribution: false,
            routed_experts: false,
        },
    );
    assert_eq!(f["model"], "mine");
    assert_eq!(f["top_logprobs"], 1);
}

mod limit_tests {
    use super::super::*;

    #[test]
    fn too_many_messages_names_the_setting() {
        let body = br#"{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"user","content":"c"}]}"#;
        let e = parse_limited(body, &HeaderMap::new(), 2).expect_err("over the limit");
        assert_eq!(e.code(), "too_many_messages");
        assert!(e.to_string().contains("server.max_messages"));
        assert!(parse_limited(body, &HeaderMap::new(), 3).is_ok());
    }
}

mod typed_tests {
    use super::super::*;
    use serde_json::json;

    /// `server.model_names`: the served name and the mapped names pass (a mapped one renamed
    /// upstream, every other byte as sent); any other name is a 404 naming both settings; no map
    /// forwards every name as sent.
    #[test]
    fn model_names_rename_what_they_map_and_refuse_the_rest() {
        let names: std::collections::BTreeMap<String, String> =
            [("claude-haiku-4-5".to_owned(), "qwen3-4b".to_owned())].into();
        let body = |model: &str| {
            format!(
                r#"{{"model":{model},"messages":[{{"role":"user","content":"hi"}}],"temperature":0.5}}"#
            )
        };
        fn parsed(b: &str) -> ChatRequest<'_> {
            parse(b.as_bytes(), &HeaderMap::new()).expect("valid")
        }
        let mapped = body(r#""claude-haiku-4-5""#);
        let req = parsed(&mapped);
        let upstream = upstream_model(&req, "qwen3-4b", &names).expect("mapped");
        assert_eq!(upstream, Some("qwen3-4b"));
        let fwd = forward_body(
            &req,
            &ForwardOptions {
                served_model_name: "qwen3-4b",
                model: upstream,
                stream: false,
                return_token_ids: false,
                full_distribution: false,
                routed_experts: false,
            },
        );
        let sent: Value = serde_json::from_slice(&fwd.body).unwrap();
        assert_eq!(sent["model"], "qwen3-4b");
        assert_eq!(sent["temperature"], 0.5);
        for ok in [r#""qwen3-4b""#, r#""""#, "null"] {
            let b = body(ok);
            assert_eq!(
                upstream_model(&parsed(&b), "qwen3-4b", &names).unwrap(),
                None,
                "{ok}"
            );
        }
        let other = body(r#""gpt-5""#);
        let err = upstream_model(&parsed(&other), "qwen3-4b", &names).unwrap_err();
        assert_eq!(err.status_code(), axum::http::StatusCode::NOT_FOUND);
        assert_eq!(err.code(), "model_not_found");
        let text = err.to_string();
        for part in [
            "\"gpt-5\"",
            "server.served_model_name",
            "server.model_names",
            "\"claude-haiku-4-5\"",
        ] {
            assert!(text.contains(part), "{part} in {text}");
        }
        // An escaped name is the name it spells; a name that is not a string is the engine's to
        // refuse, never renamed.
        let escaped = body(r#""claude-hai\u006bu-4-5""#);
        assert_eq!(
            upstream_model(&parsed(&escaped), "qwen3-4b", &names).unwrap(),
            Some("qwen3-4b")
        );
        for odd in ["5", "{}"] {
            let b = body(odd);
            assert_eq!(
                upstream_model(&parsed(&b), "qwen3-4b", &names).unwrap(),
                None,
                "{odd}"
            );
        }
        let none = std::collections::BTreeMap::new();
        assert_eq!(
            upstream_model(&parsed(&other), "qwen3-4b", &none).unwrap(),
            None
        );
    }

    /// The shape rules decide on the small view as on the whole body.
    #[test]
    fn shape_rules_see_the_same_in_the_view_as_in_the_body() {
        use ps_session_infer::ShapeRule;
        let rule = |f: fn(&mut ShapeRule)| {
            let mut r = ShapeRule {
                name: "r".into(),
                ..ShapeRule::default()
            };
            f(&mut r);
            r
        };
        let rules = [
            rule(|r| r.system_prefix = Some("You are".into())),
            rule(|r| r.last_user_prefix = Some(">> Task".into())),
            rule(|r| r.without_tools = Some(true)),
            rule(|r| r.max_tokens_at_most = Some(64)),
            rule(|r| r.model = Some("haiku".into())),
            rule(|r| {
                r.last_user_prefix = Some(">> Task".into());
                r.without_tools = Some(true);
                r.system_prefix = Some("You are".into());
            }),
        ];
        let msgs = [
            r#"[{"role":"user","content":">> Task: title"}]"#,
            r#"[{"role":"system","content":"You are an agent"},{"role":"user","content":">> Task: x"},{"role":"assistant","content":"a"}]"#,
            r#"[{"role":"developer","content":[{"type":"text","text":"You are"}]},{"role":"user","content":"q"},{"role":"user","content":[{"type":"text","text":">> Task"}]},{"role":"tool","content":null}]"#,
            r#"[{"role":"assistant","content":"You are"},{"role":"tool","content":">> Task"}]"#,
            r#"[{"role":"system","content":"  You are"},{"role":"user","content":">> Task","role":"assistant"}]"#,
        ];
        let extras = [
            "",
            r#","tools":[]"#,
            r#","tools":[{"type":"function"}]"#,
            r#","tools":null"#,
            r#","max_tokens":64"#,
            r#","max_tokens":65,"max_completion_tokens":10"#,
            r#","max_tokens":"64""#,
            r#","model":"haiku""#,
            r#","model":"haiku-2""#,
            r#","model":null"#,
        ];
        for m in msgs {
            for extra in extras {
                let body = format!(r#"{{"messages":{m}{extra}}}"#);
                let r = parse(body.as_bytes(), &HeaderMap::new()).expect("valid");
                let (view, whole) = (
                    r.shape_view(&[]).expect("view"),
                    r.body_map().expect("body"),
                );
                for rule in &rules {
                    assert_eq!(rule.matches(&view), rule.matches(&whole), "{rule:?} {body}");
                }
            }
        }
    }

    /// Values a tree parse may refuse (or not), placed where the proxy reads nothing and where
    /// it reads: a body is refused exactly when a tree parse refuses it, with the same message.
    #[test]
    fn bodies_are_refused_exactly_when_a_tree_parse_refuses_them() {
        let deep = |d: usize| format!("{}1{}", "[".repeat(d), "]".repeat(d));
        let mut values: Vec<String> = [
            "1e400",
            "-1e400",
            "1E+999",
            "2.5e-999",
            "1e308",
            "2e308",
            "1.7976931348623157e308",
            "-0.0",
            "12.50",
            r#""\ud800""#,
            r#""\uDC00x""#,
            r#""\ud83d\ude00""#,
            r#""a\u00e9\n\"""#,
            "null",
            "{\"k\":1,\n \"k\":1e999}",
        ]
        .map(str::to_owned)
        .to_vec();
        values.extend([
            deep(98),
            deep(101),
            deep(126),
            deep(130),
            "9".repeat(250),
            "9".repeat(330),
        ]);
        let places: &[fn(&str) -> String] = &[
            |v| {
                format!(
                    r#"{{"messages":[{{"role":"user","content":"hi"}}],"tools":[{{"type":"function","function":{{"name":"f","parameters":{v}}}}}]}}"#
                )
            },
            |v| {
                format!(
                    r#"{{"messages":[{{"role":"user","content":[{{"type":"text","text":"x","v":{v}}}]}}]}}"#
                )
            },
            |v| format!(r#"{{"messages":[{{"role":"user","content":"x","extra":{v}}}]}}"#),
            |v| format!(r#"{{"messages":[{{"role":"user","content":"x"}}], "session_id" : {v}}}"#),
            |v| {
                format!(
                    r#"{{"chat_template_kwargs":{{"a":{v}}},"messages":[{{"role":"user","content":"x"}}]}}"#
                )
            },
            |v| {
                format!(
                    "{{\"unknown\":\n{v},\"messages\":[{{\"role\":\"user\",\"content\":\"x\"}}],\"unknown\":0}}"
                )
            },
        ];
        for v in &values {
            for place in places {
                let body = place(v);
                let got = parse(body.as_bytes(), &HeaderMap::new());
                match serde_json::from_str::<Value>(&body) {
                    Ok(_) => assert!(got.is_ok(), "{body}: {:?}", got.err()),
                    Err(e) => assert_eq!(
                        got.err().map(|e| e.to_string()),
                        Some(ApiError::InvalidJson(e.to_string()).to_string()),
                        "{body}"
                    ),
                }
            }
            // As a message's key, when a string.
            if v.starts_with('"') {
                let body = format!(r#"{{"messages":[{{"role":"user","content":"x",{v}:1}}]}}"#);
                let got = parse(body.as_bytes(), &HeaderMap::new());
                match serde_json::from_str::<Value>(&body) {
                    Ok(_) => assert!(got.is_ok(), "{body}"),
                    Err(e) => assert_eq!(
                        got.err().map(|e| e.to_string()),
                        Some(ApiError::InvalidJson(e.to_string()).to_string()),
                        "{body}"
                    ),
                }
            }
        }
    }

    /// The same messages as when the body was parsed into a tree.
    #[test]
    fn bad_bodies_get_the_same_messages() {
        let cases: &[(&[u8], &str)] = &[
            (b"{not json", "key must be a string at line 1 column 2"),
            (b"", "EOF while parsing a value at line 1 column 0"),
            (b"{\"a\":1} x", "trailing characters at line 1 column 9"),
            (b"[1]", "`body` must be a JSON object, got an array"),
            (b"\"x\"", "`body` must be a JSON object, got a string"),
            (b"{}", "`messages` is required"),
            (br#"{"messages":null}"#, "`messages` is required"),
            (
                br#"{"messages":"hi"}"#,
                "`messages` must be an array, got a string",
            ),
            (
                br#"{"messages":[]}"#,
                "`messages` must hold at least one message",
            ),
            (
                br#"{"messages":[1]}"#,
                "`messages[0]` must be an object, got a number",
            ),
            (
                br#"{"messages":[{"role":"user"},{"content":"x"}]}"#,
                "`messages[1].role` is required",
            ),
            (
                br#"{"messages":[{"role":null}]}"#,
                "`messages[0].role` must be a string, got null",
            ),
            (
                br#"{"messages":[{"role":"user","content":5}]}"#,
                "`messages[0].content` must be a string, an array of parts or null, got a number",
            ),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"stream":"yes"}"#,
                "`stream` must be a boolean, got a string",
            ),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"tools":{}}"#,
                "`tools` must be an array, got an object",
            ),
            // What a tree parse refuses anywhere in the body, refused as before (invalid_json).
            (
                br#"{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"n":{"type":"number","maximum":1e400}}}}}]}"#,
                "the request body is not valid JSON: number out of range at line 1 column 176",
            ),
            (
                br#"{"messages":[{"role":"user","content":[{"type":"text","text":"x","n":-1e400}]}]}"#,
                "number out of range",
            ),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"session_id":1e400}"#,
                "number out of range",
            ),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"a":1e400},"other":[1E+999]}"#,
                "number out of range",
            ),
            (
                br#"{"messages":[{"role":"user","content":"x","\ud800":1}]}"#,
                "unexpected end of hex escape",
            ),
            (
                br#"{"messages":[{"role":"user","content":"\ud83d"}]}"#,
                "unexpected end of hex escape",
            ),
        ];
        for (body, message) in cases {
            let e = parse(body, &HeaderMap::new()).expect_err("must fail");
            assert!(
                e.to_string().contains(message),
                "{}: {e}",
                String::from_utf8_lossy(body)
            );
        }
    }

    /// Unknown fields reach the upstream as the client wrote them (same bytes, same order); the
    /// fields we set keep their place, those we add come last.
    #[test]
    fn unknown_fields_are_forwarded_as_written() {
        let body = br#"{"foo": {"b": 1.50, "a": "\u00e9"}, "messages": [{"role": "user", "content": "hi", "x": [1e3]}], "session_id": "s", "top_logprobs": 0, "zeta": null, "stream": true, "stream_options": {"include_usage": true}, "logprobs": false, "turn_type": "main"}"#;
        let r = parse(body, &HeaderMap::new()).expect("valid");
        let opts = ForwardOptions {
            served_model_name: "q\"3",
            model: None,
            stream: false,
            return_token_ids: true,
            full_distribution: false,
            routed_experts: false,
        };
        let f = forward_body(&r, &opts);
        let text = std::str::from_utf8(&f.body).expect("utf-8");
        assert_eq!(
            text,
            r#"{"foo":{"b": 1.50, "a": "\u00e9"},"messages":[{"role": "user", "content": "hi", "x": [1e3]}],"top_logprobs":1,"zeta":null,"stream":false,"logprobs":true,"model":"q\"3","return_token_ids":true}"#
        );
        assert!(f.return_token_ids);
        // Equal in meaning to the tree the proxy forwarded before.
        let mut expected: Value = serde_json::from_slice(body).expect("JSON");
        let obj = expected.as_object_mut().expect("object");
        for k in ["session_id", "turn_type", "stream_options"] {
            obj.shift_remove(k);
        }
        obj.insert("logprobs".into(), json!(true));
        obj.insert("top_logprobs".into(), json!(1));
        obj.insert("model".into(), json!("q\"3"));
        obj.insert("stream".into(), json!(false));
        obj.insert("return_token_ids".into(), json!(true));
        let sent: Value = serde_json::from_slice(&f.body).expect("JSON");
        assert_eq!(sent, expected);
        // A client's own `return_token_ids: false` is kept and means no ids were asked for.
        let r = parse(
            br#"{"messages":[{"role":"user","content":"x"}],"return_token_ids":false}"#,
            &HeaderMap::new(),
        )
        .expect("valid");
        let f = forward_body(&r, &opts);
        assert!(!f.return_token_ids);
        assert!(
            std::str::from_utf8(&f.body)
                .expect("utf-8")
                .contains(r#""return_token_ids":false"#)
        );
    }

    #[test]
    fn the_request_parts_capture_needs_are_read_from_the_text() {
        let r = parse(
            br#"{"messages":[{"role":"system","content":"s"},{"role":"user","content":"u"}],"tools":null,"chat_template_kwargs":{"enable_thinking":false},"session_id":7}"#,
            &HeaderMap::new(),
        )
        .expect("valid");
        assert_eq!(r.session.session_id.as_deref(), Some("7"));
        // No assistant message: only the last message is read as a tree.
        assert_eq!(
            r.added_messages(),
            &[json!({"role": "user", "content": "u"})]
        );
        assert_eq!(r.messages().expect("readable").len(), 2);
        assert!(r.tools_json().is_none());
        assert_eq!(
            r.template_kwargs_json().map(RawValue::get),
            Some(r#"{"enable_thinking":false}"#)
        );
        // What the request adds after its last assistant message, in order.
        let r = parse(
            br#"{"messages":[{"role":"user","content":"u"},{"role":"assistant","content":"a","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"1","content":"t"},{"role":"user","content":"v"}]}"#,
            &HeaderMap::new(),
        )
        .expect("valid");
        assert_eq!(
            r.added_messages(),
            &[
                json!({"role": "tool", "tool_call_id": "1", "content": "t"}),
                json!({"role": "user", "content": "v"})
            ]
        );
    }
}

/// `full_distribution` replaces the three truncating parameters in place, appends the missing
/// ones before the ids flag (which stays last, so that it can be taken off again), and keeps
/// everything else byte for byte.
#[test]
fn full_distribution_sets_three_parameters_and_keeps_the_ids_flag_last() {
    let req = parse(
        br#"{"messages":[{"role":"user","content":"hi"}],"top_p":0.9,"temperature":0.7,"x":[1.50]}"#,
        &HeaderMap::new(),
    )
    .expect("valid");
    let f = super::forward_body(
        &req,
        &ForwardOptions {
            served_model_name: "m",
            model: None,
            stream: false,
            return_token_ids: true,
            full_distribution: true,
            routed_experts: false,
        },
    );
    let text = std::str::from_utf8(&f.body).unwrap();
    assert!(
        text.ends_with(r#","top_k":-1,"min_p":0,"return_token_ids":true}"#),
        "{text}"
    );
    assert!(
        text.contains(r#""top_p":1,"temperature":0.7,"x":[1.50]"#),
        "{text}"
    );
    let without = without_injected_ids(&f.body);
    assert!(
        !std::str::from_utf8(&without)
            .unwrap()
            .contains("return_token_ids")
    );
    assert_eq!(
        req.sampling(),
        ps_core::Sampling {
            temperature: Some(0.7),
            top_p: Some(0.9),
            ..Default::default()
        }
    );
    for (body, top_p, top_k, unreadable) in [
        (
            &br#"{"messages":[{"role":"user","content":"x"}],"top_p":"0.9","top_k":20.0}"#[..],
            Some(0.9),
            Some(20),
            false,
        ),
        (
            br#"{"messages":[{"role":"user","content":"x"}],"top_p":null,"top_k":-1}"#,
            None,
            Some(-1),
            false,
        ),
        (
            br#"{"messages":[{"role":"user","content":"x"}],"top_p":"most","top_k":2}"#,
            None,
            Some(2),
            true,
        ),
        (
            br#"{"messages":[{"role":"user","content":"x"}],"top_k":2.5}"#,
            None,
            None,
            true,
        ),
    ] {
        let s = parse(body, &HeaderMap::new()).expect("valid").sampling();
        assert_eq!((s.top_p, s.top_k, s.unreadable), (top_p, top_k, unreadable));
    }
}

/// The experts flag we add comes off again by itself (the answer would be too large with it),
/// leaving the ids flag last and every other byte in place.
#[test]
fn the_experts_flag_we_add_comes_off_again() {
    let req = parse(
        br#"{"messages":[{"role":"user","content":"say \"return_routed_experts\":true"}],"extra":{"k":1,"return_routed_experts":true}}"#,
        &HeaderMap::new(),
    )
    .expect("valid");
    let f = super::forward_body(
        &req,
        &ForwardOptions {
            served_model_name: "m",
            model: None,
            stream: false,
            return_token_ids: true,
            full_distribution: false,
            routed_experts: true,
        },
    );
    assert!(f.injected_experts);
    let text = std::str::from_utf8(&f.body).unwrap();
    assert!(
        text.ends_with(r#","return_routed_experts":true,"return_token_ids":true}"#),
        "{text}"
    );
    let without = without_injected_experts(&f.body);
    let v: Value = serde_json::from_slice(&without).expect("JSON");
    assert!(v.get("return_routed_experts").is_none());
    assert_eq!(v["return_token_ids"], true);
    // The client's nested flag of the same bytes stays: only ours, the last, comes off.
    assert_eq!(v["extra"]["return_routed_experts"], true);
    assert_eq!(
        without.len() + r#","return_routed_experts":true"#.len(),
        f.body.len()
    );
    let neither: Value = serde_json::from_slice(&without_injected_ids(&without)).expect("JSON");
    assert!(neither.get("return_token_ids").is_none());
}
