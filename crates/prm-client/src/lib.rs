//! PRM judging of one main turn for binary RL: given the assistant's rendered response and the next
//! state (the next main request's last message), `m` judge votes of `\boxed{1}`, `\boxed{-1}` or
//! `\boxed{0}` and their majority, which is the turn's reward.
//!
//! This crate owns the judge-facing contract (`docs/upstream-protocols.md` section 6): the judge
//! prompt ([`judge_messages`]), score extraction ([`parse_boxed_score`]), the vote
//! ([`majority_vote`], [`PrmScorer`]) and the transport seam ([`JudgeBackend`]) with its SGLang
//! `/generate` implementation ([`SglangJudge`], section 2.4). It must not depend on the server, the
//! session buffer or any web framework; template rendering runs on tokio's blocking pool.

mod backend;
mod error;
mod parse;
mod prompt;
mod scorer;
mod votes;

use serde::{Deserialize, Serialize};

#[cfg(any(test, feature = "test-support"))]
pub use backend::MockJudgeBackend;
pub use backend::{JudgeBackend, SglangJudge, SglangJudgeConfig};
pub use error::{JudgeError, MODEL_DIR_KEY, ROUTER_URL_KEY, TIMEOUT_KEY};
pub use parse::{last_boxed_digit, majority_vote, parse_boxed_score};
pub use prompt::{judge_messages, turn_prompt};
pub use scorer::{PrmScorer, PrmVotes};
pub use votes::{VotePolicy, VoteScorer, Voted, answer_tail, ask_votes};

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
    /// One representative judge text, for records: the first vote agreeing with `score`, else the
    /// first valid vote, else `None`.
    pub representative: Option<String>,
    /// Aligned with `votes`: why a vote failed (`None` for a valid vote). The reason names the judge
    /// URL and, where an operator can fix it, the configuration key.
    #[serde(default)]
    pub failures: Vec<Option<String>>,
}

impl PrmScore {
    /// How many votes failed.
    pub fn failed_votes(&self) -> usize {
        self.votes.iter().filter(|v| v.is_none()).count()
    }
}

/// Scores one turn.
#[async_trait::async_trait]
pub trait TurnScorer: Send + Sync {
    async fn score(&self, input: &JudgeInput) -> PrmScore;
}
