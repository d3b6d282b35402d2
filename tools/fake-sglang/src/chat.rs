//! `POST /v1/chat/completions`: non-streaming JSON and SSE streaming, shaped like SGLang's answers.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::MoeRouting;
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
        ChatParams, ChatSample, Finish, Part, SampleError, SampledToken, chat_logprob_entry,
        parse_chat, sample_chat,
    },
    quirks::{IdField, Quirks, StreamLogprobs},
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
    let quirks = state.config().quirks.clone();
    let params = parse_chat(&body, quirks.vllm)
        .map_err(|m| flat_error(StatusCode::BAD_REQUEST, "BadRequestError", &m))?;

    let tok = state.tokenizer().clone();
    let st = state.clone();
    let reasoning = state.config().reasoning;
    let id = hex_id(mix(state.next_seq(), 0x6368_6174), 32);
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let fault = admitted.stream_fault;

    if params.stream {
        let events = blocking(Route::OpenAi, move || {
            let sample = sample_chat(&tok, &st.config().prompts, &params, reasoning)?;
            Ok::<_, SampleError>(if quirks.vllm {
                vllm_stream_events(&tok, &params, &sample, &id, created)
            } else {
                stream_events(&tok, &params, &sample, &id, created, &quirks)
            })
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
            let sample = sample_chat(&tok, &st.config().prompts, &params, reasoning)?;
            Ok::<_, SampleError>(completion_json(
                &tok, &params, &sample, &id, created, started, &quirks,
            ))
        })
        .await?
        .map_err(sample_error)?;
        Ok(faulted_json(Route::OpenAi, fault.as_ref(), &body))
    }
}

