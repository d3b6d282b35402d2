//! `/generate` against a spawned fake: judge votes and teacher prompt logprobs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{generate, spawn};
use ps_fake_sglang::{teacher_logprob, teacher_top_logprobs};
use serde_json::{Value, json};

/// The last `\boxed{±d}` value, as the judge contract parses it.
fn boxed(text: &str) -> Option<i64> {
    let mut last = None;
    let mut rest = text;
    while let Some(i) = rest.find("\\boxed{") {
        rest = &rest[i + 7..];
        if let Some(end) = rest.find('}') {
            last = rest[..end].trim_start_matches('+').parse().ok();
        }
    }
    last
}

#[tokio::test]
async fn scripted_votes_cycle_per_text() {
    let fake = spawn().await;
    let prompt = "Evaluate the response. FAKE_VOTES=1,-1,x";
    let mut got = Vec::new();
    for _ in 0..4 {
        let body: Value = generate(
            &fake,
            json!({"text": prompt, "sampling_params": {"temperature": 0.6, "max_new_tokens": 4096,
                   "skip_special_tokens": false, "no_stop_trim": true}}),
        )
        .await
        .json()
        .await
        .expect("json");
        got.push(boxed(body["text"].as_str().expect("text")));
    }
    assert_eq!(got, vec![Some(1), Some(-1), None, Some(1)]);
    // Another text has its own counter.
    let body: Value = generate(&fake, json!({"text": "other FAKE_VOTES=0"}))
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(boxed(body["text"].as_str().expect("text")), Some(0));
}

#[tokio::test]
async fn hint_judge_answers_with_a_hint() {
    let fake = spawn().await;
    let body: Value = generate(
        &fake,
        json!({"text": "Wrap the hint in [HINT_START] and [HINT_END]. FAKE_VOTES=1,-1"}),
    )
    .await
    .json()
    .await
    .expect("json");
    let text = body["text"].as_str().expect("text");
    let start = text.rfind("[HINT_START]").expect("hint start") + "[HINT_START]".len();
    let end = text.rfind("[HINT_END]").expect("hint end");
    assert!(text[start..end].trim().len() > 10, "{text}");
    assert_eq!(boxed(text), Some(1));
    let body: Value = generate(
        &fake,
        json!({"text": "Wrap the hint in [HINT_START] and [HINT_END]. FAKE_VOTES=1,-1"}),
    )
    .await
    .json()
    .await
    .expect("json");
    let text = body["text"].as_str().expect("text");
    assert_eq!(boxed(text), Some(-1));
    assert_eq!(text.matches("[HINT_START]").count(), 0);
}

#[tokio::test]
async fn unscripted_judge_is_deterministic_and_well_formed() {
    let fake = spawn().await;
    let tok = fake.state().tokenizer().clone();
    let eos = tok.eos_token_id().expect("eos");
    let req = json!({"text": "Score the assistant turn with \\boxed{1}, \\boxed{-1} or \\boxed{0}.",
                     "return_logprob": true, "rid": "req-7"});
    let a: Value = generate(&fake, req.clone())
        .await
        .json()
        .await
        .expect("json");
    let b: Value = generate(&fake, req).await.json().await.expect("json");
    assert_eq!(a["text"], b["text"]);
    let v = boxed(a["text"].as_str().expect("text"));
    assert!(matches!(v, Some(-1..=1)), "{v:?}");
    let ids: Vec<u32> = serde_json::from_value(a["output_ids"].clone()).expect("ids");
    assert_eq!(*ids.last().expect("ids"), eos);
    let meta = &a["meta_info"];
    assert_eq!(meta["id"], "req-7");
    assert_eq!(
        meta["finish_reason"],
        json!({"type": "stop", "matched": eos})
    );
    assert_eq!(meta["completion_tokens"], json!(ids.len()));
    assert_eq!(meta["cached_tokens"], 0);
    assert!(meta["e2e_latency"].as_f64().is_some());
    let out = meta["output_token_logprobs"]
        .as_array()
        .expect("output lps");
    assert_eq!(out.len(), ids.len());
    for (e, id) in out.iter().zip(&ids) {
        assert_eq!(e[1], json!(id));
        assert!(e[2].is_null(), "no text unless return_text_in_logprobs");
        assert!(e[0].as_f64().is_some_and(|lp| lp <= 0.0 && lp > -5.0));
    }
    // Default logprob_start_len -1: one prompt entry, and it is null.
    let input = meta["input_token_logprobs"].as_array().expect("input lps");
    assert_eq!(input.len(), 1);
    assert!(input[0][0].is_null());
    // Text prompt tokens: prompt_tokens is the encoded length.
    let prompt_len = tok
        .encode("Score the assistant turn with \\boxed{1}, \\boxed{-1} or \\boxed{0}.")
        .expect("encode")
        .len();
    assert_eq!(meta["prompt_tokens"], json!(prompt_len));
}

