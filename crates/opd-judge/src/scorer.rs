//! [`HintScorer`]: `m` parallel hint votes on one turn and the best hint among them.

use std::{fmt, sync::Arc};

use async_trait::async_trait;
use ps_judge::{VotePolicy, VoteScorer, Voted, answer_tail};
use tokio::sync::Semaphore;

use ps_core::ports::{HintJudge, HintOutcome, HintVote, JudgeBackend, JudgeInput};

use crate::{hint_messages, parse_hint_vote, select_best_hint};

/// [`HintJudge`] of OPD: sends `votes` hint-judge calls at once (each holding one permit of the
/// judge-concurrency semaphore when one is given), parses each answer with [`parse_hint_vote`] and
/// picks the best hint with [`select_best_hint`]. A call that fails or an answer without a final
/// `\boxed{1}` or `\boxed{-1}` is a failed vote with its reason kept; judging itself never fails.
/// The PRM scorer's [`VoteScorer`] with the [`HintVotes`] policy.
#[derive(Clone)]
pub struct HintScorer(VoteScorer<HintVotes>);

impl fmt::Debug for HintScorer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("HintScorer").field(&self.0).finish()
    }
}

/// The hint judge's [`VotePolicy`]: [`hint_messages`], one [`parse_hint_vote`] per answer (valid
/// when it has a score), and [`select_best_hint`] over hints longer than `min_hint_chars`.
#[derive(Debug, Clone, Copy)]
pub struct HintVotes {
    /// `opd.min_hint_chars`: a hint must be strictly longer.
    pub min_hint_chars: usize,
}

impl VotePolicy for HintVotes {
    type Vote = HintVote;
    type Outcome = HintOutcome;
    const ROLE: &'static str = "hint judge";

    fn messages(&self, input: &JudgeInput) -> Vec<serde_json::Value> {
        hint_messages(input)
    }

    fn parse(&self, answer: &str) -> Result<HintVote, HintVote> {
        let vote = parse_hint_vote(answer);
        if vote.score.is_some() {
            Ok(vote)
        } else {
            Err(vote)
        }
    }

    fn invalid_answer(&self, judge: &str, answer: &str) -> String {
        format!(
            "the hint-judge answer of {judge} does not end on a \\boxed{{1}} or \\boxed{{-1}} (its last boxed value is missing or invalid; it ends with {:?})",
            answer_tail(answer)
        )
    }

    fn failed_vote(&self) -> HintVote {
        HintVote::failed()
    }

    /// The best hint; the representative text is the best vote's, else the first valid vote's.
    fn outcome(&self, outcomes: Vec<Voted<HintVote>>) -> HintOutcome {
        let votes: Vec<HintVote> = outcomes.iter().map(|v| v.vote.clone()).collect();
        let best = select_best_hint(&votes, self.min_hint_chars);
        let representative = best
            .as_ref()
            .and_then(|(i, _)| outcomes.get(*i))
            .or_else(|| outcomes.iter().find(|v| v.text.is_some()))
            .and_then(|v| v.text.clone());
        let failures = outcomes.into_iter().map(|v| v.failure).collect();
        HintOutcome {
            votes,
            failures,
            best,
            representative,
        }
    }
}

impl HintScorer {
    /// `votes` is `prm.num_votes` (m); `min_hint_chars` is `opd.min_hint_chars` (a hint must be
    /// strictly longer); `semaphore` bounds judge calls across all turns.
    pub fn new(
        backend: Arc<dyn JudgeBackend>,
        votes: usize,
        min_hint_chars: usize,
        semaphore: Option<Arc<Semaphore>>,
    ) -> Self {
        Self(VoteScorer::with_policy(
            HintVotes { min_hint_chars },
            backend,
            votes,
            semaphore,
        ))
    }

    /// Votes per turn (m).
    pub fn votes(&self) -> usize {
        self.0.votes()
    }

    /// The hint-length threshold (characters, strictly greater).
    pub fn min_hint_chars(&self) -> usize {
        self.0.policy().min_hint_chars
    }
}

