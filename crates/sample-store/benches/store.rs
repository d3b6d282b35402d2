//! Throughput of the sample store: group-committed appends from many concurrent appenders, reads,
//! and, in the same run, the naive baseline of one sample per durable transaction.
//!
//! `cargo bench -p ps-sample-store --bench store` (release profile). Options, after `--`:
//! `--samples N` (group-commit run, default 10000), `--baseline-samples N` (default 500),
//! `--appenders N` (default 64), `--max-batch N` (default the store's default), `--rounds N`
//! (default 3; the disk of a shared machine varies from second to second, so each round runs both
//! modes and the summary gives medians),
//! `--dir PATH` (where the stores are created, default a temporary directory),
//! `--no-redis` (skip the Redis Streams store; it runs when `redis-server` is installed: a server
//! of its own on loopback with `appendfsync always`, the same samples and appenders, so the ratio
//! to the embedded store is measured in the same run).
//! A filter argument or `--bench`, as cargo passes them, is ignored.

// A benchmark that cannot set itself up should stop with a message.
#![allow(clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ps_core::SampleLog;
use ps_core::sample::{Reward, Sample, SampleStatus};
use ps_sample_store::{DEFAULT_MAX_BATCH, SampleStore, StoreConfig};
use serde_json::json;

const PROMPT_TOKENS: usize = 1_000;
const RESPONSE_TOKENS: usize = 4_096;
const VOCAB: u64 = 151_936;
const READ_PAGE: usize = 256;

/// Options, after `--` (`--bench` and a filter, as cargo passes them, are accepted and ignored).
#[derive(clap::Parser)]
struct Options {
    #[arg(long, default_value_t = 10_000)]
    samples: u64,
    #[arg(long, default_value_t = 500)]
    baseline_samples: u64,
    #[arg(long, default_value_t = 64)]
    appenders: u64,
    #[arg(long, default_value_t = DEFAULT_MAX_BATCH)]
    max_batch: usize,
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Where the stores are created (default: a temporary directory).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// Skip the Redis Streams store.
    #[arg(long = "no-redis", action = clap::ArgAction::SetFalse)]
    redis: bool,
    #[arg(long, hide = true)]
    bench: bool,
    #[arg(hide = true)]
    filter: Option<String>,
}

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

const WORDS: &[&str] = &[
    "the", "function", "returns", "a", "value", "of", "type", "which", "is", "then", "passed",
    "to", "caller", "error", "handling", "in", "Rust", "uses", "Result", "and", "match",
];

fn text(rng: &mut Rng, tokens: usize) -> String {
    (0..tokens)
        .map(|_| WORDS[(rng.next() % WORDS.len() as u64) as usize])
        .collect::<Vec<_>>()
        .join(" ")
}

