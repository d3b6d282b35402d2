//! Assembling an answer: the assistant message and the sampled tokens' log-probs, from a non-streamed
//! response or from the chunks of a stream.
//!
//! Longer than ~600 lines because of its unit tests (from line ~400): one case per response shape the
//! real builds send (docs/upstream-protocols.md), kept beside the code they pin.

use ps_core::{EngineIds, FinishReason, RolloutResponse, SampledToken};
use serde_json::{Map, Value, json};

fn first_choice(resp: &Value) -> Option<&Value> {
    resp.get("choices")?.as_array()?.first()
}

/// Reads `logprobs.content[]` entries into sampled tokens (entries without a numeric log-prob are
/// skipped: they carry nothing to align).
fn push_logprob_entries(logprobs: Option<&Value>, out: &mut Vec<SampledToken>) {
    let Some(entries) = logprobs
        .and_then(|l| l.get("content"))
        .and_then(Value::as_array)
    else {
        return;
    };
    for e in entries {
        let Some(logprob) = e.get("logprob").and_then(Value::as_f64) else {
            continue;
        };
        let token = e
            .get("token")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        out.push(SampledToken {
            token,
            id: None,
            logprob,
        });
    }
}

fn as_ids(v: &Value) -> Option<Vec<u32>> {
    v.as_array()?
        .iter()
        .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect()
}

/// `sglext.<key>` ids of the first choice: a flat list, or one list per choice.
fn sglext_ids(sglext: Option<&Value>, key: &str) -> Option<Vec<u32>> {
    let v = sglext?.get(key)?;
    match v.as_array()?.first() {
        Some(Value::Array(_)) => as_ids(v.as_array()?.first()?),
        _ => as_ids(v),
    }
}

/// The engine's sampled ids, where each build puts them (docs/upstream-protocols.md, 1.5): SGLang after
/// its August 2026 rename `choices[].response_token_ids`, earlier SGLang and vLLM
/// `choices[].token_ids`, `sglext.output_ids` (per choice or response-level), and the ids of
/// `meta_info.output_token_logprobs` (`return_meta_info`). Returns the ids and the field's name.
fn response_ids(resp: &Value, choice: &Value) -> Option<(Vec<u32>, &'static str)> {
    if let Some(ids) = choice.get("response_token_ids").and_then(as_ids) {
        return Some((ids, "response_token_ids"));
    }
    if let Some(ids) = choice.get("token_ids").and_then(as_ids) {
        return Some((ids, "token_ids"));
    }
    if let Some(ids) = sglext_ids(choice.get("sglext"), "output_ids")
        .or_else(|| sglext_ids(resp.get("sglext"), "output_ids"))
    {
        return Some((ids, "sglext.output_ids"));
    }
    let triples = choice
        .get("meta_info")?
        .get("output_token_logprobs")?
        .as_array()?;
    let ids: Option<Vec<u32>> = triples
        .iter()
        .map(|t| {
            t.get(1)
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
        })
        .collect();
    ids.map(|ids| (ids, "meta_info.output_token_logprobs"))
}

/// The engine's prompt ids: `choices[].prompt_token_ids` (SGLang), the response-level
/// `prompt_token_ids` (vLLM), or `sglext.input_ids`.
fn prompt_ids(resp: &Value, choice: &Value) -> Option<Vec<u32>> {
    choice
        .get("prompt_token_ids")
        .and_then(as_ids)
        .or_else(|| resp.get("prompt_token_ids").and_then(as_ids))
        .or_else(|| sglext_ids(choice.get("sglext"), "input_ids"))
        .or_else(|| sglext_ids(resp.get("sglext"), "input_ids"))
}

/// Both the engine's prompt and response ids, when it returned both.
pub fn engine_ids(resp: &Value) -> Option<EngineIds> {
    let choice = first_choice(resp)?;
    let (response, field) = response_ids(resp, choice)?;
    let prompt = prompt_ids(resp, choice)?;
    Some(EngineIds {
        prompt,
        response,
        field: field.to_owned(),
    })
}

