//! The bounded queue and its worker threads ([`CaptureQueue`]): the chat path submits and never
//! waits; a full queue drops the turn (counted and logged).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ps_chat_template::{ChatTokenizer, ImageLimits};
use ps_core::{AlignPolicy, TurnSink};
use serde_json::Value;

use ps_core::metric_names as m;

use crate::turn::{capture_turn_with, report};
use crate::{CaptureError, CaptureJob, CaptureStats, DriftCheck, PrefixCache, RequestJson};

/// What the queue carries: a job, with its request's parts still as JSON text when they are,
/// and the bytes it is counted for in [`QueueBytes`].
pub(crate) type Queued = (CaptureJob, Option<RequestJson>, usize);

/// About how many bytes a queued job holds: its request's JSON text and the upstream's answer
/// (whole, or its rollout when assembled from a stream). What bounds the queue's memory
/// (`capture.max_queued_mib`): when capture falls behind the chat path, the jobs waiting for a
/// worker are what grows (a heap profile of the agent benchmark at its peak: ~140 kB a turn,
/// the client's `messages` and an answer carrying 10,000–20,000 prompt ids).
pub(crate) fn queued_bytes(job: &CaptureJob, request: Option<&RequestJson>) -> usize {
    let rollout = &job.rollout;
    let ids = rollout.engine_ids.as_ref().map_or(0, |e| {
        (e.prompt.len() + e.response.len()) * size_of::<u32>()
    });
    let tokens: usize = rollout
        .tokens
        .iter()
        .map(|t| size_of::<ps_core::SampledToken>() + t.token.len())
        .sum();
    let message = ["content", "reasoning_content"]
        .iter()
        .filter_map(|k| rollout.message.get(*k).and_then(Value::as_str))
        .map(str::len)
        .sum::<usize>()
        + rollout
            .message
            .get("tool_calls")
            .map_or(0, |c| c.to_string().len());
    let request = request.map_or(0, |r| {
        r.messages.len()
            + r.tools.as_ref().map_or(0, Bytes::len)
            + r.template_kwargs.as_ref().map_or(0, Bytes::len)
            + r.answer.as_ref().map_or(0, |a| a.bytes().len())
    });
    // A streamed answer's routed experts (SGLang's base64, decoded on the capture thread).
    let experts = rollout.routed_experts.as_ref().map_or(0, |e| e.data.len())
        + rollout
            .routed_experts_encoded
            .as_ref()
            .map_or(0, String::len);
    request + ids + tokens + message + experts
}

/// What the capture queue holds now, at most, and its byte bound.
#[derive(Debug, Default)]
pub struct QueueBytes {
    pub(crate) turns: AtomicUsize,
    pub(crate) bytes: AtomicUsize,
    pub(crate) peak_bytes: AtomicUsize,
    pub(crate) max_bytes: AtomicUsize,
}

impl QueueBytes {
    /// Counts a job in, unless it would take the queue past its bound (a job is always let into
    /// an empty queue, however large: one turn alone cannot be refused for the queue's size).
    pub(crate) fn take(&self, n: usize) -> bool {
        let max = self.max_bytes.load(Ordering::Relaxed);
        let mut now = self.bytes.load(Ordering::Relaxed);
        loop {
            if now > 0 && now.saturating_add(n) > max {
                return false;
            }
            match self.bytes.compare_exchange_weak(
                now,
                now + n,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(actual) => now = actual,
            }
        }
        self.turns.fetch_add(1, Ordering::Relaxed);
        self.peak_bytes.fetch_max(now + n, Ordering::Relaxed);
        true
    }

    /// Counts a job out (a worker took it, or the channel refused it).
    pub(crate) fn give(&self, n: usize) {
        self.bytes.fetch_sub(n, Ordering::Relaxed);
        self.turns.fetch_sub(1, Ordering::Relaxed);
    }

    /// Turns queued for a worker now.
    pub fn turns(&self) -> usize {
        self.turns.load(Ordering::Relaxed)
    }

    /// Bytes those turns hold (about).
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// The most bytes queued at once since start.
    pub fn peak_bytes(&self) -> usize {
        self.peak_bytes.load(Ordering::Relaxed)
    }

