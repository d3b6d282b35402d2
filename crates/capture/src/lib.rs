//! Capture: from a finished answer and the request it answered to a captured turn handed to a
//! `TurnSink` — the engine's own ids taken as they are (checked), or the turn rendered with the
//! policy's chat template and tokenized exactly as `transformers` would and the log-probs aligned
//! to those tokens; the session's prefix cache; the sampled drift check of engine ids against
//! our render. The server hands it the request's parts and the answer ([`CaptureQueue::submit`])
//! and knows nothing else of it.
//!
//! The work runs on dedicated threads fed by a bounded queue, so that the chat path never waits
//! for it and a long conversation cannot stall other clients. A full queue drops the turn
//! (counted and logged), it never blocks a request.
//!
//! Longer than the ~600 lines we aim for: about 300 are the unit tests at the end, which drive
//! the private steps (engine ids, re-tokenization, the drift check, the prefix cache) directly;
//! the code itself is one pipeline (job → turn → sink) with the queue that feeds it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ps_chat_template::{
    ChatTemplateError, ChatTokenizer, EncodedPrefix, ImageLimits, SharedPrefixCache, TurnInput,
};
use ps_core::modes::TokenIdsMode;
use ps_core::{
    AlignPolicy, Alignment, CapturedTurn, JsonText, PositionSource, RolloutResponse, TokenSource,
    TurnGuard, TurnSink, WeightVersion, align_logprobs,
};
use serde_json::{Map, Value};

use ps_core::metric_names as m;

/// The parts of a request that capture needs, as the client sent them: parsed into a job's
/// `messages`, `tools` and `template_kwargs` on the capture thread that takes the job, so that the
/// chat path builds no tree of them. With a non-streamed answer, the answer too: its rollout
/// (message, sampled tokens, log-probs, the engine's ids, finish, weight version) is read into
/// the job's `rollout` there, not on the chat path.
#[derive(Debug)]
pub struct RequestJson {
    /// `messages` (an array): its JSON text, a slice of the client's body.
    pub messages: Bytes,
    /// `tools`, unless absent or null.
    pub tools: Option<Bytes>,
    /// `chat_template_kwargs`, when an object.
    pub template_kwargs: Option<Bytes>,
    /// The upstream's whole answer (its bytes, shared), when the job's `rollout` is still to be
    /// read from it.
    pub answer: Option<ps_sglang_client::Answer>,
}

impl RequestJson {
    /// Parses the parts into `job`. The request was validated on the chat path, so this fails
    /// only if that validation let through what a tree parse refuses; the turn is then
    /// abandoned as `request_unreadable`, never rendered without its tools or messages.
    fn fill(self, job: &mut CaptureJob) -> Result<(), CaptureError> {
        let unreadable = |part: &str, e: serde_json::Error| CaptureError::Refused {
            reason: "request_unreadable",
            detail: format!("the request's `{part}` could not be read: {e}"),
        };
        job.messages =
            serde_json::from_slice(&self.messages).map_err(|e| unreadable("messages", e))?;
        job.tools = self
            .tools
            .as_ref()
            .map(|t| serde_json::from_slice::<Value>(t))
            .transpose()
            .map_err(|e| unreadable("tools", e))?;
        // The turn keeps these texts instead of writing the trees out again (`captured_turn`).
        job.texts = Some(RequestTexts {
            messages: self.messages,
            tools: self.tools,
        });
        job.template_kwargs = self
            .template_kwargs
            .map(|k| serde_json::from_slice::<Map<String, Value>>(&k))
            .transpose()
            .map_err(|e| unreadable("chat_template_kwargs", e))?;
        if let Some(answer) = self.answer {
            // The chat path refused what a tree parse refuses, so this is not expected either; a
            // part that cannot be read abandons the turn rather than leave it out of the sample.
            job.rollout = answer.rollout().map_err(|e| CaptureError::Refused {
                reason: "answer_unreadable",
                detail: format!("the upstream's answer could not be read: {e}"),
            })?;
        }
        Ok(())
    }
}

/// What the queue carries: a job, with its request's parts still as JSON text when they are,
/// and the bytes it is counted for in [`QueueBytes`].
type Queued = (CaptureJob, Option<RequestJson>, usize);

/// About how many bytes a queued job holds: its request's JSON text and the upstream's answer
/// (whole, or its rollout when assembled from a stream). What bounds the queue's memory
/// (`capture.max_queued_mib`): when capture falls behind the chat path, the jobs waiting for a
/// worker are what grows (a heap profile of the agent benchmark at its peak: ~140 kB a turn,
/// the client's `messages` and an answer carrying 10,000–20,000 prompt ids).
fn queued_bytes(job: &CaptureJob, request: Option<&RequestJson>) -> usize {
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
    request + ids + tokens + message
}

/// What the capture queue holds now, at most, and its byte bound.
#[derive(Debug, Default)]
pub struct QueueBytes {
    turns: AtomicUsize,
    bytes: AtomicUsize,
    peak_bytes: AtomicUsize,
    max_bytes: AtomicUsize,
}

impl QueueBytes {
    /// Counts a job in, unless it would take the queue past its bound (a job is always let into
    /// an empty queue, however large: one turn alone cannot be refused for the queue's size).
    fn take(&self, n: usize) -> bool {
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
    fn give(&self, n: usize) {
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
    /// `sglang.token_ids`, and whether the engine was asked for its ids (non-streamed calls).
    pub token_ids: TokenIdsMode,
    pub asked_for_ids: bool,
    /// The version the trainer announced at its last resume, for answers that carry none.
    pub trainer_weight_version: Option<String>,
    /// How the session was found (header, body, inferred, fork), for the sample's metadata.
    pub origin: ps_core::SessionOrigin,
    /// The JSON texts `messages` and `tools` were parsed from, when they were (set by the capture
    /// thread); `None`: the trees are written out as text for the captured turn.
    pub texts: Option<RequestTexts>,
}

/// The client's own JSON texts of a job's `messages` and `tools`. They must parse to the job's
/// trees (`serde_json::from_slice`): the captured turn holds them in the trees' place, and every
/// reader parses them back (only the capture thread's `RequestJson::fill` sets them in the
/// product).
#[derive(Debug, Clone)]
pub struct RequestTexts {
    pub messages: Bytes,
    pub tools: Option<Bytes>,
}

/// `text` (which parses to `tree`) as the turn's `JsonText`, else `tree` written out: also when
/// the text is much larger than what `serde_json` writes, i.e. it escapes characters as `\uXXXX`
/// (Python's `json.dumps` default: 6 bytes for a CJK character instead of 3) or is pretty-printed
/// (line breaks between values), since the turn holds it until it becomes a sample.
fn held_text<T>(text: Option<&Bytes>, tree: &T) -> JsonText<T>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    match text.map(|t| std::str::from_utf8(t)) {
        Some(Ok(t)) if !t.contains("\\u") && !t.contains('\n') => JsonText::from_parsed_text(t),
        _ => JsonText::new(tree),
    }
}

/// Why a turn cannot become a correct sample (it is abandoned with `reason`).
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error(transparent)]
    Template(#[from] ChatTemplateError),
    #[error("{detail}")]
    Refused {
        reason: &'static str,
        detail: String,
    },
}

impl CaptureError {
    fn reason(&self) -> &'static str {
        match self {
            Self::Template(_) => "render_failed",
            Self::Refused { reason, .. } => reason,
        }
    }
}

/// Engine-id turns re-tokenized to check that our template and tokenizer agree with the engine:
/// the first `first` of the process, then one in `every`. Each comparison of a prompt is also
/// recorded in [`DriftCheck::engine_prompts`], which the OPD teacher path reads.
#[derive(Debug, Default)]
pub struct DriftCheck {
    first: u64,
    every: u64,
    seen: AtomicU64,
    checked: AtomicU64,
    drifted: AtomicU64,
    last: std::sync::Mutex<Option<serde_json::Value>>,
    prompts: ps_core::EnginePrompts,
}

impl DriftCheck {
    pub fn new(first: u64, every: u64) -> Self {
        Self {
            first,
            every,
            ..Self::default()
        }
    }

    /// What the prompt comparisons found, shared (clones see later comparisons).
    pub fn engine_prompts(&self) -> ps_core::EnginePrompts {
        self.prompts.clone()
    }

