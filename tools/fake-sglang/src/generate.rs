//! `POST`/`PUT /generate`: SGLang's native API. Text prompts get judge-like answers (scriptable with
//! `FAKE_VOTES=…`); `input_ids` with `return_logprob` give teacher-style prompt logprobs.

use std::time::Instant;

use axum::{
    extract::{Request, State},
    http::StatusCode,
    response::Response,
};
use ps_chat_template::ChatTokenizer;
use serde_json::{Map, Value, json};

use crate::{
    det::{alternatives, hash_str, hex_id, mix, policy_logprob, teacher_logprob},
    http::{Route, blocking, either, faulted_json, native_error, prelude, sse, sse_response},
    model::{default_vote, judge_text, scripted_votes, thinking_enabled, triple},
    state::FakeState,
};

/// Default `sampling_params.max_new_tokens` of SGLang.
const DEFAULT_MAX_NEW_TOKENS: usize = 128;

/// The teacher's top-`k` list at a prompt position, best first, as `(logprob, token id)`. The actual token
/// `id` is in the list with [`teacher_logprob`]`(prev_id, id, position)`; it is first when that value is
/// above ln(0.5), else at a rank derived from the inputs. This is what `/generate` returns in
/// `input_top_logprobs` for that position (entry 0 excepted, which is null).
pub fn teacher_top_logprobs(prev_id: u32, id: u32, position: usize, k: usize) -> Vec<(f64, u32)> {
    if k == 0 {
        return Vec::new();
    }
    let v = teacher_logprob(prev_id, id, position);
    let rank = if v > -std::f64::consts::LN_2 {
        0
    } else {
        (mix(mix(u64::from(prev_id), u64::from(id)), position as u64) % k as u64) as usize
    };
    let mut alts = alternatives(id, k - 1).into_iter();
    (0..k)
        .map(|r| {
            if r == rank {
                (v, id)
            } else {
                let alt = alts.next().unwrap_or(id);
                let lp = if r < rank {
                    v * (r + 1) as f64 / (rank + 1) as f64
                } else {
                    v - 0.25 - 0.5 * (r - rank) as f64
                };
                (lp, alt)
            }
        })
        .collect()
}

pub(crate) async fn generate(State(state): State<FakeState>, req: Request) -> Response {
    either(handle(state, req).await)
}

async fn handle(state: FakeState, req: Request) -> Result<Response, Response> {
    let started = Instant::now();
    let admitted = prelude(&state, Route::Native, req).await?;
    let body = admitted
        .body
        .map_err(|m| native_error(StatusCode::BAD_REQUEST, &m))?;
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let st = state.clone();
    let out = blocking(Route::Native, move || run(&st, &body))
        .await?
        .map_err(|m| native_error(StatusCode::BAD_REQUEST, &m))?;
    let tok = state.tokenizer().clone();
    if stream {
        let mut events = Vec::new();
        for case in &out.cases {
            let n = case.output.len();
            for k in (if n == 0 { 0 } else { 1 })..=n {
                let mut ev = case.render(&tok, k, k == n, started);
                if out.batch
                    && let Some(o) = ev.as_object_mut()
                {
                    o.insert("index".into(), json!(case.index));
                }
                events.push(sse(&ev.to_string()));
            }
        }
        let error_event =
            json!({"error": {"message": "fake-sglang fault: error in the middle of the stream"}});
        Ok(sse_response(
            events,
            error_event,
            admitted.stream_fault,
            state.config().token_delay,
            admitted.guard,
        ))
    } else {
        let results: Vec<Value> = out
            .cases
            .iter()
            .map(|c| c.render(&tok, c.output.len(), true, started))
            .collect();
        let body = if out.batch {
            Value::Array(results)
        } else {
            results.into_iter().next().unwrap_or(Value::Null)
        };
        Ok(faulted_json(
            Route::Native,
            admitted.stream_fault.as_ref(),
            &body,
        ))
    }
}

struct Output {
    /// Answer with an array (batch input or `n > 1`).
    batch: bool,
    cases: Vec<Case>,
}

