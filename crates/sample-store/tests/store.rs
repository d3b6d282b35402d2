//! The durable store's contract, against real database files in temporary directories.

use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use ps_core::SampleSink;
use ps_core::sample::{Reward, Sample, SampleStatus};
use ps_sample_store::{
    DB_FILE_NAME, SampleStore, StoreConfig, StoreError, StoreStats, StoredSample,
};
use serde_json::json;
use support::{append_tags, config, open, sample, stored};

fn seqs(samples: &[StoredSample]) -> Vec<u64> {
    samples.iter().map(|s| s.seq).collect()
}

#[tokio::test]
async fn appends_get_increasing_seqs_and_read_back_in_order_with_index_set() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    assert_eq!(store.stats().last_seq, 0);

    let got = append_tags(&store, (0..5).map(|i| format!("s{i}"))).await;
    assert_eq!(got, vec![1, 2, 3, 4, 5]);

    let read = store.read(0, 100).await.unwrap();
    assert_eq!(seqs(&read), vec![1, 2, 3, 4, 5]);
    for (i, item) in read.iter().enumerate() {
        assert_eq!(item.sample.index, item.seq);
        assert_eq!(item.sample.group_index, item.seq);
        assert_eq!(item.sample, stored(sample(&format!("s{i}")), item.seq));
    }
    assert_eq!(
        store.stats(),
        StoreStats {
            last_seq: 5,
            committed: 0,
            stored: 5,
            lag: 5
        }
    );
}

#[tokio::test]
async fn read_returns_seqs_after_the_cursor_up_to_max() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    append_tags(&store, (0..10).map(|i| format!("s{i}"))).await;

    assert_eq!(seqs(&store.read(3, 4).await.unwrap()), vec![4, 5, 6, 7]);
    assert_eq!(seqs(&store.read(8, 100).await.unwrap()), vec![9, 10]);
    assert_eq!(seqs(&store.read(0, 1).await.unwrap()), vec![1]);
    assert!(store.read(10, 100).await.unwrap().is_empty());
    assert!(store.read(u64::MAX, 100).await.unwrap().is_empty());
    assert!(store.read(0, 0).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_newer_wakes_on_append() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());

    let waiter = tokio::spawn({
        let store = store.clone();
        async move { store.wait_newer(0, Duration::from_secs(60)).await }
    });
    // Whether the waiter subscribed before or after the append, it must see seq 1.
    tokio::task::yield_now().await;
    assert_eq!(store.append(&sample("a")).await.unwrap(), 1);
    assert_eq!(waiter.await.unwrap(), 1);

    // Already newer: returns at once with the current last seq.
    assert_eq!(store.wait_newer(0, Duration::from_secs(60)).await, 1);
}

#[tokio::test(start_paused = true)]
async fn wait_newer_returns_the_current_seq_after_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    assert_eq!(store.wait_newer(0, Duration::from_secs(30)).await, 0);

    store.append(&sample("a")).await.unwrap();
    assert_eq!(store.wait_newer(1, Duration::from_secs(30)).await, 1);
}

#[tokio::test]
async fn commit_ahead_of_the_last_seq_is_an_error_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    append_tags(&store, ["a".into(), "b".into(), "c".into()]).await;

    let err = store.commit(7).await.unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::CommitAhead {
                through: 7,
                last_seq: 3
            }
        ),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(message.contains('7') && message.contains('3'), "{message}");
    assert_eq!(store.stats().committed, 0);
}

#[tokio::test]
async fn commit_never_moves_back_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = SampleStore::open(config(dir.path(), 100, 64)).unwrap();
    append_tags(&store, (0..5).map(|i| format!("s{i}"))).await;

    store.commit(3).await.unwrap();
    store.commit(1).await.unwrap();
    store.commit(3).await.unwrap();
    assert_eq!(store.stats().committed, 3);
    assert_eq!(store.stats().lag, 2);
    store.close().await.unwrap();

    let store = SampleStore::open(config(dir.path(), 100, 64)).unwrap();
    assert_eq!(
        store.stats(),
        StoreStats {
            last_seq: 5,
            committed: 3,
            stored: 5,
            lag: 2
        }
    );
    assert_eq!(store.append(&sample("next")).await.unwrap(), 6);
}

