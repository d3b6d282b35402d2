//! The tree-based reading of answers and chunks as it was before the raw reading replaced it
//! (`ps_sglang_client::assemble`): kept for the tests only, to check that both read every input
//! alike (`crates/sglang-client/tests/tree_equivalence.rs`).

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
        // Routed experts are checked by the parsers' own tests, not by this oracle.
        routed_experts: None,
        routed_experts_encoded: None,
        routed_experts_error: None,
        prompt_tokens: resp
            .get("usage")
            .and_then(|u| u.get("prompt_tokens"))
            .and_then(Value::as_u64),
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
    prompt_tokens: Option<u64>,
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
        if let Some(n) = chunk
            .get("usage")
            .and_then(|u| u.get("prompt_tokens"))
            .and_then(Value::as_u64)
        {
            self.prompt_tokens = Some(n);
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
            routed_experts: None,
            routed_experts_encoded: None,
            routed_experts_error: None,
            prompt_tokens: self.prompt_tokens,
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
