//! Test-only child process of `tests/store_crash.rs`: opens the store at `argv[1]` and appends samples
//! forever from several tasks, printing `<seq> <n>` (the seq the store returned and the number
//! the sample was generated from) only after `append` returned. The test kills it with SIGKILL.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ps_sample_store::{SampleStore, StoreConfig};

use ps_test_support::crash_sample;

const WRITERS: u64 = 8;

#[tokio::main]
async fn main() {
    let Some(dir) = std::env::args().nth(1) else {
        eprintln!("usage: store-crash-writer STORE_DIR");
        std::process::exit(2);
    };
    let mut config = StoreConfig::new(dir);
    config.max_batch = 16;
    let store = match SampleStore::open(config) {
        Ok(store) => store,
        Err(err) => {
            eprintln!("{}", err.chain());
            std::process::exit(1);
        }
    };
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..WRITERS {
        let store = store.clone();
        let next = Arc::clone(&next);
        tasks.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                match store.append(&crash_sample::sample(n)).await {
                    Ok(seq) => {
                        let mut stdout = std::io::stdout().lock();
                        let printed = writeln!(stdout, "{seq} {n}").and_then(|()| stdout.flush());
                        if printed.is_err() {
                            std::process::exit(0);
                        }
                    }
                    Err(err) => {
                        eprintln!("{}", err.chain());
                        std::process::exit(1);
                    }
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
}
