//! The sample log on Redis Streams: for deployments where several proxies, on several machines,
//! feed one trainer.
//!
//! This crate owns one idea: keeping the trainer's sample log ([`ps_core::SampleLog`]) in a Redis
//! stream instead of the embedded redb file, with the same guarantees the rollout HTTP API gives
//! over the embedded store.
//!
//! - **One stream per deployment.** Every replica appends to `ps:{<deployment>}:samples`. A Lua
//!   script adds the entry under the stream ID `<seq>-0` with the next number of a shared counter
//!   and only then moves the counter, in one step, so sequence numbers are strictly increasing
//!   across replicas, the stream ID *is* the seq the trainer sees, and a failure writes nothing.
//! - **Nothing lost on the way in.** An append is retried across connection loss and a Redis
//!   restart for up to `retry_for` (wall clock), and it is idempotent: its token is a hash of the
//!   encoded sample, so any retry of an append that did land returns the seq it got instead of
//!   adding a duplicate. A Redis that lost its data is noticed (the deployment's mark is gone).
//! - **Trainers read as a consumer group.** Pulls go through `XREADGROUP` in the group
//!   (`trainer` by default) under the consumer name the trainer gives; what was delivered and not
//!   committed stays in the consumer's pending list and is delivered again on the next pull from
//!   the commit point (at-least-once, as the embedded store). Entries *another* consumer left
//!   pending for longer than `claim_idle` are requeued under new seqs, above every cursor, by the
//!   next pull, so a dead trainer worker loses nothing.
//! - **Commit acknowledges.** Committing through a seq acknowledges (`XACK`) that consumer's
//!   pending entries up to it, records the commit point and trims the stream (`XTRIM MINID`) down to
//!   the `retain_committed` most recent committed entries, never at or above an entry still
//!   pending for anyone.
//!
//! Durability is Redis's: run it with `appendonly yes` (and `appendfsync always` for the embedded
//! store's guarantee that an accepted sample survives a crash of the machine). [`RedisStore::open`]
//! reports how the server is configured (persistence and `maxmemory-policy`).

mod config;
mod error;
mod scripts;
mod store;

pub use config::{RedisConfig, redact_url};
pub use error::RedisStoreError;
pub use store::{Durability, RedisStore};
