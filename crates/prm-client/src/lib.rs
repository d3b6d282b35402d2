//! PRM judging of one main turn: given the assistant's rendered response and the next state (the
//! next main request's last message), `m` judge votes of `\boxed{1}`, `\boxed{-1}` or `\boxed{0}`
//! and their majority. This crate owns the judge-facing contract only; it must not depend on the
//! server or the session buffer. The SGLang `/generate` implementation comes with the binary RL mode.

use serde::{Deserialize, Serialize};

/// What the judge sees of one turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JudgeInput {
    /// The assistant message as the policy's chat template renders it (thinking, tool-call markup and
    /// end-of-turn marker included).
    pub response_text: String,
    /// The next state's content, flattened to text.
    pub next_state_text: String,
    /// The next state's role (`user` or `tool`).
    pub next_state_role: String,
}

/// The votes on one turn and their majority.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrmScore {
    /// One entry per vote: the parsed score, or `None` for a failed vote.
    pub votes: Vec<Option<i8>>,
    /// Majority over valid votes; a tie or no valid vote gives 0.
    pub score: f64,
    /// One representative judge text, for records.
    pub representative: Option<String>,
}

/// Scores one turn.
#[async_trait::async_trait]
pub trait TurnScorer: Send + Sync {
    async fn score(&self, input: &JudgeInput) -> PrmScore;
}
