//! `POST /v1/completions` in **vLLM's** shape (`docs/upstream-protocols.md` 3), for teachers served by
//! vLLM: a token-id (or text) prompt, `prompt_logprobs: N` and `return_token_ids`. SGLang's own
//! completions route has no `prompt_logprobs`; this one exists so a completions teacher client can be
//! tested against the same teacher values as `/generate`.
//!
//! `prompt_logprobs[0]` is null; entry `i > 0` holds the prompt token with
//! [`teacher_logprob`]`(prompt[i-1], prompt[i], i)` and the top-`N` of [`teacher_top_logprobs`] with
//! ranks `1..=N` (the prompt token first, then the others by rank: key order is not part of the
//! contract). The completion itself is the end-of-turn token at once (`max_tokens: 0` gives none).

use std::time::{SystemTime, UNIX_EPOCH};

use axum::{
    extract::{Request, State},
    http::StatusCode,
    response::Response,
};
use ps_chat_template::ChatTokenizer;
use serde_json::{Map, Value, json};

use crate::{
    det::{hex_id, mix, teacher_logprob},
    generate::teacher_top_logprobs,
    http::{Route, blocking, either, faulted_json, flat_error, prelude},
    state::FakeState,
};

/// vLLM's default `max_tokens`.
const DEFAULT_MAX_TOKENS: u64 = 16;

pub(crate) async fn completions(State(state): State<FakeState>, req: Request) -> Response {
    either(handle(state, req).await)
}

async fn handle(state: FakeState, req: Request) -> Result<Response, Response> {
    let bad = |m: String| flat_error(StatusCode::BAD_REQUEST, "BadRequestError", &m);
    let admitted = prelude(&state, Route::OpenAi, req).await?;
    let body = admitted.body.map_err(bad)?;
    let tok = state.tokenizer().clone();
    let seed = state.next_seq();
    let answer = blocking(Route::OpenAi, move || answer(&tok, &body, seed))
        .await?
        .map_err(bad)?;
    Ok(faulted_json(
        Route::OpenAi,
        admitted.stream_fault.as_ref(),
        &answer,
    ))
}

/// The whole non-streaming answer to `body`.
fn answer(tok: &ChatTokenizer, body: &Value, seed: u64) -> Result<Value, String> {
    let obj = body
        .as_object()
        .ok_or("request body must be a JSON object")?;
    let model = obj
        .get("model")
        .and_then(Value::as_str)
        .ok_or("model: a string is required")?;
    let prompt: Vec<u32> = match obj.get("prompt") {
        Some(Value::String(s)) => tok
            .encode(s)
            .map_err(|e| format!("tokenization failed: {e}"))?,
        Some(Value::Array(items)) if !items.first().is_some_and(Value::is_array) => items
            .iter()
            .map(|x| {
                x.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| format!("prompt: {x} is not a token id"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("prompt: fake-sglang simulates one prompt (text or ids)".into()),
        None => return Err("prompt: required".into()),
    };
    if prompt.is_empty() {
        return Err("prompt: must not be empty".into());
    }
    let prompt_logprobs = match obj.get("prompt_logprobs") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .ok_or("prompt_logprobs: fake-sglang simulates a count >= 0 (not -1)")?
                as usize,
        ),
    };
    if obj.get("stream").and_then(Value::as_bool).unwrap_or(false) {
        return Err(if prompt_logprobs.is_some() {
            "`prompt_logprobs` are not available when `stream=True`.".into()
        } else {
            "fake-sglang does not simulate streamed completions".into()
        });
    }
    let max_tokens = match obj.get("max_tokens") {
        None | Some(Value::Null) => DEFAULT_MAX_TOKENS,
        Some(v) => v.as_u64().ok_or("max_tokens: must be a count")?,
    };
    let return_ids = obj
        .get("return_token_ids")
        .and_then(Value::as_bool)
        .unwrap_or(false);

    let eos = tok.eos_token_id().unwrap_or(0);
    let (output, finish): (Vec<u32>, &str) = if max_tokens == 0 {
        (Vec::new(), "length")
    } else {
        (vec![eos], "stop")
    };
    let logprobs = prompt_logprobs.map(|n| {
        let mut entries = vec![Value::Null];
        entries.extend((1..prompt.len()).map(|i| position_entry(tok, &prompt, i, n)));
        Value::Array(entries)
    });
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Ok(json!({
        "id": format!("cmpl-{}", hex_id(mix(seed, 0x636d_706c), 32)),
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "text": "",
            "logprobs": null,
            "finish_reason": finish,
            "stop_reason": null,
            "prompt_token_ids": return_ids.then(|| prompt.clone()),
            "token_ids": return_ids.then(|| output.clone()),
            "prompt_logprobs": logprobs,
        }],
        "usage": {
            "prompt_tokens": prompt.len(),
            "completion_tokens": output.len(),
            "total_tokens": prompt.len() + output.len(),
        },
    }))
}

