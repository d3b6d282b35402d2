//! Where finished samples go: the trainer-facing hand-off. The durable store implements it, and so
//! does a bounded in-process channel for people who embed the crates in their own trainer.

use crate::sample::Sample;

/// Why a sample could not be handed off. The sample was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("the sample store failed: {0}")]
    Store(String),
    #[error("the sample channel is closed (its receiver was dropped)")]
    Closed,
}

/// Receives finished samples, in turn order per session. `submit` returns once the sample is
/// accepted for good (for a durable store: written and synced), with the sequence number it got;
/// what the trainer reads back has `index` and `group_index` set to that number (one sample per
/// group). The sample is lent, not given: a caller that retries a refused sample keeps it, and a
/// store that only encodes it makes no copy.
#[async_trait::async_trait]
pub trait SampleSink: Send + Sync {
    async fn submit(&self, sample: &Sample) -> Result<u64, SinkError>;
}
