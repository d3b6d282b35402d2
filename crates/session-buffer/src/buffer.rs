//! [`SessionBuffer`]: the sessions under one lock, and the tasks that judge their turns and submit
//! their samples. The rooms it drives: the per-session state machine ([`crate::state`]), judging
//! ([`crate::judge`], OPD in [`crate::opd`]), ordered submission ([`crate::submit`]) and
//! persistence for shutdown and resume ([`crate::persist`]).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ps_core::metric_names as m;
use ps_core::ports::TurnScorer;
use ps_core::{
    CapturedTurn, PendingStore, PendingTurn, SampleSink, TurnEvent, TurnObserver, TurnSink,
};
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{BufferConfig, BufferMode};
use crate::judge::Judges;
use crate::opd::OpdParts;
use crate::state::{Job, Next, Session, Unfinished};
use crate::status::{BufferStatus, PendingCounts, Stats, lock};
use crate::{persist, submit};
use ps_core::ports::RecordSink;

struct Inner {
    config: BufferConfig,
    judges: Judges,
    stats: Stats,
    sink: Arc<dyn SampleSink>,
    sessions: Mutex<HashMap<String, Session>>,
    tracker: TaskTracker,
    cancel: CancellationToken,
    /// Cancels judging still running once its turns were persisted at the shutdown deadline.
    abort: CancellationToken,
    runtime: tokio::runtime::Handle,
    /// Turns being judged, by (session, turn): what to persist if the server stops first.
    inflight: Mutex<HashMap<(String, u64), Unfinished>>,
    pending_store: std::sync::OnceLock<Arc<dyn PendingStore>>,
    /// The policy tokenizer's fingerprint, written on persisted turns and checked on resumed ones.
    tokenizer: std::sync::OnceLock<u64>,
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
            judges: Judges::new(config.clone(), scorer, opd, records),
            config,
            stats: Stats::default(),
            sink,
            sessions: Mutex::new(HashMap::new()),
            tracker: TaskTracker::new(),
            cancel: CancellationToken::new(),
            abort: CancellationToken::new(),
            runtime: tokio::runtime::Handle::current(),
            inflight: Mutex::new(HashMap::new()),
            pending_store: std::sync::OnceLock::new(),
            tokenizer: std::sync::OnceLock::new(),
        }))
    }

    /// Where turns still unfinished when the shutdown grace runs out are persisted (and taken back
    /// from by [`SessionBuffer::resume`] on the next start).
    #[must_use]
    pub fn with_pending_store(self, store: Arc<dyn PendingStore>) -> Self {
        let _ = self.0.pending_store.set(store);
        self
    }

    /// The fingerprint of the policy tokenizer (`ChatTokenizer::fingerprint`) that makes the turns'
    /// ids: turns persisted at shutdown carry it, and [`SessionBuffer::resume`] abandons those
    /// persisted with another one (`tokenizer_changed`) instead of training on ids the current
    /// tokenizer did not make. Set once, before traffic.
    #[must_use]
    pub fn with_tokenizer_fingerprint(self, fingerprint: u64) -> Self {
        let _ = self.0.tokenizer.set(fingerprint);
        self
    }

    /// Who is told what happens to sessions and turns (captures, votes, hint, teacher outcome, the
    /// sample's seq or why there is none, sessions closed by timeout, eviction or shutdown): the
    /// inspection page's history. Set once, before traffic. Requests, and sessions the client
    /// ends, are told by the server, which sees them first.
    #[must_use]
    pub fn with_observer(self, observer: Arc<dyn TurnObserver>) -> Self {
        self.0.stats.observer.set(observer);
        self
    }

    /// Takes every turn that is captured but not yet a sample (being judged, or judged and waiting
    /// for an earlier turn): judging results that arrive afterwards are discarded, so each turn is
    /// either submitted now or returned here, never both.
    pub fn take_unfinished(&self) -> Vec<PendingTurn> {
        let mut sessions = lock(&self.0.sessions);
        let mut turns = persist::take_unfinished(&mut sessions, &mut lock(&self.0.inflight));
        // This run's fingerprint, also on a turn resumed from an older version's record (which
        // had none): its ids passed this run's check, or it would not have been resumed.
        for t in &mut turns {
            t.tokenizer = self.0.tokenizer.get().copied();
        }
        turns
    }

    /// Resumes turns persisted by an earlier run: each is judged again (its next state, or its
    /// absence, is known) and submitted in turn order within its session.
    ///
    /// A turn persisted with another tokenizer's fingerprint than this buffer's is abandoned
    /// (`tokenizer_changed`, counted in `turns_abandoned_by_reason`, one warning for all of them):
    /// its ids and texts were made by a tokenizer or chat template this run does not use.
    pub fn resume(&self, turns: Vec<PendingTurn>) {
        let now = self.0.tokenizer.get().copied();
        let (turns, changed): (Vec<_>, Vec<_>) = turns
            .into_iter()
            .partition(|t| t.tokenizer.zip(now).is_none_or(|(was, now)| was == now));
        if let Some(first) = changed.first() {
            tracing::warn!(
                turns = changed.len(),
                "turns persisted by the previous run were made with another policy tokenizer or \
                 chat template (fingerprint {:016x}, now {:016x}): they yield no samples \
                 (abandoned as tokenizer_changed); if the model did not change, check where the \
                 tokenizer comes from (server.model_dir, or the policy server's model path)",
                first.tokenizer.unwrap_or_default(),
                now.unwrap_or_default(),
            );
        }
        for t in &changed {
            self.0
                .stats
                .abandoned(&t.turn.session_id, t.turn.turn, "tokenizer_changed");
        }
        // Turns a build before the refusal of parts that are not text persisted with such a part
        // (capture refuses them now): abandoned with that reason, never submitted.
        // A vision-language model's turn keeps its images: their bytes are read again from its
        // messages (a turn persisted with images holds them as data URLs there).
        let mut turns = turns;
        for t in &mut turns {
            restore_image_bytes(&mut t.turn);
        }
        let unusable = |t: &ps_core::PendingTurn| -> Option<&'static str> {
            if t.turn.images.iter().any(|i| i.bytes.is_none()) {
                return Some("image_unreadable");
            }
            let m: Vec<serde_json::Value> = t.turn.messages.parse().ok()?;
            let captured = !t.turn.images.is_empty();
            ps_core::message::unsupported_part_with(&m, captured).map(|(reason, _)| reason)
        };
        let (turns, unsupported): (Vec<_>, Vec<_>) =
            turns.into_iter().partition(|t| unusable(t).is_none());
        for t in &unsupported {
            let reason = unusable(t).unwrap_or("content_part_unsupported");
            self.0
                .stats
                .abandoned(&t.turn.session_id, t.turn.turn, reason);
        }
        if !unsupported.is_empty() {
            tracing::warn!(
                turns = unsupported.len(),
                "turns persisted by the previous run hold a content part that is not text: they \
                 yield no samples (abandoned with its reason, e.g. image_unsupported)"
            );
        }
        let mut jobs = Vec::new();
        {
            let mut sessions = lock(&self.0.sessions);
            for id in persist::restore(&mut sessions, turns) {
                if let Some(s) = sessions.get_mut(&id) {
                    self.collect_ready(&id, s, &mut jobs);
                }
            }
        }
        if !jobs.is_empty() {
            tracing::info!(
                turns = jobs.len(),
                "resuming turns persisted by the previous run"
            );
        }
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
                    self.0.stats.timed_out.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!(m::SESSIONS_CLOSED_TOTAL, "reason" => "timeout").increment(1);
                    self.0.stats.observer.tell(TurnEvent::SessionClosed {
                        session: id,
                        reason: "timeout",
                    });
                    tracing::info!(session_id = %id, "session idle past server.session_timeout_sec: closed");
                    s.close();
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
                    self.0.stats.observer.tell(TurnEvent::SessionClosed {
                        session: id,
                        reason: "shutdown",
                    });
                    s.close();
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
            persist::save(self.0.pending_store.get().map(|s| &**s), unfinished).await;
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
        self.0.stats.drain_eval_scores()
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
        self.0.stats.status(live, pending)
    }

    /// Takes ready turns out of the session: captured and with a resolved next state (or any captured
    /// turn in RL mode with the PRM off, which needs no next state). OPD and Combine always wait for
    /// the next state: the hint judge needs it whatever the PRM setting.
    fn collect_ready(&self, id: &str, s: &mut Session, jobs: &mut Vec<Job>) {
        let needs_next = self.0.config.prm_enabled || self.0.config.mode != BufferMode::Rl;
        s.collect_ready(id, needs_next, jobs);
    }

    /// Starts judging each job in a task of its own.
    fn dispatch(&self, jobs: Vec<Job>) {
        for job in jobs {
            lock(&self.0.inflight).insert((job.session_id.clone(), job.turn_no), job.pending());
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

    /// Judges one turn, files the result into its session and submits what is ready in order.
    async fn judge(&self, job: Job) {
        let (session_id, turn_no) = (job.session_id.clone(), job.turn_no);
        let ready = self.0.judges.judge(job, &self.0.stats).await;
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
            s.judged(turn_no, ready, origin)
        };
        if start_drain {
            self.drain(&session_id).await;
        }
    }

    /// Submits the session's ready samples in turn order; runs in at most one task per session.
    async fn drain(&self, session_id: &str) {
        loop {
            let next = submit::next_in_order(
                &mut lock(&self.0.sessions),
                session_id,
                self.0.config.prm_enabled,
                &self.0.stats,
            );
            let Some(sample) = next else {
                return;
            };
            submit::submit(&*self.0.sink, &self.0.stats, sample).await;
        }
    }

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
            self.0.stats.evicted.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(m::SESSIONS_CLOSED_TOTAL, "reason" => "evicted").increment(1);
            self.0.stats.observer.tell(TurnEvent::SessionClosed {
                session: &id,
                reason: "evicted",
            });
            tracing::warn!(session_id = %id, "server.max_sessions reached: closing the oldest idle session");
            s.close();
            self.collect_ready(&id, s, jobs);
        }
    }

    /// Starts the session's submission task (abandoned turns free the turns after them).
    fn spawn_drain(&self, session_id: &str) {
        let this = self.clone();
        let id = session_id.to_owned();
        self.0
            .tracker
            .spawn_on(async move { this.drain(&id).await }, &self.0.runtime);
    }
}

