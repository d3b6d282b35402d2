//! The integration tests of `ps-app` in one binary: each file beside this one is a module of it, so
//! that the tests link once and share one instance of their dependencies' generic code (CI time,
//! issue 32); they run in parallel as before. `one_tokenizer.rs` stays a binary of its own: it
//! counts the tokenizers the whole process builds.

mod common;

mod bad_input;
mod doors;
mod experts;
mod faults;
mod images;
mod inspect;
mod opd;
mod provider;
mod redis;
mod rollout;
mod sampling;
mod sessions;
mod tokenizer;