    /// The bound (`capture.max_queued_mib`).
    pub fn max_bytes(&self) -> usize {
        self.max_bytes.load(Ordering::Relaxed)
    }

    /// `/v1/rollout/status`'s `capture_queue` section.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "turns": self.turns(),
            "bytes": self.bytes(),
            "peak_bytes": self.peak_bytes(),
            "max_bytes": self.max_bytes(),
        })
    }
}

/// `capture.max_queued_mib`'s default, in bytes.
pub const DEFAULT_MAX_QUEUED_BYTES: usize = 256 << 20;

/// The bounded queue in front of the capture workers.
pub struct CaptureQueue {
    pub(crate) sink: Arc<dyn TurnSink>,
    pub(crate) stats: Arc<CaptureStats>,
    pub(crate) max_turn_tokens: Arc<std::sync::atomic::AtomicUsize>,
    pub(crate) prefixes: Arc<PrefixCache>,
    pub(crate) queued: Arc<QueueBytes>,
    /// The policy is a vision-language model (its images are captured when the store keeps
    /// them: [`CaptureStats::captures_images`]).
    pub(crate) vision: bool,
    /// The policy's tokenizer and template, also for counting a request's prompt tokens
    /// ([`CaptureQueue::count_prompt_tokens`]).
    pub(crate) tokenizer: Arc<ChatTokenizer>,
    pub(crate) tx: std::sync::Mutex<Option<SyncSender<Queued>>>,
    pub(crate) workers: std::sync::Mutex<Vec<JoinHandle<usize>>>,
}

impl std::fmt::Debug for CaptureQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaptureQueue").finish_non_exhaustive()
    }
}

