//! The Anthropic Messages door (`POST /v1/messages`) through the real server in front of the fake
//! SGLang: a conversation through it becomes the samples the same conversation through chat
//! completions becomes; its answers and events are the Messages API's; its errors Anthropic's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{ADMIN_VAR, CLIENT_VAR, Server, http, settings};
use ps_config::Settings;
use ps_fake_sglang::FakeSglang;
use serde_json::{Value, json};

fn tools_chat() -> Value {
    json!([{"type": "function", "function": {"name": "list_files", "description": "List the files of a folder",
        "parameters": {"type": "object", "properties": {"folder": {"type": "string"}}, "required": ["folder"]}}}])
}

fn tools_messages() -> Value {
    json!([{"name": "list_files", "description": "List the files of a folder",
        "input_schema": {"type": "object", "properties": {"folder": {"type": "string"}}, "required": ["folder"]}}])
}

const SYSTEM: &str = "You are a careful assistant.";
const ASK: &str = "what is in the docs folder? [call_tool]";
const RESULT: &str = "README.md guide.md";
const THANKS: &str = "thanks, and which is longer?";

async fn start(
    tune: impl FnOnce(&mut Settings),
) -> (Server, ps_fake_sglang::FakeHandle, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let mut s = settings(&fake, dir.path());
    tune(&mut s);
    (Server::start(&s, &common::no_env).await, fake, dir)
}

async fn post(url: &str, path: &str, body: &Value, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = http().post(format!("{url}{path}")).json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

/// A chat answer's message: the whole answer's, or the one its chunks build (tool calls too).
async fn chat_message(r: reqwest::Response, stream: bool) -> Value {
    let status = r.status();
    if status != 200 {
        panic!("{status}: {}", r.text().await.unwrap());
    }
    if !stream {
        return r.json::<Value>().await.unwrap()["choices"][0]["message"].clone();
    }
    let text = r.text().await.unwrap();
    let mut m = json!({"role": "assistant", "content": ""});
    let mut calls: Vec<Value> = Vec::new();
    for data in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(data).unwrap();
        let d = &chunk["choices"][0]["delta"];
        for (k, v) in [
            ("content", &d["content"]),
            ("reasoning_content", &d["reasoning_content"]),
        ] {
            if let Some(t) = v.as_str() {
                m[k] = json!(format!("{}{t}", m[k].as_str().unwrap_or_default()));
            }
        }
        for c in d["tool_calls"].as_array().into_iter().flatten() {
            let i = c["index"].as_u64().unwrap() as usize;
            if calls.len() <= i {
                calls.push(json!({"id": c["id"], "type": "function", "function": {"name": c["function"]["name"], "arguments": ""}}));
            }
            if let Some(a) = c["function"]["arguments"].as_str() {
                let f = &mut calls[i]["function"]["arguments"];
                *f = json!(format!("{}{a}", f.as_str().unwrap()));
            }
        }
    }
    if !calls.is_empty() {
        m["tool_calls"] = json!(calls);
    }
    m
}

/// The three turns through chat completions, as an OpenAI client sends them (each answer's message
/// sent back as it came).
async fn through_chat(url: &str, session: &str, stream: bool) {
    let key = [("x-session-id", session), ("x-turn-type", "main")];
    let mut h = vec![
        json!({"role": "system", "content": SYSTEM}),
        json!({"role": "user", "content": ASK}),
    ];
    let body = |h: &Vec<Value>, done: bool| json!({"messages": h, "tools": tools_chat(), "max_tokens": 400, "stream": stream, "session_done": done});
    let m1 = chat_message(
        post(url, "/v1/chat/completions", &body(&h, false), &key).await,
        stream,
    )
    .await;
    let call_id = m1["tool_calls"][0]["id"].as_str().unwrap().to_owned();
    h.push(m1);
    h.push(json!({"role": "tool", "tool_call_id": call_id, "content": RESULT}));
    let m2 = chat_message(
        post(url, "/v1/chat/completions", &body(&h, false), &key).await,
        stream,
    )
    .await;
    h.push(m2);
    h.push(json!({"role": "user", "content": THANKS}));
    chat_message(
        post(url, "/v1/chat/completions", &body(&h, true), &key).await,
        stream,
    )
    .await;
}

/// A Messages answer as a client assembles it: the whole message, or the events' blocks.
async fn messages_answer(r: reqwest::Response, stream: bool) -> Value {
    let status = r.status();
    if status != 200 {
        panic!("{status}: {}", r.text().await.unwrap());
    }
    if !stream {
        let ct = r.headers()["content-type"].to_str().unwrap().to_owned();
        assert!(ct.starts_with("application/json"), "{ct}");
        return r.json().await.unwrap();
    }
    let ct = r.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(ct.starts_with("text/event-stream"), "{ct}");
    let text = r.text().await.unwrap();
    assemble_events(&text)
}