/// One result object of `/generate`.
struct Case {
    index: usize,
    rid: String,
    prompt_ids: Vec<u32>,
    /// Sampled tokens as (id, decoded text).
    output: Vec<(u32, String)>,
    /// Final `text` (when every token of `output` is included).
    text: String,
    /// Index of the eos in `output` if it was sampled; its text is dropped unless kept.
    eos_at: Option<usize>,
    keep_eos_text: bool,
    finish: Value,
    return_logprob: bool,
    logprob_start: usize,
    top_k: usize,
    text_in_logprobs: bool,
    /// `meta_info.weight_version` ([`crate::Quirks::weight_version`]).
    weight_version: Option<String>,
}

impl Case {
    fn render(&self, tok: &ChatTokenizer, k: usize, done: bool, started: Instant) -> Value {
        let k = k.min(self.output.len());
        let text = if done {
            self.text.clone()
        } else {
            self.output[..k]
                .iter()
                .enumerate()
                .filter(|(i, _)| Some(*i) != self.eos_at || self.keep_eos_text)
                .map(|(_, (_, t))| t.as_str())
                .collect()
        };
        let ids: Vec<u32> = self.output[..k].iter().map(|(id, _)| *id).collect();
        let mut meta = Map::new();
        meta.insert("id".into(), json!(self.rid));
        meta.insert(
            "finish_reason".into(),
            if done {
                self.finish.clone()
            } else {
                Value::Null
            },
        );
        meta.insert("prompt_tokens".into(), json!(self.prompt_ids.len()));
        meta.insert("completion_tokens".into(), json!(k));
        meta.insert("cached_tokens".into(), json!(0));
        if let Some(v) = &self.weight_version {
            meta.insert("weight_version".into(), json!(v));
        }
        if self.return_logprob {
            let with_text = self.text_in_logprobs;
            let p = &self.prompt_ids;
            let input: Vec<Value> = (self.logprob_start..p.len())
                .map(|pos| {
                    let lp = (pos > self.logprob_start)
                        .then(|| teacher_logprob(p[pos - 1], p[pos], pos));
                    triple(tok, lp, p[pos], with_text)
                })
                .collect();
            meta.insert("input_token_logprobs".into(), Value::Array(input));
            let output: Vec<Value> = ids
                .iter()
                .enumerate()
                .map(|(pos, id)| triple(tok, Some(policy_logprob(*id, pos)), *id, with_text))
                .collect();
            meta.insert("output_token_logprobs".into(), Value::Array(output));
            if self.top_k > 0 {
                let input_top: Vec<Value> = (self.logprob_start..p.len())
                    .map(|pos| {
                        if pos == self.logprob_start {
                            return Value::Null;
                        }
                        teacher_top_logprobs(p[pos - 1], p[pos], pos, self.top_k)
                            .into_iter()
                            .map(|(lp, id)| triple(tok, Some(lp), id, with_text))
                            .collect()
                    })
                    .collect();
                meta.insert("input_top_logprobs".into(), Value::Array(input_top));
                let output_top: Vec<Value> = ids
                    .iter()
                    .enumerate()
                    .map(|(pos, id)| {
                        let lp = policy_logprob(*id, pos);
                        let mut row = vec![triple(tok, Some(lp), *id, with_text)];
                        for (j, alt) in alternatives(*id, self.top_k - 1).into_iter().enumerate() {
                            row.push(triple(tok, Some(lp - 1.0 - 0.5 * j as f64), alt, with_text));
                        }
                        Value::Array(row)
                    })
                    .collect();
                meta.insert("output_top_logprobs".into(), Value::Array(output_top));
            }
        }
        meta.insert("e2e_latency".into(), json!(started.elapsed().as_secs_f64()));
        json!({"text": text, "output_ids": ids, "meta_info": meta})
    }
}

/// `v` itself, or its `i`-th element when it is a list (SGLang's per-item batch parameters).
fn per_item(v: Option<&Value>, i: usize) -> Option<&Value> {
    match v {
        Some(Value::Array(a)) => a.get(i),
        other => other,
    }
}

