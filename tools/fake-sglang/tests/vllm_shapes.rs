//! The fake's vLLM switch ([`Quirks::vllm`]) against the real vLLM 0.32's recorded answers
//! (`tests/fixtures/real/vllm-0.32.jsonl`): the same requests get answers of the same shape, key by
//! key where the proxy reads them (where the ids and the reasoning are, which keys name the
//! engine, which chunk carries what), so that the fast tests exercise what the real engine sends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use ps_fake_sglang::{FakeSglang, Quirks};
use serde_json::Value;

fn recorded() -> Vec<Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/real/vllm-0.32.jsonl"
    );
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The kind of a value: what shapes compare.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// What the proxy reads of a whole answer, as kinds (a missing key is "-").
fn whole_shape(v: &Value) -> Vec<(String, &'static str)> {
    let k = |v: Option<&Value>| v.map_or("-", kind);
    let c = &v["choices"][0];
    vec![
        ("prompt_token_ids".into(), k(v.get("prompt_token_ids"))),
        ("choice.token_ids".into(), k(c.get("token_ids"))),
        // `null`, or the id of a stop token other than the tokenizer's end token (the real
        // engine's forced tool call ended on `<|endoftext|>`): one shape.
        (
            "choice.stop_reason".into(),
            match c.get("stop_reason") {
                Some(Value::Number(_) | Value::Null) => "null or id",
                other => k(other),
            },
        ),
        ("choice.matched_stop".into(), k(c.get("matched_stop"))),
        (
            "choice.prompt_token_ids".into(),
            k(c.get("prompt_token_ids")),
        ),
        ("message.reasoning".into(), k(c["message"].get("reasoning"))),
        (
            "message.reasoning_content".into(),
            k(c["message"].get("reasoning_content")),
        ),
        (
            "message.tool_calls".into(),
            k(c["message"].get("tool_calls")),
        ),
        ("logprobs.content".into(), k(c["logprobs"].get("content"))),
    ]
}

/// What the proxy reads of a stream: the first chunk's, the token chunks' and the finishing
/// chunk's keys, and whether each token chunk carries exactly one id and one log-prob.
fn stream_shape(chunks: &[Value]) -> Vec<(String, String)> {
    let chunks: Vec<&Value> = chunks.iter().filter(|c| c.is_object()).collect();
    let k = |v: Option<&Value>| v.map_or("-", kind).to_owned();
    let first = chunks[0];
    let mut out = vec![
        (
            "first.prompt_token_ids".into(),
            k(first.get("prompt_token_ids")),
        ),
        (
            "first.delta.role".into(),
            k(first["choices"][0]["delta"].get("role")),
        ),
    ];
    let tokens: Vec<&&Value> = chunks[1..]
        .iter()
        .filter(|c| c["choices"].get(0).is_some())
        .collect();
    let one_each = tokens.iter().all(|c| {
        let ch = &c["choices"][0];
        let lps = ch["logprobs"]["content"].as_array().map_or(0, Vec::len);
        let ids = ch["token_ids"].as_array().map(Vec::len);
        lps == 1 && ids.is_none_or(|n| n == 1)
    });
    out.push((
        "token chunks: one id and one log-prob each".into(),
        one_each.to_string(),
    ));
    out.push((
        "token.token_ids".into(),
        k(tokens[0]["choices"][0].get("token_ids")),
    ));
    out.push((
        "token.delta.reasoning_content".into(),
        k(tokens
            .iter()
            .find_map(|c| c["choices"][0]["delta"].get("reasoning_content"))),
    ));
    let last = tokens.last().unwrap();
    out.push((
        "last.finish_reason".into(),
        k(last["choices"][0].get("finish_reason")),
    ));
    out.push((
        "last.stop_reason".into(),
        match last["choices"][0].get("stop_reason") {
            Some(Value::Number(_) | Value::Null) => "null or id".into(),
            other => k(other),
        },
    ));
    out.push((
        "last.matched_stop".into(),
        k(last["choices"][0].get("matched_stop")),
    ));
    out
}

#[tokio::test]
async fn the_fakes_vllm_answers_have_the_real_engines_shapes() {
    let fake = FakeSglang::builder()
        .quirks(Quirks::vllm())
        .spawn()
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let mut compared = 0;
    for r in recorded() {
        let path = r["request"]["path"].as_str().unwrap();
        let status = r["response"]["status"].as_u64().unwrap();
        let url = format!("{}{path}", fake.base_url());
        match (path, status) {
            ("/v1/models", 200) => {
                let v: Value = http.get(&url).send().await.unwrap().json().await.unwrap();
                assert_eq!(
                    v["data"][0]["owned_by"],
                    r["response"]["body"]["data"][0]["owned_by"]
                );
                compared += 1;
            }
            ("/get_model_info", 404) => {
                assert_eq!(http.get(&url).send().await.unwrap().status(), 404);
                compared += 1;
            }
            ("/v1/chat/completions", 200) => {
                let body = &r["request"]["body"];
                let resp = http.post(&url).json(body).send().await.unwrap();
                assert_eq!(resp.status(), 200, "{body}");
                if let Some(events) = r["response"]["events"].as_array() {
                    let text = resp.text().await.unwrap();
                    let ours: Vec<Value> = text
                        .lines()
                        .filter_map(|l| l.strip_prefix("data: "))
                        .filter(|d| *d != "[DONE]")
                        .map(|d| serde_json::from_str(d).unwrap())
                        .collect();
                    assert_eq!(stream_shape(&ours), stream_shape(events), "{body}");
                } else {
                    let ours: Value = resp.json().await.unwrap();
                    let real = &r["response"]["body"];
                    let (ours, real) = (whole_shape(&ours), whole_shape(real));
                    assert_eq!(ours, real, "{body}");
                }
                compared += 1;
            }
            _ => {}
        }
    }
    assert_eq!(
        compared, 9,
        "every recorded exchange of a shape the proxy reads"
    );
}
