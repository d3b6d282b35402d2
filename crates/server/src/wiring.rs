//! From validated settings to a running app: the concrete tokenizer, upstream client, capture
//! workers and options. Shared by `serve` and `demo`, so that the binary only parses and calls.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use ps_chat_template::{ChatTemplateError, ChatTokenizer};
use ps_config::{ConfigError, EnvLookup, Mode, PrmBackend, Settings, StoreKind, TeacherBackend};
use ps_core::{SampleLog, TurnSink};
use ps_opd_judge::HintScorer;
use ps_prm_client::{
    JudgeBackend, JudgeError, PrmScorer, SglangJudge, SglangJudgeConfig, TurnScorer,
};
use ps_provider_client::{ProviderClient, ProviderConfig, ProviderError, ProviderJudge};
use ps_records::{RecordError, RecordOptions, RecordWriter};
use ps_redis_store::{Durability, RedisConfig, RedisStore};
use ps_sample_store::{SampleStore, StoreConfig, StoreError};
use ps_session_buffer::{
    BufferConfig, BufferMode, OpdOptions, OpdParts, RecordSink, SessionBuffer,
};
use ps_sglang_client::{SglangClient, SglangClientConfig, SglangError};
use ps_teacher_client::{
    CompletionsTeacher, CompletionsTeacherConfig, SglangTeacher, SglangTeacherConfig, TeacherError,
    TeacherScorer,
};
use serde_json::Value;
use tokio::sync::Semaphore;