/// The message a Messages event stream builds, checked event by event on the way.
fn assemble_events(text: &str) -> Value {
    let mut message = Value::Null;
    let mut partial: Vec<String> = Vec::new();
    let mut names = Vec::new();
    for event in text.split("\n\n").filter(|e| !e.trim().is_empty()) {
        let name = event
            .lines()
            .find_map(|l| l.strip_prefix("event: "))
            .unwrap();
        let data: Value = serde_json::from_str(
            event
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap(),
        )
        .unwrap();
        assert_eq!(data["type"], name);
        names.push(name.to_owned());
        match name {
            "message_start" => message = data["message"].clone(),
            "content_block_start" => {
                assert_eq!(data["index"], message["content"].as_array().unwrap().len());
                message["content"]
                    .as_array_mut()
                    .unwrap()
                    .push(data["content_block"].clone());
                partial.push(String::new());
            }
            "content_block_delta" => {
                let i = data["index"].as_u64().unwrap() as usize;
                let b = &mut message["content"][i];
                let d = &data["delta"];
                let append = |b: &mut Value, k: &str, v: &Value| {
                    b[k] = json!(format!("{}{}", b[k].as_str().unwrap(), v.as_str().unwrap()));
                };
                match d["type"].as_str().unwrap() {
                    "text_delta" => append(b, "text", &d["text"]),
                    "thinking_delta" => append(b, "thinking", &d["thinking"]),
                    "signature_delta" => b["signature"] = d["signature"].clone(),
                    "input_json_delta" => partial[i].push_str(d["partial_json"].as_str().unwrap()),
                    other => panic!("unexpected delta {other}"),
                }
            }
            "content_block_stop" => {
                let i = data["index"].as_u64().unwrap() as usize;
                if message["content"][i]["type"] == "tool_use" {
                    message["content"][i]["input"] = serde_json::from_str(&partial[i]).unwrap();
                }
            }
            "message_delta" => {
                message["stop_reason"] = data["delta"]["stop_reason"].clone();
                message["stop_sequence"] = data["delta"]["stop_sequence"].clone();
                message["usage"] = data["usage"].clone();
            }
            "message_stop" | "ping" => {}
            other => panic!("unexpected event {other}: {text}"),
        }
    }
    assert_eq!(
        names.first().map(String::as_str),
        Some("message_start"),
        "{names:?}"
    );
    assert_eq!(
        names.last().map(String::as_str),
        Some("message_stop"),
        "{names:?}"
    );
    message
}

/// The same three turns through the Messages door, as an Anthropic client sends them (each
/// answer's content blocks sent back as they came).
async fn through_messages(url: &str, session: &str, stream: bool) -> Vec<Value> {
    let key = [("x-session-id", session), ("x-turn-type", "main")];
    let mut h = vec![json!({"role": "user", "content": ASK})];
    let body = |h: &Vec<Value>, done: bool| {
        let mut b = json!({"model": "default", "system": SYSTEM, "max_tokens": 400, "messages": h,
            "tools": tools_messages(), "stream": stream});
        if done {
            b["session_done"] = json!(true);
        }
        b
    };
    let m1 = messages_answer(
        post(url, "/v1/messages?beta=true", &body(&h, false), &key).await,
        stream,
    )
    .await;
    assert_eq!(m1["stop_reason"], "tool_use", "{m1}");
    let tool_use = m1["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap()
        .clone();
    assert_eq!(tool_use["name"], "list_files");
    assert!(tool_use["input"].is_object(), "{tool_use}");
    h.push(json!({"role": "assistant", "content": m1["content"]}));
    h.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use["id"], "content": RESULT}]}));
    let m2 = messages_answer(
        post(url, "/v1/messages", &body(&h, false), &key).await,
        stream,
    )
    .await;
    assert_eq!(m2["stop_reason"], "end_turn", "{m2}");
    h.push(json!({"role": "assistant", "content": m2["content"]}));
    h.push(json!({"role": "user", "content": THANKS}));
    let m3 = messages_answer(
        post(url, "/v1/messages", &body(&h, true), &key).await,
        stream,
    )
    .await;
    vec![m1, m2, m3]
}

/// What must be equal between two doors' samples of the same turn.
fn training_view(x: &Value) -> Value {
    json!({
        "turn": x["turn"], "tokens": x["tokens"], "response_length": x["response_length"],
        "loss_mask": x["loss_mask"], "rollout_log_probs": x["rollout_log_probs"], "reward": x["reward"],
        "prompt": x["prompt"], "response": x["response"],
        "token_source": x["metadata"]["token_source"],
    })
}