/// The policy version of a non-streamed answer: `metadata.weight_version` (chat), or
/// `meta_info.weight_version` of the first choice.
fn weight_version(resp: &Value) -> Option<String> {
    let v = resp
        .get("metadata")
        .and_then(|m| m.get("weight_version"))
        .or_else(|| first_choice(resp)?.get("meta_info")?.get("weight_version"))?;
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn finish_of(choice: &Value) -> FinishReason {
    FinishReason {
        reason: choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map(str::to_owned),
        matched_stop: choice.get("matched_stop").cloned().unwrap_or(Value::Null),
    }
}

/// The answer of a non-streamed chat completion (first choice).
pub fn rollout_from_response(resp: &Value) -> RolloutResponse {
    let Some(choice) = first_choice(resp) else {
        return RolloutResponse::default();
    };
    let mut tokens = Vec::new();
    push_logprob_entries(choice.get("logprobs"), &mut tokens);
    if let Some((ids, _)) = response_ids(resp, choice) {
        // Ids are only trusted when they cover the reported tokens one for one.
        if ids.len() == tokens.len() {
            for (t, id) in tokens.iter_mut().zip(ids) {
                t.id = Some(id);
            }
        }
    }
    RolloutResponse {
        message: choice.get("message").cloned().unwrap_or(Value::Null),
        tokens,
        finish: finish_of(choice),
        streamed: false,
        engine_ids: engine_ids(resp),
        weight_version: weight_version(resp),
        unexplained_chars: 0,
    }
}

#[derive(Debug, Default)]
struct ToolCallAcc {
    id: Option<String>,
    kind: Option<String>,
    name: String,
    arguments: String,
}

/// Accumulates the chunks of a streamed chat completion (first choice).
#[derive(Debug, Default)]
pub struct StreamAssembler {
    content: String,
    reasoning: Option<String>,
    tool_calls: Vec<(u64, ToolCallAcc)>,
    tokens: Vec<SampledToken>,
    finish: FinishReason,
    chunks: usize,
    /// Chunks with answer text but no log-probs.
    /// Characters of answer text received, and of the reported tokens' texts.
    text_chars: usize,
    token_chars: usize,
    /// Streamed `sglext` ids (a final `choices: []` chunk before `[DONE]`).
    sglext_prompt: Option<Vec<u32>>,
    sglext_response: Option<Vec<u32>>,
}

impl StreamAssembler {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one chunk's `data:` payload. Returns an error message when the payload is not JSON or is
    /// an upstream error event; the stream is then not usable for training.
    pub fn feed_str(&mut self, data: &str) -> Result<(), String> {
        let chunk: Value =
            serde_json::from_str(data).map_err(|e| format!("chunk is not JSON: {e}"))?;
        self.feed_checked(&chunk)
    }

    /// Feeds one parsed chunk; an upstream error event is returned as an error message.
    pub fn feed_checked(&mut self, chunk: &Value) -> Result<(), String> {
        if let Some(err) = chunk.get("error") {
            let message = err
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .unwrap_or_else(|| err.to_string());
            return Err(message);
        }
        self.feed(chunk);
        Ok(())
    }

    /// Feeds one parsed chunk.
    pub fn feed(&mut self, chunk: &Value) {
        self.chunks += 1;
        if let Some(ids) = sglext_ids(chunk.get("sglext"), "output_ids") {
            self.sglext_response = Some(ids);
        }
        if let Some(ids) = sglext_ids(chunk.get("sglext"), "input_ids") {
            self.sglext_prompt = Some(ids);
        }
        let Some(choice) = chunk
            .get("choices")
            .and_then(Value::as_array)
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
            })
        else {
            return; // usage chunk or another choice
        };
        if let Some(ids) = sglext_ids(choice.get("sglext"), "output_ids") {
            self.sglext_response = Some(ids);
        }
        if let Some(delta) = choice.get("delta") {
            for k in ["content", "reasoning_content"] {
                if let Some(s) = delta.get(k).and_then(Value::as_str) {
                    self.text_chars += s.chars().count();
                }
            }
            for call in delta
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(a) = call
                    .get("function")
                    .and_then(|f| f.get("arguments"))
                    .and_then(Value::as_str)
                {
                    self.text_chars += a.chars().count();
                }
            }
            if let Some(s) = delta.get("content").and_then(Value::as_str) {
                self.content.push_str(s);
            }
            if let Some(s) = delta.get("reasoning_content").and_then(Value::as_str) {
                self.reasoning.get_or_insert_with(String::new).push_str(s);
            }
            if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
                for call in calls {
                    self.feed_tool_call(call);
                }
            }
        }
        let before = self.tokens.len();
        push_logprob_entries(choice.get("logprobs"), &mut self.tokens);
        self.token_chars += self.tokens[before..]
            .iter()
            .map(|t| t.token.chars().count())
            .sum::<usize>();
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish.reason = Some(reason.to_owned());
            self.finish.matched_stop = choice.get("matched_stop").cloned().unwrap_or(Value::Null);
        }
    }

    fn feed_tool_call(&mut self, call: &Value) {
        let index = call.get("index").and_then(Value::as_u64).unwrap_or(0);
        let pos = match self.tool_calls.iter().position(|(i, _)| *i == index) {
            Some(p) => p,
            None => {
                self.tool_calls.push((index, ToolCallAcc::default()));
                self.tool_calls.len() - 1
            }
        };
        let acc = &mut self.tool_calls[pos].1;
        if let Some(id) = call.get("id").and_then(Value::as_str) {
            acc.id = Some(id.to_owned());
        }
        if let Some(t) = call.get("type").and_then(Value::as_str) {
            acc.kind = Some(t.to_owned());
        }
        if let Some(f) = call.get("function") {
            if let Some(n) = f.get("name").and_then(Value::as_str) {
                acc.name.push_str(n);
            }
            if let Some(a) = f.get("arguments").and_then(Value::as_str) {
                acc.arguments.push_str(a);
            }
        }
    }

    /// Whether a finish reason arrived.
    pub fn finished(&self) -> bool {
        self.finish.reason.is_some()
    }

    /// The assembled answer.
    pub fn finish(self) -> RolloutResponse {
        let mut message = Map::new();
        message.insert("role".into(), json!("assistant"));
        message.insert("content".into(), Value::String(self.content));
        message.insert(
            "reasoning_content".into(),
            self.reasoning.map_or(Value::Null, Value::String),
        );
        let calls: Vec<Value> = self
            .tool_calls
            .into_iter()
            .map(|(index, c)| {
                json!({
                    "id": c.id,
                    "index": index,
                    "type": c.kind.unwrap_or_else(|| "function".into()),
                    "function": {"name": c.name, "arguments": c.arguments},
                })
            })
            .collect();
        message.insert(
            "tool_calls".into(),
            if calls.is_empty() {
                Value::Null
            } else {
                Value::Array(calls)
            },
        );
        let engine_ids = match (self.sglext_prompt, self.sglext_response) {
            (Some(prompt), Some(response)) => Some(EngineIds {
                prompt,
                response,
                field: "sglext.output_ids".into(),
            }),
            _ => None,
        };
        RolloutResponse {
            message: Value::Object(message),
            tokens: self.tokens,
            finish: self.finish,
            streamed: true,
            engine_ids,
            weight_version: None,
            unexplained_chars: self.text_chars.saturating_sub(self.token_chars),
        }
    }
}

