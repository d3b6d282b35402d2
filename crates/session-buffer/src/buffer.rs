use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ps_core::message::flatten_content;
use ps_core::metric_names as m;
use ps_core::{CapturedTurn, PendingStore, PendingTurn, SampleSink, TurnSink};
use ps_prm_client::{JudgeInput, PrmScore, TurnScorer};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::opd::{OpdParts, combine_rl_sample, distill_sample, opd_record, teacher_signal};
use crate::rules::{rl_decision, rl_sample};

/// Attempts to hand one sample to the sink before it is counted as dropped.
const SUBMIT_ATTEMPTS: u32 = 4;
const SUBMIT_BACKOFF: Duration = Duration::from_millis(100);

/// Which samples the buffer makes (`server.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BufferMode {
    /// Binary RL: PRM-scored samples.
    #[default]
    Rl,
    /// On-policy distillation: hint judge + teacher log-probs.
    Opd,
    /// Both: hint and eval votes per turn, at most one sample.
    Combine,
}

impl BufferMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rl => "rl",
            Self::Opd => "opd",
            Self::Combine => "combine",
        }
    }
}

/// OPD settings (`[opd]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpdOptions {
    /// A turn without a next state yields no OPD sample (`opd.drop_without_next_state`); when false
    /// the hint judge still sees the turn, with an empty next state.
    pub drop_without_next_state: bool,
    /// K of top-K teacher log-probs (`opd.top_k`); 0 = off.
    pub top_k: usize,
    /// PRM eval votes alongside the hint votes in OPD (`opd.eval_mode`); always on in Combine.
    pub eval_votes: bool,
}

impl Default for OpdOptions {
    fn default() -> Self {
        Self {
            drop_without_next_state: true,
            top_k: 0,
            eval_votes: false,
        }
    }
}

/// Settings of the buffer.
#[derive(Debug, Clone)]
pub struct BufferConfig {
    pub mode: BufferMode,
    pub opd: OpdOptions,
    /// Score turns with the PRM (`prm.enabled`). Off: turns are submitted at once, excluded.
    pub prm_enabled: bool,
    /// A session idle this long is closed (`server.session_timeout_sec`).
    pub session_timeout: Duration,
    /// Live sessions held at most (`server.max_sessions`); beyond it the oldest idle one is closed.
    pub max_sessions: usize,
    /// Turns waiting for or in judging at once (`prm.max_backlog`). A turn that needs a judge
    /// beyond it is dropped (`turns_dropped_total{reason="judge_backlog"}`): a judge slower than the
    /// traffic must not grow the proxy's memory without bound.
    pub max_judge_backlog: usize,
}

/// Receives JSONL records (written off the chat path by the implementation).
pub trait RecordSink: Send + Sync {
    /// One resolved conversation turn.
    fn conversation(&self, record: Value);
    /// One PRM decision.
    fn prm(&self, record: Value);
    /// One OPD decision (accepted or not, with the reason).
    fn opd(&self, _record: Value) {}
}

/// Turns that are not samples yet, by what they wait for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PendingCounts {
    /// Answered, being rendered and tokenized.
    pub waiting_capture: u64,
    /// Captured, waiting for the session's next main request.
    pub waiting_next_state: u64,
    /// Being judged.
    pub scoring: u64,
    /// Judged, waiting for an earlier turn of the session to be submitted first.
    pub waiting_order: u64,
}

/// What the buffer holds and has done.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BufferStatus {
    pub live_sessions: u64,
    pub pending: PendingCounts,
    pub samples_submitted: u64,
    pub samples_effective: u64,
    pub samples_excluded: u64,
    pub samples_dropped: u64,
    pub turns_abandoned: u64,
    /// OPD/Combine turns that produced no sample (no next state, no hint, teacher failure, mismatch).
    pub turns_dropped: u64,
    pub teacher_mismatches: u64,
    pub sessions_timed_out: u64,
    pub sessions_evicted: u64,
    pub eval_scores: u64,
    pub eval_score_mean: Option<f64>,
    /// Trained positions of submitted samples whose rollout log-prob is a `0.0` placeholder (listed
    /// per sample in `metadata.trained_without_rollout_logprob`).
    pub positions_trained_without_logprob: u64,
    /// Positions of submitted samples taken out of the loss because a teacher field would have
    /// carried a placeholder (Combine's RL-only samples, `metadata.masked_without_logprob`).
    pub positions_masked_without_logprob: u64,
    /// Abandoned turns by reason (`upstream_failed`, `no_engine_ids`, `stream_logprobs_missing`, …).
    pub turns_abandoned_by_reason: std::collections::BTreeMap<String, u64>,
    /// Stored samples by where their ids came from (`engine`, `retokenized`).
    pub samples_by_token_source: std::collections::BTreeMap<String, u64>,
    /// Stored samples by policy version (`none` when unknown; at most
    /// [`MAX_TRACKED_VERSIONS`] versions, later ones under `other`).
    pub samples_by_weight_version: std::collections::BTreeMap<String, u64>,
}

/// Distinct policy versions counted in [`BufferStatus::samples_by_weight_version`].
pub const MAX_TRACKED_VERSIONS: usize = 256;

enum Next {
    Pending,
    State(Value),
    Missing,
}

struct Slot {
    captured: Option<CapturedTurn>,
    next: Next,
}

enum Ready {
    /// The turn was abandoned or dropped: nothing to submit, but later turns may go.
    Skip,
    /// An OPD/Combine sample, final (its rules need no order).
    Sample(Box<ps_core::sample::Sample>),
    Judged {
        turn: Box<CapturedTurn>,
        has_next_state: bool,
        judged: Option<PrmScore>,
    },
}

