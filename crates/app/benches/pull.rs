//! The pull API's rate: `GET /v1/rollout/samples` through the real server (HTTP + JSON, as a trainer
//! sees it) against reading the same store directly, in the same run. Samples have 4,096 response
//! tokens. Run: `cargo bench -p ps-app --bench pull -- [--samples N] [--page M]`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use ps_core::sample::{Reward, Sample, SampleStatus};
use ps_sample_store::{SampleStore, StoreConfig};
use serde_json::{Value, json};

/// Options, after `--` (`--bench` and a filter, as cargo passes them, are accepted and ignored).
#[derive(clap::Parser)]
struct Args {
    #[arg(long, default_value_t = 2000)]
    samples: usize,
    #[arg(long, default_value_t = 64)]
    page: usize,
    #[arg(long, hide = true)]
    bench: bool,
    #[arg(hide = true)]
    filter: Option<String>,
}

fn sample(i: u64) -> Sample {
    let t = 4096;
    let mut metadata = serde_json::Map::new();
    metadata.insert("mode".into(), json!("rl"));
    metadata.insert("votes".into(), json!([1, 1, -1]));
    Sample {
        prompt: "p".repeat(4000),
        response: "r".repeat(16000),
        tokens: (0..(1000 + t) as u32)
            .map(|x| x.wrapping_mul(2654435761) % 151_000)
            .collect(),
        response_length: t,
        loss_mask: vec![1; t],
        rollout_log_probs: (0..t).map(|x| -((x % 97) as f64) / 13.0).collect(),
        reward: Reward { score: 1.0 },
        status: SampleStatus::Completed,
        session_id: format!("s{i}"),
        turn: 1,
        metadata,
        ..Sample::default()
    }
}

#[tokio::main]
async fn main() {
    let args = <Args as clap::Parser>::parse();
    let n = args.samples;
    let page = args.page;
    let dir = tempfile::tempdir().unwrap();
    {
        let store = SampleStore::open(StoreConfig::new(dir.path())).unwrap();
        let mut tasks = Vec::new();
        for i in 0..n as u64 {
            let s = store.clone();
            tasks.push(tokio::spawn(
                async move { s.append(&sample(i)).await.unwrap() },
            ));
        }
        for t in tasks {
            t.await.unwrap();
        }
        store.close().await.unwrap();
    }

    let mut settings = ps_config::Settings::default();
    settings.server.port = 0;
    settings.prm.enabled = false;
    settings.store.path = dir.path().to_path_buf();
    let app = ps_app::build_app(&settings, &|_| None, None).await.unwrap();
    let store = app.rollout().unwrap().store.clone();
    let listener = ps_app::bind(&settings).await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let app = ps_app::App {
        state: app,
        routes: Default::default(),
    };
    let server = tokio::spawn(ps_app::serve(listener, app, async {
        let _ = stopped.await;
    }));

    // Direct reads of the same store (decode included).
    let started = Instant::now();
    let (mut after, mut read) = (0u64, 0usize);
    while read < n {
        let got = store.read(after, page, "bench").await.unwrap();
        read += got.len();
        after = got.last().unwrap().seq;
    }
    let direct = n as f64 / started.elapsed().as_secs_f64();

    // Through the API, as a trainer: HTTP, JSON encode on the server, JSON decode on the client.
    let http = reqwest::Client::new();
    let started = Instant::now();
    let (mut after, mut read, mut bytes) = (0u64, 0usize, 0usize);
    while read < n {
        let body = http
            .get(format!(
                "{base}/v1/rollout/samples?after={after}&max={page}"
            ))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        bytes += body.len();
        let v: Value = serde_json::from_slice(&body).unwrap();
        let samples = v["samples"].as_array().unwrap();
        read += samples.len();
        after = samples.last().unwrap()["seq"].as_u64().unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    let api = n as f64 / secs;
    println!("pull benchmark: {n} samples of 4,096 response tokens, pages of {page}");
    println!("  store.read (direct)        : {direct:>8.0} samples/s");
    println!(
        "  GET /v1/rollout/samples    : {api:>8.0} samples/s  ({:.0} MB/s of JSON, {:.1} KB per sample)",
        bytes as f64 / secs / 1e6,
        bytes as f64 / n as f64 / 1e3
    );
    println!("  API / direct               : {:.2}", api / direct);
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
