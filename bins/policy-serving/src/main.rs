//! `policy-serving`: parses the command line and wires the library crates. No logic lives here.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use ps_chat_template::ChatTokenizer;
use ps_config::{LogFormat, Overrides, Settings};

/// jemalloc: the proxy allocates many short-lived buffers (JSON values, token vectors); with the
/// system allocator malloc/free were 43% of its CPU samples under load
/// (docs/benchmarks-history.md).
/// Set to give freed memory back (`alloc.rs`).
mod alloc;

#[derive(Parser)]
#[command(
    name = "policy-serving",
    version,
    about = "Proxy between agent clients and an SGLang policy that turns live conversations into training samples"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the OpenAI-compatible proxy.
    Serve(ServeArgs),
    /// Run the operator checklist against the configured services: one line per check (ok, FAIL,
    /// skip) with its latency, and the cause and fix of each failure. Exit code 0 when no check
    /// failed, 1 when one did, 2 on a configuration error.
    Check(ServeArgs),
    /// Run the self-contained demo: fake SGLang, proxy and a scripted conversation on loopback;
    /// then print the inspection page's URL and keep serving it until Ctrl-C.
    Demo {
        /// `rl`, `opd` or `combine`.
        #[arg(long, value_enum, default_value_t = DemoMode::Rl)]
        mode: DemoMode,
        /// Stop after the scripted conversation instead of serving on (for scripts).
        #[arg(long)]
        exit: bool,
    },
    /// Render and tokenize turns read as JSON lines on stdin (see the README).
    Tokenize {
        /// The model's tokenizer directory (tokenizer.json, tokenizer_config.json); default: the embedded mini model.
        #[arg(long)]
        model_dir: Option<PathBuf>,
    },
    /// Print the effective configuration with secrets redacted.
    Config {
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Work with a sample store.
    Samples {
        #[command(subcommand)]
        command: SamplesCommand,
    },
}

#[derive(Subcommand)]
enum SamplesCommand {
    /// Write every kept sample as JSON lines `{"seq", "sample"}` (for replay and inspection).
    Export {
        /// The store directory (`store.path`); the server must not be running on it.
        #[arg(long)]
        store: PathBuf,
        /// Output file; default standard output.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Args)]
struct ServeArgs {
    /// Settings file (JSON or TOML, by extension).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The policy's tokenizer directory (overrides `server.model_dir`). Unset: the directory the
    /// policy server reports, when it exists on this machine; else `serve` refuses to start.
    #[arg(long)]
    model_dir: Option<PathBuf>,
    #[arg(long)]
    host: Option<String>,
    #[arg(long)]
    port: Option<u16>,
}

impl ServeArgs {
    /// The settings file and the command-line overrides.
    fn into_parts(self) -> (Option<PathBuf>, Overrides) {
        let overrides = Overrides {
            host: self.host,
            port: self.port,
            model_dir: self.model_dir,
        };
        (self.config, overrides)
    }
}

/// `demo --mode`: the values of `server.mode`, parsed by clap (which lists them in its error).
#[derive(Clone, Copy, ValueEnum)]
enum DemoMode {
    Rl,
    Opd,
    Combine,
}

impl From<DemoMode> for ps_config::Mode {
    fn from(mode: DemoMode) -> Self {
        match mode {
            DemoMode::Rl => Self::Rl,
            DemoMode::Opd => Self::Opd,
            DemoMode::Combine => Self::Combine,
        }
    }
}

fn init_tracing(level: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level.to_ascii_lowercase()));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
    }
}

fn load(config: Option<&std::path::Path>, overrides: &Overrides) -> Result<Settings, ExitCode> {
    ps_config::load(config, overrides).map_err(|e| {
        eprintln!("policy-serving: configuration error: {e}");
        ExitCode::from(2)
    })
}

/// Threads of tokio's blocking pool (tokio's default is 512). What runs there is short: rendering a
/// judge prompt per PRM or hint vote, tokenizing an OPD teacher prompt, reading a page of samples
/// for the trainer. Under load tokio starts a thread whenever none is idle, so with hundreds of
/// judge votes in flight the proxy grew to ~110 threads, and each thread's mimalloc heap (the
/// allocator then, on transparent huge pages) kept its memory after the load: RSS ended the soak
/// at 2.3-3.9 x its baseline instead of 1.06 x (docs/benchmarks-history.md, "Soak"). A few
/// threads per core do the same work.
const MAX_BLOCKING_THREADS: usize = 16;

/// How long an idle blocking-pool thread waits for work before it exits (tokio's default is 10 s).
/// Each thread kept its own allocator pages until it exited (with mimalloc, then; jemalloc's
/// per-thread caches are small): on the agent scenario the proxy's RSS fell from 228 to 147 MiB
/// when the pool's threads went (docs/benchmarks-history.md, "Memory: one tokenizer, the start-up
/// peak and what the heap keeps"), so after a burst they go after 1 s.
const BLOCKING_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(1);

fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .thread_keep_alive(BLOCKING_KEEP_ALIVE)
        .build()
        .map_err(|e| {
            eprintln!("policy-serving: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        })
}

fn main() -> ExitCode {
    let tuning = alloc::give_memory_back();
    match run(Cli::parse(), tuning) {
        Ok(()) => ExitCode::SUCCESS,
        Err(code) => code,
    }
}

fn run(cli: Cli, tuning: alloc::Tuning) -> Result<(), ExitCode> {
    match cli.command {
        Command::Serve(args) => {
            let (config, overrides) = args.into_parts();
            let settings = load(config.as_deref(), &overrides)?;
            init_tracing(&settings.logging.level, settings.logging.format);
            tracing::debug!(
                allocator = tuning.allocator,
                dirty_decay_ms = tuning.dirty_decay_ms,
                background_thread = tuning.background_thread,
                arenas = tuning.arenas,
                tcache_max = tuning.tcache_max,
                thp_disabled = tuning.thp_disabled,
                "allocator: freed pages go back to the system"
            );
            for (var, instead) in ps_config::ignored_legacy_env(&ps_config::process_env) {
                tracing::warn!("{var} is set but not honoured: {instead}");
            }
            let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .map_err(|e| tracing::warn!("metrics disabled: {e}"))
                .ok();
            runtime()?
                .block_on(ps_app::run(&settings, metrics, ps_app::shutdown_signal()))
                .map_err(|e| {
                    tracing::error!("{e}");
                    eprintln!("policy-serving: {e}");
                    ExitCode::FAILURE
                })
        }
        Command::Check(args) => {
            let (config, overrides) = args.into_parts();
            let settings = load(config.as_deref(), &overrides)?;
            init_tracing("warn", LogFormat::Text);
            let report =
                runtime()?.block_on(ps_check::run_checks(&settings, &ps_config::process_env));
            print!("{}", report.render());
            println!("{}", report.summary());
            if report.all_passed() {
                Ok(())
            } else {
                Err(ExitCode::FAILURE)
            }
        }
        Command::Demo { mode, exit } => {
            init_tracing("warn", LogFormat::Text);
            let mut out = std::io::stdout();
            // As in `serve`, so that the proxy's /metrics works while the demo keeps serving.
            let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .ok();
            let options = ps_demo::DemoOptions {
                metrics,
                keep_serving: (!exit).then(|| Box::pin(ps_app::shutdown_signal()) as _),
            };
            runtime()?
                .block_on(ps_demo::run_with(&mut out, mode.into(), options))
                .map(|_| ())
                .map_err(|e| {
                    eprintln!("policy-serving demo: {e}");
                    ExitCode::FAILURE
                })
        }
        Command::Tokenize { model_dir } => {
            let tok = match model_dir {
                Some(dir) => ChatTokenizer::from_dir(&dir).map_err(|e| {
                    eprintln!("policy-serving tokenize: {e}");
                    ExitCode::from(2)
                })?,
                None => {
                    eprintln!(
                        "policy-serving tokenize: no --model-dir, using the embedded mini model"
                    );
                    ChatTokenizer::mini()
                }
            };
            let stats = ps_chat_template::tokenize_jsonl(
                &tok,
                std::io::stdin().lock(),
                std::io::stdout().lock(),
            )
            .map_err(|e| {
                eprintln!("policy-serving tokenize: {e}");
                ExitCode::FAILURE
            })?;
            eprintln!("policy-serving tokenize: {stats:?}");
            Ok(())
        }
        Command::Samples {
            command: SamplesCommand::Export { store, out },
        } => {
            let fail = |e: &dyn std::fmt::Display| {
                eprintln!("policy-serving samples export: {e}");
                ExitCode::FAILURE
            };
            // The store's writer runs on the runtime's blocking pool.
            let rt = runtime()?;
            let _guard = rt.enter();
            let store =
                ps_sample_store::SampleStore::open(ps_sample_store::StoreConfig::new(store))
                    .map_err(|e| fail(&e))?;
            let written = match out {
                Some(path) => {
                    let file = std::fs::File::create(&path)
                        .map_err(|e| fail(&format!("cannot create {}: {e}", path.display())))?;
                    store.export_jsonl(std::io::BufWriter::new(file))
                }
                None => store.export_jsonl(std::io::stdout().lock()),
            }
            .map_err(|e| fail(&e))?;
            eprintln!("policy-serving samples export: {written} samples");
            Ok(())
        }
        Command::Config { config } => {
            let settings = load(config.as_deref(), &Overrides::default())?;
            println!("{}", settings.redacted_json_pretty());
            Ok(())
        }
    }
}
