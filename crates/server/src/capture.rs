//! Capture workers: render, tokenize and align each main turn on dedicated threads, fed by a bounded
//! queue, so that the chat path never waits for this work and a long conversation cannot stall other
//! clients. A full queue drops the turn (counted and logged), it never blocks a request.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ps_chat_template::{ChatTemplateError, ChatTokenizer, EncodedPrefix, TurnInput};
use ps_core::{
    AlignPolicy, CapturedTurn, PositionSource, RolloutResponse, TurnGuard, TurnSink, align_logprobs,
};
use serde_json::{Map, Value};

use crate::metrics as m;

/// Everything needed to capture one main turn, taken from the request and the upstream's answer.
#[derive(Debug)]
pub struct CaptureJob {
    /// Ends the turn in the sink: accepted when captured, abandoned otherwise (also when dropped).
    pub guard: TurnGuard,
    pub arrival_seq: u64,
    pub messages: Vec<Value>,
    pub tools: Option<Value>,
    pub template_kwargs: Option<Map<String, Value>>,
    pub rollout: RolloutResponse,
    /// The client closed the session with this turn (`X-Session-Done`): no later turn will extend
    /// its prompt, so the session's cached prefix is dropped rather than kept.
    pub session_done: bool,
}

/// Sessions whose last prompt is kept for incremental tokenization; past it the cache starts over.
pub const PREFIX_CACHE_SESSIONS: usize = 1024;
/// How long an unused prefix is kept when [`CaptureQueue::with_prefix_idle`] sets nothing: the
/// default `server.session_timeout_sec`.
pub const DEFAULT_PREFIX_IDLE: Duration = Duration::from_secs(600);

struct CachedPrefix {
    prefix: Arc<EncodedPrefix>,
    used: Instant,
}

/// Each live session's last encoded prompt, so that the next turn encodes only what it adds
/// ([`ChatTokenizer::encode_incremental`]; the result is the same as a full encode). A session's
/// entry goes when the client closes the session, or when it has not been used for the idle time
/// (the session timeout: the session buffer has closed the session by then), so a finished
/// conversation does not keep its prompt in memory; at most [`PREFIX_CACHE_SESSIONS`] are kept.
pub struct PrefixCache {
    map: std::sync::Mutex<HashMap<String, CachedPrefix>>,
    /// Idle time before an entry is dropped, in ms.
    idle_ms: AtomicU64,
    /// When entries were last checked for idleness.
    swept: std::sync::Mutex<Instant>,
}

impl Default for PrefixCache {
    fn default() -> Self {
        Self::new(DEFAULT_PREFIX_IDLE)
    }
}

impl PrefixCache {
    pub fn new(idle: Duration) -> Self {
        let cache = Self {
            map: std::sync::Mutex::new(HashMap::new()),
            idle_ms: AtomicU64::new(0),
            swept: std::sync::Mutex::new(Instant::now()),
        };
        cache.set_idle(idle);
        cache
    }

