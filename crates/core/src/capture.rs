//! A captured main turn: the exact prompt and response tokens with aligned log-probs, and the sink
//! that receives it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::align::Alignment;

/// One main turn, rendered and tokenized as `transformers` would, with the rollout log-probs aligned to
/// its response tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapturedTurn {
    pub session_id: String,
    /// Strictly increasing over the process, taken when the request arrived: orders the turns of a
    /// session even when their captures finish out of order.
    pub arrival_seq: u64,
    /// The request messages as the client sent them (before normalisation).
    pub messages: Vec<Value>,
    pub tools: Option<Value>,
    /// The assistant message as returned (or assembled from the stream).
    pub response_message: Value,
    pub prompt_text: String,
    pub response_text: String,
    /// `false` when the full text did not start with the prompt text; the response is then the full text.
    pub prompt_is_prefix: bool,
    pub prompt_ids: Vec<u32>,
    pub response_ids: Vec<u32>,
    pub alignment: Alignment,
    pub finish_reason: Option<String>,
    pub streamed: bool,
}

/// Receives captured main turns. Implementations must not block: the session buffer queues the turn
/// and returns.
#[cfg_attr(any(test, feature = "test-support"), mockall::automock)]
pub trait TurnSink: Send + Sync {
    fn accept(&self, turn: CapturedTurn);
}
