//! `POST /v1/chat/completions`: non-streaming JSON and SSE streaming, shaped like SGLang's answers.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::{
    body::Bytes,
    extract::{Request, State},
    http::StatusCode,
    response::Response,
};
use ps_chat_template::ChatTokenizer;
use serde_json::{Map, Value, json};

use crate::{
    det::{hex_id, mix, policy_logprob},
    http::{Route, blocking, either, faulted_json, flat_error, prelude, sse, sse_response},
    model::{
        ChatParams, ChatSample, Finish, Part, SampleError, chat_logprob_entry, parse_chat,
        sample_chat,
    },
    state::FakeState,
};

pub(crate) async fn chat_completions(State(state): State<FakeState>, req: Request) -> Response {
    either(handle(state, req).await)
}

async fn handle(state: FakeState, req: Request) -> Result<Response, Response> {
    let started = Instant::now();
    let admitted = prelude(&state, Route::OpenAi, req).await?;
    let body = admitted
        .body
        .map_err(|m| flat_error(StatusCode::BAD_REQUEST, "BadRequestError", &m))?;
    let params = parse_chat(&body)
        .map_err(|m| flat_error(StatusCode::BAD_REQUEST, "BadRequestError", &m))?;

    let tok = state.tokenizer().clone();
    let reasoning = state.config().reasoning;
    let id = hex_id(mix(state.next_seq(), 0x6368_6174), 32);
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let fault = admitted.stream_fault;

    if params.stream {
        let events = blocking(Route::OpenAi, move || {
            let sample = sample_chat(&tok, &params, reasoning)?;
            Ok::<_, SampleError>(stream_events(&tok, &params, &sample, &id, created))
        })
        .await?
        .map_err(sample_error)?;
        let error_event = json!({"error": {
            "object": "error",
            "message": "fake-sglang fault: error in the middle of the stream",
            "type": "BadRequestError",
            "param": null,
            "code": 400,
        }});
        Ok(sse_response(
            events,
            error_event,
            fault,
            state.config().token_delay,
            admitted.guard,
        ))
    } else {
        let body = blocking(Route::OpenAi, move || {
            let sample = sample_chat(&tok, &params, reasoning)?;
            Ok::<_, SampleError>(completion_json(
                &tok, &params, &sample, &id, created, started,
            ))
        })
        .await?
        .map_err(sample_error)?;
        Ok(faulted_json(Route::OpenAi, fault.as_ref(), &body))
    }
}

fn sample_error(e: SampleError) -> Response {
    match e {
        SampleError::Template(_) => {
            flat_error(StatusCode::BAD_REQUEST, "BadRequestError", &e.to_string())
        }
        SampleError::Tokenize(_) => flat_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalServerError",
            &e.to_string(),
        ),
    }
}

fn tool_calls_json(sample: &ChatSample) -> Value {
    match &sample.tool_call {
        Some(tc) => json!([{
            "id": tc.id,
            "index": 0,
            "type": "function",
            "function": {"name": tc.name, "arguments": tc.arguments},
        }]),
        None => Value::Null,
    }
}

fn usage_json(sample: &ChatSample) -> Value {
    let completion = sample.tokens.len();
    let reasoning_tokens = sample
        .tokens
        .iter()
        .filter(|t| t.part == Part::Reasoning)
        .count();
    json!({
        "prompt_tokens": sample.prompt_ids.len(),
        "total_tokens": sample.prompt_ids.len() + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": null,
        "reasoning_tokens": reasoning_tokens,
    })
}

fn finish_json(sample: &ChatSample) -> Value {
    match (sample.finish, sample.matched_stop) {
        (Finish::Length, _) => json!({"type": "length", "length": sample.tokens.len()}),
        (_, matched) => json!({"type": "stop", "matched": matched}),
    }
}