struct Session {
    next_turn: u64,
    next_submit: u64,
    last_activity: Instant,
    closing: bool,
    slots: BTreeMap<u64, Slot>,
    scoring: u64,
    ready: BTreeMap<u64, Ready>,
    /// What each judged-but-unsubmitted turn was made from, to persist it if the server stops first.
    origins: BTreeMap<u64, PendingTurn>,
    submitting: bool,
    /// The client ended the session (`X-Session-Done`): the id used again is a new conversation.
    /// (A session closed by the idle sweep or eviction and continued is the same conversation.)
    done: bool,
    /// The current conversation already has an effective sample (the at-least-one rule).
    has_effective: bool,
    /// First turns of later conversations under the same id: when submission reaches one,
    /// `has_effective` starts afresh.
    conversation_starts: std::collections::BTreeSet<u64>,
}

impl Session {
    fn new(now: Instant) -> Self {
        Self {
            next_turn: 1,
            next_submit: 1,
            last_activity: now,
            closing: false,
            slots: BTreeMap::new(),
            scoring: 0,
            ready: BTreeMap::new(),
            origins: BTreeMap::new(),
            submitting: false,
            done: false,
            has_effective: false,
            conversation_starts: std::collections::BTreeSet::new(),
        }
    }

    fn is_drained(&self) -> bool {
        self.slots.is_empty() && self.scoring == 0 && self.ready.is_empty() && !self.submitting
    }
}

/// A turn ready to be judged.
struct Job {
    session_id: String,
    turn_no: u64,
    turn: CapturedTurn,
    next: Option<Value>,
}

#[derive(Default)]
struct Counters {
    submitted: AtomicU64,
    effective: AtomicU64,
    excluded: AtomicU64,
    dropped: AtomicU64,
    abandoned: AtomicU64,
    dropped_turns: AtomicU64,
    mismatches: AtomicU64,
    timed_out: AtomicU64,
    evicted: AtomicU64,
    trained_placeholders: AtomicU64,
    masked_placeholders: AtomicU64,
    /// Whether the first trained / masked placeholder position was logged (once each per process).
    trained_placeholders_logged: std::sync::atomic::AtomicBool,
    masked_placeholders_logged: std::sync::atomic::AtomicBool,
}

/// Counts kept by name (bounded by their callers).
#[derive(Default)]
struct Tallies {
    abandoned: std::collections::BTreeMap<String, u64>,
    token_source: std::collections::BTreeMap<String, u64>,
    weight_version: std::collections::BTreeMap<String, u64>,
}

struct Inner {
    tallies: Mutex<Tallies>,
    config: BufferConfig,
    scorer: Option<Arc<dyn TurnScorer>>,
    opd: Option<OpdParts>,
    sink: Arc<dyn SampleSink>,
    records: Option<Arc<dyn RecordSink>>,
    sessions: Mutex<HashMap<String, Session>>,
    eval_scores: Mutex<Vec<f64>>,
    counters: Counters,
    tracker: TaskTracker,
    cancel: CancellationToken,
    /// Cancels judging still running once its turns were persisted at the shutdown deadline.
    abort: CancellationToken,
    runtime: tokio::runtime::Handle,
    /// Turns being judged, by (session, turn): what to persist if the server stops first.
    inflight: Mutex<HashMap<(String, u64), PendingTurn>>,
    pending_store: std::sync::OnceLock<Arc<dyn PendingStore>>,
    /// Turns waiting for or in judging now (bounded by `config.max_judge_backlog`).
    judging: AtomicUsize,
}

/// Counts one turn in [`Inner::judging`] while alive (also when its judging is cancelled).
struct JudgingSlot<'a>(&'a AtomicUsize);

impl Drop for JudgingSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The per-session state machine. Cheap to clone.
#[derive(Clone)]
pub struct SessionBuffer(Arc<Inner>);