fn by_session(samples: &[Value], session: &str) -> Vec<Value> {
    let mut v: Vec<Value> = samples
        .iter()
        .filter(|x| x["session_id"] == session)
        .cloned()
        .collect();
    v.sort_by_key(|x| x["turn"].as_u64());
    v
}

/// The same three-turn conversation with a tool call, through chat completions and through the
/// Messages door (whole and streamed), gives equal samples: the same tokens, log-probs, masks and
/// rewards; only the door in the metadata differs.
#[tokio::test]
async fn a_conversation_through_the_messages_door_gives_the_samples_chat_completions_gives() {
    let (s, fake, _dir) = start(|_| {}).await;
    through_chat(&s.url, "door-chat", false).await;
    through_chat(&s.url, "door-chat-stream", true).await;
    let whole = through_messages(&s.url, "door-messages", false).await;
    let streamed = through_messages(&s.url, "door-messages-stream", true).await;
    // The streamed answers build what the whole ones are (block ids included). The reasoning is
    // compared trimmed: the engine's streamed reasoning keeps the newline before `</think>` that
    // its whole answer strips (as SGLang's parser does), and the signature carries the text.
    let view = |m: &Value| {
        let mut content = m["content"].clone();
        for b in content.as_array_mut().unwrap() {
            if b["type"] == "thinking" {
                b["thinking"] = json!(b["thinking"].as_str().unwrap().trim());
                b.as_object_mut().unwrap().remove("signature");
            }
        }
        json!({"content": content, "stop_reason": m["stop_reason"], "output_tokens": m["usage"]["output_tokens"]})
    };
    for (w, st) in whole.iter().zip(&streamed) {
        assert_eq!(view(w), view(st));
    }
    assert!(whole[0]["usage"]["input_tokens"].as_u64().unwrap() > 0);
    let samples = s.settle(12).await;
    let chat = by_session(&samples, "door-chat");
    assert_eq!(chat.len(), 3, "{samples:?}");
    // A streamed turn is compared with a streamed one: the engine's stream leaves out what its
    // whole answer carries (the markers' log-probs), in chat completions as through the door.
    for (session, chat_session) in [
        ("door-messages", "door-chat"),
        ("door-messages-stream", "door-chat-stream"),
    ] {
        let chat = by_session(&samples, chat_session);
        let door = by_session(&samples, session);
        assert_eq!(door.len(), 3, "{session}");
        for (c, d) in chat.iter().zip(&door) {
            assert_eq!(
                training_view(c),
                training_view(d),
                "{session} turn {}",
                c["turn"]
            );
            assert_eq!(c["metadata"]["door"], "chat_completions");
            assert_eq!(d["metadata"]["door"], "messages");
        }
    }
    // The inspection page shows each turn's door.
    let page: Value = http()
        .get(format!("{}/v1/inspect/sessions/door-messages", s.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let doors: Vec<&str> = page["turns"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["door"].as_str())
        .collect();
    assert_eq!(doors, ["messages"; 3], "{page}");
    // Engine ids, not a re-tokenization: the door did not cost exactness.
    assert!(
        chat.iter()
            .all(|x| x["metadata"]["token_source"] == "engine"),
        "{chat:?}"
    );
    // The engine was asked for chat completions with log-probs every time.
    let chats: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .collect();
    assert_eq!(chats.len(), 12);
    assert!(chats.iter().all(|r| r.body["logprobs"] == true));
    s.stop().await;
}

/// Without any session key, a Messages conversation is recognised from its history as a chat
/// one is: one session, the second turn the next state of the first.
#[tokio::test]
async fn messages_sessions_are_recognised_from_the_history() {
    let (s, _fake, _dir) = start(|c| {
        c.server.default_turn_type = ps_core::DefaultTurnType::Auto;
    })
    .await;
    let mut h =
        vec![json!({"role": "user", "content": [{"type": "text", "text": "infer-1 plan a trip"}]})];
    let body = |h: &Vec<Value>| json!({"model": "default", "max_tokens": 200, "messages": h, "stream": true});
    let m1 = messages_answer(post(&s.url, "/v1/messages", &body(&h), &[]).await, true).await;
    h.push(json!({"role": "assistant", "content": m1["content"]}));
    h.push(json!({"role": "user", "content": "infer-1 and a budget"}));
    let m2 = messages_answer(post(&s.url, "/v1/messages", &body(&h), &[]).await, true).await;
    assert_eq!(m2["stop_reason"], "end_turn");
    h.push(json!({"role": "assistant", "content": m2["content"]}));
    h.push(json!({"role": "user", "content": "infer-1 thanks"}));
    let r = post(
        &s.url,
        "/v1/messages",
        &json!({"model": "default", "max_tokens": 200, "messages": h, "session_done": true}),
        &[],
    )
    .await;
    assert_eq!(r.status(), 200);
    let samples = s.settle(3).await;
    assert_eq!(samples.len(), 3);
    let sessions: std::collections::BTreeSet<&str> = samples
        .iter()
        .map(|x| x["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        sessions.len(),
        1,
        "one conversation, one session: {sessions:?}"
    );
    assert!(
        samples
            .iter()
            .all(|x| x["metadata"]["session_source"] == "inferred")
    );
    assert!(samples.iter().all(|x| x["metadata"]["door"] == "messages"));
    s.stop().await;
}

/// Bad input through the Messages door: Anthropic's error shape with the right status, the field
/// named, and nothing left behind (no turn opened, the server serves the next request).
#[tokio::test]
async fn messages_errors_answer_in_anthropics_shape_and_leave_nothing_behind() {
    let (s, fake, _dir) = start(|c| {
        c.server.model_names = [("claude-sonnet-4-5".to_owned(), "default".to_owned())].into();
    })
    .await;
    let before = s.status().await;
    let cases = [
        (
            json!({"model": "default", "messages": [{"role": "user", "content": "x"}]}),
            400,
            "invalid_request_error",
            "max_tokens",
        ),
        (
            json!({"model": "default", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}),
            400,
            "invalid_request_error",
            "document",
        ),
        (
            json!({"model": "claude-opus-9", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}),
            404,
            "not_found_error",
            "server.model_names",
        ),
    ];
    for (body, status, kind, names) in cases {
        let r = post(&s.url, "/v1/messages", &body, &[]).await;
        assert_eq!(r.status().as_u16(), status, "{body}");
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["type"], "error", "{e}");
        assert_eq!(e["error"]["type"], kind, "{e}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(names),
            "{e}"
        );
    }
    let r = http()
        .post(format!("{}/v1/messages", s.url))
        .header("content-type", "application/json")
        .body("{\"model\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["type"], "invalid_request_error");
    // Nothing reached the engine, no turn was opened.
    assert!(
        fake.requests()
            .iter()
            .all(|r| r.path != "/v1/chat/completions")
    );
    let after = s.status().await;
    assert_eq!(after["turns_abandoned"], before["turns_abandoned"]);
    assert_eq!(after["turns_dropped"], before["turns_dropped"]);
    // The agent's own model name is served under the policy's.
    let ok = post(
        &s.url,
        "/v1/messages",
        &json!({"model": "claude-sonnet-4-5", "max_tokens": 50,
        "messages": [{"role": "user", "content": "errors-ok hello"}]}),
        &[],
    )
    .await;
    let m = messages_answer(ok, false).await;
    assert_eq!(m["model"], "claude-sonnet-4-5");
    assert_eq!(m["type"], "message");
    assert_eq!(fake.requests().last().unwrap().body["model"], "default");
    s.stop().await;
}

/// The client key is taken as Anthropic's clients send it (`x-api-key`) or as a Bearer token; a
/// missing or wrong key is a 401 in Anthropic's shape. The rollout routes still take the admin
/// key as a Bearer token only.
#[tokio::test]
async fn the_messages_door_takes_the_key_as_x_api_key() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let mut c = settings(&fake, dir.path());
    c.server.api_key_env = Some(CLIENT_VAR.to_owned());
    c.server.admin_key_env = Some(ADMIN_VAR.to_owned());
    let s = Server::start(&c, &common::keys_env).await;
    let body = json!({"model": "default", "max_tokens": 20, "messages": [{"role": "user", "content": "key hello"}]});
    for (headers, status) in [
        (vec![("x-api-key", "client-secret")], 200),
        (vec![("authorization", "Bearer client-secret")], 200),
        (vec![("x-api-key", "wrong")], 401),
        (vec![], 401),
    ] {
        let r = post(&s.url, "/v1/messages", &body, &headers).await;
        assert_eq!(r.status().as_u16(), status, "{headers:?}");
        if status == 401 {
            let e: Value = r.json().await.unwrap();
            assert_eq!(e["type"], "error");
            assert_eq!(e["error"]["type"], "authentication_error", "{e}");
        }
    }
    // `x-api-key` opens the chat route too (the same client key), never the rollout routes.
    let r = post(
        &s.url,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "key chat"}]}),
        &[("x-api-key", "client-secret")],
    )
    .await;
    assert_eq!(r.status().as_u16(), 200);
    let r = http()
        .get(format!("{}/v1/rollout/status", s.url))
        .header("x-api-key", "admin-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    s.stop().await;
}