    fn set_idle(&self, idle: Duration) {
        let ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX).max(1);
        self.idle_ms.store(ms, Ordering::Relaxed);
    }

    fn idle(&self) -> Duration {
        Duration::from_millis(self.idle_ms.load(Ordering::Relaxed))
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, CachedPrefix>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sessions with a cached prefix.
    pub fn len(&self) -> usize {
        self.map().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn get(&self, session_id: &str) -> Option<Arc<EncodedPrefix>> {
        self.map().get(session_id).map(|c| c.prefix.clone())
    }

    fn put(&self, session_id: &str, prefix: EncodedPrefix) {
        let mut map = self.map();
        if map.len() >= PREFIX_CACHE_SESSIONS && !map.contains_key(session_id) {
            map.clear();
        }
        map.insert(
            session_id.to_owned(),
            CachedPrefix {
                prefix: Arc::new(prefix),
                used: Instant::now(),
            },
        );
    }

    fn forget(&self, session_id: &str) {
        self.map().remove(session_id);
    }

    /// Drops the entries unused for longer than the idle time as of `now`; returns how many.
    pub fn expire(&self, now: Instant) -> usize {
        let idle = self.idle();
        let mut map = self.map();
        let before = map.len();
        map.retain(|_, c| now.saturating_duration_since(c.used) <= idle);
        if map.is_empty() {
            // Give the table's memory back too: after a burst of sessions it would stay sized for
            // the burst.
            map.shrink_to_fit();
        }
        before - map.len()
    }

    /// [`PrefixCache::expire`] when a quarter of the idle time has passed since the last check.
    fn expire_if_due(&self, now: Instant) {
        {
            let mut swept = self.swept.lock().unwrap_or_else(|p| p.into_inner());
            if now.saturating_duration_since(*swept) < self.idle() / 4 {
                return;
            }
            *swept = now;
        }
        self.expire(now);
    }
}

/// Renders, tokenizes and aligns one turn.
pub fn capture_turn(
    tok: &ChatTokenizer,
    job: &CaptureJob,
    policy: AlignPolicy,
) -> Result<CapturedTurn, ChatTemplateError> {
    capture_turn_with(tok, job, policy, None)
}

/// [`capture_turn`], encoding the prompt incrementally from the session's previous prompt.
pub fn capture_turn_with(
    tok: &ChatTokenizer,
    job: &CaptureJob,
    policy: AlignPolicy,
    cache: Option<&PrefixCache>,
) -> Result<CapturedTurn, ChatTemplateError> {
    let session_id = job.guard.session_id();
    let prev = cache.and_then(|c| c.get(session_id));
    let (tokens, next) = tok.split_turn_incremental(
        &TurnInput {
            messages: &job.messages,
            tools: job.tools.as_ref(),
            response_message: &job.rollout.message,
            template_kwargs: job.template_kwargs.as_ref(),
        },
        prev.as_deref(),
    )?;
    match (cache, next) {
        (Some(cache), _) if job.session_done => cache.forget(session_id),
        (Some(cache), Some(next)) => cache.put(session_id, next),
        _ => {}
    }
    let alignment = align_logprobs(
        &tokens.response_ids,
        |id| tok.token_text(id),
        &job.rollout.tokens,
        &job.rollout.finish,
        tok.eos_token_id(),
        policy,
    );
    Ok(CapturedTurn {
        session_id: job.guard.session_id().to_owned(),
        turn: job.guard.turn(),
        arrival_seq: job.arrival_seq,
        messages: job.messages.clone(),
        tools: job.tools.clone(),
        template_kwargs: job.template_kwargs.clone(),
        response_message: job.rollout.message.clone(),
        prompt_text: tokens.prompt_text,
        response_text: tokens.response_text,
        prompt_is_prefix: tokens.prompt_is_prefix,
        prompt_ids: tokens.prompt_ids,
        response_ids: tokens.response_ids,
        alignment,
        finish_reason: job.rollout.finish.reason.clone(),
        streamed: job.rollout.streamed,
    })
}

/// Counts and logs what a captured turn tells an operator.
fn report(turn: &CapturedTurn) {
    let a = &turn.alignment;
    if !turn.prompt_is_prefix {
        metrics::counter!(m::PROMPT_NOT_PREFIX_TOTAL).increment(1);
        tracing::warn!(
            session_id = %turn.session_id, turn = turn.turn,
            "the rendered conversation does not start with the rendered prompt; the whole text is taken as the response"
        );
    }
    if a.unmatched_upstream > 0 {
        metrics::counter!(m::TOKEN_MISMATCH_TOTAL).increment(1);
        tracing::warn!(
            session_id = %turn.session_id, turn = turn.turn,
            unmatched = a.unmatched_upstream,
            first_unmatched = a.first_unmatched_upstream,
            by_ids = a.matched_by_ids,
            "sampled tokens differ from the re-rendered response tokens; their positions carry no log-prob"
        );
    }
    let eos = a
        .sources
        .iter()
        .filter(|s| **s == PositionSource::EosUnreported)
        .count();
    let unsampled = a
        .sources
        .iter()
        .filter(|s| **s == PositionSource::Unsampled)
        .count();
    metrics::counter!(m::MARKED_POSITIONS_TOTAL, "source" => "eos_unreported")
        .increment(eos as u64);
    metrics::counter!(m::MARKED_POSITIONS_TOTAL, "source" => "unsampled")
        .increment(unsampled as u64);
}

/// The bounded queue in front of the capture workers.
pub struct CaptureQueue {
    sink: Arc<dyn TurnSink>,
    max_turn_tokens: Arc<std::sync::atomic::AtomicUsize>,
    prefixes: Arc<PrefixCache>,
    tx: std::sync::Mutex<Option<SyncSender<CaptureJob>>>,
    workers: std::sync::Mutex<Vec<JoinHandle<usize>>>,
}

impl std::fmt::Debug for CaptureQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaptureQueue").finish_non_exhaustive()
    }
}