impl std::fmt::Debug for SessionBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionBuffer")
            .field("config", &self.0.config)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl SessionBuffer {
    /// Creates the buffer. Must be called inside a tokio runtime: scoring and submission run on it
    /// (capture worker threads call in from outside the runtime).
    pub fn new(
        config: BufferConfig,
        scorer: Option<Arc<dyn TurnScorer>>,
        sink: Arc<dyn SampleSink>,
        records: Option<Arc<dyn RecordSink>>,
    ) -> Self {
        Self::with_opd(config, scorer, None, sink, records)
    }

    /// As [`SessionBuffer::new`], with the hint judge and teacher that modes `Opd` and `Combine` use.
    pub fn with_opd(
        config: BufferConfig,
        scorer: Option<Arc<dyn TurnScorer>>,
        opd: Option<OpdParts>,
        sink: Arc<dyn SampleSink>,
        records: Option<Arc<dyn RecordSink>>,
    ) -> Self {
        Self(Arc::new(Inner {
            tallies: Mutex::new(Tallies::default()),
            config,
            scorer,
            opd,
            sink,
            records,
            sessions: Mutex::new(HashMap::new()),
            eval_scores: Mutex::new(Vec::new()),
            counters: Counters::default(),
            tracker: TaskTracker::new(),
            cancel: CancellationToken::new(),
            abort: CancellationToken::new(),
            runtime: tokio::runtime::Handle::current(),
            inflight: Mutex::new(HashMap::new()),
            pending_store: std::sync::OnceLock::new(),
            judging: AtomicUsize::new(0),
        }))
    }

    /// Where turns still unfinished when the shutdown grace runs out are persisted (and taken back
    /// from by [`SessionBuffer::resume`] on the next start).
    #[must_use]
    pub fn with_pending_store(self, store: Arc<dyn PendingStore>) -> Self {
        let _ = self.0.pending_store.set(store);
        self
    }

    /// Takes every turn that is captured but not yet a sample (being judged, or judged and waiting
    /// for an earlier turn): judging results that arrive afterwards are discarded, so each turn is
    /// either submitted now or returned here, never both.
    pub fn take_unfinished(&self) -> Vec<PendingTurn> {
        let mut sessions = lock(&self.0.sessions);
        let mut out: Vec<PendingTurn> = lock(&self.0.inflight).drain().map(|(_, t)| t).collect();
        for s in sessions.values_mut() {
            let ready = std::mem::take(&mut s.ready);
            for (n, r) in ready {
                if !matches!(r, Ready::Skip)
                    && let Some(origin) = s.origins.remove(&n)
                {
                    out.push(origin);
                }
            }
            s.origins.clear();
        }
        for t in &mut out {
            // A turn of a later conversation under the same id (see `conversation_starts`) starts
            // with no effective sample, whatever the earlier conversation had.
            let s = sessions.get(&t.turn.session_id);
            t.session_had_effective = s.is_some_and(|s| {
                s.has_effective && s.conversation_starts.range(..=t.turn.turn).next().is_none()
            });
            t.conversation_start = s.is_some_and(|s| s.conversation_starts.contains(&t.turn.turn));
        }
        out.sort_by(|a, b| {
            (&a.turn.session_id, a.turn.turn).cmp(&(&b.turn.session_id, b.turn.turn))
        });
        out
    }

    /// Resumes turns persisted by an earlier run: each is judged again (its next state, or its
    /// absence, is known) and submitted in turn order within its session.
    pub fn resume(&self, turns: Vec<PendingTurn>) {
        let mut by_session: BTreeMap<String, Vec<PendingTurn>> = BTreeMap::new();
        for t in turns {
            by_session
                .entry(t.turn.session_id.clone())
                .or_default()
                .push(t);
        }
        let mut jobs = Vec::new();
        {
            let mut sessions = lock(&self.0.sessions);
            for (id, turns) in by_session {
                let fresh = !sessions.contains_key(&id);
                let s = sessions
                    .entry(id.clone())
                    .or_insert_with(|| Session::new(Instant::now()));
                let numbers: Vec<u64> = turns.iter().map(|t| t.turn.turn).collect();
                let (lo, hi) = (
                    numbers.iter().copied().min().unwrap_or(1),
                    numbers.iter().copied().max().unwrap_or(0),
                );
                if fresh {
                    s.next_submit = lo;
                    s.closing = true;
                    // The state of the conversation the first resumed turn belongs to; a later
                    // conversation under the same id starts afresh at its first turn.
                    s.has_effective = turns
                        .iter()
                        .min_by_key(|t| t.turn.turn)
                        .is_some_and(|t| t.session_had_effective);
                    s.conversation_starts = turns
                        .iter()
                        .filter(|t| t.conversation_start)
                        .map(|t| t.turn.turn)
                        .collect();
                    // Turns between them that were submitted before the restart do not block.
                    for n in lo..=hi {
                        if !numbers.contains(&n) {
                            s.ready.insert(n, Ready::Skip);
                        }
                    }
                }
                s.next_turn = s.next_turn.max(hi + 1);
                for t in turns {
                    s.slots.insert(
                        t.turn.turn,
                        Slot {
                            next: t.next.map_or(Next::Missing, Next::State),
                            captured: Some(t.turn),
                        },
                    );
                }
                self.collect_ready(&id, s, &mut jobs);
            }
        }
        tracing::info!(
            turns = jobs.len(),
            "resuming turns persisted by the previous run"
        );
        self.dispatch(jobs);
    }

    /// Starts the task that closes idle sessions, checking every `every`.
    pub fn spawn_sweeper(&self, every: Duration) {
        let this = self.clone();
        let cancel = self.0.cancel.clone();
        self.0.tracker.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    _ = tick.tick() => this.sweep(),
                }
            }
        });
    }

    /// Closes every session idle longer than the timeout: their waiting turns get no next state.
    pub fn sweep(&self) {
        let now = Instant::now();
        let timeout = self.0.config.session_timeout;
        let mut jobs = Vec::new();
        {
            let mut sessions = lock(&self.0.sessions);
            for (id, s) in sessions.iter_mut() {
                if !s.closing && now.duration_since(s.last_activity) >= timeout {
                    self.0.counters.timed_out.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!(m::SESSIONS_CLOSED_TOTAL, "reason" => "timeout").increment(1);
                    tracing::info!(session_id = %id, "session idle past server.session_timeout_sec: closed");
                    close(s);
                    self.collect_ready(id, s, &mut jobs);
                }
            }
            sessions.retain(|_, s| !(s.closing && s.is_drained()));
        }
        self.dispatch(jobs);
    }

    /// Closes every session (shutdown): waiting turns get no next state and are submitted by the
    /// rules; then waits up to `grace` for scoring and submission to finish. Returns whether
    /// everything finished in time.
    pub async fn shutdown(&self, grace: Duration) -> bool {
        let mut jobs = Vec::new();
        {
            let mut sessions = lock(&self.0.sessions);
            for (id, s) in sessions.iter_mut() {
                if !s.closing {
                    metrics::counter!(m::SESSIONS_CLOSED_TOTAL, "reason" => "shutdown")
                        .increment(1);
                    close(s);
                    self.collect_ready(id, s, &mut jobs);
                }
            }
        }
        self.dispatch(jobs);
        self.0.cancel.cancel();
        self.0.tracker.close();
        let done = tokio::time::timeout(grace, self.0.tracker.wait())
            .await
            .is_ok();
        if !done {
            let unfinished = self.take_unfinished();
            match self.0.pending_store.get() {
                Some(store) if !unfinished.is_empty() => match store.save_pending(unfinished).await
                {
                    Ok(n) => tracing::warn!(
                        turns = n,
                        "shutdown grace elapsed: unfinished turns persisted; the next start resumes them"
                    ),
                    Err(e) => {
                        tracing::error!(error = %e, "unfinished turns could NOT be persisted: they are lost")
                    }
                },
                Some(_) => {}
                None => tracing::error!(
                    turns = unfinished.len(),
                    "shutdown grace elapsed and no pending store is configured: unfinished turns are lost"
                ),
            }
            // Their judging is pointless now (the next start redoes it): stop it and let go.
            self.0.abort.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(1), self.0.tracker.wait()).await;
        }
        done
    }

    /// Which samples this buffer makes.
    pub fn mode(&self) -> BufferMode {
        self.0.config.mode
    }

    /// Returns and clears the PRM scores computed since the last drain (`rollout/prm_eval_score`).
    pub fn drain_eval_scores(&self) -> Vec<f64> {
        std::mem::take(&mut *lock(&self.0.eval_scores))
    }

    pub fn status(&self) -> BufferStatus {
        let mut pending = PendingCounts::default();
        let mut live = 0;
        for s in lock(&self.0.sessions).values() {
            if !s.closing {
                live += 1;
            }
            for slot in s.slots.values() {
                match (&slot.captured, &slot.next) {
                    (None, _) => pending.waiting_capture += 1,
                    (Some(_), Next::Pending) => pending.waiting_next_state += 1,
                    (Some(_), _) => {}
                }
            }
            pending.scoring += s.scoring;
            pending.waiting_order += s.ready.len() as u64;
        }
        let (count, mean) = {
            let scores = lock(&self.0.eval_scores);
            let n = scores.len();
            (
                n as u64,
                (n > 0).then(|| scores.iter().sum::<f64>() / n as f64),
            )
        };
        let c = &self.0.counters;
        // One lock for the three (a temporary guard per field would deadlock the second).
        let tallies = {
            let t = lock(&self.0.tallies);
            Tallies {
                abandoned: t.abandoned.clone(),
                token_source: t.token_source.clone(),
                weight_version: t.weight_version.clone(),
            }
        };
        BufferStatus {
            live_sessions: live,
            pending,
            samples_submitted: c.submitted.load(Ordering::Relaxed),
            samples_effective: c.effective.load(Ordering::Relaxed),
            samples_excluded: c.excluded.load(Ordering::Relaxed),
            samples_dropped: c.dropped.load(Ordering::Relaxed),
            turns_abandoned: c.abandoned.load(Ordering::Relaxed),
            turns_dropped: c.dropped_turns.load(Ordering::Relaxed),
            teacher_mismatches: c.mismatches.load(Ordering::Relaxed),
            sessions_timed_out: c.timed_out.load(Ordering::Relaxed),
            sessions_evicted: c.evicted.load(Ordering::Relaxed),
            eval_scores: count,
            eval_score_mean: mean,
            positions_trained_without_logprob: c.trained_placeholders.load(Ordering::Relaxed),
            positions_masked_without_logprob: c.masked_placeholders.load(Ordering::Relaxed),
            turns_abandoned_by_reason: tallies.abandoned,
            samples_by_token_source: tallies.token_source,
            samples_by_weight_version: tallies.weight_version,
        }
    }

    /// Takes ready turns out of the session: captured and with a resolved next state (or any captured
    /// turn in RL mode with the PRM off, which needs no next state). OPD and Combine always wait for
    /// the next state: the hint judge needs it whatever the PRM setting.
    fn collect_ready(&self, id: &str, s: &mut Session, jobs: &mut Vec<Job>) {
        let needs_next = self.0.config.prm_enabled || self.0.config.mode != BufferMode::Rl;
        let ready: Vec<u64> = s
            .slots
            .iter()
            .filter(|(_, slot)| {
                slot.captured.is_some() && (!needs_next || !matches!(slot.next, Next::Pending))
            })
            .map(|(n, _)| *n)
            .collect();
        for n in ready {
            if let Some(Slot {
                captured: Some(turn),
                next,
            }) = s.slots.remove(&n)
            {
                s.scoring += 1;
                jobs.push(Job {
                    session_id: id.to_owned(),
                    turn_no: n,
                    turn,
                    next: match next {
                        Next::State(v) => Some(v),
                        Next::Pending | Next::Missing => None,
                    },
                });
            }
        }
    }

    fn dispatch(&self, jobs: Vec<Job>) {
        for job in jobs {
            lock(&self.0.inflight).insert(
                (job.session_id.clone(), job.turn_no),
                PendingTurn {
                    turn: job.turn.clone(),
                    next: job.next.clone(),
                    // Filled in by `take_unfinished`, from the session as it is then.
                    session_had_effective: false,
                    conversation_start: false,
                },
            );
            let this = self.clone();
            // Every log line of the turn's background scoring carries its session and turn.
            let span =
                tracing::info_span!("score", session_id = %job.session_id, turn = job.turn_no);
            let abort = self.0.abort.clone();
            let judge = async move {
                tokio::select! {
                    () = abort.cancelled() => {}
                    () = this.judge(job) => {}
                }
            };
            self.0.tracker.spawn_on(
                tracing::Instrument::instrument(judge, span),
                &self.0.runtime,
            );
        }
    }

    async fn judge(&self, job: Job) {
        let (session_id, turn_no) = (job.session_id.clone(), job.turn_no);
        // Only a turn with a next state calls a judge; the others are cheap and always go through.
        let needs_judge = job.next.is_some()
            && (self.0.config.mode != BufferMode::Rl || self.0.config.prm_enabled);
        let backlog = needs_judge.then(|| {
            let waiting = self.0.judging.fetch_add(1, Ordering::Relaxed);
            (waiting, JudgingSlot(&self.0.judging))
        });
        let ready = match (&backlog, self.0.config.mode) {
            (Some((n, _)), _) if *n >= self.0.config.max_judge_backlog => {
                self.drop_for_backlog(&job, *n)
            }
            (_, BufferMode::Rl) => self.judge_rl(job).await,
            (_, BufferMode::Opd | BufferMode::Combine) => self.judge_opd(job).await,
        };
        drop(backlog);
        let start_drain = {
            let mut sessions = lock(&self.0.sessions);
            let s = sessions
                .entry(session_id.clone())
                .or_insert_with(|| Session::new(Instant::now()));
            s.scoring = s.scoring.saturating_sub(1);
            let Some(origin) = lock(&self.0.inflight).remove(&(session_id.clone(), turn_no)) else {
                // Persisted at shutdown meanwhile: the next start judges it again.
                return;
            };
            if !matches!(ready, Ready::Skip) {
                s.origins.insert(turn_no, origin);
            }
            s.ready.insert(turn_no, ready);
            !std::mem::replace(&mut s.submitting, true)
        };
        if start_drain {
            self.drain(&session_id).await;
        }
    }

    /// Runs the PRM votes of a turn that has a next state, counting and collecting the score.
    async fn eval(&self, turn: &CapturedTurn, state: &Value) -> Option<PrmScore> {
        let scorer = self
            .0
            .scorer
            .as_ref()
            .filter(|_| self.0.config.prm_enabled)?;
        let started = Instant::now();
        let score = scorer.score(&judge_input(turn, state)).await;
        metrics::histogram!(m::PRM_SECONDS).record(started.elapsed().as_secs_f64());
        for v in &score.votes {
            let outcome = match v {
                Some(1) => "1",
                Some(-1) => "-1",
                Some(_) => "0",
                None => "failed",
            };
            metrics::counter!(m::PRM_VOTES_TOTAL, "outcome" => outcome).increment(1);
        }
        // OPD eval mode and Combine record every eval majority (a dropped turn's too, as the
        // reference); RL records the score of every submitted sample instead (see `drain`).
        if self.0.config.mode != BufferMode::Rl {
            lock(&self.0.eval_scores).push(score.score);
        }
        Some(score)
    }

    fn record_turn(
        &self,
        session_id: &str,
        turn_no: u64,
        turn: &CapturedTurn,
        next: Option<&Value>,
        judged: Option<&PrmScore>,
    ) {
        let Some(r) = &self.0.records else {
            return;
        };
        r.conversation(json!({
            "session_id": session_id,
            "turn": turn_no,
            "timestamp_ms": unix_millis(),
            "messages": turn.messages,
            "prompt_text": turn.prompt_text,
            "response_text": turn.response_text,
            "response_message": turn.response_message,
            "tool_calls": turn.response_message.get("tool_calls").cloned().unwrap_or(Value::Null),
            "next_state": next,
        }));
        if let Some(j) = judged {
            r.prm(json!({
                "session_id": session_id,
                "turn": turn_no,
                "timestamp_ms": unix_millis(),
                "score": j.score,
                "votes": j.votes,
                "failures": j.failures,
                "representative": if j.score != 0.0 { j.representative.clone() } else { None },
            }));
        }
    }

    async fn judge_rl(&self, job: Job) -> Ready {
        let Job {
            session_id,
            turn_no,
            turn,
            next,
        } = job;
        let judged = match &next {
            Some(state) => self.eval(&turn, state).await,
            None => None,
        };
        self.record_turn(&session_id, turn_no, &turn, next.as_ref(), judged.as_ref());
        Ready::Judged {
            turn: Box::new(turn),
            has_next_state: next.is_some(),
            judged,
        }
    }

    /// A turn dropped because `max_judge_backlog` turns already wait for a judge.
    fn drop_for_backlog(&self, job: &Job, waiting: usize) -> Ready {
        self.0
            .counters
            .dropped_turns
            .fetch_add(1, Ordering::Relaxed);
        metrics::counter!(m::TURNS_DROPPED_TOTAL, "reason" => "judge_backlog").increment(1);
        tracing::warn!(
            session_id = %job.session_id,
            turn = job.turn_no,
            waiting,
            "the judge is behind: {waiting} turns already wait for it, so this turn yields no sample \
             (raise prm.max_concurrency or add judge capacity; prm.max_backlog bounds the wait)"
        );
        Ready::Skip
    }

    /// A turn that yields no sample in OPD/Combine: counted, logged, recorded with its reason.
    fn drop_turn(&self, job: &Job, reason: &'static str, detail: &str, record: Value) -> Ready {
        self.0
            .counters
            .dropped_turns
            .fetch_add(1, Ordering::Relaxed);
        metrics::counter!(m::TURNS_DROPPED_TOTAL, "reason" => reason).increment(1);
        if reason == "teacher_token_mismatch" {
            self.0.counters.mismatches.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(m::TEACHER_MISMATCH_TOTAL).increment(1);
            tracing::warn!(
                session_id = %job.session_id, turn = job.turn_no, %detail,
                "the teacher scored other token ids than the response's (a teacher/policy tokenizer mismatch?): no sample"
            );
        } else {
            tracing::info!(session_id = %job.session_id, turn = job.turn_no, reason, %detail, "turn yields no sample");
        }
        if let Some(r) = &self.0.records {
            r.opd(record);
        }
        Ready::Skip
    }

    async fn judge_opd(&self, job: Job) -> Ready {
        let mode = self.0.config.mode;
        let combine = mode == BufferMode::Combine;
        let opts = self.0.config.opd;
        let Some(parts) = self.0.opd.clone() else {
            let rec = opd_record(
                &job.session_id,
                job.turn_no,
                mode.as_str(),
                None,
                None,
                None,
                Some(("opd_not_configured", "")),
            );
            return self.drop_turn(
                &job,
                "opd_not_configured",
                "no hint judge or teacher is configured",
                rec,
            );
        };
        let next = match (&job.next, opts.drop_without_next_state || combine) {
            (Some(v), _) => v.clone(),
            (None, true) => {
                self.record_turn(&job.session_id, job.turn_no, &job.turn, None, None);
                let rec = opd_record(
                    &job.session_id,
                    job.turn_no,
                    mode.as_str(),
                    None,
                    None,
                    None,
                    Some(("no_next_state", "")),
                );
                return self.drop_turn(
                    &job,
                    "no_next_state",
                    "the turn never got a next state",
                    rec,
                );
            }
            (None, false) => json!({"role": "user", "content": ""}),
        };
        let input = judge_input(&job.turn, &next);
        let want_eval = combine || opts.eval_votes;
        let (hint, eval) = futures::join!(parts.hint.judge(&input), async {
            if want_eval {
                self.eval(&job.turn, &next).await
            } else {
                None
            }
        });
        for v in hint.scores() {
            let outcome = match v {
                Some(1) => "1",
                Some(_) => "-1",
                None => "failed",
            };
            metrics::counter!(m::HINT_VOTES_TOTAL, "outcome" => outcome).increment(1);
        }
        self.record_turn(
            &job.session_id,
            job.turn_no,
            &job.turn,
            job.next.as_ref(),
            eval.as_ref(),
        );
        let eval_score = eval.as_ref().map_or(0.0, |e| e.score);
        let signal = match hint.hint() {
            Some(h) => Some(teacher_signal(&parts, &job.turn, h, opts.top_k).await),
            None => None,
        };
        let rec = |signal: Option<&ps_teacher_client::TeacherLogprobs>,
                   dropped: Option<(&str, &str)>| {
            opd_record(
                &job.session_id,
                job.turn_no,
                mode.as_str(),
                Some(&hint),
                eval.as_ref(),
                signal,
                dropped,
            )
        };
        match signal {
            Some(Ok(signal)) => {
                let reward = if combine { eval_score } else { 1.0 };
                if let Some(r) = &self.0.records {
                    r.opd(rec(Some(&signal), None));
                }
                Ready::Sample(Box::new(distill_sample(
                    &job.turn,
                    reward,
                    signal,
                    mode.as_str(),
                    &hint,
                    eval.as_ref(),
                )))
            }
            failed => {
                // No usable teacher signal: no hint, or the teacher failed / mismatched.
                let (reason, detail) = match &failed {
                    Some(Err(f)) => (f.reason, f.detail.clone()),
                    _ => (
                        "no_hint",
                        format!(
                            "no hint longer than the minimum among {} votes",
                            hint.votes.len()
                        ),
                    ),
                };
                match eval.as_ref().filter(|e| combine && e.score != 0.0) {
                    Some(e) => {
                        if let Some(r) = &self.0.records {
                            r.opd(rec(None, Some((reason, &detail))));
                        }
                        Ready::Sample(Box::new(combine_rl_sample(&job.turn, e, &hint)))
                    }
                    None => {
                        let record = rec(None, Some((reason, &detail)));
                        self.drop_turn(&job, reason, &detail, record)
                    }
                }
            }
        }
    }

    /// Submits the session's ready samples in turn order; runs in at most one task per session.
    async fn drain(&self, session_id: &str) {
        loop {
            let sample = {
                let mut sessions = lock(&self.0.sessions);
                let Some(s) = sessions.get_mut(session_id) else {
                    return;
                };
                s.origins.remove(&s.next_submit);
                if s.ready.contains_key(&s.next_submit)
                    && s.conversation_starts.remove(&s.next_submit)
                {
                    s.has_effective = false;
                }
                match s.ready.remove(&s.next_submit) {
                    None => {
                        s.submitting = false;
                        if s.closing && s.is_drained() {
                            sessions.remove(session_id);
                        }
                        return;
                    }
                    Some(Ready::Skip) => {
                        s.next_submit += 1;
                        continue;
                    }
                    Some(Ready::Sample(sample)) => {
                        s.next_submit += 1;
                        self.0.counters.effective.fetch_add(1, Ordering::Relaxed);
                        *sample
                    }
                    Some(Ready::Judged {
                        turn,
                        has_next_state,
                        judged,
                    }) => {
                        s.next_submit += 1;
                        let decision = rl_decision(
                            judged.as_ref().map(|j| j.score),
                            has_next_state,
                            self.0.config.prm_enabled,
                            s.has_effective,
                        );
                        s.has_effective |= decision.effective;
                        if self.0.config.prm_enabled {
                            // `rollout/prm_eval_score` covers every submitted RL sample, as in
                            // the reference: its reward, 0 for a turn without a next state.
                            lock(&self.0.eval_scores).push(decision.reward);
                        }
                        let c = &self.0.counters;
                        if decision.effective {
                            c.effective.fetch_add(1, Ordering::Relaxed);
                        } else {
                            c.excluded.fetch_add(1, Ordering::Relaxed);
                        }
                        if let Some(e) = decision.excluded {
                            metrics::counter!(m::SAMPLES_EXCLUDED_TOTAL, "reason" => e.as_str())
                                .increment(1);
                        }
                        rl_sample(&turn, &decision, judged.as_ref())
                    }
                }
            };
            self.submit(sample).await;
        }
    }

    /// Counts a stored sample by token source and policy version.
    fn tally_stored(&self, sample: &ps_core::sample::Sample) {
        let source = sample
            .metadata
            .get("token_source")
            .and_then(Value::as_str)
            .unwrap_or("retokenized")
            .to_owned();
        let mut t = lock(&self.0.tallies);
        *t.token_source.entry(source).or_default() += 1;
        let version = sample
            .weight_versions
            .last()
            .cloned()
            .unwrap_or_else(|| "none".to_owned());
        let key = if t.weight_version.contains_key(&version)
            || t.weight_version.len() < MAX_TRACKED_VERSIONS
        {
            version
        } else {
            "other".to_owned()
        };
        *t.weight_version.entry(key).or_default() += 1;
    }

    /// Counts the positions of a stored sample whose rollout log-prob is a placeholder.
    fn count_placeholders(&self, sample: &ps_core::sample::Sample) {
        let listed = |key: &str| {
            sample
                .metadata
                .get(key)
                .and_then(Value::as_array)
                .map_or(0, |a| a.len() as u64)
        };
        let trained = listed(crate::rules::TRAINED_WITHOUT_ROLLOUT_LOGPROB);
        let masked = listed(crate::opd::MASKED_WITHOUT_LOGPROB);
        let c = &self.0.counters;
        c.trained_placeholders.fetch_add(trained, Ordering::Relaxed);
        c.masked_placeholders.fetch_add(masked, Ordering::Relaxed);
        if trained > 0 {
            metrics::counter!(m::SAMPLE_POSITIONS_WITHOUT_LOGPROB_TOTAL, "outcome" => "trained")
                .increment(trained);
            if !c.trained_placeholders_logged.swap(true, Ordering::Relaxed) {
                tracing::info!(
                    session_id = %sample.session_id, turn = sample.turn, positions = trained,
                    "a sample trains positions whose rollout log-prob the upstream did not report \
                     (0.0 placeholders, listed in metadata.trained_without_rollout_logprob): a trainer \
                     that uses rollout log-probs must leave them out, or set \
                     capture.train_eos_without_logprob = false (logged once; counted in /v1/rollout/status)"
                );
            }
        }
        if masked > 0 {
            metrics::counter!(m::SAMPLE_POSITIONS_WITHOUT_LOGPROB_TOTAL, "outcome" => "masked")
                .increment(masked);
            if !c.masked_placeholders_logged.swap(true, Ordering::Relaxed) {
                tracing::info!(
                    session_id = %sample.session_id, turn = sample.turn, positions = masked,
                    "a Combine RL-only sample had trained positions without a rollout log-prob: they \
                     are taken out of the loss (metadata.masked_without_logprob) so that no placeholder \
                     enters teacher_log_probs (logged once; counted in /v1/rollout/status)"
                );
            }
        }
    }

    async fn submit(&self, sample: ps_core::sample::Sample) {
        let (session_id, turn) = (sample.session_id.clone(), sample.turn);
        let effective = sample.loss_mask.iter().any(|b| *b != 0);
        for attempt in 1..=SUBMIT_ATTEMPTS {
            match self.0.sink.submit(sample.clone()).await {
                Ok(seq) => {
                    self.0.counters.submitted.fetch_add(1, Ordering::Relaxed);
                    self.count_placeholders(&sample);
                    self.tally_stored(&sample);
                    let outcome = if effective { "effective" } else { "excluded" };
                    metrics::counter!(m::SAMPLES_SUBMITTED_TOTAL, "outcome" => outcome)
                        .increment(1);
                    tracing::debug!(%session_id, turn, seq, reward = sample.reward.score, "sample submitted");
                    return;
                }
                Err(e) if attempt < SUBMIT_ATTEMPTS => {
                    tracing::warn!(%session_id, turn, attempt, error = %e, "sample submission failed; retrying");
                    tokio::time::sleep(SUBMIT_BACKOFF * 4u32.pow(attempt - 1)).await;
                }
                Err(e) => {
                    self.0.counters.dropped.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!(m::SAMPLES_DROPPED_TOTAL, "reason" => "sink_failed")
                        .increment(1);
                    tracing::error!(%session_id, turn, error = %e, "sample LOST: the sink kept failing");
                }
            }
        }
    }
}

