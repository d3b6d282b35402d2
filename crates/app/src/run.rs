//! From validated settings to a running server: [`build_app`] assembles the parts, [`spawn`] serves
//! in a background task (demo, tests, embedding), [`run`] serves until a signal with the start-up
//! log lines, [`shutdown_signal`] is ctrl-c or SIGTERM.

use std::net::SocketAddr;
use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use ps_config::{EnvLookup, Settings};
use ps_core::TurnSink;
use ps_core::ports::{PauseHook, RecordSink};
use ps_server::capture::{CaptureQueue, DriftCheck};
use ps_server::rollout::Rollout;
use ps_server::{AppState, ExtraRoutes};
use ps_session_buffer::SessionBuffer;
use tokio::sync::Semaphore;

use crate::error::StartupError;
use crate::parts::{
    Records, buffer_config, judge_backend_with, judge_tokenizer, opd_parts, open_store, options,
    policy_client, policy_tokenizer_and_engine, provider_client, scorer, sweep_every,
};
use crate::policy_tokenizer::PolicyTokenizer;

/// Capacity of the capture queue (turns waiting for a worker).
pub const CAPTURE_QUEUE_CAPACITY: usize = 4096;
/// At most this many capture worker threads (fewer on a smaller machine).
pub const MAX_CAPTURE_WORKERS: usize = 4;

/// Builds the app: checks that every secret variable the settings name is set, loads the tokenizer,
/// builds the upstream client, opens the sample store, and starts the session buffer (with its PRM
/// judge and records) and the capture workers feeding it. Must run inside a tokio runtime.
pub async fn build_app(
    settings: &Settings,
    env: EnvLookup<'_>,
    metrics: Option<PrometheusHandle>,
) -> Result<AppState, StartupError> {
    build_app_with(settings, env, metrics, None).await
}

/// As [`build_app`], with the policy tokenizer given (`policy-serving demo`:
/// [`PolicyTokenizer::embedded_demo`]) instead of found by [`crate::parts::policy_tokenizer`].
pub async fn build_app_with(
    settings: &Settings,
    env: EnvLookup<'_>,
    metrics: Option<PrometheusHandle>,
    tokenizer: Option<PolicyTokenizer>,
) -> Result<AppState, StartupError> {
    Ok(build_full(settings, env, metrics, tokenizer).await?.state)
}

/// The app and the routes this crate adds to the server's: the inspection page (`[inspect]`).
#[derive(Debug)]
pub struct App {
    pub state: AppState,
    pub routes: ExtraRoutes,
}

