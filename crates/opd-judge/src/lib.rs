//! The hindsight-hint judge of on-policy distillation (OPD). For one main turn, `m` judge votes say
//! whether the next state reveals something that would have improved the assistant's response
//! (`\boxed{1}` with a hint between `[HINT_START]` and `[HINT_END]`) or not (`\boxed{-1}`); the best
//! hint is appended to the turn's last user message, and that enhanced prompt plus the original
//! response is what the teacher scores.
//!
//! This crate owns that contract (`docs/upstream-protocols.md` section 6): the hint prompt
//! ([`hint_messages`], in our own words), vote parsing ([`parse_hint_vote`]), best-hint selection
//! ([`select_best_hint`]), hint injection ([`append_hint`], [`teacher_input_text`], and
//! [`teacher_input_ids`], which encodes only what the hint changes in the turn's encoded prompt) and the voting
//! seam ([`HintJudge`], implemented by [`HintScorer`]). It reuses the PRM client's transport seam
//! ([`ps_prm_client::JudgeBackend`], with its SGLang `/generate` implementation) and boxed-score
//! parsing, and depends otherwise only on `ps-core` and `ps-chat-template`. It must not depend on the
//! server, the session buffer, the teacher client or any web framework.

mod inject;
mod parse;
mod prompt;
mod scorer;

use serde::{Deserialize, Serialize};

pub use inject::{
    HINT_MARKER, TeacherResponse, append_hint, append_hint_keeping_lists, teacher_input_ids,
    teacher_input_text,
};
pub use parse::{parse_hint_vote, select_best_hint};
pub use prompt::hint_messages;
pub use ps_prm_client::{JudgeBackend, JudgeInput};
pub use scorer::{HintScorer, HintVotes};

/// Default of `opd.min_hint_chars`: a hint is a candidate only when its trimmed length (in
/// characters) is strictly greater than this.
pub const DEFAULT_MIN_HINT_CHARS: usize = 10;

/// One hint vote: its score (1, -1, or `None` when the vote failed) and its hint text (the last
/// `[HINT_START]…[HINT_END]` span, trimmed; empty when there is none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HintVote {
    pub score: Option<i8>,
    pub hint: String,
}

impl HintVote {
    /// A failed vote (no score, no hint), such as a judge call that did not answer.
    pub fn failed() -> Self {
        Self {
            score: None,
            hint: String::new(),
        }
    }
}

/// The hint votes on one turn and the hint chosen from them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HintOutcome {
    /// One entry per vote, in vote order.
    pub votes: Vec<HintVote>,
    /// Aligned with `votes`: why a vote failed (`None` for a vote with a valid score). The reason
    /// names the judge URL and, where an operator can fix it, the configuration key.
    pub failures: Vec<Option<String>>,
    /// The best hint as `(vote index, trimmed hint)` ([`select_best_hint`]); `None` means the turn
    /// is not accepted for OPD.
    pub best: Option<(usize, String)>,
    /// One raw judge answer, for records: the best vote's, else the first valid vote's, else `None`.
    pub representative: Option<String>,
}

impl HintOutcome {
    /// Whether a hint was accepted (the turn can become an OPD sample).
    pub fn accepted(&self) -> bool {
        self.best.is_some()
    }

    /// The accepted hint, if any.
    pub fn hint(&self) -> Option<&str> {
        self.best.as_ref().map(|(_, h)| h.as_str())
    }

    /// The scores of the votes, in vote order (`None` for a failed vote).
    pub fn scores(&self) -> Vec<Option<i8>> {
        self.votes.iter().map(|v| v.score).collect()
    }

    /// How many votes failed.
    pub fn failed_votes(&self) -> usize {
        self.votes.iter().filter(|v| v.score.is_none()).count()
    }
}

/// Judges one turn for OPD: `m` hint votes and the best hint among them. Judging never fails: a
/// failed call is a failed vote, and no acceptable hint is `best: None`.
#[cfg_attr(any(test, feature = "test-support"), mockall::automock)]
#[async_trait::async_trait]
pub trait HintJudge: Send + Sync {
    async fn judge(&self, input: &JudgeInput) -> HintOutcome;
}
