//! The load generator: measures what the policy-serving proxy costs, against a baseline taken in the
//! same run on the same machine.
//!
//! It owns one idea: drive the built binaries as black boxes and turn what it observes into a
//! report. It starts `fake-sglang` and `policy-serving serve` as child processes on free loopback
//! ports (killed by a guard however the run ends), then runs the same workload of concurrent
//! multi-turn conversations twice: straight to the fake (phase A, the baseline) and through the
//! proxy with `X-Session-Id` / `X-Turn-Type: main` (phase B), optionally both again streamed
//! (phase C); with `open_pages`, phase B again with emulated inspection pages polling the proxy
//! ([`page`]). From the client's latencies, the proxy's `Server-Timing: upstream;dur=…` header and
//! `/proc/<pid>` it derives the proxy's added latency, CPU time per request (background capture
//! included) and memory, and checks them against the targets of `docs/benchmarks.md` (reported,
//! never asserted). It talks to 127.0.0.1 only and depends on no crate of the product: what it
//! measures is the shipped binary, not a library call.
//!
//! [`soak`] uses the same children, workload and readings for a long bounded run in RL mode, with a
//! trainer ([`trainer`]) pulling and committing the samples, and follows the proxy's memory from a
//! baseline to the end, once every session is flushed. [`plot`] draws every report as SVG.

pub mod agent;
mod children;
pub mod page;
pub mod plot;
pub mod procfs;
mod report;
pub mod runs;
pub mod soak;
pub mod stats;
pub mod trainer;
pub mod workload;

use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use children::{FakeOptions, ProxyMode, ProxyOptions};
pub use report::{
    Config, CpuPerRequest, Machine, MainSide, MemoryReport, PhaseReport, ProxyReport, Report,
    RssPoint, SoakReport, TargetCheck,
};
pub use soak::{SessionClose, SoakConfig};

use children::ChildGuard;
use procfs::Proc;
use stats::Summary;
use workload::{PhaseRun, PhaseSpec, Turns};

/// Runs one phase's conversations with the driver its shape calls for: chat-shaped sessions
/// (`workload`) or agent-shaped ones (`agent`). Picked here, above both, so that neither module
/// needs the other.
pub(crate) async fn run_phase(
    client: &reqwest::Client,
    spec: &PhaseSpec,
    deadline: Instant,
) -> PhaseRun {
    match spec.shape {
        workload::Shape::Chat => {
            workload::run_phase_with(client, spec, deadline, workload::session).await
        }
        workload::Shape::Agent => {
            workload::run_phase_with(client, spec, deadline, agent::session).await
        }
    }
}

/// How long a child may take to answer `/health` (each loads the Qwen3 tokenizer: ~0.3 s here).
pub const STARTUP_BOUND: Duration = Duration::from_secs(60);
/// Poll period and bound of the wait for the proxy's CPU time to stop increasing.
pub const IDLE_POLL: Duration = Duration::from_millis(100);
pub const IDLE_BOUND: Duration = Duration::from_secs(10);
/// The proxy's default `sglang.max_concurrency`: with more sessions than this in flight the chat
/// workload raises it to the sessions, or the proxy would answer the rest with 429.
pub const PROXY_UPSTREAM_CAP: usize = 256;
/// Warm-up: this many sessions (at most) of this many turns, per phase kind, not measured.
pub const WARMUP_SESSIONS: usize = 8;
pub const WARMUP_TURNS: usize = 2;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    pub fake_bin: PathBuf,
    pub proxy_bin: PathBuf,
    /// Tokenizer directory given to both children.
    pub model_dir: PathBuf,
    pub sessions: usize,
    pub turns: usize,
    /// Also run the streamed phases.
    pub stream: bool,
    /// Each phase runs this many times, interleaved with the others; figures pool all rounds.
    pub rounds: usize,
    /// The fake waits this long before each answer (0: answers at once, the run is CPU-bound).
    pub fake_latency: Duration,
    /// Session starts are spread over this long (0: all start at once).
    pub ramp: Duration,
    /// The whole run stops by itself after this long.
    pub max_duration: Duration,
    /// With more than 0: a `proxy-page` phase, the proxied one again with this many inspection
    /// pages open (see [`page`]), interleaved with the others; the proxy gets an admin key.
    pub open_pages: usize,
}