fn run(state: &FakeState, body: &Value) -> Result<Output, String> {
    let obj = body
        .as_object()
        .ok_or_else(|| "request body must be a JSON object".to_owned())?;
    let tok = state.tokenizer();
    let text = obj.get("text").filter(|v| !v.is_null());
    let input_ids = obj.get("input_ids").filter(|v| !v.is_null());
    // (prompt text, prompt ids) per batch item.
    let (prompts, batch): (Vec<(String, Vec<u32>)>, bool) = match (text, input_ids) {
        (Some(_), Some(_)) => {
            return Err("Either text or input_ids should be provided, not both.".into());
        }
        (None, None) => {
            return Err("Either text, input_ids or input_embeds should be provided.".into());
        }
        (Some(Value::String(s)), None) => (vec![(s.clone(), encode_prompt(state, s)?)], false),
        (Some(Value::Array(list)), None) => {
            let mut v = Vec::with_capacity(list.len());
            for t in list {
                let s = t.as_str().ok_or("text: every item must be a string")?;
                v.push((s.to_owned(), encode_prompt(state, s)?));
            }
            (v, true)
        }
        (Some(_), None) => return Err("text: must be a string or a list of strings".into()),
        (None, Some(Value::Array(list))) if list.first().is_some_and(Value::is_array) => {
            let mut v = Vec::with_capacity(list.len());
            for ids in list {
                let ids = parse_ids(ids)?;
                v.push((decode(tok, &ids), ids));
            }
            (v, true)
        }
        (None, Some(ids)) => {
            let ids = parse_ids(ids)?;
            (vec![(decode(tok, &ids), ids)], false)
        }
    };
    // A vision-language engine's images beside `input_ids`: one per run of image pad tokens (SGLang
    // refuses a count that does not match). The fake does not look at the images themselves.
    if let Some(images) = obj.get("image_data").filter(|v| !v.is_null()) {
        let Value::Array(list) = images else {
            return Err("image_data: must be a list of image URLs".into());
        };
        let Some(vision) = tok.vision() else {
            return Err("image_data given to a model that takes no images".into());
        };
        // Each image as the processor sizes it, in order: its run of pads must be that long (a
        // real engine's processor expands the images again and would not match otherwise).
        let mut want = Vec::with_capacity(list.len());
        for url in list {
            let url = url
                .as_str()
                .ok_or("image_data: must be a list of image URLs")?;
            let part = serde_json::json!({"type": "image_url", "image_url": {"url": url}});
            want.push(crate::model::image_pads(vision, &part)?);
        }
        for (_, ids) in &prompts {
            let runs = vision.pad_runs(ids);
            if runs != want {
                return Err(format!(
                    "the input's image placeholders {runs:?} do not fit the images of \
                     image_data ({want:?} tokens)"
                ));
            }
        }
    }
    let text_in_logprobs = obj
        .get("return_text_in_logprobs")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut cases = Vec::new();
    let mut any_n = false;
    for (i, (prompt, prompt_ids)) in prompts.iter().enumerate() {
        if prompt_ids.is_empty() {
            return Err("The input is empty.".into());
        }
        let sp = per_item(obj.get("sampling_params"), i)
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let sp_u = |k: &str| sp.get(k).and_then(Value::as_u64).map(|n| n as usize);
        let sp_b = |k: &str, d: bool| sp.get(k).and_then(Value::as_bool).unwrap_or(d);
        let max_new = sp_u("max_new_tokens").unwrap_or(DEFAULT_MAX_NEW_TOKENS);
        let n = sp_u("n").unwrap_or(1).max(1);
        any_n |= n > 1;
        let return_logprob = per_item(obj.get("return_logprob"), i)
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let len = prompt_ids.len();
        let start = match per_item(obj.get("logprob_start_len"), i).and_then(Value::as_i64) {
            None => len - 1,
            Some(s) if s < 0 => len - 1,
            Some(s) => s as usize,
        };
        if return_logprob && start >= len {
            return Err(format!(
                "logprob_start_len ({start}) is greater than or equal to the input length ({len}); \
                 it must be smaller than the input length"
            ));
        }
        let top_k = per_item(obj.get("top_logprobs_num"), i)
            .and_then(Value::as_u64)
            .unwrap_or(0) as usize;
        let keep_eos_text = !sp_b("skip_special_tokens", true) && sp_b("no_stop_trim", false);
        let rid = per_item(obj.get("rid"), i)
            .and_then(Value::as_str)
            .map(str::to_owned);
        for copy in 0..n {
            let rid = match (&rid, n) {
                (Some(r), 1) => r.clone(),
                (Some(r), _) => format!("{r}-{copy}"),
                (None, _) => hex_id(mix(state.next_seq(), hash_str(prompt)), 32),
            };
            let (output, text, eos_at, finish) = if max_new == 0 {
                (
                    Vec::new(),
                    String::new(),
                    None,
                    json!({"type": "length", "length": 0}),
                )
            } else {
                sample_judge(state, prompt, max_new, keep_eos_text)?
            };
            cases.push(Case {
                index: cases.len(),
                rid,
                prompt_ids: prompt_ids.clone(),
                output,
                text,
                eos_at,
                keep_eos_text,
                finish,
                return_logprob,
                logprob_start: start,
                top_k,
                text_in_logprobs,
                weight_version: state.config().quirks.weight_version.clone(),
            });
        }
    }
    Ok(Output {
        batch: batch || any_n,
        cases,
    })
}

