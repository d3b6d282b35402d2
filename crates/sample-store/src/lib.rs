//! Durable storage of finished training samples.
//!
//! This crate owns what happens to a sample after its turn is scored: it is written to an
//! embedded redb database under a strictly increasing sequence number (never reused, also across
//! restarts and compaction), read back by the trainer in seq order with at-least-once delivery,
//! and deleted by retention once the trainer's commit point has passed it. An append returns only
//! after its write is durable, so a sample survives `kill -9` as soon as `append` (or
//! [`ps_core::SampleSink::submit`]) returned. Appends are group-committed by one writer thread;
//! reads use read transactions and never wait for it.
//!
//! It also provides [`channel_sink`], the non-durable in-process [`ps_core::SampleSink`] for
//! people embedding the crates in their own trainer.
//!
//! It depends only on `ps-core` and must not depend on a web framework: the HTTP routes of the
//! trainer protocol live in the server crate, on top of [`ps_core::SampleLog`], which [`SampleStore`] implements.

mod channel;
mod codec;
mod error;
mod store;

pub use channel::{ChannelSink, channel_sink};
pub use error::StoreError;
pub use ps_core::{StoreStats, StoredSample};
pub use store::{
    DB_FILE_NAME, DEFAULT_CACHE_BYTES, DEFAULT_MAX_BATCH, DEFAULT_RETAIN_COMMITTED, SampleStore,
    StoreConfig,
};
