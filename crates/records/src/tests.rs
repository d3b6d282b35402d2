//! Tests of the record writer (they run as root, so permissions cannot make writes fail; paths under
//! a regular file do).

use std::{fs, path::Path, sync::Arc};

use serde_json::{Value, json};

use super::*;

fn opts(max_file_bytes: u64, queue: usize) -> RecordOptions {
    RecordOptions {
        max_file_bytes,
        queue,
        config_key: "logging.prm_record_dir",
    }
}

/// `(stamp, n)` of `<prefix>_YYYYMMDD_HHMMSS[_N].jsonl`, or `None` when the name has another shape.
fn name_key(prefix: &str, name: &str) -> Option<(String, u32)> {
    let rest = name
        .strip_prefix(prefix)?
        .strip_prefix('_')?
        .strip_suffix(".jsonl")?;
    let (date, rest) = rest.split_at_checked(8)?;
    let rest = rest.strip_prefix('_')?;
    let (time, rest) = rest.split_at_checked(6)?;
    if !date.bytes().chain(time.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n = match rest {
        "" => 0,
        r => r.strip_prefix('_')?.parse().ok()?,
    };
    Some((format!("{date}_{time}"), n))
}

/// The record files of `prefix` in `dir`, oldest first.
fn files(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut out: Vec<((String, u32), PathBuf)> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.to_owned();
            Some((name_key(prefix, &name)?, p))
        })
        .collect();
    out.sort();
    out.into_iter().map(|(_, p)| p).collect()
}

fn lines(path: &Path) -> Vec<Value> {
    fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn indices(path: &Path) -> Vec<u64> {
    lines(path)
        .iter()
        .map(|v| v["i"].as_u64().unwrap())
        .collect()
}

#[test]
fn file_names_follow_the_pattern() {
    assert_eq!(
        name_key("prm", "prm_20250102_030405.jsonl"),
        Some(("20250102_030405".into(), 0))
    );
    assert_eq!(
        name_key("prm", "prm_20250102_030405_12.jsonl"),
        Some(("20250102_030405".into(), 12))
    );
    assert_eq!(name_key("prm", "prm_2025.jsonl"), None);
    assert_eq!(name_key("prm", "opd_20250102_030405.jsonl"), None);
}

#[test]
fn writer_is_shareable() {
    fn check<T: Send + Sync>() {}
    check::<RecordWriter>();
}

#[test]
fn lines_are_written_in_order_and_parse() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a/b/records");
    let w = RecordWriter::start(dir.clone(), "conversations", RecordOptions::default()).unwrap();
    assert!(dir.is_dir(), "start creates the directory");
    assert!(
        files(&dir, "conversations").is_empty(),
        "no file before the first record"
    );
    for i in 0..200u64 {
        w.record(json!({"i": i, "text": format!("line {i} with \"quotes\"\nand a newline")}));
    }
    let stats = w.shutdown();
    assert_eq!(
        stats,
        RecordStats {
            written: 200,
            dropped: 0,
            failed: 0,
            files: 1
        }
    );
    let f = files(&dir, "conversations");
    assert_eq!(f.len(), 1);
    let got = lines(&f[0]);
    assert_eq!(got.len(), 200);
    for (i, v) in got.iter().enumerate() {
        assert_eq!(v["i"], json!(i));
        assert_eq!(
            v["text"],
            json!(format!("line {i} with \"quotes\"\nand a newline"))
        );
    }
}

