//! What the upstream reported about a generated answer: the assembled assistant message and, for each
//! sampled token it reported, the token's text, id (when returned) and log-prob.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One sampled token as the upstream reported it in `logprobs.content[]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampledToken {
    /// The token decoded on its own (SGLang's `token` field).
    pub token: String,
    /// The token id, when the upstream returned sampled ids.
    pub id: Option<u32>,
    pub logprob: f64,
}

/// Why generation stopped, with the stop the upstream matched (`matched_stop`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct FinishReason {
    /// `stop`, `length`, `tool_calls`, `abort`, … or `None` when the upstream sent none.
    pub reason: Option<String>,
    /// A token id (number) or stop string, or `Null`.
    pub matched_stop: Value,
}

impl FinishReason {
    /// Whether the model itself sampled the end-of-turn token `eos_id`: it stopped normally (`stop` or
    /// `tool_calls`) and the matched stop is that token, or is not reported (older builds).
    pub fn sampled_eos(&self, eos_id: Option<u32>) -> bool {
        let stopped = matches!(self.reason.as_deref(), Some("stop" | "tool_calls"));
        if !stopped {
            return false;
        }
        match (&self.matched_stop, eos_id) {
            (Value::Null, _) => true,
            (Value::Number(n), Some(eos)) => n.as_u64() == Some(u64::from(eos)),
            _ => false,
        }
    }
}

/// The token ids the engine itself used for one answer: the prompt it rendered and tokenized, and
/// the ids it sampled (end-of-turn token included), taken before any reasoning or tool-call parsing.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct EngineIds {
    pub prompt: Vec<u32>,
    pub response: Vec<u32>,
    /// Where the response ids were found (`response_token_ids`, `token_ids`, `sglext.output_ids`,
    /// `meta_info`), for logs and the sample's metadata.
    pub field: String,
}

/// The assembled answer of one chat completion (streamed or not), for the first choice.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RolloutResponse {
    /// `{"role": "assistant", "content", "reasoning_content"?, "tool_calls"?}` as returned or assembled.
    pub message: Value,
    /// Every sampled token the upstream reported, in order.
    pub tokens: Vec<SampledToken>,
    pub finish: FinishReason,
    /// Whether the answer came as a stream (streamed answers may lack log-probs of empty deltas).
    pub streamed: bool,
    /// The engine's own prompt and response ids, when it returned both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_ids: Option<EngineIds>,
    /// The policy version that produced the answer (`metadata.weight_version` of a non-streamed
    /// SGLang answer); streamed answers carry none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_version: Option<String>,
    /// Characters of streamed answer text (content, reasoning, tool-call arguments) beyond the
    /// text of the tokens whose log-probs were reported: text no reported token explains (SGLang
    /// builds with a reasoning or tool parser before mid-2026 send those chunks with
    /// `logprobs: null`). A later chunk of the same step carrying text without log-probs (its
    /// step's log-probs rode on the first chunk) leaves nothing unexplained. 0 when not streamed.
    #[serde(default)]
    pub unexplained_chars: usize,
    /// The engine's count of prompt tokens (`usage.prompt_tokens`: a non-streamed answer's, a
    /// stream's when it carries usage), image pads included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u64>,
    /// A mixture-of-experts engine's routed experts for the turn's tokens (SGLang's
    /// `sglext.routed_experts`, vLLM's `choices[0].routed_experts`), when it returned them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routed_experts: Option<crate::EngineExperts>,
    /// A stream's routed experts as SGLang sent them (base64 of int32), read on the capture
    /// thread rather than on the chat path that assembled the stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routed_experts_encoded: Option<String>,
    /// Why routed experts the answer carried could not be read (the turn then has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routed_experts_error: Option<String>,
}