/// Why a run could not produce a report.
#[derive(Debug, thiserror::Error)]
pub enum LoadgenError {
    #[error(
        "{} not found: build it with `cargo build --release -p policy-serving -p fake-sglang -p loadgen` (or pass its path)",
        path.display()
    )]
    MissingBinary { path: PathBuf },
    #[error("model directory {} has no tokenizer.json (pass --model-dir)", path.display())]
    MissingModelDir { path: PathBuf },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("/proc/{pid}: {detail}")]
    Proc { pid: u32, detail: String },
    #[error("the generated proxy settings {} are rejected: {stderr}", path.display())]
    Settings { path: PathBuf, stderr: String },
    #[error("{name} exited ({status}) during the run; last log lines:\n{log_tail}")]
    Exited {
        name: &'static str,
        status: String,
        log_tail: String,
    },
    #[error("{name} did not answer {url} within {waited:?}; last log lines:\n{log_tail}")]
    NotHealthy {
        name: &'static str,
        url: String,
        waited: Duration,
        log_tail: String,
    },
    #[error("interrupted by {0}; the children were stopped")]
    Interrupted(&'static str),
    #[error("cannot build the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    #[error(
        "warm-up `{phase}` failed ({errors} errors), so the measurement would be meaningless: {first}"
    )]
    WarmUp {
        phase: String,
        errors: usize,
        first: String,
    },
    #[error("the proxy's {what}: {detail}")]
    Rollout { what: &'static str, detail: String },
    #[error("cannot draw {what}: {detail}")]
    Plot { what: &'static str, detail: String },
    #[error("the time bound (--max-seconds) passed while {0}")]
    TimeBound(&'static str),
}

/// The processes whose CPU time a phase accounts for.
#[derive(Clone, Copy)]
pub(crate) struct Procs {
    proxy: Proc,
    fake: Proc,
    me: Proc,
}

/// One kind of phase (`direct`, `proxy`, …) and what its rounds accumulated.
pub(crate) struct Phase {
    name: &'static str,
    base_url: String,
    via_proxy: bool,
    stream: bool,
    /// Every request a side turn (`proxy-side`): the proxy forwards it and captures nothing.
    side_only: bool,
    /// The API its sessions speak (`proxy-messages`, `proxy-responses`).
    door: workload::Door,
    run: PhaseRun,
    fake_ticks: u64,
    me_ticks: u64,
    proxy_ticks: u64,
    /// The proxy's ticks by thread kind (`procfs::thread_growth`), idle to idle.
    proxy_threads: std::collections::BTreeMap<String, u64>,
    /// Longest wait for the proxy to go idle after a round.
    settle: Duration,
    rounds: usize,
    /// Inspection pages open while each round runs (0: none), and what they did.
    pages: usize,
    page: page::PageTally,
}

impl Phase {
    fn new(name: &'static str, base_url: &str, via_proxy: bool, stream: bool) -> Self {
        Self {
            name,
            base_url: base_url.to_owned(),
            via_proxy,
            stream,
            side_only: false,
            door: workload::Door::ChatCompletions,
            run: PhaseRun::default(),
            fake_ticks: 0,
            me_ticks: 0,
            proxy_ticks: 0,
            proxy_threads: Default::default(),
            settle: Duration::ZERO,
            rounds: 0,
            pages: 0,
            page: page::PageTally::default(),
        }
    }

    /// The same phase with every request sent as a side turn.
    fn side_only(self) -> Self {
        Self {
            side_only: true,
            ..self
        }
    }

    /// The same phase through another door of the proxy.
    fn through(self, door: workload::Door) -> Self {
        Self { door, ..self }
    }

    /// The same phase with `pages` inspection pages open while it runs (see [`page`]).
    fn with_pages(self, pages: usize) -> Self {
        Self { pages, ..self }
    }

    /// `sessions` sessions of `turns`, all at once, each closed by `X-Session-Done`.
    fn spec(&self, prefix: &str, sessions: usize, turns: Turns, ramp: Duration) -> PhaseSpec {
        PhaseSpec {
            name: self.name.to_owned(),
            url: format!("{}{}", self.base_url, self.door.path()),
            via_proxy: self.via_proxy,
            stream: self.stream,
            sessions,
            turns,
            concurrency: sessions,
            done_header: true,
            session_prefix: format!("loadgen-{prefix}-{}", self.name),
            ramp,
            answered: Default::default(),
            shape: workload::Shape::Chat,
            side_only: self.side_only,
            door: self.door,
        }
    }

    /// Adds the proxy's CPU by thread kind between two readings (`ticks`: the process's growth).
    pub(crate) fn add_threads(
        &mut self,
        before: &std::collections::BTreeMap<u32, (String, u64)>,
        after: &std::collections::BTreeMap<u32, (String, u64)>,
        ticks: u64,
    ) {
        for (kind, t) in procfs::thread_growth(before, after, ticks) {
            *self.proxy_threads.entry(kind).or_default() += t;
        }
    }

    /// Adds one round's requests.
    fn absorb(&mut self, run: PhaseRun) {
        self.rounds += 1;
        let acc = &mut self.run;
        acc.samples.extend(run.samples);
        acc.answered.extend(run.answered);
        acc.errors += run.errors;
        acc.first_errors.extend(run.first_errors);
        acc.first_errors.truncate(5);
        acc.wall += run.wall;
        acc.cut_by_deadline |= run.cut_by_deadline;
    }
}

/// The two children of a run, the client that drives them and the processes to watch. Dropping it
/// kills the children, then deletes the temporary directory (fields drop in this order).
pub(crate) struct Rig {
    pub fake: ChildGuard,
    pub proxy: ChildGuard,
    pub client: reqwest::Client,
    pub procs: Procs,
    pub ticks: u64,
    /// The children's logs, settings and sample store; deleted after they are killed.
    _dir: tempfile::TempDir,
}

impl Rig {
    /// Checks the model directory, starts the fake and then the proxy (configured by `options`) on
    /// free loopback ports, and waits until both answer `/health`.
    pub(crate) async fn start(
        bins: (&std::path::Path, &std::path::Path),
        model_dir: &std::path::Path,
        fake_options: FakeOptions,
        options: &ProxyOptions,
        idle_connections: usize,
        deadline: Instant,
        progress: &impl Fn(&str),
    ) -> Result<Self, LoadgenError> {
        let (fake_bin, proxy_bin) = bins;
        if !model_dir.join("tokenizer.json").is_file() {
            return Err(LoadgenError::MissingModelDir {
                path: model_dir.to_owned(),
            });
        }
        let ticks = procfs::clock_ticks_per_second();
        let dir = tempfile::Builder::new()
            .prefix("ps-loadgen-")
            .tempdir()
            .map_err(|source| LoadgenError::Io {
                context: "creating a temporary directory".into(),
                source,
            })?;
        let client = reqwest::Client::builder()
            .no_proxy()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(idle_connections)
            .build()
            .map_err(LoadgenError::Client)?;

        let startup_deadline = deadline.min(Instant::now() + STARTUP_BOUND);
        let mut fake = children::spawn_fake(fake_bin, model_dir, fake_options, dir.path())?;
        let waited = fake.wait_healthy(&client, startup_deadline).await?;
        progress(&format!(
            "fake-sglang healthy on {} after {waited:.1?}",
            fake.base_url()
        ));
        let mut proxy =
            children::spawn_proxy(proxy_bin, model_dir, fake.port, dir.path(), options)?;
        let waited = proxy.wait_healthy(&client, startup_deadline).await?;
        progress(&format!(
            "policy-serving healthy on {} after {waited:.1?}",
            proxy.base_url()
        ));
        let procs = Procs {
            proxy: proxy.proc(ticks),
            fake: fake.proc(ticks),
            me: Proc::current(ticks),
        };
        Ok(Self {
            fake,
            proxy,
            client,
            procs,
            ticks,
            _dir: dir,
        })
    }

    /// The start of a run with a trainer (the soak, the agent scenario): reads the proxy's RSS
    /// right after its start, starts the trainer pulling `trainer_page` samples at a time (long
    /// polls bounded by `trainer_wait`, pages in `trainer_format`), and makes the `direct` and `proxy` phases.
    pub(crate) fn with_trainer(
        self,
        trainer_page: usize,
        trainer_wait: Duration,
        trainer_format: trainer::PageFormat,
    ) -> Result<TrainedRig, LoadgenError> {
        let procs = self.procs;
        let start_kib = procs.proxy.rss_kib()?.0;
        let (fake_url, proxy_url) = (self.fake.base_url(), self.proxy.base_url());
        let trainer = trainer::Trainer::spawn(
            self.client.clone(),
            trainer::TrainerSpec {
                base_url: proxy_url.clone(),
                page: trainer_page,
                wait: trainer_wait,
                format: trainer_format,
            },
        );
        Ok(TrainedRig {
            rig: self,
            procs,
            start_kib,
            trainer,
            direct: Phase::new("direct", &fake_url, false, false),
            proxy: Phase::new("proxy", &proxy_url, true, false),
        })
    }

    /// An error when either child has exited.
    pub(crate) fn ensure_running(&mut self) -> Result<(), LoadgenError> {
        self.fake.ensure_running()?;
        self.proxy.ensure_running()
    }

    /// The proxy's current RSS, its peak, and its log so far.
    pub(crate) fn proxy_report(&self) -> Result<ProxyReport, LoadgenError> {
        let (rss_kib, peak_rss_kib) = self.procs.proxy.rss_kib()?;
        let log = self.proxy.log_text();
        Ok(ProxyReport {
            rss_kib,
            peak_rss_kib,
            log_lines: log.lines().count(),
            log_excerpt: log.lines().take(5).map(str::to_owned).collect(),
        })
    }

    pub(crate) fn machine(&self) -> Machine {
        Machine {
            cpus: std::thread::available_parallelism().map_or(0, usize::from),
            clock_ticks_per_second: self.ticks,
        }
    }
}

/// A started [`Rig`] with a trainer pulling from its proxy ([`Rig::with_trainer`]).
pub(crate) struct TrainedRig {
    pub rig: Rig,
    pub procs: Procs,
    /// The proxy's RSS right after its start, in KiB.
    pub start_kib: u64,
    pub trainer: trainer::Trainer,
    /// Straight to the fake.
    pub direct: Phase,
    /// Through the proxy.
    pub proxy: Phase,
}

/// Runs the unmeasured warm-up of each phase kind: `sessions` sessions of `turns`. Any error
/// fails the run (the measurement would be meaningless).
pub(crate) async fn warm_up(
    client: &reqwest::Client,
    phases: &[Phase],
    sessions: usize,
    turns: Turns,
    deadline: Instant,
    progress: &impl Fn(&str),
) -> Result<(), LoadgenError> {
    for phase in phases {
        let spec = phase.spec("warmup", sessions, turns, Duration::ZERO);
        let run = crate::run_phase(client, &spec, deadline).await;
        if run.errors > 0 {
            return Err(LoadgenError::WarmUp {
                phase: phase.name.to_owned(),
                errors: run.errors,
                first: run.first_errors.first().cloned().unwrap_or_default(),
            });
        }
        progress(&format!(
            "warm-up {}: {} requests",
            phase.name,
            run.samples.len()
        ));
    }
    Ok(())
}

/// Runs the benchmark; `progress` receives one line per step. Ctrl-C or SIGTERM stops it, and the
/// children are killed as the run is dropped.
pub async fn run(cfg: &BenchConfig, progress: impl Fn(&str)) -> Result<Report, LoadgenError> {
    tokio::select! {
        report = run_to_end(cfg, progress) => report,
        signal = interrupted() => Err(LoadgenError::Interrupted(signal)),
    }
}

/// Resolves with the signal's name on SIGINT or SIGTERM.
async fn interrupted() -> &'static str {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        () = term => "SIGTERM",
    }
}

