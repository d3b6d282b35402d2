//! The judges' ports: the transport one judge prompt goes through ([`JudgeBackend`]), the PRM votes
//! on a turn ([`TurnScorer`]) and the OPD hint votes on a turn ([`HintJudge`]), with what they see
//! ([`JudgeInput`]) and what they give back ([`PrmScore`], [`HintOutcome`]).

use std::fmt::Display;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::Semaphore;

use super::CallError;

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

/// Scores one turn (the PRM votes of RL and Combine). Scoring never fails: a failed call is a
/// failed vote.
#[async_trait]
pub trait TurnScorer: Send + Sync {
    async fn score(&self, input: &JudgeInput) -> PrmScore;
}

/// Sends one judge prompt and returns the judge's answer text.
#[async_trait]
pub trait JudgeBackend: Send + Sync {
    /// One completion of `messages` (a `[system, user]` judge prompt).
    async fn complete(&self, messages: &[Value]) -> Result<String, CallError>;

    /// `m` completions of the same `messages` (the votes on one turn), in parallel, each its own
    /// call with its own answer or failure, each holding a permit of `semaphore` (when given)
    /// while it runs. The default calls [`JudgeBackend::complete`] `m` times; a backend whose
    /// calls share work overrides it to do that work once (the SGLang judge renders the prompt
    /// and builds the request body once per turn, not once per vote).
    async fn complete_votes(
        &self,
        messages: &[Value],
        m: usize,
        semaphore: Option<&Semaphore>,
    ) -> Vec<Result<String, String>> {
        let one = || with_permit(semaphore, self.complete(messages));
        futures::future::join_all((0..m).map(|_| one())).await
    }

    /// A short description for logs, such as `sglang /generate at http://…`.
    fn describe(&self) -> String;
}

/// Runs `call` holding a permit of `semaphore` (when given); the error as its text, as a failed
/// vote keeps it.
pub async fn with_permit<T, E: Display>(
    semaphore: Option<&Semaphore>,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, String> {
    let _permit = match semaphore {
        Some(sem) => Some(
            sem.acquire()
                .await
                .map_err(|_| "the judge concurrency limiter is closed".to_owned())?,
        ),
        None => None,
    };
    call.await.map_err(|e| e.to_string())
}

// A hand-written `mock!` instead of `automock`: it mocks only the required methods, so that a
// mock's `complete_votes` is the trait's default (the `m` calls of `complete` the tests expect).
#[cfg(any(test, feature = "test-support"))]
mockall::mock! {
    /// A [`JudgeBackend`] driven by expectations on `complete` and `describe`.
    pub JudgeBackend {}

    #[async_trait]
    impl JudgeBackend for JudgeBackend {
        async fn complete(&self, messages: &[Value]) -> Result<String, CallError>;
        fn describe(&self) -> String;
    }
}

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
    /// The best hint as `(vote index, trimmed hint)`; `None` means the turn is not accepted for
    /// OPD.
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
#[async_trait]
pub trait HintJudge: Send + Sync {
    async fn judge(&self, input: &JudgeInput) -> HintOutcome;
}