type Sampled = (Vec<(u32, String)>, String, Option<usize>, Value);

/// The judge's answer to `prompt`: tokens, final text, eos position and finish reason.
fn sample_judge(
    state: &FakeState,
    prompt: &str,
    max_new: usize,
    keep_eos_text: bool,
) -> Result<Sampled, String> {
    let tok = state.tokenizer();
    let (vote, call) = match scripted_votes(prompt) {
        Some(list) => {
            let call = state.next_vote_call(prompt);
            (list[call % list.len()], call)
        }
        None => (Some(default_vote(prompt)), 0),
    };
    let thinking = thinking_enabled(state.config().reasoning, None);
    let answer = judge_text(prompt, vote, call, thinking);
    let mut output: Vec<(u32, String)> = encode(tok, &answer)?
        .into_iter()
        .map(|id| (id, tok.token_text(id)))
        .collect();
    let eos = tok.eos_token_id();
    if let Some(id) = eos {
        output.push((id, tok.token_text(id)));
    }
    if output.len() > max_new {
        output.truncate(max_new);
        let text = output.iter().map(|(_, t)| t.as_str()).collect();
        return Ok((
            output,
            text,
            None,
            json!({"type": "length", "length": max_new}),
        ));
    }
    let eos_at = eos.map(|_| output.len() - 1);
    let mut text = answer;
    if keep_eos_text && let Some((_, t)) = eos_at.and_then(|i| output.get(i)) {
        text.push_str(t);
    }
    Ok((
        output,
        text,
        eos_at,
        json!({"type": "stop", "matched": eos}),
    ))
}

/// A text prompt's ids, through the prefix cache (a judge's votes on one turn send the same prompt).
fn encode_prompt(state: &FakeState, text: &str) -> Result<Vec<u32>, String> {
    state
        .config()
        .prompts
        .encode_shared(state.tokenizer(), text)
        .map_err(|e| format!("tokenization failed: {e}"))
}

fn encode(tok: &ChatTokenizer, text: &str) -> Result<Vec<u32>, String> {
    tok.encode(text)
        .map_err(|e| format!("tokenization failed: {e}"))
}

fn decode(tok: &ChatTokenizer, ids: &[u32]) -> String {
    ids.iter().map(|id| tok.token_text(*id)).collect()
}

fn parse_ids(v: &Value) -> Result<Vec<u32>, String> {
    v.as_array()
        .ok_or("input_ids: must be a list of token ids")?
        .iter()
        .map(|x| {
            x.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| format!("input_ids: {x} is not a token id"))
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn teacher_top_contains_the_token_sorted() {
        for pos in 1..40 {
            let top = teacher_top_logprobs(3, 10, pos, 5);
            assert_eq!(top.len(), 5);
            let mine: Vec<_> = top.iter().filter(|(_, id)| *id == 10).collect();
            assert_eq!(mine.len(), 1);
            assert_eq!(mine[0].0, teacher_logprob(3, 10, pos));
            assert!(top.windows(2).all(|w| w[0].0 >= w[1].0), "{top:?}");
        }
    }
}
