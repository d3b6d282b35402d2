//! Store bytes per sample of agent-shaped conversations with and without routed experts (issue
//! 34), in the same run: the samples a mixture-of-experts policy gives, kept by the embedded store
//! as blocks once per hash, against the same samples without experts, and against the bytes the
//! experts would take if every sample kept all its rows.
//!
//! The conversations follow the loadgen agent scenario's shape (docs/benchmarks.md, "The agent
//! scenario"): a ~2,700-token system prompt and 20 tools (~3,000 tokens) shared by every session,
//! 10–30 main turns, each adding a user message or a tool result (100–1,200 tokens) and a reply
//! (100–800 tokens). The routing is a Qwen3-30B-A3B's shape: 48 layers, top-8 of 128 experts (one
//! byte an index), a function of the position and the session (a causal model routes a shared
//! prefix alike, so every later turn repeats the earlier turns' rows).
//!
//! `cargo bench -p ps-sample-store --bench experts` (release profile). Options, after `--`:
//! `--sessions N` (default 8), `--seed N` (default 1), `--dir PATH` (where the stores are created,
//! default a temporary directory). A filter argument or `--bench`, as cargo passes them, is ignored.

// A benchmark that cannot set itself up should stop with a message.
#![allow(clippy::expect_used)]

use ps_core::sample::{Reward, Sample, SampleStatus};
use ps_core::{EngineExperts, ExpertRows, ExpertWidth, SampleExperts};
use ps_sample_store::{DB_FILE_NAME, SampleStore, StoreConfig};

const SHARED_PREFIX_TOKENS: usize = 5_700;
const LAYERS: usize = 48;
const TOP_K: usize = 8;
const EXPERTS: u64 = 128;

#[derive(clap::Parser)]
struct Options {
    #[arg(long, default_value_t = 8)]
    sessions: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    #[arg(long, hide = true)]
    bench: bool,
    #[arg(hide = true)]
    filter: Option<String>,
}

/// SplitMix64: a reproducible stream without a dependency.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn between(seed: u64, lo: usize, hi: usize) -> usize {
    lo + (mix(seed) % (hi - lo + 1) as u64) as usize
}

/// One conversation's turns: (prompt tokens, response tokens) per main turn.
fn turns(session: u64, seed: u64) -> Vec<(usize, usize)> {
    let n = between(seed ^ session.wrapping_mul(31), 10, 30);
    let mut prompt = SHARED_PREFIX_TOKENS + 150;
    let mut out = Vec::with_capacity(n);
    for t in 0..n as u64 {
        let reply = between(seed ^ (session << 20) ^ (t << 8) ^ 1, 100, 800);
        out.push((prompt, reply));
        prompt += reply + between(seed ^ (session << 20) ^ (t << 8) ^ 2, 100, 1_200);
    }
    out
}

/// The routing of the first `rows` positions of `session`'s conversation, one byte an index.
fn routing(session: u64, rows: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows * LAYERS * TOP_K);
    for i in 0..(rows * LAYERS * TOP_K) as u64 {
        out.push((mix(session.wrapping_mul(0x1_0000_0000) ^ i) % EXPERTS) as u8);
    }
    out
}

fn sample(session: u64, turn: usize, prompt: usize, response: usize, experts: bool) -> Sample {
    let tokens: Vec<u32> = (0..prompt + response)
        .map(|i| (mix(session ^ ((i as u64) << 16)) % 151_000) as u32)
        .collect();
    let rollout_routed_experts = experts.then(|| {
        let rows = tokens.len() - 1;
        let engine = EngineExperts {
            width: ExpertWidth::Uint8,
            data: routing(session, rows),
            shape: Some([rows, LAYERS, TOP_K]),
            field: "bench".into(),
        };
        SampleExperts::of(&ExpertRows::of_turn(&engine, tokens.len(), None).expect("shape"))
    });
    Sample {
        rollout_routed_experts,
        tokens,
        response_length: response,
        loss_mask: vec![1; response],
        rollout_log_probs: (0..response).map(|i| -(i as f64) / 1e3).collect(),
        reward: Reward { score: 1.0 },
        status: SampleStatus::Completed,
        session_id: format!("agent-{session}"),
        turn: turn as u64,
        prompt: "x".repeat(prompt * 4),
        response: "y".repeat(response * 4),
        ..Sample::default()
    }
}

struct Run {
    samples: u64,
    file_bytes: u64,
    naive_expert_bytes: u64,
    blobs: u64,
}

async fn run(dir: &std::path::Path, opts: &Options, experts: bool) -> Run {
    let store = SampleStore::open(StoreConfig::new(dir)).expect("open store");
    let mut samples = 0;
    let mut naive = 0;
    for session in 0..opts.sessions {
        for (t, (prompt, response)) in turns(session, opts.seed).into_iter().enumerate() {
            let s = sample(session, t, prompt, response, experts);
            naive += ((prompt + response - 1) * LAYERS * TOP_K) as u64;
            store.append(&s).await.expect("append");
            samples += 1;
        }
    }
    let blobs = store.blob_count().expect("blobs");
    store.close().await.expect("close");
    let file_bytes = std::fs::metadata(dir.join(DB_FILE_NAME))
        .expect("store file")
        .len();
    Run {
        samples,
        file_bytes,
        naive_expert_bytes: if experts { naive } else { 0 },
        blobs,
    }
}

#[tokio::main]
async fn main() {
    let opts = <Options as clap::Parser>::parse();
    let tmp = tempfile::tempdir().expect("temporary directory");
    let root = opts.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    let plain = run(&root.join("without"), &opts, false).await;
    let moe = run(&root.join("with"), &opts, true).await;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let per = |r: &Run| mib(r.file_bytes) / r.samples as f64;
    println!(
        "agent-shaped conversations: {} sessions, {} samples; routing {LAYERS} layers x top-{TOP_K} of {EXPERTS}",
        opts.sessions, plain.samples
    );
    println!(
        "store without experts: {:.2} MiB = {:.3} MiB a sample",
        mib(plain.file_bytes),
        per(&plain)
    );
    println!(
        "store with experts:    {:.2} MiB = {:.3} MiB a sample ({} blocks kept)",
        mib(moe.file_bytes),
        per(&moe),
        moe.blobs
    );
    let added = mib(moe.file_bytes.saturating_sub(plain.file_bytes));
    println!(
        "experts as kept: {:.3} MiB a sample; every sample keeping all its rows would be {:.3} MiB a sample ({:.1}x more)",
        added / moe.samples as f64,
        mib(moe.naive_expert_bytes) / moe.samples as f64,
        mib(moe.naive_expert_bytes) / added.max(f64::MIN_POSITIVE)
    );
}