/// Chunks for a client that asked for a stream when the upstream was called without one
/// (`sglang.stream = false`): a delta with the whole message (and its log-probs), then a delta with the
/// finish reason (and usage). The caller adds `data: [DONE]`.
pub fn synthesize_chunks(resp: &Value) -> Vec<Value> {
    let choice = first_choice(resp).cloned().unwrap_or(Value::Null);
    let message = choice.get("message").cloned().unwrap_or(Value::Null);
    let mut delta = Map::new();
    delta.insert("role".into(), json!("assistant"));
    delta.insert(
        "content".into(),
        message.get("content").cloned().unwrap_or(Value::Null),
    );
    for key in ["reasoning_content", "tool_calls"] {
        if let Some(v) = message.get(key).filter(|v| !v.is_null()) {
            delta.insert(key.into(), v.clone());
        }
    }
    let head = |choices: Value| {
        let mut c = Map::new();
        for key in ["id", "created", "model"] {
            if let Some(v) = resp.get(key) {
                c.insert(key.into(), v.clone());
            }
        }
        c.insert("object".into(), json!("chat.completion.chunk"));
        c.insert("choices".into(), choices);
        c
    };
    let first = head(json!([{
        "index": 0,
        "delta": delta,
        "logprobs": choice.get("logprobs").cloned().unwrap_or(Value::Null),
        "finish_reason": null,
    }]));
    let mut last = head(json!([{
        "index": 0,
        "delta": {},
        "logprobs": null,
        "finish_reason": choice.get("finish_reason").cloned().unwrap_or(Value::Null),
        "matched_stop": choice.get("matched_stop").cloned().unwrap_or(Value::Null),
    }]));
    if let Some(u) = resp.get("usage") {
        last.insert("usage".into(), u.clone());
    }
    vec![Value::Object(first), Value::Object(last)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lp(token: &str, logprob: f64) -> Value {
        json!({"token": token, "bytes": token.as_bytes(), "logprob": logprob, "top_logprobs": []})
    }

    #[test]
    fn non_streamed_answer_with_token_ids() {
        let resp = json!({"choices": [{"index": 0,
            "message": {"role": "assistant", "content": "Hi", "reasoning_content": null, "tool_calls": null},
            "logprobs": {"content": [lp("Hi", -0.5), lp("<|im_end|>", -0.1)]},
            "finish_reason": "stop", "matched_stop": 151645, "token_ids": [13048, 151645]}]});
        let r = rollout_from_response(&resp);
        assert_eq!(r.tokens.len(), 2);
        assert_eq!(r.tokens[0].id, Some(13048));
        assert_eq!(r.tokens[1].logprob, -0.1);
        assert_eq!(r.finish.reason.as_deref(), Some("stop"));
        assert_eq!(r.finish.matched_stop, json!(151645));
        assert_eq!(r.message["content"], "Hi");
        assert!(!r.streamed);
    }

    #[test]
    fn ids_of_another_length_are_ignored() {
        let resp = json!({"choices": [{"message": {"content": "Hi"},
            "logprobs": {"content": [lp("Hi", -0.5)]}, "token_ids": [1, 2]}]});
        let r = rollout_from_response(&resp);
        assert_eq!(r.tokens[0].id, None);
    }

    #[test]
    fn meta_info_ids_are_used() {
        let resp = json!({"choices": [{"message": {"content": "Hi"},
            "logprobs": {"content": [lp("Hi", -0.5)]},
            "meta_info": {"output_token_logprobs": [[-0.5, 77, null]]}}]});
        assert_eq!(rollout_from_response(&resp).tokens[0].id, Some(77));
    }

    #[test]
    fn stream_chunks_assemble_content_reasoning_tools_and_logprobs() {
        let mut a = StreamAssembler::new();
        let chunks = [
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]}),
            json!({"choices": [{"index": 0, "delta": {"reasoning_content": "think"}, "logprobs": {"content": [lp("think", -0.2)]}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": "Hel"}, "logprobs": {"content": [lp("Hel", -0.3)]}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": "lo", "reasoning_content": null}, "logprobs": {"content": [lp("lo", -0.4)]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "get", "arguments": ""}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": null, "type": "function", "function": {"name": null, "arguments": "{\"a\": 1}"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {}, "logprobs": null, "finish_reason": "tool_calls", "matched_stop": null}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 1}}),
        ];
        for c in &chunks {
            a.feed_str(&c.to_string()).expect("valid chunk");
        }
        assert!(a.finished());
        let r = a.finish();
        assert!(r.streamed);
        assert_eq!(r.message["content"], "Hello");
        assert_eq!(r.message["reasoning_content"], "think");
        assert_eq!(
            r.message["tool_calls"],
            json!([{"id": "call_1", "index": 0, "type": "function", "function": {"name": "get", "arguments": "{\"a\": 1}"}}])
        );
        let toks: Vec<_> = r.tokens.iter().map(|t| t.token.as_str()).collect();
        assert_eq!(toks, ["think", "Hel", "lo"]);
        assert_eq!(r.finish.reason.as_deref(), Some("tool_calls"));
    }

    #[test]
    fn error_event_and_garbage_are_reported() {
        let mut a = StreamAssembler::new();
        let e = a
            .feed_str(r#"{"error": {"object": "error", "message": "boom", "code": 400}}"#)
            .expect_err("error event");
        assert_eq!(e, "boom");
        assert!(a.feed_str("not json").is_err());
        assert!(!a.finished());
    }

    #[test]
    fn synthesized_chunks_carry_message_and_finish() {
        let resp = json!({"id": "x", "created": 1, "model": "m", "choices": [{"index": 0,
            "message": {"role": "assistant", "content": "Hi", "reasoning_content": null, "tool_calls": null},
            "logprobs": {"content": [lp("Hi", -0.5)]}, "finish_reason": "stop", "matched_stop": 2}],
            "usage": {"prompt_tokens": 3}});
        let chunks = synthesize_chunks(&resp);
        assert_eq!(chunks.len(), 2);
        assert_eq!(
            chunks[0]["choices"][0]["delta"],
            json!({"role": "assistant", "content": "Hi"})
        );
        assert_eq!(chunks[1]["choices"][0]["finish_reason"], "stop");
        assert_eq!(chunks[1]["usage"]["prompt_tokens"], 3);
        // Re-assembling the synthesized chunks gives the same answer back.
        let mut a = StreamAssembler::new();
        for c in &chunks {
            a.feed(c);
        }
        let r = a.finish();
        assert_eq!(r.message["content"], "Hi");
        assert_eq!(r.tokens.len(), 1);
    }

    fn answer_with(choice_extra: Value, top_extra: Value) -> Value {
        let mut choice = json!({
            "index": 0,
            "message": {"role": "assistant", "content": "Hi"},
            "logprobs": {"content": [lp("Hi", -0.1), lp("<|im_end|>", -0.2)]},
            "finish_reason": "stop",
            "matched_stop": 2,
        });
        for (k, v) in choice_extra.as_object().cloned().unwrap_or_default() {
            choice[k] = v;
        }
        let mut resp = json!({"choices": [choice]});
        for (k, v) in top_extra.as_object().cloned().unwrap_or_default() {
            resp[k] = v;
        }
        resp
    }

    /// Every place a build puts its ids is read, in the documented order of preference.
    #[test]
    fn engine_ids_are_read_from_each_builds_field() {
        let cases = [
            // SGLang after the August 2026 rename
            (
                json!({"prompt_token_ids": [1, 2], "response_token_ids": [7, 9]}),
                json!({}),
                "response_token_ids",
            ),
            // SGLang between the two PRs
            (
                json!({"prompt_token_ids": [1, 2], "token_ids": [7, 9]}),
                json!({}),
                "token_ids",
            ),
            // vLLM: prompt ids at the response level
            (
                json!({"token_ids": [7, 9]}),
                json!({"prompt_token_ids": [1, 2]}),
                "token_ids",
            ),
            // sglext, response-level, one list per choice
            (
                json!({}),
                json!({"sglext": {"input_ids": [1, 2], "output_ids": [[7, 9]]}}),
                "sglext.output_ids",
            ),
            // the renamed field wins over a stale one
            (
                json!({"prompt_token_ids": [1, 2], "response_token_ids": [7, 9], "token_ids": [5]}),
                json!({}),
                "response_token_ids",
            ),
        ];
        for (choice, top, field) in cases {
            let r = rollout_from_response(&answer_with(choice.clone(), top.clone()));
            let ids = r
                .engine_ids
                .unwrap_or_else(|| panic!("no ids from {choice} {top}"));
            assert_eq!((ids.prompt, ids.response), (vec![1, 2], vec![7, 9]));
            assert_eq!(ids.field, field);
            assert_eq!(r.tokens[1].id, Some(9), "ids attached to the log-probs");
        }
        // Response ids without prompt ids are not engine ids (the sample needs both).
        let r = rollout_from_response(&answer_with(json!({"token_ids": [7, 9]}), json!({})));
        assert!(r.engine_ids.is_none());
        assert_eq!(r.tokens[0].id, Some(7));
        assert!(
            rollout_from_response(&answer_with(json!({}), json!({})))
                .engine_ids
                .is_none()
        );
    }

    #[test]
    fn the_weight_version_is_read_from_metadata() {
        let r = rollout_from_response(&answer_with(
            json!({}),
            json!({"metadata": {"weight_version": "v7"}}),
        ));
        assert_eq!(r.weight_version.as_deref(), Some("v7"));
        let r = rollout_from_response(&answer_with(
            json!({}),
            json!({"metadata": {"weight_version": 3}}),
        ));
        assert_eq!(r.weight_version.as_deref(), Some("3"));
        assert!(
            rollout_from_response(&answer_with(json!({}), json!({})))
                .weight_version
                .is_none()
        );
    }

    /// Builds with a parser before mid-2026 send reasoning and tool-call chunks with
    /// `logprobs: null`: those sampled tokens are unexplained, and counted.
    #[test]
    fn text_that_no_reported_token_explains_is_counted() {
        let mut a = StreamAssembler::new();
        a.feed(&json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null}]}));
        a.feed(&json!({"choices": [{"index": 0, "delta": {"reasoning_content": "thinking hard"}, "logprobs": null}]}));
        a.feed(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}, "logprobs": null}]}));
        a.feed(&json!({"choices": [{"index": 0, "delta": {"content": "Hi"}, "logprobs": {"content": [lp("Hi", -0.1)]}}]}));
        a.feed(&json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "matched_stop": 2}]}));
        let r = a.finish();
        assert_eq!(r.unexplained_chars, "thinking hard{}".len());
        assert_eq!(r.tokens.len(), 1);
        // Builds after mid-2026: a later chunk of the same step carries text without log-probs
        // (the step's log-probs rode on its first chunk), and a standalone chunk with an empty
        // delta carries a step that emitted no text: nothing is unexplained.
        let mut a = StreamAssembler::new();
        a.feed(&json!({"choices": [{"index": 0, "delta": {"content": "He"}, "logprobs": {"content": [lp("Hello", -0.1)]}}]}));
        a.feed(&json!({"choices": [{"index": 0, "delta": {"content": "llo"}, "logprobs": null}]}));
        a.feed(&json!({"choices": [{"index": 0, "delta": {}, "logprobs": {"content": [lp("<|im_end|>", -0.2)]}}]}));
        let r = a.finish();
        assert_eq!((r.unexplained_chars, r.tokens.len()), (0, 2));
    }

    /// Streamed `sglext` ids arrive in a final `choices: []` chunk.
    #[test]
    fn streamed_sglext_ids_are_engine_ids() {
        let mut a = StreamAssembler::new();
        a.feed(&json!({"choices": [{"index": 0, "delta": {"content": "Hi"}, "logprobs": {"content": [lp("Hi", -0.1), lp("!", -0.3)]}}]}));
        a.feed(&json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}));
        a.feed(&json!({"choices": [], "sglext": {"input_ids": [1, 2, 3], "output_ids": [[5, 6]]}}));
        let ids = a.finish().engine_ids.expect("ids");
        assert_eq!((ids.prompt, ids.response), (vec![1, 2, 3], vec![5, 6]));
    }
}
