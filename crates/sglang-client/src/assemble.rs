//! Assembling an answer: the assistant message and the sampled tokens' log-probs, from a non-streamed
//! response or from the chunks of a stream.

use ps_core::{FinishReason, RolloutResponse, SampledToken};
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

/// Sampled ids, when the upstream returned them: `choices[0].token_ids` (`return_token_ids`) or the ids
/// of `choices[0].meta_info.output_token_logprobs` (`return_meta_info`).
fn sampled_ids(choice: &Value) -> Option<Vec<u32>> {
    let as_ids = |v: &Value| -> Option<Vec<u32>> {
        v.as_array()?
            .iter()
            .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect()
    };
    if let Some(ids) = choice.get("token_ids").and_then(as_ids) {
        return Some(ids);
    }
    let triples = choice
        .get("meta_info")?
        .get("output_token_logprobs")?
        .as_array()?;
    triples
        .iter()
        .map(|t| {
            t.get(1)
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
        })
        .collect()
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
    if let Some(ids) = sampled_ids(choice) {
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
        if let Some(delta) = choice.get("delta") {
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
        push_logprob_entries(choice.get("logprobs"), &mut self.tokens);
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
        RolloutResponse {
            message: Value::Object(message),
            tokens: self.tokens,
            finish: self.finish,
            streamed: true,
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
}