    fn due(&self) -> bool {
        let n = self.seen.fetch_add(1, Ordering::Relaxed);
        n < self.first || (self.every > 0 && (n - self.first).is_multiple_of(self.every))
    }
}

/// What capture counted: where ids came from, fallbacks, drift.
#[derive(Debug, Default)]
pub struct CaptureStats {
    pub engine: AtomicU64,
    pub retokenized: AtomicU64,
    /// Turns whose engine was asked for ids and answered without them.
    pub engine_ids_missing: AtomicU64,
    pub drift: DriftCheck,
    /// Refusal reasons already explained in the log (each is logged once with its fix).
    explained: std::sync::Mutex<std::collections::HashSet<&'static str>>,
    /// `capture.max_image_mib` in bytes and `capture.max_images_per_turn` (0: the defaults).
    max_image_bytes: AtomicUsize,
    max_images: AtomicUsize,
    /// The sample store does not keep images (`SampleLog::keeps_images`): turns with images are
    /// refused even for a vision-language model.
    store_without_images: std::sync::atomic::AtomicBool,
}

impl CaptureStats {
    pub fn new(drift: DriftCheck) -> Self {
        Self {
            drift,
            ..Self::default()
        }
    }

    /// Bounds on a turn's images (`capture.max_image_mib`, `capture.max_images_per_turn`).
    pub fn set_image_limits(&self, limits: ImageLimits) {
        self.max_image_bytes
            .store(limits.max_image_bytes, Ordering::Relaxed);
        self.max_images.store(limits.max_images, Ordering::Relaxed);
    }

    /// Whether the sample store keeps images (set by the composition root; true by default).
    pub fn set_store_keeps_images(&self, keeps: bool) {
        self.store_without_images.store(!keeps, Ordering::Relaxed);
    }

    /// Whether turns with images are captured with `tok`: it is a vision-language model and the
    /// store keeps images.
    pub fn captures_images(&self, tok: &ChatTokenizer) -> bool {
        self.captures_images_of(tok.vision().is_some())
    }

    /// [`Self::captures_images`] of a model that has vision or not.
    fn captures_images_of(&self, vision: bool) -> bool {
        vision && !self.store_without_images.load(Ordering::Relaxed)
    }

    /// The bounds in effect.
    pub fn image_limits(&self) -> ImageLimits {
        let d = ImageLimits::default();
        let or = |v: usize, d: usize| if v == 0 { d } else { v };
        ImageLimits {
            max_image_bytes: or(
                self.max_image_bytes.load(Ordering::Relaxed),
                d.max_image_bytes,
            ),
            max_images: or(self.max_images.load(Ordering::Relaxed), d.max_images),
        }
    }

    /// `/v1/rollout/status`'s `token_ids` section.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "engine": self.engine.load(Ordering::Relaxed),
            "retokenized": self.retokenized.load(Ordering::Relaxed),
            "engine_ids_missing": self.engine_ids_missing.load(Ordering::Relaxed),
            "drift_checked": self.drift.checked.load(Ordering::Relaxed),
            "drift": self.drift.drifted.load(Ordering::Relaxed),
            "last_drift": self.drift.last.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            "engine_prompts_agree": self.drift.prompts.agree(),
        })
    }

    /// Whether `reason` is logged for the first time (then with its fix).
    fn first_time(&self, reason: &'static str) -> bool {
        self.explained
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(reason)
    }
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
/// A session's first turn reuses the system prompt and tools another session encoded
/// (`shared`, bounded by bytes).
pub struct PrefixCache {
    map: std::sync::Mutex<HashMap<String, CachedPrefix>>,
    shared: SharedPrefixCache,
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
            shared: SharedPrefixCache::default(),
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
) -> Result<CapturedTurn, CaptureError> {
    capture_turn_with(tok, job, policy, None, &CaptureStats::default())
}

/// [`capture_turn`], encoding the prompt incrementally from the session's previous prompt, and
/// counting in `stats`. A turn whose engine returned its own ids takes them (no re-tokenization,
/// every position its own log-prob); otherwise it is re-rendered and re-tokenized
/// (docs/architecture.md, "Where a turn's ids come from").
pub fn capture_turn_with(
    tok: &ChatTokenizer,
    job: &CaptureJob,
    policy: AlignPolicy,
    cache: Option<&PrefixCache>,
    stats: &CaptureStats,
) -> Result<CapturedTurn, CaptureError> {
    // A prompt with audio, a video, a file or any part that is not text (nor an image, for a
    // vision-language model) is not captured exactly (not even on the engine's ids, which hold
    // its pads but not what the trainer needs): the turn is dropped with its reason, whichever
    // path its ids would take. A VL model's images are read and counted here; one that cannot
    // be read exactly drops the turn with its reason too.
    let images_captured = stats.captures_images(tok);
    if let Some((reason, mut detail)) =
        ps_core::message::unsupported_part_with(&job.messages, images_captured)
    {
        if reason == "image_unsupported" && tok.vision().is_some() {
            detail.push_str(
                " (the model takes images, but the sample store does not keep them \
                 (SampleLog::keeps_images): use the embedded or the Redis store to train on \
                 image turns)",
            );
        }
        return Err(CaptureError::Refused { reason, detail });
    }
    let images = tok
        .images(&job.messages, &stats.image_limits())
        .map_err(|e| CaptureError::Refused {
            reason: e.reason(),
            detail: e.to_string(),
        })?;
    let pads: Vec<usize> = images.iter().map(|i| i.tokens).collect();
    let sample_images = || {
        images
            .iter()
            .map(|i| ps_core::sample::SampleImage {
                hash: i.image.hash.clone(),
                mime: i.image.mime.clone(),
                width: i.image.width,
                height: i.image.height,
                tokens: i.tokens,
                bytes: Some(i.image.bytes.clone()),
            })
            .collect::<Vec<_>>()
    };
    let rollout = &job.rollout;
    let weight_version = match (&rollout.weight_version, &job.trainer_weight_version) {
        (Some(v), _) => Some(WeightVersion {
            version: v.clone(),
            source: "engine".into(),
        }),
        (None, Some(v)) => Some(WeightVersion {
            version: v.clone(),
            source: "trainer".into(),
        }),
        (None, None) => None,
    };
    let use_engine = job.token_ids != TokenIdsMode::Retokenize;
    let engine = match (use_engine, &rollout.engine_ids) {
        (true, Some(ids)) => match engine_turn(tok, job, ids) {
            // A stream without parsers loses the end-of-turn token's log-prob while its sglext ids
            // include the token: under `auto` such a turn is re-tokenized (its placeholder marked
            // and counted) rather than lost; `engine` refuses it.
            Err(e @ CaptureError::Refused { .. }) if job.token_ids == TokenIdsMode::Auto => {
                if stats.first_time("engine_logprob_count_mismatch") {
                    tracing::warn!(
                        session_id = %job.guard.session_id(), turn = job.guard.turn(), error = %e,
                        "the engine's ids and its log-probs differ in number: re-tokenizing such turns \
                         (logged once)"
                    );
                }
                None
            }
            other => Some(other?),
        },
        _ => None,
    };
    if let Some(mut turn) = engine {
        if let Some(v) = tok.vision() {
            check_engine_pads(&turn.prompt_ids, v, &pads)?;
        }
        turn.images = sample_images();
        turn.weight_version = weight_version;
        if let (Some(cache), true) = (cache, job.session_done) {
            cache.forget(job.guard.session_id());
        }
        if stats.drift.due() {
            check_drift(tok, job, &turn, &pads, cache, &stats.drift)?;
        }
        turn.engine_prompts_agreed = stats.drift.prompts.agree();
        stats.engine.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(m::TOKEN_SOURCE_TOTAL, "source" => "engine").increment(1);
        return Ok(turn);
    }
    if job.asked_for_ids && rollout.engine_ids.is_none() {
        stats.engine_ids_missing.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(m::ENGINE_IDS_MISSING_TOTAL).increment(1);
        let engine_only = job.token_ids == TokenIdsMode::Engine;
        if stats.first_time("no_engine_ids") {
            tracing::warn!(
                session_id = %job.guard.session_id(), turn = job.guard.turn(),
                "the policy server was asked for its token ids (return_token_ids) and answered without \
                 them: an SGLang build before July 2026, or a router that strips them. {} \
                 (logged once; counted as engine_ids_missing in /v1/rollout/status)",
                if engine_only {
                    "sglang.token_ids = \"engine\": such turns give no sample; upgrade SGLang or use \"auto\""
                } else {
                    "Falling back to exact re-tokenization for such turns"
                }
            );
        }
        if engine_only {
            return Err(CaptureError::Refused {
                reason: "no_engine_ids",
                detail: "the engine returned no token ids and sglang.token_ids = \"engine\"".into(),
            });
        }
    } else if job.token_ids == TokenIdsMode::Engine {
        return Err(CaptureError::Refused {
            reason: "no_engine_ids",
            detail: "the answer carries no engine token ids (a streamed answer without sglext ids, or \
                     the client's own return_token_ids: false) and sglang.token_ids = \"engine\"; set \
                     sglang.stream = false so the upstream call is whole"
                .into(),
        });
    }
    if rollout.streamed && stream_logprobs_incomplete(rollout) {
        return Err(CaptureError::Refused {
            reason: "stream_logprobs_missing",
            detail: format!(
                "the streamed answer's log-probs do not explain its text ({} characters without a \
                 reported token, {} log-probs in all): this SGLang build drops them with a reasoning or \
                 tool parser. Set sglang.stream = false so the upstream call is whole and every token's \
                 log-prob comes back",
                rollout.unexplained_chars,
                rollout.tokens.len()
            ),
        });
    }
    let mut turn = retokenized_turn(tok, job, &pads, policy, cache)?;
    // Re-tokenized pads are this model's processor's counts: where the engine says how many
    // prompt tokens it used (`usage.prompt_tokens`), an image turn must come to the same number,
    // or the engine resized its images otherwise.
    if let (false, Some(engine)) = (pads.is_empty(), rollout.prompt_tokens)
        && engine != turn.prompt_ids.len() as u64
    {
        return Err(CaptureError::Refused {
            reason: "image_pad_mismatch",
            detail: format!(
                "the engine used {engine} prompt tokens where this model's processor gives {} \
                 (its images expanded to {pads:?} pads): the engine resizes images otherwise \
                 than preprocessor_config.json in the model directory; serve both with the \
                 same processor settings",
                turn.prompt_ids.len()
            ),
        });
    }
    turn.images = sample_images();
    turn.weight_version = weight_version;
    stats.retokenized.fetch_add(1, Ordering::Relaxed);
    metrics::counter!(m::TOKEN_SOURCE_TOTAL, "source" => "retokenized").increment(1);
    Ok(turn)
}

