//! The integration tests of `ps-chat-template` in one binary: each file beside this one is a module
//! of it, so that the tests link once and share one instance of their dependencies' generic code
//! (CI time, issue 32); they run in parallel as before.

mod common;

mod decode;
mod fingerprint;
mod golden;
mod incremental;
mod mini_model;
mod splice;
mod split_turn;
mod tojson;
mod unspliceable;
mod vl_prompt_parity;