/// As [`build_app_with`], with the inspection page: its history told by the server and the
/// session buffer, its routes in [`App::routes`] (serve them with `ps_server::serve_with`).
pub async fn build_full(
    settings: &Settings,
    env: EnvLookup<'_>,
    metrics: Option<PrometheusHandle>,
    tokenizer: Option<PolicyTokenizer>,
) -> Result<App, StartupError> {
    settings.check_secrets(env)?;
    let policy = policy_client(settings, env)?;
    let (tokenizer, engine) = match tokenizer {
        Some(t) => (t, None),
        None => policy_tokenizer_and_engine(settings, &policy).await?,
    };
    tracing::info!("policy tokenizer: {}", tokenizer.source);
    let moe_shape = tokenizer.moe_shape();
    let mut options = options(settings, env)?;
    options.ask_routed_experts = ask_routed_experts(settings, &policy).await;
    // One tokenizer in memory: capture, the OPD teacher's input, the inspection page and (unless
    // `prm.model_dir` holds another tokenizer) the judges all share this `Arc`.
    let judge_tokenizer = judge_tokenizer(settings, &tokenizer)?;
    let tokenizer = tokenizer.tokenizer;
    let history = crate::inspect::history(settings);
    let store = open_store(settings).await?;
    let records = Arc::new(Records::start(settings)?);
    let judge = judge_backend_with(settings, judge_tokenizer)?;
    let judge_permits = Arc::new(Semaphore::new(settings.prm.max_concurrency.max(1)));
    let provider = provider_client(settings, env)?;
    let drift = DriftCheck::new(
        settings.capture.drift_check_first,
        settings.capture.drift_check_every,
    );
    let buffer = SessionBuffer::with_opd(
        buffer_config(settings),
        scorer(settings, &judge, provider.as_ref(), &judge_permits)?,
        opd_parts(
            settings,
            env,
            &judge,
            provider.as_ref(),
            &judge_permits,
            &tokenizer,
            drift.engine_prompts(),
        )?,
        store.clone() as Arc<dyn ps_core::SampleSink>,
        (!records.is_empty()).then(|| records.clone() as Arc<dyn RecordSink>),
    );
    let buffer = buffer
        .with_pending_store(store.clone() as Arc<dyn ps_core::PendingStore>)
        .with_tokenizer_fingerprint(tokenizer.fingerprint());
    let workers = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(MAX_CAPTURE_WORKERS);
    let sink: Arc<dyn TurnSink> = Arc::new(buffer.clone());
    let page_tokenizer = tokenizer.clone();
    let capture = CaptureQueue::start(
        tokenizer,
        sink,
        options.align_policy,
        drift,
        CAPTURE_QUEUE_CAPACITY,
        workers,
    )
    .map(|q| {
        q.with_max_turn_tokens(settings.server.max_turn_tokens)
            .with_max_queued_bytes(
                usize::try_from(settings.capture.max_queued_mib.saturating_mul(1 << 20))
                    .unwrap_or(usize::MAX),
            )
            .with_prefix_idle(settings.server.session_timeout())
            .with_image_limits(ps_chat_template::ImageLimits {
                max_image_bytes: usize::try_from(
                    settings.capture.max_image_mib.saturating_mul(1 << 20),
                )
                .unwrap_or(usize::MAX),
                max_images: settings.capture.max_images_per_turn,
            })
            .with_store_keeping_images(store.keeps_images())
            .with_routed_experts(
                settings.capture.routed_experts,
                moe_shape,
                options.ask_routed_experts,
            )
            .with_max_held_experts(
                usize::try_from(
                    settings
                        .capture
                        .max_held_experts_mib
                        .saturating_mul(1 << 20),
                )
                .unwrap_or(usize::MAX),
            )
    })
    .map_err(StartupError::Workers)?;
    let rollout = Rollout {
        store: store.clone(),
        buffer: Arc::new(buffer.clone()),
        on_pause: Some(records as Arc<dyn PauseHook>),
    };
    let experts_budget = capture.stats().experts.budget.clone();
    let state = AppState::with_rollout(options, Arc::new(policy), capture, metrics, Some(rollout));
    if let Some(engine) = engine {
        state.learn_engine(engine, "reported by the policy server at start");
    }
    // The buffer tells what happens to sessions and turns: the inspection page's history keeps it,
    // and the session matcher forgets a conversation when the buffer closes its session.
    let mut observers: Vec<Arc<dyn ps_core::TurnObserver>> = Vec::new();
    if let Some(h) = &history {
        observers.push(crate::inspect::observer(h));
    }
    if let Some(m) = state.session_matcher() {
        observers.push(m);
    }
    let buffer = if observers.is_empty() {
        buffer
    } else {
        buffer.with_observer(Arc::new(ps_core::Observers(observers)))
    };
    buffer.spawn_sweeper(sweep_every(settings.server.session_timeout()));
    // Turns the previous run persisted at shutdown (unfinished when its grace ran out) resume now.
    {
        let store = store.clone();
        let experts = experts_budget;
        tokio::spawn(async move {
            match store.take_pending().await {
                Ok(mut turns) if !turns.is_empty() => {
                    // Their routed experts are in memory again: counted, past the bound too.
                    for t in &mut turns {
                        if let Some(rows) = &mut t.turn.routed_experts {
                            rows.held = Some(experts.hold(rows.data.len()));
                        }
                    }
                    buffer.resume(turns);
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(error = %e, "pending turns of the previous run could not be read")
                }
            }
        });
    }
    Ok(match history {
        Some(h) => {
            let state = state.with_observer(crate::inspect::observer(&h));
            let routes = crate::inspect::routes(settings, h, &state, store, page_tokenizer);
            App { state, routes }
        }
        None => App {
            state,
            routes: ExtraRoutes::default(),
        },
    })
}