#[tokio::test]
async fn retention_deletes_only_committed_samples_beyond_the_retained_count() {
    let dir = tempfile::tempdir().unwrap();
    let store = SampleStore::open(config(dir.path(), 2, 64)).unwrap();
    append_tags(&store, (1..=10).map(|i| format!("s{i}"))).await;

    store.commit(6).await.unwrap();
    // Committed 1..=6, the two most recent of them (5, 6) are kept, 7..=10 are not committed.
    assert_eq!(
        seqs(&store.read(0, 100).await.unwrap()),
        vec![5, 6, 7, 8, 9, 10]
    );
    assert_eq!(store.stats().stored, 6);

    store.commit(10).await.unwrap();
    let kept = store.read(0, 100).await.unwrap();
    assert_eq!(seqs(&kept), vec![9, 10]);
    assert_eq!(kept[0].sample, stored(sample("s9"), 9));
    assert_eq!(
        store.stats(),
        StoreStats {
            last_seq: 10,
            committed: 10,
            stored: 2,
            lag: 0
        }
    );
}

#[tokio::test]
async fn seqs_are_never_reused_after_compaction_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    append_tags(&store, ["a".into(), "b".into(), "c".into()]).await;
    store.commit(3).await.unwrap();
    assert!(store.read(0, 100).await.unwrap().is_empty());
    assert_eq!(store.stats().stored, 0);
    store.close().await.unwrap();

    let store = open(dir.path());
    assert_eq!(store.stats().last_seq, 3);
    assert_eq!(store.stats().stored, 0);
    assert_eq!(store.append(&sample("d")).await.unwrap(), 4);
    assert_eq!(seqs(&store.read(0, 100).await.unwrap()), vec![4]);
}

#[tokio::test]
async fn reopening_with_a_smaller_retention_compacts_what_is_committed() {
    let dir = tempfile::tempdir().unwrap();
    let store = SampleStore::open(config(dir.path(), 100, 64)).unwrap();
    append_tags(&store, (1..=6).map(|i| format!("s{i}"))).await;
    store.commit(4).await.unwrap();
    assert_eq!(store.stats().stored, 6);
    store.close().await.unwrap();

    let store = SampleStore::open(config(dir.path(), 1, 64)).unwrap();
    assert_eq!(seqs(&store.read(0, 100).await.unwrap()), vec![4, 5, 6]);
    assert_eq!(store.stats().stored, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appenders_get_distinct_seqs_and_lose_nothing() {
    const TASKS: usize = 16;
    const EACH: usize = 25;
    let dir = tempfile::tempdir().unwrap();
    let store = SampleStore::open(config(dir.path(), 0, 8)).unwrap();

    let mut handles = Vec::new();
    for task in 0..TASKS {
        let store = store.clone();
        handles.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for i in 0..EACH {
                let tag = format!("t{task}-{i}");
                let seq = store.append(&sample(&tag)).await.unwrap();
                got.push((seq, tag));
            }
            got
        }));
    }
    let mut appended = Vec::new();
    for handle in handles {
        let got = handle.await.unwrap();
        // One appender's samples get increasing seqs.
        assert!(got.windows(2).all(|w| w[0].0 < w[1].0));
        appended.extend(got);
    }

    let distinct: BTreeSet<u64> = appended.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(distinct.len(), TASKS * EACH);
    assert_eq!(distinct, (1..=(TASKS * EACH) as u64).collect());

    let read = store.read(0, 10_000).await.unwrap();
    assert_eq!(read.len(), TASKS * EACH);
    for (seq, tag) in appended {
        let item = &read[(seq - 1) as usize];
        assert_eq!(item.seq, seq);
        assert_eq!(item.sample, stored(sample(&tag), seq));
    }
}