#[async_trait]
impl HintJudge for HintScorer {
    async fn judge(&self, input: &JudgeInput) -> HintOutcome {
        self.0.run(input).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use ps_core::ports::{CallError, MockJudgeBackend};
    use ps_judge::{JudgeError, TIMEOUT_KEY};

    use super::*;
    use serde_json::Value;

    fn input() -> JudgeInput {
        JudgeInput {
            response_text: "It is in a.txt.<|im_end|>\n".into(),
            next_state_text: "No, I said b.txt.".into(),
            next_state_role: "user".into(),
        }
    }

    fn timeout() -> JudgeError {
        JudgeError::Timeout {
            url: "http://judge/generate".into(),
            after: std::time::Duration::from_secs(1),
            config_key: TIMEOUT_KEY,
        }
    }

    /// A mock answering the `i`-th call with `answers[i]` (`Err(())` is a timeout).
    fn scripted(answers: Vec<Result<&'static str, ()>>) -> MockJudgeBackend {
        let n = answers.len();
        let calls = AtomicUsize::new(0);
        let mut mock = MockJudgeBackend::new();
        let expected = hint_messages(&input());
        mock.expect_complete()
            .times(n)
            .withf(move |msgs: &[Value]| msgs == expected.as_slice())
            .returning(move |_| {
                let i = calls.fetch_add(1, Ordering::SeqCst);
                match answers[i] {
                    Ok(t) => Ok(t.to_owned()),
                    Err(()) => Err(timeout().into()),
                }
            });
        mock.expect_describe().returning(|| "mock judge".to_owned());
        mock
    }

    fn scorer(mock: MockJudgeBackend, m: usize) -> HintScorer {
        HintScorer::new(Arc::new(mock), m, 10, None)
    }

    const GOOD: &str = "[HINT_START]Use the file name the user gave.[HINT_END]\n\\boxed{1}";
    const LONGER: &str =
        "[HINT_START]Use b.txt, the file the user named, not a guessed one.[HINT_END] \\boxed{1}";

    #[tokio::test]
    async fn sends_m_hint_prompts_and_picks_the_longest_hint() {
        let mock = scripted(vec![
            Ok(GOOD),
            Ok("nothing to learn \\boxed{-1}"),
            Ok(LONGER),
        ]);
        let o = scorer(mock, 3).judge(&input()).await;
        assert_eq!(o.scores(), vec![Some(1), Some(-1), Some(1)]);
        assert_eq!(o.votes[0].hint, "Use the file name the user gave.");
        assert_eq!(o.votes[1].hint, "");
        assert_eq!(
            o.best,
            Some((
                2,
                "Use b.txt, the file the user named, not a guessed one.".to_owned()
            ))
        );
        assert!(o.accepted());
        assert_eq!(
            o.hint(),
            Some("Use b.txt, the file the user named, not a guessed one.")
        );
        assert_eq!(o.representative.as_deref(), Some(LONGER));
        assert_eq!(o.failures, vec![None, None, None]);
        assert_eq!(o.failed_votes(), 0);
    }

    #[tokio::test]
    async fn failures_are_failed_votes_with_reasons() {
        let mock = scripted(vec![
            Err(()),
            Ok("[HINT_START]A hint with a zero verdict.[HINT_END] \\boxed{0}"),
            Ok(GOOD),
        ]);
        let o = scorer(mock, 3).judge(&input()).await;
        assert_eq!(o.scores(), vec![None, None, Some(1)]);
        assert_eq!(o.failed_votes(), 2);
        assert_eq!(o.votes[0], HintVote::failed());
        // The parsed hint of a failed vote is kept, but it cannot be chosen.
        assert_eq!(o.votes[1].hint, "A hint with a zero verdict.");
        assert_eq!(
            o.best,
            Some((2, "Use the file name the user gave.".to_owned()))
        );
        let r0 = o.failures[0].as_deref().unwrap();
        assert!(
            r0.contains("http://judge/generate") && r0.contains(TIMEOUT_KEY),
            "{r0}"
        );
        let r1 = o.failures[1].as_deref().unwrap();
        assert!(r1.contains("mock judge") && r1.contains("boxed{0}"), "{r1}");
        assert!(o.failures[2].is_none());
    }

    #[tokio::test]
    async fn no_acceptable_hint_rejects_the_turn() {
        let mock = scripted(vec![
            Ok("\\boxed{-1}"),
            Ok("[HINT_START]too short[HINT_END] \\boxed{1}"),
            Ok("\\boxed{1} but no hint block"),
        ]);
        let o = scorer(mock, 3).judge(&input()).await;
        assert_eq!(o.scores(), vec![Some(-1), Some(1), Some(1)]);
        assert_eq!(o.best, None);
        assert!(!o.accepted());
        assert_eq!(o.hint(), None);
        // No best vote: the first valid answer represents the turn.
        assert_eq!(o.representative.as_deref(), Some("\\boxed{-1}"));
    }

    #[tokio::test]
    async fn the_threshold_comes_from_construction() {
        // "too short" has 9 characters; a hint must be strictly longer than the threshold. The
        // default of these tests (10) would reject it, so both sides depend on the value given.
        let answer = "[HINT_START]too short[HINT_END] \\boxed{1}";
        let o = HintScorer::new(Arc::new(scripted(vec![Ok(answer)])), 1, 8, None)
            .judge(&input())
            .await;
        assert_eq!(o.best, Some((0, "too short".to_owned())), "8 < 9 chars");
        let o = HintScorer::new(Arc::new(scripted(vec![Ok(answer)])), 1, 9, None)
            .judge(&input())
            .await;
        assert_eq!(o.best, None, "9 is not < 9 chars");
        assert_eq!(o.votes[0].hint, "too short", "parsed, but not accepted");
    }

    #[tokio::test]
    async fn all_failed_gives_no_hint_and_no_representative() {
        let mock = scripted(vec![Err(()), Ok("no verdict"), Err(())]);
        let o = scorer(mock, 3).judge(&input()).await;
        assert_eq!(o.scores(), vec![None, None, None]);
        assert_eq!(o.best, None);
        assert_eq!(o.representative, None);
        assert!(o.failures.iter().all(Option::is_some));
    }

    #[tokio::test]
    async fn zero_votes_make_no_calls() {
        let mut mock = MockJudgeBackend::new();
        mock.expect_complete().never();
        let o = scorer(mock, 0).judge(&input()).await;
        assert!(o.votes.is_empty() && o.failures.is_empty());
        assert_eq!(o.best, None);
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
            Ok(GOOD.into())
        }

        fn describe(&self) -> String {
            "probe".into()
        }
    }

