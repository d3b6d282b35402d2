//! The sample log on Redis Streams: for deployments where several proxies, on several machines,
//! feed one trainer.
//!
//! This crate owns one idea: keeping the trainer's sample log ([`ps_core::SampleLog`]) in a Redis
//! stream instead of the embedded redb file, with the same guarantees the rollout HTTP API gives
//! over the embedded store.
//!
//! - **One stream per deployment.** Every replica appends to `ps:{<deployment>}:samples`. A Lua
//!   script takes the next number of a shared counter and adds the entry under the stream ID
//!   `<seq>-0` in one step, so sequence numbers are strictly increasing across replicas and the
//!   stream ID *is* the seq the trainer sees. (All keys share the `{<deployment>}` hash tag, so a
//!   Redis Cluster keeps them on one node.)
//! - **Nothing lost on the way in.** An append is retried across connection loss and a Redis
//!   restart for up to `retry_for`, and it is idempotent: each append carries a token, and a retry
//!   of an append that did land returns the seq it got instead of adding a duplicate.
//! - **Trainers read as a consumer group.** Pulls go through `XREADGROUP` in the group
//!   (`trainer` by default) under the consumer name the trainer gives; what was delivered and not
//!   committed stays in the consumer's pending list and is delivered again on the next pull from
//!   the commit point (at-least-once, as the embedded store). Entries a consumer left pending for
//!   longer than `claim_idle` are reclaimed (`XAUTOCLAIM`) by the next consumer that pulls, so a
//!   dead trainer worker loses nothing.
//! - **Commit acknowledges.** Committing through a seq acknowledges (`XACK`) every pending entry up
//!   to it, records the commit point and trims the stream (`XTRIM MINID`) down to the
//!   `retain_committed` most recent committed entries. Uncommitted entries are never trimmed.
//!
//! Durability is Redis's: run it with `appendonly yes` (and `appendfsync always` for the embedded
//! store's guarantee that an accepted sample survives a crash of the machine). [`RedisStore::open`]
//! reports how the server is configured.

mod config;
mod error;
mod store;
#[cfg(feature = "test-support")]
pub mod testing;

pub use config::{RedisConfig, redact_url};
pub use error::RedisStoreError;
pub use store::{Durability, RedisStore};
