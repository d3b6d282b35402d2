//! Why a provider call failed. Every message names the provider and its URL; a rejected key names
//! the variable that holds it, never the key.

use std::time::Duration;

/// Configuration key naming the provider root URL.
pub const BASE_URL_KEY: &str = "provider.base_url";
/// Configuration key naming the variable that holds the provider key.
pub const API_KEY_ENV_KEY: &str = "provider.api_key_env";
/// Configuration key of the per-call timeout.
pub const TIMEOUT_KEY: &str = "provider.timeout_sec";
/// Configuration key of the whole-call deadline.
pub const DEADLINE_KEY: &str = "provider.deadline_sec";

/// Why a call to the external provider failed.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// HTTP 401 or 403: the key is missing, wrong, revoked or not allowed. Never retried.
    #[error(
        "provider `{name}` at {url} {verb} {key} (HTTP {status}): {fix}{said}",
        verb = unauthorized_verb(.status),
        key = key_phrase(.key_var),
        fix = key_fix(.key_var, .status),
        said = provider_said(.message),
    )]
    Unauthorized {
        name: String,
        url: String,
        /// The variable holding the key (`provider.api_key_env`), when one is configured.
        key_var: Option<String>,
        status: u16,
        /// The provider's `error.message`, with any copy of the key removed.
        message: String,
    },
    /// HTTP 429 with `insufficient_quota`: the account is out of credit. Never retried.
    #[error(
        "provider `{name}` at {url} answered HTTP 429 insufficient_quota: the account's quota or billing is exhausted; add credit or use another key{said}",
        said = provider_said(.message)
    )]
    Quota {
        name: String,
        url: String,
        message: String,
    },
    /// A client error that retrying cannot fix (400, 404, …).
    #[error(
        "provider `{name}` at {url} rejected the call for model `{model}` with HTTP {status}{code}: {fix}{said}",
        code = code_phrase(.code),
        fix = rejected_fix(.status),
        said = provider_said(.message)
    )]
    Rejected {
        name: String,
        url: String,
        model: String,
        status: u16,
        /// The provider's `error.code` (or `error.type`), e.g. `model_not_found`.
        code: Option<String>,
        message: String,
    },
    /// A retryable status (408, 409, 429, 5xx) that persisted, or that the provider said not to retry.
    #[error(
        "provider `{name}` at {url} answered HTTP {status} after {attempts} attempt(s){said}",
        said = provider_said(.message)
    )]
    Status {
        name: String,
        url: String,
        status: u16,
        message: String,
        attempts: u32,
    },
    #[error(
        "provider `{name}` at {url} did not answer within {after:?} after {attempts} attempt(s) (raise `{TIMEOUT_KEY}`)"
    )]
    Timeout {
        name: String,
        url: String,
        after: Duration,
        attempts: u32,
    },
    #[error(
        "provider `{name}` at {url} gave no usable answer within {after:?} ({attempts} attempt(s), back-off included; raise `{DEADLINE_KEY}`)"
    )]
    Deadline {
        name: String,
        url: String,
        after: Duration,
        attempts: u32,
    },
    #[error(
        "cannot connect to provider `{name}` at {url} after {attempts} attempt(s) (check `{BASE_URL_KEY}`): {detail}"
    )]
    Connect {
        name: String,
        url: String,
        attempts: u32,
        /// The transport error with its causes (for example "Connection refused").
        detail: String,
    },
    #[error(
        "the connection to provider `{name}` at {url} failed before a whole answer after {attempts} attempt(s): {detail}"
    )]
    Transport {
        name: String,
        url: String,
        attempts: u32,
        detail: String,
    },
    #[error(
        "provider `{name}` at {url} sent a body that is not an OpenAI chat completion (check `{BASE_URL_KEY}`): {detail}"
    )]
    InvalidBody {
        name: String,
        url: String,
        detail: String,
    },
    #[error(
        "provider `{name}`: {url:?} is not a usable chat URL (check `{BASE_URL_KEY}`): {detail}"
    )]
    InvalidUrl {
        name: String,
        url: String,
        detail: String,
    },
    #[error("cannot build the HTTP client of provider `{name}`: {detail}")]
    Build { name: String, detail: String },
    #[error("provider `{name}`: the concurrency limiter is closed (the server is shutting down)")]
    Closed { name: String },
}

impl ProviderError {
    /// The HTTP status the provider answered, for the status variants.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Unauthorized { status, .. }
            | Self::Rejected { status, .. }
            | Self::Status { status, .. } => Some(*status),
            Self::Quota { .. } => Some(429),
            _ => None,
        }
    }

    /// Whether the error is a configuration problem the operator must fix (key, quota, model or
    /// URL), as opposed to a transient failure.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            Self::Unauthorized { .. }
                | Self::Quota { .. }
                | Self::Rejected { .. }
                | Self::InvalidUrl { .. }
                | Self::Build { .. }
        )
    }
}

fn unauthorized_verb(status: &u16) -> &'static str {
    if *status == 403 {
        "refused the request made with"
    } else {
        "rejected"
    }
}

fn code_phrase(code: &Option<String>) -> String {
    code.as_deref().map(|c| format!(" {c}")).unwrap_or_default()
}

fn key_phrase(var: &Option<String>) -> String {
    match var {
        Some(v) => format!("the key from {v}"),
        None => format!("the request, which carried no key (`{API_KEY_ENV_KEY}` is not set)"),
    }
}

fn key_fix(var: &Option<String>, status: &u16) -> String {
    match (var, *status) {
        (Some(_), 403) => {
            "the key is valid but not allowed to use this model or from this region; check the account's permissions".to_owned()
        }
        (Some(_), _) => "check that the variable holds a valid key".to_owned(),
        (None, _) => format!("set `{API_KEY_ENV_KEY}` to the name of the variable holding the key"),
    }
}

fn rejected_fix(status: &u16) -> &'static str {
    match *status {
        404 => "check the model name and that `provider.base_url` is the provider root",
        400 | 422 => {
            "the provider refused the request's parameters (model, max_tokens or temperature)"
        }
        _ => "the provider refused the request",
    }
}

fn provider_said(message: &str) -> String {
    if message.is_empty() {
        String::new()
    } else {
        format!(" (the provider said: {message})")
    }
}

/// `e` and its causes, joined (one definition for the product, in `ps-core`).
pub(crate) use ps_core::error_chain;