impl TurnSink for SessionBuffer {
    fn begin(&self, session_id: &str, next_state: Option<&Value>, done: bool) -> u64 {
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
            let n = s.begin(next_state, done, now);
            self.collect_ready(session_id, s, &mut jobs);
            n
        };
        self.dispatch(jobs);
        n
    }

    fn advance(&self, session_id: &str, next_state: Option<&Value>, done: bool) {
        let mut jobs = Vec::new();
        {
            let mut sessions = lock(&self.0.sessions);
            let Some(s) = sessions.get_mut(session_id) else {
                // No turn of this session waits for a next state.
                return;
            };
            s.advance(next_state, done, Instant::now());
            self.collect_ready(session_id, s, &mut jobs);
        }
        self.dispatch(jobs);
    }

    fn end_session(&self, session_id: &str) {
        let mut jobs = Vec::new();
        {
            let mut sessions = lock(&self.0.sessions);
            if let Some(s) = sessions.get_mut(session_id) {
                s.end();
                self.collect_ready(session_id, s, &mut jobs);
            }
        }
        self.dispatch(jobs);
    }

    fn accept(&self, turn: CapturedTurn) {
        self.0.stats.observer.tell(TurnEvent::Captured {
            session: &turn.session_id,
            turn: turn.turn,
            response_tokens: turn.response_ids.len(),
        });
        let mut jobs = Vec::new();
        {
            let mut sessions = lock(&self.0.sessions);
            let id = turn.session_id.clone();
            let s = sessions
                .entry(id.clone())
                .or_insert_with(|| Session::new(Instant::now()));
            s.accept(turn);
            self.collect_ready(&id, s, &mut jobs);
        }
        self.dispatch(jobs);
    }

    fn abandon(&self, session_id: &str, turn: u64, reason: &str) {
        self.0.stats.abandoned(session_id, turn, reason);
        tracing::info!(%session_id, turn, reason, "turn abandoned: it will not become a sample");
        let start_drain = {
            let mut sessions = lock(&self.0.sessions);
            let Some(s) = sessions.get_mut(session_id) else {
                return;
            };
            s.abandon(turn)
        };
        if start_drain {
            self.spawn_drain(session_id);
        }
    }
}