use crate::capture::CaptureQueue;
use crate::policy_tokenizer::{self, PolicyTokenizer, Reported};
use crate::rollout::{PauseHook, Rollout};
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
    #[error(
        "no policy tokenizer: {reason}. Set `server.model_dir` (or `--model-dir`) to the policy's \
         tokenizer directory (tokenizer.json, tokenizer_config.json): captured token ids must be \
         the policy's"
    )]
    NoTokenizer { reason: String },
    #[error(
        "the policy tokenizer does not match the model the policy server serves: {detail}. Set \
         `server.model_dir` to the tokenizer directory of the served model"
    )]
    TokenizerMismatch { detail: String },
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
    #[error("cannot open the sample store (check `store.path`): {0}")]
    Store(#[from] StoreError),
    #[error("cannot open the Redis sample store (store.kind = \"redis\"): {}", .0.chain())]
    RedisStore(#[from] ps_redis_store::RedisStoreError),
    #[error("cannot set up the PRM judge: {0}")]
    Judge(#[from] JudgeError),
    #[error("cannot start the records writer: {0}")]
    Records(#[from] RecordError),
    #[error("cannot set up the teacher: {0}")]
    Teacher(#[from] TeacherError),
    #[error("cannot set up the external provider: {0}")]
    Provider(#[source] Box<ProviderError>),
    #[error("`{key}` is not set: {what}")]
    Missing {
        key: &'static str,
        what: &'static str,
    },
}

/// How often the idle-session sweeper runs: a quarter of the session timeout, within bounds.
fn sweep_every(timeout: std::time::Duration) -> std::time::Duration {
    (timeout / 4).clamp(
        std::time::Duration::from_millis(100),
        std::time::Duration::from_secs(5),
    )
}

/// The JSONL records: conversations, PRM and OPD decisions, each when its directory is configured.
#[derive(Debug, Default)]
pub struct Records {
    conversations: Option<RecordWriter>,
    prm: Option<RecordWriter>,
    opd: Option<RecordWriter>,
}

impl Records {
    pub fn start(settings: &Settings) -> Result<Self, StartupError> {
        let l = &settings.logging;
        let writer = |dir: Option<std::path::PathBuf>, prefix: &str, key: &'static str| {
            dir.map(|d| {
                RecordWriter::start(
                    d,
                    prefix,
                    RecordOptions {
                        config_key: key,
                        ..RecordOptions::default()
                    },
                )
            })
            .transpose()
        };
        Ok(Self {
            conversations: writer(
                l.conversation_records(),
                "conversations",
                "logging.record_dir",
            )?,
            prm: writer(l.prm_records(), "prm", "logging.prm_record_dir")?,
            opd: writer(l.opd_records(), "opd", "logging.opd_record_dir")?,
        })
    }

    fn is_empty(&self) -> bool {
        self.conversations.is_none() && self.prm.is_none() && self.opd.is_none()
    }
}

impl RecordSink for Records {
    fn conversation(&self, record: Value) {
        if let Some(w) = &self.conversations {
            w.record(record);
        }
    }

    fn prm(&self, record: Value) {
        if let Some(w) = &self.prm {
            w.record(record);
        }
    }

    fn opd(&self, record: Value) {
        if let Some(w) = &self.opd {
            w.record(record);
        }
    }
}

impl PauseHook for Records {
    /// The reference truncates its record files on pause; records here are only rotated.
    fn on_pause(&self) {
        for w in [&self.conversations, &self.prm, &self.opd]
            .into_iter()
            .flatten()
        {
            w.rotate();
        }
    }
}

/// Asks the policy server what it serves (SGLang `GET /get_model_info`, else `GET /v1/models`).
pub async fn ask_policy_server(settings: &Settings, policy: &SglangClient) -> Reported {
    match policy.model_info(&settings.server.served_model_name).await {
        Ok(info) => Reported::Info(info),
        Err(e) => Reported::Unreachable {
            url: policy.model_info_url(),
            error: e.to_string(),
        },
    }
}

/// The policy tokenizer by the rule of [`crate::policy_tokenizer`]: `server.model_dir`, else the
/// directory the policy server reports when it exists here, else an error naming
/// `server.model_dir`; refused when the policy server reports a model it clearly does not fit.
pub async fn policy_tokenizer(
    settings: &Settings,
    policy: &SglangClient,
) -> Result<PolicyTokenizer, StartupError> {
    let reported = ask_policy_server(settings, policy).await;
    let dir = settings.server.model_dir.clone();
    let chosen = tokio::task::spawn_blocking(move || {
        let chosen = policy_tokenizer::choose(dir.as_deref(), &reported);
        (chosen, reported)
    })
    .await
    .map_err(|e| StartupError::NoTokenizer {
        reason: format!("loading it failed: {e}"),
    })?;
    let (chosen, reported) = chosen;
    if let (Ok(_), Reported::Unreachable { url, error }) = (&chosen, &reported) {
        tracing::warn!(
            %url,
            "the policy server could not be asked what it serves ({error}): the tokenizer of \
             server.model_dir is not compared with the served model"
        );
    }
    chosen
}

pub fn options(settings: &Settings, env: EnvLookup<'_>) -> Result<ServerOptions, StartupError> {
    let s = &settings.server;
    Ok(ServerOptions {
        default_turn_type: s.default_turn_type,
        served_model_name: s.served_model_name.clone(),
        max_body_bytes: usize::try_from(s.max_body_bytes).unwrap_or(usize::MAX),
        client_api_key: settings.client_api_key(env)?,
        submission_enabled: s.submission_enabled,
        upstream_stream: settings.sglang.stream,
        token_ids: settings.sglang.token_ids_mode(),
        align_policy: settings.capture.align_policy(),
        pause_mode: s.pause_mode,
        pause_hold_max: std::time::Duration::from_secs(s.pause_hold_max_sec),
        admin_api_key: settings.admin_api_key(env)?,
        shutdown_grace: s.shutdown_grace(),
        max_messages: s.max_messages,
        max_upstream: settings.sglang.max_concurrency,
        inference: crate::infer::InferenceOptions {
            mode: s.session_inference,
            idle: s.session_timeout(),
            max_sessions: s.max_sessions,
            side_rules: s
                .side_turn_rules
                .iter()
                .map(|r| ps_session_infer::ShapeRule {
                    name: r.name.clone(),
                    system_prefix: r.system_prefix.clone(),
                    last_user_prefix: r.last_user_prefix.clone(),
                    without_tools: r.without_tools.then_some(true),
                    max_tokens_at_most: r.max_tokens_at_most,
                })
                .collect(),
        },
    })
}

pub fn policy_client(
    settings: &Settings,
    env: EnvLookup<'_>,
) -> Result<SglangClient, StartupError> {
    let g = &settings.sglang;
    Ok(SglangClient::new(SglangClientConfig {
        chat_url: g.chat_url.clone(),
        api_key: settings.sglang_api_key(env)?,
        timeout: g.timeout(),
        connect_timeout: g.connect_timeout(),
    })?)
}

/// The judge backend (SGLang `/generate` at `prm.router_url`, rendered with the judge's tokenizer:
/// `prm.model_dir`, else the policy's) shared by the PRM and the hint judge, and the cap on their
/// calls (`prm.max_concurrency`).
pub fn judge_backend(
    settings: &Settings,
    policy_tokenizer: &Arc<ChatTokenizer>,
) -> Result<Arc<SglangJudge>, StartupError> {
    let p = &settings.prm;
    let tokenizer =
        match &p.model_dir {
            Some(dir) => Arc::new(ChatTokenizer::from_dir(dir).map_err(|source| {
                StartupError::Tokenizer {
                    dir: dir.clone(),
                    source,
                }
            })?),
            None => policy_tokenizer.clone(),
        };
    Ok(Arc::new(SglangJudge::new(
        SglangJudgeConfig {
            router_url: p.router_url.clone(),
            timeout: std::time::Duration::from_secs(p.timeout_sec),
            temperature: p.temperature,
            max_new_tokens: p.max_new_tokens,
        },
        Some(tokenizer),
    )?))
}

/// The external provider's client, when anything active calls it (`settings.provider_in_use()`):
/// one per process, so its `provider.max_concurrency` cap is shared by every role and session. The
/// key comes from the variable named by `provider.api_key_env`.
pub fn provider_client(
    settings: &Settings,
    env: EnvLookup<'_>,
) -> Result<Option<Arc<ProviderClient>>, StartupError> {
    if !settings.provider_in_use() {
        return Ok(None);
    }
    let p = &settings.provider;
    let chat_url = p.chat_completions_url().ok_or(StartupError::Missing {
        key: "provider.base_url",
        what: "the provider root URL (such as \"https://taotoken.net/api\"), required by a \
               judge whose backend is \"provider\"",
    })?;
    let client = ProviderClient::new(ProviderConfig {
        // The loaded settings do not say whether the file called the section `taotoken`.
        name: "provider".to_owned(),
        chat_url,
        api_key: settings.provider_api_key(env)?,
        key_var: p.api_key_env.clone(),
        max_concurrency: p.max_concurrency.max(1),
        timeout: p.timeout(),
        max_retries: p.max_retries,
        deadline: Some(std::time::Duration::from_secs(p.deadline_sec)),
    })
    .map_err(|e| StartupError::Provider(Box::new(e)))?;
    Ok(Some(Arc::new(client)))
}

/// A judge backend over the provider with `model`, sampling as `[prm]` says.
fn provider_judge(
    settings: &Settings,
    provider: Option<&Arc<ProviderClient>>,
    model: Option<&str>,
    model_key: &'static str,
    what: &'static str,
) -> Result<Arc<dyn JudgeBackend>, StartupError> {
    let client = provider.ok_or(StartupError::Missing {
        key: "provider.base_url",
        what: "the provider root URL, required by a judge whose backend is \"provider\"",
    })?;
    let model = model.ok_or(StartupError::Missing {
        key: model_key,
        what,
    })?;
    Ok(Arc::new(ProviderJudge::new(
        client.clone(),
        model,
        Some(settings.prm.max_new_tokens),
        Some(settings.prm.temperature),
    )))
}

/// The PRM scorer, when `prm.enabled`: over SGLang `/generate` (`judge`) or, with
/// `prm.backend = "provider"`, over the provider with `prm.model` (else `provider.prm_model`).
/// Each vote holds a `permits` slot (`prm.max_concurrency`); the provider's own cap applies too.
pub fn scorer(
    settings: &Settings,
    judge: &Arc<SglangJudge>,
    provider: Option<&Arc<ProviderClient>>,
    permits: &Arc<Semaphore>,
) -> Result<Option<Arc<dyn TurnScorer>>, StartupError> {
    let p = &settings.prm;
    if !p.enabled {
        return Ok(None);
    }
    let backend: Arc<dyn JudgeBackend> = match p.backend {
        PrmBackend::Sglang => judge.clone(),
        PrmBackend::Provider => provider_judge(
            settings,
            provider,
            settings.prm_provider_model(),
            "prm.model",
            "a model name when prm.backend = \"provider\" (set prm.model or provider.prm_model)",
        )?,
    };
    let votes = usize::try_from(p.num_votes).unwrap_or(1);
    Ok(Some(Arc::new(PrmScorer::new(
        backend,
        votes,
        Some(permits.clone()),
    ))))
}

/// The teacher (`[teacher]`): SGLang `/generate` or an OpenAI-compatible `/v1/completions`.
pub fn teacher(
    settings: &Settings,
    env: EnvLookup<'_>,
) -> Result<Arc<dyn TeacherScorer>, StartupError> {
    let t = &settings.teacher;
    let url = settings.teacher_url().unwrap_or_default().to_owned();
    let api_key = settings.teacher_api_key(env)?;
    let timeout = std::time::Duration::from_secs(t.timeout_sec);
    Ok(match t.backend {
        TeacherBackend::Sglang => Arc::new(SglangTeacher::new(SglangTeacherConfig {
            url,
            timeout,
            api_key,
        })?),
        TeacherBackend::OpenaiCompletions => {
            Arc::new(CompletionsTeacher::new(CompletionsTeacherConfig {
                base_url: url,
                model: settings.teacher_model().unwrap_or_default().to_owned(),
                api_key,
                timeout,
            })?)
        }
        // Refused by validation; kept exhaustive.
        TeacherBackend::ProviderChat => {
            return Err(ps_teacher_client::chat_endpoint_error(&url).into());
        }
    })
}

/// The hint judge and teacher, when OPD is active (`server.mode` `opd` or `combine`). The hint
/// judge runs on SGLang `/generate` (`judge`) or, with `opd.hint_backend = "provider"`, on the
/// provider with `provider.hint_model`.
pub fn opd_parts(
    settings: &Settings,
    env: EnvLookup<'_>,
    judge: &Arc<SglangJudge>,
    provider: Option<&Arc<ProviderClient>>,
    permits: &Arc<Semaphore>,
    tokenizer: &Arc<ChatTokenizer>,
) -> Result<Option<OpdParts>, StartupError> {
    if !settings.opd_active() {
        return Ok(None);
    }
    let backend: Arc<dyn JudgeBackend> = match settings.opd.hint_backend {
        PrmBackend::Sglang => judge.clone(),
        PrmBackend::Provider => provider_judge(
            settings,
            provider,
            settings.provider.hint_model.as_deref(),
            "provider.hint_model",
            "the hint judge's model name, required when opd.hint_backend = \"provider\"",
        )?,
    };
    let votes = usize::try_from(settings.prm.num_votes).unwrap_or(1);
    let hint = HintScorer::new(
        backend,
        votes,
        settings.opd.min_hint_chars,
        Some(permits.clone()),
    );
    Ok(Some(OpdParts {
        hint: Arc::new(hint),
        teacher: teacher(settings, env)?,
        tokenizer: tokenizer.clone(),
        teacher_permits: Some(Arc::new(Semaphore::new(
            settings.teacher.max_concurrency.max(1),
        ))),
    }))
}

fn buffer_config(settings: &Settings) -> BufferConfig {
    BufferConfig {
        mode: match settings.server.mode {
            Mode::Rl => BufferMode::Rl,
            Mode::Opd => BufferMode::Opd,
            Mode::Combine => BufferMode::Combine,
        },
        opd: OpdOptions {
            drop_without_next_state: settings.opd.drop_without_next_state,
            top_k: settings.opd.top_k,
            eval_votes: settings.opd.eval_votes_enabled(),
        },
        prm_enabled: settings.prm.enabled,
        session_timeout: settings.server.session_timeout(),
        max_sessions: settings.server.max_sessions,
        max_judge_backlog: settings.prm.max_backlog,
    }
}

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
/// [`PolicyTokenizer::embedded_demo`]) instead of found by [`policy_tokenizer`].
pub async fn build_app_with(
    settings: &Settings,
    env: EnvLookup<'_>,
    metrics: Option<PrometheusHandle>,
    tokenizer: Option<PolicyTokenizer>,
) -> Result<AppState, StartupError> {
    settings.check_secrets(env)?;
    let policy = policy_client(settings, env)?;
    let tokenizer = match tokenizer {
        Some(t) => t,
        None => policy_tokenizer(settings, &policy).await?,
    };
    tracing::info!("policy tokenizer: {}", tokenizer.source);
    let tokenizer = tokenizer.tokenizer;
    let options = options(settings, env)?;
    let store = open_store(settings).await?;
    let records = Arc::new(Records::start(settings)?);
    let judge = judge_backend(settings, &tokenizer)?;
    let judge_permits = Arc::new(Semaphore::new(settings.prm.max_concurrency.max(1)));
    let provider = provider_client(settings, env)?;
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
        )?,
        store.clone() as Arc<dyn ps_core::SampleSink>,
        (!records.is_empty()).then(|| records.clone() as Arc<dyn RecordSink>),
    );
    let buffer = buffer.with_pending_store(store.clone() as Arc<dyn ps_core::PendingStore>);
    buffer.spawn_sweeper(sweep_every(settings.server.session_timeout()));
    // Turns the previous run persisted at shutdown (unfinished when its grace ran out) resume now.
    {
        let (buffer, store) = (buffer.clone(), store.clone());
        tokio::spawn(async move {
            match store.take_pending().await {
                Ok(turns) if !turns.is_empty() => buffer.resume(turns),
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(error = %e, "pending turns of the previous run could not be read")
                }
            }
        });
    }
    let workers = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(MAX_CAPTURE_WORKERS);
    let sink: Arc<dyn TurnSink> = Arc::new(buffer.clone());
    let capture = CaptureQueue::start(
        tokenizer,
        sink,
        options.align_policy,
        crate::capture::DriftCheck::new(
            settings.capture.drift_check_first,
            settings.capture.drift_check_every,
        ),
        CAPTURE_QUEUE_CAPACITY,
        workers,
    )
    .map(|q| {
        q.with_max_turn_tokens(settings.server.max_turn_tokens)
            .with_prefix_idle(settings.server.session_timeout())
    })
    .map_err(StartupError::Workers)?;
    let rollout = Rollout {
        store,
        buffer,
        on_pause: Some(records as Arc<dyn PauseHook>),
    };
    Ok(AppState::with_rollout(
        options,
        Arc::new(policy),
        capture,
        metrics,
        Some(rollout),
    ))
}

/// Opens the sample store `store.kind` names.
pub async fn open_store(settings: &Settings) -> Result<Arc<dyn SampleLog>, StartupError> {
    match settings.store.kind {
        StoreKind::Embedded => Ok(Arc::new(SampleStore::open(StoreConfig {
            retain_committed: settings.store.retain_committed,
            ..StoreConfig::new(settings.store.path.clone())
        })?)),
        StoreKind::Redis => {
            let store = RedisStore::open(redis_config(settings)).await?;
            for risk in redis_risks(&store) {
                tracing::warn!(url = %store.url(), "{risk}");
            }
            tracing::info!(store = %store.describe(), "sample store: Redis stream");
            Ok(Arc::new(store))
        }
    }
}

/// The Redis store's config from `[store.redis]` (and `store.retain_committed`).
pub fn redis_config(settings: &Settings) -> RedisConfig {
    let r = &settings.store.redis;
    RedisConfig {
        url: r.url.clone(),
        deployment: r.deployment.clone(),
        group: r.group.clone(),
        replica: r
            .replica
            .clone()
            .unwrap_or_else(|| default_replica(settings.server.port)),
        retain_committed: settings.store.retain_committed,
        claim_idle: Duration::from_secs(r.claim_idle_sec),
        timeout: Duration::from_secs(r.timeout_sec),
        retry_for: Duration::from_secs(r.retry_for_sec),
    }
}

/// How Redis may lose accepted samples, one sentence each naming what to set (empty: it keeps
/// them as the embedded store would). `serve` logs them; `policy-serving check` reports them.
pub fn redis_risks(store: &RedisStore) -> Vec<String> {
    let mut risks = Vec::new();
    match store.durability() {
        Durability::EveryWrite => {}
        Durability::AppendOnly { fsync } => risks.push(format!(
            "Redis fsyncs its append-only file less than on every write (appendfsync {fsync}): a \
             crash of the Redis machine may lose the last accepted samples (set appendfsync always)"
        )),
        Durability::NoAppendOnly => risks.push(
            "Redis runs without an append-only file: a Redis restart loses accepted samples (set \
             appendonly yes and appendfsync always)"
                .to_owned(),
        ),
        Durability::Unknown => risks.push(
            "cannot read Redis's persistence settings (CONFIG GET refused): make sure it runs \
             with appendonly yes, appendfsync always and maxmemory-policy noeviction"
                .to_owned(),
        ),
    }
    match store.eviction_policy() {
        Some("noeviction") | None => {}
        Some(policy) => risks.push(format!(
            "Redis may evict keys under memory pressure (maxmemory-policy {policy}): the stream, \
             its counter or the append tokens could go (set maxmemory-policy noeviction)"
        )),
    }
    risks
}

/// This machine's host name and `port`, as a replica name (`store.redis.replica`'s default).
fn default_replica(port: u16) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let host: String = host
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(100)
        .collect();
    if host.is_empty() {
        format!("replica-{port}")
    } else {
        format!("{host}-{port}")
    }
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
    let app = build_app_with(settings, env, metrics, tokenizer).await?;
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
    let task = tokio::spawn(crate::serve(listener, app, async {
        let _ = stopped.await;
    }));
    Ok(Running {
        addr,
        url: format!("http://{addr}"),
        stop,
        task,
    })
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
    let app = build_app(settings, &env, metrics).await?;
    if settings.server.admin_key_env.is_none() && !is_loopback(&settings.server.host) {
        tracing::warn!(
            host = %settings.server.host,
            "the /v1/rollout/* endpoints are open to the network: set server.admin_key_env"
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
    app.options().inference.log_active();
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
