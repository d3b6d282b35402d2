//! The configuration schema: one struct per section of `settings.json` / `settings.toml`.
//!
//! Every section rejects unknown keys and every key has a default (see [`crate::defaults`]), so a
//! file only needs the keys it changes. The doc comment on each field is the README's reference.
//!
//! Over ~600 lines on purpose: the whole schema in one file is the reference operators read, one
//! documented struct per section; about 90 lines at the end are unit tests.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ps_core::{AlignPolicy, DefaultTurnType};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::defaults as d;

// The wire enums live in core (several crates read them; loading settings builds nothing above it).
pub use ps_core::modes::{PauseMode, SessionInference, TokenIdsMode};

/// The whole configuration, after layering (see [`crate::load`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// The proxy's own HTTP server.
    pub server: ServerSettings,
    /// The SGLang policy server the proxy forwards chat requests to.
    pub sglang: SglangSettings,
    /// The process reward model (PRM) judge that scores main turns.
    pub prm: PrmSettings,
    /// The external OpenAI-compatible provider (hint judge, provider-backed PRM). Operators' files
    /// call this section `taotoken`; both names are accepted, but not both at once.
    pub provider: ProviderSettings,
    /// The teacher that returns log-probs of the policy's response tokens (OPD).
    pub teacher: TeacherSettings,
    /// On-policy distillation (OPD) with hints.
    pub opd: OpdSettings,
    /// Logs and JSONL records.
    pub logging: LoggingSettings,
    /// How captured response tokens enter the loss mask.
    pub capture: CaptureSettings,
    /// Where finished samples are persisted until the trainer takes them.
    pub store: StoreSettings,
    /// The inspection page (`/ui`, `/v1/inspect/*`) and its in-memory history.
    pub inspect: InspectSettings,
    /// The trainer-side keys the settings file carried (the operators' `config.toml`: see
    /// [`crate::TRAINER_FILE_KEYS`]), as written; `serve` reports them at start. Not a setting.
    #[serde(skip)]
    pub trainer_side: Vec<String>,
}

/// What the proxy produces from conversations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// RL samples rewarded by the PRM.
    #[default]
    Rl,
    /// On-policy distillation samples carrying teacher log-probs.
    Opd,
    /// Both.
    Combine,
}

impl Mode {
    /// The name used in configuration files.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rl => "rl",
            Self::Opd => "opd",
            Self::Combine => "combine",
        }
    }

    /// Whether this mode produces OPD samples.
    pub fn includes_opd(self) -> bool {
        matches!(self, Self::Opd | Self::Combine)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `[server]`: the proxy's own HTTP server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSettings {
    /// Address to listen on. Default `127.0.0.1`; use `0.0.0.0` to accept remote clients.
    pub host: String,
    /// Port to listen on (0 picks a free port). Default 30000.
    pub port: u16,
    /// Whether finished samples are submitted to the trainer (`GET /health` reports it). Default true.
    pub submission_enabled: bool,
    /// A session with no request for this many seconds is closed and its pending turns are
    /// finished without a next state. Default 600.
    pub session_timeout_sec: u64,
    /// Cap on live sessions; a new session beyond it closes the oldest idle one (its waiting turns
    /// get no next state; counted and logged). Default 10000.
    pub max_sessions: usize,
    /// `rl`, `opd` or `combine`. Default `rl`.
    pub mode: Mode,
    /// Turn type assumed when a request names none (`X-Turn-Type` header or body key): `main` trains,
    /// `side` is only forwarded, `auto` (default) is `main` for a request without a session key
    /// whose session is recognised from its history (an unmodified agent trains) and `side` for a
    /// request with a session key (as in the reference). A `side_turn_rules` match is always side.
    /// The server warns once when requests will not train.
    pub default_turn_type: DefaultTurnType,
    /// Model name filled into `model` when a request lacks it. Default `default`.
    pub served_model_name: String,
    /// Model names a client may ask for besides `served_model_name`, each with the name sent to
    /// the policy server in its place (`[server.model_names]`, e.g. `"claude-haiku-4-5" =
    /// "qwen3-4b"`: an agent's own model names). Empty (the default): a request's `model` is
    /// forwarded as sent. Set: a request naming another model is refused with 404
    /// `model_not_found`.
    pub model_names: std::collections::BTreeMap<String, String>,
    /// The policy's tokenizer directory (`tokenizer.json`, `tokenizer_config.json`). When absent the
    /// server uses the directory the policy server reports (SGLang `/get_model_info`, vLLM
    /// `/v1/models` `root`) when it exists on this machine, and otherwise refuses to start.
    pub model_dir: Option<PathBuf>,
    /// NAME of the environment variable holding the Bearer key clients must send. When unset, the
    /// legacy variable `SGLANG_API_KEY` plays that role if it is set; otherwise no key is required.
    pub api_key_env: Option<String>,
    /// Largest accepted request body, in bytes. Default 16 MiB.
    pub max_body_bytes: u64,
    /// Most messages one chat request may carry; more is a 400 naming this key. Default 4096.
    pub max_messages: usize,
    /// Most tokens (prompt + response) of a main turn used for training; a longer turn is still
    /// answered, but not trained on (counted, logged, reason `turn_too_long`). Default 131072.
    pub max_turn_tokens: usize,
    /// On shutdown, how long in-flight requests and background scoring may run before they are cut.
    /// Default 30.
    pub shutdown_grace_sec: u64,
    /// What chat requests get while the trainer has paused submission: `reject` (503 with
    /// Retry-After, the reference behaviour; default), `hold` (wait for resume up to
    /// `pause_hold_max_sec`, then 503) or `serve` (answer, but collect nothing).
    pub pause_mode: PauseMode,
    /// Longest wait of a held request in `hold` mode, seconds. Default 30.
    pub pause_hold_max_sec: u64,
    /// NAME of the variable holding the key of the trainer-facing `/v1/rollout/*` endpoints. When
    /// set, they need `Authorization: Bearer <that key>` (a chat client's key cannot pause training).
    /// Unset: they are open (bind to loopback, or set it).
    pub admin_key_env: Option<String>,
    /// How a request without a session key (`X-Session-Id` header, body `session_id`) finds its
    /// session: `when_missing` (default) recognises its conversation from the history (a key the
    /// client sends always wins), `always` recognises every request and ignores the keys, `off`
    /// puts them all into the shared session `unknown`.
    pub session_inference: SessionInference,
    /// Rules that mark a request naming no turn type as a side turn by its shape (a title or
    /// summary request, …): every condition of a rule must hold; any matching rule makes it a side
    /// turn. Requests matching none get `default_turn_type`. Default: none.
    pub side_turn_rules: Vec<SideTurnRule>,
    /// Messages a client appends to a request and never sends again (a wrapper's context block):
    /// left out of the fingerprints that recognise sessions and out of the next state. Default:
    /// the npm OpenClaw agent's `<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>` user message.
    pub ephemeral_message_rules: Vec<EphemeralMessageRule>,
    /// Where agents carry their own conversation key: `header:NAME` or `body:KEY`, the first
    /// present wins. Each sample records it (`metadata.agent_session_key`). Default: Claude
    /// Code's `header:x-claude-code-session-id`, Codex's `header:session-id`, and
    /// `body:prompt_cache_key` (Codex's thread id; OpenClaw's with `supportsPromptCacheKey`).
    pub agent_session_keys: Vec<String>,
    /// Use the agent's key as the session (source `agent`; turns naming no type are main, as
    /// for an unmodified agent) instead of recognising the session from the history. Off by
    /// default: one agent key covers every conversation the agent holds (a sub-agent's, a title
    /// request), which the history keeps apart; turn it on for an agent that holds one.
    pub agent_keys_name_sessions: bool,
}