/// The server's view of the buffer ([`ps_core::RolloutControl`]): it links no part of it.
#[async_trait::async_trait]
impl ps_core::RolloutControl for SessionBuffer {
    fn status(&self) -> BufferStatus {
        SessionBuffer::status(self)
    }

    fn mode_name(&self) -> &'static str {
        self.mode().as_str()
    }

    fn drain_eval_scores(&self) -> Vec<f64> {
        SessionBuffer::drain_eval_scores(self)
    }

    async fn shutdown(&self, grace: Duration) -> bool {
        SessionBuffer::shutdown(self, grace).await
    }
}

/// Fills the bytes of a resumed turn's images from the data URLs of its messages, matched by
/// content hash; an image whose bytes are not found keeps `None` (the turn is then abandoned as
/// `image_unreadable`).
fn restore_image_bytes(turn: &mut ps_core::CapturedTurn) {
    if turn.images.iter().all(|i| i.bytes.is_some()) {
        return;
    }
    let Ok(messages) = turn.messages.parse() else {
        return;
    };
    let limits = ps_vision::ImageLimits::unbounded();
    let read: Vec<ps_vision::Image> = ps_core::message::image_parts(&messages)
        .filter_map(|p| ps_vision::read_image_part(p, &limits).ok())
        .collect();
    for image in turn.images.iter_mut().filter(|i| i.bytes.is_none()) {
        image.bytes = read
            .iter()
            .find(|r| r.hash == image.hash)
            .map(|r| r.bytes.clone());
    }
}
