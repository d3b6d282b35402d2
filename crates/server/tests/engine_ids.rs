//! Token ids straight from the engine, across the ways real SGLang and vLLM builds answer (the fake's
//! [`Quirks`]): ids read from each field name, the fallback in each mode, no injected field leaking to
//! the client, and each streaming behaviour giving a correct sample or a counted drop.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::Duration;

use common::{Harness, Setup};
use ps_core::{CapturedTurn, PositionSource, TokenSource};
use ps_fake_sglang::{FakeSglang, IdField, Quirks, StreamLogprobs};
use ps_server::ServerOptions;
use ps_server::TokenIdsMode;
use serde_json::{Value, json};

fn setup(quirks: Quirks, token_ids: TokenIdsMode) -> Setup {
    Setup {
        options: ServerOptions {
            default_turn_type: ps_core::DefaultTurnType::Main,
            token_ids,
            ..ServerOptions::default()
        },
        fake: Some(FakeSglang::builder().quirks(quirks)),
        ..Setup::default()
    }
}

fn messages() -> Value {
    json!([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a colour."}
    ])
}

async fn ask(h: &Harness, body: Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(h.chat_url())
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// The whole SSE body of a streamed answer.
async fn ask_streamed(h: &Harness, extra: Value) -> String {
    let mut body = json!({"messages": messages(), "stream": true});
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        body[k] = v;
    }
    let r = ask(h, body).await;
    assert_eq!(r.status(), 200);
    r.text().await.unwrap()
}