impl CaptureQueue {
    /// Starts `workers` threads sharing a queue of `capacity` jobs (and at most
    /// [`DEFAULT_MAX_QUEUED_BYTES`] of them: [`Self::with_max_queued_bytes`]).
    pub fn start(
        tokenizer: Arc<ChatTokenizer>,
        sink: Arc<dyn TurnSink>,
        policy: AlignPolicy,
        drift: DriftCheck,
        capacity: usize,
        workers: usize,
    ) -> std::io::Result<Self> {
        let vision = tokenizer.vision().is_some();
        let (tx, rx) = sync_channel::<Queued>(capacity.max(1));
        let rx = Arc::new(std::sync::Mutex::new(rx));
        let max_turn_tokens = Arc::new(std::sync::atomic::AtomicUsize::new(usize::MAX));
        let prefixes = Arc::new(PrefixCache::default());
        let stats = Arc::new(CaptureStats::new(drift));
        let queued = Arc::new(QueueBytes::default());
        queued
            .max_bytes
            .store(DEFAULT_MAX_QUEUED_BYTES, Ordering::Relaxed);
        let mut handles = Vec::new();
        for i in 0..workers.max(1) {
            let (rx, tok, max, prefixes, stats, queued) = (
                rx.clone(),
                tokenizer.clone(),
                max_turn_tokens.clone(),
                prefixes.clone(),
                stats.clone(),
                queued.clone(),
            );
            handles.push(
                std::thread::Builder::new()
                    .name(format!("capture-{i}"))
                    .spawn(move || {
                        let limits = Limits {
                            max_turn_tokens: &max,
                            queued: &queued,
                        };
                        worker(&rx, &tok, policy, limits, &prefixes, &stats)
                    })?,
            );
        }
        Ok(Self {
            sink,
            stats,
            max_turn_tokens,
            prefixes,
            queued,
            vision,
            tokenizer,
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

    /// Jobs beyond `bytes` in the queue are refused (`capture.max_queued_mib`): the turn is
    /// answered but not trained on, abandoned as `capture_queue_full`.
    #[must_use]
    pub fn with_max_queued_bytes(self, bytes: usize) -> Self {
        self.queued.max_bytes.store(bytes, Ordering::Relaxed);
        self
    }

    /// The number of prompt tokens a request's `messages` (with `tools` and `template_kwargs`)
    /// render to with the policy's template and tokenizer, the generation prompt included and each
    /// image expanded to its pad tokens: what the engine counts, and what a turn's prompt ids
    /// would be. Rendering a long conversation takes a millisecond or more: call it off the
    /// executor. An error says why the prompt does not render (a message the template refuses, an
    /// image that cannot be read, images for a text model).
    pub fn count_prompt_tokens(
        &self,
        messages: &[Value],
        tools: Option<&Value>,
        template_kwargs: Option<&serde_json::Map<String, Value>>,
    ) -> Result<usize, String> {
        let tok = &self.tokenizer;
        let images = tok
            .images(messages, &self.stats.image_limits())
            .map_err(|e| e.to_string())?;
        let normalized = tok.normalize(messages);
        let text = tok
            .render(&normalized, tools, true, template_kwargs)
            .map_err(|e| e.to_string())?;
        let ids = tok.encode(&text).map_err(|e| e.to_string())?;
        if images.is_empty() {
            return Ok(ids.len());
        }
        let counts: Vec<usize> = images.iter().map(|i| i.tokens).collect();
        tok.expand_image_pads(&ids, &counts)
            .map(|ids| ids.len())
            .map_err(|e| e.to_string())
    }

    /// Bounds on a turn's images (`capture.max_image_mib`, `capture.max_images_per_turn`).
    #[must_use]
    pub fn with_image_limits(self, limits: ImageLimits) -> Self {
        self.stats.set_image_limits(limits);
        self
    }

    /// The sample store keeps images or not (`SampleLog::keeps_images`): without, turns with
    /// images are refused (`image_unsupported`) even for a vision-language model.
    #[must_use]
    pub fn with_store_keeping_images(self, keeps: bool) -> Self {
        self.stats.set_store_keeps_images(keeps);
        self
    }

    /// `capture.routed_experts`, and the model's routing shape when known (SGLang's experts are
    /// flat: their layers and top-k come from it).
    /// `asked`: main turns ask the engine for them (a turn without them is then missing from
    /// the first).
    pub fn with_routed_experts(
        self,
        mode: ps_core::RoutedExpertsMode,
        shape: Option<ps_core::MoeShape>,
        asked: bool,
    ) -> Self {
        self.stats.experts.configure(mode, shape, asked);
        self
    }

    /// `capture.max_held_experts_mib`, in bytes.
    pub fn with_max_held_experts(self, bytes: usize) -> Self {
        self.stats.experts.budget.set_limit(bytes);
        self
    }

    /// Whether turns with images are captured (the policy's directory has an image processor
    /// and the store keeps images); otherwise they are refused on the chat path
    /// (`image_unsupported`).
    pub fn images_captured(&self) -> bool {
        self.stats.captures_images_of(self.vision)
    }

    /// What the queue holds now and at most.
    pub fn queued(&self) -> &QueueBytes {
        &self.queued
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

    /// What capture counted (id sources, fallbacks, drift).
    pub fn stats(&self) -> &CaptureStats {
        &self.stats
    }

    /// The sink captured turns go to.
    pub fn sink(&self) -> &Arc<dyn TurnSink> {
        &self.sink
    }

    /// Queues a job without waiting. Returns `false` (counted, logged) when the queue is full or closed.
    pub fn submit(&self, job: CaptureJob) -> bool {
        let n = queued_bytes(&job, None);
        self.enqueue((job, None, n))
    }

    /// As [`Self::submit`], for a job whose `messages`, `tools` and `template_kwargs` are still the
    /// client's JSON text (`request`): the capture thread parses them before the job runs.
    pub fn submit_json(&self, job: CaptureJob, request: RequestJson) -> bool {
        let n = queued_bytes(&job, Some(&request));
        self.enqueue((job, Some(request), n))
    }

    /// A turn refused by the queue: counted, logged once per kind with what helps.
    pub(crate) fn refuse(
        &self,
        mut job: CaptureJob,
        kind: &'static str,
        why: &str,
        helps: &str,
    ) -> bool {
        metrics::counter!(m::CAPTURE_TOTAL, "outcome" => "queue_full").increment(1);
        if self.stats.first_time(kind) {
            tracing::warn!(
                session_id = %job.guard.session_id(), turn = job.guard.turn(),
                queued_turns = self.queued.turns(), queued_bytes = self.queued.bytes(),
                "capture queue full ({why}); turn answered but not trained on (capture_queue_full in \
                 /v1/rollout/status turns_abandoned_by_reason; logged once): capture is slower than \
                 the chat path; {helps}"
            );
        }
        job.guard.set_reason("capture_queue_full");
        false
    }

    pub(crate) fn enqueue(&self, (mut job, request, n): Queued) -> bool {
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        let Some(tx) = tx.as_ref() else {
            metrics::counter!(m::CAPTURE_TOTAL, "outcome" => "closed").increment(1);
            tracing::warn!(session_id = %job.guard.session_id(), "capture is shut down; turn not captured");
            job.guard.set_reason("capture_closed");
            return false;
        };
        if !self.queued.take(n) {
            let why = format!(
                "{} bytes queued, capture.max_queued_mib = {}",
                self.queued.bytes(),
                self.queued.max_bytes() >> 20
            );
            return self.refuse(
                job,
                "capture_queue_full_bytes",
                &why,
                "more CPU for the capture workers or a larger capture.max_queued_mib helps",
            );
        }
        match tx.try_send((job, request, n)) {
            Ok(()) => true,
            Err(TrySendError::Full((job, _, n))) => {
                self.queued.give(n);
                self.refuse(
                    job,
                    "capture_queue_full_turns",
                    "all of its turns are taken",
                    "more CPU for the capture workers helps",
                )
            }
            Err(TrySendError::Disconnected((mut job, _, n))) => {
                self.queued.give(n);
                metrics::counter!(m::CAPTURE_TOTAL, "outcome" => "closed").increment(1);
                if self.stats.first_time("capture_closed") {
                    tracing::error!(
                        session_id = %job.guard.session_id(), turn = job.guard.turn(),
                        "every capture worker is gone (a panic, logged above); turns are answered \
                         but not trained on (capture_closed) until the server is restarted"
                    );
                }
                job.guard.set_reason("capture_closed");
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

/// What a worker checks a turn and the queue against.
#[derive(Clone, Copy)]
pub(crate) struct Limits<'a> {
    pub(crate) max_turn_tokens: &'a AtomicUsize,
    pub(crate) queued: &'a QueueBytes,
}

pub(crate) fn worker(
    rx: &std::sync::Mutex<Receiver<Queued>>,
    tok: &ChatTokenizer,
    policy: AlignPolicy,
    Limits {
        max_turn_tokens,
        queued,
    }: Limits<'_>,
    prefixes: &PrefixCache,
    stats: &CaptureStats,
) -> usize {
    let mut captured = 0;
    loop {
        prefixes.expire_if_due(Instant::now());
        let (mut job, request, n) = {
            let guard = rx.lock().unwrap_or_else(|p| p.into_inner());
            // Wakes up now and then while idle, so that idle prefixes go even when no turn comes.
            match guard.recv_timeout((prefixes.idle() / 4).max(Duration::from_millis(10))) {
                Ok(job) => job,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return captured,
            }
        };
        queued.give(n);
        let started = Instant::now();
        let filled = match request {
            Some(request) => request.fill(&mut job),
            None => Ok(()),
        };
        let captured_turn =
            filled.and_then(|()| capture_turn_with(tok, &job, policy, Some(prefixes), stats));
        if captured_turn.is_err() && job.session_done {
            // The session's last turn failed: its kept prefix goes now, not at its idle expiry.
            prefixes.forget(job.guard.session_id());
        }
        match captured_turn {
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
            Err(e @ CaptureError::Template(_)) => {
                metrics::counter!(m::CAPTURE_TOTAL, "outcome" => "render_failed").increment(1);
                tracing::error!(
                    session_id = %job.guard.session_id(), turn = job.guard.turn(), error = %e,
                    "capture failed: the turn could not be rendered or tokenized"
                );
                let mut job = job;
                job.guard.set_reason(e.reason());
            }
            Err(e @ CaptureError::Refused { .. }) => {
                let reason = e.reason();
                metrics::counter!(m::CAPTURE_TOTAL, "outcome" => reason).increment(1);
                if stats.first_time(reason) {
                    tracing::warn!(
                        session_id = %job.guard.session_id(), turn = job.guard.turn(), reason, error = %e,
                        "turn not trained on: it cannot become a correct sample (logged once per reason; \
                         counted in /v1/rollout/status turns_abandoned_by_reason)"
                    );
                }
                let mut job = job;
                job.guard.set_reason(reason);
            }
        }
    }
}
