//! The process's allocator: jemalloc, set to give freed memory back to the system within 100 ms.
//!
//! Measured on the agent scenario (docs/benchmarks-history.md, "jemalloc instead of mimalloc"):
//! the proxy allocates and frees ~300 kB a request in blocks of 50–100 kB (bodies, answers,
//! rendered prompts) on ~20 threads. mimalloc, even purging at once, kept most of what a burst had
//! touched (peak 211–234 MiB, 4× its start at the end): such blocks share its larger pages, and a
//! page goes back only when all of it is free. jemalloc gives back free runs of 4 KiB pages
//! after `dirty_decay_ms`; with 100 ms the peak was 137–141 MiB and the end 2× the start, at the
//! same CPU per request (0.50–0.56 of the fake's against mimalloc's 0.53–0.61). With 0 ms the
//! peak was 118–124 MiB at ~25 % more CPU than with 100 ms (measured with jemalloc's default
//! arenas and caches, before the settings below); an operator who prefers that sets
//! `_RJEM_MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0` (read after the settings compiled in
//! here, so it wins; any other jemalloc option the same way).
//!
//! Two arenas instead of jemalloc's four per CPU (eight here), and thread caches for blocks up
//! to 4 KiB instead of 32 KiB: the ~20 threads that allocate (tokio's workers, the blocking pool,
//! capture, the store's writer) each keep a cache of freed blocks, and share the arenas' freed
//! pages and partly used slabs. In the agent scenario on 2 cores (docs/benchmarks-history.md,
//! "jemalloc with two arenas and small thread caches") the two together took the peak from
//! 112.3–119.9 MiB (jemalloc's defaults, median 114.6 of twelve runs) to 108.7–112.4 (median 111.0
//! of twelve), the arenas about two thirds of it, at no CPU cost these runs could see (the arms of
//! a pair differ by up to ~20 %). Measured on 2 cores only: blocks past the thread caches take an
//! arena's lock, and on a machine with many cores an operator who sees that lock in a profile
//! restores jemalloc's defaults with `_RJEM_MALLOC_CONF=narenas:default,tcache_max:32768`. (This
//! proxy's allocation rate follows the engine's answers: ~300 kB a request, at ~130 requests a
//! second here.)
//!
//! Transparent huge pages stay off for this process: where THP is on, the kernel's `khugepaged`
//! fills a 2 MiB huge page around every few small pages still in use, so a heap that was just
//! given back grows again in RSS while the proxy is idle. `MIMALLOC_ALLOW_THP=1` (the name it had
//! with mimalloc) or `POLICY_SERVING_ALLOW_THP=1` keeps them.
//!
//! The `system-alloc` feature leaves the system allocator in place, so that `heaptrack` and
//! `valgrind --tool=massif`, which intercept `malloc`, see every allocation (the heap profiles of
//! docs/benchmarks-history.md were made that way). Not for production: it costs CPU and memory.
//! jemalloc is the default feature `jemalloc` (built from source: `make` and a C compiler);
//! `--no-default-features` leaves it out of the build too, and so uses the system allocator.
//!
//! The only `unsafe` of the workspace: jemalloc's configuration symbol, the read of one of its
//! settings, and one `prctl` (and, in this module's test, one more read and one more `prctl`).
#![allow(unsafe_code)]

#[cfg(all(feature = "jemalloc", not(feature = "system-alloc")))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The settings jemalloc reads at its first allocation, before `main` runs: background threads
/// that give freed pages back while the proxy is idle, dirty pages kept at most 100 ms, none
/// kept "muzzy" (lazily freed pages still counted in RSS), two arenas, thread caches for blocks
/// up to 4 KiB.
#[cfg(all(feature = "jemalloc", not(feature = "system-alloc")))]
const MALLOC_CONF: &[u8] =
    b"background_thread:true,dirty_decay_ms:100,muzzy_decay_ms:0,narenas:2,tcache_max:4096\0";

/// jemalloc's `malloc_conf` (the `_rjem_` prefix is the one `tikv-jemalloc-sys` builds it with).
// SAFETY: jemalloc reads this symbol as a `const char *` to a NUL-terminated string; its own
// definition is weak (a null pointer), so this one takes its place. A reference to an array is one
// pointer to its first byte, and `MALLOC_CONF` ends with NUL (checked at compile time below).
#[cfg(all(feature = "jemalloc", not(feature = "system-alloc")))]
#[unsafe(export_name = "_rjem_malloc_conf")]
static JEMALLOC_CONF: &[u8; MALLOC_CONF.len()] = match MALLOC_CONF.as_array() {
    Some(conf) => conf,
    None => unreachable!(),
};

