//! Turns that were captured but not yet samples when the server had to stop: persisted so that the
//! next start resumes them instead of losing them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::capture::CapturedTurn;
use crate::sink::SinkError;

/// A captured turn and its next state (`None`: known to have none), waiting to be judged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingTurn {
    pub turn: CapturedTurn,
    pub next: Option<Value>,
    /// Whether its session had already submitted an effective sample before the stop, so that
    /// the at-least-one rule does not keep one more zero-scored turn after the restart. (Absent
    /// in turns persisted by older versions: false.)
    #[serde(default)]
    pub session_had_effective: bool,
    /// Whether this turn starts a new conversation under a reused session id (after
    /// `X-Session-Done`): its at-least-one state starts afresh here after the restart too.
    #[serde(default)]
    pub conversation_start: bool,
    /// The fingerprint of the policy tokenizer that made its ids (`ChatTokenizer::fingerprint`):
    /// a restart with another tokenizer or chat template does not resume it. (Absent in turns
    /// persisted by older versions, or by a buffer told no fingerprint: resumed as before.)
    #[serde(default)]
    pub tokenizer: Option<u64>,
}

/// Durable keeping of pending turns across a restart.
#[async_trait::async_trait]
pub trait PendingStore: Send + Sync {
    /// Stores the turns durably; returns how many.
    async fn save_pending(&self, turns: Vec<PendingTurn>) -> Result<usize, SinkError>;
    /// Returns every stored pending turn and removes them.
    async fn take_pending(&self) -> Result<Vec<PendingTurn>, SinkError>;
}
