//! The JSON of the `/v1/inspect/...` endpoints (documented in `docs/inspect.md`). Every type
//! serialises and deserialises, so tests and clients read the same shapes the page reads.

use std::collections::BTreeMap;

use ps_core::{SessionSource, StoreStats, TurnType};
use serde::{Deserialize, Serialize};

/// Where a turn is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnStatus {
    /// A main request is being answered.
    Answering,
    /// A side turn: forwarded, never trained on.
    Side,
    /// A main request served while the trainer paused submission: not captured.
    NotCaptured,
    /// Captured; waits for the session's next main request (its next state).
    WaitingNextState,
    /// Judged (votes in); waits for the teacher or for earlier turns of the session.
    Judged,
    /// Stored as a sample that trains.
    Submitted,
    /// Stored as a sample with an all-zero loss mask (`excluded` says why).
    Excluded,
    /// Gave no sample (`reason`).
    Dropped,
    /// Never captured (`reason`).
    Abandoned,
}

/// The teacher's outcome of one turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TeacherView {
    /// `scored`, `mismatch` or `failed`.
    pub outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// One request of a session, as the timeline shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnView {
    /// The main turn's number in its session (`None` for side turns and uncaptured requests).
    pub turn: Option<u64>,
    pub turn_type: TurnType,
    pub status: TurnStatus,
    /// When the request arrived (Unix milliseconds).
    pub at_ms: u64,
    /// When the last event of this turn happened (Unix milliseconds).
    pub updated_ms: u64,
    pub streamed: bool,
    /// The API the request came through (`chat_completions`, `messages`, `responses`).
    #[serde(default)]
    pub door: ps_core::Door,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_tokens: Option<usize>,
    /// PRM votes (`null`: a failed vote) and their majority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prm_votes: Option<Vec<Option<i8>>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prm_score: Option<f64>,
    /// Hint votes (OPD, Combine) and the hint chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint_votes: Option<Vec<Option<i8>>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teacher: Option<TeacherView>,
    /// Why the turn gave no sample (dropped, abandoned) or why its sample is excluded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The stored sample's seq (`GET /v1/inspect/samples/{seq}`) and reward.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<f64>,
}

/// One session in the list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionSummary {
    pub id: String,
    pub source: SessionSource,
    /// `live`, or `closed`.
    pub state: String,
    /// Why the session was closed (`done`, `timeout`, `evicted`, `shutdown`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_reason: Option<String>,
    pub first_ms: u64,
    pub last_ms: u64,
    /// Requests seen, main turns among them, and their outcomes.
    pub requests: u64,
    pub main_turns: u64,
    pub samples: u64,
    pub drops: u64,
}

/// `GET /v1/inspect/sessions?q=&limit=`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionList {
    /// Most recently active first.
    pub sessions: Vec<SessionSummary>,
    /// Sessions held, and those whose id contains `q`.
    pub total: usize,
    pub matched: usize,
}

/// `GET /v1/inspect/sessions/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionTimeline {
    pub session: SessionSummary,
    /// In arrival order.
    pub turns: Vec<TurnView>,
    /// Earlier requests of this session no longer held (beyond `max_turns_per_session`).
    pub turns_forgotten: u64,
}

/// Counters since the server started (or since the history's start).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    pub requests: u64,
    pub main_turns: u64,
    pub side_turns: u64,
    pub samples: u64,
    pub excluded: u64,
    pub teacher_mismatches: u64,
    pub dropped: BTreeMap<String, u64>,
    pub abandoned: BTreeMap<String, u64>,
}

/// One bucket of the recent series.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SeriesPoint {
    /// The bucket's start (Unix milliseconds).
    pub t_ms: u64,
    pub requests: u64,
    pub samples: u64,
    /// Turns dropped or abandoned.
    pub drops: u64,
    /// Mean reward of the samples stored in the bucket (the PRM eval-score trend).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_reward: Option<f64>,
}

/// What the server knows now (the composition crate provides it, see [`crate::LiveStatus`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Live {
    pub submission_enabled: bool,
    /// `server.pause_mode`: what chat requests get while paused.
    pub pause_mode: String,
    /// `server.mode`.
    pub mode: String,
    pub live_sessions: usize,
    /// Main turns not yet samples, by state.
    pub pending: BTreeMap<String, usize>,
}

/// The store's counters ([`StoreStats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreView {
    /// The highest seq handed out.
    pub last_seq: u64,
    /// The trainer's commit point.
    pub committed: u64,
    /// Samples kept.
    pub stored: u64,
    /// Stored but not committed yet.
    pub lag: u64,
}

impl From<StoreStats> for StoreView {
    fn from(s: StoreStats) -> Self {
        Self {
            last_seq: s.last_seq,
            committed: s.committed,
            stored: s.stored,
            lag: s.lag,
        }
    }
}

/// The history's own size and bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryInfo {
    pub sessions: usize,
    pub max_sessions: usize,
    pub max_turns_per_session: usize,
    /// Sessions dropped from the history to stay within `max_sessions`.
    pub forgotten_sessions: u64,
}

/// `GET /v1/inspect/overview`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Overview {
    pub now_ms: u64,
    pub totals: Totals,
    /// Over the last minute.
    pub requests_per_s: f64,
    pub samples_per_s: f64,
    /// The last minutes, oldest first, `bucket_ms` apart.
    pub bucket_ms: u64,
    pub series: Vec<SeriesPoint>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<Live>,
    /// The store's counters: `lag` is what the trainer has not committed yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<StoreView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_error: Option<String>,
    pub history: HistoryInfo,
}

/// One of the teacher's top-K candidates at a position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopEntry {
    pub id: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    pub lp: f64,
}

/// One response token of a sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenView {
    pub id: u32,
    /// The token's text, when the server has the tokenizer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    pub mask: u8,
    /// The rollout log-prob; `None` where the sample marks the position as having none.
    pub lp: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teacher_lp: Option<f64>,
    /// Teacher − rollout (OPD's per-token advantage), where both exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adv: Option<f64>,
    /// `sampled`, `eos_unreported` or `unsampled` (`metadata.logprob_sources`).
    pub source: String,
    /// Why the position stands out: `no_logprob`, `template_inserted`, `eos_unreported`,
    /// `trained_without_logprob`, `masked_without_logprob`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub marks: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top: Vec<TopEntry>,
    /// A mixture-of-experts policy's routed experts of this token: per layer, its top-k expert
    /// indices (`rollout_routed_experts`; none for the sample's last token, whose routing never
    /// ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experts: Option<Vec<Vec<u32>>>,
}

/// `GET /v1/inspect/samples/{seq}`: a stored sample, read from the store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleView {
    pub seq: u64,
    pub session_id: String,
    pub turn: u64,
    pub mode: Option<String>,
    pub reward: f64,
    pub status: String,
    /// Whether any position trains (a non-zero loss mask).
    pub trains: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub excluded: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub votes: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint_votes: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teacher: Option<String>,
    pub prompt: String,
    pub prompt_tokens: usize,
    pub response_tokens: usize,
    /// The prompt's images in prompt order (a vision-language policy's sample): where the prompt
    /// text has its `i`-th `<|image_pad|>`, the page shows the image's thumbnail (its bytes from
    /// `GET /v1/rollout/blobs/{hash}`) and one chip for its run of pad tokens.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ps_core::sample::SampleImage>,
    pub has_teacher: bool,
    pub tokens: Vec<TokenView>,
    /// The sample's whole metadata, as stored.
    pub metadata: serde_json::Map<String, serde_json::Value>,
}
