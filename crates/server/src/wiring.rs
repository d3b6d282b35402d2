//! From validated settings to a running app: the concrete tokenizer, upstream client, capture
//! workers and options. Shared by `serve` and `demo`, so that the binary only parses and calls.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use ps_chat_template::{ChatTemplateError, ChatTokenizer};
use ps_config::{ConfigError, EnvLookup, Settings};
use ps_core::TurnSink;
use ps_sglang_client::{SglangClient, SglangClientConfig, SglangError};

use crate::capture::CaptureQueue;
use crate::state::{AppState, ServerOptions};

/// Capacity of the capture queue (turns waiting for a worker).
pub const CAPTURE_QUEUE_CAPACITY: usize = 4096;
/// At most this many capture worker threads (fewer on a smaller machine).
pub const MAX_CAPTURE_WORKERS: usize = 4;

/// Why the server could not start. Each message names what to fix.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(
        "cannot load the policy tokenizer from {dir} (check `server.model_dir` or `--model-dir`): {source}"
    )]
    Tokenizer {
        dir: PathBuf,
        #[source]
        source: ChatTemplateError,
    },
    #[error(transparent)]
    Upstream(#[from] SglangError),
    #[error(
        "cannot listen on {addr} (check `server.host`/`server.port` or `--host`/`--port`): {source}"
    )]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the capture workers: {0}")]
    Workers(#[source] std::io::Error),
}

/// The policy tokenizer: `server.model_dir`, or the small embedded model (with a warning: its tokens
/// are not the policy's).
pub fn tokenizer(settings: &Settings) -> Result<Arc<ChatTokenizer>, StartupError> {
    match &settings.server.model_dir {
        Some(dir) => ChatTokenizer::from_dir(dir)
            .map(Arc::new)
            .map_err(|source| StartupError::Tokenizer {
                dir: dir.clone(),
                source,
            }),
        None => {
            tracing::warn!(
                "no `server.model_dir` (or `--model-dir`): using the small embedded demo tokenizer; captured token ids are NOT the policy's"
            );
            Ok(Arc::new(ChatTokenizer::mini()))
        }
    }
}

pub fn options(settings: &Settings, env: EnvLookup<'_>) -> Result<ServerOptions, StartupError> {
    let s = &settings.server;
    Ok(ServerOptions {
        default_turn_type: s.default_turn_type,
        served_model_name: s.served_model_name.clone(),
        max_body_bytes: usize::try_from(s.max_body_bytes).unwrap_or(usize::MAX),
        client_api_key: settings.client_api_key(env)?.map(|k| k.expose().to_owned()),
        submission_enabled: s.submission_enabled,
        upstream_stream: settings.sglang.stream,
        return_token_ids: settings.sglang.return_token_ids,
        align_policy: settings.capture.align_policy(),
    })
}

pub fn policy_client(
    settings: &Settings,
    env: EnvLookup<'_>,
) -> Result<SglangClient, StartupError> {
    let g = &settings.sglang;
    Ok(SglangClient::new(SglangClientConfig {
        chat_url: g.chat_url.clone(),
        api_key: settings.sglang_api_key(env)?.map(|k| k.expose().to_owned()),
        timeout: g.timeout(),
        connect_timeout: g.connect_timeout(),
    })?)
}

/// Builds the app: checks that every secret variable the settings name is set, loads the tokenizer,
/// builds the upstream client and starts the capture workers feeding `sink`.
pub fn build_app(
    settings: &Settings,
    env: EnvLookup<'_>,
    sink: Arc<dyn TurnSink>,
    metrics: Option<PrometheusHandle>,
) -> Result<AppState, StartupError> {
    settings.check_secrets(env)?;
    let tokenizer = tokenizer(settings)?;
    let policy = policy_client(settings, env)?;
    let options = options(settings, env)?;
    let workers = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(MAX_CAPTURE_WORKERS);
    let capture = CaptureQueue::start(
        tokenizer,
        sink,
        options.align_policy,
        CAPTURE_QUEUE_CAPACITY,
        workers,
    )
    .map_err(StartupError::Workers)?;
    Ok(AppState::new(options, Arc::new(policy), capture, metrics))
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

/// Runs the server from settings until `shutdown` resolves: checks secrets, loads the tokenizer,
/// binds, serves and drains. Captured turns go to `sink`.
pub async fn run(
    settings: &Settings,
    sink: Arc<dyn TurnSink>,
    metrics: Option<PrometheusHandle>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), StartupError> {
    let env = ps_config::process_env;
    let app = build_app(settings, &env, sink, metrics)?;
    let listener = bind(settings).await?;
    tracing::info!(
        addr = ?local_addr(&listener),
        upstream = %settings.sglang.chat_url,
        mode = %settings.server.mode,
        default_turn_type = settings.server.default_turn_type.as_str(),
        "policy-serving listening"
    );
    crate::serve(listener, app, shutdown)
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
