//! The ports: every trait that joins two crates of the workspace, with the values that cross it.
//! An implementation lives in its own crate (the SGLang judge in `ps-judge`, the provider judge in
//! `ps-provider-client`, the hint judge in `ps-opd-judge`, the teachers in `ps-teacher-client`, the
//! record writer and the pause hook in `ps-app`); the crates that call them (`ps-session-buffer`,
//! `ps-server`) depend on these traits, never on the implementations.
//!
//! - [`TurnScorer`]: the PRM votes on one turn ([`JudgeInput`] → [`PrmScore`]).
//! - [`JudgeBackend`]: one judge prompt sent, its answer text back (the transport under every vote).
//! - [`HintJudge`]: the OPD hint votes on one turn ([`HintOutcome`]).
//! - [`TeacherScorer`]: the teacher's log-probs of given tokens ([`TeacherLogprobs`]).
//! - [`RecordSink`]: the JSONL conversation, PRM and OPD records.
//! - [`PauseHook`]: told when the trainer pauses submission.
//!
//! The other ports of the workspace sit in the modules of what they carry: samples
//! ([`crate::SampleSink`], [`crate::SampleLog`], [`crate::PendingStore`]), captured turns
//! ([`crate::TurnSink`], [`crate::TurnObserver`]) and the rollout routes' view of the buffer
//! ([`crate::RolloutControl`]).
//!
//! A call through a port fails with a [`CallError`]: the implementation's own error (each client
//! crate keeps its enum, naming the URL and the setting to fix) and the stable reason the drop
//! counters use.

mod judge;
mod records;
mod teacher;

pub use judge::{
    HintJudge, HintOutcome, HintVote, JudgeBackend, JudgeInput, PrmScore, TurnScorer, with_permit,
};
#[cfg(any(test, feature = "test-support"))]
pub use judge::{MockHintJudge, MockJudgeBackend};
pub use records::{ConversationRecord, OpdFacts, OpdRecord, PrmRecord, RecordSink, ToJson};
#[cfg(any(test, feature = "test-support"))]
pub use teacher::MockTeacherScorer;
pub use teacher::{
    Mismatch, TEACHER_TOKEN_MISMATCH, TEACHER_WITHOUT_IMAGES, TeacherLogprobs, TeacherScorer,
    TeacherTemperature, check_alignment,
};

use std::error::Error;

/// Why one call through a port failed: the implementation's own error, kept whole (its message
/// names the URL and the setting to fix; [`CallError::downcast_ref`] gives the enum back), and a
/// stable reason for counters and records (`teacher_timeout`, `judge_call`, …).
///
/// Transparent: its message and its causes are the implementation error's own.
#[derive(Debug)]
pub struct CallError {
    reason: &'static str,
    inner: Box<dyn Error + Send + Sync>,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Error for CallError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.inner.source()
    }
}

impl CallError {
    /// `error` as a failed call with the stable `reason`.
    pub fn new(reason: &'static str, error: impl Into<Box<dyn Error + Send + Sync>>) -> Self {
        Self {
            reason,
            inner: error.into(),
        }
    }

    /// The stable reason (a snake_case word, never a message).
    pub fn reason(&self) -> &'static str {
        self.reason
    }

    /// The implementation's error, when it is an `E`.
    pub fn downcast_ref<E: Error + 'static>(&self) -> Option<&E> {
        self.inner.downcast_ref::<E>()
    }
}

/// Something to tell when the trainer pauses submission (the records rotate there; they are
/// never truncated).
pub trait PauseHook: Send + Sync {
    fn on_pause(&self);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("the teacher at http://t did not answer within 2s (raise `teacher.timeout_sec`)")]
    struct Timeout;

    #[test]
    fn a_call_error_keeps_the_implementations_message_reason_and_type() {
        let e = CallError::new("teacher_timeout", Timeout);
        assert_eq!(e.reason(), "teacher_timeout");
        assert_eq!(e.to_string(), Timeout.to_string());
        assert!(e.downcast_ref::<Timeout>().is_some());
        assert!(e.downcast_ref::<std::fmt::Error>().is_none());
        let from_text = CallError::new("judge_call", "connection refused");
        assert_eq!(from_text.to_string(), "connection refused");
    }
}
