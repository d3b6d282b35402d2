//! The rollout control port: what the HTTP server asks of the part that turns captured turns into
//! samples (the session buffer), without depending on it: its status, its mode's name, the
//! eval scores collected, and its shutdown. The composition root hands the server an
//! `Arc<dyn RolloutControl>`, so the server crate links no judge, teacher or buffer.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

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
    pub turns_abandoned_by_reason: BTreeMap<String, u64>,
    /// Dropped turns by reason (`no_next_state`, `no_hint`, `teacher_error`,
    /// `teacher_without_images`, `judge_backlog`, …).
    #[serde(default)]
    pub turns_dropped_by_reason: BTreeMap<String, u64>,
    /// Stored samples by where their ids came from (`engine`, `retokenized`).
    pub samples_by_token_source: BTreeMap<String, u64>,
    /// Stored samples by policy version (`none` when unknown; at most
    /// the session buffer's `MAX_TRACKED_VERSIONS` versions, later ones under `other`).
    pub samples_by_weight_version: BTreeMap<String, u64>,
    /// Stored samples by what their sampling means for the log-probs (`full`, `truncated`,
    /// `greedy`, `engine_defaults`: [`crate::SamplingKind`]).
    #[serde(default)]
    pub samples_by_sampling: BTreeMap<String, u64>,
}

/// What the server asks of the session buffer.
#[async_trait::async_trait]
pub trait RolloutControl: Send + Sync {
    /// What it holds and has done (`/v1/rollout/status`, `/health`, the inspection page).
    fn status(&self) -> BufferStatus;

    /// The mode it makes samples in: `rl`, `opd` or `combine`.
    fn mode_name(&self) -> &'static str;

    /// Returns and clears the PRM scores computed since the last drain (`rollout/prm_eval_score`).
    fn drain_eval_scores(&self) -> Vec<f64>;

    /// Closes every session and waits up to `grace` for judging and submission; whether it
    /// finished within it.
    async fn shutdown(&self, grace: Duration) -> bool;
}
