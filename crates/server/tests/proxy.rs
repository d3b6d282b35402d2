//! The real server in front of the in-process fake SGLang: answers, forwarding, streaming, capture and
//! every bad input of the serving path.
//!
//! Long because it is the serving path's whole contract: one case per answer shape and bad input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::Duration;

use common::{Harness, Setup};
use futures::StreamExt;
use ps_chat_template::TurnInput;
use ps_core::PositionSource;
use ps_fake_sglang::{FakeSglang, Fault};
use ps_server::ServerOptions;
use serde_json::{Value, json};

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

fn conversation() -> Value {
    json!([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a colour."}
    ])
}

/// The server re-tokenizes every turn (`sglang.token_ids = "retokenize"`): the tests of that path.
fn retokenizing() -> Setup {
    let mut setup = Setup::default();
    setup.options.token_ids = ps_server::TokenIdsMode::Retokenize;
    setup
}

async fn post(h: &Harness, body: Value, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = client().post(h.chat_url()).json(&body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

/// Checks that every response position with a log-prob carries the value the upstream reported for
/// that very token: the (token, log-prob) pairs of the matched positions form, in order, a
/// subsequence of what the upstream reported, and every reported token is matched or counted.
fn assert_exact_alignment(h: &Harness, turn: &ps_core::CapturedTurn, reported: &[(String, f64)]) {
    let matched: Vec<(String, f64)> = turn
        .response_ids
        .iter()
        .zip(&turn.alignment.logprobs)
        .filter_map(|(&id, lp)| lp.map(|lp| (h.tokenizer.token_text(id), lp)))
        .collect();
    let mut it = reported.iter();
    for m in &matched {
        assert!(
            it.any(|r| r == m),
            "{m:?} is not the reported value of that token, in order"
        );
    }
    assert_eq!(
        matched.len() + turn.alignment.unmatched_upstream,
        reported.len()
    );
    // Positions without a log-prob are excluded unless they are the end-of-turn token the model sampled.
    for (i, src) in turn.alignment.sources.iter().enumerate() {
        let expected_mask = match src {
            PositionSource::Sampled | PositionSource::EosUnreported => 1,
            PositionSource::Unsampled => 0,
        };
        assert_eq!(turn.alignment.loss_mask[i], expected_mask, "position {i}");
    }
}

fn reported_of(logprobs: &Value) -> Vec<(String, f64)> {
    logprobs["content"]
        .as_array()
        .map(|c| {
            c.iter()
                .map(|e| {
                    (
                        e["token"].as_str().unwrap().to_owned(),
                        e["logprob"].as_f64().unwrap(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

const MAIN: &[(&str, &str)] = &[("x-session-id", "s1"), ("x-turn-type", "main")];

/// Reads a whole SSE body into its data payloads.
async fn sse_data(resp: reqwest::Response) -> Vec<String> {
    let text = resp.text().await.unwrap();
    text.split("\n\n")
        .filter_map(|ev| ev.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn non_streamed_main_turn_is_answered_unchanged_and_captured_exactly() {
    // The re-tokenization path (engine ids: tests/engine_ids.rs).
    let mut h = Harness::with(retokenizing()).await;
    let body = json!({"messages": conversation(), "logprobs": true, "top_logprobs": 2,
                      "foo": {"kept": true}, "session_done": "no"});
    let resp = post(&h, body, MAIN).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-session-id"], "s1");
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer["session_id"], "s1");
    assert_eq!(answer["object"], "chat.completion");
    let content = answer["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!content.is_empty());
    for e in answer["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
    {
        assert_eq!(e["top_logprobs"].as_array().unwrap().len(), 2);
    }
    let reported = reported_of(&answer["choices"][0]["logprobs"]);
    assert!(reported.len() > 10);

    // Forwarded: our keys stripped, log-probs forced, model filled, unknown fields kept.
    let sent = &h.fake().requests()[0].body;
    assert!(sent.get("session_done").is_none() && sent.get("session_id").is_none());
    assert_eq!(sent["logprobs"], true);
    assert_eq!(sent["model"], "default");
    assert_eq!(sent["foo"], json!({"kept": true}));

    let turn = h.next_turn().await;
    assert_eq!(turn.session_id, "s1");
    let expected = h
        .tokenizer
        .split_turn(&TurnInput {
            messages: conversation().as_array().unwrap(),
            tools: None,
            response_message: &answer["choices"][0]["message"],
            template_kwargs: None,
        })
        .unwrap();
    assert_eq!(turn.prompt_ids, expected.prompt_ids);
    assert_eq!(turn.response_ids, expected.response_ids);
    assert_eq!(turn.prompt_text, expected.prompt_text);
    // Every sampled token (think block, answer, <|im_end|>) carries its own log-prob, in order; the
    // template's trailing newline, never sampled, is marked and excluded.
    assert_exact_alignment(&h, &turn, &reported);
    let n = turn.response_ids.len();
    assert_eq!(h.tokenizer.token_text(turn.response_ids[n - 1]), "\n");
    assert_eq!(turn.alignment.sources[n - 1], PositionSource::Unsampled);
    let eos = n - 2;
    assert_eq!(Some(turn.response_ids[eos]), h.tokenizer.eos_token_id());
    assert_eq!(turn.alignment.sources[eos], PositionSource::Sampled);
    assert_eq!(turn.alignment.logprobs[eos], reported.last().map(|r| r.1));
    assert!(h.stop().await.is_empty());
}

#[tokio::test]
async fn a_client_that_did_not_ask_for_logprobs_does_not_get_them() {
    let mut h = Harness::start().await;
    let resp = post(&h, json!({"messages": conversation()}), MAIN).await;
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer["choices"][0]["logprobs"], Value::Null);
    assert_eq!(h.fake().requests()[0].body["logprobs"], true);
    assert_eq!(h.fake().requests()[0].body["top_logprobs"], 1);
    // The turn is still captured with log-probs.
    let turn = h.next_turn().await;
    assert!(
        turn.alignment
            .logprobs
            .iter()
            .filter(|l| l.is_some())
            .count()
            > 3
    );
}

#[tokio::test]
async fn streamed_main_turn_is_forwarded_and_captured_with_marked_positions() {
    // A server without parsers: empty deltas lose their log-probs (tests/engine_ids.rs runs the
    // other streaming behaviours).
    let mut h = Harness::with(Setup {
        fake: Some(FakeSglang::builder().quirks(ps_fake_sglang::Quirks {
            stream_logprobs: ps_fake_sglang::StreamLogprobs::DropEmptyDeltas,
            ..ps_fake_sglang::Quirks::default()
        })),
        ..Setup::default()
    })
    .await;
    let body = json!({"messages": conversation(), "stream": true, "logprobs": true});
    let resp = post(&h, body, MAIN).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let data = sse_data(resp).await;
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let first: Value = serde_json::from_str(&data[0]).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let mut content = String::new();
    let mut reported = Vec::new();
    for d in &data[..data.len() - 1] {
        let c: Value = serde_json::from_str(d).unwrap();
        assert_eq!(c["object"], "chat.completion.chunk");
        if let Some(ch) = c["choices"].get(0) {
            content.push_str(ch["delta"]["content"].as_str().unwrap_or(""));
            reported.extend(reported_of(&ch["logprobs"]));
        }
    }
    assert!(!content.is_empty());

    let turn = h.next_turn().await;
    assert!(turn.streamed);
    assert_eq!(turn.response_message["content"], content);
    assert_exact_alignment(&h, &turn, &reported);
    // The stream never reports the markers the reasoning parser swallows nor the end-of-turn token.
    let text = |i: usize| h.tokenizer.token_text(turn.response_ids[i]);
    let n = turn.response_ids.len();
    for (i, src) in turn.alignment.sources.iter().enumerate() {
        match text(i).as_str() {
            "<think>" | "</think>" => assert_eq!(*src, PositionSource::Unsampled, "position {i}"),
            "<|im_end|>" => assert_eq!(*src, PositionSource::EosUnreported, "position {i}"),
            _ if i == n - 1 => assert_eq!(*src, PositionSource::Unsampled),
            _ => {}
        }
    }
    // The end-of-turn token the model produced stays trainable; scaffolding does not.
    let eos = turn
        .response_ids
        .iter()
        .rposition(|&id| Some(id) == h.tokenizer.eos_token_id())
        .unwrap();
    assert_eq!(turn.alignment.loss_mask[eos], 1);
    assert_eq!(turn.alignment.loss_mask[n - 1], 0);
}

#[tokio::test]
async fn stream_chunks_reach_the_client_while_the_upstream_is_still_generating() {
    let setup = Setup {
        fake: Some(FakeSglang::builder().token_delay(Duration::from_millis(100))),
        ..Setup::default()
    };
    let h = Harness::with(setup).await;
    let resp = post(
        &h,
        json!({"messages": conversation(), "stream": true}),
        MAIN,
    )
    .await;
    let mut body = resp.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    // The upstream is still producing tokens: nothing was buffered until the end.
    assert_eq!(h.fake().in_flight(), 1);
    drop(body);
    h.stop().await;
}

#[tokio::test]
async fn a_client_that_goes_away_cancels_the_upstream_and_the_turn_is_not_used() {
    let setup = Setup {
        fake: Some(FakeSglang::builder().token_delay(Duration::from_millis(100))),
        ..Setup::default()
    };
    let h = Harness::with(setup).await;
    let resp = post(
        &h,
        json!({"messages": conversation(), "stream": true}),
        MAIN,
    )
    .await;
    let mut body = resp.bytes_stream();
    body.next().await.unwrap().unwrap();
    assert_eq!(h.fake().in_flight(), 1);
    drop(body);
    // Bounded (the fake panics past its wait): the upstream request is cancelled.
    h.fake().wait_for_in_flight_at_most(0).await;
    assert!(
        h.stop().await.is_empty(),
        "a cancelled turn is not captured"
    );
}

#[tokio::test]
async fn side_turns_are_forwarded_but_not_captured() {
    let h = Harness::start().await;
    let resp = post(
        &h,
        json!({"messages": conversation()}),
        &[("x-session-id", "s2"), ("x-turn-type", "side")],
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(h.fake().requests().len(), 1);
    assert!(h.stop().await.is_empty());
}

#[tokio::test]
async fn default_turn_type_applies_when_none_is_given() {
    let setup = Setup {
        options: ServerOptions::default(), // default_turn_type = side
        ..Setup::default()
    };
    let h = Harness::with(setup).await;
    let resp = post(
        &h,
        json!({"messages": conversation(), "session_id": "s3"}),
        &[],
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert!(h.stop().await.is_empty());
}

#[tokio::test]
async fn body_session_keys_select_main_turns() {
    let setup = Setup {
        options: ServerOptions::default(),
        ..Setup::default()
    };
    let mut h = Harness::with(setup).await;
    let resp = post(
        &h,
        json!({"messages": conversation(), "session_id": "b1", "turn_type": "main"}),
        &[],
    )
    .await;
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer["session_id"], "b1");
    assert_eq!(h.next_turn().await.session_id, "b1");
}

#[tokio::test]
async fn non_streamed_upstream_serves_a_streaming_client_with_synthesised_chunks() {
    let setup = Setup {
        options: ServerOptions {
            upstream_stream: false,
            default_turn_type: ps_core::DefaultTurnType::Main,
            ..ServerOptions::default()
        },
        ..Setup::default()
    };
    let mut h = Harness::with(setup).await;
    let resp = post(
        &h,
        json!({"messages": conversation(), "stream": true}),
        MAIN,
    )
    .await;
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let data = sse_data(resp).await;
    assert_eq!(data.len(), 3);
    assert_eq!(data[2], "[DONE]");
    assert_eq!(h.fake().requests()[0].body["stream"], false);
    let turn = h.next_turn().await;
    assert!(!turn.streamed);
    assert!(
        turn.alignment
            .logprobs
            .iter()
            .filter(|l| l.is_some())
            .count()
            > 10
    );
}

async fn assert_error(resp: reqwest::Response, status: u16, code: &str) -> String {
    assert_eq!(resp.status(), status);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(body["error"]["type"].is_string());
    body["error"]["message"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn bad_requests_get_clear_openai_errors_and_never_reach_the_upstream() {
    let h = Harness::start().await;
    let raw = |b: &'static str| {
        client()
            .post(h.chat_url())
            .header("content-type", "application/json")
            .body(b)
            .send()
    };
    assert_error(raw("{nope").await.unwrap(), 400, "invalid_json").await;
    let m = assert_error(raw("{}").await.unwrap(), 400, "missing_messages").await;
    assert!(m.contains("messages"));
    assert_error(
        raw(r#"{"messages": []}"#).await.unwrap(),
        400,
        "empty_messages",
    )
    .await;
    let m = assert_error(
        raw(r#"{"messages": "hi"}"#).await.unwrap(),
        400,
        "invalid_type",
    )
    .await;
    assert!(m.contains("`messages` must be an array"), "{m}");
    let m = assert_error(
        raw(r#"{"messages": [{"role": "user", "content": 3}]}"#)
            .await
            .unwrap(),
        400,
        "invalid_type",
    )
    .await;
    assert!(m.contains("messages[0].content"), "{m}");
    assert_error(
        raw(r#"{"messages": [{"role": "user", "content": "x"}], "turn_type": "both"}"#)
            .await
            .unwrap(),
        400,
        "invalid_turn_type",
    )
    .await;
    assert!(h.fake().requests().is_empty());
    assert!(h.stop().await.is_empty());
}

#[tokio::test]
async fn a_body_over_the_limit_is_413_naming_the_setting() {
    let setup = Setup {
        options: ServerOptions {
            max_body_bytes: 1024,
            ..ServerOptions::default()
        },
        ..Setup::default()
    };
    let h = Harness::with(setup).await;
    let big = "x".repeat(4096);
    let resp = post(
        &h,
        json!({"messages": [{"role": "user", "content": big}]}),
        MAIN,
    )
    .await;
    let m = assert_error(resp, 413, "body_too_large").await;
    assert!(m.contains("server.max_body_bytes"));
    assert!(h.fake().requests().is_empty());
}

#[tokio::test]
async fn client_key_is_required_when_configured() {
    let setup = Setup {
        options: ServerOptions {
            client_api_key: Some("s3cret".into()),
            default_turn_type: ps_core::DefaultTurnType::Main,
            ..ServerOptions::default()
        },
        ..Setup::default()
    };
    let mut h = Harness::with(setup).await;
    let body = json!({"messages": conversation()});
    let resp = client()
        .post(h.chat_url())
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["www-authenticate"], "Bearer");
    assert_error(resp, 401, "invalid_api_key").await;
    let resp = client()
        .post(h.chat_url())
        .bearer_auth("wrong")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_error(resp, 401, "invalid_api_key").await;
    let resp = client()
        .get(format!("{}/v1/models", h.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    assert!(h.fake().requests().is_empty());
    // Health stays open; the right key works.
    let resp = client()
        .get(format!("{}/health", h.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let resp = client()
        .post(h.chat_url())
        .bearer_auth("s3cret")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    h.next_turn().await;
}

#[tokio::test]
async fn refused_upstream_is_502_naming_the_url_and_the_key() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}/v1/chat/completions");
    let setup = Setup {
        chat_url: Some(url.clone()),
        fake: None,
        ..Setup::default()
    };
    let h = Harness::with(setup).await;
    let m = assert_error(
        post(&h, json!({"messages": conversation()}), MAIN).await,
        502,
        "upstream_unreachable",
    )
    .await;
    assert!(m.contains(&url) && m.contains("sglang.chat_url"), "{m}");
    let health: Value = client()
        .get(format!("{}/health", h.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["status"], "ok");
    assert_eq!(health["upstream"]["reachable"], false);
    assert!(h.stop().await.is_empty());
}

#[tokio::test]
async fn slow_upstream_is_504() {
    let setup = Setup {
        timeout: Duration::from_millis(300),
        ..Setup::default()
    };
    let h = Harness::with(setup).await;
    h.fake().push_fault(Fault::Delay(Duration::from_secs(3)));
    let m = assert_error(
        post(&h, json!({"messages": conversation()}), MAIN).await,
        504,
        "upstream_timeout",
    )
    .await;
    assert!(m.contains("sglang.timeout_sec"), "{m}");
    assert!(h.stop().await.is_empty());
}

#[tokio::test]
async fn upstream_errors_pass_through_with_status_and_body() {
    let h = Harness::start().await;
    for (status, body) in [
        (
            400u16,
            r#"{"object":"error","message":"bad","type":"BadRequestError","param":null,"code":400}"#,
        ),
        (
            503u16,
            r#"{"object":"error","message":"busy","type":"InternalServerError","param":null,"code":503}"#,
        ),
    ] {
        h.fake().push_fault(Fault::Status(status, body.into()));
        let resp = post(&h, json!({"messages": conversation()}), MAIN).await;
        assert_eq!(resp.status().as_u16(), status);
        assert_eq!(resp.text().await.unwrap(), body);
    }
    assert!(h.stop().await.is_empty());
}

#[tokio::test]
async fn non_json_upstream_answer_is_502() {
    let h = Harness::start().await;
    h.fake().push_fault(Fault::Garbage);
    assert_error(
        post(&h, json!({"messages": conversation()}), MAIN).await,
        502,
        "upstream_invalid_response",
    )
    .await;
    assert!(h.stop().await.is_empty());
}

#[tokio::test]
async fn a_stream_that_breaks_at_once_is_502() {
    let h = Harness::start().await;
    h.fake().push_fault(Fault::CutStream { after_chunks: 0 });
    let resp = post(
        &h,
        json!({"messages": conversation(), "stream": true}),
        MAIN,
    )
    .await;
    assert_eq!(resp.status(), 502);
    let body: Value = resp.json().await.unwrap();
    let code = body["error"]["code"].as_str().unwrap();
    // Depending on whether the upstream's head was flushed before it dropped the connection.
    assert!(
        ["upstream_stream_broken", "upstream_connection_lost"].contains(&code),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&h.fake().chat_url())
    );
    assert!(h.stop().await.is_empty());
}

#[tokio::test]
async fn a_stream_cut_midway_ends_with_an_error_event_and_no_turn() {
    let setup = Setup {
        fake: Some(FakeSglang::builder().token_delay(Duration::from_millis(20))),
        ..Setup::default()
    };
    let h = Harness::with(setup).await;
    h.fake().push_fault(Fault::CutStream { after_chunks: 3 });
    let resp = post(
        &h,
        json!({"messages": conversation(), "stream": true}),
        MAIN,
    )
    .await;
    assert_eq!(resp.status(), 200);
    let data = sse_data(resp).await;
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let err: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(err["error"]["code"], "upstream_stream_broken");
    assert!(
        h.stop().await.is_empty(),
        "a broken stream is not used for training"
    );
}

#[tokio::test]
async fn an_upstream_error_event_is_forwarded_and_the_turn_not_used() {
    let h = Harness::start().await;
    h.fake().push_fault(Fault::StreamError { after_chunks: 2 });
    let resp = post(
        &h,
        json!({"messages": conversation(), "stream": true}),
        MAIN,
    )
    .await;
    let data = sse_data(resp).await;
    assert!(data.iter().any(|d| d.contains("\"error\"")));
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    assert!(h.stop().await.is_empty());
}

#[tokio::test]
async fn health_and_models() {
    let h = Harness::start().await;
    let health: Value = client()
        .get(format!("{}/health", h.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["status"], "ok");
    assert_eq!(health["submission_enabled"], true);
    assert_eq!(health["upstream"]["reachable"], true);
    let healthz = client()
        .get(format!("{}/healthz", h.url))
        .send()
        .await
        .unwrap();
    assert_eq!(healthz.status(), 200);
    let models: Value = client()
        .get(format!("{}/v1/models", h.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "default");
}

#[tokio::test]
async fn requests_beyond_the_upstream_cap_get_429_and_a_stream_holds_its_permit_to_the_end() {
    let setup = Setup {
        options: ServerOptions {
            max_upstream: 1,
            default_turn_type: ps_core::DefaultTurnType::Main,
            ..ServerOptions::default()
        },
        fake: Some(FakeSglang::builder().token_delay(Duration::from_millis(50))),
        ..Setup::default()
    };
    let h = Harness::with(setup).await;
    let resp = post(
        &h,
        json!({"messages": conversation(), "stream": true}),
        MAIN,
    )
    .await;
    let mut body = resp.bytes_stream();
    body.next().await.unwrap().unwrap();
    // The stream is still open: its permit is held.
    let r = post(&h, json!({"messages": conversation()}), MAIN).await;
    assert_eq!(r.headers()["retry-after"], "1");
    let m = assert_error(r, 429, "too_many_requests").await;
    assert!(m.contains("sglang.max_concurrency"), "{m}");
    while body.next().await.is_some() {}
    drop(body);
    let r = post(&h, json!({"messages": conversation()}), MAIN).await;
    assert_eq!(
        r.status(),
        200,
        "the permit came back when the stream ended"
    );
    h.stop().await;
}

#[tokio::test]
async fn too_many_messages_is_a_400_naming_the_setting() {
    let setup = Setup {
        options: ServerOptions {
            max_messages: 2,
            ..ServerOptions::default()
        },
        ..Setup::default()
    };
    let h = Harness::with(setup).await;
    let many = json!([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]);
    let m = assert_error(
        post(&h, json!({"messages": many}), MAIN).await,
        400,
        "too_many_messages",
    )
    .await;
    assert!(m.contains("server.max_messages"));
    assert!(h.fake().requests().is_empty());
}

#[tokio::test]
async fn a_turn_over_the_token_limit_is_answered_but_not_captured() {
    let setup = Setup {
        max_turn_tokens: 10,
        ..Setup::default()
    };
    let h = Harness::with(setup).await;
    let resp = post(&h, json!({"messages": conversation()}), MAIN).await;
    assert_eq!(resp.status(), 200);
    let answer: Value = resp.json().await.unwrap();
    assert!(
        answer["choices"][0]["message"]["content"].is_string(),
        "{answer}"
    );
    let abandoned = h.abandoned.clone();
    // Stopping drains the capture queue: every turn has reached its end after this.
    assert!(h.stop().await.is_empty(), "not captured");
    let abandoned = abandoned.lock().unwrap().clone();
    assert_eq!(abandoned.len(), 1, "{abandoned:?}");
    assert_eq!(abandoned[0].2, "turn_too_long", "{abandoned:?}");
}

#[tokio::test]
async fn every_turn_of_a_long_session_captures_exactly_the_full_render_tokens() {
    // The capture workers encode each prompt incrementally from the session's previous one.
    let mut h = Harness::with(retokenizing()).await;
    let mut history = vec![json!({"role": "system", "content": "You are terse."})];
    for i in 0..6 {
        history.push(
            json!({"role": "user", "content": format!("Question {i}: and then? <|im_end|> é")}),
        );
        let answer: Value = post(&h, json!({"messages": history}), MAIN)
            .await
            .json()
            .await
            .unwrap();
        let turn = h.next_turn().await;
        let expected = h
            .tokenizer
            .split_turn(&TurnInput {
                messages: &history,
                tools: None,
                response_message: &answer["choices"][0]["message"],
                template_kwargs: None,
            })
            .unwrap();
        assert_eq!(turn.prompt_ids, expected.prompt_ids, "turn {i}");
        assert_eq!(turn.response_ids, expected.response_ids, "turn {i}");
        history.push(answer["choices"][0]["message"].clone());
    }
}