/// Unexplained text tolerated in a streamed answer: bytes the detokenizer held back can shift a few
/// characters between chunks.
const UNEXPLAINED_SLACK_CHARS: usize = 8;

/// A streamed answer whose log-probs cannot explain its text: text beyond what the reported tokens
/// spell (more than a few characters and a twentieth of the text), or no log-prob at all for a
/// non-empty answer. Builds that put a step's log-probs on its first chunk pass; builds that send
/// reasoning or tool-call chunks with `logprobs: null` do not.
fn stream_logprobs_incomplete(rollout: &RolloutResponse) -> bool {
    let text: usize = ["content", "reasoning_content"]
        .iter()
        .filter_map(|k| rollout.message.get(*k).and_then(serde_json::Value::as_str))
        .map(|s| s.chars().count())
        .sum();
    let has_text = text > 0
        || rollout
            .message
            .get("tool_calls")
            .and_then(serde_json::Value::as_array)
            .is_some_and(|c| !c.is_empty());
    let unexplained = rollout.unexplained_chars;
    (unexplained > UNEXPLAINED_SLACK_CHARS && unexplained * 20 > text)
        || (has_text && rollout.tokens.is_empty())
}

fn turn_input(job: &CaptureJob) -> TurnInput<'_> {
    TurnInput {
        messages: &job.messages,
        tools: job.tools.as_ref(),
        response_message: &job.rollout.message,
        template_kwargs: job.template_kwargs.as_ref(),
    }
}

/// A turn from the engine's own ids: tokens = engine prompt + response ids, one engine log-prob per
/// response id. The texts are still rendered with the template (what the judges read).
fn engine_turn(
    tok: &ChatTokenizer,
    job: &CaptureJob,
    ids: &ps_core::EngineIds,
) -> Result<CapturedTurn, CaptureError> {
    let rollout = &job.rollout;
    if ids.response.len() != rollout.tokens.len() {
        return Err(CaptureError::Refused {
            reason: "engine_logprob_count_mismatch",
            detail: format!(
                "the engine returned {} response ids ({}) but {} log-probs: no exact log-prob per token",
                ids.response.len(),
                ids.field,
                rollout.tokens.len()
            ),
        });
    }
    let texts = tok.render_turn(&turn_input(job))?;
    let n = ids.response.len();
    let alignment = Alignment {
        logprobs: rollout.tokens.iter().map(|t| Some(t.logprob)).collect(),
        sources: vec![PositionSource::Sampled; n],
        loss_mask: vec![1; n],
        matched_by_ids: true,
        unmatched_upstream: 0,
        first_unmatched_upstream: None,
    };
    Ok(captured_turn(
        job,
        texts,
        (ids.prompt.clone(), ids.response.clone()),
        alignment,
        TokenSource::Engine,
    ))
}

/// The captured turn of `job`, whichever path gave its ids (the policy version is set by the
/// caller).
fn captured_turn(
    job: &CaptureJob,
    texts: ps_chat_template::TurnTexts,
    (prompt_ids, response_ids): (Vec<u32>, Vec<u32>),
    alignment: Alignment,
    token_source: TokenSource,
) -> CapturedTurn {
    CapturedTurn {
        images: Vec::new(),
        session_id: job.guard.session_id().to_owned(),
        turn: job.guard.turn(),
        arrival_seq: job.arrival_seq,
        // Held as JSON text while the turn waits for its sample (a tree of a 56 kB `messages`
        // array takes ~4–5 times that); the job's trees are dropped with the job. The client's
        // own texts when the capture thread parsed them: writing the trees out again cost ~2.7 %
        // of the proxy's CPU in the agent benchmark.
        messages: held_text(job.texts.as_ref().map(|t| &t.messages), &job.messages),
        tools: job
            .tools
            .as_ref()
            .map(|tree| held_text(job.texts.as_ref().and_then(|t| t.tools.as_ref()), tree)),
        template_kwargs: job.template_kwargs.as_ref().map(JsonText::new),
        response_message: job.rollout.message.clone(),
        prompt_text: texts.prompt_text,
        response_text: texts.response_text,
        prompt_is_prefix: texts.prompt_is_prefix,
        prompt_ids,
        response_ids,
        alignment,
        finish_reason: job.rollout.finish.reason.clone(),
        streamed: job.rollout.streamed,
        token_source,
        weight_version: None,
        origin: job.origin.clone(),
        engine_prompts_agreed: false,
    }
}

/// The engine's prompt ids must hold one run of image pad tokens per image, each as long as the
/// model's processor makes it: otherwise the engine expanded the images with other processor
/// settings than `preprocessor_config.json` (a sample whose prompt the trainer's processor would
/// not match), and the turn is dropped (`image_pad_mismatch`).
fn check_engine_pads(
    prompt: &[u32],
    vision: &ps_chat_template::Vision,
    pads: &[usize],
) -> Result<(), CaptureError> {
    let runs = vision.pad_runs(prompt);
    if runs == pads {
        return Ok(());
    }
    Err(CaptureError::Refused {
        reason: "image_pad_mismatch",
        detail: format!(
            "the engine's prompt holds runs of {runs:?} image pad tokens where the model's \
             processor gives {pads:?}: the engine resizes images otherwise than \
             preprocessor_config.json in the model directory (its min/max pixels, e.g. \
             --mm-processor-kwargs); serve both with the same processor settings"
        ),
    })
}

