//! What redb's quick repair costs per commit, and what it spares after a crash: the evidence for
//! the store's `QUICK_REPAIR` (docs/benchmarks-history.md, "The store's commits without quick
//! repair").
//!
//! `cargo run --release -p ps-sample-store --example quick_repair -- --commits 15000`: for quick
//! repair on and off, a child process commits that many samples of the store's shape (six 16 KB
//! pieces, one durable transaction each) into a fresh file under `--dir`, prints its CPU and wall
//! time per commit and aborts without closing the file; the parent then opens the file (redb
//! repairs it) and prints how long that took. `--cold` drops the OS page cache before the open
//! (needs root).

#![allow(clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use clap::Parser;
use redb::{Database, TableDefinition};

const SAMPLES: TableDefinition<(u64, u32), &[u8]> = TableDefinition::new("samples");
const PIECE: usize = 16_000;
const PIECES: u32 = 6;

#[derive(Parser)]
struct Options {
    #[arg(long, default_value_t = 5_000)]
    commits: u64,
    /// Where the files are written (default: a temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Drop the OS page cache before reopening (root only).
    #[arg(long)]
    cold: bool,
    /// Internal: the child that writes and aborts, with quick repair on or off.
    #[arg(long, hide = true)]
    write: Option<bool>,
}

/// This process's CPU time in seconds: the nanoseconds on CPU of each of its threads, from
/// `/proc/self/task/*/schedstat`, as the store bench measures its writer (Linux).
fn cpu_seconds() -> f64 {
    let tasks = std::fs::read_dir("/proc/self/task").expect("/proc/self/task");
    let ns: u64 = tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 / 1e9
}

fn file_of(dir: &Path, quick_repair: bool) -> PathBuf {
    dir.join(format!("quick-repair-{quick_repair}.redb"))
}

fn write_and_abort(file: &Path, commits: u64, quick_repair: bool) -> ! {
    let _ = std::fs::remove_file(file);
    let db = Database::builder()
        .set_cache_size(ps_sample_store::DEFAULT_CACHE_BYTES)
        .create(file)
        .expect("create");
    let piece = vec![7u8; PIECE];
    let (cpu, wall) = (cpu_seconds(), Instant::now());
    for seq in 0..commits {
        let mut txn = db.begin_write().expect("begin");
        txn.set_quick_repair(quick_repair);
        {
            let mut table = txn.open_table(SAMPLES).expect("table");
            for i in 0..PIECES {
                table.insert((seq, i), piece.as_slice()).expect("insert");
            }
        }
        txn.commit().expect("commit");
    }
    let size = std::fs::metadata(file).map_or(0, |m| m.len());
    println!(
        "quick repair {quick_repair}: {commits} commits, CPU {:.3} ms and wall {:.3} ms per commit, file {:.2} GB",
        (cpu_seconds() - cpu) * 1e3 / commits as f64,
        wall.elapsed().as_secs_f64() * 1e3 / commits as f64,
        size as f64 / 1e9
    );
    // A crash: the file is never closed.
    std::process::abort()
}

fn main() {
    let opts = Options::parse();
    let tmp = tempfile::tempdir().expect("temporary directory");
    let dir = opts.dir.clone().unwrap_or_else(|| tmp.path().to_owned());
    std::fs::create_dir_all(&dir).expect("--dir");
    if let Some(quick_repair) = opts.write {
        write_and_abort(&file_of(&dir, quick_repair), opts.commits, quick_repair);
    }
    for quick_repair in [true, false] {
        let status = Command::new(std::env::current_exe().expect("this binary"))
            .args(["--commits", &opts.commits.to_string(), "--dir"])
            .arg(&dir)
            .arg(format!("--write={quick_repair}"))
            .status()
            .expect("the writer");
        assert!(!status.success(), "the writer aborts: {status:?}");
        if opts.cold {
            let _ = Command::new("sync").status();
            std::fs::write("/proc/sys/vm/drop_caches", "3").expect("--cold needs root");
        }
        let file = file_of(&dir, quick_repair);
        let (cpu, wall) = (cpu_seconds(), Instant::now());
        let db = Database::builder()
            .set_cache_size(ps_sample_store::DEFAULT_CACHE_BYTES)
            .create(&file)
            .expect("reopen");
        println!(
            "  reopened after the crash in {:.3} s ({:.3} s of CPU)",
            wall.elapsed().as_secs_f64(),
            cpu_seconds() - cpu
        );
        drop(db);
        let _ = std::fs::remove_file(&file);
    }
}
