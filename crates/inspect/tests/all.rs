//! The integration tests of `ps-inspect` in one binary: each file beside this one is a module of
//! it, so that the tests link once and share one instance of their dependencies' generic code (CI
//! time, issue 32); they run in parallel as before.

mod support;

mod browser;
mod router;