/// Re-tokenizes an engine-id turn and compares: the prompt ids must be equal, and every sampled id
/// must find its place in the re-rendered response. A difference is counted and the first one kept
/// (position and both token texts) for `/v1/rollout/status`.
fn check_drift(
    tok: &ChatTokenizer,
    job: &CaptureJob,
    engine: &CapturedTurn,
    pads: &[usize],
    cache: Option<&PrefixCache>,
    drift: &DriftCheck,
) -> Result<(), CaptureError> {
    let session_id = job.guard.session_id();
    let prev = cache.and_then(|c| c.get(session_id));
    let shared = cache.map(|c| &c.shared);
    let (mut ours, next) = tok.split_turn_cached(&turn_input(job), prev.as_deref(), shared)?;
    if !pads.is_empty() {
        ours.prompt_ids = tok.expand_image_pads(&ours.prompt_ids, pads)?;
    }
    if let (Some(cache), Some(next)) = (cache, next)
        && !job.session_done
    {
        cache.put(session_id, next);
    }
    drift.checked.fetch_add(1, Ordering::Relaxed);
    let first_diff = |a: &[u32], b: &[u32]| {
        a.iter()
            .zip(b)
            .position(|(x, y)| x != y)
            .or_else(|| (a.len() != b.len()).then(|| a.len().min(b.len())))
    };
    let text = |ids: &[u32], i: usize| ids.get(i).map(|&id| tok.token_text(id));
    let prompt_diff = first_diff(&engine.prompt_ids, &ours.prompt_ids);
    let first_prompt_difference = drift.prompts.record(prompt_diff.is_none());
    // An answer's text holds all it sampled only when it stopped by itself: one cut by
    // `max_tokens` may end inside what a parser holds back (a tool call's head, a call whose
    // arguments are not yet an object) or inside a character (whose bytes the detokenizer never
    // sends), and one stopped by a stop string leaves the string out of its text. Such a response
    // is not compared, only its prompt.
    let finish = &job.rollout.finish;
    let text_incomplete =
        finish.reason.as_deref() == Some("length") || finish.matched_stop.is_string();
    // A tool call whose arguments the model wrote otherwise than the template writes them back
    // (the template prints the parsed object with `tojson`; a grammar-forced call may space or
    // escape its JSON differently): no render of the answer holds the sampled text, so the
    // response is not comparable either (the engine renders it the same way in the next prompt,
    // which the prompt check compares).
    let rewritten_arguments = job
        .rollout
        .message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("function")?.get("arguments")?.as_str())
        .any(|args| !ours.response_text.contains(args.trim()));
    let found = if let Some(i) = prompt_diff {
        Some((
            "prompt",
            i,
            text(&engine.prompt_ids, i),
            text(&ours.prompt_ids, i),
        ))
    } else if text_incomplete || rewritten_arguments {
        None
    } else {
        // The response is compared as text: the engine's sampled ids decoded together must all
        // stand, in order, in the response our template renders from the answer (which may add
        // what was not sampled: an empty think block, the newline after the end token). Ids are
        // not comparable here: sampled byte-level tokens need not be what the decoded text
        // encodes back to (a model may sample the bytes of a character apart, or merges the
        // tokenizer would not make), so an exact engine and template would still differ by id.
        // Decoded as the engine wrote the answer's text, without special tokens: a model may
        // sample them anywhere (a random one does) and stop on any of its stop tokens (Qwen3:
        // `<|im_end|>` or `<|endoftext|>`), and the template writes its own end marker.
        let engine_text = tok.decode(&engine.response_ids, true);
        first_unexplained_char(&engine_text, &ours.response_text).map(|i| {
            let around: String = engine_text.chars().skip(i).take(16).collect();
            ("response", i, Some(around), None)
        })
    };
    if let Some((part, position, engine_token, ours_token)) = found {
        let first = drift.drifted.fetch_add(1, Ordering::Relaxed) == 0;
        metrics::counter!(m::RETOKENIZE_DRIFT_TOTAL, "part" => part).increment(1);
        let record = serde_json::json!({
            "session_id": session_id,
            "turn": job.guard.turn(),
            "part": part,
            "position": position,
            "engine_token": engine_token,
            "retokenized_token": ours_token,
        });
        // Once for the first difference, and once more for the first prompt that differs (the
        // OPD teacher path stops building on engines' prompt ids then).
        if first || first_prompt_difference {
            let teacher = if first_prompt_difference {
                "; a prompt differed: in OPD and Combine mode the teacher encodes prompt texts \
                 itself from now on"
            } else {
                ""
            };
            tracing::warn!(
                session_id,
                turn = job.guard.turn(),
                part,
                position,
                ?engine_token,
                ?ours_token,
                "re-tokenizing an engine-id turn gives other ids than the engine used: the chat template \
                 or tokenizer here differs from the engine's (samples use the engine's ids; counted as \
                 retokenize_drift_total, the latest in /v1/rollout/status){teacher}"
            );
        }
        *drift.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(record);
    }
    Ok(())
}

/// The first character of `engine` (by index) that does not stand, in order, in `ours`: a
/// character-level diff in which `ours` may add text but not drop or change any of `engine`'s.
/// Bounded in time (a pathological pair is compared coarsely past the deadline, never wrongly
/// declared equal).
fn first_unexplained_char(engine: &str, ours: &str) -> Option<usize> {
    use similar::{Algorithm, DiffOp, capture_diff_slices_deadline};
    let e: Vec<char> = engine.chars().collect();
    let o: Vec<char> = ours.chars().collect();
    let deadline = Instant::now() + Duration::from_millis(200);
    capture_diff_slices_deadline(Algorithm::Myers, &e, &o, Some(deadline))
        .into_iter()
        .find_map(|op| match op {
            DiffOp::Delete { old_index, .. } | DiffOp::Replace { old_index, .. } => Some(old_index),
            DiffOp::Equal { .. } | DiffOp::Insert { .. } => None,
        })
}