/// `count_tokens` counts the prompt a turn gets: the engine's own prompt count (`input_tokens` of
/// the answer) and the sample's prompt ids agree with it; a request that does not render is a
/// 400 in Anthropic's shape.
#[tokio::test]
async fn count_tokens_counts_the_prompt_the_turn_gets() {
    let (s, _fake, _dir) = start(|_| {}).await;
    let messages = json!([
        {"role": "user", "content": "count-1 what is in the docs folder?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}, {"type": "tool_use", "id": "t1", "name": "list_files", "input": {"folder": "docs"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": RESULT}, {"type": "text", "text": "go on"}]}
    ]);
    let count = json!({"model": "default", "system": [{"type": "text", "text": SYSTEM}], "messages": messages, "tools": tools_messages()});
    let r = post(&s.url, "/v1/messages/count_tokens", &count, &[]).await;
    assert_eq!(r.status(), 200);
    let n = r.json::<Value>().await.unwrap()["input_tokens"]
        .as_u64()
        .unwrap();
    assert!(n > 50, "{n}");
    let mut turn = count.clone();
    turn["max_tokens"] = json!(100);
    turn["session_done"] = json!(true);
    let m = messages_answer(
        post(
            &s.url,
            "/v1/messages",
            &turn,
            &[("x-session-id", "count-1"), ("x-turn-type", "main")],
        )
        .await,
        false,
    )
    .await;
    assert_eq!(
        m["usage"]["input_tokens"], n,
        "the engine counted the same prompt"
    );
    let samples = s.settle(1).await;
    let x = &samples[0];
    let prompt_len =
        x["tokens"].as_array().unwrap().len() as u64 - x["response_length"].as_u64().unwrap();
    assert_eq!(prompt_len, n, "the sample's prompt is what was counted");
    // Without max_tokens (count_tokens has none) but otherwise checked as a Messages request.
    for (body, kind) in [
        (
            json!({"model": "default", "messages": [{"role": "robot", "content": "x"}]}),
            "invalid_request_error",
        ),
        // An image for a text policy does not render to a prompt it can count.
        (
            json!({"model": "default", "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]}),
            "invalid_request_error",
        ),
    ] {
        let r = post(&s.url, "/v1/messages/count_tokens", &body, &[]).await;
        assert_eq!(r.status().as_u16(), 400, "{body}");
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["type"], kind, "{e}");
    }
    s.stop().await;
}

