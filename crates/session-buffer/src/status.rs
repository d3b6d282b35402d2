//! What the buffer counts: the counters and tallies behind [`BufferStatus`] and the metrics of
//! submitted samples. A leaf module: it sees samples and numbers, not sessions.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use ps_core::metric_names as m;
use ps_core::sample::Sample;
use ps_core::{TurnEvent, TurnObserver};
use serde_json::Value;

pub use ps_core::rollout_control::{BufferStatus, PendingCounts};

/// Distinct policy versions counted in [`BufferStatus::samples_by_weight_version`].
pub const MAX_TRACKED_VERSIONS: usize = 256;

/// Who is told what happens to sessions and turns (the inspection page's history), once set
/// ([`crate::SessionBuffer::with_observer`]); nobody by default.
#[derive(Default)]
pub(crate) struct Observer(OnceLock<Arc<dyn TurnObserver>>);

impl Observer {
    pub fn set(&self, observer: Arc<dyn TurnObserver>) {
        let _ = self.0.set(observer);
    }

    /// Tells the observer `event` (returns at once: observers must not block).
    pub fn tell(&self, event: TurnEvent<'_>) {
        if let Some(o) = self.0.get() {
            o.observe(event);
        }
    }
}

/// The buffer's counters, tallies and collected eval scores, shared by its tasks.
#[derive(Default)]
pub(crate) struct Stats {
    pub submitted: AtomicU64,
    pub effective: AtomicU64,
    pub excluded: AtomicU64,
    pub dropped: AtomicU64,
    pub abandoned: AtomicU64,
    pub dropped_turns: AtomicU64,
    pub mismatches: AtomicU64,
    pub timed_out: AtomicU64,
    pub evicted: AtomicU64,
    trained_placeholders: AtomicU64,
    masked_placeholders: AtomicU64,
    /// Whether the first trained / masked placeholder position was logged (once each per process).
    trained_placeholders_logged: AtomicBool,
    masked_placeholders_logged: AtomicBool,
    tallies: Mutex<Tallies>,
    /// PRM scores since the last drain (`rollout/prm_eval_score`).
    eval_scores: Mutex<Vec<f64>>,
    /// Told what happens to turns, where the counters above count it.
    pub observer: Observer,
}

