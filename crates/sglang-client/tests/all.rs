//! The integration tests of `ps-sglang-client` in one binary: each file beside this one is a module
//! of it, so that the tests link once and share one instance of their dependencies' generic code
//! (CI time, issue 32); they run in parallel as before.

mod assemble_props;
mod sse_props;
mod tree_equivalence;
mod vllm_recorded;
