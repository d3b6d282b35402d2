//! The real vLLM 0.32's answers, as recorded (`tests/fixtures/real/vllm-0.32.jsonl`: thinking on
//! and off, streamed and not, a parsed tool call, ids asked and not), read by the same code that
//! reads them in the proxy: the engine's ids (the prompt's on the first chunk, each sampled id on
//! its chunk), one log-prob per id, the reasoning under vLLM's key, the engine named by its keys.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use ps_core::Engine;
use ps_sglang_client::{Answer, StreamAssembler};
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

fn chats(status: u16) -> Vec<Value> {
    recorded()
        .into_iter()
        .filter(|r| {
            r["request"]["path"] == "/v1/chat/completions" && r["response"]["status"] == status
        })
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn whole_answers_give_the_engines_ids_reasoning_and_finish() {
    let mut seen = 0;
    for r in chats(200)
        .iter()
        .filter(|r| r["response"]["body"].is_object())
    {
        let body = &r["response"]["body"];
        let answer = Answer::parse("u", Bytes::from(body.to_string())).unwrap();
        assert_eq!(answer.engine(), Some(Engine::Vllm));
        let rollout = answer.rollout().unwrap();
        let choice = &body["choices"][0];
        let engine = rollout.engine_ids.expect("ids asked for, ids read");
        assert_eq!(engine.prompt, ids(&body["prompt_token_ids"]));
        assert_eq!(engine.response, ids(&choice["token_ids"]));
        assert_eq!(
            rollout.tokens.len(),
            engine.response.len(),
            "a log-prob per id"
        );
        let reasoning = choice["message"]["reasoning"].as_str();
        assert_eq!(
            rollout.message["reasoning_content"].as_str(),
            reasoning,
            "vLLM's `reasoning` is read as the turn's reasoning"
        );
        assert!(rollout.message.get("reasoning").is_none_or(Value::is_null));
        assert_eq!(
            rollout.finish.reason.as_deref(),
            choice["finish_reason"].as_str()
        );
        seen += 1;
    }
    assert_eq!(seen, 3, "thinking on, off, and a tool call");
}

#[test]
fn streams_give_the_engines_ids_chunk_by_chunk() {
    let mut with_ids = 0;
    for r in chats(200)
        .iter()
        .filter(|r| r["response"]["events"].is_array())
    {
        let events = r["response"]["events"].as_array().unwrap();
        let mut a = StreamAssembler::new();
        let (mut prompt, mut response, mut reasoning) = (None, Vec::new(), String::new());
        for e in events.iter().filter(|e| e.is_object()) {
            a.feed_str(&e.to_string()).unwrap();
            if e["prompt_token_ids"].is_array() {
                prompt = Some(ids(&e["prompt_token_ids"]));
            }
            if let Some(c) = e["choices"].get(0) {
                if c["token_ids"].is_array() {
                    response.extend(ids(&c["token_ids"]));
                }
                reasoning.push_str(c["delta"]["reasoning"].as_str().unwrap_or(""));
            }
        }
        assert!(a.finished());
        assert_eq!(
            a.engine(),
            Some(Engine::Vllm),
            "the last chunk's `stop_reason`"
        );
        let rollout = a.finish();
        let asked = r["request"]["body"]["return_token_ids"] == true;
        match (asked, rollout.engine_ids) {
            (true, Some(engine)) => {
                assert_eq!(Some(engine.prompt), prompt);
                assert_eq!(engine.response, response);
                assert_eq!(rollout.tokens.len(), response.len(), "a log-prob per id");
                with_ids += 1;
            }
            (false, None) => assert!(prompt.is_none(), "unasked, vLLM writes null ids"),
            (asked, ids) => panic!("asked={asked}, ids={ids:?}"),
        }
        assert_eq!(
            rollout.message["reasoning_content"].as_str().unwrap_or(""),
            reasoning
        );
        assert_eq!(
            rollout.unexplained_chars, 0,
            "every chunk's text has its log-prob"
        );
        if r["request"]["body"]["tools"].is_array() {
            let call = &rollout.message["tool_calls"][0]["function"];
            assert_eq!(call["name"], "get_weather");
            let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
            assert!(args["city"].is_string(), "{args}");
            assert_eq!(rollout.finish.reason.as_deref(), Some("tool_calls"));
        }
    }
    assert_eq!(with_ids, 3, "thinking on, off, and a tool call");
}

/// vLLM's error body for an unknown model (recorded): nested, 404.
#[test]
fn an_unknown_model_is_a_nested_404() {
    let r = &chats(404)[0];
    assert!(r["response"]["body"]["error"]["message"].is_string(), "{r}");
}

/// A real vLLM serving a mixture-of-experts model without `--enable-return-routed-experts`
/// answers `routed_experts: null`: read as an answer without experts (nothing to count as
/// broken), its ids and finish read as usual.
#[test]
fn a_moe_answer_without_experts_has_none_and_no_error() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/real/vllm-0.32-moe-without-experts.json"
    );
    let bytes = Bytes::from(std::fs::read(path).unwrap());
    let answer = Answer::parse("http://vllm/v1/chat/completions", bytes).unwrap();
    let rollout = answer.rollout().unwrap();
    assert!(rollout.routed_experts.is_none());
    assert!(rollout.routed_experts_error.is_none());
    let ids = rollout.engine_ids.unwrap();
    assert_eq!((ids.prompt.len(), ids.response.len()), (9, 8));
}