async fn run_to_end(cfg: &BenchConfig, progress: impl Fn(&str)) -> Result<Report, LoadgenError> {
    let deadline = Instant::now() + cfg.max_duration;
    let mut rig = Rig::start(
        (&cfg.fake_bin, &cfg.proxy_bin),
        &cfg.model_dir,
        FakeOptions::new(cfg.fake_latency),
        &ProxyOptions {
            admin_key: cfg.open_pages > 0,
            sglang_max_concurrency: (cfg.sessions > PROXY_UPSTREAM_CAP).then_some(cfg.sessions),
            ..ProxyOptions::default()
        },
        cfg.sessions + WARMUP_SESSIONS + cfg.open_pages * 4,
        deadline,
        &progress,
    )
    .await?;

    let start_rss_kib = rig.procs.proxy.rss_kib()?.0;
    let (fake_url, proxy_url) = (rig.fake.base_url(), rig.proxy.base_url());
    let mut phases = vec![
        Phase::new("direct", &fake_url, false, false),
        Phase::new("proxy", &proxy_url, true, false),
        // The same requests as side turns: what forwarding alone costs, beside what a main turn
        // (forwarded, captured, judged, stored) costs in `proxy`.
        Phase::new("proxy-side", &proxy_url, true, false).side_only(),
        // The same conversations through the proxy's other doors (Anthropic Messages, OpenAI
        // Responses), and through chat completions without log-probs asked, as the doors' clients
        // send them (`proxy-plain`: the proxy asks for them and takes them out again): what
        // translating a request and its answer costs.
        Phase::new("proxy-plain", &proxy_url, true, false).through(workload::Door::ChatPlain),
        Phase::new("proxy-messages", &proxy_url, true, false).through(workload::Door::Messages),
        Phase::new("proxy-responses", &proxy_url, true, false).through(workload::Door::Responses),
    ];
    if cfg.open_pages > 0 {
        phases.push(Phase::new("proxy-page", &proxy_url, true, false).with_pages(cfg.open_pages));
    }
    if cfg.stream {
        phases.push(Phase::new("direct-stream", &fake_url, false, true));
        phases.push(Phase::new("proxy-stream", &proxy_url, true, true));
    }

    let warm = cfg.sessions.clamp(1, WARMUP_SESSIONS);
    warm_up(
        &rig.client,
        &phases,
        warm,
        Turns::Fixed(WARMUP_TURNS),
        deadline,
        &progress,
    )
    .await?;

    // Rounds interleave the phases (A B [C] A B [C] …) so that a noisy neighbour hits all alike.
    'rounds: for round in 1..=cfg.rounds {
        for phase in &mut phases {
            if Instant::now() >= deadline {
                progress(&format!(
                    "{}: stopped, the time bound is reached",
                    phase.name
                ));
                break 'rounds;
            }
            let spec = phase.spec(
                &format!("r{round}"),
                cfg.sessions,
                Turns::Fixed(cfg.turns),
                cfg.ramp,
            );
            measure_round(&rig.client, &spec, deadline, &rig.procs, phase).await?;
            rig.ensure_running()?;
            progress(&format!(
                "round {round}/{} {}: {} requests, {} errors so far",
                cfg.rounds,
                phase.name,
                phase.run.samples.len(),
                phase.run.errors
            ));
        }
    }

    let proxy_report = rig.proxy_report()?;
    let config = Config {
        sessions: cfg.sessions,
        turns: cfg.turns,
        rounds: cfg.rounds,
        requests_per_phase: cfg.sessions * cfg.turns * cfg.rounds,
        warmup_sessions: warm,
        warmup_turns: WARMUP_TURNS,
        fake_latency_ms: cfg.fake_latency.as_secs_f64() * 1e3,
        ramp_ms: cfg.ramp.as_secs_f64() * 1e3,
        max_seconds: cfg.max_duration.as_secs_f64(),
        model_dir: cfg.model_dir.display().to_string(),
        open_pages: cfg.open_pages,
    };
    let machine = rig.machine();
    let procs = rig.procs;
    drop(rig);
    let reports = phases
        .into_iter()
        .filter(|p| p.rounds > 0)
        .map(|p| phase_report(p, &procs))
        .collect();
    Ok(Report::new(
        machine,
        config,
        reports,
        proxy_report,
        start_rss_kib,
    ))
}

