//! The process's allocator: mimalloc, told to give freed memory back to the system.
//!
//! Two settings, both measured on the agent scenario (docs/benchmarks.md, "Memory: one tokenizer,
//! the start-up peak and what the heap keeps"):
//!
//! - **Purge at once.** mimalloc gives freed pages back ("purges" them) only some time after they
//!   become free (`purge_delay`, 1 s in mimalloc 3) and only when a thread allocates again after
//!   that, so a proxy that goes quiet after a burst keeps every page the burst touched.
//!   `MIMALLOC_PURGE_DELAY` set by the operator still wins.
//! - **No transparent huge pages for this process.** Where THP is on, the kernel's `khugepaged`
//!   fills a 2 MiB huge page around every few small pages still in use, so a heap that was just
//!   purged grows back in RSS while the proxy is idle (seen with THP `madvise` as with `always`).
//!
//! The `system-alloc` feature leaves the system allocator in place (mimalloc is still linked and
//! tuned, but unused), so that `heaptrack` and `valgrind --tool=massif`, which intercept
//! `malloc`, see every allocation: the heap profile of docs/benchmarks.md ("Memory, round two")
//! was made that way. Not for production: it costs CPU (see main.rs).
//!
//! The only `unsafe` of the workspace: calls into mimalloc's C API (which the `mimalloc` crate
//! links but does not wrap) and one `prctl`.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_long};

#[cfg(not(feature = "system-alloc"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Without it the `mimalloc` crate would be unused under `system-alloc`, and its C library,
/// which the option calls below need, not linked.
#[cfg(feature = "system-alloc")]
#[allow(dead_code, reason = "only its crate's C library is needed")]
static UNUSED: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc 3's `mi_option_t` (libmimalloc-sys 0.1.49, `mimalloc.h`).
/// The test below checks it against the option's documented default.
const MI_OPTION_PURGE_DELAY: c_int = 15;

// SAFETY (for both): plain C functions of the linked mimalloc without pointer arguments; an
// option number out of range is ignored by mimalloc.
unsafe extern "C" {
    fn mi_option_get(option: c_int) -> c_long;
    fn mi_option_set_default(option: c_int, value: c_long);
}

/// What [`give_memory_back`] set, for the start-up log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// The purge delay in effect, in ms (0 unless `MIMALLOC_PURGE_DELAY` says otherwise).
    pub purge_delay_ms: i64,
    /// Whether transparent huge pages are off for this process.
    pub thp_disabled: bool,
}

/// Freed pages go back to the system at once, and this process gets no transparent huge pages.
/// Call first thing in `main`, before threads start.
pub fn give_memory_back() -> Tuning {
    // SAFETY: see the extern block.
    unsafe { mi_option_set_default(MI_OPTION_PURGE_DELAY, 0) };
    Tuning {
        purge_delay_ms: purge_delay_ms(),
        thp_disabled: disable_thp(),
    }
}

/// The purge delay in effect, in ms.
#[allow(
    clippy::useless_conversion,
    reason = "`c_long` is 64 bits here but 32 on other targets"
)]
fn purge_delay_ms() -> i64 {
    // SAFETY: see the extern block.
    i64::from(unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) })
}

/// An operator who wants huge pages back sets `MIMALLOC_ALLOW_THP` to a non-zero value.
fn thp_allowed_by_operator() -> bool {
    std::env::var("MIMALLOC_ALLOW_THP").is_ok_and(|v| !v.trim().is_empty() && v.trim() != "0")
}

#[cfg(target_os = "linux")]
fn disable_thp() -> bool {
    if thp_allowed_by_operator() {
        return false;
    }
    let (on, unused): (libc::c_ulong, libc::c_ulong) = (1, 0);
    // SAFETY: `prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0)` takes no pointers (the kernel reads its
    // arguments as unsigned longs); it sets a flag of this process (inherited by children) and
    // fails harmlessly on kernels without it.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, on, unused, unused, unused) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn disable_thp() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_purge_delay_is_the_option_set_and_thp_goes_off() {
        // The option number is mimalloc's purge delay: its default (1000 ms in mimalloc 3) before
        // it is set, unless the environment running the tests sets it; 0 after.
        let from_env = std::env::var_os("MIMALLOC_PURGE_DELAY").is_some();
        if !from_env {
            assert_eq!(purge_delay_ms(), 1000);
        }
        let tuning = give_memory_back();
        if !from_env {
            assert_eq!(tuning.purge_delay_ms, 0);
        }
        #[cfg(target_os = "linux")]
        if !thp_allowed_by_operator() {
            assert!(tuning.thp_disabled);
            // SAFETY: as in `disable_thp`.
            let flag = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
            assert_eq!(flag, 1);
        }
    }
}