impl CaptureQueue {
    /// Starts `workers` threads sharing a queue of `capacity` jobs.
    pub fn start(
        tokenizer: Arc<ChatTokenizer>,
        sink: Arc<dyn TurnSink>,
        policy: AlignPolicy,
        capacity: usize,
        workers: usize,
    ) -> std::io::Result<Self> {
        let (tx, rx) = sync_channel::<CaptureJob>(capacity.max(1));
        let rx = Arc::new(std::sync::Mutex::new(rx));
        let max_turn_tokens = Arc::new(std::sync::atomic::AtomicUsize::new(usize::MAX));
        let prefixes = Arc::new(PrefixCache::default());
        let mut handles = Vec::new();
        for i in 0..workers.max(1) {
            let (rx, tok, max, prefixes) = (
                rx.clone(),
                tokenizer.clone(),
                max_turn_tokens.clone(),
                prefixes.clone(),
            );
            handles.push(
                std::thread::Builder::new()
                    .name(format!("capture-{i}"))
                    .spawn(move || worker(&rx, &tok, policy, &max, &prefixes))?,
            );
        }
        Ok(Self {
            sink,
            max_turn_tokens,
            prefixes,
            tx: std::sync::Mutex::new(Some(tx)),
            workers: std::sync::Mutex::new(handles),
        })
    }

    /// Turns with more tokens (prompt + response) than this are not trained on (`server.max_turn_tokens`).
    #[must_use]
    pub fn with_max_turn_tokens(self, max: usize) -> Self {
        self.max_turn_tokens
            .store(max, std::sync::atomic::Ordering::Relaxed);
        self
    }

    /// Unused cached prefixes are dropped after `idle` (`server.session_timeout_sec`: the session
    /// is closed by then; a turn that comes later is encoded in full, with the same ids).
    #[must_use]
    pub fn with_prefix_idle(self, idle: Duration) -> Self {
        self.prefixes.set_idle(idle);
        self
    }

    /// Sessions whose last prompt is cached for incremental tokenization.
    pub fn cached_prefixes(&self) -> usize {
        self.prefixes.len()
    }

    /// The sink captured turns go to.
    pub fn sink(&self) -> &Arc<dyn TurnSink> {
        &self.sink
    }

    /// Queues a job without waiting. Returns `false` (counted, logged) when the queue is full or closed.
    pub fn submit(&self, mut job: CaptureJob) -> bool {
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        let Some(tx) = tx.as_ref() else {
            metrics::counter!(m::CAPTURE_TOTAL, "outcome" => "closed").increment(1);
            tracing::warn!(session_id = %job.guard.session_id(), "capture is shut down; turn not captured");
            job.guard.set_reason("capture_closed");
            return false;
        };
        match tx.try_send(job) {
            Ok(()) => true,
            Err(TrySendError::Full(mut job) | TrySendError::Disconnected(mut job)) => {
                metrics::counter!(m::CAPTURE_TOTAL, "outcome" => "queue_full").increment(1);
                tracing::warn!(
                    session_id = %job.guard.session_id(), turn = job.guard.turn(),
                    "capture queue full; turn not captured (more capture workers or a larger queue help)"
                );
                job.guard.set_reason("capture_queue_full");
                false
            }
        }
    }

    /// Closes the queue, lets the workers finish every queued job and returns how many they captured.
    /// Blocking: call it off the executor.
    pub fn shutdown(&self) -> usize {
        drop(self.tx.lock().unwrap_or_else(|p| p.into_inner()).take());
        let handles = std::mem::take(&mut *self.workers.lock().unwrap_or_else(|p| p.into_inner()));
        handles.into_iter().filter_map(|h| h.join().ok()).sum()
    }
}

impl Drop for CaptureQueue {
    fn drop(&mut self) {
        drop(self.tx.lock().unwrap_or_else(|p| p.into_inner()).take());
    }
}