/// A turn re-rendered and re-tokenized, its log-probs aligned to the tokens.
fn retokenized_turn(
    tok: &ChatTokenizer,
    job: &CaptureJob,
    pads: &[usize],
    policy: AlignPolicy,
    cache: Option<&PrefixCache>,
) -> Result<CapturedTurn, CaptureError> {
    let session_id = job.guard.session_id();
    let prev = cache.and_then(|c| c.get(session_id));
    let (mut tokens, next) = tok.split_turn_cached(
        &TurnInput {
            messages: &job.messages,
            tools: job.tools.as_ref(),
            response_message: &job.rollout.message,
            template_kwargs: job.template_kwargs.as_ref(),
        },
        prev.as_deref(),
        cache.map(|c| &c.shared),
    )?;
    match (cache, next) {
        (Some(cache), _) if job.session_done => cache.forget(session_id),
        (Some(cache), Some(next)) => cache.put(session_id, next),
        _ => {}
    }
    // The template wrote one pad per image; the processor repeats each to its image's count (the
    // cached prefix keeps the rendered text's own ids: the next turn expands again).
    if !pads.is_empty() {
        tokens.prompt_ids = tok.expand_image_pads(&tokens.prompt_ids, pads)?;
    }
    let alignment = align_logprobs(
        &tokens.response_ids,
        |id| tok.token_text(id),
        &job.rollout.tokens,
        &job.rollout.finish,
        tok.eos_token_id(),
        policy,
    );
    Ok(captured_turn(
        job,
        ps_chat_template::TurnTexts {
            prompt_text: tokens.prompt_text,
            full_text: tokens.full_text,
            response_text: tokens.response_text,
            prompt_is_prefix: tokens.prompt_is_prefix,
        },
        (tokens.prompt_ids, tokens.response_ids),
        alignment,
        TokenSource::Retokenized,
    ))
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
    stats: Arc<CaptureStats>,
    max_turn_tokens: Arc<std::sync::atomic::AtomicUsize>,
    prefixes: Arc<PrefixCache>,
    queued: Arc<QueueBytes>,
    /// The policy is a vision-language model (its images are captured when the store keeps
    /// them: [`CaptureStats::captures_images`]).
    vision: bool,
    tx: std::sync::Mutex<Option<SyncSender<Queued>>>,
    workers: std::sync::Mutex<Vec<JoinHandle<usize>>>,
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
    fn refuse(&self, mut job: CaptureJob, kind: &'static str, why: &str, helps: &str) -> bool {
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

    fn enqueue(&self, (mut job, request, n): Queued) -> bool {
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
struct Limits<'a> {
    max_turn_tokens: &'a AtomicUsize,
    queued: &'a QueueBytes,
}

fn worker(
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
                ..RolloutResponse::default()
            },
            session_done,
            token_ids: TokenIdsMode::Auto,
            asked_for_ids: false,
            trainer_weight_version: None,
            origin: Default::default(),
            texts: None,
        }
    }

    fn policy() -> AlignPolicy {
        AlignPolicy::default()
    }

    /// A re-tokenized image turn's prompt must come to the engine's own count of prompt tokens
    /// when the answer states it: otherwise the engine resized the image otherwise than this
    /// model's processor (`image_pad_mismatch`), never a sample with other pads than it used.
    /// The engine's ids with another run of pads are refused the same way.
    #[test]
    fn an_image_turn_whose_pads_the_engine_did_not_use_is_refused() {
        use base64::Engine as _;
        let tok = ChatTokenizer::mini_vl();
        let png = [
            0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 13, b'I', b'H', b'D', b'R', 0,
            0, 0, 64, 0, 0, 0, 48, 8, 2, 0, 0, 0, 0, 0, 0, 0,
        ];
        let url = format!(
            "data:image/png;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(png)
        );
        let history = vec![json!({"role": "user", "content": [
            {"type": "text", "text": "What is it?"},
            {"type": "image_url", "image_url": {"url": url}}]})];
        let run = |prompt_tokens: Option<u64>| {
            let mut j = job("i", 1, &history, false);
            j.rollout.prompt_tokens = prompt_tokens;
            capture_turn_with(&tok, &j, policy(), None, &CaptureStats::default())
        };
        let ok = run(None).unwrap();
        let pad = tok.vision().unwrap().image_pad_id;
        assert_eq!(ok.images.len(), 1);
        assert_eq!(
            ok.prompt_ids.iter().filter(|&&t| t == pad).count(),
            ok.images[0].tokens
        );
        let n = ok.prompt_ids.len() as u64;
        assert!(run(Some(n)).is_ok(), "the engine's count agrees");
        for other in [n - 1, n + 12] {
            match run(Some(other)) {
                Err(CaptureError::Refused { reason, detail }) => {
                    assert_eq!(reason, "image_pad_mismatch");
                    assert!(detail.contains("preprocessor_config.json"), "{detail}");
                }
                r => panic!("{other}: {r:?}"),
            }
        }
        // The engine's own ids with a run of pads of another length.
        let mut prompt = ok.prompt_ids.clone();
        let at = prompt.iter().position(|&t| t == pad).unwrap();
        prompt.insert(at, pad);
        let eos = tok.eos_token_id().unwrap();
        let mut j = engine_job(&tok, Some((prompt, vec![eos])), 1);
        j.messages = history.clone();
        match capture_turn_with(&tok, &j, policy(), None, &CaptureStats::default()) {
            Err(CaptureError::Refused { reason, .. }) => assert_eq!(reason, "image_pad_mismatch"),
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn a_session_closed_by_its_client_leaves_no_cached_prefix() {
        let tok = ChatTokenizer::mini();
        let cache = PrefixCache::default();
        let mut history = vec![json!({"role": "user", "content": "First question"})];
        capture_turn_with(
            &tok,
            &job("a", 1, &history, false),
            policy(),
            Some(&cache),
            &CaptureStats::default(),
        )
        .unwrap();
        capture_turn_with(
            &tok,
            &job("b", 1, &history, false),
            policy(),
            Some(&cache),
            &CaptureStats::default(),
        )
        .unwrap();
        assert_eq!(cache.len(), 2, "each open session keeps its last prompt");
        history.push(json!({"role": "assistant", "content": "Answer 1."}));
        history.push(json!({"role": "user", "content": "Second question"}));
        let done = capture_turn_with(
            &tok,
            &job("a", 2, &history, true),
            policy(),
            Some(&cache),
            &CaptureStats::default(),
        )
        .unwrap();
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

    /// A job whose engine returned `prompt` and `response` ids with one log-prob per response id
    /// (`logprobs` of them).
    fn engine_job(
        tok: &ChatTokenizer,
        ids: Option<(Vec<u32>, Vec<u32>)>,
        logprobs: usize,
    ) -> CaptureJob {
        let history = vec![json!({"role": "user", "content": "First question"})];
        let mut j = job("e", 1, &history, false);
        let response = ids.as_ref().map_or_else(Vec::new, |(_, r)| r.clone());
        j.rollout.tokens = (0..logprobs)
            .map(|i| ps_core::SampledToken {
                token: response
                    .get(i)
                    .map(|&id| tok.token_text(id))
                    .unwrap_or_default(),
                id: response.get(i).copied(),
                logprob: -0.1 * (i + 1) as f64,
            })
            .collect();
        j.rollout.engine_ids = ids.map(|(prompt, response)| ps_core::EngineIds {
            prompt,
            response,
            field: "response_token_ids".into(),
        });
        j.asked_for_ids = true;
        j
    }

    /// The ids an engine with our very template and tokenizer would use for `engine_job`'s turn.
    fn true_ids(tok: &ChatTokenizer) -> (Vec<u32>, Vec<u32>) {
        let j = job(
            "e",
            1,
            &[json!({"role": "user", "content": "First question"})],
            false,
        );
        let t = tok.split_turn(&turn_input(&j)).unwrap();
        // The engine samples the answer and stops on the end-of-turn token; the template's newline
        // after it is never sampled.
        let eos = tok.eos_token_id().unwrap();
        let end = t.response_ids.iter().rposition(|&id| id == eos).unwrap();
        (t.prompt_ids, t.response_ids[..=end].to_vec())
    }

    #[test]
    fn an_engine_id_turn_takes_the_engines_ids_and_every_log_prob() {
        let tok = ChatTokenizer::mini();
        let (prompt, response) = true_ids(&tok);
        let stats = CaptureStats::new(DriftCheck::new(10, 0));
        let engine_prompts = stats.drift.engine_prompts();
        assert!(!engine_prompts.agree(), "no prompt compared yet");
        let j = engine_job(
            &tok,
            Some((prompt.clone(), response.clone())),
            response.len(),
        );
        let t = capture_turn_with(&tok, &j, policy(), None, &stats).unwrap();
        assert_eq!(t.token_source, TokenSource::Engine);
        assert_eq!(
            (t.prompt_ids, t.response_ids.clone()),
            (prompt, response.clone())
        );
        assert_eq!(t.alignment.loss_mask, vec![1; response.len()]);
        assert_eq!(
            t.alignment.marked(),
            0,
            "every position has its own log-prob"
        );
        assert_eq!(t.alignment.logprobs[0], Some(-0.1));
        assert!(
            t.response_text.ends_with("<|im_end|>\n"),
            "the judges read the rendering"
        );
        let st = stats.to_json();
        assert_eq!(
            (st["engine"].as_u64(), st["drift_checked"].as_u64()),
            (Some(1), Some(1))
        );
        assert_eq!(st["drift"], 0, "same template and tokenizer: no drift");
        assert_eq!(st["engine_prompts_agree"], true);
        assert!(engine_prompts.agree(), "the OPD teacher's handle sees it");
        assert!(
            t.engine_prompts_agreed,
            "captured after its own prompt agreed"
        );
        // With the check off nothing is compared: no turn is captured as agreeing.
        let unchecked = CaptureStats::new(DriftCheck::new(0, 0));
        let t = capture_turn_with(&tok, &j, policy(), None, &unchecked).unwrap();
        assert_eq!(t.token_source, TokenSource::Engine);
        assert!(!t.engine_prompts_agreed);
        assert_eq!(unchecked.to_json()["engine_prompts_agree"], false);
    }

    #[test]
    fn a_log_prob_count_that_differs_from_the_engine_ids_is_re_tokenized_or_refused() {
        let tok = ChatTokenizer::mini();
        let ids = true_ids(&tok);
        let n = ids.1.len();
        // `auto` re-tokenizes such a turn (the missing value becomes a marked position)…
        let j = engine_job(&tok, Some(ids.clone()), n - 1);
        let t = capture_turn_with(&tok, &j, policy(), None, &CaptureStats::default()).unwrap();
        assert_eq!(t.token_source, TokenSource::Retokenized);
        assert!(t.alignment.marked() > 0);
        // …`engine` refuses it.
        let mut j = engine_job(&tok, Some(ids), n - 1);
        j.token_ids = TokenIdsMode::Engine;
        match capture_turn_with(&tok, &j, policy(), None, &CaptureStats::default()) {
            Err(e @ CaptureError::Refused { .. }) => {
                assert_eq!(e.reason(), "engine_logprob_count_mismatch");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn re_tokenization_that_differs_from_the_engine_is_counted_with_its_first_position() {
        let tok = ChatTokenizer::mini();
        let (mut prompt, response) = true_ids(&tok);
        let stats = CaptureStats::new(DriftCheck::new(10, 0));
        let engine_prompts = stats.drift.engine_prompts();
        // A turn whose prompt ids are ours first: the prompts agree…
        let good = engine_job(
            &tok,
            Some((prompt.clone(), response.clone())),
            response.len(),
        );
        capture_turn_with(&tok, &good, policy(), None, &stats).unwrap();
        assert!(engine_prompts.agree());
        let changed = prompt.len() - 2;
        prompt[changed] = response[0];
        let j = engine_job(
            &tok,
            Some((prompt.clone(), response.clone())),
            response.len(),
        );
        let t = capture_turn_with(&tok, &j, policy(), None, &stats).unwrap();
        assert_eq!(t.prompt_ids, prompt, "the sample keeps the engine's ids");
        // …until one differs, for good: the OPD teacher encodes prompt texts itself from then on.
        assert!(!engine_prompts.agree());
        assert!(!t.engine_prompts_agreed);
        let later = capture_turn_with(&tok, &good, policy(), None, &stats).unwrap();
        assert!(!engine_prompts.agree());
        assert!(!later.engine_prompts_agreed);
        let st = stats.to_json();
        assert_eq!(st["engine_prompts_agree"], false);
        assert_eq!(st["drift"], 1);
        assert_eq!(st["last_drift"]["part"], "prompt");
        assert_eq!(st["last_drift"]["position"], changed);
        assert_eq!(
            st["last_drift"]["engine_token"],
            tok.token_text(response[0])
        );
    }

    #[test]
    fn a_response_that_differs_is_drift_but_the_prompts_still_agree() {
        let tok = ChatTokenizer::mini();
        let (prompt, mut response) = true_ids(&tok);
        // A sampled token whose text is not in the answer our template renders.
        let other = tok.encode("zebra").unwrap()[0];
        assert_ne!(tok.token_text(other), tok.token_text(response[1]));
        response[1] = other;
        let stats = CaptureStats::new(DriftCheck::new(10, 0));
        let j = engine_job(
            &tok,
            Some((prompt.clone(), response.clone())),
            response.len(),
        );
        capture_turn_with(&tok, &j, policy(), None, &stats).unwrap();
        let st = stats.to_json();
        assert_eq!(st["drift"], 1);
        assert_eq!(st["last_drift"]["part"], "response");
        assert_eq!(st["engine_prompts_agree"], true);
        assert!(stats.drift.engine_prompts().agree());
    }

    /// The response is compared as text: an engine that sampled the answer in other pieces than
    /// our tokenizer would cut it into (byte-level models do: a random model, a character's bytes
    /// apart, merges the encoder would not make) agrees with the template all the same.
    #[test]
    fn a_response_sampled_in_other_pieces_is_not_drift() {
        let tok = ChatTokenizer::mini();
        let (prompt, response) = true_ids(&tok);
        let (at, long) = response
            .iter()
            .enumerate()
            .find(|(_, id)| tok.token_text(**id).chars().count() >= 2)
            .map(|(i, id)| (i, *id))
            .expect("a token of two characters or more");
        let pieces: Vec<u32> = tok
            .token_text(long)
            .chars()
            .flat_map(|c| tok.encode(&c.to_string()).unwrap())
            .collect();
        assert!(pieces.len() >= 2 && !pieces.contains(&long));
        let mut sampled = response[..at].to_vec();
        sampled.extend(&pieces);
        sampled.extend(&response[at + 1..]);
        assert_eq!(tok.decode(&sampled, true), tok.decode(&response, true));
        let stats = CaptureStats::new(DriftCheck::new(10, 0));
        let n = sampled.len();
        let j = engine_job(&tok, Some((prompt.clone(), sampled.clone())), n);
        let t = capture_turn_with(&tok, &j, policy(), None, &stats).unwrap();
        assert_eq!(t.response_ids, sampled, "the sample keeps the engine's ids");
        let st = stats.to_json();
        assert_eq!(
            (st["drift_checked"].clone(), st["drift"].clone()),
            (json!(1), json!(0))
        );
        // The same answer with a character the template does not render is drift.
        let mut wrong = sampled;
        wrong[at] = tok.encode("Q").unwrap()[0];
        let j = engine_job(&tok, Some((prompt, wrong.clone())), wrong.len());
        capture_turn_with(&tok, &j, policy(), None, &stats).unwrap();
        assert_eq!(stats.to_json()["drift"], 1);
    }

    /// A grammar-forced tool call may space its JSON otherwise than the template writes the parsed
    /// arguments back: no render holds the sampled text, so the response is not compared (not
    /// drift); the same call written as the template writes it is compared, and a changed
    /// argument there is drift.
    #[test]
    fn tool_call_arguments_the_template_rewrites_are_not_drift() {
        let tok = ChatTokenizer::mini();
        let (prompt, _) = true_ids(&tok);
        let eos = tok.eos_token_id().unwrap();
        let run = |args: &str, sampled_args: &str| {
            let sampled = format!(
                "<tool_call>\n{{\"name\": \"get\", \"arguments\": {sampled_args}}}\n</tool_call>"
            );
            let mut ids = tok.encode(&sampled).unwrap();
            ids.push(eos);
            let stats = CaptureStats::new(DriftCheck::new(10, 0));
            let mut j = engine_job(&tok, Some((prompt.clone(), ids.clone())), ids.len());
            j.rollout.message = json!({"role": "assistant", "content": "", "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "get", "arguments": args}}]});
            let t = capture_turn_with(&tok, &j, policy(), None, &stats).unwrap();
            assert_eq!(t.response_ids, ids, "the sample keeps the engine's ids");
            stats.to_json()["drift"].clone()
        };
        let spaced = r#"{ "city" : "Rome" }"#;
        assert_eq!(
            run(spaced, spaced),
            json!(0),
            "rewritten by the template: not compared"
        );
        let canonical = r#"{"city": "Rome"}"#;
        assert_eq!(run(canonical, canonical), json!(0), "compared, and equal");
        assert_eq!(
            run(canonical, r#"{"city": "Paris"}"#),
            json!(1),
            "compared, and the sampled text is not the answer's"
        );
    }

    #[test]
    fn the_drift_check_runs_on_the_first_turns_then_one_in_every() {
        let d = DriftCheck::new(2, 3);
        let due: Vec<bool> = (0..9).map(|_| d.due()).collect();
        assert_eq!(
            due,
            [true, true, true, false, false, true, false, false, true]
        );
        let never = DriftCheck::new(0, 0);
        assert!(!(0..5).any(|_| never.due()));
    }

    #[test]
    fn an_engine_asked_for_ids_that_gave_none_falls_back_or_refuses_by_mode() {
        let tok = ChatTokenizer::mini();
        let stats = CaptureStats::default();
        let auto = engine_job(&tok, None, 0);
        let t = capture_turn_with(&tok, &auto, policy(), None, &stats).unwrap();
        assert_eq!(t.token_source, TokenSource::Retokenized);
        let mut engine_only = engine_job(&tok, None, 0);
        engine_only.token_ids = TokenIdsMode::Engine;
        let e = capture_turn_with(&tok, &engine_only, policy(), None, &stats).unwrap_err();
        assert_eq!(e.reason(), "no_engine_ids");
        assert_eq!(stats.to_json()["engine_ids_missing"], 2);
        // With `retokenize` the engine's ids are not used even when present.
        let mut retok = engine_job(&tok, Some(true_ids(&tok)), true_ids(&tok).1.len());
        retok.token_ids = TokenIdsMode::Retokenize;
        retok.asked_for_ids = false;
        let t = capture_turn_with(&tok, &retok, policy(), None, &stats).unwrap();
        assert_eq!(t.token_source, TokenSource::Retokenized);
    }

    #[test]
    fn a_streamed_answer_whose_log_probs_cannot_explain_its_text_is_refused() {
        let tok = ChatTokenizer::mini();
        let mut j = job("s", 1, &[json!({"role": "user", "content": "q"})], false);
        j.rollout.streamed = true;
        j.rollout.message = json!({"role": "assistant", "content": "Answer.", "reasoning_content": "A long chain of thought that streamed without any log-probs."});
        j.rollout.tokens = vec![ps_core::SampledToken {
            token: "Answer.".into(),
            id: None,
            logprob: -0.1,
        }];
        j.rollout.unexplained_chars = 60;
        let e = capture_turn_with(&tok, &j, policy(), None, &CaptureStats::default()).unwrap_err();
        assert_eq!(e.reason(), "stream_logprobs_missing");
        assert!(e.to_string().contains("sglang.stream = false"), "{e}");
        // No log-probs at all for a non-empty answer: refused too.
        j.rollout.unexplained_chars = 0;
        j.rollout.tokens.clear();
        let e = capture_turn_with(&tok, &j, policy(), None, &CaptureStats::default()).unwrap_err();
        assert_eq!(e.reason(), "stream_logprobs_missing");
    }

    #[test]
    fn the_weight_version_comes_from_the_answer_else_from_the_trainer() {
        let tok = ChatTokenizer::mini();
        let stats = CaptureStats::default();
        let mut j = job("w", 1, &[json!({"role": "user", "content": "q"})], false);
        j.trainer_weight_version = Some("step-7".into());
        let t = capture_turn_with(&tok, &j, policy(), None, &stats).unwrap();
        let v = t.weight_version.unwrap();
        assert_eq!(
            (v.version.as_str(), v.source.as_str()),
            ("step-7", "trainer")
        );
        j.rollout.weight_version = Some("v3".into());
        let t = capture_turn_with(&tok, &j, policy(), None, &stats).unwrap();
        let v = t.weight_version.unwrap();
        assert_eq!((v.version.as_str(), v.source.as_str()), ("v3", "engine"));
    }

    /// Records why turns were abandoned.
    #[derive(Default)]
    struct Reasons(std::sync::Mutex<Vec<String>>);

    impl TurnSink for Reasons {
        fn accept(&self, _turn: CapturedTurn) {}
        fn abandon(&self, _session_id: &str, _turn: u64, reason: &str) {
            self.0.lock().unwrap().push(reason.to_owned());
        }
    }

    /// A queue of 8 jobs with one worker on the mini model, feeding `sink`.
    fn one_worker_queue(sink: Arc<dyn TurnSink>) -> CaptureQueue {
        CaptureQueue::start(
            Arc::new(ChatTokenizer::mini()),
            sink,
            policy(),
            DriftCheck::default(),
            8,
            1,
        )
        .unwrap()
    }

    /// A request part that a tree parse refuses never becomes a sample rendered without it: the
    /// turn is abandoned with a reason (counted like every other one).
    #[test]
    fn an_unreadable_request_abandons_the_turn_with_a_reason() {
        let raw = |s: &str| Bytes::from(s.to_owned());
        let sink = Arc::new(Reasons::default());
        let queue = one_worker_queue(sink.clone());
        let good = r#"[{"role":"user","content":"q"}]"#;
        let bad_parts = [
            (r#"[{"role":"user","content":"q","n":1e400}]"#, None, None),
            (good, Some(r#"[{"type":"function","x":1e400}]"#), None),
            (good, None, Some(r#"{"enable_thinking":true,"x":-1e400}"#)),
        ];
        for (i, (messages, tools, kwargs)) in bad_parts.into_iter().enumerate() {
            let mut j = job("u", i as u64 + 1, &[], false);
            j.guard = TurnGuard::new(sink.clone(), "u".into(), i as u64 + 1);
            let request = RequestJson {
                messages: raw(messages),
                tools: tools.map(raw),
                template_kwargs: kwargs.map(raw),
                answer: None,
            };
            assert!(queue.submit_json(j, request));
        }
        assert_eq!(queue.shutdown(), 0);
        assert_eq!(
            *sink.0.lock().unwrap(),
            ["request_unreadable"; 3].map(String::from)
        );
    }

    struct Accepted(std::sync::Mutex<Vec<CapturedTurn>>);

    impl TurnSink for Accepted {
        fn accept(&self, turn: CapturedTurn) {
            self.0.lock().unwrap().push(turn);
        }
    }

    /// Captures one turn from `messages` and `tools` as JSON texts; the captured turn.
    fn captured_from_texts(messages: &str, tools: &str) -> CapturedTurn {
        let sink = Arc::new(Accepted(std::sync::Mutex::new(Vec::new())));
        let queue = one_worker_queue(sink.clone());
        let mut j = job("t", 1, &[], false);
        j.guard = TurnGuard::new(sink.clone(), "t".into(), 1);
        let request = RequestJson {
            messages: Bytes::from(messages.to_owned()),
            tools: Some(Bytes::from(tools.to_owned())),
            template_kwargs: None,
            answer: None,
        };
        assert!(queue.submit_json(j, request));
        queue.shutdown();
        let mut turns = sink.0.lock().unwrap();
        assert_eq!(turns.len(), 1, "one turn captured");
        turns.pop().unwrap()
    }

    /// The captured turn holds the client's own `messages` and `tools` texts (not the trees
    /// written out again), and they read as the very trees the turn was rendered from; a text
    /// much larger than what `serde_json` writes (`\u` escapes, line breaks) is held as written
    /// from its tree instead.
    #[test]
    fn a_turn_holds_the_clients_own_texts_which_read_as_its_trees() {
        let messages = "[ {\"role\": \"system\", \"content\": \"café\"}, {\"role\": \"user\", \"content\": \"q \\/ 1.50\", \"n\": 1.50} ]";
        let tools = "[{\"type\": \"function\", \"function\": {\"name\": \"ls\", \"parameters\": {\"min\": -0.0}}}]";
        let turn = captured_from_texts(messages, tools);
        assert_eq!(turn.messages.as_str(), messages);
        let tree: Vec<Value> = serde_json::from_str(messages).unwrap();
        assert_eq!(turn.messages.parse().unwrap(), tree);
        assert_eq!(turn.messages, JsonText::new(&tree));
        let held = turn.tools.as_ref().unwrap();
        assert_eq!(held.as_str(), tools);
        // What a consumer writes of the held tools keeps the zero's sign.
        let written = serde_json::to_string(held).unwrap();
        assert!(written.contains("-0.0"), "{written}");
        assert_eq!(
            rmp_serde::to_vec_named(held).unwrap(),
            rmp_serde::to_vec_named(&serde_json::from_str::<Value>(tools).unwrap()).unwrap()
        );
        // The prompt was rendered from these trees: the system text as parsed.
        assert!(turn.prompt_text.contains("café"), "{}", turn.prompt_text);

        let escaped = "[{\"role\": \"system\", \"content\": \"caf\\u00e9 \\u4e2d\"}, {\"role\": \"user\", \"content\": \"q\"}]";
        let pretty =
            "[\n  {\n    \"type\": \"function\",\n    \"function\": {\"name\": \"ls\"}\n  }\n]";
        let turn = captured_from_texts(escaped, pretty);
        let tree: Vec<Value> = serde_json::from_str(escaped).unwrap();
        assert_eq!(
            turn.messages.as_str(),
            serde_json::to_string(&tree).unwrap()
        );
        assert!(turn.messages.as_str().contains("café 中"));
        let tools_tree: Value = serde_json::from_str(pretty).unwrap();
        assert_eq!(
            turn.tools.unwrap().as_str(),
            serde_json::to_string(&tools_tree).unwrap()
        );
    }

    /// A sink that holds each captured turn's worker until the test lets it go.
    struct Gated {
        reasons: std::sync::Mutex<Vec<String>>,
        accepted: std::sync::Mutex<Vec<u64>>,
        gate: std::sync::Mutex<Receiver<()>>,
    }

    impl TurnSink for Gated {
        fn accept(&self, turn: CapturedTurn) {
            let _ = self.gate.lock().unwrap().recv();
            self.accepted.lock().unwrap().push(turn.turn);
        }
        fn abandon(&self, _session_id: &str, _turn: u64, reason: &str) {
            self.reasons.lock().unwrap().push(reason.to_owned());
        }
    }

    /// A capture queue of one worker that a [`Gated`] sink holds after each turn.
    struct GatedQueue {
        queue: CaptureQueue,
        sink: Arc<Gated>,
        open: std::sync::mpsc::Sender<()>,
    }

    impl GatedQueue {
        /// A queue of `capacity` turns and at most `max_bytes` bytes.
        fn start(capacity: usize, max_bytes: usize) -> Self {
            let (open, gate) = std::sync::mpsc::channel();
            let sink = Arc::new(Gated {
                reasons: Default::default(),
                accepted: Default::default(),
                gate: std::sync::Mutex::new(gate),
            });
            let queue = CaptureQueue::start(
                Arc::new(ChatTokenizer::mini()),
                sink.clone(),
                policy(),
                DriftCheck::default(),
                capacity,
                1,
            )
            .unwrap()
            .with_max_queued_bytes(max_bytes);
            Self { queue, sink, open }
        }

        /// Queues turn `turn` of session `g`, its request's `messages` as this JSON text.
        fn submit(&self, turn: u64, messages: &str) -> bool {
            let mut j = job("g", turn, &[], false);
            j.guard = TurnGuard::new(self.sink.clone(), "g".into(), turn);
            let request = RequestJson {
                messages: Bytes::from(messages.to_owned()),
                tools: None,
                template_kwargs: None,
                answer: None,
            };
            self.queue.submit_json(j, request)
        }

        /// Waits until the worker took every queued turn (counting it out); it then waits in
        /// the sink.
        fn wait_taken(&self) {
            let started = Instant::now();
            while (self.queued().turns(), self.queued().bytes()) != (0, 0) {
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "no worker took the turn"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        }

        /// Lets `n` captured turns through the sink, then shuts the queue down; returns how many
        /// turns it captured.
        fn finish(&self, n: usize) -> usize {
            for _ in 0..n {
                self.open.send(()).unwrap();
            }
            self.queue.shutdown()
        }

        fn queued(&self) -> &QueueBytes {
            self.queue.queued()
        }
    }

    const SHORT: &str = r#"[{"role":"user","content":"q"}]"#;

    /// While capture is behind, a turn that would take the queue past `capture.max_queued_mib`
    /// is refused with a reason (answered, not trained on); every turn the queue took is still
    /// captured, and its bytes are counted out again.
    #[test]
    fn a_queue_past_its_byte_bound_refuses_turns_with_a_reason_and_loses_none_it_took() {
        // ~10 kB of request text per turn; the queue may hold 25 kB.
        let messages = format!(r#"[{{"role":"user","content":"{}"}}]"#, "q".repeat(10_000));
        let q = GatedQueue::start(64, 25_000);
        assert_eq!(q.queued().max_bytes(), 25_000);
        assert!(q.submit(1, &messages));
        q.wait_taken();
        assert!(
            q.submit(2, &messages) && q.submit(3, &messages),
            "two turns fit in 25 kB"
        );
        let held = q.queued().bytes();
        assert_eq!(q.queued().turns(), 2);
        assert!((20_000..=25_000).contains(&held), "{held} bytes counted");
        assert!(
            !q.submit(4, &messages),
            "a third queued turn would pass the bound"
        );
        assert_eq!(*q.sink.reasons.lock().unwrap(), ["capture_queue_full"]);
        assert_eq!(q.queued().turns(), 2, "the refused turn is not counted");
        assert_eq!(q.finish(3), 3);
        assert_eq!(*q.sink.accepted.lock().unwrap(), [1, 2, 3]);
        assert_eq!((q.queued().turns(), q.queued().bytes()), (0, 0));
        assert_eq!(q.queued().peak_bytes(), held);
        let status = q.queued().to_json();
        assert_eq!(status["peak_bytes"], held);
        assert_eq!(status["max_bytes"], 25_000);
    }

    /// The count bound refuses too, and counts the refused turn's bytes out again.
    #[test]
    fn a_queue_with_all_its_turns_taken_refuses_and_counts_the_turn_out() {
        let q = GatedQueue::start(1, DEFAULT_MAX_QUEUED_BYTES);
        assert!(q.submit(1, SHORT));
        q.wait_taken();
        assert!(q.submit(2, SHORT), "the one place in the channel");
        let held = (q.queued().turns(), q.queued().bytes());
        assert_eq!(held.0, 1);
        assert!(!q.submit(3, SHORT), "the channel is full");
        assert_eq!(
            (q.queued().turns(), q.queued().bytes()),
            held,
            "the refused turn is counted out"
        );
        assert_eq!(*q.sink.reasons.lock().unwrap(), ["capture_queue_full"]);
        assert_eq!(q.finish(2), 2);
        assert_eq!((q.queued().turns(), q.queued().bytes()), (0, 0));
    }

    /// One turn larger than the whole bound still goes into an empty queue: the bound limits
    /// what piles up, it does not refuse a long conversation outright.
    #[test]
    fn a_turn_larger_than_the_bound_is_taken_by_an_empty_queue() {
        let q = GatedQueue::start(8, 1);
        assert!(q.submit(1, SHORT));
        assert_eq!(q.finish(1), 1);
        assert!(q.sink.reasons.lock().unwrap().is_empty());
    }

    /// An answer whose rollout cannot be read on the capture thread (here a log-prob out of
    /// range and a lone surrogate in the message, which the chat path's parse would have
    /// refused) never becomes a sample: the turn is abandoned as `answer_unreadable`.
    #[test]
    fn an_unreadable_answer_abandons_the_turn_with_a_reason() {
        let sink = Arc::new(Reasons::default());
        let queue = one_worker_queue(sink.clone());
        let answers = [
            r#"{"choices":[{"message":{"role":"assistant","content":"Hi"},"logprobs":{"content":[{"token":"Hi","logprob":-1e400}]},"finish_reason":"stop"}]}"#,
            r#"{"choices":[{"message":{"role":"assistant","content":"\ud800"},"finish_reason":"stop"}]}"#,
            r#"{"choices":[{"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop","matched_stop":1e999}]}"#,
        ];
        for (i, text) in answers.into_iter().enumerate() {
            let bytes = bytes::Bytes::from_static(text.as_bytes());
            assert!(ps_sglang_client::Answer::parse("u", bytes.clone()).is_err());
            let answer = ps_sglang_client::Answer::parse_unchecked(bytes).unwrap();
            let turn = i as u64 + 1;
            let mut j = job("a", turn, &[], false);
            j.guard = TurnGuard::new(sink.clone(), "a".into(), turn);
            let request = RequestJson {
                messages: Bytes::from_static(br#"[{"role":"user","content":"q"}]"#),
                tools: None,
                template_kwargs: None,
                answer: Some(answer),
            };
            assert!(queue.submit_json(j, request));
        }
        assert_eq!(queue.shutdown(), 0);
        assert_eq!(
            *sink.0.lock().unwrap(),
            ["answer_unreadable"; 3].map(String::from)
        );
    }

    /// A readable answer handed over as bytes is captured as its rollout read on the chat path
    /// would have been.
    #[test]
    fn an_answer_handed_over_as_bytes_is_captured() {
        let tok = ChatTokenizer::mini();
        let text = r#"{"choices":[{"message":{"role":"assistant","content":"Answer 1."},"finish_reason":"stop"}],"metadata":{"weight_version":"v9"}}"#;
        let answer =
            ps_sglang_client::Answer::parse("u", bytes::Bytes::from_static(text.as_bytes()))
                .unwrap();
        let mut j = job("b", 1, &[], false);
        j.rollout = RolloutResponse::default();
        let request = RequestJson {
            messages: Bytes::from_static(br#"[{"role":"user","content":"q"}]"#),
            tools: None,
            template_kwargs: None,
            answer: Some(answer.clone()),
        };
        request.fill(&mut j).unwrap();
        assert_eq!(j.rollout, answer.rollout().unwrap());
        assert_eq!(j.rollout.weight_version.as_deref(), Some("v9"));
        let turn = capture_turn(&tok, &j, policy()).unwrap();
        assert_eq!(turn.response_message["content"], "Answer 1.");
    }
}