/// A sample exercising every field: teacher fields, nested metadata of every JSON kind, and
/// f64 values whose bits must survive (signed zero, subnormal, extremes, infinities, NaN with a
/// payload), large enough to be stored in several chunks.
fn full_sample() -> Sample {
    let mut rollout_log_probs = vec![
        -0.0,
        0.1,
        -1e-300,
        f64::MIN_POSITIVE / 4.0,
        f64::MAX,
        f64::MIN,
        f64::NEG_INFINITY,
        f64::INFINITY,
        f64::from_bits(0x7ff8_0000_dead_beef),
        std::f64::consts::PI,
    ];
    rollout_log_probs.extend((0..6_000).map(|i| -(f64::from(i) * 0.000_123_456_789).sin().abs()));
    let response_length = rollout_log_probs.len();
    let mut metadata = serde_json::Map::new();
    metadata.insert("model".into(), json!("policy-7b"));
    metadata.insert("unicode".into(), json!("ünïcødé ✓ 日本語"));
    metadata.insert("big".into(), json!(u64::MAX));
    metadata.insert("negative".into(), json!(i64::MIN));
    metadata.insert("float".into(), json!(0.1 + 0.2));
    metadata.insert("whole_float".into(), json!(2.0));
    metadata.insert("null".into(), serde_json::Value::Null);
    metadata.insert(
        "nested".into(),
        json!({"judge": {"votes": [1, -1, 0.5, true, null, "x"], "empty": {}, "list": []}}),
    );
    Sample {
        rollout_routed_experts: None,
        images: Vec::new(),
        index: 12345,
        group_index: 999,
        prompt: "<|im_start|>user\nhello\n<|im_end|>".repeat(50),
        response: "<think>hm</think> the answer is 42".repeat(50),
        tokens: (0..(response_length as u32 + 700))
            .map(|i| i.wrapping_mul(2_654_435_761) % 151_936)
            .collect(),
        response_length,
        loss_mask: (0..response_length).map(|i| u8::from(i % 7 != 0)).collect(),
        rollout_log_probs,
        reward: Reward {
            score: -0.000_123_456_789_012_345_6,
        },
        status: SampleStatus::Truncated,
        session_id: "sess-ü".into(),
        turn: 7,
        weight_versions: Vec::new(),
        teacher_log_probs: Some(vec![-0.0, -2.5, f64::NEG_INFINITY]),
        teacher_topk_log_probs: Some(vec![vec![-0.1, -2.3], vec![], vec![f64::MIN_POSITIVE]]),
        teacher_topk_indices: Some(vec![vec![5, 151_935], vec![], vec![u32::MAX]]),
        metadata,
    }
}

fn bits(values: &[f64]) -> Vec<u64> {
    values.iter().map(|v| v.to_bits()).collect()
}

#[tokio::test]
async fn a_sample_round_trips_exactly_including_f64_bits() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let original = full_sample();
    let seq = store.append(&original).await.unwrap();
    // A small one after it: chunk reassembly must not mix them.
    store.append(&sample("after")).await.unwrap();
    store.close().await.unwrap();

    let store = open(dir.path());
    let read = store.read(0, 10).await.unwrap();
    assert_eq!(read.len(), 2);
    let got = &read[0];
    assert_eq!(got.seq, seq);
    let expected = stored(original, seq);
    assert_eq!(
        bits(&got.sample.rollout_log_probs),
        bits(&expected.rollout_log_probs)
    );
    assert_eq!(
        bits(got.sample.teacher_log_probs.as_deref().unwrap()),
        bits(expected.teacher_log_probs.as_deref().unwrap())
    );
    assert_eq!(
        got.sample.reward.score.to_bits(),
        expected.reward.score.to_bits()
    );
    assert_eq!(
        got.sample.metadata["float"].as_f64().unwrap().to_bits(),
        (0.1f64 + 0.2).to_bits()
    );
    // Everything else (NaN aside, which `==` cannot compare) by value.
    let without_nan = |mut sample: Sample| {
        sample.rollout_log_probs.retain(|v| !v.is_nan());
        sample
    };
    assert_eq!(without_nan(got.sample.clone()), without_nan(expected));
    assert_eq!(read[1].sample, stored(sample("after"), read[1].seq));
}