    #[tokio::test]
    async fn without_a_semaphore_all_votes_run_at_once() {
        let probe = Arc::new(ConcurrencyProbe::default());
        let o = HintScorer::new(probe.clone(), 5, 10, None)
            .judge(&input())
            .await;
        assert_eq!(o.best.map(|(i, _)| i), Some(0));
        assert_eq!(probe.calls.load(Ordering::SeqCst), 5);
        assert_eq!(probe.max.load(Ordering::SeqCst), 5);
    }

    #[tokio::test]
    async fn the_semaphore_limits_concurrent_calls() {
        let probe = Arc::new(ConcurrencyProbe::default());
        let sem = Arc::new(Semaphore::new(2));
        let o = HintScorer::new(probe.clone(), 5, 10, Some(sem.clone()))
            .judge(&input())
            .await;
        assert_eq!(o.scores(), vec![Some(1); 5]);
        assert_eq!(probe.calls.load(Ordering::SeqCst), 5);
        assert_eq!(probe.max.load(Ordering::SeqCst), 2);
        assert_eq!(sem.available_permits(), 2, "permits are returned");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_semaphore_bounds_calls_across_turns() {
        let probe = Arc::new(ConcurrencyProbe::default());
        let sem = Arc::new(Semaphore::new(3));
        let scorer = HintScorer::new(probe.clone(), 3, 10, Some(sem));
        let turns: Vec<_> = (0..4)
            .map(|_| {
                let scorer = scorer.clone();
                tokio::spawn(async move { scorer.judge(&input()).await })
            })
            .collect();
        for t in turns {
            assert!(t.await.unwrap().accepted());
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
        let o = HintScorer::new(Arc::new(mock), 2, 10, Some(sem))
            .judge(&input())
            .await;
        assert_eq!(o.scores(), vec![None, None]);
        assert_eq!(o.best, None);
        assert!(o.failures[0].as_deref().unwrap().contains("closed"));
    }
}