/// A server serving in a background task ([`spawn`]): its URL, and a graceful stop.
#[derive(Debug)]
pub struct Running {
    addr: SocketAddr,
    url: String,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Running {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<bound address>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Stops it as a signal would (in-flight requests finish; capture, scoring and submission
    /// drain within `server.shutdown_grace_sec`) and waits until it has.
    pub async fn stop(self) -> std::io::Result<()> {
        let _ = self.stop.send(());
        match self.task.await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(std::io::Error::other(e)),
        }
    }
}

/// Builds the app from `settings` ([`build_app`]), binds `server.host:server.port` (port 0: a free
/// one) and serves in a background task: for embedding the proxy in another program, and for tests.
pub async fn spawn(
    settings: &Settings,
    env: EnvLookup<'_>,
    metrics: Option<PrometheusHandle>,
) -> Result<Running, StartupError> {
    spawn_with(settings, env, metrics, None).await
}

/// As [`spawn`], with the policy tokenizer given (see [`build_app_with`]).
pub async fn spawn_with(
    settings: &Settings,
    env: EnvLookup<'_>,
    metrics: Option<PrometheusHandle>,
    tokenizer: Option<PolicyTokenizer>,
) -> Result<Running, StartupError> {
    let app = build_full(settings, env, metrics, tokenizer).await?;
    let listener = bind(settings).await?;
    let addr = match listener.local_addr() {
        Ok(addr) => addr,
        Err(source) => {
            return Err(StartupError::Bind {
                addr: format!("{}:{}", settings.server.host, settings.server.port),
                source,
            });
        }
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(serve(listener, app, async {
        let _ = stopped.await;
    }));
    Ok(Running {
        addr,
        url: format!("http://{addr}"),
        stop,
        task,
    })
}

/// Serves `app` on `listener` until `shutdown` resolves, then winds the pipeline down in order:
/// in-flight requests finish and the capture queue drains (`ps_server::serve_with`), the session
/// buffer finishes scoring and submitting within `server.shutdown_grace_sec` (what it cannot
/// finish is persisted for the next start), and the sample store is closed, so that a restarted
/// server can open it at once.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: App,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let state = app.state.clone();
    ps_server::serve_with(listener, app.state, app.routes, shutdown).await?;
    close_pipeline(&state).await;
    Ok(())
}

/// The session buffer's shutdown, then the store's close (after the server drained capture).
async fn close_pipeline(state: &AppState) {
    let Some(r) = state.rollout() else {
        return;
    };
    let grace = state.options().shutdown_grace;
    if !r.buffer.shutdown(grace).await {
        tracing::warn!(
            ?grace,
            "scoring and submission did not finish within server.shutdown_grace_sec"
        );
    }
    match r.store.stats().await {
        Ok(st) => tracing::info!(
            last_seq = st.last_seq,
            committed = st.committed,
            store = %r.store.describe(),
            "closing the sample store"
        ),
        Err(e) => tracing::warn!(error = %e, "sample store counters unavailable at shutdown"),
    }
    // Stops the embedded store's writer now, so the database is closed when the last handle goes
    // (a restarted server can open it at once).
    if let Err(e) = r.store.close().await {
        tracing::error!(error = %e, "closing the sample store failed");
    }
}

/// Binds `server.host:server.port`.
pub async fn bind(settings: &Settings) -> Result<tokio::net::TcpListener, StartupError> {
    let addr = format!("{}:{}", settings.server.host, settings.server.port);
    tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|source| StartupError::Bind { addr, source })
}