/// Writes and reads back 40 samples of ~100 KB; returns the bytes left in the page cache.
#[allow(clippy::unwrap_used)] // a test helper: a failure should panic, as in the tests
async fn cache_after_40_large_samples(cache_bytes: usize) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let store = SampleStore::open(StoreConfig {
        cache_bytes,
        ..config(dir.path(), 1_000, 8)
    })
    .unwrap();
    for _ in 0..40 {
        store.append(&full_sample()).await.unwrap();
    }
    let read = store.read(0, 64).await.unwrap();
    assert_eq!(read.len(), 40);
    assert!(
        read.iter()
            .all(|s| s.sample.rollout_log_probs.len() == 6_010)
    );
    store.cache_used_bytes()
}

#[tokio::test]
async fn the_page_cache_stays_within_its_bound() {
    const MIB: usize = 1024 * 1024;
    // With room for everything, the ~4 MB written and read stay cached: the bound is what limits.
    assert!(cache_after_40_large_samples(64 * MIB).await > 2 * MIB);
    assert!(cache_after_40_large_samples(MIB).await <= MIB);
}

#[tokio::test]
async fn export_jsonl_writes_every_kept_sample_as_one_line_each() {
    let dir = tempfile::tempdir().unwrap();
    let store = SampleStore::open(config(dir.path(), 1, 64)).unwrap();
    let mut teacher = sample("teacher");
    teacher.teacher_log_probs = Some(vec![-0.25, -1.5]);
    teacher.teacher_topk_log_probs = Some(vec![vec![-0.25, -3.0], vec![-1.5, -2.0]]);
    teacher.teacher_topk_indices = Some(vec![vec![11, 12], vec![13, 14]]);
    teacher.metadata.insert("ratio".into(), json!(1.0 / 3.0));
    store.append(&sample("a")).await.unwrap();
    store.append(&sample("b")).await.unwrap();
    store.append(&teacher).await.unwrap();
    store.append(&sample("d")).await.unwrap();
    // Deletes seq 1 (retain 1 of the 2 committed).
    store.commit(2).await.unwrap();

    let mut out = Vec::new();
    let count = store.export_jsonl(&mut out).unwrap();
    assert_eq!(count, 3);
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3);
    assert!(text.ends_with('\n'));
    let parsed: Vec<StoredSample> = lines
        .iter()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(parsed, store.read(0, 100).await.unwrap());
    assert_eq!(seqs(&parsed), vec![2, 3, 4]);
    let first: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(first["seq"], json!(2));
    assert_eq!(first["sample"]["index"], json!(2));
    assert_eq!(first["sample"]["session_id"], json!("b"));
}

#[tokio::test]
async fn the_sink_trait_appends() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let sink: std::sync::Arc<dyn SampleSink> = std::sync::Arc::new(store.clone());
    assert_eq!(sink.submit(&sample("a")).await.unwrap(), 1);
    assert_eq!(sink.submit(&sample("b")).await.unwrap(), 2);
    assert_eq!(store.read(0, 10).await.unwrap()[1].sample.session_id, "b");
}