/// One `[[server.ephemeral_message_rules]]` entry: messages of `role` (any when unset) whose text,
/// leading white space aside, starts with `content_prefix`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EphemeralMessageRule {
    /// Named in logs.
    pub name: String,
    pub role: Option<String>,
    pub content_prefix: String,
}

impl EphemeralMessageRule {
    /// The npm OpenClaw agent's context message (the default rule).
    pub fn openclaw() -> Self {
        Self {
            name: "openclaw_internal_context".into(),
            role: Some("user".into()),
            content_prefix: ps_core::session::OPENCLAW_CONTEXT_PREFIX.into(),
        }
    }
}

/// One `[[server.side_turn_rules]]` entry. Unset conditions are not checked; at least one is needed.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SideTurnRule {
    /// Named in logs.
    pub name: String,
    /// The first message is a system (or developer) message whose text starts with this.
    pub system_prefix: Option<String>,
    /// The last user message's text starts with this.
    pub last_user_prefix: Option<String>,
    /// `true`: the request offers no tools.
    pub without_tools: bool,
    /// `max_tokens` or `max_completion_tokens` is set and at most this.
    pub max_tokens_at_most: Option<u64>,
    /// The request's `model` is exactly this (an agent's helper model name).
    pub model: Option<String>,
}

impl SideTurnRule {
    /// The default rules: the npm OpenClaw agent's two compaction helpers (recorded from
    /// `openclaw` 2026.9.6), which are not the conversation's turns: the memory flush it sends
    /// in the conversation before compacting it, and the summary request of its summariser.
    pub fn openclaw_helpers() -> Vec<Self> {
        vec![
            Self {
                name: "openclaw_memory_flush".into(),
                last_user_prefix: Some("Pre-compaction memory flush.".into()),
                ..Self::default()
            },
            Self {
                name: "openclaw_compaction_summary".into(),
                system_prefix: Some("You are a context summarization assistant.".into()),
                ..Self::default()
            },
        ]
    }
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            host: d::SERVER_HOST.to_owned(),
            port: d::SERVER_PORT,
            submission_enabled: d::SERVER_SUBMISSION_ENABLED,
            session_timeout_sec: d::SERVER_SESSION_TIMEOUT_SEC,
            max_sessions: d::SERVER_MAX_SESSIONS,
            mode: Mode::default(),
            default_turn_type: DefaultTurnType::Auto,
            served_model_name: d::SERVER_SERVED_MODEL_NAME.to_owned(),
            model_names: std::collections::BTreeMap::new(),
            model_dir: None,
            api_key_env: None,
            max_body_bytes: d::SERVER_MAX_BODY_BYTES,
            max_messages: d::SERVER_MAX_MESSAGES,
            max_turn_tokens: d::SERVER_MAX_TURN_TOKENS,
            shutdown_grace_sec: d::SERVER_SHUTDOWN_GRACE_SEC,
            pause_mode: PauseMode::default(),
            pause_hold_max_sec: d::SERVER_PAUSE_HOLD_MAX_SEC,
            admin_key_env: None,
            session_inference: SessionInference::default(),
            side_turn_rules: SideTurnRule::openclaw_helpers(),
            agent_session_keys: [
                "header:x-claude-code-session-id",
                "header:session-id",
                "body:prompt_cache_key",
            ]
            .map(String::from)
            .to_vec(),
            agent_keys_name_sessions: false,
            ephemeral_message_rules: vec![EphemeralMessageRule::openclaw()],
        }
    }
}

