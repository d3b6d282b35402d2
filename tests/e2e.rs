//! The end-to-end tests of the built binary in one test binary (`harness.rs` says what each
//! shows): each file is a module, so that they link once (CI time, issue 32). The tests against
//! the real counterparts (`real_engine.rs`, `real_vl_engine.rs`, `real_openclaw.rs`) stay binaries
//! of their own, so that CI reports each one's time on its own line.

mod harness;

mod check;
mod crash;
mod inspect;
mod observability;
mod operators;
mod prometheus;
