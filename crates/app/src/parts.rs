//! Settings to parts: the concrete upstream client, judges, teacher, provider client, sample
//! store, records and server options that [`crate::build_app`] assembles. Each function reads only
//! the validated settings (and the environment for keys), so `policy-serving check` builds exactly
//! what `serve` builds.

use std::sync::Arc;
use std::time::Duration;

use ps_chat_template::ChatTokenizer;
use ps_config::{EnvLookup, Mode, PrmBackend, Settings, StoreKind, TeacherBackend};
use ps_core::SampleLog;
use ps_core::ports::{
    ConversationRecord, JudgeBackend, OpdRecord, PauseHook, PrmRecord, RecordSink, TeacherScorer,
    ToJson, TurnScorer,
};
use ps_judge::{PrmScorer, SglangJudge, SglangJudgeConfig};
use ps_opd_judge::HintScorer;
use ps_provider_client::{ProviderClient, ProviderConfig, ProviderJudge};
use ps_records::{RecordOptions, RecordWriter};
use ps_redis_store::{Durability, RedisConfig, RedisStore};
use ps_sample_store::{SampleStore, StoreConfig};
use ps_server::ServerOptions;
use ps_session_buffer::{BufferConfig, BufferMode, OpdOptions, OpdParts};
use ps_sglang_client::{SglangClient, SglangClientConfig};
use ps_teacher_client::{
    CompletionsTeacher, CompletionsTeacherConfig, SglangTeacher, SglangTeacherConfig,
};
use tokio::sync::Semaphore;

use crate::error::StartupError;
use crate::policy_tokenizer::{self, PolicyTokenizer, Reported};

/// How often the idle-session sweeper runs: a quarter of the session timeout, within bounds.
pub(crate) fn sweep_every(timeout: std::time::Duration) -> std::time::Duration {
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

    pub(crate) fn is_empty(&self) -> bool {
        self.conversations.is_none() && self.prm.is_none() && self.opd.is_none()
    }
}

impl RecordSink for Records {
    fn conversation(&self, record: ConversationRecord) {
        if let Some(w) = &self.conversations {
            w.record(record.to_json());
        }
    }

    fn prm(&self, record: PrmRecord) {
        if let Some(w) = &self.prm {
            w.record(record.to_json());
        }
    }

    fn opd(&self, record: OpdRecord) {
        if let Some(w) = &self.opd {
            w.record(record.to_json());
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
    policy_tokenizer_and_engine(settings, policy)
        .await
        .map(|(t, _)| t)
}

/// [`policy_tokenizer`], and the engine the policy server's report names (SGLang when
/// `/get_model_info` answered, else `/v1/models`'s `owned_by`), when it was reachable.
pub async fn policy_tokenizer_and_engine(
    settings: &Settings,
    policy: &SglangClient,
) -> Result<(PolicyTokenizer, Option<ps_core::Engine>), StartupError> {
    let reported = ask_policy_server(settings, policy).await;
    let engine = match &reported {
        Reported::Info(info) => info.engine,
        Reported::Unreachable { .. } => None,
    };
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
    chosen.map(|t| (t, engine))
}

pub fn options(settings: &Settings, env: EnvLookup<'_>) -> Result<ServerOptions, StartupError> {
    let s = &settings.server;
    Ok(ServerOptions {
        default_turn_type: s.default_turn_type,
        served_model_name: s.served_model_name.clone(),
        model_names: s.model_names.clone(),
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
        engine: settings.sglang.engine,
        sampling: settings.capture.sampling,
        ask_routed_experts: false,
        inference: ps_server::infer::InferenceOptions {
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
                    model: r.model.clone(),
                })
                .collect(),
            ephemeral_rules: s
                .ephemeral_message_rules
                .iter()
                .map(|r| ps_session_infer::EphemeralRule {
                    name: r.name.clone(),
                    role: r.role.clone(),
                    content_prefix: r.content_prefix.clone(),
                })
                .collect(),
            // Validated by the settings: every entry parses.
            agent_keys: s
                .agent_session_keys
                .iter()
                .filter_map(|k| ps_server::infer::AgentKey::parse(k))
                .collect(),
            agent_keys_name_sessions: s.agent_keys_name_sessions,
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
    })?
    .with_max_answer_bytes(
        usize::try_from(g.max_answer_mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX),
    ))
}

/// The judge backend (SGLang `/generate` at `prm.router_url`, rendered with the judge's tokenizer:
/// `prm.model_dir`, else the policy's) shared by the PRM and the hint judge, and the cap on their
/// calls (`prm.max_concurrency`).
pub fn judge_backend(
    settings: &Settings,
    policy_tokenizer: &Arc<ChatTokenizer>,
) -> Result<Arc<SglangJudge>, StartupError> {
    let tokenizer = match &settings.prm.model_dir {
        Some(dir) => Arc::new(load_dir(dir)?),
        None => policy_tokenizer.clone(),
    };
    judge_backend_with(settings, tokenizer)
}