/// Runs one round of a phase and accounts CPU time: the proxy's from idle to idle (so its
/// background capture work is included), the fake's and this process's over the requests.
async fn measure_round(
    client: &reqwest::Client,
    spec: &PhaseSpec,
    deadline: Instant,
    procs: &Procs,
    into: &mut Phase,
) -> Result<(), LoadgenError> {
    let proxy_before = if spec.via_proxy {
        let ticks = procs.proxy.wait_idle(IDLE_POLL, IDLE_BOUND).await?.0;
        Some((ticks, procs.proxy.thread_ticks()?))
    } else {
        None
    };
    let fake_before = procs.fake.cpu_ticks()?;
    let me_before = procs.me.cpu_ticks()?;
    let pages = (into.pages > 0).then(|| page::OpenPages::open(client, &into.base_url, into.pages));
    let run = crate::run_phase(client, spec, deadline).await;
    if let Some(pages) = pages {
        into.page.absorb(pages.close().await);
    }
    into.fake_ticks += procs.fake.cpu_ticks()?.saturating_sub(fake_before);
    into.me_ticks += procs.me.cpu_ticks()?.saturating_sub(me_before);
    if let Some((before, threads_before)) = proxy_before {
        let (after, settle) = procs.proxy.wait_idle(IDLE_POLL, IDLE_BOUND).await?;
        let ticks = after.saturating_sub(before);
        into.proxy_ticks += ticks;
        into.add_threads(&threads_before, &procs.proxy.thread_ticks()?, ticks);
        into.settle = into.settle.max(settle);
    }
    into.absorb(run);
    Ok(())
}