/// The address a listener is bound to, for the start-up log line.
pub fn local_addr(listener: &tokio::net::TcpListener) -> Option<SocketAddr> {
    listener.local_addr().ok()
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The start-up line about the trainer-side keys of the settings file (the operators'
/// `config.toml`), when it has any: which are the trainer's alone and which both sides read.
pub fn trainer_side_line(keys: &[String]) -> Option<String> {
    if keys.is_empty() {
        return None;
    }
    let both: Vec<&str> = keys
        .iter()
        .map(String::as_str)
        .filter(|k| {
            ps_config::TRAINER_FILE_KEYS
                .iter()
                .any(|(key, r)| key == k && matches!(r, ps_config::Reader::Both(_)))
        })
        .collect();
    let trainer: Vec<&str> = keys
        .iter()
        .map(String::as_str)
        .filter(|k| !both.contains(k))
        .collect();
    let mut line = format!(
        "trainer-side keys in the settings file, left to the trainer: {}",
        if trainer.is_empty() {
            "none".to_owned()
        } else {
            trainer.join(", ")
        }
    );
    if !both.is_empty() {
        line.push_str(&format!(
            "; read by both sides: {} (see the README's operator table)",
            both.join(", ")
        ));
    }
    Some(line)
}

/// How clients of the proxy must authenticate, in one plain line ending with a curl command that
/// works against `base_url` (`http://host:port`). The key's value is never shown, except the
/// reference's placeholder `EMPTY`: `SGLANG_API_KEY=EMPTY` (the operators' `env.sh`) means clients
/// must send `Authorization: Bearer EMPTY`, as in the reference.
pub fn client_auth_line(settings: &Settings, env: EnvLookup<'_>, base_url: &str) -> String {
    let models = format!("{base_url}/v1/models");
    let legacy = ps_config::LEGACY_CLIENT_KEY_ENV;
    match &settings.server.api_key_env {
        Some(var) => format!(
            "clients must send `Authorization: Bearer <value of {var}>` (server.api_key_env = \
             \"{var}\"); a request without it gets 401. Try: curl -H \"Authorization: Bearer \
             ${var}\" {models}"
        ),
        None => match env(legacy).filter(|v| !v.trim().is_empty()) {
            Some(v) if v == "EMPTY" => format!(
                "{legacy}=EMPTY is set, so clients must send `Authorization: Bearer EMPTY`, as in \
                 the reference; a request without it gets 401 (unset {legacy}, or set \
                 server.api_key_env, to change this). Try: curl -H \"Authorization: Bearer \
                 EMPTY\" {models}"
            ),
            Some(_) => format!(
                "{legacy} is set, so clients must send `Authorization: Bearer <value of \
                 {legacy}>`, as in the reference; a request without it gets 401 (unset {legacy}, \
                 or set server.api_key_env, to change this). Try: curl -H \"Authorization: \
                 Bearer ${legacy}\" {models}"
            ),
            None => format!(
                "clients need no key (server.api_key_env and {legacy} are unset). Try: curl \
                 {models}"
            ),
        },
    }
}

/// Which requests train, said plainly (`serve` logs it at start, `check` prints it on its `turn
/// types` line): the turn type of requests that name none (`server.default_turn_type`) with and
/// without a session key, as `server.session_inference` finds their sessions.
pub fn turn_type_line(settings: &Settings) -> String {
    use ps_config::{DefaultTurnType, SessionInference};
    let s = &settings.server;
    let rules = if s.side_turn_rules.is_empty() {
        String::new()
    } else {
        let names: Vec<&str> = s.side_turn_rules.iter().map(|r| r.name.as_str()).collect();
        format!(" (except side turns by shape: {})", names.join(", "))
    };
    let keyless_infers = s.session_inference != SessionInference::Off;
    let keyed_infers = s.session_inference == SessionInference::Always;
    let says = |train: bool| {
        if train {
            "main turns: they train"
        } else {
            "side turns: they never train"
        }
    };
    let (keyless, keyed) = (
        s.default_turn_type.for_request(keyless_infers) == ps_core::TurnType::Main,
        s.default_turn_type.for_request(keyed_infers) == ps_core::TurnType::Main,
    );
    let fix = match (keyless, keyed) {
        (true, true) => String::new(),
        _ if s.default_turn_type == DefaultTurnType::Side => {
            "; unmodified agents produce no samples: send `X-Turn-Type: main`, or set \
             server.default_turn_type = \"auto\""
                .to_owned()
        }
        (_, false) => {
            "; clients that key their sessions mark main turns with `X-Turn-Type: main`".to_owned()
        }
        (false, true) => {
            "; with server.session_inference = \"off\" requests without a key share the session \
             \"unknown\""
                .to_owned()
        }
    };
    format!(
        "requests naming no turn type (server.default_turn_type = \"{}\"){rules}: without a session \
         key they are {}; with one they are {}{fix}",
        s.default_turn_type.as_str(),
        says(keyless),
        says(keyed),
    )
}

/// `http://host:port` where a client on this machine reaches the proxy (a wildcard listen
/// address becomes `127.0.0.1`).
pub fn local_base_url(host: &str, port: u16) -> String {
    let host = match host {
        "0.0.0.0" | "::" | "[::]" | "" => "127.0.0.1",
        h if h.contains(':') && !h.starts_with('[') => return format!("http://[{h}]:{port}"),
        h => h,
    };
    format!("http://{host}:{port}")
}

/// Runs the server from settings until `shutdown` resolves: checks secrets, loads the tokenizer,
/// opens the store, binds, serves, then drains capture, scoring and submission.
pub async fn run(
    settings: &Settings,
    metrics: Option<PrometheusHandle>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), StartupError> {
    let env = ps_config::process_env;
    if let Some(line) = trainer_side_line(&settings.trainer_side) {
        tracing::info!("{line}");
    }
    let app = build_full(settings, &env, metrics, None).await?;
    if settings.server.admin_key_env.is_none() && !is_loopback(&settings.server.host) {
        tracing::warn!(
            host = %settings.server.host,
            "the /v1/rollout/* and /v1/inspect/* endpoints are open to the network: set server.admin_key_env"
        );
    }
    let listener = bind(settings).await?;
    let port = local_addr(&listener).map_or(settings.server.port, |a| a.port());
    tracing::info!(
        "{}",
        client_auth_line(settings, &env, &local_base_url(&settings.server.host, port))
    );
    tracing::info!(
        addr = ?local_addr(&listener),
        upstream = %settings.sglang.chat_url,
        mode = %settings.server.mode,
        default_turn_type = settings.server.default_turn_type.as_str(),
        "policy-serving listening"
    );
    tracing::info!("{}", turn_type_line(settings));
    app.state.options().inference.log_active();
    if settings.inspect.enabled {
        tracing::info!(
            "inspection page: {}/ui/{}",
            local_base_url(&settings.server.host, port),
            if settings.server.admin_key_env.is_some() {
                " (it asks for the admin key)"
            } else {
                ""
            }
        );
    }
    serve(listener, app, shutdown)
        .await
        .map_err(|source| StartupError::Bind {
            addr: format!("{}:{}", settings.server.host, settings.server.port),
            source,
        })
}

/// Resolves on ctrl-c or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutdown requested: finishing in-flight requests and queued captures");
}

/// Whether main turns ask the engine for routed experts (`return_routed_experts`, which only SGLang
/// takes): always under `capture.routed_experts = "require"`; under `auto` when the engine says it
/// returns them (SGLang's `enable_return_routed_experts`).
async fn ask_routed_experts(settings: &Settings, policy: &ps_sglang_client::SglangClient) -> bool {
    use ps_core::RoutedExpertsMode as M;
    match settings.capture.routed_experts {
        M::Off => false,
        M::Require => true,
        M::Auto => match policy.returns_routed_experts().await {
            Ok(Some(on)) => {
                if on {
                    tracing::info!(
                        "the policy server returns routed experts: main turns ask for them and \
                         samples carry them (capture.routed_experts = \"auto\")"
                    );
                }
                on
            }
            Ok(None) => false,
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "could not ask the policy server whether it returns routed experts: main \
                     turns do not ask for them (set capture.routed_experts = \"require\" to \
                     ask regardless)"
                );
                false
            }
        },
    }
}