/// An engine answer the Messages API cannot carry (tool arguments that are not an object) is a
/// 502 naming the call, and no sample: the turn is abandoned as `door_untranslatable` before its
/// reply is registered, so the client's retry is served as a fresh turn, not a fork of it.
#[tokio::test]
async fn an_answer_the_door_cannot_give_is_refused_and_not_trained_on() {
    let (s, fake, _dir) = start(|_| {}).await;
    let engine_answer = json!({"id": "x", "object": "chat.completion", "model": "default",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "list_files", "arguments": "[\"docs\"]"}}]},
            "logprobs": {"content": [{"token": "x", "logprob": -0.5, "top_logprobs": []}]}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1}});
    fake.push_fault(ps_fake_sglang::Fault::Status(
        200,
        engine_answer.to_string(),
    ));
    let body = json!({"model": "default", "max_tokens": 50, "tools": tools_messages(),
        "messages": [{"role": "user", "content": "untranslatable-1 list docs"}]});
    let r = post(
        &s.url,
        "/v1/messages",
        &body,
        &[
            ("x-session-id", "untranslatable-1"),
            ("x-turn-type", "main"),
        ],
    )
    .await;
    assert_eq!(r.status().as_u16(), 502);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["type"], "api_error", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("list_files"),
        "{e}"
    );
    // The retry is answered by the engine as usual.
    let m = messages_answer(
        post(
            &s.url,
            "/v1/messages",
            &body,
            &[
                ("x-session-id", "untranslatable-1"),
                ("x-turn-type", "main"),
            ],
        )
        .await,
        false,
    )
    .await;
    assert_eq!(m["type"], "message");
    let st = s
        .status_when(|st| st["turns_abandoned_by_reason"]["door_untranslatable"] == 1)
        .await;
    assert_eq!(st["samples"]["submitted"], 0, "{st}");
    s.stop().await;
}

fn tools_responses() -> Value {
    json!([{"type": "function", "name": "list_files", "description": "List the files of a folder",
        "parameters": {"type": "object", "properties": {"folder": {"type": "string"}}, "required": ["folder"]}},
        {"type": "web_search"}])
}

