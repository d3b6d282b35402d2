//! The hindsight-hint judge of on-policy distillation: `m` votes on whether the next state reveals
//! what would have improved the response (`\boxed{1}` with a hint between `[HINT_START]` and
//! `[HINT_END]`, or `\boxed{-1}`), and the choice of the best hint. This crate owns that contract;
//! the judge implementations come with the OPD mode.

use serde::{Deserialize, Serialize};

/// One hint vote: its score (1, -1, or `None` when it failed) and its hint text (trimmed, may be empty).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HintVote {
    pub score: Option<i8>,
    pub hint: String,
}

/// Asks the judge for `m` hint votes on one turn.
#[async_trait::async_trait]
pub trait HintJudge: Send + Sync {
    async fn votes(
        &self,
        response_text: &str,
        next_state_role: &str,
        next_state_text: &str,
    ) -> Vec<HintVote>;
}