/// Waits until `n` turns were abandoned (the reason is known only after capture).
async fn abandoned(h: &Harness, n: usize) -> Vec<String> {
    for _ in 0..400 {
        let a = h.abandoned.lock().unwrap().clone();
        if a.len() >= n {
            return a.into_iter().map(|(_, _, r)| r).collect();
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "{n} turns were not abandoned: {:?}",
        h.abandoned.lock().unwrap()
    );
}

/// What the engine sampled, as the fake reports it in the non-streamed answer's log-probs.
fn reported_logprobs(answer: &Value) -> Vec<f64> {
    answer["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["logprob"].as_f64().unwrap())
        .collect()
}

fn assert_engine_turn(h: &Harness, turn: &CapturedTurn, reported: &[f64]) {
    assert_eq!(turn.token_source, TokenSource::Engine);
    assert_eq!(turn.response_ids.len(), reported.len());
    let lps: Vec<f64> = turn.alignment.logprobs.iter().map(|l| l.unwrap()).collect();
    assert_eq!(
        lps, reported,
        "one engine log-prob per response id, in order"
    );
    assert_eq!(turn.alignment.loss_mask, vec![1; reported.len()]);
    assert_eq!(
        turn.response_ids.last().copied(),
        h.tokenizer.eos_token_id(),
        "the engine's ids end with the end-of-turn token it sampled"
    );
    // The engine's prompt is the one our template renders (same template and tokenizer here).
    let (messages, tools) = (turn.messages.parse().unwrap(), turn.tools.as_ref());
    let tools = tools.map(|t| t.parse().unwrap());
    let kwargs: Option<serde_json::Map<String, Value>> =
        turn.template_kwargs.as_ref().map(|k| k.parse().unwrap());
    let ours = h
        .tokenizer
        .split_turn(&ps_chat_template::TurnInput {
            messages: &messages,
            tools: tools.as_ref(),
            response_message: &turn.response_message,
            template_kwargs: kwargs.as_ref(),
        })
        .unwrap();
    assert_eq!(turn.prompt_ids, ours.prompt_ids);
}

#[tokio::test]
async fn ids_are_taken_from_each_builds_field_and_never_leak_to_the_client() {
    for field in [
        IdField::ResponseTokenIds,
        IdField::TokenIds,
        IdField::Vllm,
        IdField::Sglext,
    ] {
        let quirks = Quirks {
            id_field: field,
            ..Quirks::default()
        };
        let mut h = Harness::with(setup(quirks, TokenIdsMode::Auto)).await;
        let answer: Value = ask(&h, json!({"messages": messages()}))
            .await
            .json()
            .await
            .unwrap();
        let turn = h.next_turn().await;
        assert_engine_turn(&h, &turn, &reported_logprobs_of(&h, &turn));
        // What we injected is not in the client's answer, wherever the build put it.
        let choice = &answer["choices"][0];
        for key in ["response_token_ids", "token_ids", "prompt_token_ids"] {
            assert!(
                choice.get(key).is_none(),
                "{field:?}: {key} leaked: {choice}"
            );
        }
        assert!(
            answer.get("prompt_token_ids").is_none(),
            "{field:?}: {answer}"
        );
        assert!(
            answer["choices"][0]["logprobs"].is_null(),
            "log-probs not asked for"
        );
        // The upstream call asked for ids.
        let sent = h.fake().requests().pop().unwrap();
        assert_eq!(sent.body["return_token_ids"], true);
        h.stop().await;
    }
}

/// The engine ids' log-probs are the fake's policy log-probs of those very ids.
fn reported_logprobs_of(_h: &Harness, turn: &CapturedTurn) -> Vec<f64> {
    turn.response_ids
        .iter()
        .enumerate()
        .map(|(pos, &id)| ps_fake_sglang::policy_logprob(id, pos))
        .collect()
}

#[tokio::test]
async fn a_client_that_asked_for_ids_itself_gets_them() {
    let mut h = Harness::with(setup(Quirks::default(), TokenIdsMode::Auto)).await;
    let answer: Value = ask(
        &h,
        json!({"messages": messages(), "return_token_ids": true}),
    )
    .await
    .json()
    .await
    .unwrap();
    let turn = h.next_turn().await;
    assert_eq!(
        answer["choices"][0]["response_token_ids"],
        json!(turn.response_ids)
    );
    h.stop().await;
}

/// A client that asked only for the prompt ids keeps them (we added the response ids, not those).
#[tokio::test]
async fn a_client_that_asked_for_prompt_ids_keeps_them() {
    let mut h = Harness::with(setup(Quirks::default(), TokenIdsMode::Auto)).await;
    let answer: Value = ask(
        &h,
        json!({"messages": messages(), "return_prompt_token_ids": true}),
    )
    .await
    .json()
    .await
    .unwrap();
    let turn = h.next_turn().await;
    let choice = &answer["choices"][0];
    assert_eq!(choice["prompt_token_ids"], json!(turn.prompt_ids));
    assert!(choice.get("response_token_ids").is_none(), "{choice}");
    h.stop().await;
}

/// A client's own `return_token_ids: false` is forwarded as sent: the engine was not asked, so the
/// turn is not counted as an engine that gave no ids; `engine` mode refuses it.
#[tokio::test]
async fn a_clients_own_return_token_ids_false_is_not_a_missing_id() {
    let mut h = Harness::with(setup(Quirks::default(), TokenIdsMode::Auto)).await;
    ask(
        &h,
        json!({"messages": messages(), "return_token_ids": false}),
    )
    .await;
    let t = h.next_turn().await;
    assert_eq!(t.token_source, TokenSource::Retokenized);
    assert_eq!(
        h.fake().requests().pop().unwrap().body["return_token_ids"],
        false
    );
    h.stop().await;
    let h = Harness::with(setup(Quirks::default(), TokenIdsMode::Engine)).await;
    ask(
        &h,
        json!({"messages": messages(), "return_token_ids": false}),
    )
    .await;
    assert_eq!(abandoned(&h, 1).await, ["no_engine_ids"]);
    h.stop().await;
}

#[tokio::test]
async fn an_engine_without_ids_falls_back_in_auto_and_gives_no_sample_in_engine_mode() {
    let old_build = || Quirks {
        id_field: IdField::None,
        ..Quirks::default()
    };
    let mut h = Harness::with(setup(old_build(), TokenIdsMode::Auto)).await;
    let answer: Value = ask(&h, json!({"messages": messages(), "logprobs": true}))
        .await
        .json()
        .await
        .unwrap();
    let turn = h.next_turn().await;
    assert_eq!(turn.token_source, TokenSource::Retokenized);
    // Exact re-tokenization: every sampled token found its place.
    assert_eq!(turn.alignment.unmatched_upstream, 0);
    assert_eq!(
        turn.alignment
            .logprobs
            .iter()
            .filter(|l| l.is_some())
            .count(),
        reported_logprobs(&answer).len()
    );
    h.stop().await;

    let h = Harness::with(setup(old_build(), TokenIdsMode::Engine)).await;
    assert_eq!(ask(&h, json!({"messages": messages()})).await.status(), 200);
    assert_eq!(abandoned(&h, 1).await, ["no_engine_ids"]);
    h.stop().await;

    // `retokenize` never asks.
    let mut h = Harness::with(setup(Quirks::default(), TokenIdsMode::Retokenize)).await;
    assert_eq!(ask(&h, json!({"messages": messages()})).await.status(), 200);
    assert_eq!(h.next_turn().await.token_source, TokenSource::Retokenized);
    assert!(
        h.fake()
            .requests()
            .pop()
            .unwrap()
            .body
            .get("return_token_ids")
            .is_none()
    );
    h.stop().await;
}

/// Streamed answers carry no ids (unless the server sends sglext ids) and are re-tokenized; each
/// of the three streaming behaviours of real builds gives a correct sample or a counted drop, never
/// a sample whose log-probs cannot explain its text.
#[tokio::test]
async fn each_streaming_behaviour_gives_a_correct_sample_or_a_counted_drop() {
    // After PR #28601 every step's log-prob arrives (standalone chunks for empty deltas): the end
    // of turn included, so nothing the model sampled is marked.
    let mut h = Harness::with(setup(Quirks::default(), TokenIdsMode::Auto)).await;
    ask_streamed(&h, json!({})).await;
    let t = h.next_turn().await;
    assert_eq!(t.token_source, TokenSource::Retokenized);
    assert_eq!(t.alignment.unmatched_upstream, 0);
    assert!(
        !t.alignment.sources.contains(&PositionSource::EosUnreported),
        "{:?}",
        t.alignment.sources
    );
    let step_chunks = t.alignment.logprobs.clone();
    h.stop().await;

    // Several tokens per chunk, each entry repeating the first one's top list, and top lists
    // shorter than asked that miss the sampled token: the same values.
    let quirks = Quirks {
        tokens_per_chunk: 3,
        short_top_lists: true,
        ..Quirks::default()
    };
    let mut h = Harness::with(setup(quirks, TokenIdsMode::Auto)).await;
    ask_streamed(&h, json!({"top_logprobs": 3})).await;
    assert_eq!(h.next_turn().await.alignment.logprobs, step_chunks);
    h.stop().await;

    // No parser: empty deltas lose their log-probs; those positions are marked, never trained as
    // if they had one (the EOS only by capture.train_eos_without_logprob, listed per sample).
    let quirks = Quirks {
        stream_logprobs: StreamLogprobs::DropEmptyDeltas,
        ..Quirks::default()
    };
    let mut h = Harness::with(setup(quirks, TokenIdsMode::Auto)).await;
    ask_streamed(&h, json!({})).await;
    let t = h.next_turn().await;
    assert!(t.alignment.sources.contains(&PositionSource::EosUnreported));
    for (lp, src) in t.alignment.logprobs.iter().zip(&t.alignment.sources) {
        assert_eq!(lp.is_some(), *src == PositionSource::Sampled);
    }
    h.stop().await;

    // A parser on a build before PR #28601: reasoning chunks carry no log-probs. Dropped, counted.
    let quirks = Quirks {
        stream_logprobs: StreamLogprobs::NullOnParsedChunks,
        ..Quirks::default()
    };
    let h = Harness::with(setup(quirks.clone(), TokenIdsMode::Auto)).await;
    ask_streamed(&h, json!({})).await;
    assert_eq!(abandoned(&h, 1).await, ["stream_logprobs_missing"]);
    h.stop().await;
    // …and a request with tools gets no log-probs at all.
    let h = Harness::with(setup(quirks, TokenIdsMode::Auto)).await;
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    ask_streamed(
        &h,
        json!({"tools": tools, "chat_template_kwargs": {"enable_thinking": false}}),
    )
    .await;
    assert_eq!(abandoned(&h, 1).await, ["stream_logprobs_missing"]);
    h.stop().await;
}

/// Streamed `sglext` ids (a final `choices: []` chunk) make a streamed turn an engine-id turn.
#[tokio::test]
async fn streamed_sglext_ids_are_used() {
    let quirks = Quirks {
        id_field: IdField::Sglext,
        ..Quirks::default()
    };
    let mut h = Harness::with(setup(quirks, TokenIdsMode::Engine)).await;
    let sse = ask_streamed(&h, json!({})).await;
    assert!(sse.contains("sglext"), "the client gets the stream as sent");
    let t = h.next_turn().await;
    let reported = reported_logprobs_of(&h, &t);
    assert_engine_turn(&h, &t, &reported);
    h.stop().await;
}

/// Streamed sglext ids from a server without parsers: the end-of-turn token's log-prob is lost
/// while its id is in the ids. `auto` re-tokenizes such a turn (its placeholder marked) instead of
/// losing it; `engine` refuses it with its own reason.
#[tokio::test]
async fn sglext_ids_with_a_lost_log_prob_fall_back_in_auto() {
    let quirks = || Quirks {
        id_field: IdField::Sglext,
        stream_logprobs: StreamLogprobs::DropEmptyDeltas,
        ..Quirks::default()
    };
    let mut h = Harness::with(setup(quirks(), TokenIdsMode::Auto)).await;
    ask_streamed(&h, json!({})).await;
    let t = h.next_turn().await;
    assert_eq!(t.token_source, TokenSource::Retokenized);
    assert!(t.alignment.sources.contains(&PositionSource::EosUnreported));
    h.stop().await;
    let h = Harness::with(setup(quirks(), TokenIdsMode::Engine)).await;
    ask_streamed(&h, json!({})).await;
    assert_eq!(abandoned(&h, 1).await, ["engine_logprob_count_mismatch"]);
    h.stop().await;
}

/// A non-streamed tool call reports `matched_stop: null` (real builds); the engine's ids still end
/// with the end-of-turn token and every position is trained with its own log-prob.
#[tokio::test]
async fn a_tool_call_turn_with_engine_ids_has_no_marked_positions() {
    let mut h = Harness::with(setup(Quirks::default(), TokenIdsMode::Auto)).await;
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let answer: Value = ask(
        &h,
        json!({"messages": messages(), "tools": tools, "tool_choice": "required"}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(answer["choices"][0]["finish_reason"], "tool_calls");
    assert!(answer["choices"][0]["matched_stop"].is_null());
    let t = h.next_turn().await;
    let reported = reported_logprobs_of(&h, &t);
    assert_engine_turn(&h, &t, &reported);
    assert_eq!(t.alignment.marked(), 0);
    h.stop().await;
}

#[tokio::test]
async fn the_weight_version_of_a_non_streamed_answer_is_recorded() {
    let quirks = Quirks {
        weight_version: Some("step-42".into()),
        ..Quirks::default()
    };
    let mut h = Harness::with(setup(quirks, TokenIdsMode::Auto)).await;
    ask(&h, json!({"messages": messages()})).await;
    let v = h.next_turn().await.weight_version.unwrap();
    assert_eq!(
        (v.version.as_str(), v.source.as_str()),
        ("step-42", "engine")
    );
    // Streamed answers carry none (and no trainer announced one here).
    ask_streamed(&h, json!({})).await;
    assert!(h.next_turn().await.weight_version.is_none());
    h.stop().await;
}

/// vLLM's shapes (the fake's [`Quirks::vllm`], as recorded from vLLM 0.32): reasoning under
/// `reasoning`, the prompt's ids on the first streamed chunk and each chunk's sampled ids on its
/// choice. With `sglang.engine = "vllm"` every turn, streamed or not, thinking on or off, with a
/// tool call or not, is an engine-id turn whose reasoning is read; nothing injected reaches the
/// client.
#[tokio::test]
async fn vllm_answers_streamed_or_not_are_engine_id_turns_with_their_reasoning() {
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let mut s = setup(Quirks::vllm(), TokenIdsMode::Engine);
    s.options.engine = ps_core::EngineSetting::Vllm;
    let mut h = Harness::with(s).await;
    for stream in [false, true] {
        for thinking in [true, false] {
            for tool in [false, true] {
                let mut body = json!({"messages": messages(), "stream": stream,
                    "chat_template_kwargs": {"enable_thinking": thinking}});
                if tool {
                    body["tools"] = tools.clone();
                    body["tool_choice"] = json!("required");
                }
                let what = format!("stream={stream} thinking={thinking} tool={tool}");
                let r = ask(&h, body).await;
                assert_eq!(r.status(), 200, "{what}");
                let text = r.text().await.unwrap();
                assert!(
                    !text.contains("token_ids"),
                    "{what}: injected ids leaked to the client: {text}"
                );
                if thinking && !tool {
                    assert!(
                        text.contains("\"reasoning\""),
                        "{what}: vLLM's key reaches the client"
                    );
                }
                let sent = h.fake().requests().pop().unwrap();
                assert_eq!(sent.body["return_token_ids"], true, "{what}");
                let t = h.next_turn().await;
                let reported = reported_logprobs_of(&h, &t);
                assert_engine_turn(&h, &t, &reported);
                assert_eq!(
                    t.response_message["reasoning_content"].as_str().is_some(),
                    thinking,
                    "{what}: the reasoning is read from `reasoning`: {}",
                    t.response_message
                );
                if thinking {
                    assert!(
                        t.response_text
                            .contains(t.response_message["reasoning_content"].as_str().unwrap()),
                        "{what}: the rendered response holds the reasoning"
                    );
                }
                assert_eq!(
                    t.response_message["tool_calls"].is_array(),
                    tool,
                    "{what}: {}",
                    t.response_message
                );
            }
        }
    }
    h.stop().await;
}

/// `sglang.engine = "auto"` with an engine that was not asked at start (the harness builds the
/// server without a start-up probe): its first answer's shape names it. vLLM's first streamed
/// turn is re-tokenized (not asked for ids yet, its reasoning read all the same); from then on
/// streamed calls ask for ids. An SGLang-shaped engine is never asked for ids on a stream (it
/// refuses them with 400).
#[tokio::test]
async fn the_engine_is_learned_from_its_first_answer() {
    let mut h = Harness::with(setup(Quirks::vllm(), TokenIdsMode::Auto)).await;
    let body = json!({"messages": messages(), "stream": true});
    let r = ask(&h, body.clone()).await;
    assert_eq!(r.status(), 200);
    r.text().await.unwrap();
    assert!(
        h.fake()
            .requests()
            .pop()
            .unwrap()
            .body
            .get("return_token_ids")
            .is_none()
    );
    let first = h.next_turn().await;
    assert_eq!(first.token_source, TokenSource::Retokenized);
    assert!(first.response_message["reasoning_content"].is_string());
    let r = ask(&h, body).await;
    r.text().await.unwrap();
    assert_eq!(
        h.fake().requests().pop().unwrap().body["return_token_ids"],
        true
    );
    let second = h.next_turn().await;
    let reported = reported_logprobs_of(&h, &second);
    assert_engine_turn(&h, &second, &reported);
    h.stop().await;

    let mut h = Harness::with(setup(Quirks::default(), TokenIdsMode::Auto)).await;
    for _ in 0..2 {
        let r = ask(&h, json!({"messages": messages(), "stream": true})).await;
        assert_eq!(r.status(), 200, "SGLang is never asked for ids on a stream");
        r.text().await.unwrap();
        assert!(
            h.fake()
                .requests()
                .pop()
                .unwrap()
                .body
                .get("return_token_ids")
                .is_none()
        );
        h.next_turn().await;
    }
    h.stop().await;
}

/// An engine wrongly taken to be vLLM (`sglang.engine = "vllm"` in front of SGLang): the first
/// streamed call asks for ids and gets SGLang's 400; the call is sent again as the client sent it
/// and answered, and later streamed calls do not ask. The chat path never fails for a flag it
/// added for training.
#[tokio::test]
async fn an_engine_that_refuses_streamed_ids_is_asked_again_without_them() {
    let mut s = setup(Quirks::default(), TokenIdsMode::Auto);
    s.options.engine = ps_core::EngineSetting::Vllm;
    let mut h = Harness::with(s).await;
    for round in 0..2 {
        let r = ask(&h, json!({"messages": messages(), "stream": true})).await;
        assert_eq!(r.status(), 200, "round {round}");
        let sse = r.text().await.unwrap();
        assert!(sse.contains("[DONE]") && !sse.contains("error"), "{sse}");
        let t = h.next_turn().await;
        assert_eq!(t.token_source, TokenSource::Retokenized, "round {round}");
    }
    let sent: Vec<Value> = h.fake().requests().into_iter().map(|r| r.body).collect();
    let asked: Vec<bool> = sent
        .iter()
        .map(|b| b.get("return_token_ids").is_some())
        .collect();
    assert_eq!(asked, [true, false, false], "asked once, then never again");
    // The retry is the first call without the flag, byte for byte as forwarded otherwise.
    let mut first = sent[0].clone();
    first.as_object_mut().unwrap().remove("return_token_ids");
    assert_eq!(first, sent[1]);
    h.stop().await;
}
