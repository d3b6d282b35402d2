//! The session state machine with small fakes for the scorer and the sink.
//!
//! Long because each transition of the state machine has its own case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use ps_core::ports::{JudgeInput, PrmScore, TurnScorer};
use ps_core::sample::Sample;
use ps_core::{
    AlignPolicy, Alignment, CapturedTurn, FinishReason, SampleSink, SinkError, TurnSink,
    align_logprobs,
};
use ps_session_buffer::{BufferConfig, BufferMode, OpdOptions, SessionBuffer};
use serde_json::{Value, json};
use tokio::sync::Notify;

/// Scores by the next state's text: `score:<n>` in it gives n; `hold` waits for `release`.
#[derive(Default)]
struct FakeScorer {
    inputs: Mutex<Vec<JudgeInput>>,
    release: Notify,
}

#[async_trait::async_trait]
impl TurnScorer for FakeScorer {
    async fn score(&self, input: &JudgeInput) -> PrmScore {
        self.inputs.lock().unwrap().push(input.clone());
        if input.next_state_text.contains("hold") {
            self.release.notified().await;
        }
        let score = input
            .next_state_text
            .split("score:")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse::<i8>().ok());
        PrmScore {
            votes: vec![score; 3],
            score: f64::from(score.unwrap_or(0)),
            representative: Some("judge text".into()),
            failures: vec![None; 3],
        }
    }
}

#[derive(Default)]
struct CollectSink {
    samples: Mutex<Vec<Sample>>,
    seq: AtomicU64,
    fail_first: AtomicUsize,
}

#[async_trait::async_trait]
impl SampleSink for CollectSink {
    async fn submit(&self, sample: &Sample) -> Result<u64, SinkError> {
        if self.fail_first.load(Ordering::SeqCst) > 0 {
            self.fail_first.fetch_sub(1, Ordering::SeqCst);
            return Err(SinkError::Store("disk full".into()));
        }
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        let mut sample = sample.clone();
        sample.index = seq;
        sample.group_index = seq;
        self.samples.lock().unwrap().push(sample);
        Ok(seq)
    }
}

impl CollectSink {
    fn taken(&self) -> Vec<Sample> {
        self.samples.lock().unwrap().clone()
    }
}

struct Rig {
    buffer: SessionBuffer,
    scorer: Arc<FakeScorer>,
    sink: Arc<CollectSink>,
}

fn rig_with(prm_enabled: bool, max_sessions: usize) -> Rig {
    rig_config(|c| {
        c.prm_enabled = prm_enabled;
        c.max_sessions = max_sessions;
    })
}

fn rig_config(change: impl FnOnce(&mut BufferConfig)) -> Rig {
    let scorer = Arc::new(FakeScorer::default());
    let sink = Arc::new(CollectSink::default());
    let mut config = BufferConfig {
        mode: BufferMode::Rl,
        opd: OpdOptions::default(),
        prm_enabled: true,
        session_timeout: Duration::from_secs(60),
        max_sessions: 100,
        max_judge_backlog: usize::MAX,
    };
    change(&mut config);
    let buffer = SessionBuffer::new(config, Some(scorer.clone()), sink.clone(), None);
    Rig {
        buffer,
        scorer,
        sink,
    }
}

fn rig() -> Rig {
    rig_with(true, 100)
}