fn sample_error(e: SampleError) -> Response {
    match e {
        SampleError::Template(_) | SampleError::Image(_) => {
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

/// A log-prob entry as this build gives it (short top lists under [`Quirks::short_top_lists`]).
fn entry(tok: &ChatTokenizer, t: &SampledToken, pos: usize, top: usize, q: &Quirks) -> Value {
    let mut e = chat_logprob_entry(tok, t, pos, top);
    if q.short_top_lists
        && let Some(list) = e.get_mut("top_logprobs").and_then(Value::as_array_mut)
        && list.len() > 1
    {
        // Two ids that decode to the same text collapse: the list is shorter than asked and, here,
        // lacks the sampled token.
        list.remove(0);
        list.pop();
    }
    e
}

/// The routed experts of a sample's tokens (prompt and sampled, but the last) in SGLang's form:
/// base64 of little-endian int32.
fn sglang_experts(routing: &MoeRouting, sample: &ChatSample) -> Value {
    use base64::Engine as _;
    let bytes: Vec<u8> = routing
        .route(&all_ids(sample))
        .iter()
        .flat_map(|&e| (e as i32).to_le_bytes())
        .collect();
    json!(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// The same in vLLM's form: base64 of a `.npy` file, shape `(rows, layers, top_k)`, uint8.
fn vllm_experts(routing: &MoeRouting, sample: &ChatSample) -> Value {
    use base64::Engine as _;
    use npyz::WriterBuilder as _;
    let ids = all_ids(sample);
    let rows = ids.len().saturating_sub(1) as u64;
    let mut out = Vec::new();
    let written = npyz::WriteOptions::<u8>::new()
        .default_dtype()
        .shape(&[rows, routing.layers as u64, routing.top_k as u64])
        .writer(&mut out)
        .begin_nd()
        .and_then(|mut w| {
            w.extend(routing.route(&ids).iter().map(|&e| e as u8))?;
            w.finish()
        });
    match written {
        Ok(()) => json!(base64::engine::general_purpose::STANDARD.encode(out)),
        Err(_) => Value::Null,
    }
}

/// The prompt's ids and the sampled ones.
fn all_ids(sample: &ChatSample) -> Vec<u32> {
    let mut ids = sample.prompt_ids.clone();
    ids.extend(sample.sampled_ids());
    ids
}

/// `sglext` with the engine's ids (one list per choice for the outputs).
fn sglext_json(sample: &ChatSample) -> Value {
    let mut ext = json!({"input_ids": null, "output_ids": null});
    ext["input_ids"] = Value::from(sample.prompt_ids.clone());
    ext["output_ids"] = Value::Array(vec![Value::from(sample.sampled_ids())]);
    ext
}

fn completion_json(
    tok: &ChatTokenizer,
    p: &ChatParams,
    sample: &ChatSample,
    id: &str,
    created: u64,
    started: Instant,
    q: &Quirks,
) -> Value {
    let logprobs = if p.logprobs {
        json!({"content": sample
            .tokens
            .iter()
            .enumerate()
            .map(|(pos, t)| entry(tok, t, pos, p.top_logprobs, q))
            .collect::<Vec<_>>()})
    } else {
        Value::Null
    };
    // A non-streamed answer that ends in tool calls reports no matched stop (docs/upstream-protocols.md 1.6).
    let matched_stop = if sample.tool_call.is_some() {
        Value::Null
    } else {
        json!(sample.matched_stop)
    };
    // Large values are moved into their (already ordered) places: `json!` would copy them.
    let mut choice = if q.vllm {
        // vLLM writes `tool_calls` only when there are calls.
        let mut message = json!({"role": "assistant", "content": sample.content, "refusal": null});
        if sample.tool_call.is_some()
            && let Some(m) = message.as_object_mut()
        {
            m.insert("tool_calls".into(), tool_calls_json(sample));
        }
        if let Some(m) = message.as_object_mut() {
            m.insert("reasoning".into(), json!(sample.reasoning));
        }
        json!({
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": sample.finish.as_str(),
            "stop_reason": null,
        })
    } else {
        json!({
            "index": 0,
            "message": {
                "role": "assistant",
                "content": sample.content,
                "reasoning_content": sample.reasoning,
                "tool_calls": tool_calls_json(sample),
            },
            "logprobs": null,
            "finish_reason": sample.finish.as_str(),
            "matched_stop": matched_stop,
        })
    };
    choice["logprobs"] = logprobs;
    let mut top_level = Map::new();
    if let Some(c) = choice.as_object_mut() {
        let ids = |v: &[u32]| Value::from(v.to_vec());
        let sampled = sample.sampled_ids();
        let prompt_in_choice = !matches!(q.id_field, IdField::Vllm | IdField::Sglext);
        if prompt_in_choice
            && (p.return_prompt_token_ids || (p.return_token_ids && q.id_field != IdField::None))
        {
            c.insert("prompt_token_ids".into(), ids(&sample.prompt_ids));
        }
        if p.return_token_ids {
            match q.id_field {
                IdField::ResponseTokenIds => {
                    c.insert("response_token_ids".into(), ids(&sampled));
                }
                IdField::TokenIds => {
                    c.insert("token_ids".into(), ids(&sampled));
                }
                IdField::Vllm => {
                    c.insert("token_ids".into(), ids(&sampled));
                    top_level.insert("prompt_token_ids".into(), ids(&sample.prompt_ids));
                }
                IdField::Sglext | IdField::None => {}
            }
        }
        if q.id_field == IdField::Sglext {
            top_level.insert("sglext".into(), sglext_json(sample));
        }
        if let Some(routing) = &q.routed_experts {
            if q.vllm {
                c.insert("routed_experts".into(), vllm_experts(routing, sample));
            } else if p.return_routed_experts {
                let ext = top_level.entry("sglext").or_insert_with(|| json!({}));
                ext["routed_experts"] = sglang_experts(routing, sample);
            }
        }
        if p.return_meta_info {
            let mut meta = Map::new();
            meta.insert("id".into(), json!(id));
            meta.insert("finish_reason".into(), finish_json(sample));
            meta.insert("prompt_tokens".into(), json!(sample.prompt_ids.len()));
            meta.insert("completion_tokens".into(), json!(sample.tokens.len()));
            meta.insert("cached_tokens".into(), json!(0));
            if let Some(v) = &q.weight_version {
                meta.insert("weight_version".into(), json!(v));
            }
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
    let mut answer = json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": p.model,
        "choices": null,
        "usage": usage_json(sample),
    });
    answer["choices"] = Value::Array(vec![choice]);
    if let Some(o) = answer.as_object_mut() {
        if let Some(v) = &q.weight_version {
            o.insert("metadata".into(), json!({"weight_version": v}));
        }
        o.extend(top_level);
    }
    answer
}

/// The `data:` events of a streamed answer as vLLM 0.32 sends them (recorded; without `[DONE]`):
/// the role first, with the prompt's ids at the response level when asked (`null` otherwise),
/// then one chunk per sampled token carrying its text under `reasoning`, `content` or a tool-call
/// fragment (an empty delta when the parsers swallow it), its log-prob and, when asked, its id in
/// `token_ids`; the finish reason and `stop_reason` ride on the last token's chunk.
fn vllm_stream_events(
    tok: &ChatTokenizer,
    p: &ChatParams,
    sample: &ChatSample,
    id: &str,
    created: u64,
) -> Vec<Bytes> {
    let chunk = |choice: Value| {
        json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": p.model,
            "choices": [choice],
        })
    };
    let mut first = chunk(
        json!({"index": 0, "delta": {"role": "assistant", "content": ""},
        "logprobs": null, "finish_reason": null}),
    );
    if let Some(o) = first.as_object_mut() {
        let prompt = if p.return_token_ids {
            Value::from(sample.prompt_ids.clone())
        } else {
            Value::Null
        };
        o.insert("prompt_token_ids".into(), prompt);
    }
    let mut events = vec![first];
    let last_head = sample.tokens.iter().rposition(|t| t.part == Part::ToolHead);
    let n = sample.tokens.len();
    for (pos, t) in sample.tokens.iter().enumerate() {
        let delta = match t.part {
            Part::Reasoning if !t.text.is_empty() => json!({"reasoning": t.text}),
            Part::Content if !t.text.is_empty() => json!({"content": t.text}),
            Part::ToolHead if Some(pos) == last_head => match &sample.planned_tool {
                Some(tc) => json!({"tool_calls": [{"id": tc.id, "type": "function", "index": 0,
                    "function": {"name": tc.name}}]}),
                None => json!({}),
            },
            Part::ToolArgs if !t.text.is_empty() => {
                json!({"tool_calls": [{"index": 0, "function": {"arguments": t.text}}]})
            }
            _ => json!({}),
        };
        let logprobs = if p.logprobs {
            json!({"content": [chat_logprob_entry(tok, t, pos, p.top_logprobs)]})
        } else {
            Value::Null
        };
        let last = pos + 1 == n;
        let mut choice = json!({"index": 0, "delta": delta, "logprobs": logprobs,
            "finish_reason": if last { json!(sample.finish.as_str()) } else { Value::Null }});
        if let Some(c) = choice.as_object_mut() {
            if last {
                c.insert("stop_reason".into(), Value::Null);
            }
            let ids = if p.return_token_ids {
                json!([t.id])
            } else {
                Value::Null
            };
            c.insert("token_ids".into(), ids);
        }
        events.push(chunk(choice));
    }
    if n == 0 {
        events.push(chunk(json!({"index": 0, "delta": {}, "logprobs": null,
            "finish_reason": sample.finish.as_str(), "stop_reason": null})));
    }
    if p.include_usage {
        let mut usage_chunk = chunk(json!(null));
        if let Some(o) = usage_chunk.as_object_mut() {
            o.insert("choices".into(), json!([]));
            o.insert("usage".into(), usage_json(sample));
        }
        events.push(usage_chunk);
    }
    events.iter().map(|e| sse(&e.to_string())).collect()
}

/// The `data:` events of a streamed answer (without `[DONE]`).
fn stream_events(
    tok: &ChatTokenizer,
    p: &ChatParams,
    sample: &ChatSample,
    id: &str,
    created: u64,
    q: &Quirks,
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
    // Before PR #28601 a request with tools and a tool parser gets no log-probs at all.
    let no_logprobs_at_all =
        q.stream_logprobs == StreamLogprobs::NullOnParsedChunks && p.tools.is_some();
    // Steps waiting to be sent in one chunk (tokens_per_chunk > 1): their deltas merged, their
    // entries each repeating the first token's top list.
    let per_chunk = q.tokens_per_chunk.max(1);
    let mut pending: Vec<(Value, Value)> = Vec::new();
    let flush = |pending: &mut Vec<(Value, Value)>, events: &mut Vec<Value>| {
        if pending.is_empty() {
            return;
        }
        let mut delta = Map::new();
        let mut entries = Vec::new();
        let mut first_top: Option<Value> = None;
        let mut any_logprobs = false;
        for (d, lp) in pending.drain(..) {
            for (k, v) in d.as_object().cloned().unwrap_or_default() {
                match (delta.get_mut(&k), &v) {
                    (Some(Value::String(acc)), Value::String(more)) => acc.push_str(more),
                    // Tool-call fragments of one call (index 0) in one chunk: their argument
                    // pieces are joined, as SGLang's parser would have streamed them together.
                    (Some(Value::Array(acc)), Value::Array(more)) if k == "tool_calls" => {
                        for call in more {
                            let piece = call["function"]["arguments"].as_str().unwrap_or_default();
                            match acc.last_mut() {
                                Some(last)
                                    if last["index"] == call["index"]
                                        && last["function"]["arguments"].is_string() =>
                                {
                                    let joined = format!(
                                        "{}{piece}",
                                        last["function"]["arguments"].as_str().unwrap_or_default()
                                    );
                                    last["function"]["arguments"] = Value::String(joined);
                                }
                                _ => acc.push(call.clone()),
                            }
                        }
                    }
                    (Some(_), _) => {}
                    (None, _) => {
                        delta.insert(k, v);
                    }
                }
            }
            if let Some(mut e) = lp.as_object().cloned() {
                any_logprobs = true;
                match &first_top {
                    None => first_top = e.get("top_logprobs").cloned(),
                    Some(top) => {
                        e.insert("top_logprobs".into(), top.clone());
                    }
                }
                entries.push(Value::Object(e));
            }
        }
        let logprobs = if any_logprobs {
            json!({"content": entries})
        } else {
            Value::Null
        };
        events.push(chunk(choice(
            Value::Object(delta),
            logprobs,
            Value::Null,
            Value::Null,
        )));
    };
    for (pos, t) in sample.tokens.iter().enumerate() {
        let parsed = matches!(t.part, Part::Reasoning | Part::ToolHead | Part::ToolArgs);
        let entry_here = if !p.logprobs
            || no_logprobs_at_all
            || (parsed && q.stream_logprobs == StreamLogprobs::NullOnParsedChunks)
        {
            Value::Null
        } else {
            entry(tok, t, pos, p.top_logprobs, q)
        };
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
            // without a parser SGLang sends no chunk, and this step's logprob is lost; builds
            // after PR #28601 send it on a standalone chunk with an empty delta (docs/upstream-protocols.md 1.3).
            _ => match q.stream_logprobs {
                StreamLogprobs::StepChunks if !entry_here.is_null() => json!({}),
                _ => continue,
            },
        };
        // Builds after PR #28601 may emit one step's text in two chunks: the step's log-probs ride
        // on the first, the second carries text and `logprobs: null` (docs/upstream-protocols.md 1.3). Every fifth
        // visible token is split so.
        let split = q.stream_logprobs == StreamLogprobs::StepChunks
            && per_chunk == 1
            && pos % 5 == 2
            && matches!(t.part, Part::Reasoning | Part::Content)
            && t.text.chars().count() >= 2;
        if split {
            let key = if t.part == Part::Reasoning {
                "reasoning_content"
            } else {
                "content"
            };
            let mid = t.text.char_indices().nth(1).map_or(0, |(i, _)| i);
            let (head, tail) = t.text.split_at(mid);
            pending.push((json!({ key: head }), entry_here));
            flush(&mut pending, &mut events);
            pending.push((json!({ key: tail }), Value::Null));
            flush(&mut pending, &mut events);
            continue;
        }
        pending.push((delta, entry_here));
        if pending.len() >= per_chunk {
            flush(&mut pending, &mut events);
        }
    }
    flush(&mut pending, &mut events);
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
    let experts = q
        .routed_experts
        .as_ref()
        .filter(|_| p.return_routed_experts)
        .map(|r| sglang_experts(r, sample));
    if q.id_field == IdField::Sglext || experts.is_some() {
        // Streamed sglext (ids, routed experts) comes once, in a final `choices: []` chunk.
        let mut ext = if q.id_field == IdField::Sglext {
            sglext_json(sample)
        } else {
            json!({})
        };
        if let Some(e) = experts {
            ext["routed_experts"] = e;
        }
        let mut ext_chunk = chunk(json!([]));
        if let Some(o) = ext_chunk.as_object_mut() {
            o.insert("sglext".into(), ext);
        }
        events.push(ext_chunk);
    }
    events.iter().map(|e| sse(&e.to_string())).collect()
}