/// `prompt_logprobs[i]` (`i > 0`): the prompt token first, then the rest of the top-`n` by rank.
fn position_entry(tok: &ChatTokenizer, prompt: &[u32], i: usize, n: usize) -> Value {
    let (prev, id) = (prompt[i - 1], prompt[i]);
    let top = teacher_top_logprobs(prev, id, i, n.max(1));
    let rank_of = |t: u32| top.iter().position(|(_, x)| *x == t).map(|r| r + 1);
    let entry = |lp: f64, t: u32, rank: Option<usize>| {
        let decoded = tok.token_text(t);
        json!({"logprob": lp, "rank": rank, "decoded_token": decoded})
    };
    let mut map = Map::new();
    map.insert(
        id.to_string(),
        entry(teacher_logprob(prev, id, i), id, rank_of(id)),
    );
    for (r, (lp, t)) in top.iter().enumerate().take(n) {
        if *t != id {
            map.insert(t.to_string(), entry(*lp, *t, Some(r + 1)));
        }
    }
    Value::Object(map)
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn prompt_logprobs_follow_the_vllm_layout() {
        let tok = ChatTokenizer::mini();
        let prompt = [10u32, 11, 12, 13];
        let body = json!({"model": "t", "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
                          "prompt_logprobs": 3, "return_token_ids": true});
        let v = answer(&tok, &body, 1).unwrap();
        let choice = &v["choices"][0];
        assert_eq!(choice["prompt_token_ids"], json!(prompt));
        let lps = choice["prompt_logprobs"].as_array().unwrap();
        assert_eq!(lps.len(), prompt.len());
        assert!(lps[0].is_null());
        for i in 1..prompt.len() {
            let (prev, id) = (prompt[i - 1], prompt[i]);
            let entry = lps[i].as_object().unwrap();
            assert_eq!(entry.keys().next().unwrap(), &id.to_string());
            assert_eq!(
                entry[&id.to_string()]["logprob"].as_f64().unwrap(),
                teacher_logprob(prev, id, i)
            );
            let mut ranked: Vec<(u64, u32, f64)> = entry
                .iter()
                .map(|(k, e)| {
                    (
                        e["rank"].as_u64().unwrap(),
                        k.parse().unwrap(),
                        e["logprob"].as_f64().unwrap(),
                    )
                })
                .collect();
            ranked.sort_by_key(|r| r.0);
            let want: Vec<(u64, u32, f64)> = teacher_top_logprobs(prev, id, i, 3)
                .into_iter()
                .enumerate()
                .map(|(r, (lp, t))| (r as u64 + 1, t, lp))
                .collect();
            assert_eq!(ranked, want);
        }
        let no_ids = answer(&tok, &json!({"model": "t", "prompt": [1, 2]}), 2).unwrap();
        assert!(no_ids["choices"][0]["prompt_token_ids"].is_null());
        assert!(no_ids["choices"][0]["prompt_logprobs"].is_null());
        let streamed =
            json!({"model": "t", "prompt": [1, 2], "prompt_logprobs": 1, "stream": true});
        assert!(answer(&tok, &streamed, 3).is_err());
    }
}
