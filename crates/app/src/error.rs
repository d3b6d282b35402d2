//! Why the server could not start ([`StartupError`]): one variant per start-up step, each message
//! naming the setting or flag to fix.

use std::path::PathBuf;

use ps_chat_template::ChatTemplateError;
use ps_config::ConfigError;
use ps_judge::JudgeError;
use ps_provider_client::ProviderError;
use ps_records::RecordError;
use ps_sample_store::StoreError;
use ps_sglang_client::SglangError;
use ps_teacher_client::TeacherError;

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