#[tokio::test]
async fn max_new_tokens_cuts() {
    let fake = spawn().await;
    let body: Value = generate(
        &fake,
        json!({"text": "judge this", "sampling_params": {"max_new_tokens": 3}}),
    )
    .await
    .json()
    .await
    .expect("json");
    assert_eq!(body["output_ids"].as_array().expect("ids").len(), 3);
    assert_eq!(
        body["meta_info"]["finish_reason"],
        json!({"type": "length", "length": 3})
    );
}

#[tokio::test]
async fn teacher_input_logprobs_follow_the_sglang_layout() {
    let fake = spawn().await;
    let tok = fake.state().tokenizer().clone();
    let ids = tok
        .encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nHello there<|im_end|>\n")
        .expect("encode");
    let l = ids.len();
    let t = 4;
    let start = l - t;
    let body: Value = generate(
        &fake,
        json!({"input_ids": ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": 0,
               "skip_special_tokens": false}, "return_logprob": true, "logprob_start_len": start}),
    )
    .await
    .json()
    .await
    .expect("json");
    assert_eq!(body["text"], "");
    assert_eq!(body["output_ids"], json!([]));
    let meta = &body["meta_info"];
    assert_eq!(
        meta["finish_reason"],
        json!({"type": "length", "length": 0})
    );
    assert_eq!(meta["prompt_tokens"], json!(l));
    assert_eq!(meta["completion_tokens"], 0);
    assert_eq!(meta["output_token_logprobs"], json!([]));
    let input = meta["input_token_logprobs"].as_array().expect("input");
    assert_eq!(input.len(), l - start);
    assert_eq!(input[0], json!([null, ids[start], null]));
    for (j, e) in input.iter().enumerate().skip(1) {
        let pos = start + j;
        assert_eq!(
            *e,
            json!([teacher_logprob(ids[pos - 1], ids[pos], pos), ids[pos], null])
        );
    }
    assert!(meta.get("input_top_logprobs").is_none());

    // Top-k: a second request with top_logprobs_num.
    let k = 3;
    let body: Value = generate(
        &fake,
        json!({"input_ids": ids, "sampling_params": {"max_new_tokens": 0}, "return_logprob": true,
               "logprob_start_len": start, "top_logprobs_num": k, "return_text_in_logprobs": true}),
    )
    .await
    .json()
    .await
    .expect("json");
    let meta = &body["meta_info"];
    let top = meta["input_top_logprobs"].as_array().expect("top");
    assert_eq!(top.len(), l - start);
    assert!(top[0].is_null());
    for (j, row) in top.iter().enumerate().skip(1) {
        let pos = start + j;
        let row = row.as_array().expect("row");
        let expected = teacher_top_logprobs(ids[pos - 1], ids[pos], pos, k);
        assert_eq!(row.len(), k);
        for (e, (lp, id)) in row.iter().zip(&expected) {
            assert_eq!(e[0].as_f64(), Some(*lp));
            assert_eq!(e[1], json!(id));
            assert_eq!(e[2], json!(tok.token_text(*id)));
        }
        assert!(row.iter().any(|e| e[1] == json!(ids[pos])
            && e[0].as_f64() == Some(teacher_logprob(ids[pos - 1], ids[pos], pos))));
    }
    // Text is filled when return_text_in_logprobs.
    assert_eq!(
        meta["input_token_logprobs"][0][2],
        json!(tok.token_text(ids[start]))
    );

    // logprob_start_len 0: L entries, entry 0 null.
    let body: Value = generate(
        &fake,
        json!({"input_ids": ids, "sampling_params": {"max_new_tokens": 0}, "return_logprob": true,
               "logprob_start_len": 0}),
    )
    .await
    .json()
    .await
    .expect("json");
    let input = body["meta_info"]["input_token_logprobs"]
        .as_array()
        .expect("input");
    assert_eq!(input.len(), l);
    assert!(input[0][0].is_null());
    assert!(input[1..].iter().all(|e| e[0].is_f64()));
}