/// A realistic sample: ~1,000 prompt tokens, 4,096 response tokens with log-probs, metadata as
/// the proxy writes it.
fn sample(n: u64) -> Sample {
    let mut rng = Rng(n.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let tokens = (0..PROMPT_TOKENS + RESPONSE_TOKENS)
        .map(|_| (rng.next() % VOCAB) as u32)
        .collect();
    let loss_mask = (0..RESPONSE_TOKENS)
        .map(|i| u8::from(!(100..140).contains(&(i % 1000))))
        .collect();
    let rollout_log_probs = (0..RESPONSE_TOKENS).map(|_| -(rng.unit() * 8.0)).collect();
    let mut metadata = serde_json::Map::new();
    metadata.insert("model".into(), json!("qwen3-8b-policy"));
    metadata.insert("finish_reason".into(), json!("stop"));
    metadata.insert("prompt_tokens".into(), json!(PROMPT_TOKENS));
    metadata.insert("completion_tokens".into(), json!(RESPONSE_TOKENS));
    metadata.insert("latency_s".into(), json!(rng.unit() * 30.0));
    metadata.insert("turn_type".into(), json!("main"));
    metadata.insert(
        "judge".into(),
        json!({"model": "prm-7b", "votes": [1, 1, -1, 1], "score": rng.unit()}),
    );
    metadata.insert(
        "alignment".into(),
        json!({"matched": RESPONSE_TOKENS - 3, "missing_logprobs": 3, "policy": "zero"}),
    );
    Sample {
        images: Vec::new(),
        rollout_routed_experts: None,
        index: 0,
        group_index: 0,
        prompt: text(&mut rng, PROMPT_TOKENS),
        response: text(&mut rng, RESPONSE_TOKENS),
        tokens,
        response_length: RESPONSE_TOKENS,
        loss_mask,
        rollout_log_probs,
        reward: Reward { score: rng.unit() },
        status: SampleStatus::Completed,
        session_id: format!("session-{}", n % 97),
        turn: n / 97,
        weight_versions: Vec::new(),
        teacher_log_probs: None,
        teacher_topk_log_probs: None,
        teacher_topk_indices: None,
        metadata,
    }
}

struct WriteRun {
    elapsed: Duration,
    latencies: Vec<Duration>,
}

/// `appenders` tasks append `total` samples (clones of a few prebuilt ones, so that building
/// samples is not measured).
async fn write(
    store: &Arc<dyn SampleLog>,
    templates: &Arc<Vec<Sample>>,
    total: u64,
    appenders: u64,
) -> WriteRun {
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..appenders {
        let store = Arc::clone(store);
        let next = Arc::clone(&next);
        let templates = Arc::clone(templates);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= total {
                    break latencies;
                }
                let mut sample = templates[(n % templates.len() as u64) as usize].clone();
                // Distinct samples: the Redis store recognises a repeated one as a retry.
                sample.turn = n;
                let begin = Instant::now();
                store.submit(&sample).await.expect("append");
                latencies.push(begin.elapsed());
            }
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("appender task"));
    }
    let elapsed = start.elapsed();
    latencies.sort();
    WriteRun { elapsed, latencies }
}

/// CPU time (ns) of the store's live writer threads (`sample-store-wr…`), from
/// `/proc/self/task/*/schedstat`; 0 where that is not available.
fn writer_cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|comm| comm.starts_with("sample-store-wr"))
        })
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn report_write(label: &str, run: &WriteRun, total: u64, bytes_per_sample: usize) {
    let secs = run.elapsed.as_secs_f64();
    let rate = total as f64 / secs;
    println!(
        "{label}: {total} samples in {secs:.2} s = {rate:.0} samples/s, {:.1} MB/s; append latency p50 {:.1} ms, p99 {:.1} ms",
        rate * bytes_per_sample as f64 / 1e6,
        percentile(&run.latencies, 0.5).as_secs_f64() * 1e3,
        percentile(&run.latencies, 0.99).as_secs_f64() * 1e3,
    );
}

