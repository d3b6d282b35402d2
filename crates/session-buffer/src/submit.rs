//! Ordered submission: the samples of one session reach the [`SampleSink`] strictly in turn
//! order. A judged turn waits until every earlier turn of its session was submitted or skipped;
//! RL turns get their final decision here, because the at-least-one rule depends on the turns
//! submitted before them. A failing sink is retried with back-off before the sample is counted
//! as lost.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use ps_core::SampleSink;
use ps_core::metric_names as m;
use ps_core::sample::Sample;

use crate::rules::{rl_decision, rl_sample};
use crate::state::{Ready, Session};
use crate::status::Stats;

/// Attempts to hand one sample to the sink before it is counted as dropped.
const SUBMIT_ATTEMPTS: usize = 4;
/// The first retry's delay; each later one is [`SUBMIT_BACKOFF_FACTOR`] times longer.
const SUBMIT_BACKOFF: Duration = Duration::from_millis(100);
const SUBMIT_BACKOFF_FACTOR: f32 = 4.0;

/// Takes the session's next sample in turn order, if it is ready (skipping abandoned and dropped
/// turns). `None`: the next turn is not ready yet; the session's submission task stops (and a
/// closed session that has nothing left is forgotten).
pub(crate) fn next_in_order(
    sessions: &mut HashMap<String, Session>,
    session_id: &str,
    prm_enabled: bool,
    stats: &Stats,
) -> Option<Sample> {
    let s = sessions.get_mut(session_id)?;
    loop {
        s.origins.remove(&s.next_submit);
        if s.ready.contains_key(&s.next_submit) && s.conversation_starts.remove(&s.next_submit) {
            s.has_effective = false;
        }
        match s.ready.remove(&s.next_submit) {
            None => {
                s.submitting = false;
                if s.closing && s.is_drained() {
                    sessions.remove(session_id);
                }
                return None;
            }
            Some(Ready::Skip) => {
                s.next_submit += 1;
            }
            Some(Ready::Sample(sample)) => {
                s.next_submit += 1;
                stats.effective.fetch_add(1, Ordering::Relaxed);
                return Some(*sample);
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
                    prm_enabled,
                    s.has_effective,
                );
                s.has_effective |= decision.effective;
                if prm_enabled {
                    // `rollout/prm_eval_score` covers every submitted RL sample, as in the
                    // reference: its reward, 0 for a turn without a next state.
                    stats.push_eval_score(decision.reward);
                }
                if decision.effective {
                    stats.effective.fetch_add(1, Ordering::Relaxed);
                } else {
                    stats.excluded.fetch_add(1, Ordering::Relaxed);
                }
                if let Some(e) = decision.excluded {
                    metrics::counter!(m::SAMPLES_EXCLUDED_TOTAL, "reason" => e.as_str())
                        .increment(1);
                }
                return Some(rl_sample(&turn, &decision, judged.as_ref()));
            }
        }
    }
}

/// Hands one sample to the sink, retrying with back-off; a sample the sink keeps refusing is
/// counted and logged as lost.
pub(crate) async fn submit(sink: &dyn SampleSink, stats: &Stats, sample: Sample) {
    let (session_id, turn) = (sample.session_id.clone(), sample.turn);
    let effective = sample.loss_mask.iter().any(|b| *b != 0);
    let attempt = AtomicU32::new(1);
    let result = (|| sink.submit(&sample))
        .retry(
            ExponentialBuilder::new()
                .with_min_delay(SUBMIT_BACKOFF)
                .with_factor(SUBMIT_BACKOFF_FACTOR)
                .with_max_times(SUBMIT_ATTEMPTS - 1),
        )
        .notify(|e, _wait| {
            let attempt = attempt.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%session_id, turn, attempt, error = %e, "sample submission failed; retrying");
        })
        .await;
    match result {
        Ok(seq) => {
            stats.stored(&sample);
            stats.observer.tell(ps_core::TurnEvent::Submitted {
                session: &session_id,
                turn,
                seq,
                reward: sample.reward.score,
                excluded: sample
                    .metadata
                    .get("excluded")
                    .and_then(serde_json::Value::as_str),
            });
            let outcome = if effective { "effective" } else { "excluded" };
            metrics::counter!(m::SAMPLES_SUBMITTED_TOTAL, "outcome" => outcome).increment(1);
            tracing::debug!(%session_id, turn, seq, reward = sample.reward.score, "sample submitted");
        }
        Err(e) => {
            stats.dropped.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(m::SAMPLES_DROPPED_TOTAL, "reason" => "sink_failed").increment(1);
            stats.observer.tell(ps_core::TurnEvent::Dropped {
                session: &session_id,
                turn,
                reason: "sink_failed",
                detail: None,
            });
            tracing::error!(%session_id, turn, error = %e, "sample LOST: the sink kept failing");
        }
    }
}