/// The judge's tokenizer: the policy's own (the same `Arc`, not a second parse of the same
/// files) unless `prm.model_dir` names a directory whose tokenizer files differ from the policy's;
/// then that directory, loaded. Blocking (it may read or parse files).
pub fn judge_tokenizer(
    settings: &Settings,
    policy: &PolicyTokenizer,
) -> Result<Arc<ChatTokenizer>, StartupError> {
    let Some(dir) = &settings.prm.model_dir else {
        return Ok(policy.tokenizer.clone());
    };
    let same = policy
        .source
        .dir()
        .is_some_and(|policy_dir| ps_chat_template::same_tokenizer_dir(policy_dir, dir));
    if same {
        Ok(policy.tokenizer.clone())
    } else {
        Ok(Arc::new(load_dir(dir)?))
    }
}

fn load_dir(dir: &std::path::Path) -> Result<ChatTokenizer, StartupError> {
    ChatTokenizer::from_dir(dir).map_err(|source| StartupError::Tokenizer {
        dir: dir.to_owned(),
        source,
    })
}

/// [`judge_backend`] with the judge's tokenizer already chosen ([`judge_tokenizer`]).
pub fn judge_backend_with(
    settings: &Settings,
    tokenizer: Arc<ChatTokenizer>,
) -> Result<Arc<SglangJudge>, StartupError> {
    let p = &settings.prm;
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
            images: settings.teacher.images,
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
/// provider with `provider.hint_model`. `engine_prompts` is what capture's drift check finds
/// about engines' prompt ids (the teacher path builds on them while they agree).
pub fn opd_parts(
    settings: &Settings,
    env: EnvLookup<'_>,
    judge: &Arc<SglangJudge>,
    provider: Option<&Arc<ProviderClient>>,
    permits: &Arc<Semaphore>,
    tokenizer: &Arc<ChatTokenizer>,
    engine_prompts: ps_core::EnginePrompts,
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
        engine_prompts,
        teacher_temperature: settings.opd.teacher_temperature,
    }))
}

pub(crate) fn buffer_config(settings: &Settings) -> BufferConfig {
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::policy_tokenizer::TokenizerSource;

    fn mini_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/mini-model")
    }

    fn copy_of_mini(into: &Path) {
        for name in ps_chat_template::TOKENIZER_FILES {
            let from = mini_dir().join(name);
            if from.exists() {
                std::fs::copy(from, into.join(name)).unwrap();
            }
        }
    }

    fn judge_dir(dir: Option<&Path>) -> Settings {
        let mut s = Settings::default();
        s.prm.model_dir = dir.map(Path::to_owned);
        s
    }

    #[test]
    fn the_judge_shares_the_policy_tokenizer_unless_its_directory_holds_another() {
        let policy = PolicyTokenizer {
            tokenizer: Arc::new(ChatTokenizer::from_dir(mini_dir()).unwrap()),
            source: TokenizerSource::Setting { dir: mini_dir() },
        };
        // No `prm.model_dir`, the same directory (also by another path) and a copy of its files:
        // the policy's own tokenizer, not a second parse.
        let copy = tempfile::tempdir().unwrap();
        copy_of_mini(copy.path());
        let other_path = mini_dir().join("../mini-model");
        for dir in [
            None,
            Some(mini_dir().as_path()),
            Some(other_path.as_path()),
            Some(copy.path()),
        ] {
            let t = judge_tokenizer(&judge_dir(dir), &policy).unwrap();
            assert!(Arc::ptr_eq(&t, &policy.tokenizer), "{dir:?}");
        }
        // Another chat template next to the same tokenizer: the judge's own.
        let other = tempfile::tempdir().unwrap();
        copy_of_mini(other.path());
        std::fs::write(
            other.path().join("chat_template.jinja"),
            "{% for m in messages %}{{ m.content }}{% endfor %}",
        )
        .unwrap();
        let t = judge_tokenizer(&judge_dir(Some(other.path())), &policy).unwrap();
        assert!(!Arc::ptr_eq(&t, &policy.tokenizer));
        // The embedded demo tokenizer has no directory: a `prm.model_dir` is loaded.
        let demo = PolicyTokenizer::embedded_demo();
        let t = judge_tokenizer(&judge_dir(Some(&mini_dir())), &demo).unwrap();
        assert!(!Arc::ptr_eq(&t, &demo.tokenizer));
        // A directory without a tokenizer is the same error as before.
        let e = judge_tokenizer(&judge_dir(Some(Path::new("/nonexistent/judge"))), &policy)
            .unwrap_err();
        assert!(matches!(e, StartupError::Tokenizer { .. }), "{e}");
    }
}