#[cfg(all(feature = "jemalloc", not(feature = "system-alloc")))]
const _: () = assert!(matches!(MALLOC_CONF.last(), Some(0)), "NUL-terminated");

/// The allocator's settings in effect, for the start-up log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// `jemalloc` or `system`.
    pub allocator: &'static str,
    /// How long jemalloc keeps freed pages before giving them back, in ms (`None`: the system
    /// allocator).
    pub dirty_decay_ms: Option<i64>,
    /// Whether jemalloc's background threads run (they give pages back while the proxy is idle).
    pub background_thread: Option<bool>,
    /// jemalloc's arenas for threads' allocations (`None`: the system allocator).
    pub arenas: Option<u32>,
    /// The largest block a thread's cache keeps, in bytes (`None`: the system allocator).
    pub tcache_max: Option<usize>,
    /// Whether transparent huge pages are off for this process.
    pub thp_disabled: bool,
}

/// Turns transparent huge pages off for this process and reports the allocator's settings.
/// Call first thing in `main` (the flag covers the whole process, jemalloc's background thread,
/// started at its first allocation, included).
pub fn give_memory_back() -> Tuning {
    Tuning {
        thp_disabled: disable_thp(),
        ..settings()
    }
}

#[cfg(all(feature = "jemalloc", not(feature = "system-alloc")))]
fn settings() -> Tuning {
    // SAFETY: `opt.dirty_decay_ms` is an `ssize_t` option (jemalloc's mallctl namespace), read as
    // one.
    let decay = unsafe { tikv_jemalloc_ctl::raw::read::<libc::ssize_t>(b"opt.dirty_decay_ms\0") };
    Tuning {
        allocator: "jemalloc",
        dirty_decay_ms: decay.ok().and_then(|d| i64::try_from(d).ok()),
        background_thread: tikv_jemalloc_ctl::background_thread::read().ok(),
        // `opt.narenas`, not `arenas.narenas`: the latter also counts the arena jemalloc keeps
        // for blocks past `oversize_threshold`.
        arenas: tikv_jemalloc_ctl::opt::narenas::read().ok(),
        tcache_max: tikv_jemalloc_ctl::opt::tcache_max::read().ok(),
        thp_disabled: false,
    }
}

#[cfg(not(all(feature = "jemalloc", not(feature = "system-alloc"))))]
fn settings() -> Tuning {
    Tuning {
        allocator: "system",
        dirty_decay_ms: None,
        background_thread: None,
        arenas: None,
        tcache_max: None,
        thp_disabled: false,
    }
}

/// An operator who wants huge pages back sets `POLICY_SERVING_ALLOW_THP` (or, as before,
/// `MIMALLOC_ALLOW_THP`) to a non-zero value.
fn thp_allowed_by_operator() -> bool {
    ["POLICY_SERVING_ALLOW_THP", "MIMALLOC_ALLOW_THP"]
        .iter()
        .any(|var| std::env::var(var).is_ok_and(|v| !v.trim().is_empty() && v.trim() != "0"))
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

    /// The settings compiled in are the ones in effect (unless the environment running the tests
    /// sets jemalloc's own), and huge pages go off.
    #[test]
    fn jemalloc_gives_pages_back_within_100_ms_with_two_arenas_and_small_caches_and_thp_goes_off() {
        let tuning = give_memory_back();
        #[cfg(all(feature = "jemalloc", not(feature = "system-alloc")))]
        {
            assert_eq!(tuning.allocator, "jemalloc");
            if std::env::var_os("_RJEM_MALLOC_CONF").is_none() {
                assert_eq!(tuning.dirty_decay_ms, Some(100));
                assert_eq!(tuning.background_thread, Some(true));
                assert_eq!(tuning.arenas, Some(2));
                assert_eq!(tuning.tcache_max, Some(4096));
                // SAFETY: as in `settings`.
                let muzzy = unsafe {
                    tikv_jemalloc_ctl::raw::read::<libc::ssize_t>(b"opt.muzzy_decay_ms\0")
                };
                assert_eq!(muzzy.ok(), Some(0));
            }
        }
        #[cfg(not(all(feature = "jemalloc", not(feature = "system-alloc"))))]
        assert_eq!((tuning.allocator, tuning.dirty_decay_ms), ("system", None));
        #[cfg(target_os = "linux")]
        if !thp_allowed_by_operator() {
            assert!(tuning.thp_disabled);
            // SAFETY: as in `disable_thp`.
            let flag = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
            assert_eq!(flag, 1);
        }
    }
}
