//! `loadgen`: parses the command line, runs the `ps-loadgen` benchmark on one tokio runtime, prints
//! the table and writes the JSON report. No logic lives here (see `docs/benchmarks.md`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use ps_loadgen::BenchConfig;

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Measures policy-serving's added latency, CPU and memory against direct calls to a fake SGLang, in one run"
)]
struct Args {
    /// The fake SGLang binary.
    #[arg(long, default_value = "target/release/fake-sglang")]
    fake_bin: PathBuf,
    /// The proxy binary.
    #[arg(long, default_value = "target/release/policy-serving")]
    proxy_bin: PathBuf,
    /// Tokenizer directory given to both (the real Qwen3 tokenizer by default).
    #[arg(long, default_value = "../shared/fixtures/qwen3")]
    model_dir: PathBuf,
    /// Concurrent sessions.
    #[arg(long, short = 'n', default_value_t = 64)]
    sessions: usize,
    /// Turns per session.
    #[arg(long, short = 't', default_value_t = 5)]
    turns: usize,
    /// Also run streamed phases (time to first byte).
    #[arg(long)]
    stream: bool,
    /// Runs of each phase, interleaved (A B A B …); figures pool all rounds.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Fake SGLang's delay before each answer, in ms (0: the run is CPU-bound).
    #[arg(long, default_value_t = 0)]
    fake_latency_ms: u64,
    /// Spread the session starts over this many ms (0: all at once).
    #[arg(long, default_value_t = 0)]
    ramp_ms: u64,
    /// The whole run stops by itself after this many seconds.
    #[arg(long, default_value_t = 120)]
    max_seconds: u64,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.sessions > 0 && args.turns > 0 && args.rounds > 0,
        "--sessions, --turns and --rounds must be at least 1"
    );
    let config = BenchConfig {
        fake_bin: args.fake_bin,
        proxy_bin: args.proxy_bin,
        model_dir: args.model_dir,
        sessions: args.sessions,
        turns: args.turns,
        stream: args.stream,
        rounds: args.rounds,
        fake_latency: Duration::from_millis(args.fake_latency_ms),
        ramp: Duration::from_millis(args.ramp_ms),
        max_duration: Duration::from_secs(args.max_seconds),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let report = runtime.block_on(ps_loadgen::run(&config, |line| {
        eprintln!("loadgen: {line}")
    }))?;
    print!("{}", report.render());
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report).context("cannot serialise the report")?;
        std::fs::write(path, json + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("loadgen: JSON report written to {}", path.display());
    }
    Ok(())
}