impl ServerSettings {
    /// `session_timeout_sec` as a duration.
    pub fn session_timeout(&self) -> Duration {
        Duration::from_secs(self.session_timeout_sec)
    }

    /// `shutdown_grace_sec` as a duration.
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_sec)
    }
}

/// `[sglang]`: the SGLang policy server. `Debug` redacts `api_key`.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SglangSettings {
    /// OpenAI-compatible chat endpoint chat requests are forwarded to.
    /// Default `http://127.0.0.1:30001/v1/chat/completions`.
    pub chat_url: String,
    /// Literal key sent upstream as Bearer token. Only for keyless local servers (`"EMPTY"`);
    /// real keys belong in the environment (`api_key_env`). Redacted when the configuration is printed.
    pub api_key: Option<String>,
    /// NAME of the environment variable holding the upstream key; wins over `api_key`.
    pub api_key_env: Option<String>,
    /// Whole-request timeout for upstream calls, in seconds. Default 120.
    pub timeout_sec: u64,
    /// Connect timeout for upstream calls, in seconds. Default 5.
    pub connect_timeout_sec: u64,
    /// true: stream upstream when the client asks for a stream. false: always call upstream without
    /// streaming and synthesise the answer as chunks for streaming clients. Default true.
    pub stream: bool,
    /// Where a main turn's token ids come from: `auto` (default: ask the engine for its own prompt
    /// and sampled ids on non-streamed calls and use them; when it answers without them, count it,
    /// say so once, and re-tokenize exactly), `engine` (such a turn gives no sample, reason
    /// `no_engine_ids`) or `retokenize` (never ask; render and re-tokenize every turn).
    pub token_ids: TokenIdsMode,
    /// Deprecated: `false` is `token_ids = "retokenize"`, `true` is `auto`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub return_token_ids: Option<bool>,
    /// The engine behind `chat_url`: `auto` (default: learned from what the server reports at
    /// start, `GET /get_model_info` or `/v1/models`'s `owned_by`, else from its first answer),
    /// `sglang` or `vllm`. vLLM is asked for its token ids on streamed calls too.
    pub engine: ps_core::EngineSetting,
    /// Cap on concurrent upstream chat requests; a permit is held until a streamed body ends. A
    /// request beyond it gets 429 with Retry-After. Default 256.
    pub max_concurrency: usize,
    /// The largest non-streamed answer read, in MiB (a larger one is the client's 502). Routed
    /// experts take layers × top-k × 16/3 bytes a token in SGLang's base64 (2 KiB for a 48-layer
    /// top-8 model): raise it for long contexts of a mixture-of-experts policy. Default 128, at
    /// least 1.
    pub max_answer_mib: u64,
}

impl Default for SglangSettings {
    fn default() -> Self {
        Self {
            chat_url: d::SGLANG_CHAT_URL.to_owned(),
            api_key: None,
            api_key_env: None,
            timeout_sec: d::SGLANG_TIMEOUT_SEC,
            connect_timeout_sec: d::SGLANG_CONNECT_TIMEOUT_SEC,
            stream: d::SGLANG_STREAM,
            token_ids: TokenIdsMode::default(),
            return_token_ids: None,
            engine: ps_core::EngineSetting::default(),
            max_concurrency: d::SGLANG_MAX_CONCURRENCY,
            max_answer_mib: d::SGLANG_MAX_ANSWER_MIB,
        }
    }
}

impl fmt::Debug for SglangSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Redacted;
        impl fmt::Debug for Redacted {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(crate::secret::REDACTED)
            }
        }
        f.debug_struct("SglangSettings")
            .field("chat_url", &self.chat_url)
            .field("api_key", &self.api_key.as_ref().map(|_| Redacted))
            .field("api_key_env", &self.api_key_env)
            .field("timeout_sec", &self.timeout_sec)
            .field("connect_timeout_sec", &self.connect_timeout_sec)
            .field("stream", &self.stream)
            .field("token_ids", &self.token_ids)
            .field("return_token_ids", &self.return_token_ids)
            .field("engine", &self.engine)
            .field("max_concurrency", &self.max_concurrency)
            .field("max_answer_mib", &self.max_answer_mib)
            .finish()
    }
}

impl SglangSettings {
    /// `token_ids`, with the deprecated `return_token_ids = false` read as `retokenize`.
    pub fn token_ids_mode(&self) -> TokenIdsMode {
        match (self.token_ids, self.return_token_ids) {
            (TokenIdsMode::Auto, Some(false)) => TokenIdsMode::Retokenize,
            (mode, _) => mode,
        }
    }

    /// `timeout_sec` as a duration.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_sec)
    }

    /// `connect_timeout_sec` as a duration.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_secs(self.connect_timeout_sec)
    }
}

/// Where PRM scoring runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrmBackend {
    /// An SGLang `/generate` endpoint (`prm.router_url`), prompts rendered with the judge's template.
    #[default]
    Sglang,
    /// The external provider's chat endpoint with `prm.model` (or `provider.prm_model`).
    Provider,
}

impl PrmBackend {
    /// The name used in configuration files.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sglang => "sglang",
            Self::Provider => "provider",
        }
    }
}

