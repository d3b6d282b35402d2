//! A sample survives `kill -9` once `append` returned: a real child process appends and prints
//! each seq after `append` returned, is killed with SIGKILL, and the reopened store must hold every
//! printed seq with its content.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::io::BufRead;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use ps_core::sample::Sample;
use ps_sample_store::{SampleStore, StoreConfig};
use ps_test_support::crash_sample;

fn open(dir: &std::path::Path) -> SampleStore {
    SampleStore::open(StoreConfig {
        retain_committed: 0,
        max_batch: 64,
        ..StoreConfig::new(dir)
    })
    .expect("open store")
}

/// `sample` as the store returns it under `seq`.
fn stored(mut sample: Sample, seq: u64) -> Sample {
    sample.index = seq;
    sample.group_index = seq;
    sample
}

/// Seqs to see printed before the kill.
const BEFORE_KILL: usize = 300;
const LINE_TIMEOUT: Duration = Duration::from_secs(60);

fn parse(line: &str) -> (u64, u64) {
    let mut parts = line.split_whitespace();
    let seq = parts.next().and_then(|s| s.parse().ok());
    let n = parts.next().and_then(|s| s.parse().ok());
    match (seq, n) {
        (Some(seq), Some(n)) => (seq, n),
        _ => panic!("unexpected line from the crash writer: {line:?}"),
    }
}

#[test]
fn every_printed_seq_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_store-crash-writer"))
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();

    // Complete lines only: a line cut by the kill was not fully printed.
    let stdout = child.stdout.take().unwrap();
    let (lines_tx, lines) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut stdout = std::io::BufReader::new(stdout);
        let mut line = String::new();
        while stdout.read_line(&mut line).unwrap_or(0) > 0 {
            if line.ends_with('\n') && lines_tx.send(parse(&line)).is_err() {
                break;
            }
            line.clear();
        }
    });

    let mut printed = BTreeMap::new();
    while printed.len() < BEFORE_KILL {
        match lines.recv_timeout(LINE_TIMEOUT) {
            Ok((seq, n)) => assert!(printed.insert(seq, n).is_none(), "seq {seq} printed twice"),
            Err(err) => {
                let _ = child.kill();
                panic!(
                    "the crash writer stopped printing after {} seqs: {err} (exit: {:?})",
                    printed.len(),
                    child.wait()
                );
            }
        }
    }
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert!(!status.success(), "the writer was killed: {status:?}");
    // What it printed before dying counts too.
    reader.join().unwrap();
    for (seq, n) in lines.try_iter() {
        assert!(printed.insert(seq, n).is_none(), "seq {seq} printed twice");
    }

    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store: SampleStore = open(dir.path());
        let last_seq = store.stats().last_seq;
        let max_printed = *printed.keys().next_back().unwrap();
        assert!(
            last_seq >= max_printed,
            "last_seq {last_seq} < printed {max_printed}"
        );

        let mut kept = BTreeMap::new();
        let mut after = 0;
        loop {
            let page = store.read(after, 500).await.unwrap();
            let Some(last) = page.last() else { break };
            after = last.seq;
            kept.extend(page.into_iter().map(|item| (item.seq, item.sample)));
        }
        // Nothing was committed: every seq ever handed out is there, without holes.
        assert_eq!(
            kept.keys().copied().collect::<Vec<_>>(),
            (1..=last_seq).collect::<Vec<_>>()
        );
        for (seq, n) in &printed {
            let sample = kept
                .get(seq)
                .unwrap_or_else(|| panic!("printed seq {seq} was lost"));
            // Its images are kept beside it (the sample carries their hashes, not their bytes).
            let mut want = stored(crash_sample::sample(*n), *seq);
            for image in &mut want.images {
                let bytes = image.bytes.take().unwrap();
                let kept = store.blob(&image.hash).await.unwrap();
                assert_eq!(
                    kept.as_deref(),
                    Some(&bytes[..]),
                    "seq {seq}: image {}",
                    image.hash
                );
            }
            // So are its blocks of routed experts.
            for block in want
                .rollout_routed_experts
                .iter_mut()
                .flat_map(|e| e.blocks.iter_mut())
            {
                let bytes = block.bytes.take().unwrap();
                let kept = store.blob(&block.hash).await.unwrap();
                assert_eq!(
                    kept.as_deref(),
                    Some(&bytes[..]),
                    "seq {seq}: experts block {}",
                    block.hash
                );
            }
            assert_eq!(*sample, want, "seq {seq}");
        }

        let next = store
            .append(&crash_sample::sample(1_000_000))
            .await
            .unwrap();
        assert!(next > last_seq, "new seq {next} must follow {last_seq}");
        store.close().await.unwrap();
    });
}