#[test]
fn records_from_many_threads_all_arrive_in_per_thread_order() {
    let tmp = tempfile::tempdir().unwrap();
    let w =
        Arc::new(RecordWriter::start(tmp.path().into(), "opd", RecordOptions::default()).unwrap());
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let w = w.clone();
            std::thread::spawn(move || {
                for k in 0..500u64 {
                    w.record(json!({"t": t, "k": k}));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let stats = Arc::into_inner(w).unwrap().shutdown();
    assert_eq!(stats.written, 2000);
    let all: Vec<Value> = files(tmp.path(), "opd")
        .iter()
        .flat_map(|p| lines(p))
        .collect();
    assert_eq!(all.len(), 2000);
    for t in 0..4u64 {
        let ks: Vec<u64> = all
            .iter()
            .filter(|v| v["t"] == json!(t))
            .map(|v| v["k"].as_u64().unwrap())
            .collect();
        assert_eq!(ks, (0..500).collect::<Vec<_>>());
    }
}

#[test]
fn rotates_by_size_and_keeps_every_line() {
    let tmp = tempfile::tempdir().unwrap();
    let max = 100;
    let w = RecordWriter::start(tmp.path().into(), "prm", opts(max, 1000)).unwrap();
    for i in 0..40u64 {
        w.record(json!({"i": i, "pad": "xxxxxxxxxx"}));
    }
    let stats = w.shutdown();
    assert_eq!(stats.written, 40);
    let f = files(tmp.path(), "prm");
    assert!(f.len() > 1, "{f:?}");
    assert_eq!(stats.files, f.len() as u64);
    for p in &f {
        let len = fs::metadata(p).unwrap().len();
        assert!(len > 0 && len <= max, "{} is {len} bytes", p.display());
    }
    let all: Vec<u64> = f.iter().flat_map(|p| indices(p)).collect();
    assert_eq!(all, (0..40).collect::<Vec<_>>());
}

#[test]
fn a_line_larger_than_the_limit_gets_a_file_of_its_own() {
    let tmp = tempfile::tempdir().unwrap();
    let w = RecordWriter::start(tmp.path().into(), "prm", opts(50, 10)).unwrap();
    w.record(json!({"i": 0}));
    w.record(json!({"i": 1, "big": "y".repeat(200)}));
    w.record(json!({"i": 2}));
    assert_eq!(w.shutdown().written, 3);
    let f = files(tmp.path(), "prm");
    let per_file: Vec<Vec<u64>> = f.iter().map(|p| indices(p)).collect();
    assert_eq!(per_file, vec![vec![0], vec![1], vec![2]]);
}

#[test]
fn rotate_starts_a_new_file_and_keeps_the_old_one() {
    let tmp = tempfile::tempdir().unwrap();
    let other = tmp.path().join("notes.jsonl");
    fs::write(&other, "keep me\n").unwrap();
    let w =
        RecordWriter::start(tmp.path().into(), "conversations", RecordOptions::default()).unwrap();
    for i in 0..3u64 {
        w.record(json!({"i": i}));
    }
    w.rotate();
    w.rotate(); // nothing written in between: no empty file
    w.barrier();
    let first = files(tmp.path(), "conversations");
    assert_eq!(first.len(), 1);
    let before = fs::read(&first[0]).unwrap();
    for i in 3..5u64 {
        w.record(json!({"i": i}));
    }
    w.rotate();
    let stats = w.shutdown();
    assert_eq!(stats.written, 5);
    assert_eq!(stats.files, 2);
    let f = files(tmp.path(), "conversations");
    assert_eq!(f.len(), 2);
    assert_eq!(f[0], first[0]);
    assert_eq!(
        fs::read(&f[0]).unwrap(),
        before,
        "the old file is left as it was"
    );
    assert_eq!(indices(&f[0]), vec![0, 1, 2]);
    assert_eq!(indices(&f[1]), vec![3, 4]);
    assert_eq!(fs::read_to_string(&other).unwrap(), "keep me\n");
}

#[test]
fn taken_names_get_a_numeric_suffix_and_are_never_opened() {
    let tmp = tempfile::tempdir().unwrap();
    let stamp = "20250102_030405";
    let taken0 = tmp.path().join(format!("prm_{stamp}.jsonl"));
    let taken1 = tmp.path().join(format!("prm_{stamp}_1.jsonl"));
    fs::write(&taken0, "old 0\n").unwrap();
    fs::write(&taken1, "old 1\n").unwrap();
    let mut f = test_files(tmp.path(), DEFAULT_MAX_FILE_BYTES);
    let open = f.open_stamped(stamp).unwrap();
    assert_eq!(open.path, tmp.path().join(format!("prm_{stamp}_2.jsonl")));
    assert_eq!(fs::read_to_string(&taken0).unwrap(), "old 0\n");
    assert_eq!(fs::read_to_string(&taken1).unwrap(), "old 1\n");
}

#[test]
fn two_writers_on_one_directory_never_share_a_file() {
    let tmp = tempfile::tempdir().unwrap();
    let a = RecordWriter::start(tmp.path().into(), "prm", RecordOptions::default()).unwrap();
    let b = RecordWriter::start(tmp.path().into(), "prm", RecordOptions::default()).unwrap();
    a.record(json!({"i": 1}));
    a.barrier();
    b.record(json!({"i": 2}));
    a.shutdown();
    b.shutdown();
    let f = files(tmp.path(), "prm");
    assert_eq!(f.len(), 2);
    assert_eq!(indices(&f[0]), vec![1]);
    assert_eq!(indices(&f[1]), vec![2]);
}

#[test]
fn a_directory_that_cannot_be_created_names_the_path_and_key() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("plain-file");
    fs::write(&file, "x").unwrap();
    for dir in [file.join("records"), file.clone()] {
        let err = RecordWriter::start(dir.clone(), "prm", opts(1000, 10)).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(&dir.display().to_string()), "{msg}");
        assert!(msg.contains("logging.prm_record_dir"), "{msg}");
    }
}

#[test]
fn an_invalid_prefix_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for bad in ["", "a/b", "..", "x y"] {
        let err =
            RecordWriter::start(tmp.path().into(), bad, RecordOptions::default()).unwrap_err();
        assert!(
            matches!(err, RecordError::InvalidPrefix { .. }),
            "{bad:?}: {err}"
        );
    }
}