/// `[prm]`: the process reward model judge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrmSettings {
    /// Whether main turns are scored. Default true.
    pub enabled: bool,
    /// The judge's SGLang `/generate` URL. Default `http://127.0.0.1:30002/generate`.
    pub router_url: String,
    /// Votes per turn (m); the reward is their majority. At least 1. Default 3.
    pub num_votes: u32,
    /// Timeout of one judge call, in seconds. Default 60.
    pub timeout_sec: u64,
    /// Sampling temperature of the judge. Default 0.6.
    pub temperature: f64,
    /// Generation budget of one judge call, in tokens. Default 4096.
    pub max_new_tokens: u32,
    /// The judge's tokenizer directory; defaults to the policy's tokenizer.
    pub model_dir: Option<PathBuf>,
    /// `sglang` (default) or `provider`.
    pub backend: PrmBackend,
    /// Model name for the `provider` backend; defaults to `provider.prm_model`.
    pub model: Option<String>,
    /// Cap on simultaneous judge calls (PRM and hint votes) across all sessions. Default 64.
    pub max_concurrency: usize,
    /// Turns waiting for or in judging at once; a turn beyond it yields no sample (counted as
    /// `turns_dropped_total{reason="judge_backlog"}`, logged), so that a judge slower than the
    /// traffic cannot grow the proxy's memory without bound. Default 4096.
    pub max_backlog: usize,
}

impl Default for PrmSettings {
    fn default() -> Self {
        Self {
            enabled: d::PRM_ENABLED,
            router_url: d::PRM_ROUTER_URL.to_owned(),
            num_votes: d::PRM_NUM_VOTES,
            timeout_sec: d::PRM_TIMEOUT_SEC,
            temperature: d::PRM_TEMPERATURE,
            max_new_tokens: d::PRM_MAX_NEW_TOKENS,
            model_dir: None,
            backend: PrmBackend::default(),
            model: None,
            max_concurrency: d::PRM_MAX_CONCURRENCY,
            max_backlog: d::PRM_MAX_BACKLOG,
        }
    }
}

impl PrmSettings {
    /// `timeout_sec` as a duration.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_sec)
    }
}

/// `[provider]` (alias `[taotoken]`): the external OpenAI-compatible provider.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProviderSettings {
    /// Provider root; the chat path `/v1/chat/completions` is appended to it (so do not end it with
    /// `/v1`). Example `https://taotoken.net/api`.
    pub base_url: Option<String>,
    /// NAME of the environment variable holding the provider key (one key for every provider call).
    pub api_key_env: Option<String>,
    /// Model of the OPD hint judge.
    pub hint_model: Option<String>,
    /// Teacher model name as the operators' file records it (teacher log-probs come from
    /// `[teacher]`, since a chat endpoint cannot return them).
    pub teacher_model: Option<String>,
    /// Model of the provider-backed PRM (`prm.backend = "provider"`).
    pub prm_model: Option<String>,
    /// Cap on simultaneous provider calls, across all sessions. Default 4.
    pub max_concurrency: usize,
    /// Timeout of one provider call, in seconds. Default 90.
    pub timeout_sec: u64,
    /// Retries of a failed call (429, 5xx, time-out), with back-off honouring `Retry-After`. Default 3.
    pub max_retries: u32,
    /// Bound of one whole call (a judge vote, a hint vote), retries and waits included: a vote
    /// still unanswered after it fails (and counts as a failed vote). Default 180.
    pub deadline_sec: u64,
}

impl Default for ProviderSettings {
    fn default() -> Self {
        Self {
            base_url: None,
            api_key_env: None,
            hint_model: None,
            teacher_model: None,
            prm_model: None,
            max_concurrency: d::PROVIDER_MAX_CONCURRENCY,
            timeout_sec: d::PROVIDER_TIMEOUT_SEC,
            max_retries: d::PROVIDER_MAX_RETRIES,
            deadline_sec: d::PROVIDER_DEADLINE_SEC,
        }
    }
}

impl ProviderSettings {
    /// The OpenAI-compatible chat endpoint: `<base_url>/v1/chat/completions`.
    pub fn chat_completions_url(&self) -> Option<String> {
        self.base_url.as_deref().map(|base| {
            let root = base.trim_end_matches('/');
            let root = root.strip_suffix("/v1").unwrap_or(root);
            format!("{root}/v1/chat/completions")
        })
    }

    /// `timeout_sec` as a duration.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_sec)
    }
}

/// Where teacher log-probs come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TeacherBackend {
    /// An SGLang `/generate` endpoint scoring the given tokens (`return_logprob`, `logprob_start_len`).
    #[default]
    Sglang,
    /// A vLLM-style `/v1/completions` endpoint (`prompt_logprobs`, `return_token_ids`), reached with
    /// `teacher.url` as its root and `teacher.model`.
    OpenaiCompletions,
    /// A chat endpoint. Parsed so the error can explain itself, but always rejected by validation:
    /// chat endpoints cannot return log-probs of given tokens.
    ProviderChat,
}

impl TeacherBackend {
    /// The name used in configuration files.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sglang => "sglang",
            Self::OpenaiCompletions => "openai_completions",
            Self::ProviderChat => "provider_chat",
        }
    }
}

