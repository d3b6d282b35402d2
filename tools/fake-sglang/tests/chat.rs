//! `/v1/chat/completions` against a spawned fake.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{chat, spawn, sse_events, user};
use ps_fake_sglang::{FakeSglang, Quirks, StreamLogprobs, policy_logprob};
use serde_json::{Value, json};

#[tokio::test]
async fn non_stream_logprobs_cover_every_sampled_token() {
    let fake = spawn().await;
    let tok = fake.state().tokenizer().clone();
    let messages = json!([user("Hello there, how are you today?")]);
    let resp = chat(
        &fake,
        json!({"model": "qwen3-4b", "messages": messages, "logprobs": true, "top_logprobs": 2,
               "return_token_ids": true}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "qwen3-4b");
    let choice = &body["choices"][0];
    let msg = &choice["message"];
    let content = msg["content"].as_str().expect("content");
    let reasoning = msg["reasoning_content"].as_str().expect("reasoning");
    assert!(
        content.contains("You said \"Hello there, how are you today?\" (turn 1)"),
        "{content}"
    );
    assert!(!content.contains("<think>") && !content.contains("</think>"));
    assert!(
        reasoning.starts_with("The user said: \"Hello there"),
        "{reasoning}"
    );
    assert!(msg["tool_calls"].is_null());
    assert_eq!(choice["finish_reason"], "stop");
    let eos = tok.eos_token_id().expect("mini has an eos");
    assert_eq!(choice["matched_stop"], json!(eos));

    let ids: Vec<u32> =
        serde_json::from_value(choice["response_token_ids"].clone()).expect("token_ids");
    let entries = choice["logprobs"]["content"].as_array().expect("logprobs");
    assert_eq!(entries.len(), ids.len());
    assert_eq!(*ids.last().expect("ids"), eos);
    for (pos, (e, id)) in entries.iter().zip(&ids).enumerate() {
        let text = tok.token_text(*id);
        assert_eq!(e["token"], json!(text));
        assert_eq!(e["bytes"], json!(text.as_bytes()));
        assert_eq!(e["logprob"].as_f64(), Some(policy_logprob(*id, pos)));
        let top = e["top_logprobs"].as_array().expect("top");
        assert_eq!(top.len(), 2);
        assert_eq!(top[0]["token"], e["token"]);
        assert_eq!(top[0]["logprob"], e["logprob"]);
    }
    // The sampled text is exactly think block + content + eos.
    let sampled: String = ids.iter().map(|id| tok.token_text(*id)).collect();
    let eos_text = tok.eos_token().expect("eos");
    assert_eq!(
        sampled,
        format!("<think>\n{reasoning}\n</think>\n\n{content}{eos_text}")
    );
    assert_eq!(entries[0]["token"], "<think>");

    let prompt_text = tok
        .render(messages.as_array().expect("list"), None, true, None)
        .expect("render");
    let prompt_ids = tok.encode(&prompt_text).expect("encode");
    assert_eq!(choice["prompt_token_ids"], json!(prompt_ids));
    assert_eq!(body["usage"]["prompt_tokens"], json!(prompt_ids.len()));
    assert_eq!(body["usage"]["completion_tokens"], json!(ids.len()));
    assert_eq!(
        body["usage"]["total_tokens"],
        json!(prompt_ids.len() + ids.len())
    );

    let rec = fake.requests();
    assert_eq!(rec.len(), 1);
    assert_eq!(rec[0].path, "/v1/chat/completions");
    assert_eq!(rec[0].body["model"], "qwen3-4b");
}

#[tokio::test]
async fn answers_are_deterministic_and_logprobs_null_unless_asked() {
    let fake = spawn().await;
    let req = json!({"messages": [user("same question")]});
    let a: Value = chat(&fake, req.clone()).await.json().await.expect("json");
    let b: Value = chat(&fake, req).await.json().await.expect("json");
    assert_eq!(a["choices"][0]["message"], b["choices"][0]["message"]);
    assert!(a["choices"][0]["logprobs"].is_null());
    assert!(a["choices"][0].get("token_ids").is_none());
    assert_eq!(a["model"], "default");
}

#[tokio::test]
async fn thinking_off_gives_no_reasoning() {
    let fake = spawn().await;
    let body: Value = chat(
        &fake,
        json!({"messages": [user("hi")], "chat_template_kwargs": {"enable_thinking": false},
               "logprobs": true}),
    )
    .await
    .json()
    .await
    .expect("json");
    let choice = &body["choices"][0];
    assert!(choice["message"]["reasoning_content"].is_null());
    assert!(
        choice["logprobs"]["content"]
            .as_array()
            .expect("lp")
            .iter()
            .all(|e| e["token"] != "<think>")
    );

    let fake = FakeSglang::builder()
        .reasoning(false)
        .spawn()
        .await
        .expect("spawn");
    let body: Value = chat(&fake, json!({"messages": [user("hi")]}))
        .await
        .json()
        .await
        .expect("json");
    assert!(body["choices"][0]["message"]["reasoning_content"].is_null());
}

#[tokio::test]
async fn max_tokens_cuts_with_finish_length() {
    let fake = spawn().await;
    let body: Value = chat(
        &fake,
        json!({"messages": [user("a long question about many things")], "max_tokens": 5,
               "logprobs": true, "return_token_ids": true}),
    )
    .await
    .json()
    .await
    .expect("json");
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    assert!(choice["matched_stop"].is_null());
    assert_eq!(
        choice["response_token_ids"].as_array().expect("ids").len(),
        5
    );
    assert_eq!(
        choice["logprobs"]["content"].as_array().expect("lp").len(),
        5
    );
    assert_eq!(body["usage"]["completion_tokens"], 5);
    let eos = fake.state().tokenizer().eos_token_id().expect("eos");
    assert!(
        !choice["response_token_ids"]
            .as_array()
            .expect("ids")
            .contains(&json!(eos))
    );
}

#[tokio::test]
async fn tool_call_when_asked() {
    let fake = spawn().await;
    let tok = fake.state().tokenizer().clone();
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                       "days": {"type": "integer"}}, "required": ["city"]}}}]);
    let body: Value = chat(
        &fake,
        json!({"messages": [user("[call_tool] Paris please")], "tools": tools,
               "logprobs": true, "return_token_ids": true}),
    )
    .await
    .json()
    .await
    .expect("json");
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], "");
    let call = &choice["message"]["tool_calls"][0];
    let id = call["id"].as_str().expect("id");
    assert!(id.starts_with("call_") && id.len() == 29, "{id}");
    assert_eq!(call["index"], 0);
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().expect("string"))
        .expect("json");
    assert_eq!(args, json!({"city": "Paris please"}));
    let ids: Vec<u32> = serde_json::from_value(choice["response_token_ids"].clone()).expect("ids");
    let sampled: String = ids.iter().map(|id| tok.token_text(*id)).collect();
    assert!(
        sampled.contains("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris please\"}}\n</tool_call>"),
        "{sampled}"
    );
    assert_eq!(
        choice["logprobs"]["content"].as_array().expect("lp").len(),
        ids.len()
    );

    // No [call_tool] and tool_choice auto: plain answer. Named tool_choice: that tool.
    let plain: Value = chat(&fake, json!({"messages": [user("hello")], "tools": tools}))
        .await
        .json()
        .await
        .expect("json");
    assert!(plain["choices"][0]["message"]["tool_calls"].is_null());
    let named: Value = chat(
        &fake,
        json!({"messages": [user("hello")], "tools": tools,
               "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
    )
    .await
    .json()
    .await
    .expect("json");
    assert_eq!(
        named["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "get_weather"
    );
    let required: Value = chat(
        &fake,
        json!({"messages": [user("hello")], "tools": tools, "tool_choice": "required"}),
    )
    .await
    .json()
    .await
    .expect("json");
    assert_eq!(required["choices"][0]["finish_reason"], "tool_calls");
}

#[tokio::test]
async fn streamed_tool_call_fragments() {
    let fake = spawn().await;
    let tools = json!([{"type": "function", "function": {"name": "search",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}]);
    let req = json!({"messages": [user("[call_tool] rust async book")], "tools": tools});
    let full: Value = chat(&fake, req.clone()).await.json().await.expect("json");
    let mut sreq = req;
    sreq["stream"] = json!(true);
    let events = sse_events(chat(&fake, sreq).await.text().await.expect("text"));
    let frags: Vec<&Value> = events
        .iter()
        .filter_map(|e| e.as_ref().ok())
        .filter_map(|e| e["choices"][0]["delta"]["tool_calls"].get(0))
        .collect();
    assert!(frags.len() >= 2);
    assert_eq!(frags[0]["function"]["arguments"], "");
    assert_eq!(
        frags[0]["id"],
        full["choices"][0]["message"]["tool_calls"][0]["id"]
    );
    assert_eq!(frags[0]["function"]["name"], "search");
    assert_eq!(frags[0]["type"], "function");
    let args: String = frags[1..]
        .iter()
        .map(|f| {
            assert!(f["id"].is_null() && f["function"]["name"].is_null());
            assert_eq!(f["index"], 0);
            f["function"]["arguments"].as_str().expect("piece")
        })
        .collect();
    assert_eq!(
        json!(args),
        full["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    );
    let finish = events
        .iter()
        .filter_map(|e| e.as_ref().ok())
        .find(|e| !e["choices"][0]["finish_reason"].is_null())
        .expect("finish chunk");
    assert_eq!(finish["choices"][0]["finish_reason"], "tool_calls");
}

#[tokio::test]
async fn stream_chunk_sequence_loses_empty_delta_logprobs() {
    // A server without reasoning/tool parsers (docs/upstream-protocols.md 1.3, first behaviour).
    let fake = FakeSglang::builder()
        .quirks(Quirks {
            stream_logprobs: StreamLogprobs::DropEmptyDeltas,
            ..Quirks::default()
        })
        .spawn()
        .await
        .expect("spawn");
    let tok = fake.state().tokenizer().clone();
    let base = json!({"model": "m", "messages": [user("Stream me a reply")], "logprobs": true});
    let full: Value = chat(&fake, {
        let mut b = base.clone();
        b["return_token_ids"] = json!(true);
        b
    })
    .await
    .json()
    .await
    .expect("json");
    let mut sreq = base;
    sreq["stream"] = json!(true);
    sreq["stream_options"] = json!({"include_usage": true});
    let resp = chat(&fake, sreq).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"].to_str().expect("ct"),
        "text/event-stream"
    );
    let text = resp.text().await.expect("text");
    assert!(text.ends_with("data: [DONE]\n\n"));
    let events = sse_events(text);
    let events: Vec<Value> = events.into_iter().map(|e| e.expect("json event")).collect();

    // Role chunk.
    assert_eq!(events[0]["object"], "chat.completion.chunk");
    assert_eq!(
        events[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    // Usage chunk last, finish chunk before it.
    let usage = events.last().expect("usage");
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"], full["usage"]);
    let finish = &events[events.len() - 2];
    assert_eq!(finish["choices"][0]["delta"], json!({}));
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        finish["choices"][0]["matched_stop"],
        json!(tok.eos_token_id().expect("eos"))
    );

    let token_chunks = &events[1..events.len() - 2];
    let mut reasoning = String::new();
    let mut content = String::new();
    let mut streamed_lp = Vec::new();
    for c in token_chunks {
        let d = &c["choices"][0]["delta"];
        if let Some(r) = d["reasoning_content"].as_str() {
            reasoning.push_str(r);
        }
        if let Some(t) = d["content"].as_str() {
            content.push_str(t);
        }
        let lp = c["choices"][0]["logprobs"]["content"]
            .as_array()
            .expect("per-chunk logprobs");
        assert_eq!(lp.len(), 1);
        streamed_lp.push(lp[0].clone());
    }
    let msg = &full["choices"][0]["message"];
    // The last reasoning token carries the newline that closes the reasoning (".\n" is one token);
    // SGLang's non-streamed reasoning_content is stripped of it.
    assert_eq!(
        reasoning.strip_suffix('\n'),
        msg["reasoning_content"].as_str()
    );
    assert_eq!(json!(content), msg["content"]);

    // Every streamed entry is one of the non-streamed ones, in order; markers and eos are missing.
    let all = full["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("lp")
        .clone();
    assert!(streamed_lp.len() < all.len());
    let mut it = all.iter();
    for s in &streamed_lp {
        assert!(it.any(|a| a == s), "streamed entry {s} not in order");
    }
    let eos_text = tok.eos_token().expect("eos");
    assert_eq!(all.last().expect("last")["token"], eos_text);
    assert!(streamed_lp.iter().all(|e| e["token"] != eos_text));
    assert!(
        streamed_lp
            .iter()
            .all(|e| e["token"] != "<think>" && e["token"] != "</think>")
    );
    // Without include_usage there is no usage chunk.
    let events = sse_events(
        chat(&fake, json!({"messages": [user("x")], "stream": true}))
            .await
            .text()
            .await
            .expect("text"),
    );
    let last = events.last().expect("events").as_ref().expect("json");
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    assert!(last["choices"][0]["logprobs"].is_null());
}

#[tokio::test]
async fn validation_errors_are_flat_400() {
    let fake = spawn().await;
    let check = |body: Value| {
        assert_eq!(body["object"], "error");
        assert_eq!(body["type"], "BadRequestError");
        assert_eq!(body["code"], 400);
        assert!(body["param"].is_null());
        assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
    };
    for req in [
        json!({"messages": [user("x")], "stream": true, "return_token_ids": true}),
        json!({"messages": [user("x")], "stream": true, "return_meta_info": true}),
        json!({"messages": [user("x")], "stream": true, "return_prompt_token_ids": true}),
        json!({"messages": []}),
        json!({"model": "m"}),
    ] {
        let resp = chat(&fake, req).await;
        assert_eq!(resp.status(), 400);
        check(resp.json().await.expect("json"));
    }
    let resp = reqwest::Client::new()
        .post(fake.chat_url())
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 400);
    check(resp.json().await.expect("json"));
}

#[tokio::test]
async fn api_key_is_enforced_except_on_health() {
    let fake = FakeSglang::builder()
        .api_key(Some("sk-test".into()))
        .spawn()
        .await
        .expect("spawn");
    let client = reqwest::Client::new();
    let body = json!({"messages": [user("hi")]});
    for auth in [None, Some("Bearer wrong")] {
        let mut req = client.post(fake.chat_url()).json(&body);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let resp = req.send().await.expect("send");
        assert_eq!(resp.status(), 401);
        assert_eq!(
            resp.json::<Value>().await.expect("json"),
            json!({"error": "Unauthorized"})
        );
    }
    let ok = client
        .post(fake.chat_url())
        .bearer_auth("sk-test")
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(ok.status(), 200);
    let health = client
        .get(format!("{}/health", fake.base_url()))
        .send()
        .await
        .expect("send");
    assert_eq!(health.status(), 200);
    let models = client
        .get(format!("{}/v1/models", fake.base_url()))
        .send()
        .await
        .expect("send");
    assert_eq!(models.status(), 401);
    // The recorder keeps the headers.
    let rec = fake.requests();
    assert_eq!(rec.len(), 3);
    assert_eq!(rec[2].headers["authorization"], "Bearer sk-test");
}

#[tokio::test]
async fn health_and_models() {
    let fake = FakeSglang::builder()
        .model_name("qwen3-4b")
        .spawn()
        .await
        .expect("spawn");
    let client = reqwest::Client::new();
    for path in ["/health", "/health_generate"] {
        let r = client
            .get(format!("{}{path}", fake.base_url()))
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), 200);
        assert!(r.bytes().await.expect("body").is_empty());
    }
    let models: Value = client
        .get(format!("{}/v1/models", fake.base_url()))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "qwen3-4b");
    assert_eq!(models["data"][0]["object"], "model");
    assert!(
        fake.requests().is_empty(),
        "only chat and generate are recorded"
    );
}

#[tokio::test]
async fn return_meta_info_carries_exact_ids() {
    let fake = spawn().await;
    let body: Value = chat(
        &fake,
        json!({"messages": [user("meta please")], "logprobs": true, "return_meta_info": true,
               "return_token_ids": true}),
    )
    .await
    .json()
    .await
    .expect("json");
    let choice = &body["choices"][0];
    let meta = &choice["meta_info"];
    let triples = meta["output_token_logprobs"].as_array().expect("triples");
    let ids: Vec<Value> = triples.iter().map(|t| t[1].clone()).collect();
    assert_eq!(json!(ids), choice["response_token_ids"]);
    assert_eq!(meta["finish_reason"]["type"], "stop");
    assert_eq!(
        meta["completion_tokens"],
        body["usage"]["completion_tokens"]
    );
}

#[tokio::test]
async fn a_record_limit_keeps_only_the_most_recent_requests() {
    let fake = FakeSglang::builder()
        .record_limit(2)
        .spawn()
        .await
        .expect("spawn fake");
    for text in ["one", "two", "three"] {
        let r = chat(&fake, json!({"messages": [user(text)]})).await;
        assert_eq!(r.status(), 200);
    }
    // Counted all three, kept the last two.
    fake.wait_for_requests(3).await;
    let kept: Vec<String> = fake
        .requests()
        .iter()
        .map(|r| {
            r.body["messages"][0]["content"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    assert_eq!(kept, vec!["two", "three"]);
}

/// Builds after PR #28601 (the default): every step's log-prob is streamed, a step without text on
/// a standalone chunk with an empty delta, so the streamed entries are exactly the non-streamed ones.
#[tokio::test]
async fn streamed_step_chunks_carry_every_sampled_tokens_logprob() {
    let fake = spawn().await;
    let base = json!({"model": "m", "messages": [user("Stream me a reply")], "logprobs": true});
    let full: Value = chat(&fake, base.clone()).await.json().await.expect("json");
    let mut streamed = base.clone();
    streamed["stream"] = json!(true);
    let events: Vec<Value> = sse_events(chat(&fake, streamed).await.text().await.expect("text"))
        .into_iter()
        .map(|e| e.expect("json"))
        .collect();
    let entries: Vec<Value> = events
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(json!(entries), full["choices"][0]["logprobs"]["content"]);
    assert!(
        events.iter().any(
            |c| c["choices"][0]["delta"] == json!({}) && !c["choices"][0]["logprobs"].is_null()
        ),
        "a standalone chunk with an empty delta carries a step's log-prob"
    );
}