fn worker(
    rx: &std::sync::Mutex<Receiver<CaptureJob>>,
    tok: &ChatTokenizer,
    policy: AlignPolicy,
    max_turn_tokens: &std::sync::atomic::AtomicUsize,
    prefixes: &PrefixCache,
) -> usize {
    let mut captured = 0;
    loop {
        prefixes.expire_if_due(Instant::now());
        let job = {
            let guard = rx.lock().unwrap_or_else(|p| p.into_inner());
            // Wakes up now and then while idle, so that idle prefixes go even when no turn comes.
            match guard.recv_timeout((prefixes.idle() / 4).max(Duration::from_millis(10))) {
                Ok(job) => job,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return captured,
            }
        };
        let started = Instant::now();
        match capture_turn_with(tok, &job, policy, Some(prefixes)) {
            Ok(turn)
                if turn.prompt_ids.len() + turn.response_ids.len()
                    > max_turn_tokens.load(std::sync::atomic::Ordering::Relaxed) =>
            {
                metrics::counter!(m::CAPTURE_TOTAL, "outcome" => "turn_too_long").increment(1);
                tracing::warn!(
                    session_id = %turn.session_id, turn = turn.turn,
                    tokens = turn.prompt_ids.len() + turn.response_ids.len(),
                    "turn longer than server.max_turn_tokens: answered, but not trained on"
                );
                let mut job = job;
                job.guard.set_reason("turn_too_long");
            }
            Ok(turn) => {
                metrics::histogram!(m::CAPTURE_SECONDS).record(started.elapsed().as_secs_f64());
                metrics::counter!(m::CAPTURE_TOTAL, "outcome" => "captured").increment(1);
                report(&turn);
                job.guard.accept(turn);
                captured += 1;
            }
            Err(e) => {
                metrics::counter!(m::CAPTURE_TOTAL, "outcome" => "render_failed").increment(1);
                tracing::error!(
                    session_id = %job.guard.session_id(), turn = job.guard.turn(), error = %e,
                    "capture failed: the turn could not be rendered or tokenized"
                );
                let mut job = job;
                job.guard.set_reason("render_failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use ps_core::FinishReason;
    use serde_json::json;

    struct Discard;

    impl TurnSink for Discard {
        fn accept(&self, _turn: CapturedTurn) {}
    }

    fn job(session: &str, turn: u64, messages: &[Value], session_done: bool) -> CaptureJob {
        CaptureJob {
            guard: TurnGuard::new(Arc::new(Discard), session.to_owned(), turn),
            arrival_seq: turn,
            messages: messages.to_vec(),
            tools: None,
            template_kwargs: None,
            rollout: RolloutResponse {
                message: json!({"role": "assistant", "content": format!("Answer {turn}.")}),
                tokens: Vec::new(),
                finish: FinishReason {
                    reason: Some("stop".into()),
                    matched_stop: Value::Null,
                },
                streamed: false,
            },
            session_done,
        }
    }

    fn policy() -> AlignPolicy {
        AlignPolicy::default()
    }

    #[test]
    fn a_session_closed_by_its_client_leaves_no_cached_prefix() {
        let tok = ChatTokenizer::mini();
        let cache = PrefixCache::default();
        let mut history = vec![json!({"role": "user", "content": "First question"})];
        capture_turn_with(&tok, &job("a", 1, &history, false), policy(), Some(&cache)).unwrap();
        capture_turn_with(&tok, &job("b", 1, &history, false), policy(), Some(&cache)).unwrap();
        assert_eq!(cache.len(), 2, "each open session keeps its last prompt");
        history.push(json!({"role": "assistant", "content": "Answer 1."}));
        history.push(json!({"role": "user", "content": "Second question"}));
        let done =
            capture_turn_with(&tok, &job("a", 2, &history, true), policy(), Some(&cache)).unwrap();
        assert!(!done.prompt_ids.is_empty());
        assert_eq!(cache.len(), 1, "the closed session's prefix is gone");
        assert!(cache.get("a").is_none() && cache.get("b").is_some());
    }

    #[test]
    fn unused_prefixes_expire_after_the_idle_time() {
        let cache = PrefixCache::new(Duration::from_secs(60));
        let prefix = || EncodedPrefix {
            text: "x".into(),
            ids: vec![1],
            boundaries: Vec::new(),
        };
        cache.put("a", prefix());
        let now = Instant::now();
        assert_eq!(cache.expire(now), 0, "used just now");
        assert_eq!(
            cache.expire(now + Duration::from_secs(30)),
            0,
            "idle 30 s of 60"
        );
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.expire(now + Duration::from_secs(61)), 1);
        assert!(cache.is_empty());
        cache.put("again", prefix());
        cache.forget("again");
        cache.forget("never-there");
        assert!(cache.is_empty());
    }
}
