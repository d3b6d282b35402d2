//! `loadgen`: parses the command line, runs the `ps-loadgen` benchmark (or, with `soak`, the soak;
//! with `agent`, the agent scenario) on one tokio runtime, prints the table and writes the JSON report. No logic lives here (see
//! `docs/benchmarks.md`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use ps_loadgen::trainer::PageFormat;
use ps_loadgen::{BenchConfig, ProxyMode, SessionClose, SoakConfig};
use ps_loadgen::{agent, runs, soak};

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Measures policy-serving's added latency, CPU and memory against direct calls to a fake SGLang, in one run",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    bench: BenchArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// A bounded soak: many sessions of 5–20 turns through the proxy in RL mode with a trainer
    /// pulling samples; throughput, added latency, and whether the proxy's memory returns to its
    /// baseline.
    Soak(SoakArgs),
    /// The agent scenario: a long system prompt and 20 tools shared by every session, 10–30 turns
    /// with tool calls and results, long replies with engine ids, side turns, RL mode with 3 PRM
    /// votes and a trainer; the proxy's CPU per request and per 1,000 captured tokens, added
    /// latency and memory, against the same sessions straight to the fake.
    Agent(AgentArgs),
}

#[derive(Debug, Args)]
struct AgentArgs {
    #[command(flatten)]
    common: Common,
    /// Concurrent sessions.
    #[arg(long, short = 'n', default_value_t = agent::DEFAULT_SESSIONS)]
    sessions: usize,
    /// Fewest main turns of a session.
    #[arg(long, default_value_t = agent::DEFAULT_MIN_TURNS)]
    min_turns: usize,
    /// Most main turns of a session.
    #[arg(long, default_value_t = agent::DEFAULT_MAX_TURNS)]
    max_turns: usize,
    /// Seed of the turn counts and the conversations.
    #[arg(long, default_value_t = agent::DEFAULT_SEED)]
    seed: u64,
    /// Runs of each phase, interleaved (A B A B …); figures pool all rounds.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Spread the session starts over this many ms (0: all at once).
    #[arg(long, default_value_t = 0)]
    ramp_ms: u64,
    /// The proxy's `prm.max_concurrency` (default: 4 x the sessions).
    #[arg(long)]
    prm_concurrency: Option<usize>,
    /// The proxy's `teacher.max_concurrency` in OPD and Combine (default: the sessions; the
    /// proxy's own default is 3).
    #[arg(long)]
    teacher_concurrency: Option<usize>,
    /// Samples per trainer pull (1–1024).
    #[arg(long, default_value_t = soak::DEFAULT_TRAINER_PAGE)]
    trainer_page: usize,
    /// Long-poll bound of a trainer pull, in ms.
    #[arg(long, default_value_t = 500)]
    trainer_wait_ms: u64,
    /// What the trainer asks its pages in: MessagePack, as the Python bridge does whenever
    /// `msgpack` is installed (every Ray environment), or JSON.
    #[arg(long, value_enum, default_value_t = FormatArg::Msgpack)]
    trainer_format: FormatArg,
    /// Period of the proxy's RSS readings, in ms.
    #[arg(long, default_value_t = 1000)]
    rss_every_ms: u64,
    /// The whole run stops by itself after this many seconds.
    #[arg(long, default_value_t = 1800)]
    max_seconds: u64,
    /// Capture re-tokenizes every turn (`sglang.token_ids = "retokenize"`, as for streamed
    /// answers) instead of taking the engine's ids.
    #[arg(long)]
    retokenize: bool,
    /// The proxy's mode: `rl` (3 PRM votes per turn), `opd` (3 hint votes per turn, the fake's
    /// /generate as the teacher) or `combine` (both).
    #[arg(long, value_enum, default_value_t = ModeArg::Rl)]
    mode: ModeArg,
    /// Make the whole measurement this many times (fresh children each time) and print each run
    /// and the median of each figure. With `--runs` (even `--runs 1`) `--json` writes
    /// `{runs, figures, median}`; without it, the one run's report as before. `--max-seconds`
    /// bounds each run.
    #[arg(long)]
    runs: Option<usize>,
    /// Start the fake with `--no-prefix-cache` (every prompt encoded whole, as before).
    #[arg(long)]
    fake_no_prefix_cache: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ModeArg {
    Rl,
    Opd,
    Combine,
}

impl From<ModeArg> for ProxyMode {
    fn from(m: ModeArg) -> Self {
        match m {
            ModeArg::Rl => ProxyMode::Rl,
            ModeArg::Opd => ProxyMode::Opd,
            ModeArg::Combine => ProxyMode::Combine,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum FormatArg {
    Msgpack,
    Json,
}

impl From<FormatArg> for PageFormat {
    fn from(f: FormatArg) -> Self {
        match f {
            FormatArg::Msgpack => PageFormat::Msgpack,
            FormatArg::Json => PageFormat::Json,
        }
    }
}

/// What both commands start and where the report goes.
#[derive(Debug, Args)]
struct Common {
    /// The fake SGLang binary.
    #[arg(long, default_value = "target/release/fake-sglang")]
    fake_bin: PathBuf,
    /// The proxy binary.
    #[arg(long, default_value = "target/release/policy-serving")]
    proxy_bin: PathBuf,
    /// Tokenizer directory given to both (the real Qwen3 tokenizer by default).
    #[arg(long, default_value = "../shared/fixtures/qwen3")]
    model_dir: PathBuf,
    /// Fake SGLang's delay before each answer (chat and /generate), in ms (0: the run is CPU-bound).
    #[arg(long, default_value_t = 0)]
    fake_latency_ms: u64,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also write the report's SVG plots (latency percentiles per phase; RSS over the run) into
    /// this directory, e.g. `docs/img`.
    #[arg(long, value_name = "DIR")]
    svg: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct BenchArgs {
    #[command(flatten)]
    common: Common,
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
    /// Spread the session starts over this many ms (0: all at once).
    #[arg(long, default_value_t = 0)]
    ramp_ms: u64,
    /// The whole run stops by itself after this many seconds.
    #[arg(long, default_value_t = 120)]
    max_seconds: u64,
    /// Also run the proxied phase with this many inspection pages open (`proxy-page`: each polls
    /// `/v1/inspect/*` as the page does, with an admin key), interleaved with the others.
    #[arg(long, default_value_t = 0)]
    open_pages: usize,
}

#[derive(Debug, Args)]
struct SoakArgs {
    #[command(flatten)]
    common: Common,
    /// Sessions in all (e.g. 50 for a quick check).
    #[arg(long, short = 'n', default_value_t = soak::DEFAULT_SESSIONS)]
    sessions: usize,
    /// Fewest turns of a session.
    #[arg(long, default_value_t = soak::DEFAULT_MIN_TURNS)]
    min_turns: usize,
    /// Most turns of a session.
    #[arg(long, default_value_t = soak::DEFAULT_MAX_TURNS)]
    max_turns: usize,
    /// Seed of the per-session turn counts.
    #[arg(long, default_value_t = soak::DEFAULT_SEED)]
    seed: u64,
    /// Sessions in flight at once.
    #[arg(long, short = 'c', default_value_t = soak::DEFAULT_CONCURRENCY)]
    concurrency: usize,
    /// Phase A: this many of the soak's sessions straight to the fake (0: none).
    #[arg(long, default_value_t = soak::DEFAULT_DIRECT_SESSIONS)]
    direct_sessions: usize,
    /// Sessions of the unmeasured warm-up (default: the concurrency).
    #[arg(long)]
    warmup_sessions: Option<usize>,
    /// End sessions by the proxy's idle timeout of this many seconds instead of `X-Session-Done`.
    #[arg(long, value_name = "SECONDS")]
    session_timeout: Option<u64>,
    /// The proxy's `prm.max_concurrency` (default: 4 x the concurrency, so that the judge, 3 votes
    /// per turn, keeps up; with the proxy's own default of 64 the turns waiting for it pile up).
    #[arg(long)]
    prm_concurrency: Option<usize>,
    /// The proxy's `store.retain_committed` (default: the proxy's default).
    #[arg(long)]
    retain_committed: Option<u64>,
    /// Samples per trainer pull (1–1024).
    #[arg(long, default_value_t = soak::DEFAULT_TRAINER_PAGE)]
    trainer_page: usize,
    /// Long-poll bound of a trainer pull, in ms.
    #[arg(long, default_value_t = 500)]
    trainer_wait_ms: u64,
    /// What the trainer asks its pages in: MessagePack, as the Python bridge does whenever
    /// `msgpack` is installed (every Ray environment), or JSON.
    #[arg(long, value_enum, default_value_t = FormatArg::Msgpack)]
    trainer_format: FormatArg,
    /// Period of the proxy's RSS readings, in ms.
    #[arg(long, default_value_t = 1000)]
    rss_every_ms: u64,
    /// The whole run stops by itself after this many seconds.
    #[arg(long, default_value_t = 3600)]
    max_seconds: u64,
    /// After the end reading, stop the trainer, wait this many seconds idle and read the proxy's
    /// RSS once more (200: the client pools close an idle connection 90–180 s after its last use).
    #[arg(long, default_value_t = 0)]
    idle_after_seconds: u64,
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn write_json(path: Option<&Path>, report: &impl serde::Serialize) -> anyhow::Result<()> {
    let Some(path) = path else {
        return Ok(());
    };
    let json = serde_json::to_string_pretty(report).context("cannot serialise the report")?;
    std::fs::write(path, json + "\n")
        .with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("loadgen: JSON report written to {}", path.display());
    Ok(())
}

fn write_svg(
    dir: Option<&Path>,
    plots: impl FnOnce() -> Result<Vec<ps_loadgen::plot::Plot>, ps_loadgen::LoadgenError>,
) -> anyhow::Result<()> {
    let Some(dir) = dir else {
        return Ok(());
    };
    for path in ps_loadgen::plot::write_all(dir, &plots()?)? {
        eprintln!("loadgen: plot written to {}", path.display());
    }
    Ok(())
}

fn bench(args: BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.sessions > 0 && args.turns > 0 && args.rounds > 0,
        "--sessions, --turns and --rounds must be at least 1"
    );
    let c = args.common;
    let config = BenchConfig {
        fake_bin: c.fake_bin,
        proxy_bin: c.proxy_bin,
        model_dir: c.model_dir,
        sessions: args.sessions,
        turns: args.turns,
        stream: args.stream,
        rounds: args.rounds,
        fake_latency: Duration::from_millis(c.fake_latency_ms),
        ramp: Duration::from_millis(args.ramp_ms),
        max_duration: Duration::from_secs(args.max_seconds),
        open_pages: args.open_pages,
    };
    let report = runtime()?.block_on(ps_loadgen::run(&config, |line| {
        eprintln!("loadgen: {line}")
    }))?;
    print!("{}", report.render());
    write_svg(c.svg.as_deref(), || report.plots())?;
    write_json(c.json.as_deref(), &report)
}

fn soak(args: SoakArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.sessions > 0 && args.concurrency > 0 && args.min_turns > 0,
        "--sessions, --concurrency and --min-turns must be at least 1"
    );
    anyhow::ensure!(
        args.min_turns <= args.max_turns,
        "--min-turns must not exceed --max-turns"
    );
    anyhow::ensure!(
        (1..=1024).contains(&args.trainer_page),
        "--trainer-page must be 1 to 1024"
    );
    anyhow::ensure!(
        args.session_timeout != Some(0),
        "--session-timeout must be at least 1 second"
    );
    anyhow::ensure!(args.rss_every_ms > 0, "--rss-every-ms must be at least 1");
    let c = args.common;
    let config = SoakConfig {
        fake_bin: c.fake_bin,
        proxy_bin: c.proxy_bin,
        model_dir: c.model_dir,
        sessions: args.sessions,
        min_turns: args.min_turns,
        max_turns: args.max_turns,
        seed: args.seed,
        concurrency: args.concurrency,
        direct_sessions: args.direct_sessions,
        warmup_sessions: args.warmup_sessions.unwrap_or(args.concurrency),
        close: args
            .session_timeout
            .map_or(SessionClose::DoneHeader, |secs| SessionClose::Timeout {
                secs,
            }),
        prm_max_concurrency: Some(
            args.prm_concurrency
                .unwrap_or(soak::JUDGE_SLOTS_PER_SESSION * args.concurrency),
        ),
        fake_latency: Duration::from_millis(c.fake_latency_ms),
        retain_committed: args.retain_committed,
        trainer_page: args.trainer_page,
        trainer_wait: Duration::from_millis(args.trainer_wait_ms),
        trainer_format: args.trainer_format.into(),
        rss_every: Duration::from_millis(args.rss_every_ms),
        max_duration: Duration::from_secs(args.max_seconds),
        idle_after: Duration::from_secs(args.idle_after_seconds),
    };
    let report = runtime()?.block_on(soak::run(&config, |line| eprintln!("loadgen: {line}")))?;
    print!("{}", report.render());
    write_svg(c.svg.as_deref(), || report.plots())?;
    write_json(c.json.as_deref(), &report)
}

fn agent(args: AgentArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.sessions > 0 && args.min_turns > 0 && args.rounds > 0 && args.runs != Some(0),
        "--sessions, --min-turns, --rounds and --runs must be at least 1"
    );
    anyhow::ensure!(
        args.min_turns <= args.max_turns,
        "--min-turns must not exceed --max-turns"
    );
    anyhow::ensure!(
        (1..=1024).contains(&args.trainer_page),
        "--trainer-page must be 1 to 1024"
    );
    anyhow::ensure!(args.rss_every_ms > 0, "--rss-every-ms must be at least 1");
    let c = args.common;
    let config = agent::AgentConfig {
        fake_bin: c.fake_bin,
        proxy_bin: c.proxy_bin,
        model_dir: c.model_dir,
        sessions: args.sessions,
        min_turns: args.min_turns,
        max_turns: args.max_turns,
        seed: args.seed,
        rounds: args.rounds,
        fake_latency: Duration::from_millis(c.fake_latency_ms),
        ramp: Duration::from_millis(args.ramp_ms),
        prm_max_concurrency: args.prm_concurrency,
        teacher_max_concurrency: args.teacher_concurrency,
        trainer_page: args.trainer_page,
        trainer_wait: Duration::from_millis(args.trainer_wait_ms),
        trainer_format: args.trainer_format.into(),
        rss_every: Duration::from_millis(args.rss_every_ms),
        max_duration: Duration::from_secs(args.max_seconds),
        retokenize: args.retokenize,
        mode: args.mode.into(),
        fake_prefix_cache: !args.fake_no_prefix_cache,
    };
    let rt = runtime()?;
    let Some(n) = args.runs else {
        let report = rt.block_on(agent::run(&config, |line| eprintln!("loadgen: {line}")))?;
        print!("{}", report.render());
        write_svg(c.svg.as_deref(), || report.plots())?;
        return write_json(c.json.as_deref(), &report);
    };
    let mut reports = Vec::with_capacity(n);
    for run in 1..=n {
        let report = match rt.block_on(agent::run(&config, |line| {
            eprintln!("loadgen: run {run}/{n}: {line}")
        })) {
            Ok(report) => report,
            Err(e) => {
                // Keep the finished runs (their tables are printed above) in the JSON file.
                if !reports.is_empty() {
                    eprintln!(
                        "loadgen: run {run}/{n} failed; writing the {} finished runs",
                        reports.len()
                    );
                    write_json(c.json.as_deref(), &runs::AgentRuns::new(reports))?;
                }
                return Err(e.into());
            }
        };
        println!("=== run {run}/{n} ===");
        print!("{}", report.render());
        reports.push(report);
    }
    let all = runs::AgentRuns::new(reports);
    println!("\n=== {n} runs: each run's figures and the median of each ===");
    print!("{}", all.render());
    // The plots of the last run (their file names name no run).
    if let Some(last) = all.runs.last() {
        write_svg(c.svg.as_deref(), || last.plots())?;
    }
    write_json(c.json.as_deref(), &all)
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Soak(args)) => soak(args),
        Some(Command::Agent(args)) => agent(args),
        None => bench(cli.bench),
    }
}