fn open(dir: &std::path::Path, max_batch: usize) -> SampleStore {
    let mut config = StoreConfig::new(dir);
    config.max_batch = max_batch;
    SampleStore::open(config).expect("open store")
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Single-threaded encode and decode time of `sample`, MessagePack (what the store uses) against
/// JSON, in microseconds.
fn codec_times(sample: &Sample) -> [f64; 4] {
    const ROUNDS: u32 = 200;
    let time = |f: &mut dyn FnMut()| {
        let start = Instant::now();
        for _ in 0..ROUNDS {
            f();
        }
        start.elapsed().as_secs_f64() * 1e6 / f64::from(ROUNDS)
    };
    let msgpack = ps_core::codec::encode_sample(sample).expect("encode");
    let json = serde_json::to_vec(sample).expect("json");
    [
        time(&mut || drop(std::hint::black_box(ps_core::codec::encode_sample(sample)))),
        time(&mut || {
            drop(std::hint::black_box(ps_core::codec::decode_sample(
                0, &msgpack,
            )))
        }),
        time(&mut || drop(std::hint::black_box(serde_json::to_vec(sample)))),
        time(&mut || {
            drop(std::hint::black_box(serde_json::from_slice::<Sample>(
                &json,
            )))
        }),
    ]
}

struct Round {
    group: f64,
    read: f64,
    /// Records read as a MessagePack trainer page is made of them (samples/s).
    read_records: f64,
    baseline: f64,
}

async fn round(
    options: &Options,
    root: &std::path::Path,
    templates: &Arc<Vec<Sample>>,
    bytes_per_sample: usize,
) -> Round {
    // Group commit.
    let dir = root.join("group");
    let store = open(&dir, options.max_batch);
    let log: Arc<dyn SampleLog> = Arc::new(store.clone());
    let cpu_before = writer_cpu_ns();
    let run = write(&log, templates, options.samples, options.appenders).await;
    let writer_cpu = writer_cpu_ns().saturating_sub(cpu_before);
    report_write(
        &format!("  group commit (max_batch {})", options.max_batch),
        &run,
        options.samples,
        bytes_per_sample,
    );
    println!(
        "  group commit: {} transactions, {:.1} samples per commit, writer thread CPU {:.0} us per sample",
        store.transactions(),
        options.samples as f64 / store.transactions().max(1) as f64,
        writer_cpu as f64 / 1e3 / options.samples as f64,
    );
    let group = options.samples as f64 / run.elapsed.as_secs_f64();

    // Reads, in pages as the trainer route pulls them; then commit everything: compaction deletes
    // it all (retain_committed 0).
    let (read_rate, records_rate) =
        read_and_commit(&log, options.samples, bytes_per_sample, "").await;
    store.close().await.expect("close");
    std::fs::remove_dir_all(&dir).expect("remove store");

    // Baseline: one sample per durable transaction, same appenders.
    let dir = root.join("baseline");
    let store = open(&dir, 1);
    let log: Arc<dyn SampleLog> = Arc::new(store.clone());
    let run = write(&log, templates, options.baseline_samples, options.appenders).await;
    report_write(
        "  baseline (one sample per transaction)",
        &run,
        options.baseline_samples,
        bytes_per_sample,
    );
    let baseline = options.baseline_samples as f64 / run.elapsed.as_secs_f64();
    store.close().await.expect("close");
    std::fs::remove_dir_all(&dir).expect("remove store");

    Round {
        group,
        read: read_rate,
        read_records: records_rate,
        baseline,
    }
}

/// The same appends, reads and commit against the Redis Streams store (samples/s of each).
async fn redis_round(
    options: &Options,
    url: &str,
    deployment: &str,
    templates: &Arc<Vec<Sample>>,
    bytes_per_sample: usize,
    fsync: &str,
) -> (f64, f64) {
    let config = ps_redis_store::RedisConfig {
        deployment: deployment.into(),
        timeout: Duration::from_secs(30),
        ..ps_redis_store::RedisConfig::new(url)
    };
    let store = ps_redis_store::RedisStore::open(config)
        .await
        .expect("open the Redis store");
    let log: Arc<dyn SampleLog> = Arc::new(store.clone());
    let run = write(&log, templates, options.samples, options.appenders).await;
    report_write(
        &format!("  Redis stream (appendfsync {fsync})"),
        &run,
        options.samples,
        bytes_per_sample,
    );
    let write_rate = options.samples as f64 / run.elapsed.as_secs_f64();
    let (read_rate, _) = read_and_commit(&log, options.samples, bytes_per_sample, "Redis ").await;
    (write_rate, read_rate)
}

/// One line of read throughput: `n` samples in `secs`.
fn print_read(what: &str, n: u64, secs: f64, bytes_per_sample: usize) {
    println!(
        "  {what} (pages of {READ_PAGE}): {n} samples in {secs:.2} s = {:.0} samples/s, {:.1} MB/s",
        n as f64 / secs,
        n as f64 * bytes_per_sample as f64 / secs / 1e6,
    );
}

/// Reads every sample in pages, as the trainer route pulls them (decoded, for JSON pages), then
/// every record (undecoded, what MessagePack pages are written from), then commits them all;
/// prints each and returns the two read rates (samples/s).
async fn read_and_commit(
    log: &Arc<dyn SampleLog>,
    expected: u64,
    bytes_per_sample: usize,
    label: &str,
) -> (f64, f64) {
    let start = Instant::now();
    let (mut after, mut read) = (0, 0u64);
    loop {
        let page = log.read(after, READ_PAGE, "bench").await.expect("read");
        let Some(last) = page.last() else { break };
        after = last.seq;
        read += page.len() as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(read, expected, "every sample read back");
    print_read(&format!("{label}read"), read, secs, bytes_per_sample);
    let start = Instant::now();
    let (mut upto, mut records) = (0, 0u64);
    loop {
        let page = log
            .read_records(upto, READ_PAGE, "bench")
            .await
            .expect("read records");
        let Some(last) = page.last() else { break };
        upto = last.seq();
        records += page.len() as u64;
    }
    let records_secs = start.elapsed().as_secs_f64();
    assert_eq!(records, expected, "every record read back");
    print_read(
        &format!("{label}read records"),
        records,
        records_secs,
        bytes_per_sample,
    );
    let start = Instant::now();
    log.commit(after, "bench").await.expect("commit");
    println!(
        "  {label}commit (+ compaction or trim) of {read} samples: {:.1} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
    (read as f64 / secs, records as f64 / records_secs)
}

#[tokio::main]
async fn main() {
    let options = <Options as clap::Parser>::parse();
    let root = match &options.dir {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .expect("temporary directory");

    let templates: Arc<Vec<Sample>> = Arc::new((0..16).map(sample).collect());
    let bytes_per_sample = ps_core::codec::encode_sample(&templates[0])
        .expect("encode")
        .len();
    let json_bytes = serde_json::to_vec(&templates[0]).expect("json").len();
    println!(
        "sample: {PROMPT_TOKENS} prompt + {RESPONSE_TOKENS} response tokens; {} appenders, {} cores",
        options.appenders,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    let [mp_enc, mp_dec, json_enc, json_dec] = codec_times(&templates[0]);
    println!(
        "codec: MessagePack {bytes_per_sample} bytes, encode {mp_enc:.0} us, decode {mp_dec:.0} us; JSON {json_bytes} bytes, encode {json_enc:.0} us, decode {json_dec:.0} us"
    );

    let mut rounds = Vec::new();
    for i in 1..=options.rounds {
        println!("round {i}:");
        rounds.push(round(&options, root.path(), &templates, bytes_per_sample).await);
    }
    let mut group: Vec<f64> = rounds.iter().map(|r| r.group).collect();
    let mut read: Vec<f64> = rounds.iter().map(|r| r.read).collect();
    let mut records: Vec<f64> = rounds.iter().map(|r| r.read_records).collect();
    let mut baseline: Vec<f64> = rounds.iter().map(|r| r.baseline).collect();
    let mut ratio: Vec<f64> = rounds.iter().map(|r| r.group / r.baseline).collect();
    let (group, read, baseline, ratio) = (
        median(&mut group),
        median(&mut read),
        median(&mut baseline),
        median(&mut ratio),
    );
    println!(
        "median of {} rounds: write {group:.0} samples/s ({:.1} MB/s), read {read:.0} samples/s (records {:.0}), baseline {baseline:.0} samples/s, group-commit speed-up {ratio:.1}x",
        options.rounds,
        group * bytes_per_sample as f64 / 1e6,
        median(&mut records),
    );

    if !options.redis {
        return;
    }
    let Some(server) = ps_test_support::redis::RedisServer::start() else {
        println!("Redis: redis-server not installed, skipped");
        return;
    };
    let client = redis::Client::open(server.url()).expect("Redis URL");
    let mut admin = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect to Redis");
    for fsync in ["always", "everysec"] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("appendfsync")
            .arg(fsync)
            .query_async(&mut admin)
            .await
            .expect("CONFIG SET appendfsync");
        let mut writes = Vec::new();
        let mut reads = Vec::new();
        for i in 1..=options.rounds {
            println!("Redis round {i} (appendfsync {fsync}):");
            let (w, r) = redis_round(
                &options,
                &server.url(),
                &format!("bench-{fsync}-{i}"),
                &templates,
                bytes_per_sample,
                fsync,
            )
            .await;
            writes.push(w);
            reads.push(r);
        }
        let (w, r) = (median(&mut writes), median(&mut reads));
        println!(
            "Redis (appendfsync {fsync}), median of {} rounds: write {w:.0} samples/s ({:.2}x the embedded store), read {r:.0} samples/s ({:.2}x)",
            options.rounds,
            w / group,
            r / read,
        );
    }
}
