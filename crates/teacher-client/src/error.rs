//! Why one teacher call failed. The caller drops the sample (with the error's reason); it never fills
//! in values.

use std::time::Duration;

/// Configuration key of the teacher endpoint.
pub const URL_KEY: &str = "teacher.url";
/// Configuration key of the per-call timeout.
pub const TIMEOUT_KEY: &str = "teacher.timeout_sec";
/// Configuration key naming the environment variable that holds the teacher's key.
pub const API_KEY_ENV_KEY: &str = "teacher.api_key_env";
/// Configuration key of the teacher's model name (completions teachers).
pub const MODEL_KEY: &str = "teacher.model";
/// Configuration key of the teacher protocol (`sglang` or `openai_completions`).
pub const BACKEND_KEY: &str = "teacher.backend";

/// Why the teacher could not score a sequence. Each variant names the URL and the configuration key an
/// operator would look at; none carries the API key.
#[derive(Debug, thiserror::Error)]
pub enum TeacherError {
    #[error("cannot connect to the teacher at {url} (check `{config_key}`): {detail}")]
    Connect {
        url: String,
        config_key: &'static str,
        /// The transport error with its causes (for example "Connection refused").
        detail: String,
        #[source]
        source: Option<reqwest::Error>,
    },
    #[error(
        "the connection to the teacher at {url} failed before a complete answer (check `{config_key}`): {detail}"
    )]
    Transport {
        url: String,
        config_key: &'static str,
        detail: String,
        #[source]
        source: Option<reqwest::Error>,
    },
    #[error("the teacher at {url} did not answer within {after:?} (raise `{config_key}`)")]
    Timeout {
        url: String,
        after: Duration,
        config_key: &'static str,
    },
    #[error("the teacher at {url} answered HTTP {status}: {body} (check `{config_key}`)")]
    Status {
        url: String,
        status: u16,
        /// The error body's message when it has one, else the start of the body.
        body: String,
        config_key: &'static str,
    },
    #[error(
        "the teacher at {url} rejected the request with HTTP {status}: {} (check the variable named by `{config_key}`)",
        key_phrase(.key_sent)
    )]
    Unauthorized {
        url: String,
        status: u16,
        /// Whether a key was sent (the key itself is never kept here).
        key_sent: bool,
        config_key: &'static str,
    },
    #[error("the teacher at {url} sent an answer we cannot use (check `{config_key}`): {detail}")]
    InvalidBody {
        url: String,
        detail: String,
        config_key: &'static str,
    },
    #[error(
        "the teacher at {url} gave no {field} value for response position {position} (input position {input_position}) (check `{config_key}`)"
    )]
    MissingValue {
        url: String,
        /// The wire field that lacked it (`input_token_logprobs`, `input_top_logprobs`, `prompt_logprobs`).
        field: &'static str,
        /// 0-based position in the response.
        position: usize,
        /// 0-based position in the whole input.
        input_position: usize,
        config_key: &'static str,
    },
    #[error(
        "the teacher at {url} gave {got} top log-probs instead of {k} at response position {position} (check `{config_key}`)"
    )]
    ShortTopK {
        url: String,
        /// 0-based position in the response.
        position: usize,
        got: usize,
        k: usize,
        config_key: &'static str,
    },
    #[error(
        "cannot score the last {response_len} of {input_len} tokens with the teacher at {url} (`{config_key}`): \
         the response must follow at least one prompt token, since the first input token never has a log-prob"
    )]
    NoContext {
        url: String,
        input_len: usize,
        response_len: usize,
        config_key: &'static str,
    },
    #[error("`{config_key}` = {url:?} cannot be used as the teacher: {detail}")]
    InvalidUrl {
        url: String,
        detail: String,
        config_key: &'static str,
    },
    #[error("the teacher at {url} is misconfigured (`{config_key}`): {detail}")]
    InvalidConfig {
        url: String,
        detail: String,
        config_key: &'static str,
    },
    #[error(
        "`{config_key}` = {url:?} is a chat endpoint, and chat endpoints cannot return the log-probs of \
         given tokens, which OPD needs. Point `teacher.url` at an SGLang /generate URL (backend \"sglang\", \
         e.g. http://127.0.0.1:30003/generate) or a vLLM-style /v1/completions URL (backend \
         \"openai_completions\", e.g. http://127.0.0.1:8000/v1 or http://127.0.0.1:8000/v1/completions)"
    )]
    ChatEndpoint {
        url: String,
        config_key: &'static str,
    },
}

impl From<TeacherError> for ps_core::ports::CallError {
    /// A failed teacher call through the port, with its stable reason ([`TeacherError::reason`]).
    fn from(e: TeacherError) -> Self {
        Self::new(e.reason(), e)
    }
}

impl TeacherError {
    /// A stable snake_case reason for counters and records (low cardinality).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Connect { .. } => "teacher_connect",
            Self::Transport { .. } => "teacher_transport",
            Self::Timeout { .. } => "teacher_timeout",
            Self::Status { .. } => "teacher_status",
            Self::Unauthorized { .. } => "teacher_unauthorized",
            Self::InvalidBody { .. } => "teacher_invalid_body",
            Self::MissingValue { .. } => "teacher_missing_value",
            Self::ShortTopK { .. } => "teacher_short_topk",
            Self::NoContext { .. } => "teacher_no_context",
            Self::InvalidUrl { .. } => "teacher_invalid_url",
            Self::InvalidConfig { .. } => "teacher_invalid_config",
            Self::ChatEndpoint { .. } => "teacher_chat_endpoint",
        }
    }
}

/// The start-up error for a chat-only endpoint configured as the teacher: chat endpoints cannot return
/// log-probs of given tokens; the message names what works (an SGLang `/generate` URL or a vLLM-style
/// `/v1/completions` URL).
pub fn chat_endpoint_error(url: &str) -> TeacherError {
    TeacherError::ChatEndpoint {
        url: url.to_owned(),
        config_key: URL_KEY,
    }
}

fn key_phrase(key_sent: &bool) -> &'static str {
    if *key_sent {
        "the API key was refused"
    } else {
        "it needs an API key and none is configured"
    }
}

/// `e` and its causes, joined (one definition for the product, in `ps-core`).
pub(crate) use ps_core::error_chain;

/// Why an answer (SGLang `/generate` or `/v1/completions`) could not be read; the HTTP layer turns it
/// into a [`TeacherError`] with the URL.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ParseError {
    Invalid(String),
    Missing {
        field: &'static str,
        position: usize,
        input_position: usize,
    },
    ShortTopK {
        position: usize,
        got: usize,
    },
}