/// `[teacher]`: the OPD teacher.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TeacherSettings {
    /// `sglang` (default: an SGLang `/generate` URL) or `openai_completions` (a vLLM-style
    /// `/v1/completions` URL). `provider_chat` is rejected.
    pub backend: TeacherBackend,
    /// The teacher endpoint; required when OPD is active.
    pub url: Option<String>,
    /// Model name sent to the teacher (needed by `openai_completions`).
    pub model: Option<String>,
    /// Cap on simultaneous teacher calls. Default 3.
    pub max_concurrency: usize,
    /// Timeout of one teacher call, in seconds. Default 120.
    pub timeout_sec: u64,
    /// NAME of the environment variable holding the teacher key, if it needs one.
    pub api_key_env: Option<String>,
    /// The `sglang` teacher is a vision-language model that takes `image_data` beside
    /// `input_ids`: image turns are scored with their images. Default false: a text model would
    /// score the pads without the images, so image turns get no teacher values
    /// (`teacher_without_images`).
    pub images: bool,
}

impl Default for TeacherSettings {
    fn default() -> Self {
        Self {
            backend: TeacherBackend::default(),
            url: None,
            model: None,
            max_concurrency: d::TEACHER_MAX_CONCURRENCY,
            timeout_sec: d::TEACHER_TIMEOUT_SEC,
            api_key_env: None,
            images: false,
        }
    }
}

impl TeacherSettings {
    /// `timeout_sec` as a duration.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_sec)
    }
}

/// `opd.eval_mode` as written (a string such as `"opd_prm"` / `"none"` / `""`, or a boolean),
/// normalised to whether PRM evaluation votes run beside OPD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvalMode {
    original: EvalModeValue,
    votes: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum EvalModeValue {
    Bool(bool),
    Text(String),
}

impl EvalMode {
    /// Strings meaning "PRM evaluation votes on" (case-insensitive).
    pub const TRUE_WORDS: &'static [&'static str] = &["opd_prm", "prm", "true", "yes", "on", "1"];
    /// Strings meaning "off" (case-insensitive; the empty string too).
    pub const FALSE_WORDS: &'static [&'static str] =
        &["", "none", "opd", "off", "false", "no", "0"];

    /// From a boolean.
    pub fn from_bool(votes: bool) -> Self {
        Self {
            original: EvalModeValue::Bool(votes),
            votes,
        }
    }

    /// From a string; `None` when the string is not one of [`Self::TRUE_WORDS`] /
    /// [`Self::FALSE_WORDS`].
    pub fn parse(text: &str) -> Option<Self> {
        let norm = text.trim().to_ascii_lowercase();
        let votes = if Self::TRUE_WORDS.contains(&norm.as_str()) {
            true
        } else if Self::FALSE_WORDS.contains(&norm.as_str()) {
            false
        } else {
            return None;
        };
        Some(Self {
            original: EvalModeValue::Text(text.to_owned()),
            votes,
        })
    }

    /// Whether PRM evaluation votes run beside OPD.
    pub fn eval_votes_enabled(&self) -> bool {
        self.votes
    }

    /// The value as written, for printing: a JSON string or boolean.
    pub fn original(&self) -> serde_json::Value {
        match &self.original {
            EvalModeValue::Bool(b) => serde_json::Value::Bool(*b),
            EvalModeValue::Text(s) => serde_json::Value::String(s.clone()),
        }
    }
}

impl Default for EvalMode {
    fn default() -> Self {
        Self::from_bool(d::OPD_EVAL_MODE)
    }
}

impl Serialize for EvalMode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.original {
            EvalModeValue::Bool(b) => s.serialize_bool(*b),
            EvalModeValue::Text(t) => s.serialize_str(t),
        }
    }
}

impl<'de> Deserialize<'de> for EvalMode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        const EXPECTED: &str = "a boolean or one of \"opd_prm\", \"prm\", \"none\", \"opd\", \"\"";
        impl serde::de::Visitor<'_> for V {
            type Value = EvalMode;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(EXPECTED)
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<EvalMode, E> {
                Ok(EvalMode::from_bool(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<EvalMode, E> {
                match v {
                    0 | 1 => Ok(EvalMode {
                        original: EvalModeValue::Text(v.to_string()),
                        votes: v == 1,
                    }),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Unsigned(v), &self)),
                }
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<EvalMode, E> {
                match u64::try_from(v) {
                    Ok(u) => self.visit_u64(u),
                    Err(_) => Err(E::invalid_value(serde::de::Unexpected::Signed(v), &self)),
                }
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<EvalMode, E> {
                EvalMode::parse(v)
                    .ok_or_else(|| E::invalid_value(serde::de::Unexpected::Str(v), &self))
            }
        }
        d.deserialize_any(V)
    }
}

/// `[opd]`: on-policy distillation with hints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OpdSettings {
    /// Force OPD on or off. When unset, OPD is on exactly when `server.mode` is `opd` or `combine`;
    /// when set, it must agree with `server.mode`.
    pub enabled: Option<bool>,
    /// PRM evaluation votes beside OPD: a string (`"opd_prm"` on; `"none"`, `"opd"` or `""` off) or a
    /// boolean. Default false.
    pub eval_mode: EvalMode,
    /// K for top-K teacher distillation; 0 turns it off. Default 0.
    pub top_k: usize,
    /// Ask the hint judge for several hints and keep the best one. Default true.
    pub select_best_hint: bool,
    /// A turn that never gets a next state yields no OPD sample. Default true.
    pub drop_without_next_state: bool,
    /// A hint is accepted only when its trimmed length is strictly greater than this many
    /// characters (so a hint of exactly 10 is rejected). Default 10.
    pub min_hint_chars: usize,
    /// Where the hint judge runs: `sglang` (the judge's `/generate` at `prm.router_url`; default) or
    /// `provider` (the provider's chat endpoint with `provider.hint_model`).
    pub hint_backend: PrmBackend,
    /// The temperature the teacher is asked to score at: a number (default 0, the reference's) or
    /// `"rollout"` (each turn's own sampling temperature; 1.0, marked assumed, when its request
    /// left it to the engine). Sent to both teacher backends and recorded in OPD records and
    /// samples; SGLang and vLLM do not apply it to prompt log-probs (docs/upstream-protocols.md
    /// section 9).
    pub teacher_temperature: ps_core::ports::TeacherTemperature,
}

