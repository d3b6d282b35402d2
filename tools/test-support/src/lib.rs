//! What the tests of several crates share and the product never runs: a real `redis-server` per
//! test run ([`redis`]), a headless chromium driven through chromedriver ([`browser`]), where the
//! shared fixtures are ([`fixtures`]), and the sample the store's `kill -9` test and its child
//! process agree on ([`crash_sample`], with the child `store-crash-writer` and the test
//! `tests/store_crash.rs`), and the tree reading of answers the upstream client's raw reading is
//! checked against ([`tree_oracle`]).
//!
//! It lives in `tools/` with the rest of the workbench and is not a default member: a plain
//! `cargo build` never builds it; crates take it as a dev-dependency.

pub mod browser;
pub mod crash_sample;
pub mod fixtures;
pub mod redis;
pub mod tree_oracle;
