//! The in-process sink for people who embed the crates in their own trainer: a bounded channel.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use ps_core::sample::Sample;
use ps_core::sink::{SampleSink, SinkError};
use tokio::sync::mpsc;

use crate::StoredSample;

/// A [`SampleSink`] that hands samples to a [`mpsc::Receiver`] in the same process. Nothing is
/// durable: samples in the channel are lost with the process. Cheap to clone (clones share the
/// channel and the seq counter).
#[derive(Clone)]
pub struct ChannelSink {
    sender: mpsc::Sender<StoredSample>,
    /// The last seq handed out. Locked while sending, so that samples arrive in seq order.
    last_seq: Arc<Mutex<u64>>,
    /// Mirrors `last_seq` for [`ChannelSink::last_seq`] without taking the lock.
    published: Arc<AtomicU64>,
}

impl std::fmt::Debug for ChannelSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelSink")
            .field("last_seq", &self.last_seq())
            .field("capacity", &self.sender.max_capacity())
            .finish()
    }
}

/// A bounded channel sink holding at most `capacity` samples (at least 1). `submit` waits for
/// room (backpressure), numbers samples 1, 2, 3, ... (`index == group_index == seq`), delivers
/// them in that order, and fails with [`SinkError::Closed`] once the receiver is dropped.
pub fn channel_sink(capacity: usize) -> (ChannelSink, mpsc::Receiver<StoredSample>) {
    let (sender, receiver) = mpsc::channel(capacity.max(1));
    let sink = ChannelSink {
        sender,
        last_seq: Arc::new(Mutex::new(0)),
        published: Arc::new(AtomicU64::new(0)),
    };
    (sink, receiver)
}

impl ChannelSink {
    /// The last seq handed out; 0 = none yet.
    pub fn last_seq(&self) -> u64 {
        self.published.load(Ordering::Acquire)
    }
}

#[async_trait::async_trait]
impl SampleSink for ChannelSink {
    async fn submit(&self, sample: &Sample) -> Result<u64, SinkError> {
        // Wait for room first, so that a seq is only taken by a sample that is then sent.
        let permit = self.sender.reserve().await.map_err(|_| SinkError::Closed)?;
        // The receiver gets a sample of its own, copied before the lock that orders submitters.
        let mut sample = sample.clone();
        let mut last_seq = self.last_seq.lock().unwrap_or_else(PoisonError::into_inner);
        let seq = *last_seq + 1;
        sample.index = seq;
        sample.group_index = seq;
        permit.send(StoredSample { seq, sample });
        *last_seq = seq;
        self.published.store(seq, Ordering::Release);
        Ok(seq)
    }
}