impl Default for OpdSettings {
    fn default() -> Self {
        Self {
            enabled: None,
            eval_mode: EvalMode::default(),
            top_k: d::OPD_TOP_K,
            select_best_hint: d::OPD_SELECT_BEST_HINT,
            drop_without_next_state: d::OPD_DROP_WITHOUT_NEXT_STATE,
            min_hint_chars: d::OPD_MIN_HINT_CHARS,
            hint_backend: PrmBackend::default(),
            teacher_temperature: ps_core::ports::TeacherTemperature::default(),
        }
    }
}

impl OpdSettings {
    /// Whether PRM evaluation votes run beside OPD (the normalised `eval_mode`).
    pub fn eval_votes_enabled(&self) -> bool {
        self.eval_mode.eval_votes_enabled()
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `[logging]`: logs and JSONL records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoggingSettings {
    /// `trace`, `debug`, `info`, `warn` (or `warning`) or `error`, in any case. Default `INFO`.
    pub level: String,
    /// `text` (default) or `json`.
    pub format: LogFormat,
    /// Parent directory for records; PRM and OPD records go to its `prm/` and `opd/` unless set
    /// below. Unset: no records unless a directory below is set.
    pub record_dir: Option<PathBuf>,
    /// Directory of PRM JSONL records.
    pub prm_record_dir: Option<PathBuf>,
    /// Directory of OPD JSONL records (`opd_YYYYMMDD_HHMMSS.jsonl`).
    pub opd_record_dir: Option<PathBuf>,
}

impl Default for LoggingSettings {
    fn default() -> Self {
        Self {
            level: d::LOGGING_LEVEL.to_owned(),
            format: LogFormat::default(),
            record_dir: None,
            prm_record_dir: None,
            opd_record_dir: None,
        }
    }
}

impl LoggingSettings {
    /// The level as a lower-case filter directive (`warning` becomes `warn`); `None` when the
    /// level is not one of the accepted names.
    pub fn level_filter(&self) -> Option<&'static str> {
        match self.level.trim().to_ascii_lowercase().as_str() {
            "trace" => Some("trace"),
            "debug" => Some("debug"),
            "info" => Some("info"),
            "warn" | "warning" => Some("warn"),
            "error" => Some("error"),
            _ => None,
        }
    }

    /// Where PRM records go: `prm_record_dir`, else `record_dir/prm`, else nowhere.
    pub fn prm_records(&self) -> Option<PathBuf> {
        self.prm_record_dir
            .clone()
            .or_else(|| self.record_dir.as_ref().map(|d| d.join("prm")))
    }

    /// Where conversation records go: `record_dir/conversations`, else nowhere.
    pub fn conversation_records(&self) -> Option<PathBuf> {
        self.record_dir.as_ref().map(|d| d.join("conversations"))
    }

    /// Where OPD records go: `opd_record_dir`, else `record_dir/opd`, else nowhere.
    pub fn opd_records(&self) -> Option<PathBuf> {
        self.opd_record_dir
            .clone()
            .or_else(|| self.record_dir.as_ref().map(|d| d.join("opd")))
    }
}

/// `[inspect]`: the inspection page (`/ui`, `/v1/inspect/*`, docs/inspect.md) and the bounds of
/// its in-memory history of recent sessions and turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InspectSettings {
    /// Serve the page and keep the history. Default true.
    pub enabled: bool,
    /// Sessions the history holds; the least recently active is forgotten first. Default 1000.
    pub max_sessions: usize,
    /// Requests held per session; the oldest first. Default 256.
    pub max_turns_per_session: usize,
}

impl Default for InspectSettings {
    fn default() -> Self {
        Self {
            enabled: d::INSPECT_ENABLED,
            max_sessions: d::INSPECT_MAX_SESSIONS,
            max_turns_per_session: d::INSPECT_MAX_TURNS_PER_SESSION,
        }
    }
}