#[test]
fn a_failed_write_is_counted_and_record_still_returns() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("records");
    let w = RecordWriter::start(dir.clone(), "prm", opts(1000, 10)).unwrap();
    // Replace the directory by a regular file: creating a record file under it fails.
    fs::remove_dir(&dir).unwrap();
    fs::write(&dir, "not a directory").unwrap();
    w.record(json!({"i": 0}));
    w.record(json!({"i": 1}));
    w.barrier();
    assert_eq!(w.failed(), 2);
    assert_eq!(w.written(), 0);
    // Once the path is usable again, writing resumes in a fresh file.
    fs::remove_file(&dir).unwrap();
    w.record(json!({"i": 2}));
    let stats = w.shutdown();
    assert_eq!(stats.failed, 2);
    assert_eq!(stats.written, 1);
    assert_eq!(stats.dropped, 0);
    let f = files(&dir, "prm");
    assert_eq!(f.len(), 1);
    assert_eq!(indices(&f[0]), vec![2]);
}

fn test_shared() -> Arc<Shared> {
    Arc::new(Shared {
        written: AtomicU64::new(0),
        dropped: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        files: AtomicU64::new(0),
        rotate_pending: AtomicBool::new(false),
        dropping: AtomicBool::new(false),
        queue_full: metrics::Counter::noop(),
        write_error: metrics::Counter::noop(),
        writer_stopped: metrics::Counter::noop(),
    })
}

fn test_files(dir: &Path, max_file_bytes: u64) -> Files {
    Files {
        dir: dir.into(),
        prefix: "prm".into(),
        max_file_bytes,
        config_key: "logging.prm_record_dir",
        current: None,
        failing: false,
        shared: test_shared(),
    }
}

#[test]
fn a_write_failure_mid_file_counts_the_batch_and_switches_files() {
    let full = Path::new("/dev/full");
    if !full.exists() {
        return; // not Linux-like; the directory-replacement test covers the failure path
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut f = test_files(tmp.path(), DEFAULT_MAX_FILE_BYTES);
    // An open "record file" whose writes fail with ENOSPC.
    f.current = Some(OpenFile {
        path: full.into(),
        file: OpenOptions::new().write(true).open(full).unwrap(),
        bytes: 0,
        buf: Vec::new(),
        buf_lines: 0,
    });
    f.add(&json!({"i": 0}));
    f.add(&json!({"i": 1}));
    f.write_out();
    assert_eq!(f.shared.failed.load(Ordering::Relaxed), 2);
    assert_eq!(f.shared.written.load(Ordering::Relaxed), 0);
    assert!(f.current.is_none(), "the failing file is abandoned");
    assert!(f.failing);
    // The next record starts a fresh file and succeeds.
    f.add(&json!({"i": 2}));
    f.close();
    assert_eq!(f.shared.written.load(Ordering::Relaxed), 1);
    assert!(!f.failing);
    let written = files(tmp.path(), "prm");
    assert_eq!(written.len(), 1);
    assert_eq!(indices(&written[0]), vec![2]);
}

#[test]
fn a_full_queue_drops_and_counts_without_blocking() {
    let tmp = tempfile::tempdir().unwrap();
    let (release, gate) = mpsc::channel();
    let w = RecordWriter::start_inner(tmp.path().into(), "prm", opts(1000, 2), Some(gate)).unwrap();
    // The writer thread waits at the gate, so the queue holds exactly 2 records.
    for i in 0..5u64 {
        w.record(json!({"i": i}));
    }
    assert_eq!(w.dropped(), 3);
    // A rotate() that finds the queue full is remembered, not lost and not blocking.
    w.rotate();
    release.send(()).unwrap();
    w.barrier();
    w.record(json!({"i": 5}));
    let stats = w.shutdown();
    assert_eq!(
        stats,
        RecordStats {
            written: 3,
            dropped: 3,
            failed: 0,
            files: 1
        }
    );
    // The pending rotation happened before the writer's first record: one file, nothing lost.
    let all: Vec<u64> = files(tmp.path(), "prm")
        .iter()
        .flat_map(|p| indices(p))
        .collect();
    assert_eq!(all, vec![0, 1, 5]);
}

#[test]
fn drop_drains_and_flushes() {
    let tmp = tempfile::tempdir().unwrap();
    let (release, gate) = mpsc::channel();
    let w = RecordWriter::start_inner(
        tmp.path().into(),
        "opd",
        opts(DEFAULT_MAX_FILE_BYTES, 100),
        Some(gate),
    )
    .unwrap();
    for i in 0..50u64 {
        w.record(json!({"i": i}));
    }
    // Nothing is written yet; dropping the writer must still write all 50.
    release.send(()).unwrap();
    drop(w);
    let f = files(tmp.path(), "opd");
    assert_eq!(f.len(), 1);
    assert_eq!(indices(&f[0]), (0..50).collect::<Vec<_>>());
}
