//! The integration tests of `ps-provider-client` in one binary: each file beside this one is a
//! module of it, so that the tests link once and share one instance of their dependencies' generic
//! code (CI time, issue 32); they run in parallel as before. `client.rs` stays a binary of its own:
//! it reads what a thread-local tracing subscriber and metrics recorder record, and tracing decides
//! each callsite's interest process-wide.

mod judge;
