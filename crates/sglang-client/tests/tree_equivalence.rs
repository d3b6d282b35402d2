//! The raw reading of answers and chunks against the tree reading it replaced
//! (`ps_test_support::tree_oracle`): the same result for every input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use proptest::prelude::*;
use ps_core::RolloutResponse;
use ps_sglang_client::{Answer, StreamAssembler, engine_ids, rollout_from_response};
use ps_test_support::tree_oracle as tree;
use serde_json::{Value, json};

/// Any JSON value, a few levels deep, with the keys the readers look at over-represented.
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
        Just("id".to_owned()),
        Just("type".to_owned()),
        Just("index".to_owned()),
        Just("logprobs".to_owned()),
        Just("logprob".to_owned()),
        Just("token".to_owned()),
        Just("finish_reason".to_owned()),
        Just("matched_stop".to_owned()),
        Just("error".to_owned()),
        Just("message".to_owned()),
        Just("token_ids".to_owned()),
        Just("response_token_ids".to_owned()),
        Just("prompt_token_ids".to_owned()),
        Just("sglext".to_owned()),
        Just("output_ids".to_owned()),
        Just("input_ids".to_owned()),
        Just("metadata".to_owned()),
        Just("weight_version".to_owned()),
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
    leaf.prop_recursive(6, 96, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key.clone(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// The keys the readers look at, for generated text.
const ANSWER_KEYS: &[&str] = &[
    "choices",
    "delta",
    "content",
    "reasoning_content",
    "tool_calls",
    "function",
    "arguments",
    "index",
    "logprobs",
    "logprob",
    "token",
    "top_logprobs",
    "finish_reason",
    "matched_stop",
    "error",
    "message",
    "token_ids",
    "response_token_ids",
    "prompt_token_ids",
    "sglext",
    "output_ids",
    "metadata",
    "weight_version",
];

/// `text` as the parts of choice 0 (message, delta, log-probs, finish), with repeated keys.
fn in_choice(text: &str) -> String {
    format!(
        "{{\"choices\" : [ {{\"index\":0,\"message\":{text},\"delta\":{text},\n\"logprobs\":{{\"content\":[{text}]}},\"finish_reason\":{text},\"sglext\":{text},\"index\":0}} ],\"metadata\":{text}}}"
    )
}

fn lp(token: &str, logprob: f64) -> Value {
    json!({"token": token, "bytes": token.as_bytes(), "logprob": logprob,
           "top_logprobs": [{"token": token, "logprob": logprob}]})
}

/// Answers of every shape the builds send (docs/upstream-protocols.md, 1.2, 1.5, 1.6, 5).
fn answers() -> Vec<Value> {
    let choice = |extra: Value| {
        let mut c = json!({"index": 0,
            "message": {"role": "assistant", "content": "Hi", "reasoning_content": "r",
                        "tool_calls": [{"id": "c", "type": "function",
                                        "function": {"name": "f", "arguments": "{}"}}]},
            "logprobs": {"content": [lp("Hi", -0.5), lp("\u{e9}\n\"", -1e-7), lp("<|im_end|>", -0.1),
                                     {"token": "x", "logprob": null}, 5]},
            "finish_reason": "tool_calls", "matched_stop": null});
        for (k, v) in extra.as_object().cloned().unwrap_or_default() {
            c[k] = v;
        }
        c
    };
    vec![
        json!({"id": "a", "choices": [choice(json!({"response_token_ids": [1, 2, 3], "prompt_token_ids": [9]}))],
               "metadata": {"weight_version": "v3"}}),
        json!({"choices": [choice(json!({"token_ids": [1, 2, 3]}))], "prompt_token_ids": [9, 8],
               "metadata": {"weight_version": 2.50}}),
        json!({"choices": [choice(json!({"sglext": {"output_ids": [1, 2, 3], "input_ids": [4]}}))]}),
        json!({"choices": [choice(json!({}))], "sglext": {"output_ids": [[1, 2, 3]], "input_ids": [[4]]}}),
        json!({"choices": [choice(json!({"meta_info": {"output_token_logprobs": [[-0.5, 1, null], [-1e-7, 2, "x"], [-0.1, 3, null]],
                                                         "weight_version": "m"}, "prompt_token_ids": [1]}))]}),
        json!({"choices": [choice(json!({"matched_stop": 151645, "finish_reason": "stop", "token_ids": [1, 2]}))]}),
        json!({"choices": [choice(json!({"matched_stop": "</s>", "logprobs": null}))]}),
        json!({"choices": [null, choice(json!({}))], "sglext": {"output_ids": [1], "input_ids": [2]}}),
        json!({"choices": [], "usage": {}}),
        json!({"choices": {"0": 1}}),
        json!({"object": "error", "message": "m"}),
    ]
}

#[test]
fn every_build_s_answer_reads_alike() {
    for a in answers() {
        assert_eq!(
            rollout_from_response(&a),
            tree::rollout_from_response(&a),
            "{a}"
        );
        assert_eq!(engine_ids(&a), tree::engine_ids(&a), "{a}");
        let text = a.to_string();
        let parsed = Answer::parse("u", Bytes::from(text)).expect("an object");
        assert_eq!(
            parsed.rollout().expect("readable"),
            tree::rollout_from_response(&a),
            "{a}"
        );
        assert_eq!(parsed.to_value().expect("a tree"), a);
    }
}

#[test]
fn a_malformed_answer_gives_the_error_it_gave() {
    let e = Answer::parse(
        "http://u/v1/chat/completions",
        Bytes::from_static(b"<html>oops"),
    )
    .expect_err("not JSON");
    assert_eq!(
        e.to_string(),
        "the policy upstream at http://u/v1/chat/completions sent a body that is not the expected JSON: expected value at line 1 column 1 (body starts with \"<html>oops\")"
    );
    for body in [&b"[1, 2]"[..], b"null", b"\"x\""] {
        let e = Answer::parse("http://u", Bytes::from_static(body)).expect_err("not an object");
        assert_eq!(
            e.to_string(),
            "the policy upstream at http://u sent a body that is not the expected JSON: the answer is not a JSON object"
        );
    }
    assert!(Answer::parse("u", Bytes::from_static(b"{\"choices\": [}")).is_err());
}

fn stream_of(chunks: &[String]) -> (Vec<Result<(), String>>, RolloutResponse) {
    let mut a = StreamAssembler::new();
    let fed = chunks.iter().map(|c| a.feed_str(c)).collect();
    (fed, a.finish())
}

fn tree_stream_of(chunks: &[String]) -> (Vec<Result<(), String>>, RolloutResponse) {
    let mut a = tree::StreamAssembler::new();
    let fed = chunks.iter().map(|c| a.feed_str(c)).collect();
    (fed, a.finish())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn any_answer_reads_alike(v in json_value()) {
        prop_assert_eq!(rollout_from_response(&v), tree::rollout_from_response(&v));
        prop_assert_eq!(engine_ids(&v), tree::engine_ids(&v));
        let wrapped = json!({"choices": [v.clone()], "sglext": v.clone(), "metadata": v.clone()});
        prop_assert_eq!(rollout_from_response(&wrapped), tree::rollout_from_response(&wrapped));
    }

    /// Text a `Value` never writes (repeated and escaped keys, whitespace, numbers out of
    /// range, surrogates, deep nesting): refused alike, and read alike when accepted.
    #[test]
    fn any_answer_text_reads_alike(text in ps_json::text_gen::object(ANSWER_KEYS)) {
        // Also as choice 0's parts, so that the readers' paths are reached.
        for text in [text.clone(), in_choice(&text)] {
            let tree = serde_json::from_str::<Value>(&text);
            let parsed = Answer::parse("u", Bytes::from(text.clone()));
            prop_assert_eq!(parsed.is_ok(), tree.is_ok(), "{}", &text);
            if let (Ok(parsed), Ok(tree)) = (parsed, tree) {
                prop_assert_eq!(parsed.rollout().ok(), Some(tree::rollout_from_response(&tree)), "{}", &text);
                prop_assert_eq!(parsed.to_value().expect("a tree"), tree, "{}", &text);
            }
        }
    }

    /// Cut or damaged answers (the single pass reads every byte itself) are refused exactly
    /// when a tree parse refuses them, with its error.
    #[test]
    fn damaged_answer_text_is_refused_alike(
        text in ps_json::text_gen::object(ANSWER_KEYS),
        at in any::<prop::sample::Index>(),
        byte in prop::sample::select(&b"{}[],:\"\\0-.eE+ \x01\x1ftnf\xff9u"[..]),
        cut in any::<bool>(),
    ) {
        let mut b = in_choice(&text).into_bytes();
        let i = at.index(b.len());
        if cut {
            b.truncate(i);
        } else {
            b[i] = byte;
        }
        let tree = serde_json::from_slice::<Value>(&b);
        let parsed = Answer::parse("u", Bytes::from(b.clone()));
        prop_assert_eq!(parsed.is_ok(), tree.as_ref().is_ok_and(Value::is_object));
        if let (Err(e), Err(tree_e)) = (parsed, tree) {
            let (e, tree_e) = (e.to_string(), tree_e.to_string());
            prop_assert!(e.contains(&tree_e), "{} / {}", e, tree_e);
        }
    }

    /// Arrays shaped like the engine's ids, and every near miss of that shape (leading
    /// zeros, signs, fractions, exponents, whitespace, long numbers, empty or doubled
    /// elements, a missing bracket): the single pass's integer loop accepts and refuses
    /// exactly what a tree parse does, and what it accepts reads as the tree.
    #[test]
    fn id_arrays_and_their_near_misses_read_alike(
        elems in prop::collection::vec(prop_oneof![
            8 => (0u32..200_000).prop_map(|n| n.to_string()),
            1 => prop::sample::select(&[
                "0", "00", "01", "-1", "-0", "1.5", "1e2", "1E+2", "0.0", " 7", "7 ", "\n7",
                "", "null", "\"7\"", "[1,2]", "{}", "+1", "7-", "1.", "4294967296",
            ][..]).prop_map(str::to_owned),
            1 => (190usize..210).prop_map(|n| "7".repeat(n)),
            // Out of an f64's range: the pass must leave these to a tree parse.
            1 => (310usize..400).prop_map(|n| "1".repeat(n)),
        ], 0..40),
        seps in prop::collection::vec(
            prop::sample::select(&[",", ",", ",", ",", ", ", ",,", ""][..]), 40),
        close in prop::sample::select(&["]", "]", "]", " ]", "", "]]", ",]"][..]),
    ) {
        let mut ids = String::from("[");
        for (i, e) in elems.iter().enumerate() {
            if i > 0 {
                ids.push_str(seps[i % seps.len()]);
            }
            ids.push_str(e);
        }
        ids.push_str(close);
        for text in [
            format!(r#"{{"choices":[{{"index":0}}],"prompt_token_ids":{ids}}}"#),
            format!(r#"{{"choices":[{{"token_ids":{ids},"index":0}}]}}"#),
        ] {
            let tree = serde_json::from_str::<Value>(&text);
            let parsed = Answer::parse("u", Bytes::from(text.clone()));
            prop_assert_eq!(parsed.is_ok(), tree.is_ok(), "{}", &text);
            if let (Ok(parsed), Ok(tree)) = (parsed, tree) {
                // Read through the spans the pass recorded, against the tree's reading.
                prop_assert_eq!(parsed.rollout().ok(), Some(tree::rollout_from_response(&tree)), "{}", &text);
                prop_assert_eq!(parsed.engine_ids(), tree::engine_ids(&tree), "{}", &text);
            }
        }
    }

    #[test]
    fn any_chunk_text_assembles_alike(
        chunks in prop::collection::vec(ps_json::text_gen::object(ANSWER_KEYS), 0..6)
    ) {
        let mut chunks = chunks;
        chunks.extend(chunks.clone().iter().map(|c| in_choice(c)));
        let (fed, r) = stream_of(&chunks);
        let (tree_fed, tree_r) = tree_stream_of(&chunks);
        prop_assert_eq!(fed, tree_fed);
        prop_assert_eq!(r, tree_r);
    }

    #[test]
    fn any_chunks_assemble_alike(chunks in prop::collection::vec(json_value(), 0..8)) {
        let mut texts: Vec<String> = chunks.iter().map(Value::to_string).collect();
        // Also as chunks of choice 0, so that the deltas are reached.
        texts.extend(chunks.iter().map(|c| json!({"choices": [{"index": 0, "delta": c, "logprobs": c,
            "finish_reason": c.get("finish_reason"), "matched_stop": c}]}).to_string()));
        texts.push("not json".into());
        let (fed, r) = stream_of(&texts);
        let (tree_fed, tree_r) = tree_stream_of(&texts);
        prop_assert_eq!(fed, tree_fed);
        prop_assert_eq!(r, tree_r);
    }
}
