//! [`PrmScorer`]: `m` parallel judge votes on one turn and their majority.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::Semaphore;

use ps_core::ports::{JudgeBackend, JudgeInput, PrmScore, TurnScorer};

use crate::{
    VotePolicy, VoteScorer, Voted, answer_tail, judge_messages, majority_vote, parse_boxed_score,
};

/// [`TurnScorer`] of binary RL: sends `votes` judge calls at once (each holding one permit of the
/// judge-concurrency semaphore when one is given) and takes their majority. A call that fails or an
/// answer without a valid `\boxed{1|-1|0}` is a failed vote with its reason kept; scoring itself
/// never fails. Built with [`PrmScorer::new`].
pub type PrmScorer = VoteScorer<PrmVotes>;

/// The PRM's [`VotePolicy`]: [`judge_messages`], a final `\boxed{1}`, `\boxed{-1}` or
/// `\boxed{0}` per vote ([`parse_boxed_score`]), and their [`majority_vote`].
#[derive(Debug, Clone, Copy, Default)]
pub struct PrmVotes;

impl VotePolicy for PrmVotes {
    type Vote = Option<i8>;
    type Outcome = PrmScore;
    const ROLE: &'static str = "PRM judge";

    fn messages(&self, input: &JudgeInput) -> Vec<serde_json::Value> {
        judge_messages(input)
    }

    fn parse(&self, answer: &str) -> Result<Option<i8>, Option<i8>> {
        parse_boxed_score(answer).map(Some).ok_or(None)
    }

    fn invalid_answer(&self, judge: &str, answer: &str) -> String {
        format!(
            "the answer of {judge} does not end on a \\boxed{{1}}, \\boxed{{-1}} or \\boxed{{0}} (its last boxed value is missing or invalid; it ends with {:?})",
            answer_tail(answer)
        )
    }

    fn failed_vote(&self) -> Option<i8> {
        None
    }

    /// The majority; the representative text is the first vote agreeing with it, else the first
    /// valid vote.
    fn outcome(&self, outcomes: Vec<Voted<Option<i8>>>) -> PrmScore {
        let votes: Vec<Option<i8>> = outcomes.iter().map(|v| v.vote).collect();
        let score = majority_vote(&votes);
        let agreeing = outcomes
            .iter()
            .find(|v| v.vote.is_some_and(|x| f64::from(x) == score));
        let representative = agreeing
            .or_else(|| outcomes.iter().find(|v| v.vote.is_some()))
            .and_then(|v| v.text.clone());
        let failures = outcomes.into_iter().map(|v| v.failure).collect();
        PrmScore {
            votes,
            score,
            representative,
            failures,
        }
    }
}

impl PrmScorer {
    /// `votes` is `prm.num_votes` (m); `semaphore` bounds judge calls across all turns.
    pub fn new(
        backend: Arc<dyn JudgeBackend>,
        votes: usize,
        semaphore: Option<Arc<Semaphore>>,
    ) -> Self {
        Self::with_policy(PrmVotes, backend, votes, semaphore)
    }
}