/// `[capture]`: how response positions without a log-prob enter the loss mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CaptureSettings {
    /// Train the end-of-turn token the model sampled even when upstream reported no log-prob for
    /// it (streams drop the empty final delta). Default true.
    pub train_eos_without_logprob: bool,
    /// Train tokens the model never sampled (template scaffolding). Default false.
    pub train_unsampled: bool,
    /// Engine-id turns also re-tokenized to check that our template and tokenizer agree with the
    /// engine (`retokenize_drift_total`): the first this many turns of the process… Default 100.
    /// The OPD teacher builds on engines' prompt ids only once a prompt was checked and while
    /// every prompt checked was equal (none checked, as with both settings 0: it encodes prompt
    /// texts itself).
    pub drift_check_first: u64,
    /// …then one turn in this many (0: none after the first). Default 100.
    pub drift_check_every: u64,
    /// At most this many MiB of main turns waiting for a capture worker (their request text and
    /// the engine's answer); a turn beyond it is answered but not trained on
    /// (`capture_queue_full`). Bounds memory when capture falls behind. Default 256, at least 1.
    pub max_queued_mib: u64,
    /// A vision-language policy's turn whose image is larger than this many MiB (decoded) is not
    /// captured (`image_too_large`). Default 20, at least 1.
    pub max_image_mib: u64,
    /// …nor one with more images than this in its prompt (`too_many_images`). Default 64, at
    /// least 1.
    pub max_images_per_turn: usize,
    /// What main turns are sampled with: `as_sent` (the client's parameters; each sample records
    /// them and a truncated one is marked `truncated_sampling_without_sets`) or
    /// `full_distribution` (`top_p = 1`, `top_k = -1`, `min_p = 0` sent upstream on main turns, the
    /// temperature kept). Default `as_sent`.
    pub sampling: ps_core::SamplingMode,
    /// A mixture-of-experts policy's routed experts on samples (routing replay): `off`, `auto`
    /// (the default: kept when the engine returns them; SGLang asked when it reports
    /// `enable_return_routed_experts`) or `require` (always asked for; a turn without them, or
    /// whose shape does not fit its tokens, gives no sample: `routed_experts_missing`,
    /// `routed_experts_mismatch`).
    pub routed_experts: ps_core::RoutedExpertsMode,
    /// At most this many MiB of routed experts held in memory by captured turns waiting for their
    /// next state and judges; a turn past it keeps no experts (`routed_experts_over_budget`:
    /// marked under `auto`, dropped under `require`). Default 4096, at least 1.
    pub max_held_experts_mib: u64,
}

impl Default for CaptureSettings {
    fn default() -> Self {
        Self {
            train_eos_without_logprob: d::CAPTURE_TRAIN_EOS_WITHOUT_LOGPROB,
            train_unsampled: d::CAPTURE_TRAIN_UNSAMPLED,
            drift_check_first: d::CAPTURE_DRIFT_CHECK_FIRST,
            drift_check_every: d::CAPTURE_DRIFT_CHECK_EVERY,
            max_queued_mib: d::CAPTURE_MAX_QUEUED_MIB,
            max_image_mib: d::CAPTURE_MAX_IMAGE_MIB,
            max_images_per_turn: d::CAPTURE_MAX_IMAGES_PER_TURN,
            sampling: ps_core::SamplingMode::AsSent,
            routed_experts: ps_core::RoutedExpertsMode::Auto,
            max_held_experts_mib: d::CAPTURE_MAX_HELD_EXPERTS_MIB,
        }
    }
}

impl CaptureSettings {
    /// The alignment policy of `ps-core` these settings select.
    pub fn align_policy(&self) -> AlignPolicy {
        AlignPolicy {
            train_eos_without_logprob: self.train_eos_without_logprob,
            train_unsampled: self.train_unsampled,
        }
    }
}

impl From<CaptureSettings> for AlignPolicy {
    fn from(c: CaptureSettings) -> Self {
        c.align_policy()
    }
}

/// Kind of sample store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreKind {
    /// An embedded on-disk store in `store.path`: one proxy beside one trainer.
    #[default]
    Embedded,
    /// A Redis stream (`store.redis`): several proxy replicas feeding one trainer.
    Redis,
}

impl StoreKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Embedded => "embedded",
            Self::Redis => "redis",
        }
    }
}

/// `[store.redis]`: the Redis Streams store, used when `store.kind` is `redis`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisStoreSettings {
    /// `redis://[user:password@]host:port[/db]` (`rediss://` for TLS). Default
    /// `redis://127.0.0.1:6379`. Printed with its password redacted.
    pub url: String,
    /// Names the stream `ps:{<deployment>}:samples`: every replica feeding one trainer uses the
    /// same value. Default `default`.
    pub deployment: String,
    /// The consumer group trainers read in. Default `trainer`.
    pub group: String,
    /// This replica's name, under which its unfinished turns are kept across a restart; must be
    /// unique per replica. Default: the host name and `server.port` (`gpu-node-3-30000`).
    pub replica: Option<String>,
    /// Entries a consumer has left unacknowledged this long are handed to the next consumer that
    /// pulls (a dead trainer worker loses nothing). Default 300.
    pub claim_idle_sec: u64,
    /// Timeout of one Redis command, connecting included. Default 5.
    pub timeout_sec: u64,
    /// How long an append keeps retrying while Redis is unreachable (restarting) before the
    /// session buffer's own retries take over. Default 60.
    pub retry_for_sec: u64,
}

impl Default for RedisStoreSettings {
    fn default() -> Self {
        Self {
            url: d::REDIS_URL.into(),
            deployment: d::REDIS_DEPLOYMENT.into(),
            group: d::REDIS_GROUP.into(),
            replica: None,
            claim_idle_sec: d::REDIS_CLAIM_IDLE_SEC,
            timeout_sec: d::REDIS_TIMEOUT_SEC,
            retry_for_sec: d::REDIS_RETRY_FOR_SEC,
        }
    }
}

/// `[store]`: where finished samples are persisted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreSettings {
    /// Directory of the store. Default `./data/samples`.
    pub path: PathBuf,
    /// `embedded` (default) or `redis` (see `store.redis`).
    pub kind: StoreKind,
    /// Committed samples kept before compaction deletes the oldest of them (0: delete as soon as the
    /// trainer commits them). Uncommitted samples are never deleted. Default 10000.
    pub retain_committed: u64,
    /// The Redis Streams store.
    pub redis: RedisStoreSettings,
}

