//! Judging a turn whose next state is resolved: the PRM votes of RL (and the eval votes of OPD
//! and Combine), the bound on the judge backlog, and the counting and logging of turns that yield
//! no sample. What an OPD/Combine turn becomes is decided in [`crate::opd`].
//!
//! No locks on sessions here: a judged turn comes back as a [`Ready`] that the buffer files into
//! its session for ordered submission.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use ps_chat_template::SharedPrefixCache;
use ps_core::metric_names as m;
use ps_core::ports::{PrmScore, TurnScorer};
use ps_core::{CapturedTurn, TeacherOutcome, TurnEvent};
use serde_json::Value;
use tokio::time::Instant;

use crate::config::{BufferConfig, BufferMode};
use crate::input::judge_input;
use crate::opd::{self, OpdParts, OpdVerdict};
use ps_core::ports::RecordSink;

use crate::records::record_turn;
use crate::state::{Job, Ready};
use crate::status::Stats;

/// The judges and what they need: the PRM, the OPD parts, where records go.
pub(crate) struct Judges {
    pub config: BufferConfig,
    pub scorer: Option<Arc<dyn TurnScorer>>,
    pub opd: Option<OpdParts>,
    pub records: Option<Arc<dyn RecordSink>>,
    /// System prompts and tools the teacher path encoded, shared by all sessions (OPD/Combine).
    teacher_prefixes: Arc<SharedPrefixCache>,
    /// Turns waiting for or in judging now (bounded by `config.max_judge_backlog`).
    judging: AtomicUsize,
}

/// Counts one turn in [`Judges::judging`] while alive (also when its judging is cancelled).
struct JudgingSlot<'a>(&'a AtomicUsize);

impl Drop for JudgingSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Judges {
    pub fn new(
        config: BufferConfig,
        scorer: Option<Arc<dyn TurnScorer>>,
        opd: Option<OpdParts>,
        records: Option<Arc<dyn RecordSink>>,
    ) -> Self {
        Self {
            config,
            scorer,
            opd,
            records,
            teacher_prefixes: Arc::new(SharedPrefixCache::new(
                ps_chat_template::DEFAULT_SHARED_PREFIX_BYTES,
            )),
            judging: AtomicUsize::new(0),
        }
    }

    /// Judges one turn by the mode's rules.
    pub async fn judge(&self, job: Job, stats: &Stats) -> Ready {
        // Only a turn with a next state calls a judge; the others are cheap and always go through.
        let needs_judge =
            job.next.is_some() && (self.config.mode != BufferMode::Rl || self.config.prm_enabled);
        let backlog = needs_judge.then(|| {
            let waiting = self.judging.fetch_add(1, Ordering::Relaxed);
            (waiting, JudgingSlot(&self.judging))
        });
        match (&backlog, self.config.mode) {
            (Some((n, _)), _) if *n >= self.config.max_judge_backlog => {
                Self::drop_for_backlog(&job, *n, stats)
            }
            (_, BufferMode::Rl) => self.judge_rl(job, stats).await,
            (_, BufferMode::Opd | BufferMode::Combine) => self.judge_opd(job, stats).await,
        }
    }

    /// Runs the PRM votes of a turn that has a next state, counting and collecting the score.
    async fn eval(&self, turn: &CapturedTurn, state: &Value, stats: &Stats) -> Option<PrmScore> {
        let scorer = self.scorer.as_ref().filter(|_| self.config.prm_enabled)?;
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
        stats.observer.tell(TurnEvent::PrmVotes {
            session: &turn.session_id,
            turn: turn.turn,
            votes: &score.votes,
            score: score.score,
        });
        // OPD eval mode and Combine record every eval majority (a dropped turn's too, as the
        // reference); RL records the score of every submitted sample instead (see `submit`).
        if self.config.mode != BufferMode::Rl {
            stats.push_eval_score(score.score);
        }
        Some(score)
    }

    async fn judge_rl(&self, job: Job, stats: &Stats) -> Ready {
        let Job {
            session_id,
            turn_no,
            turn,
            next,
            ..
        } = job;
        let judged = match &next {
            Some(state) => self.eval(&turn, state, stats).await,
            None => None,
        };
        record_turn(
            self.records.as_deref(),
            &session_id,
            turn_no,
            &turn,
            next.as_ref(),
            judged.as_ref(),
        );
        Ready::Judged {
            turn,
            has_next_state: next.is_some(),
            judged,
        }
    }

    async fn judge_opd(&self, job: Job, stats: &Stats) -> Ready {
        let judging = opd::OpdJudging {
            parts: self.opd.as_ref(),
            mode: self.config.mode,
            options: self.config.opd,
            records: self.records.as_deref(),
            observer: &stats.observer,
            shared_prefixes: &self.teacher_prefixes,
        };
        let turn = &job.turn;
        let verdict = judging
            .judge(&job, move |state| async move {
                self.eval(turn, &state, stats).await
            })
            .await;
        match verdict {
            OpdVerdict::Sample(sample) => Ready::Sample(sample),
            OpdVerdict::Drop {
                reason,
                detail,
                record,
            } => {
                Self::drop_turn(&job, reason, &detail, stats);
                if let Some(r) = &self.records {
                    r.opd(*record);
                }
                Ready::Skip
            }
        }
    }

    /// A turn dropped because `max_judge_backlog` turns already wait for a judge.
    fn drop_for_backlog(job: &Job, waiting: usize, stats: &Stats) -> Ready {
        stats.dropped("judge_backlog");
        stats.observer.tell(TurnEvent::Dropped {
            session: &job.session_id,
            turn: job.turn_no,
            reason: "judge_backlog",
            detail: None,
        });
        tracing::warn!(
            session_id = %job.session_id,
            turn = job.turn_no,
            waiting,
            "the judge is behind: {waiting} turns already wait for it, so this turn yields no sample \
             (raise prm.max_concurrency or add judge capacity; prm.max_backlog bounds the wait)"
        );
        Ready::Skip
    }

    /// A turn that yields no sample in OPD/Combine: counted and logged (the caller records it).
    fn drop_turn(job: &Job, reason: &'static str, detail: &str, stats: &Stats) {
        stats.dropped(reason);
        let teacher = match reason {
            "teacher_token_mismatch" => Some(TeacherOutcome::Mismatch { detail }),
            "teacher_error" => Some(TeacherOutcome::Failed { detail }),
            _ => None,
        };
        if let Some(outcome) = teacher {
            stats.observer.tell(TurnEvent::Teacher {
                session: &job.session_id,
                turn: job.turn_no,
                outcome,
            });
        }
        stats.observer.tell(TurnEvent::Dropped {
            session: &job.session_id,
            turn: job.turn_no,
            reason,
            detail: Some(detail),
        });
        if reason == "teacher_token_mismatch" {
            stats.mismatches.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(m::TEACHER_MISMATCH_TOTAL).increment(1);
            tracing::warn!(
                session_id = %job.session_id, turn = job.turn_no, %detail,
                "the teacher scored other token ids than the response's (a teacher/policy tokenizer mismatch?): no sample"
            );
        } else {
            tracing::info!(session_id = %job.session_id, turn = job.turn_no, reason, %detail, "turn yields no sample");
        }
    }
}