#[tokio::test]
async fn after_close_appends_and_commits_fail_with_closed_and_reads_still_work() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let other = store.clone();
    store.append(&sample("a")).await.unwrap();
    store.close().await.unwrap();

    let err = other.append(&sample("b")).await.unwrap_err();
    assert!(matches!(err, StoreError::Closed { .. }), "{err:?}");
    assert!(err.to_string().contains(DB_FILE_NAME), "{err}");
    assert!(matches!(
        other.commit(1).await.unwrap_err(),
        StoreError::Closed { .. }
    ));
    let sink_err = SampleSink::submit(&other, &sample("c")).await.unwrap_err();
    assert!(sink_err.to_string().contains("closed"), "{sink_err}");
    assert_eq!(seqs(&other.read(0, 10).await.unwrap()), vec![1]);
}

#[test]
fn a_corrupted_database_file_is_an_open_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(DB_FILE_NAME);
    std::fs::write(&file, vec![0x5a; 64 * 1024]).unwrap();
    let err = SampleStore::open(StoreConfig::new(dir.path())).unwrap_err();
    assert!(matches!(err, StoreError::Open { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&file.display().to_string()),
        "{err}"
    );
}

#[test]
fn a_store_path_that_is_a_file_is_an_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("not-a-dir");
    std::fs::write(&path, b"x").unwrap();
    let err = SampleStore::open(StoreConfig::new(&path)).unwrap_err();
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
}

#[tokio::test]
async fn a_store_opened_twice_is_an_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let _first = open(dir.path());
    let err = SampleStore::open(StoreConfig::new(dir.path())).unwrap_err();
    assert!(matches!(err, StoreError::Open { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&dir.path().display().to_string()),
        "{err}"
    );
    assert!(err.chain().contains("already open"), "{}", err.chain());
}

#[test]
fn a_zero_batch_size_is_a_config_error_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let err = SampleStore::open(config(dir.path(), 0, 0)).unwrap_err();
    assert!(err.to_string().contains("max_batch"), "{err}");
}

/// A writer that blocks its first write until released.
struct Gate {
    entered: std::sync::mpsc::Sender<()>,
    release: std::sync::mpsc::Receiver<()>,
    out: Vec<u8>,
    opened: bool,
}

impl std::io::Write for Gate {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if !self.opened {
            self.opened = true;
            let _ = self.entered.send(());
            let _ = self.release.recv();
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_read_blocks_neither_appends_nor_commits_and_sees_its_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    append_tags(&store, ["a".into(), "b".into()]).await;

    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel();
    let exporter = std::thread::spawn({
        let store = store.clone();
        move || {
            let mut gate = Gate {
                entered: entered_tx,
                release: release_rx,
                out: Vec::new(),
                opened: false,
            };
            let count = store.export_jsonl(&mut gate).unwrap();
            (count, gate.out)
        }
    });
    // The export holds its read transaction, stuck in a write.
    tokio::task::spawn_blocking(move || entered.recv().unwrap())
        .await
        .unwrap();

    assert_eq!(store.append(&sample("c")).await.unwrap(), 3);
    store.commit(3).await.unwrap();
    assert!(store.read(0, 10).await.unwrap().is_empty());

    release.send(()).unwrap();
    let (count, out) = tokio::task::spawn_blocking(move || exporter.join().unwrap())
        .await
        .unwrap();
    assert_eq!(count, 2, "the export saw the store as it was when it began");
    assert_eq!(String::from_utf8(out).unwrap().lines().count(), 2);
}

#[tokio::test]
async fn a_sample_is_got_by_seq_and_reading_is_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    append_tags(&store, (0..4).map(|i| format!("s{i}"))).await;
    let log: &dyn ps_core::SampleLog = &store;
    let got = log.get(3).await.unwrap().unwrap();
    assert_eq!((got.seq, got.sample), (3, stored(sample("s2"), 3)));
    assert!(log.get(0).await.unwrap().is_none());
    assert!(log.get(5).await.unwrap().is_none());
    assert_eq!(seqs(&store.read(0, 100).await.unwrap()), vec![1, 2, 3, 4]);
}
