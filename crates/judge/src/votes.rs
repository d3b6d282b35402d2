//! Asking a judge `m` times in parallel and reading the answers as votes: [`VoteScorer`] with a
//! [`VotePolicy`], shared by the PRM scorer and the OPD hint judge.

use std::{fmt, sync::Arc};

use serde_json::Value;
use tokio::sync::Semaphore;

use ps_core::ports::JudgeBackend;

/// Longest tail of an unparseable judge answer quoted in a vote's failure reason.
const TAIL_CHARS: usize = 120;

/// Sends `messages` to `backend` `m` times in parallel ([`JudgeBackend::complete_votes`]); each
/// call holds a permit of `semaphore` (when given) while it runs. Each entry is the judge's answer,
/// or why the call failed.
pub async fn ask_votes(
    backend: &dyn JudgeBackend,
    messages: &[Value],
    m: usize,
    semaphore: Option<&Semaphore>,
) -> Vec<Result<String, String>> {
    backend.complete_votes(messages, m, semaphore).await
}

/// The last characters of a judge answer, for a failure reason.
pub fn answer_tail(text: &str) -> String {
    let n = text.chars().count();
    text.chars().skip(n.saturating_sub(TAIL_CHARS)).collect()
}

/// What makes one kind of vote judge: its prompt, how one answer is read, and how the votes of a
/// turn add up. [`VoteScorer`] does the rest (the `m` calls, the concurrency permits, the failed
/// votes with their reasons), the same for the PRM scorer and the OPD hint judge.
pub trait VotePolicy: Send + Sync {
    /// One vote as parsed from one answer.
    type Vote: Send;
    /// What the votes of one turn add up to.
    type Outcome;

    /// Who votes, for the log line of a failed vote (`PRM judge`, `hint judge`).
    const ROLE: &'static str;

    /// The judge prompt for one turn.
    fn messages(&self, input: &ps_core::ports::JudgeInput) -> Vec<Value>;

    /// Reads one answer: the vote, or, when the answer has no valid verdict, what was parsed of
    /// it (kept in the failed vote).
    fn parse(&self, answer: &str) -> Result<Self::Vote, Self::Vote>;

    /// Why `answer`, which [`VotePolicy::parse`] refused, is not a valid vote of the judge `judge`.
    fn invalid_answer(&self, judge: &str, answer: &str) -> String;

    /// The vote of a call that failed.
    fn failed_vote(&self) -> Self::Vote;

    /// The turn's outcome from its votes, in vote order.
    fn outcome(&self, votes: Vec<Voted<Self::Vote>>) -> Self::Outcome;
}

/// One vote's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Voted<V> {
    pub vote: V,
    /// The judge's answer, when the vote is valid.
    pub text: Option<String>,
    /// Why the vote failed (the call's error, or what is wrong with the answer).
    pub failure: Option<String>,
}

/// `votes` parallel judge calls on one turn (each holding one permit of the judge-concurrency
/// semaphore when one is given), read by the policy `P`. A call that fails or an answer without a
/// valid verdict is a failed vote with its reason kept; judging itself never fails.
#[derive(Clone)]
pub struct VoteScorer<P> {
    backend: Arc<dyn JudgeBackend>,
    votes: usize,
    semaphore: Option<Arc<Semaphore>>,
    policy: P,
}

impl<P: fmt::Debug> fmt::Debug for VoteScorer<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VoteScorer")
            .field("policy", &self.policy)
            .field("backend", &self.backend.describe())
            .field("votes", &self.votes)
            .field(
                "semaphore_available",
                &self.semaphore.as_ref().map(|s| s.available_permits()),
            )
            .finish()
    }
}

impl<P: VotePolicy> VoteScorer<P> {
    /// `votes` is `prm.num_votes` (m); `semaphore` bounds judge calls across all turns.
    pub fn with_policy(
        policy: P,
        backend: Arc<dyn JudgeBackend>,
        votes: usize,
        semaphore: Option<Arc<Semaphore>>,
    ) -> Self {
        Self {
            backend,
            votes,
            semaphore,
            policy,
        }
    }

    /// Votes per turn (m).
    pub fn votes(&self) -> usize {
        self.votes
    }

    /// How the votes are asked and read.
    pub fn policy(&self) -> &P {
        &self.policy
    }

    /// Asks the `m` votes on one turn and adds them up.
    pub async fn run(&self, input: &ps_core::ports::JudgeInput) -> P::Outcome {
        let messages = self.policy.messages(input);
        let answers = ask_votes(
            self.backend.as_ref(),
            &messages,
            self.votes,
            self.semaphore.as_deref(),
        )
        .await;
        let voted = answers
            .into_iter()
            .enumerate()
            .map(|(i, a)| self.vote(i, a))
            .collect();
        self.policy.outcome(voted)
    }

    /// One vote from the judge's answer (or the call's failure).
    fn vote(&self, index: usize, answer: Result<String, String>) -> Voted<P::Vote> {
        let (vote, reason) = match answer {
            Ok(text) => match self.policy.parse(&text) {
                Ok(vote) => {
                    return Voted {
                        vote,
                        text: Some(text),
                        failure: None,
                    };
                }
                Err(vote) => {
                    let reason = self.policy.invalid_answer(&self.backend.describe(), &text);
                    (vote, reason)
                }
            },
            Err(reason) => (self.policy.failed_vote(), reason),
        };
        tracing::warn!(vote = index, reason = %reason, "{} vote failed", P::ROLE);
        Voted {
            vote,
            text: None,
            failure: Some(reason),
        }
    }
}
