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

/// Fixtures for the tests of this and other crates (feature `test-support`).
#[cfg(any(test, feature = "test-support"))]
pub mod testing {
    use super::PendingTurn;
    use crate::{Alignment, CapturedTurn, PositionSource, TokenSource};

    /// Turn `turn` of session `session` as persisted at a shutdown: one user message, a
    /// one-token retokenized answer with its log-prob, a next state, no flags, no fingerprint.
    /// What the stores' round-trip tests keep and read back.
    pub fn pending_turn(session: &str, turn: u64) -> PendingTurn {
        PendingTurn {
            turn: CapturedTurn {
                images: Vec::new(),
                sampling: Default::default(),
                routed_experts: None,
                routed_experts_missing: None,
                session_id: session.into(),
                turn,
                arrival_seq: turn,
                messages: vec![serde_json::json!({"role": "user", "content": "hi"})].into(),
                tools: None,
                template_kwargs: None,
                response_message: serde_json::json!({"role": "assistant", "content": "yo"}),
                prompt_text: "p".into(),
                response_text: "yo".into(),
                prompt_is_prefix: true,
                prompt_ids: vec![1, 2],
                response_ids: vec![3],
                alignment: Alignment {
                    logprobs: vec![Some(-0.25)],
                    sources: vec![PositionSource::Sampled],
                    loss_mask: vec![1],
                    matched_by_ids: true,
                    unmatched_upstream: 0,
                    first_unmatched_upstream: None,
                },
                finish_reason: Some("stop".into()),
                streamed: false,
                token_source: TokenSource::Retokenized,
                weight_version: None,
                origin: Default::default(),
                engine_prompts_agreed: false,
            },
            next: Some(serde_json::json!({"role": "user", "content": "next"})),
            session_had_effective: false,
            conversation_start: false,
            tokenizer: None,
        }
    }
}

/// Durable keeping of pending turns across a restart.
#[async_trait::async_trait]
pub trait PendingStore: Send + Sync {
    /// Stores the turns durably; returns how many.
    async fn save_pending(&self, turns: Vec<PendingTurn>) -> Result<usize, SinkError>;
    /// Returns every stored pending turn and removes them.
    async fn take_pending(&self) -> Result<Vec<PendingTurn>, SinkError>;
}
