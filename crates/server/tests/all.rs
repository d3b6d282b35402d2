//! The integration tests of `ps-server` in one binary: each file beside this one is a module of it,
//! so that the tests link once and share one instance of their dependencies' generic code (CI time,
//! issue 32); they run in parallel as before. `error_log.rs` stays a binary of its own: it reads
//! what a thread-local tracing subscriber records, and tracing decides each callsite's interest
//! process-wide: the other tests, which set no subscriber, running beside it left its spans
//! unrecorded.

mod common;

mod engine_ids;
mod listen;
mod proxy;