/// Closes a session: every turn still waiting for a next state will get none. The caller then
/// collects the turns this made ready.
fn close(s: &mut Session) {
    s.closing = true;
    for slot in s.slots.values_mut() {
        if matches!(slot.next, Next::Pending) {
            slot.next = Next::Missing;
        }
    }
}

fn judge_input(turn: &CapturedTurn, state: &Value) -> JudgeInput {
    JudgeInput {
        response_text: turn.response_text.clone(),
        next_state_text: flatten_content(state.get("content").unwrap_or(&Value::Null)),
        next_state_role: state
            .get("role")
            .and_then(Value::as_str)
            .unwrap_or("user")
            .to_owned(),
    }
}

pub(crate) fn unix_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl TurnSink for SessionBuffer {
    fn begin(&self, session_id: &str, last_message: &Value, done: bool) -> u64 {
        let now = Instant::now();
        let mut jobs = Vec::new();
        let n = {
            let mut sessions = lock(&self.0.sessions);
            if !sessions.contains_key(session_id) {
                self.make_room(&mut sessions, &mut jobs);
            }
            let s = sessions
                .entry(session_id.to_owned())
                .or_insert_with(|| Session::new(now));
            let n = s.next_turn;
            s.closing = false;
            if std::mem::replace(&mut s.done, false) {
                // The id is reused after the session closed (`X-Session-Done`, the shared
                // `unknown` session, a timeout while its last turns were still being judged): a
                // new conversation, whose at-least-one state starts afresh at this turn, as the
                // reference clears it at done. Earlier turns keep the old conversation's state.
                s.conversation_starts.insert(n);
            }
            s.last_activity = now;
            s.next_turn += 1;
            if let Some(prev) = s.slots.get_mut(&(n - 1))
                && matches!(prev.next, Next::Pending)
            {
                prev.next = Next::State(last_message.clone());
            }
            s.slots.insert(
                n,
                Slot {
                    captured: None,
                    next: if done { Next::Missing } else { Next::Pending },
                },
            );
            if done {
                metrics::counter!(m::SESSIONS_CLOSED_TOTAL, "reason" => "done").increment(1);
                close(s);
                s.done = true;
            }
            self.collect_ready(session_id, s, &mut jobs);
            n
        };
        self.dispatch(jobs);
        n
    }

    fn advance(&self, session_id: &str, last_message: &Value, done: bool) {
        let mut jobs = Vec::new();
        {
            let mut sessions = lock(&self.0.sessions);
            let Some(s) = sessions.get_mut(session_id) else {
                // No turn of this session waits for a next state.
                return;
            };
            s.last_activity = Instant::now();
            if let Some(prev) = s.slots.get_mut(&(s.next_turn - 1))
                && matches!(prev.next, Next::Pending)
            {
                prev.next = Next::State(last_message.clone());
            }
            if done && !s.closing {
                metrics::counter!(m::SESSIONS_CLOSED_TOTAL, "reason" => "done").increment(1);
                close(s);
            }
            s.done |= done;
            self.collect_ready(session_id, s, &mut jobs);
        }
        self.dispatch(jobs);
    }

    fn end_session(&self, session_id: &str) {
        let mut jobs = Vec::new();
        {
            let mut sessions = lock(&self.0.sessions);
            if let Some(s) = sessions.get_mut(session_id) {
                metrics::counter!(m::SESSIONS_CLOSED_TOTAL, "reason" => "done").increment(1);
                close(s);
                s.done = true;
                self.collect_ready(session_id, s, &mut jobs);
            }
        }
        self.dispatch(jobs);
    }

    fn accept(&self, turn: CapturedTurn) {
        let mut jobs = Vec::new();
        {
            let mut sessions = lock(&self.0.sessions);
            let id = turn.session_id.clone();
            let s = sessions
                .entry(id.clone())
                .or_insert_with(|| Session::new(Instant::now()));
            match s.slots.get_mut(&turn.turn) {
                Some(slot) => slot.captured = Some(turn),
                None => {
                    // Not begun here (a sink that does not number turns, or a session removed
                    // meanwhile): it has no next state to wait for.
                    s.slots.insert(
                        turn.turn,
                        Slot {
                            captured: Some(turn),
                            next: Next::Missing,
                        },
                    );
                }
            }
            self.collect_ready(&id, s, &mut jobs);
        }
        self.dispatch(jobs);
    }

    fn abandon(&self, session_id: &str, turn: u64, reason: &str) {
        self.0.counters.abandoned.fetch_add(1, Ordering::Relaxed);
        {
            // Reasons are a small fixed set of snake_case words chosen by the server.
            let mut t = lock(&self.0.tallies);
            *t.abandoned.entry(reason.to_owned()).or_default() += 1;
        }
        metrics::counter!(m::TURNS_ABANDONED_TOTAL, "reason" => reason.to_owned()).increment(1);
        tracing::info!(%session_id, turn, reason, "turn abandoned: it will not become a sample");
        let start_drain = {
            let mut sessions = lock(&self.0.sessions);
            let Some(s) = sessions.get_mut(session_id) else {
                return;
            };
            s.slots.remove(&turn);
            s.ready.insert(turn, Ready::Skip);
            !std::mem::replace(&mut s.submitting, true)
        };
        if start_drain {
            let this = self.clone();
            let id = session_id.to_owned();
            self.0
                .tracker
                .spawn_on(async move { this.drain(&id).await }, &self.0.runtime);
        }
    }
}

impl SessionBuffer {
    /// Keeps live sessions under the cap by closing the oldest idle one.
    fn make_room(&self, sessions: &mut HashMap<String, Session>, jobs: &mut Vec<Job>) {
        let live = sessions.values().filter(|s| !s.closing).count();
        if live < self.0.config.max_sessions.max(1) {
            return;
        }
        let oldest = sessions
            .iter()
            .filter(|(_, s)| !s.closing)
            .min_by_key(|(_, s)| s.last_activity)
            .map(|(id, _)| id.clone());
        if let Some(id) = oldest
            && let Some(s) = sessions.get_mut(&id)
        {
            self.0.counters.evicted.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(m::SESSIONS_CLOSED_TOTAL, "reason" => "evicted").increment(1);
            tracing::warn!(session_id = %id, "server.max_sessions reached: closing the oldest idle session");
            close(s);
            self.collect_ready(&id, s, jobs);
        }
    }
}