pub(crate) fn phase_report(phase: Phase, procs: &Procs) -> PhaseReport {
    let run = &phase.run;
    let n = run.samples.len();
    let per_request = |p: &Proc, ticks: u64| (n > 0).then(|| p.seconds(ticks) * 1e3 / n as f64);
    let wall_s = run.wall.as_secs_f64();
    let added = run
        .samples
        .iter()
        .filter_map(|s| Some(s.total_ms - s.upstream_ms?));
    let mean = |f: fn(&workload::Sample) -> usize| {
        (n > 0).then(|| run.samples.iter().map(f).sum::<usize>() as f64 / n as f64)
    };
    PhaseReport {
        name: phase.name.to_owned(),
        via_proxy: phase.via_proxy,
        stream: phase.stream,
        rounds: phase.rounds,
        requests: n,
        errors: run.errors,
        first_errors: run.first_errors.clone(),
        cut_by_deadline: run.cut_by_deadline,
        wall_s,
        throughput_rps: if wall_s > 0.0 { n as f64 / wall_s } else { 0.0 },
        latency_ms: Summary::of(run.samples.iter().map(|s| s.total_ms)),
        ttfb_ms: phase
            .stream
            .then(|| Summary::of(run.samples.iter().map(|s| s.ttfb_ms)))
            .flatten(),
        upstream_ms: Summary::of(run.samples.iter().filter_map(|s| s.upstream_ms)),
        added_ms: Summary::of(added),
        missing_server_timing: if phase.via_proxy && !phase.stream {
            run.samples
                .iter()
                .filter(|s| s.upstream_ms.is_none())
                .count()
        } else {
            0
        },
        mean_request_bytes: mean(|s| s.request_bytes),
        mean_response_bytes: mean(|s| s.response_bytes),
        cpu_ms_per_request: CpuPerRequest {
            proxy: phase
                .via_proxy
                .then(|| per_request(&procs.proxy, phase.proxy_ticks))
                .flatten(),
            fake: per_request(&procs.fake, phase.fake_ticks),
            loadgen: per_request(&procs.me, phase.me_ticks),
            resolution: per_request(&procs.me, 1),
        },
        proxy_settle_s: phase.via_proxy.then_some(phase.settle.as_secs_f64()),
        proxy_cpu_ms_by_thread: phase
            .proxy_threads
            .iter()
            .filter_map(|(kind, t)| Some((kind.clone(), per_request(&procs.proxy, *t)?)))
            .collect(),
        page: (phase.pages > 0).then(|| phase.page.report(phase.pages)),
    }
}