#[async_trait]
impl TurnScorer for PrmScorer {
    async fn score(&self, input: &JudgeInput) -> PrmScore {
        self.run(input).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::{JudgeError, TIMEOUT_KEY};
    use ps_core::ports::{CallError, MockJudgeBackend};
    use serde_json::Value;

    fn input() -> JudgeInput {
        JudgeInput {
            response_text: "Done.<|im_end|>\n".into(),
            next_state_text: "thanks".into(),
            next_state_role: "user".into(),
        }
    }

    /// A mock answering the `i`-th call with `answers[i]`.
    fn scripted(answers: Vec<Result<&'static str, ()>>) -> MockJudgeBackend {
        let n = answers.len();
        let calls = AtomicUsize::new(0);
        let mut mock = MockJudgeBackend::new();
        mock.expect_complete()
            .times(n)
            .withf(|msgs: &[Value]| msgs.len() == 2 && msgs[1]["content"].is_string())
            .returning(move |_| {
                let i = calls.fetch_add(1, Ordering::SeqCst);
                match answers[i] {
                    Ok(t) => Ok(t.to_owned()),
                    Err(()) => Err(JudgeError::Timeout {
                        url: "http://judge/generate".into(),
                        after: std::time::Duration::from_secs(1),
                        config_key: TIMEOUT_KEY,
                    }
                    .into()),
                }
            });
        mock.expect_describe().returning(|| "mock judge".to_owned());
        mock
    }

    fn scorer(mock: MockJudgeBackend, m: usize) -> PrmScorer {
        PrmScorer::new(Arc::new(mock), m, None)
    }

    #[tokio::test]
    async fn sends_m_calls_and_takes_the_majority() {
        let mock = scripted(vec![
            Ok("good \\boxed{1}"),
            Ok("bad \\boxed{-1}"),
            Ok("fine \\boxed{1}"),
        ]);
        let s = scorer(mock, 3).score(&input()).await;
        assert_eq!(s.votes, vec![Some(1), Some(-1), Some(1)]);
        assert_eq!(s.score, 1.0);
        assert_eq!(s.representative.as_deref(), Some("good \\boxed{1}"));
        assert_eq!(s.failures, vec![None, None, None]);
        assert_eq!(s.failed_votes(), 0);
    }

    #[tokio::test]
    async fn sends_the_judge_messages() {
        let mut mock = MockJudgeBackend::new();
        let expected = judge_messages(&input());
        mock.expect_complete()
            .times(5)
            .withf(move |msgs: &[Value]| msgs == expected.as_slice())
            .returning(|_| Ok("\\boxed{0}".into()));
        let s = scorer(mock, 5).score(&input()).await;
        assert_eq!(s.votes, vec![Some(0); 5]);
        assert_eq!(s.score, 0.0);
        assert_eq!(s.representative.as_deref(), Some("\\boxed{0}"));
    }

    #[tokio::test]
    async fn failures_are_failed_votes_with_reasons() {
        let mock = scripted(vec![
            Err(()),
            Ok("I think \\boxed{-1}"),
            Ok("no verdict at all"),
        ]);
        let s = scorer(mock, 3).score(&input()).await;
        assert_eq!(s.votes, vec![None, Some(-1), None]);
        assert_eq!(s.score, -1.0);
        assert_eq!(s.failed_votes(), 2);
        assert_eq!(s.representative.as_deref(), Some("I think \\boxed{-1}"));
        let r0 = s.failures[0].as_deref().unwrap();
        assert!(
            r0.contains("http://judge/generate") && r0.contains(TIMEOUT_KEY),
            "{r0}"
        );
        assert!(s.failures[1].is_none());
        let r2 = s.failures[2].as_deref().unwrap();
        assert!(
            r2.contains("mock judge") && r2.contains("no verdict at all"),
            "{r2}"
        );
    }

    #[tokio::test]
    async fn an_invalid_digit_is_a_failed_vote() {
        let mock = scripted(vec![
            Ok("\\boxed{2}"),
            Ok("\\boxed{1}"),
            Ok("\\boxed{1} \\boxed{10}"),
        ]);
        let s = scorer(mock, 3).score(&input()).await;
        assert_eq!(s.votes, vec![None, Some(1), Some(1)]);
        assert_eq!(s.score, 1.0);
        assert_eq!(s.representative.as_deref(), Some("\\boxed{1}"));
    }

    #[tokio::test]
    async fn all_failed_gives_zero_and_no_representative() {
        let mock = scripted(vec![Err(()), Ok("nothing"), Err(())]);
        let s = scorer(mock, 3).score(&input()).await;
        assert_eq!(s.votes, vec![None, None, None]);
        assert_eq!(s.score, 0.0);
        assert_eq!(s.representative, None);
        assert!(s.failures.iter().all(Option::is_some));
    }

    #[tokio::test]
    async fn a_tie_takes_the_first_valid_vote_as_representative() {
        let mock = scripted(vec![Err(()), Ok("up \\boxed{1}"), Ok("down \\boxed{-1}")]);
        let s = scorer(mock, 3).score(&input()).await;
        assert_eq!(s.score, 0.0);
        assert_eq!(s.representative.as_deref(), Some("up \\boxed{1}"));
    }

    #[tokio::test]
    async fn a_zero_majority_takes_the_first_zero_vote() {
        let mock = scripted(vec![
            Ok("yes \\boxed{1}"),
            Ok("a \\boxed{0}"),
            Ok("b \\boxed{0}"),
        ]);
        let s = scorer(mock, 3).score(&input()).await;
        assert_eq!(s.score, 0.0);
        assert_eq!(s.representative.as_deref(), Some("a \\boxed{0}"));
    }

    #[tokio::test]
    async fn zero_votes_make_no_calls() {
        let mut mock = MockJudgeBackend::new();
        mock.expect_complete().never();
        let s = scorer(mock, 0).score(&input()).await;
        assert_eq!(s.votes, Vec::<Option<i8>>::new());
        assert_eq!(s.score, 0.0);
    }

    /// Records the highest number of calls in progress at once. Each call yields a few times so the
    /// other votes of the same `join_all` get polled while it is in progress.
    #[derive(Default)]
    struct ConcurrencyProbe {
        current: AtomicUsize,
        max: AtomicUsize,
        calls: AtomicUsize,
    }

    #[async_trait]
    impl JudgeBackend for ConcurrencyProbe {
        async fn complete(&self, _messages: &[Value]) -> Result<String, CallError> {
            let now = self.current.fetch_add(1, Ordering::SeqCst) + 1;
            self.max.fetch_max(now, Ordering::SeqCst);
            for _ in 0..8 {
                tokio::task::yield_now().await;
            }
            self.current.fetch_sub(1, Ordering::SeqCst);
            self.calls.fetch_add(1, Ordering::SeqCst);
            Ok("\\boxed{1}".into())
        }

        fn describe(&self) -> String {
            "probe".into()
        }
    }

    #[tokio::test]
    async fn without_a_semaphore_all_votes_run_at_once() {
        let probe = Arc::new(ConcurrencyProbe::default());
        let s = PrmScorer::new(probe.clone(), 5, None).score(&input()).await;
        assert_eq!(s.score, 1.0);
        assert_eq!(probe.calls.load(Ordering::SeqCst), 5);
        assert_eq!(probe.max.load(Ordering::SeqCst), 5);
    }

    #[tokio::test]
    async fn the_semaphore_limits_concurrent_calls() {
        let probe = Arc::new(ConcurrencyProbe::default());
        let sem = Arc::new(Semaphore::new(2));
        let s = PrmScorer::new(probe.clone(), 5, Some(sem.clone()))
            .score(&input())
            .await;
        assert_eq!(s.votes, vec![Some(1); 5]);
        assert_eq!(probe.calls.load(Ordering::SeqCst), 5);
        assert_eq!(probe.max.load(Ordering::SeqCst), 2);
        assert_eq!(sem.available_permits(), 2, "permits are returned");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_semaphore_bounds_calls_across_turns() {
        let probe = Arc::new(ConcurrencyProbe::default());
        let sem = Arc::new(Semaphore::new(3));
        let scorer = PrmScorer::new(probe.clone(), 3, Some(sem));
        let turns: Vec<_> = (0..4)
            .map(|_| {
                let scorer = scorer.clone();
                tokio::spawn(async move { scorer.score(&input()).await })
            })
            .collect();
        for t in turns {
            assert_eq!(t.await.unwrap().score, 1.0);
        }
        assert_eq!(probe.calls.load(Ordering::SeqCst), 12);
        assert!(probe.max.load(Ordering::SeqCst) <= 3);
    }

    #[tokio::test]
    async fn a_closed_semaphore_fails_votes_without_calls() {
        let mut mock = MockJudgeBackend::new();
        mock.expect_complete().never();
        let sem = Arc::new(Semaphore::new(1));
        sem.close();
        let s = PrmScorer::new(Arc::new(mock), 2, Some(sem))
            .score(&input())
            .await;
        assert_eq!(s.votes, vec![None, None]);
        assert!(s.failures[0].as_deref().unwrap().contains("closed"));
    }
}