/// A Responses answer as a client assembles it: the whole response, or the one its last event
/// carries (its events numbered from 0, in order).
async fn responses_answer(r: reqwest::Response, stream: bool) -> Value {
    let status = r.status();
    if status != 200 {
        panic!("{status}: {}", r.text().await.unwrap());
    }
    if !stream {
        return r.json().await.unwrap();
    }
    let text = r.text().await.unwrap();
    let mut last = Value::Null;
    for (i, event) in text
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .enumerate()
    {
        let data: Value = serde_json::from_str(
            event
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap(),
        )
        .unwrap();
        assert_eq!(data["sequence_number"], i, "{event}");
        last = data;
    }
    assert_eq!(last["type"], "response.completed", "{last}");
    last["response"].clone()
}

/// The same three turns through the Responses door, as Codex sends them (every output item sent
/// back as it came, with its id and status).
async fn through_responses(url: &str, session: &str, stream: bool) -> Vec<Value> {
    let key = [("x-session-id", session), ("x-turn-type", "main")];
    let mut input = vec![
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": ASK}]}),
    ];
    let body = |input: &Vec<Value>, done: bool| {
        let mut b = json!({"model": "default", "instructions": SYSTEM, "input": input, "tools": tools_responses(),
            "max_output_tokens": 400, "stream": stream, "store": false, "include": ["reasoning.encrypted_content"]});
        if done {
            b["session_done"] = json!(true);
        }
        b
    };
    let r1 = responses_answer(
        post(url, "/v1/responses", &body(&input, false), &key).await,
        stream,
    )
    .await;
    let call = r1["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "function_call")
        .unwrap()
        .clone();
    assert_eq!(call["name"], "list_files");
    input.extend(r1["output"].as_array().unwrap().iter().cloned());
    input.push(
        json!({"type": "function_call_output", "call_id": call["call_id"], "output": RESULT}),
    );
    let r2 = responses_answer(
        post(url, "/v1/responses", &body(&input, false), &key).await,
        stream,
    )
    .await;
    assert!(
        r2["output"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["type"] == "message"),
        "{r2}"
    );
    input.extend(r2["output"].as_array().unwrap().iter().cloned());
    input.push(json!({"role": "user", "content": THANKS}));
    let r3 = responses_answer(
        post(url, "/v1/responses", &body(&input, true), &key).await,
        stream,
    )
    .await;
    vec![r1, r2, r3]
}

/// The same three-turn conversation with a tool call through chat completions and through the
/// Responses door (whole and streamed) gives equal samples; the hosted tool is left out and
/// counted, never sent to the engine.
#[tokio::test]
async fn a_conversation_through_the_responses_door_gives_the_samples_chat_completions_gives() {
    let (s, fake, _dir) = start(|_| {}).await;
    through_chat(&s.url, "r-chat", false).await;
    through_chat(&s.url, "r-chat-stream", true).await;
    let whole = through_responses(&s.url, "r-responses", false).await;
    let streamed = through_responses(&s.url, "r-responses-stream", true).await;
    for (w, st) in whole.iter().zip(&streamed) {
        let types = |r: &Value| {
            r["output"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["type"].clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(types(w), types(st));
        assert_eq!(w["usage"]["output_tokens"], st["usage"]["output_tokens"]);
    }
    let samples = s.settle(12).await;
    for (session, chat_session) in [
        ("r-responses", "r-chat"),
        ("r-responses-stream", "r-chat-stream"),
    ] {
        let chat = by_session(&samples, chat_session);
        let door = by_session(&samples, session);
        assert_eq!((chat.len(), door.len()), (3, 3), "{session}");
        for (c, d) in chat.iter().zip(&door) {
            assert_eq!(
                training_view(c),
                training_view(d),
                "{session} turn {}",
                c["turn"]
            );
            assert_eq!(d["metadata"]["door"], "responses");
        }
    }
    let chats: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .collect();
    assert!(chats.iter().all(|r| {
        r.body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["type"] == "function")
    }));
    s.stop().await;
}

/// `previous_response_id` continues a stored response (`store: true`, the API's default): the
/// engine sees the whole conversation, and the turn continues its session; an unknown id is a 404
/// naming the setting-free remedy, and leaves nothing behind.
#[tokio::test]
async fn previous_response_id_continues_a_stored_response() {
    let (s, fake, _dir) = start(|c| {
        c.server.default_turn_type = ps_core::DefaultTurnType::Auto;
    })
    .await;
    let r1 = responses_answer(
        post(
            &s.url,
            "/v1/responses",
            &json!({"model": "default", "instructions": "Answer in French.", "input": "prev-1 plan a trip"}),
            &[],
        )
        .await,
        false,
    )
    .await;
    let id = r1["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("resp_"));
    let r2 = responses_answer(
        post(
            &s.url,
            "/v1/responses",
            &json!({"model": "default", "instructions": "Answer in French.", "input": "prev-1 and a budget",
        "previous_response_id": id, "stream": true}),
            &[],
        )
        .await,
        true,
    )
    .await;
    let sent = &fake
        .requests()
        .into_iter()
        .rfind(|r| r.path == "/v1/chat/completions")
        .unwrap()
        .body;
    let roles: Vec<&str> = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["role"].as_str())
        .collect();
    // The request's own instructions first, then the stored conversation and the new input.
    assert_eq!(roles, ["system", "user", "assistant", "user"], "{sent}");
    // Streamed responses are stored too.
    let r3 = post(
        &s.url,
        "/v1/responses",
        &json!({"model": "default", "instructions": "Answer in French.", "input": "prev-1 thanks",
        "previous_response_id": r2["id"], "session_done": true}),
        &[],
    )
    .await;
    assert_eq!(r3.status(), 200);
    let samples = s.settle(3).await;
    let sessions: std::collections::BTreeSet<&str> = samples
        .iter()
        .map(|x| x["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    let before = fake.requests().len();
    let r = post(
        &s.url,
        "/v1/responses",
        &json!({"model": "default", "input": "x", "previous_response_id": "resp_nope"}),
        &[],
    )
    .await;
    assert_eq!(r.status().as_u16(), 404);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "previous_response_not_found", "{e}");
    let r = post(
        &s.url,
        "/v1/responses",
        &json!({"model": "default", "input": [{"type": "computer_call", "id": "x"}]}),
        &[],
    )
    .await;
    assert_eq!(r.status().as_u16(), 400);
    let e: Value = r.json().await.unwrap();
    assert!(
        e["error"]["message"].as_str().unwrap().contains("input[0]"),
        "{e}"
    );
    assert_eq!(fake.requests().len(), before, "nothing reached the engine");
    s.stop().await;
}

/// Claude Code's own conversation key is recorded on each sample; by default it does not name the
/// session, so a sub-agent's conversation under the same key stays a session of its own (its
/// turns are not the parent's next states). With `server.agent_keys_name_sessions` the key is the
/// session, and its turns train.
#[tokio::test]
async fn an_agents_own_key_is_recorded_and_names_the_session_only_when_asked() {
    let cc = [("x-claude-code-session-id", "5b0c7e1a-cc")];
    let turn = |text: &str, prior: &[Value]| {
        let mut h: Vec<Value> = prior.to_vec();
        h.push(json!({"role": "user", "content": text}));
        json!({"model": "default", "max_tokens": 100, "messages": h})
    };
    let (s, _fake, _dir) =
        start(|c| c.server.default_turn_type = ps_core::DefaultTurnType::Auto).await;
    // The parent conversation, and a sub-agent's, interleaved under one key.
    let p1 = messages_answer(
        post(
            &s.url,
            "/v1/messages",
            &turn("agent-1 fix the bug", &[]),
            &cc,
        )
        .await,
        false,
    )
    .await;
    let a1 = messages_answer(
        post(
            &s.url,
            "/v1/messages",
            &turn("agent-1 search the code base", &[]),
            &cc,
        )
        .await,
        false,
    )
    .await;
    let parent = [
        json!({"role": "user", "content": "agent-1 fix the bug"}),
        json!({"role": "assistant", "content": p1["content"]}),
    ];
    let sub = [
        json!({"role": "user", "content": "agent-1 search the code base"}),
        json!({"role": "assistant", "content": a1["content"]}),
    ];
    messages_answer(
        post(
            &s.url,
            "/v1/messages",
            &turn("agent-1 found it?", &sub),
            &cc,
        )
        .await,
        false,
    )
    .await;
    messages_answer(
        post(
            &s.url,
            "/v1/messages",
            &turn("agent-1 thanks", &parent),
            &cc,
        )
        .await,
        false,
    )
    .await;
    let samples = s.settle(2).await;
    assert_eq!(samples.len(), 2);
    for x in &samples {
        assert_eq!(x["metadata"]["agent_session_key"], "5b0c7e1a-cc");
        assert_eq!(x["metadata"]["session_source"], "inferred");
    }
    assert_ne!(
        samples[0]["session_id"], samples[1]["session_id"],
        "two conversations, two sessions"
    );
    s.stop().await;

    let (s, _fake, _dir) = start(|c| {
        c.server.default_turn_type = ps_core::DefaultTurnType::Auto;
        c.server.agent_keys_name_sessions = true;
    })
    .await;
    let p1 = messages_answer(
        post(
            &s.url,
            "/v1/messages",
            &turn("agent-2 fix the bug", &[]),
            &cc,
        )
        .await,
        false,
    )
    .await;
    let parent = [
        json!({"role": "user", "content": "agent-2 fix the bug"}),
        json!({"role": "assistant", "content": p1["content"]}),
    ];
    messages_answer(
        post(
            &s.url,
            "/v1/messages",
            &turn("agent-2 thanks", &parent),
            &cc,
        )
        .await,
        false,
    )
    .await;
    let samples = s.settle(1).await;
    assert_eq!(samples[0]["session_id"], "5b0c7e1a-cc");
    assert_eq!(samples[0]["metadata"]["session_source"], "agent");
    s.stop().await;
}

/// Bad input through each door: a 4xx in the door's own error shape, never a 5xx, nothing sent to
/// the engine, no turn left behind.
#[tokio::test]
async fn bad_input_through_each_door_is_a_4xx_in_its_shape() {
    let (s, fake, _dir) = start(|_| {}).await;
    let before = s.status().await;
    let messages_bodies = [
        json!([1, 2]),
        json!({"model": "default", "max_tokens": 5, "messages": {"role": "user"}}),
        json!({"model": "default", "max_tokens": 5, "messages": [{"role": "user"}]}),
        json!({"model": "default", "max_tokens": 5, "messages": [{"role": "user", "content": [{"text": "no type"}]}]}),
        json!({"model": "default", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}]}),
        json!({"model": "default", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": "all"}),
        json!({"model": "default", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "maybe"}}),
        json!({"model": 7, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}),
    ];
    for b in &messages_bodies {
        let r = post(&s.url, "/v1/messages", b, &[]).await;
        let status = r.status().as_u16();
        let e: Value = r.json().await.unwrap();
        assert!((400..500).contains(&status), "{b}: {status} {e}");
        assert_eq!(e["type"], "error", "{b}: {e}");
        assert!(
            e["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{e}"
        );
    }
    let responses_bodies = [
        json!("input"),
        json!({"model": "default", "input": 5}),
        json!({"model": "default", "input": [{"type": "message"}]}),
        json!({"model": "default", "input": [{"type": "message", "role": "user", "content": [{"type": "input_audio"}]}]}),
        json!({"model": "default", "input": [{"type": "function_call_output"}]}),
        json!({"model": "default", "input": "x", "tools": [{"type": "namespace"}]}),
        json!({"model": "default", "input": "x", "tool_choice": {"type": "allowed_tools"}}),
        json!({"model": "default", "input": "x", "previous_response_id": "resp_gone"}),
    ];
    for b in &responses_bodies {
        let r = post(&s.url, "/v1/responses", b, &[]).await;
        let status = r.status().as_u16();
        let e: Value = r.json().await.unwrap();
        assert!((400..500).contains(&status), "{b}: {status} {e}");
        assert!(
            e["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{b}: {e}"
        );
    }
    assert!(
        fake.requests()
            .iter()
            .all(|r| r.path != "/v1/chat/completions")
    );
    let after = s.status().await;
    assert_eq!(after["turns_abandoned"], before["turns_abandoned"]);
    assert_eq!(
        after["samples"]["submitted"],
        before["samples"]["submitted"]
    );
    s.stop().await;
}

/// A stream that breaks upstream (SGLang's error event mid-stream) through a door: the client
/// gets the door's error event, and the turn ends with `stream_error` (not as a client that went
/// away), no sample.
#[tokio::test]
async fn a_broken_stream_through_a_door_ends_its_turn_with_its_reason() {
    let (s, fake, _dir) = start(|_| {}).await;
    let key = [("x-session-id", "broken-1"), ("x-turn-type", "main")];
    fake.push_fault(ps_fake_sglang::Fault::StreamError { after_chunks: 2 });
    let r = post(
        &s.url,
        "/v1/messages",
        &json!({"model": "default", "max_tokens": 50, "stream": true,
        "messages": [{"role": "user", "content": "broken-1 hello"}]}),
        &key,
    )
    .await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(
        text.contains("event: error") && !text.contains("message_stop"),
        "{text}"
    );
    fake.push_fault(ps_fake_sglang::Fault::StreamError { after_chunks: 2 });
    let r = post(
        &s.url,
        "/v1/responses",
        &json!({"model": "default", "stream": true, "input": "broken-2 hello"}),
        &[("x-session-id", "broken-2"), ("x-turn-type", "main")],
    )
    .await;
    let text = r.text().await.unwrap();
    assert!(
        text.contains("response.failed") && !text.contains("response.completed"),
        "{text}"
    );
    let st = s
        .status_when(|st| st["turns_abandoned_by_reason"]["stream_error"] == 2)
        .await;
    let by = &st["turns_abandoned_by_reason"];
    assert!(by.get("client_cancelled").is_none(), "{st}");
    assert_eq!(st["samples"]["submitted"], 0);
    s.stop().await;
}
