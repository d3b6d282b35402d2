//! The trainer's side of the sample hand-off: a log of samples under strictly increasing sequence
//! numbers, read in order, committed by the trainer, and kept durably until then.
//!
//! Two stores implement [`SampleLog`]: the embedded redb store (one proxy beside one trainer) and
//! the Redis Streams store (many proxies feeding one trainer). The rollout HTTP API is written
//! against this trait only, so a trainer does not see which one is in use.

use std::time::Duration;

use crate::codec;
use crate::pending::PendingStore;
use crate::sample::Sample;
use crate::sink::SampleSink;

/// A sample as the trainer receives it, with the sequence number it was stored under
/// (`sample.index == sample.group_index == seq`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StoredSample {
    pub seq: u64,
    pub sample: Sample,
}

/// A stored sample as its store keeps it: a record of the sample codec, checked to be one whole
/// record with `index` and `group_index` first (which are not yet the seq). What a MessagePack
/// page is written from ([`EncodedSample::write_named`]) without decoding the sample; only made
/// through the constructors below, so a page never copies a record that was not checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedSample {
    seq: u64,
    record: Vec<u8>,
}

impl EncodedSample {
    /// The record stored under `seq`, kept as it is when [`codec::is_spliceable`], else decoded
    /// and encoded again; the decode error when it does not decode.
    pub fn from_record(seq: u64, record: Vec<u8>) -> Result<Self, codec::DecodeError> {
        Ok(Self {
            seq,
            record: codec::canonical_record(seq, record)?,
        })
    }

    /// `sample` encoded under `seq`.
    pub fn from_sample(seq: u64, sample: &Sample) -> Result<Self, codec::EncodeError> {
        Ok(Self {
            seq,
            record: codec::encode_sample(sample)?,
        })
    }

    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The record (its `index` and `group_index` are whatever they were when it was written).
    pub fn record(&self) -> &[u8] {
        &self.record
    }

    /// Appends to `out` what `rmp_serde::encode::write_named` writes for this
    /// `StoredSample { seq, sample }`: the record copied with `index` and `group_index` set to the
    /// seq ([`codec::write_checked_record`]).
    pub fn write_named(&self, out: &mut Vec<u8>) -> Result<(), codec::DecodeError> {
        codec::write_checked_record(out, self.seq, &self.record)
    }
}

/// A snapshot of a store's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct StoreStats {
    /// The highest seq handed out; 0 = none yet.
    pub last_seq: u64,
    /// The trainer's commit point: every seq up to it has been consumed.
    pub committed: u64,
    /// Samples currently kept (uncommitted ones plus the retained committed ones).
    pub stored: u64,
    /// `last_seq - committed`: samples the trainer has not committed yet.
    pub lag: u64,
}

/// Why a log operation failed.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The trainer tried to commit samples that do not exist yet.
    #[error("cannot commit through sample {through}: the last stored sample is {last_seq}")]
    CommitAhead { through: u64, last_seq: u64 },
    /// The store could not do it; `message` names the store (file or URL) and the cause.
    #[error("{message}")]
    Store { message: String },
}

impl LogError {
    pub fn store(message: impl Into<String>) -> Self {
        Self::Store {
            message: message.into(),
        }
    }
}

/// Who reads when the trainer does not say: the consumer name of the default trainer.
pub const DEFAULT_CONSUMER: &str = "trainer";

/// A durable, ordered log of samples that the trainer pulls and commits. Appends go through
/// [`SampleSink::submit`]; turns unfinished at shutdown through [`PendingStore`].
#[async_trait::async_trait]
pub trait SampleLog: SampleSink + PendingStore {
    /// Up to `max` samples with `seq > after` that are not committed yet (the embedded store also
    /// returns retained committed ones), ascending. `consumer` names the reader for stores that
    /// track delivery per reader (Redis consumer groups); others ignore it.
    async fn read(
        &self,
        after: u64,
        max: usize,
        consumer: &str,
    ) -> Result<Vec<StoredSample>, LogError>;

    /// The samples [`SampleLog::read`] returns, as records of the sample codec: for a trainer page
    /// in MessagePack, which is then written from them without decoding any. By default the
    /// samples are read and encoded again; a store that keeps the codec's records returns them.
    async fn read_records(
        &self,
        after: u64,
        max: usize,
        consumer: &str,
    ) -> Result<Vec<EncodedSample>, LogError> {
        self.read(after, max, consumer)
            .await?
            .into_iter()
            .map(|s| {
                EncodedSample::from_sample(s.seq, &s.sample).map_err(|e| {
                    LogError::store(format!("sample {} could not be encoded: {e}", s.seq))
                })
            })
            .collect()
    }

    /// The bytes of the image stored under `hash` (SHA-256, hex; a sample's `images[].hash`)
    /// while a kept sample references it. By default none: a store that does not keep images
    /// ([`SampleLog::keeps_images`]).
    async fn blob(&self, _hash: &str) -> Result<Option<Vec<u8>>, LogError> {
        Ok(None)
    }

    /// Whether the store keeps the images of the samples it stores (once per hash, until no
    /// kept sample references them): turns with images are captured only into such a store.
    fn keeps_images(&self) -> bool {
        false
    }

    /// The kept sample stored under `seq`, without delivering it to any reader (no consumer
    /// group sees it as read): for the inspection page. `None` when no such sample is kept (never
    /// stored, or compacted after its commit).
    async fn get(&self, seq: u64) -> Result<Option<StoredSample>, LogError>;

    /// Waits until a sample with `seq > after` exists or `timeout` passed; returns the last seq.
    async fn wait_newer(&self, after: u64, timeout: Duration) -> Result<u64, LogError>;

    /// Records that every sample up to `through` that `consumer` was given is consumed. The commit
    /// point never moves back; beyond the last seq: [`LogError::CommitAhead`]. Stores that track
    /// delivery per reader acknowledge only that consumer's samples; others ignore `consumer`.
    async fn commit(&self, through: u64, consumer: &str) -> Result<(), LogError>;

    /// The current counters.
    async fn stats(&self) -> Result<StoreStats, LogError>;

    /// Finishes what was accepted and releases the store (the embedded store stops its writer so
    /// that a restarted server can open the file at once). Other handles fail afterwards.
    async fn close(&self) -> Result<(), LogError>;

    /// Where the samples are, for logs and errors (a file path, or a URL without its password).
    fn describe(&self) -> String;
}