impl Rig {
    /// Releases the fake judge's held votes until the sink has `samples` samples (at most ~10 s;
    /// the caller asserts what it got).
    async fn release_judge_until(&self, samples: usize) {
        for _ in 0..2000 {
            self.scorer.release.notify_waiters();
            if self.sink.taken().len() == samples {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

/// A captured turn with a 4-token response whose last position is template scaffolding.
fn captured(session: &str, turn: u64) -> CapturedTurn {
    let response_ids = vec![10, 11, 12, 13];
    let alignment: Alignment = align_logprobs(
        &response_ids,
        |id| format!("t{id}"),
        &[10, 11, 12]
            .iter()
            .map(|&id| ps_core::SampledToken {
                token: format!("t{id}"),
                id: Some(id),
                logprob: -0.5,
            })
            .collect::<Vec<_>>(),
        &FinishReason {
            reason: Some("stop".into()),
            matched_stop: Value::Null,
        },
        Some(12),
        AlignPolicy::default(),
    );
    CapturedTurn {
        images: Vec::new(),
        sampling: Default::default(),
        routed_experts: None,
        routed_experts_missing: None,
        session_id: session.into(),
        turn,
        arrival_seq: turn,
        messages: vec![user("q")].into(),
        tools: None,
        template_kwargs: None,
        response_message: json!({"role": "assistant", "content": format!("answer {turn}")}),
        prompt_text: "P".into(),
        response_text: format!("R{turn}"),
        prompt_is_prefix: true,
        prompt_ids: vec![1, 2],
        response_ids,
        alignment,
        finish_reason: Some("stop".into()),
        streamed: false,
        token_source: ps_core::TokenSource::Retokenized,
        weight_version: None,
        origin: Default::default(),
        engine_prompts_agreed: false,
    }
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn the_next_main_request_gives_the_previous_turn_its_next_state() {
    let r = rig();
    let t1 = r.buffer.begin("s", Some(&user("first")), false);
    assert_eq!(t1, 1);
    r.buffer.accept(captured("s", t1));
    assert_eq!(r.buffer.status().pending.waiting_next_state, 1);
    let t2 = r.buffer.begin("s", Some(&user("thanks score:1")), false);
    assert_eq!(t2, 2);
    wait_for("one sample", || r.sink.taken().len() == 1).await;
    let s = &r.sink.taken()[0];
    assert_eq!((s.session_id.as_str(), s.turn), ("s", 1));
    assert_eq!(s.reward.score, 1.0);
    assert_eq!(
        s.loss_mask,
        vec![1, 1, 1, 0],
        "the alignment mask, scaffolding excluded"
    );
    assert_eq!(s.tokens, vec![1, 2, 10, 11, 12, 13]);
    assert_eq!(s.response_length, 4);
    assert_eq!(s.metadata["votes"], json!([1, 1, 1]));
    let input = &r.scorer.inputs.lock().unwrap()[0];
    assert_eq!(input.response_text, "R1");
    assert_eq!(input.next_state_text, "thanks score:1");
    assert_eq!(input.next_state_role, "user");
    assert_eq!(r.buffer.drain_eval_scores(), vec![1.0]);
    assert!(r.buffer.drain_eval_scores().is_empty());
}

#[tokio::test]
async fn a_tool_message_is_a_next_state_with_its_role_and_flattened_content() {
    let r = rig();
    r.buffer
        .accept(captured("s", r.buffer.begin("s", Some(&user("q")), false)));
    let tool = json!({"role": "tool", "content": [{"type": "text", "text": "sunny"}, {"type": "text", "text": "score:-1"}]});
    r.buffer.begin("s", Some(&tool), false);
    wait_for("a sample", || r.sink.taken().len() == 1).await;
    let input = &r.scorer.inputs.lock().unwrap()[0];
    assert_eq!(input.next_state_role, "tool");
    assert_eq!(input.next_state_text, "sunny score:-1");
    assert_eq!(r.sink.taken()[0].reward.score, -1.0);
}

#[tokio::test]
async fn session_done_flushes_the_last_turn_without_a_next_state() {
    let r = rig();
    r.buffer
        .accept(captured("s", r.buffer.begin("s", Some(&user("a")), false)));
    let t2 = r.buffer.begin("s", Some(&user("b score:1")), true);
    r.buffer.accept(captured("s", t2));
    wait_for("two samples", || r.sink.taken().len() == 2).await;
    let samples = r.sink.taken();
    assert_eq!(samples[1].turn, 2);
    assert_eq!(samples[1].reward.score, 0.0);
    assert_eq!(samples[1].loss_mask, vec![0, 0, 0, 0]);
    assert_eq!(samples[1].metadata["excluded"], "no_next_state");
    assert_eq!(
        r.scorer.inputs.lock().unwrap().len(),
        1,
        "a turn without next state is not judged"
    );
    wait_for("session removed", || r.buffer.status().live_sessions == 0).await;
}

/// A request that adds nothing but messages sent once (`next_state` is `None`): the previous turn
/// gets no next state, is not judged, and its sample says why; the request's own turn goes on.
#[tokio::test]
async fn a_request_adding_nothing_gives_the_previous_turn_no_next_state() {
    let r = rig();
    r.buffer
        .accept(captured("s", r.buffer.begin("s", Some(&user("a")), false)));
    let t2 = r.buffer.begin("s", None, false);
    assert_eq!(t2, 2);
    wait_for("a sample", || r.sink.taken().len() == 1).await;
    let s = &r.sink.taken()[0];
    assert_eq!((s.turn, s.reward.score), (1, 0.0));
    assert_eq!(s.metadata["excluded"], "no_next_state");
    assert!(r.scorer.inputs.lock().unwrap().is_empty(), "not judged");
    r.buffer.accept(captured("s", t2));
    assert_eq!(r.buffer.status().pending.waiting_next_state, 1);
}

#[tokio::test]
async fn end_session_from_a_side_request_flushes_too() {
    let r = rig();
    r.buffer
        .accept(captured("s", r.buffer.begin("s", Some(&user("a")), false)));
    r.buffer.end_session("s");
    wait_for("a sample", || r.sink.taken().len() == 1).await;
    assert_eq!(r.sink.taken()[0].metadata["excluded"], "no_next_state");
}

#[tokio::test]
async fn at_least_one_guarantee_then_zero_scores_are_excluded() {
    let r = rig();
    for (i, next) in ["a", "score:0", "score:0", "score:1 end"]
        .iter()
        .enumerate()
    {
        let t = r.buffer.begin("s", Some(&user(next)), i == 3);
        r.buffer.accept(captured("s", t));
    }
    wait_for("four samples", || r.sink.taken().len() == 4).await;
    let s = r.sink.taken();
    // Turn 1 (score 0) is the session's first scored turn: kept by the guarantee.
    assert_eq!(s[0].loss_mask, vec![1, 1, 1, 0]);
    assert_eq!(s[0].metadata["at_least_one"], true);
    // Turn 2 (score 0) is excluded now.
    assert_eq!(s[1].loss_mask, vec![0, 0, 0, 0]);
    assert_eq!(s[1].metadata["excluded"], "score_zero");
    // Turn 3 (score 1) is effective; turn 4 had no next state.
    assert_eq!(s[2].reward.score, 1.0);
    assert_eq!(s[3].metadata["excluded"], "no_next_state");
    let st = r.buffer.status();
    assert_eq!((st.samples_effective, st.samples_excluded), (2, 2));
}

#[tokio::test]
async fn samples_of_a_session_are_submitted_in_turn_order_even_when_scoring_finishes_out_of_order()
{
    let r = rig();
    let t1 = r.buffer.begin("s", Some(&user("a")), false);
    let t2 = r.buffer.begin("s", Some(&user("hold score:1")), false); // turn 1's judge is held
    let _t3 = r.buffer.begin("s", Some(&user("score:-1")), false);
    r.buffer.accept(captured("s", t2));
    r.buffer.accept(captured("s", t1));
    wait_for("turn 2 judged", || {
        r.buffer.status().pending.waiting_order == 1
    })
    .await;
    assert!(r.sink.taken().is_empty(), "turn 2 waits for turn 1");
    r.scorer.release.notify_waiters();
    wait_for("two samples", || r.sink.taken().len() == 2).await;
    let turns: Vec<u64> = r.sink.taken().iter().map(|s| s.turn).collect();
    assert_eq!(turns, vec![1, 2]);
    let idx: Vec<u64> = r.sink.taken().iter().map(|s| s.index).collect();
    assert!(idx[0] < idx[1]);
}

#[tokio::test]
async fn with_the_prm_off_turns_are_submitted_at_once_and_excluded() {
    let r = rig_with(false, 100);
    let t1 = r.buffer.begin("s", Some(&user("a")), false);
    r.buffer.accept(captured("s", t1));
    wait_for("a sample", || r.sink.taken().len() == 1).await;
    let s = &r.sink.taken()[0];
    assert_eq!(s.metadata["excluded"], "prm_disabled");
    assert_eq!(s.loss_mask, vec![0, 0, 0, 0]);
    assert!(r.scorer.inputs.lock().unwrap().is_empty());
    assert!(r.buffer.drain_eval_scores().is_empty());
}

#[tokio::test(start_paused = true)]
async fn idle_sessions_time_out_and_their_turns_are_flushed() {
    let r = rig();
    r.buffer
        .accept(captured("s", r.buffer.begin("s", Some(&user("a")), false)));
    tokio::time::advance(Duration::from_secs(30)).await;
    r.buffer.sweep();
    assert!(r.sink.taken().is_empty(), "not idle long enough");
    tokio::time::advance(Duration::from_secs(31)).await;
    r.buffer.sweep();
    wait_for("flushed sample", || r.sink.taken().len() == 1).await;
    assert_eq!(r.sink.taken()[0].metadata["excluded"], "no_next_state");
    assert_eq!(r.buffer.status().sessions_timed_out, 1);
    r.buffer.sweep();
    assert_eq!(r.buffer.status().live_sessions, 0, "memory is released");
}

#[tokio::test(start_paused = true)]
async fn the_sweeper_task_closes_idle_sessions_by_itself() {
    let r = rig();
    r.buffer.spawn_sweeper(Duration::from_secs(5));
    r.buffer
        .accept(captured("s", r.buffer.begin("s", Some(&user("a")), false)));
    tokio::time::sleep(Duration::from_secs(70)).await;
    wait_for("flushed sample", || r.sink.taken().len() == 1).await;
}

#[tokio::test]
async fn the_session_cap_evicts_the_oldest_idle_session() {
    let r = rig_with(true, 2);
    r.buffer
        .accept(captured("a", r.buffer.begin("a", Some(&user("x")), false)));
    r.buffer
        .accept(captured("b", r.buffer.begin("b", Some(&user("x")), false)));
    r.buffer.begin("c", Some(&user("x")), false);
    wait_for("a's turn flushed", || r.sink.taken().len() == 1).await;
    assert_eq!(r.sink.taken()[0].session_id, "a");
    let st = r.buffer.status();
    assert_eq!(st.sessions_evicted, 1);
    assert_eq!(st.live_sessions, 2);
}

#[tokio::test]
async fn abandoned_turns_do_not_block_later_ones() {
    let r = rig();
    let t1 = r.buffer.begin("s", Some(&user("a")), false);
    let t2 = r.buffer.begin("s", Some(&user("b score:1")), false);
    r.buffer.abandon("s", t2, "upstream_failed");
    let t3 = r.buffer.begin("s", Some(&user("c score:-1")), false);
    r.buffer.accept(captured("s", t3));
    r.buffer.accept(captured("s", t1));
    r.buffer.begin("s", Some(&user("d score:1")), true);
    wait_for("turns 1 and 3", || r.sink.taken().len() == 2).await;
    let turns: Vec<u64> = r.sink.taken().iter().map(|s| s.turn).collect();
    assert_eq!(turns, vec![1, 3]);
    assert_eq!(
        r.sink.taken()[0].reward.score,
        1.0,
        "turn 1's next state came with turn 2's request"
    );
    assert_eq!(r.buffer.status().turns_abandoned, 1);
}

#[tokio::test]
async fn concurrent_requests_of_one_session_get_distinct_turns() {
    let r = rig();
    let mut handles = Vec::new();
    for i in 0..50 {
        let b = r.buffer.clone();
        handles.push(tokio::spawn(async move {
            b.begin("s", Some(&user(&format!("m{i}"))), false)
        }));
    }
    let mut turns = Vec::new();
    for h in handles {
        turns.push(h.await.unwrap());
    }
    turns.sort_unstable();
    assert_eq!(turns, (1..=50).collect::<Vec<_>>());
    for t in 1..=50 {
        r.buffer.accept(captured("s", t));
    }
    r.buffer.end_session("s");
    wait_for("fifty samples in order", || r.sink.taken().len() == 50).await;
    let got: Vec<u64> = r.sink.taken().iter().map(|s| s.turn).collect();
    assert_eq!(got, (1..=50).collect::<Vec<_>>());
}

#[tokio::test(start_paused = true)]
async fn a_failing_sink_is_retried_and_nothing_is_lost() {
    let r = rig();
    r.sink.fail_first.store(2, Ordering::SeqCst);
    r.buffer
        .accept(captured("s", r.buffer.begin("s", Some(&user("a")), true)));
    wait_for("the sample after retries", || r.sink.taken().len() == 1).await;
    assert_eq!(r.buffer.status().samples_dropped, 0);
}

#[tokio::test]
async fn shutdown_flushes_every_waiting_turn() {
    let r = rig();
    let mut per_session = HashMap::new();
    for s in ["a", "b", "c"] {
        let t = r.buffer.begin(s, Some(&user("x")), false);
        r.buffer.accept(captured(s, t));
        per_session.insert(s, t);
    }
    assert!(r.buffer.shutdown(Duration::from_secs(10)).await);
    assert_eq!(r.sink.taken().len(), 3);
    assert!(
        r.sink
            .taken()
            .iter()
            .all(|s| s.metadata["excluded"] == "no_next_state")
    );
}

#[derive(Default)]
struct MemPending(Mutex<Vec<ps_core::PendingTurn>>);

#[async_trait::async_trait]
impl ps_core::PendingStore for MemPending {
    async fn save_pending(&self, turns: Vec<ps_core::PendingTurn>) -> Result<usize, SinkError> {
        let n = turns.len();
        self.0.lock().unwrap().extend(turns);
        Ok(n)
    }

    async fn take_pending(&self) -> Result<Vec<ps_core::PendingTurn>, SinkError> {
        Ok(std::mem::take(&mut *self.0.lock().unwrap()))
    }
}

#[tokio::test]
async fn turns_unfinished_at_the_shutdown_deadline_are_persisted_and_resumed_in_order() {
    let r = rig();
    let pending = Arc::new(MemPending::default());
    let buffer = r.buffer.clone().with_pending_store(pending.clone());
    let t1 = buffer.begin("s", Some(&user("a")), false);
    buffer.accept(captured("s", t1));
    let t2 = buffer.begin("s", Some(&user("hold score:1")), false); // turn 1's judge hangs
    buffer.accept(captured("s", t2));
    let t3 = buffer.begin("s", Some(&user("score:-1")), true); // turn 2 judged, turn 3 has no next state
    buffer.accept(captured("s", t3));
    wait_for("turns 2 and 3 waiting behind turn 1", || {
        buffer.status().pending.waiting_order == 2
    })
    .await;

    assert!(
        !buffer.shutdown(Duration::from_millis(200)).await,
        "turn 1 did not finish in time"
    );
    let saved = pending.0.lock().unwrap().clone();
    let turns: Vec<u64> = saved.iter().map(|p| p.turn.turn).collect();
    assert_eq!(turns, vec![1, 2, 3]);
    assert_eq!(saved[0].next, Some(user("hold score:1")));
    assert_eq!(saved[2].next, None);
    // A judge result arriving after the deadline is discarded: no duplicate later.
    r.scorer.release.notify_waiters();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(r.sink.taken().is_empty());

    // The next start resumes them.
    let r2 = rig();
    let resumed = r2.buffer.clone().with_pending_store(pending.clone());
    resumed.resume(
        ps_core::PendingStore::take_pending(pending.as_ref())
            .await
            .unwrap(),
    );
    r2.release_judge_until(3).await;
    let got: Vec<(u64, f64)> = r2
        .sink
        .taken()
        .iter()
        .map(|s| (s.turn, s.reward.score))
        .collect();
    assert_eq!(got, vec![(1, 1.0), (2, -1.0), (3, 0.0)]);
    assert!(pending.0.lock().unwrap().is_empty());
    // Resumed sessions are closed ones: once their turns are submitted, nothing is held.
    wait_for("state released", || {
        resumed.status() == Default::default() || {
            let st = resumed.status();
            st.live_sessions == 0 && st.pending == Default::default()
        }
    })
    .await;
}

/// Turns persisted at shutdown carry the policy tokenizer's fingerprint: a restart with the same
/// one resumes them; a restart with another abandons them with a reason (counted, visible in the
/// status), and none becomes a sample made of the old tokenizer's ids.
#[tokio::test]
async fn turns_persisted_with_another_tokenizer_are_abandoned_not_resumed() {
    let persist_two = |fingerprint: u64| async move {
        let r = rig();
        let pending = Arc::new(MemPending::default());
        let buffer = r
            .buffer
            .clone()
            .with_pending_store(pending.clone())
            .with_tokenizer_fingerprint(fingerprint);
        let t1 = buffer.begin("s", Some(&user("a")), false);
        buffer.accept(captured("s", t1));
        let t2 = buffer.begin("s", Some(&user("hold score:1")), true); // turn 1's judge hangs
        buffer.accept(captured("s", t2));
        wait_for("turn 2 waiting behind turn 1", || {
            buffer.status().pending.waiting_order >= 1
        })
        .await;
        assert!(!buffer.shutdown(Duration::from_millis(200)).await);
        let saved = std::mem::take(&mut *pending.0.lock().unwrap());
        assert_eq!(saved.len(), 2);
        assert!(saved.iter().all(|t| t.tokenizer == Some(fingerprint)));
        saved
    };

    // The same tokenizer: resumed.
    let r = rig();
    let same = r.buffer.clone().with_tokenizer_fingerprint(7);
    same.resume(persist_two(7).await);
    r.release_judge_until(2).await;
    assert_eq!(r.sink.taken().len(), 2);
    assert!(same.status().turns_abandoned_by_reason.is_empty());

    // Turns of an older version carry no fingerprint: resumed as before.
    let r = rig();
    let older = r.buffer.clone().with_tokenizer_fingerprint(8);
    let mut unmarked = persist_two(7).await;
    for t in &mut unmarked {
        t.tokenizer = None;
    }
    older.resume(unmarked);
    r.release_judge_until(2).await;
    assert_eq!(r.sink.taken().len(), 2);

    // Another tokenizer: abandoned, counted by reason, nothing restored, no sample.
    let r = rig();
    let other = r.buffer.clone().with_tokenizer_fingerprint(8);
    other.resume(persist_two(7).await);
    let st = other.status();
    assert_eq!(st.turns_abandoned, 2);
    assert_eq!(
        st.turns_abandoned_by_reason.get("tokenizer_changed"),
        Some(&2)
    );
    assert_eq!(
        st.pending,
        Default::default(),
        "no turn restored for judging"
    );
    for _ in 0..100 {
        r.scorer.release.notify_waiters();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(r.sink.taken().is_empty());
}

#[tokio::test]
async fn a_resumed_session_remembers_it_already_had_an_effective_sample() {
    let r = rig();
    let pending = Arc::new(MemPending::default());
    let buffer = r.buffer.clone().with_pending_store(pending.clone());
    let t1 = buffer.begin("s", Some(&user("a")), false);
    buffer.accept(captured("s", t1));
    let t2 = buffer.begin("s", Some(&user("score:1")), false); // turn 1: effective
    buffer.accept(captured("s", t2));
    wait_for("turn 1 submitted", || r.sink.taken().len() == 1).await;
    let t3 = buffer.begin("s", Some(&user("hold score:0")), true); // turn 2's judge hangs
    buffer.accept(captured("s", t3));
    wait_for("turn 2 scoring", || buffer.status().pending.scoring == 1).await;
    assert!(!buffer.shutdown(Duration::from_millis(200)).await);
    let saved = pending.0.lock().unwrap().clone();
    assert_eq!(
        saved.iter().map(|p| p.turn.turn).collect::<Vec<_>>(),
        vec![2, 3]
    );
    assert!(saved.iter().all(|p| p.session_had_effective));

    // After the restart, turn 2's zero score is excluded as it would have been without the stop:
    // the at-least-one guarantee was already met by turn 1.
    let r2 = rig();
    r2.buffer.resume(
        ps_core::PendingStore::take_pending(pending.as_ref())
            .await
            .unwrap(),
    );
    r2.release_judge_until(2).await;
    let s = r2.sink.taken();
    assert_eq!(s.len(), 2);
    assert_eq!((s[0].turn, s[0].reward.score), (2, 0.0));
    assert_eq!(s[0].metadata["at_least_one"], false);
    assert_eq!(s[0].metadata["excluded"], "score_zero");
    assert!(s[0].loss_mask.iter().all(|b| *b == 0));
}

#[tokio::test]
async fn a_turn_beyond_the_judge_backlog_is_dropped_and_counted_and_later_turns_go_on() {
    let r = rig_config(|c| c.max_judge_backlog = 1);
    // Session a's turn 1 takes the only backlog slot and its judge hangs.
    let t = r.buffer.begin("a", Some(&user("x")), false);
    r.buffer.accept(captured("a", t));
    let t = r.buffer.begin("a", Some(&user("hold score:1")), false);
    r.buffer.accept(captured("a", t));
    wait_for("a's turn 1 judging", || {
        r.buffer.status().pending.scoring == 1
    })
    .await;
    // Session b's turn 1 needs the judge too: dropped. Its turn 2 (no next state) needs none.
    let t = r.buffer.begin("b", Some(&user("y")), false);
    r.buffer.accept(captured("b", t));
    let t = r.buffer.begin("b", Some(&user("score:1")), true);
    r.buffer.accept(captured("b", t));
    wait_for("b's turn 2 submitted", || r.sink.taken().len() == 1).await;
    let s = r.sink.taken();
    assert_eq!((s[0].session_id.as_str(), s[0].turn), ("b", 2));
    assert_eq!(s[0].metadata["excluded"], "no_next_state");
    assert_eq!(r.buffer.status().turns_dropped, 1);
    // The slot frees: a's turn 1 is judged and submitted.
    r.scorer.release.notify_waiters();
    wait_for("a's turn 1 submitted", || r.sink.taken().len() == 2).await;
    assert_eq!(r.sink.taken()[1].reward.score, 1.0);
}

/// `pause_mode = "serve"`: a main request served while paused is not captured, but it is still the
/// message that directly follows the previous turn, so it is that turn's next state; the first
/// request after the resume must not become it.
#[tokio::test]
async fn a_request_served_while_paused_is_the_previous_turns_next_state() {
    let r = rig();
    let t1 = r.buffer.begin("s", Some(&user("q")), false);
    r.buffer.accept(captured("s", t1));
    r.buffer
        .advance("s", Some(&user("during the pause score:1")), false);
    r.buffer
        .advance("s", Some(&user("later in the pause score:-1")), false);
    wait_for("turn 1's sample", || r.sink.taken().len() == 1).await;
    let t2 = r
        .buffer
        .begin("s", Some(&user("after the resume score:-1")), false);
    assert_eq!(t2, 2, "paused requests take no turn number");
    r.buffer.accept(captured("s", t2));
    let s = &r.sink.taken()[0];
    assert_eq!((s.turn, s.reward.score), (1, 1.0));
    let inputs = r.scorer.inputs.lock().unwrap().clone();
    assert_eq!(inputs.len(), 1, "turn 2 waits for its own next state");
    assert_eq!(inputs[0].next_state_text, "during the pause score:1");
    // A paused request that ends the session is turn 2's next state, and closes the session.
    r.buffer.advance("s", Some(&user("bye score:-1")), true);
    wait_for("turn 2's sample", || r.sink.taken().len() == 2).await;
    assert_eq!(r.sink.taken()[1].reward.score, -1.0);
    assert_eq!(
        r.scorer.inputs.lock().unwrap()[1].next_state_text,
        "bye score:-1"
    );
    assert_eq!(r.buffer.status().live_sessions, 0);
    // A paused request of a session nobody knows creates nothing.
    r.buffer.advance("other", Some(&user("x")), false);
    wait_for("session s removed", || r.buffer.status().live_sessions == 0).await;
}

/// The reference clears a session's at-least-one state at done: a new conversation under the same
/// id (the shared `unknown` session included) gets its own guarantee, while the earlier
/// conversation's turns keep theirs.
#[tokio::test]
async fn a_session_id_reused_after_done_starts_a_fresh_at_least_one_state() {
    let r = rig();
    let t1 = r.buffer.begin("s", Some(&user("q")), false);
    r.buffer.accept(captured("s", t1));
    let t2 = r.buffer.begin("s", Some(&user("score:1")), true);
    // The id comes back before the first conversation is drained (its turn 2 is not captured yet).
    let t3 = r
        .buffer
        .begin("s", Some(&user("a new conversation")), false);
    r.buffer.accept(captured("s", t2));
    r.buffer.accept(captured("s", t3));
    let t4 = r.buffer.begin("s", Some(&user("score:0")), false);
    let t5 = r.buffer.begin("s", Some(&user("score:0 again")), true);
    r.buffer.accept(captured("s", t4));
    r.buffer.abandon("s", t5, "test");
    wait_for("four samples", || r.sink.taken().len() == 4).await;
    let s = r.sink.taken();
    assert_eq!(s[0].reward.score, 1.0, "conversation 1: effective");
    assert_eq!(s[1].metadata["excluded"], "no_next_state");
    assert_eq!(s[2].turn, 3);
    assert_eq!(
        s[2].metadata["at_least_one"], true,
        "the new conversation's first scored turn is kept: {:?}",
        s[2].metadata
    );
    assert_eq!(s[2].loss_mask, vec![1, 1, 1, 0]);
    assert_eq!(s[3].metadata["excluded"], "score_zero");
}

/// `rollout/prm_eval_score` is the mean over every submitted RL sample (0 for a turn without a
/// next state, 0 for an excluded zero), in submission order, as the reference records it.
#[tokio::test]
async fn the_eval_score_covers_every_submitted_rl_sample() {
    let r = rig();
    let t1 = r.buffer.begin("s", Some(&user("q")), false);
    r.buffer.accept(captured("s", t1));
    let t2 = r.buffer.begin("s", Some(&user("score:1")), false);
    r.buffer.accept(captured("s", t2));
    let t3 = r.buffer.begin("s", Some(&user("score:0")), true);
    r.buffer.accept(captured("s", t3));
    wait_for("three samples", || r.sink.taken().len() == 3).await;
    // turn 1 scored 1; turn 2 scored 0 (excluded, the session has an effective sample); turn 3
    // has no next state.
    let scores = r.buffer.drain_eval_scores();
    assert_eq!(scores, vec![1.0, 0.0, 0.0]);
    let mean = scores.iter().sum::<f64>() / scores.len() as f64;
    assert!((mean - 1.0 / 3.0).abs() < 1e-12);
}

/// A restart between two conversations under one id keeps each conversation's own at-least-one
/// state: the first conversation's effective sample does not exclude the second's first scored
/// turn, and the restart does not merge them.
#[tokio::test]
async fn a_restart_keeps_each_conversations_own_at_least_one_state() {
    let r = rig();
    let pending = Arc::new(MemPending::default());
    let buffer = r.buffer.clone().with_pending_store(pending.clone());
    let t1 = buffer.begin("s", Some(&user("a")), false);
    buffer.accept(captured("s", t1));
    let t2 = buffer.begin("s", Some(&user("score:1 hold")), true); // conversation 1 ends; turn 1 hangs
    buffer.accept(captured("s", t2));
    let t3 = buffer.begin("s", Some(&user("conversation 2")), false);
    buffer.accept(captured("s", t3));
    let t4 = buffer.begin("s", Some(&user("score:0")), true);
    buffer.accept(captured("s", t4));
    wait_for("turn 1 scoring, 2-4 waiting for it", || {
        let p = buffer.status().pending;
        p.scoring == 1 && p.waiting_order == 3
    })
    .await;
    assert!(!buffer.shutdown(Duration::from_millis(200)).await);
    let saved = pending.0.lock().unwrap().clone();
    let starts: Vec<(u64, bool)> = saved
        .iter()
        .map(|p| (p.turn.turn, p.conversation_start))
        .collect();
    assert!(starts.contains(&(3, true)), "{starts:?}");

    let r2 = rig();
    r2.buffer.resume(
        ps_core::PendingStore::take_pending(pending.as_ref())
            .await
            .unwrap(),
    );
    r2.release_judge_until(saved.len()).await;
    let s = r2.sink.taken();
    let turn3 = s.iter().find(|x| x.turn == 3).expect("turn 3 resumed");
    assert_eq!(
        turn3.metadata["at_least_one"], true,
        "conversation 2's first scored turn is kept: {:?}",
        turn3.metadata
    );
}

/// A session closed because it sat idle, then continued, is the same conversation: only the
/// client's `X-Session-Done` starts a new one (the reference clears the state at done only).
#[tokio::test(start_paused = true)]
async fn a_session_continued_after_an_idle_timeout_is_the_same_conversation() {
    let r = rig();
    let t1 = r.buffer.begin("s", Some(&user("a")), false);
    r.buffer.accept(captured("s", t1));
    let t2 = r.buffer.begin("s", Some(&user("score:1")), false);
    r.buffer.accept(captured("s", t2));
    tokio::time::advance(Duration::from_secs(61)).await;
    r.buffer.sweep(); // turn 2 gets no next state; the session closes
    let t3 = r.buffer.begin("s", Some(&user("back again")), false);
    r.buffer.accept(captured("s", t3));
    r.buffer.begin("s", Some(&user("score:0")), true);
    wait_for("three samples", || r.sink.taken().len() == 3).await;
    let s = r.sink.taken();
    assert_eq!(s[0].reward.score, 1.0);
    assert_eq!(s[2].turn, 3);
    assert_eq!(
        s[2].metadata["excluded"], "score_zero",
        "{:?}",
        s[2].metadata
    );
}

/// Writes down every event it is told, in short.
#[derive(Default)]
struct Told(Mutex<Vec<String>>);

impl ps_core::TurnObserver for Told {
    fn observe(&self, e: ps_core::TurnEvent<'_>) {
        use ps_core::TurnEvent as E;
        let line = match e {
            E::Captured {
                session,
                turn,
                response_tokens,
            } => {
                format!("captured {session} {turn} ({response_tokens} tokens)")
            }
            E::PrmVotes {
                session,
                turn,
                votes,
                score,
            } => {
                format!("votes {session} {turn} {votes:?} -> {score}")
            }
            E::Submitted {
                session,
                turn,
                seq,
                reward,
                excluded,
            } => {
                format!(
                    "submitted {session} {turn} seq {seq} reward {reward} excluded {excluded:?}"
                )
            }
            E::Abandoned {
                session,
                turn,
                reason,
            } => format!("abandoned {session} {turn} {reason}"),
            E::SessionClosed { session, reason } => format!("closed {session} {reason}"),
            other => format!("{other:?}"),
        };
        self.0.lock().unwrap().push(line);
    }
}

#[tokio::test]
async fn the_observer_is_told_captures_votes_samples_abandons_and_closes() {
    let r = rig();
    let told = Arc::new(Told::default());
    let buffer = r.buffer.clone().with_observer(told.clone());
    let t1 = buffer.begin("s", Some(&user("a")), false);
    buffer.accept(captured("s", t1));
    let t2 = buffer.begin("s", Some(&user("b score:1")), false);
    wait_for("turn 1's sample", || r.sink.taken().len() == 1).await;
    wait_for("its event", || told.0.lock().unwrap().len() == 3).await;
    buffer.abandon("s", t2, "upstream_failed");
    assert!(buffer.shutdown(Duration::from_secs(5)).await);
    let told = told.0.lock().unwrap().clone();
    assert_eq!(
        told,
        vec![
            "captured s 1 (4 tokens)",
            "votes s 1 [Some(1), Some(1), Some(1)] -> 1",
            "submitted s 1 seq 1 reward 1 excluded None",
            "abandoned s 2 upstream_failed",
            "closed s shutdown",
        ],
        "{told:#?}"
    );
}

/// A turn persisted with images keeps them across a restart: the store of pending turns holds
/// their hashes only, and the resumed turn reads their bytes again from its messages' data URLs;
/// a turn whose image cannot be found there is abandoned (`image_unreadable`), never submitted
/// without it.
#[tokio::test]
async fn a_resumed_turn_reads_its_images_again_from_its_messages() {
    let png = [
        0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 13, b'I', b'H', b'D', b'R', 0, 0,
        0, 8, 0, 0, 0, 4, 8, 2, 0, 0, 0, 0, 0, 0, 0,
    ];
    let url = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(png)
    );
    let hash = ps_vision::read_image_part(
        &json!({"type": "image_url", "image_url": {"url": url}}),
        &Default::default(),
    )
    .unwrap()
    .hash;
    let with_image = |turn: u64, image_hash: &str| {
        let mut t = captured("s", turn);
        t.messages = vec![json!({"role": "user", "content": [
            {"type": "text", "text": "see"},
            {"type": "image_url", "image_url": {"url": url}}]})]
        .into();
        // As a persisted turn comes back: the hash, not the bytes.
        t.images = vec![ps_core::sample::SampleImage {
            hash: image_hash.to_owned(),
            mime: "image/png".into(),
            width: 8,
            height: 4,
            tokens: 4,
            bytes: None,
        }];
        ps_core::PendingTurn {
            turn: t,
            next: Some(user("score:1")),
            session_had_effective: false,
            conversation_start: false,
            tokenizer: None,
        }
    };
    let r = rig();
    let mut other = with_image(2, &"0".repeat(64));
    other.turn.session_id = "t".into();
    r.buffer.resume(vec![with_image(1, &hash), other]);
    r.release_judge_until(1).await;
    let taken = r.sink.taken();
    assert_eq!(taken.len(), 1, "only the turn whose image was found");
    assert_eq!(taken[0].images.len(), 1);
    assert_eq!(taken[0].images[0].hash, hash);
    assert_eq!(taken[0].images[0].bytes.as_deref(), Some(&png[..]));
    assert_eq!(
        r.buffer
            .status()
            .turns_abandoned_by_reason
            .get("image_unreadable"),
        Some(&1)
    );
}
