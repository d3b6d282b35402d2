//! Per-session turn buffering: each captured main turn waits for its next state (the next main
//! request's last message of the same session), is then scored and turned into a training sample,
//! and samples of a session are submitted in turn order. This crate owns that state machine; it is
//! filled in by the binary RL mode. Until then the server hands captured turns to a
//! [`ps_core::TurnSink`] directly.

use ps_core::sample::Sample;

/// Receives finished samples, in turn order per session. Implementations persist them durably.
#[async_trait::async_trait]
pub trait SampleSink: Send + Sync {
    async fn submit(&self, sample: Sample) -> Result<u64, SampleSinkError>;
}

/// Why a sample could not be stored.
#[derive(Debug, thiserror::Error)]
pub enum SampleSinkError {
    #[error("sample store at {path} failed: {detail}")]
    Store { path: String, detail: String },
}