impl Default for StoreSettings {
    fn default() -> Self {
        Self {
            path: PathBuf::from(d::STORE_PATH),
            kind: StoreKind::default(),
            retain_committed: d::STORE_RETAIN_COMMITTED,
            redis: RedisStoreSettings::default(),
        }
    }
}

impl Settings {
    /// Whether OPD samples are produced: `opd.enabled` when set, else `server.mode` is `opd` or
    /// `combine`. (Validation rejects an `opd.enabled` that contradicts `server.mode`.)
    pub fn opd_active(&self) -> bool {
        self.opd.enabled.unwrap_or(self.server.mode.includes_opd())
    }

    /// The PRM judge's tokenizer directory: `prm.model_dir`, else `server.model_dir`.
    pub fn prm_model_dir(&self) -> Option<&Path> {
        self.prm
            .model_dir
            .as_deref()
            .or(self.server.model_dir.as_deref())
    }

    /// The model the provider-backed PRM uses: `prm.model`, else `provider.prm_model`.
    pub fn prm_provider_model(&self) -> Option<&str> {
        self.prm
            .model
            .as_deref()
            .or(self.provider.prm_model.as_deref())
    }

    /// Whether the teacher is reached through the provider: backend `openai_completions` with no
    /// `teacher.url` of its own (the operators' `teacher_base_url` is the provider root).
    pub fn teacher_uses_provider(&self) -> bool {
        self.teacher.backend == TeacherBackend::OpenaiCompletions
            && self.teacher.url.is_none()
            && self.provider.base_url.is_some()
    }

    /// The teacher's URL: `teacher.url`, else (for `openai_completions`) `provider.base_url`.
    pub fn teacher_url(&self) -> Option<&str> {
        match &self.teacher.url {
            Some(u) => Some(u),
            None if self.teacher_uses_provider() => self.provider.base_url.as_deref(),
            None => None,
        }
    }

    /// The teacher's model: `teacher.model`, else `provider.teacher_model`.
    pub fn teacher_model(&self) -> Option<&str> {
        self.teacher
            .model
            .as_deref()
            .or(self.provider.teacher_model.as_deref())
    }

    /// Whether anything active calls the external provider (the OPD hint judge, or the PRM with
    /// `backend = "provider"`).
    pub fn provider_in_use(&self) -> bool {
        (self.opd_active() && self.opd.hint_backend == PrmBackend::Provider)
            || (self.prm.enabled && self.prm.backend == PrmBackend::Provider)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn eval_mode_words() {
        for w in EvalMode::TRUE_WORDS {
            assert_eq!(
                EvalMode::parse(w).map(|m| m.eval_votes_enabled()),
                Some(true),
                "{w}"
            );
        }
        for w in EvalMode::FALSE_WORDS {
            assert_eq!(
                EvalMode::parse(w).map(|m| m.eval_votes_enabled()),
                Some(false),
                "{w}"
            );
        }
        assert_eq!(
            EvalMode::parse(" OPD_PRM ").map(|m| m.original()),
            Some(" OPD_PRM ".into())
        );
        assert!(EvalMode::parse("maybe").is_none());
        assert_eq!(
            EvalMode::default().original(),
            serde_json::Value::Bool(false)
        );
    }

    #[test]
    fn eval_mode_round_trips_through_json() {
        for text in [r#""opd_prm""#, "true", r#""""#] {
            let m: EvalMode = serde_json::from_str(text).unwrap();
            assert_eq!(serde_json::to_string(&m).unwrap(), text);
        }
        assert!(serde_json::from_str::<EvalMode>("2").is_err());
        assert!(
            serde_json::from_str::<EvalMode>("1")
                .unwrap()
                .eval_votes_enabled()
        );
    }

    #[test]
    fn settings_round_trip_through_json() {
        let s = Settings::default();
        let back: Settings = serde_json::from_value(serde_json::to_value(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn record_dirs_fall_back_to_record_dir() {
        let mut l = LoggingSettings::default();
        assert_eq!(l.prm_records(), None);
        l.record_dir = Some(PathBuf::from("/r"));
        assert_eq!(l.prm_records(), Some(PathBuf::from("/r/prm")));
        assert_eq!(l.opd_records(), Some(PathBuf::from("/r/opd")));
        l.opd_record_dir = Some(PathBuf::from("/o"));
        assert_eq!(l.opd_records(), Some(PathBuf::from("/o")));
    }

    #[test]
    fn derived_values() {
        let mut s = Settings::default();
        assert!(!s.opd_active());
        assert!(!s.provider_in_use());
        s.server.model_dir = Some(PathBuf::from("/m"));
        assert_eq!(s.prm_model_dir(), Some(Path::new("/m")));
        s.prm.model_dir = Some(PathBuf::from("/j"));
        assert_eq!(s.prm_model_dir(), Some(Path::new("/j")));
        s.prm.backend = PrmBackend::Provider;
        assert!(s.provider_in_use());
        s.provider.prm_model = Some("p".into());
        assert_eq!(s.prm_provider_model(), Some("p"));
        s.server.mode = Mode::Combine;
        assert!(s.opd_active());
        assert_eq!(s.capture.align_policy(), AlignPolicy::default());
        let p = ProviderSettings {
            base_url: Some("https://x/api/".into()),
            ..Default::default()
        };
        assert_eq!(
            p.chat_completions_url().as_deref(),
            Some("https://x/api/v1/chat/completions")
        );
        assert_eq!(s.sglang.timeout(), Duration::from_secs(120));
    }
}
