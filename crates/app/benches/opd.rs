//! End-to-end OPD throughput: sessions of two main turns through the real server, the fake SGLang
//! answering chat, hint votes and teacher scoring; turns per second until every turn is resolved,
//! with K = 0 and K = 50 in the same run, plus the store's write rate for K = 50 samples
//! (T = 4,096). Run: `cargo bench -p ps-app --bench opd -- [--sessions N]`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use ps_config::{Mode, Settings};
use ps_core::sample::{Reward, Sample, SampleStatus};
use ps_fake_sglang::FakeSglang;
use ps_sample_store::{SampleStore, StoreConfig};
use serde_json::{Value, json};

/// Options, after `--` (`--bench` and a filter, as cargo passes them, are accepted and ignored).
#[derive(clap::Parser)]
struct Args {
    #[arg(long, default_value_t = 200)]
    sessions: usize,
    #[arg(long, default_value_t = 200)]
    store_samples: usize,
    #[arg(long, hide = true)]
    bench: bool,
    #[arg(hide = true)]
    filter: Option<String>,
}

async fn opd_run(sessions: usize, top_k: usize) -> (f64, u64, u64) {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut s = Settings::default();
    s.server.port = 0;
    s.server.mode = Mode::Opd;
    s.server.default_turn_type = ps_core::DefaultTurnType::Main;
    s.sglang.chat_url = fake.chat_url();
    s.prm.router_url = fake.generate_url();
    s.teacher.url = Some(fake.generate_url());
    s.teacher.max_concurrency = 8;
    s.opd.top_k = top_k;
    s.store.path = dir.path().to_path_buf();
    let running = ps_app::spawn(&s, &|_| None, None).await.unwrap();
    let base = running.url().to_owned();
    let http = reqwest::Client::new();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..sessions {
        let (http, url) = (http.clone(), format!("{base}/v1/chat/completions"));
        tasks.push(tokio::spawn(async move {
            let session = format!("bench-{i}");
            let first =
                json!([{"role": "user", "content": format!("Task number {i}: plan a trip.")}]);
            let a: Value = http
                .post(&url)
                .header("x-session-id", &session)
                .json(&json!({"messages": first}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let history = json!([first[0], a["choices"][0]["message"],
                {"role": "user", "content": "You forgot my budget. FAKE_VOTES=1,1,1"}]);
            http.post(&url)
                .header("x-session-id", &session)
                .header("x-session-done", "1")
                .json(&json!({"messages": history}))
                .send()
                .await
                .unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let turns = 2 * sessions as u64;
    let (mut submitted, mut dropped) = (0, 0);
    while submitted + dropped < turns {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let st: Value = http
            .get(format!("{base}/v1/rollout/status"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        submitted = st["samples"]["submitted"].as_u64().unwrap();
        dropped = st["turns_dropped"].as_u64().unwrap();
    }
    let rate = turns as f64 / started.elapsed().as_secs_f64();
    running.stop().await.unwrap();
    (rate, submitted, dropped)
}

fn topk_sample(k: usize) -> Sample {
    let t = 4096;
    Sample {
        prompt: "p".repeat(4000),
        response: "r".repeat(16000),
        tokens: (0..(1000 + t) as u32).collect(),
        response_length: t,
        loss_mask: vec![1; t],
        rollout_log_probs: (0..t).map(|x| -((x % 97) as f64) / 13.0).collect(),
        reward: Reward { score: 1.0 },
        status: SampleStatus::Completed,
        session_id: "s".into(),
        turn: 1,
        weight_versions: Vec::new(),
        teacher_log_probs: Some((0..t).map(|x| -((x % 89) as f64) / 17.0).collect()),
        teacher_topk_log_probs: Some(
            (0..t)
                .map(|x| (0..k).map(|j| -((x + j) as f64) / 1000.0).collect())
                .collect(),
        ),
        teacher_topk_indices: Some(
            (0..t)
                .map(|x| (0..k).map(|j| (x * 31 + j) as u32 % 151_000).collect())
                .collect(),
        ),
        ..Sample::default()
    }
}

#[tokio::main]
async fn main() {
    let args = <Args as clap::Parser>::parse();
    let sessions = args.sessions;
    println!(
        "OPD end to end: {sessions} sessions x 2 main turns (1 distilled, 1 without next state), fake SGLang, mini tokenizer"
    );
    for k in [0, 50] {
        let (rate, submitted, dropped) = opd_run(sessions, k).await;
        println!(
            "  K = {k:>2}: {rate:>7.1} turns/s  ({submitted} samples, {dropped} turns without a sample)"
        );
    }

    let n = args.store_samples;
    let dir = tempfile::tempdir().unwrap();
    let store = SampleStore::open(StoreConfig::new(dir.path())).unwrap();
    let sample = topk_sample(50);
    let bytes = rmp_serde::to_vec_named(&sample).unwrap().len();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..n {
        let (store, sample) = (store.clone(), sample.clone());
        tasks.push(tokio::spawn(
            async move { store.append(&sample).await.unwrap() },
        ));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "store, K = 50, T = 4,096 ({:.1} MB per sample as MessagePack): {:.0} samples/s written, {:.0} MB/s",
        bytes as f64 / 1e6,
        n as f64 / secs,
        n as f64 * bytes as f64 / secs / 1e6
    );
    let started = Instant::now();
    let mut after = 0;
    let mut read = 0;
    while read < n {
        let page = store.read(after, 16).await.unwrap();
        read += page.len();
        after = page.last().unwrap().seq;
    }
    println!(
        "store, K = 50: {:.0} samples/s read",
        n as f64 / started.elapsed().as_secs_f64()
    );
    store.close().await.unwrap();
}