#[tokio::test]
async fn logprob_start_len_too_large_is_400() {
    let fake = spawn().await;
    for start in [3, 4] {
        let resp = generate(
            &fake,
            json!({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 0},
                   "return_logprob": true, "logprob_start_len": start}),
        )
        .await;
        assert_eq!(resp.status(), 400);
        let body: Value = resp.json().await.expect("json");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
    }
    // Neither text nor input_ids.
    let resp = generate(&fake, json!({"sampling_params": {}})).await;
    assert_eq!(resp.status(), 400);
    assert!(resp.json::<Value>().await.expect("json")["error"]["message"].is_string());
}

#[tokio::test]
async fn batch_inputs_answer_arrays() {
    let fake = spawn().await;
    let body: Value = generate(
        &fake,
        json!({"text": ["a FAKE_VOTES=1", "b FAKE_VOTES=-1"]}),
    )
    .await
    .json()
    .await
    .expect("json");
    let arr = body.as_array().expect("array");
    assert_eq!(arr.len(), 2);
    assert_eq!(boxed(arr[0]["text"].as_str().expect("t")), Some(1));
    assert_eq!(boxed(arr[1]["text"].as_str().expect("t")), Some(-1));

    let body: Value = generate(
        &fake,
        json!({"input_ids": [[1, 2, 3], [4, 5]], "sampling_params": {"max_new_tokens": 0},
               "return_logprob": true, "logprob_start_len": [0, 1]}),
    )
    .await
    .json()
    .await
    .expect("json");
    let arr = body.as_array().expect("array");
    assert_eq!(arr.len(), 2);
    assert_eq!(
        arr[0]["meta_info"]["input_token_logprobs"]
            .as_array()
            .expect("a")
            .len(),
        3
    );
    assert_eq!(
        arr[1]["meta_info"]["input_token_logprobs"]
            .as_array()
            .expect("b")
            .len(),
        1
    );
}

#[tokio::test]
async fn put_and_stream_work() {
    let fake = spawn().await;
    let resp = reqwest::Client::new()
        .put(fake.generate_url())
        .json(&json!({"text": "judge FAKE_VOTES=1"}))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    let text = common::generate(&fake, json!({"text": "judge FAKE_VOTES=1", "stream": true}))
        .await
        .text()
        .await
        .expect("text");
    assert!(text.ends_with("data: [DONE]\n\n"));
    let events: Vec<Value> = common::sse_events(text)
        .into_iter()
        .map(|e| e.expect("json"))
        .collect();
    assert!(events.len() > 2);
    // Cumulative text; finish_reason only at the end.
    let last = events.last().expect("last");
    assert_eq!(boxed(last["text"].as_str().expect("t")), Some(1));
    assert!(events[0]["meta_info"]["finish_reason"].is_null());
    assert_eq!(last["meta_info"]["finish_reason"]["type"], "stop");
    assert_eq!(
        last["output_ids"].as_array().expect("ids").len(),
        events.len()
    );
}