fn completion_json(
    tok: &ChatTokenizer,
    p: &ChatParams,
    sample: &ChatSample,
    id: &str,
    created: u64,
    started: Instant,
) -> Value {
    let logprobs = if p.logprobs {
        json!({"content": sample
            .tokens
            .iter()
            .enumerate()
            .map(|(pos, t)| chat_logprob_entry(tok, t, pos, p.top_logprobs))
            .collect::<Vec<_>>()})
    } else {
        Value::Null
    };
    let mut choice = json!({
        "index": 0,
        "message": {
            "role": "assistant",
            "content": sample.content,
            "reasoning_content": sample.reasoning,
            "tool_calls": tool_calls_json(sample),
        },
        "logprobs": logprobs,
        "finish_reason": sample.finish.as_str(),
        "matched_stop": sample.matched_stop,
    });
    if let Some(c) = choice.as_object_mut() {
        let ids = |v: &[u32]| Value::from(v.to_vec());
        if p.return_token_ids || p.return_prompt_token_ids {
            c.insert("prompt_token_ids".into(), ids(&sample.prompt_ids));
        }
        if p.return_token_ids {
            let sampled: Vec<u32> = sample.tokens.iter().map(|t| t.id).collect();
            c.insert("token_ids".into(), ids(&sampled));
        }
        if p.return_meta_info {
            let mut meta = Map::new();
            meta.insert("id".into(), json!(id));
            meta.insert("finish_reason".into(), finish_json(sample));
            meta.insert("prompt_tokens".into(), json!(sample.prompt_ids.len()));
            meta.insert("completion_tokens".into(), json!(sample.tokens.len()));
            meta.insert("cached_tokens".into(), json!(0));
            meta.insert("weight_version".into(), json!("default"));
            if p.logprobs {
                let triples: Vec<Value> = sample
                    .tokens
                    .iter()
                    .enumerate()
                    .map(|(pos, t)| json!([policy_logprob(t.id, pos), t.id, t.text]))
                    .collect();
                meta.insert("output_token_logprobs".into(), Value::Array(triples));
            }
            meta.insert("e2e_latency".into(), json!(started.elapsed().as_secs_f64()));
            c.insert("meta_info".into(), Value::Object(meta));
        }
    }
    json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": p.model,
        "choices": [choice],
        "usage": usage_json(sample),
        "metadata": {"weight_version": "default"},
    })
}

/// The `data:` events of a streamed answer (without `[DONE]`).
fn stream_events(
    tok: &ChatTokenizer,
    p: &ChatParams,
    sample: &ChatSample,
    id: &str,
    created: u64,
) -> Vec<Bytes> {
    let chunk = |choices: Value| {
        json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": p.model,
            "choices": choices,
        })
    };
    let choice = |delta: Value, logprobs: Value, finish: Value, matched: Value| {
        json!([{
            "index": 0,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish,
            "matched_stop": matched,
        }])
    };
    let mut events = vec![chunk(choice(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
        Value::Null,
        Value::Null,
    ))];
    let last_head = sample.tokens.iter().rposition(|t| t.part == Part::ToolHead);
    for (pos, t) in sample.tokens.iter().enumerate() {
        let delta = match t.part {
            Part::Reasoning if !t.text.is_empty() => json!({"reasoning_content": t.text}),
            Part::Content if !t.text.is_empty() => json!({"content": t.text}),
            Part::ToolHead if Some(pos) == last_head => match &sample.planned_tool {
                Some(tc) => json!({"tool_calls": [{
                    "index": 0,
                    "id": tc.id,
                    "type": "function",
                    "function": {"name": tc.name, "arguments": ""},
                }]}),
                None => continue,
            },
            Part::ToolArgs if !t.text.is_empty() => json!({"tool_calls": [{
                "index": 0,
                "id": null,
                "type": "function",
                "function": {"name": null, "arguments": t.text},
            }]}),
            // Empty text delta (markers swallowed by the parsers, stripped whitespace, the eos):
            // SGLang sends no chunk, and this step's logprob is lost (Gotcha 3).
            _ => continue,
        };
        let logprobs = if p.logprobs {
            json!({"content": [chat_logprob_entry(tok, t, pos, p.top_logprobs)]})
        } else {
            Value::Null
        };
        events.push(chunk(choice(delta, logprobs, Value::Null, Value::Null)));
    }
    events.push(chunk(choice(
        json!({}),
        Value::Null,
        json!(sample.finish.as_str()),
        json!(sample.matched_stop),
    )));
    if p.include_usage {
        let mut usage_chunk = chunk(json!([]));
        if let Some(o) = usage_chunk.as_object_mut() {
            o.insert("usage".into(), usage_json(sample));
        }
        events.push(usage_chunk);
    }
    events.iter().map(|e| sse(&e.to_string())).collect()
}