/// Counts kept by name (bounded by their callers).
#[derive(Default, Clone)]
struct Tallies {
    abandoned: BTreeMap<String, u64>,
    dropped: BTreeMap<String, u64>,
    token_source: BTreeMap<String, u64>,
    weight_version: BTreeMap<String, u64>,
    sampling: BTreeMap<String, u64>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Stats {
    /// Counts an abandoned turn by its reason (the status and `turns_abandoned_total`) and tells
    /// the observer.
    pub fn abandoned(&self, session: &str, turn: u64, reason: &str) {
        self.abandoned.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(m::TURNS_ABANDONED_TOTAL, "reason" => reason.to_owned()).increment(1);
        // Reasons are a small fixed set of snake_case words chosen by the server.
        *lock(&self.tallies)
            .abandoned
            .entry(reason.to_owned())
            .or_default() += 1;
        self.observer.tell(TurnEvent::Abandoned {
            session,
            turn,
            reason,
        });
    }

    /// Counts a dropped turn (judged, but no sample: OPD/Combine, judge backlog) by its reason
    /// (the status and `turns_dropped_total`); the caller tells the observer.
    pub fn dropped(&self, reason: &'static str) {
        self.dropped_turns.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(m::TURNS_DROPPED_TOTAL, "reason" => reason).increment(1);
        *lock(&self.tallies)
            .dropped
            .entry(reason.to_owned())
            .or_default() += 1;
    }

    /// Collects one eval score for `rollout/prm_eval_score`.
    pub fn push_eval_score(&self, score: f64) {
        lock(&self.eval_scores).push(score);
    }

    /// Returns and clears the eval scores collected since the last drain.
    pub fn drain_eval_scores(&self) -> Vec<f64> {
        std::mem::take(&mut *lock(&self.eval_scores))
    }

    /// Counts a stored sample: its placeholders, its token source and its policy version.
    pub fn stored(&self, sample: &Sample) {
        self.submitted.fetch_add(1, Ordering::Relaxed);
        self.count_placeholders(sample);
        self.tally_stored(sample);
    }

    /// Counts a stored sample by token source and policy version.
    fn tally_stored(&self, sample: &Sample) {
        let source = sample
            .metadata
            .get("token_source")
            .and_then(Value::as_str)
            .unwrap_or("retokenized")
            .to_owned();
        // `full`, `truncated`, `greedy`, `engine_defaults` (ps_core::SamplingKind); `unknown`
        // only for a sample built without `rl_sample`'s metadata (an embedder's).
        let sampling = sample
            .metadata
            .get("sampling_kind")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
            .to_owned();
        let mut t = lock(&self.tallies);
        *t.token_source.entry(source).or_default() += 1;
        let first_truncated = sample
            .metadata
            .contains_key(ps_core::sampling::TRUNCATED_WITHOUT_SETS)
            && !t.sampling.contains_key(&sampling);
        metrics::counter!(m::SAMPLES_BY_SAMPLING_TOTAL, "kind" => sampling.clone()).increment(1);
        *t.sampling.entry(sampling).or_default() += 1;
        if first_truncated {
            tracing::warn!(
                session = %sample.session_id,
                turn = sample.turn,
                sampling = %sample.metadata.get("sampling").unwrap_or(&serde_json::Value::Null),
                "a sample's response was sampled from a truncated distribution (top_p < 1, \
                 top_k > 0, min_p > 0 or temperature 0) and the kept token sets are not \
                 available from the engine: its rollout log-probs are not those of the full \
                 distribution the trainer recomputes. Marked \
                 metadata.truncated_sampling_without_sets and counted in /v1/rollout/status \
                 samples_by_sampling; set capture.sampling = \"full_distribution\" to sample \
                 main turns from the full distribution (logged once per kind)"
            );
        }
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
    fn count_placeholders(&self, sample: &Sample) {
        let listed = |key: &str| {
            sample
                .metadata
                .get(key)
                .and_then(Value::as_array)
                .map_or(0, |a| a.len() as u64)
        };
        let trained = listed(crate::rules::TRAINED_WITHOUT_ROLLOUT_LOGPROB);
        let masked = listed(crate::rules::MASKED_WITHOUT_LOGPROB);
        self.trained_placeholders
            .fetch_add(trained, Ordering::Relaxed);
        self.masked_placeholders
            .fetch_add(masked, Ordering::Relaxed);
        if trained > 0 {
            metrics::counter!(m::SAMPLE_POSITIONS_WITHOUT_LOGPROB_TOTAL, "outcome" => "trained")
                .increment(trained);
            if !self
                .trained_placeholders_logged
                .swap(true, Ordering::Relaxed)
            {
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
            if !self
                .masked_placeholders_logged
                .swap(true, Ordering::Relaxed)
            {
                tracing::info!(
                    session_id = %sample.session_id, turn = sample.turn, positions = masked,
                    "a Combine RL-only sample had trained positions without a rollout log-prob: they \
                     are taken out of the loss (metadata.masked_without_logprob) so that no placeholder \
                     enters teacher_log_probs (logged once; counted in /v1/rollout/status)"
                );
            }
        }
    }

    /// The status: these counts with the sessions' `live` and `pending` counts.
    pub fn status(&self, live_sessions: u64, pending: PendingCounts) -> BufferStatus {
        let (count, mean) = {
            let scores = lock(&self.eval_scores);
            let n = scores.len();
            (
                n as u64,
                (n > 0).then(|| scores.iter().sum::<f64>() / n as f64),
            )
        };
        // One lock for the three (a temporary guard per field would deadlock the second).
        let tallies = lock(&self.tallies).clone();
        BufferStatus {
            live_sessions,
            pending,
            samples_submitted: self.submitted.load(Ordering::Relaxed),
            samples_effective: self.effective.load(Ordering::Relaxed),
            samples_excluded: self.excluded.load(Ordering::Relaxed),
            samples_dropped: self.dropped.load(Ordering::Relaxed),
            turns_abandoned: self.abandoned.load(Ordering::Relaxed),
            turns_dropped: self.dropped_turns.load(Ordering::Relaxed),
            teacher_mismatches: self.mismatches.load(Ordering::Relaxed),
            sessions_timed_out: self.timed_out.load(Ordering::Relaxed),
            sessions_evicted: self.evicted.load(Ordering::Relaxed),
            eval_scores: count,
            eval_score_mean: mean,
            positions_trained_without_logprob: self.trained_placeholders.load(Ordering::Relaxed),
            positions_masked_without_logprob: self.masked_placeholders.load(Ordering::Relaxed),
            turns_abandoned_by_reason: tallies.abandoned,
            turns_dropped_by_reason: tallies.dropped,
            samples_by_token_source: tallies.token_source,
            samples_by_weight_version: tallies.weight_version,
            samples_by_sampling: tallies.sampling,
        }
    }
}
