//! Why one judge call failed. A failed call is a failed vote, never a failed turn.

use std::time::Duration;

/// Configuration key of the judge's `/generate` URL.
pub const ROUTER_URL_KEY: &str = "prm.router_url";
/// Configuration key of the per-call timeout.
pub const TIMEOUT_KEY: &str = "prm.timeout_sec";
/// Configuration key of the judge tokenizer directory (its chat template renders the prompt).
pub const MODEL_DIR_KEY: &str = "prm.model_dir";

/// Why a call to the judge failed. Each variant names the URL and the configuration key an operator
/// would look at.
#[derive(Debug, thiserror::Error)]
pub enum JudgeError {
    #[error("cannot connect to the PRM judge at {url} (check `{config_key}`): {detail}")]
    Connect {
        url: String,
        config_key: &'static str,
        /// The transport error with its causes (for example "Connection refused").
        detail: String,
        #[source]
        source: Option<reqwest::Error>,
    },
    #[error(
        "the connection to the PRM judge at {url} failed before an answer (check `{config_key}`): {detail}"
    )]
    Transport {
        url: String,
        config_key: &'static str,
        detail: String,
        #[source]
        source: Option<reqwest::Error>,
    },
    #[error("the PRM judge at {url} did not answer within {after:?} (raise `{config_key}`)")]
    Timeout {
        url: String,
        after: Duration,
        config_key: &'static str,
    },
    #[error("the PRM judge at {url} answered HTTP {status}: {body} (check `{config_key}`)")]
    Status {
        url: String,
        status: u16,
        /// SGLang's `error.message` when the body has one, else the start of the body.
        body: String,
        config_key: &'static str,
    },
    #[error(
        "the PRM judge at {url} sent a body that is not SGLang /generate JSON (check `{config_key}`): {detail}"
    )]
    InvalidBody {
        url: String,
        detail: String,
        config_key: &'static str,
    },
    #[error("`{config_key}` = {url:?} is not an absolute http(s) URL: {detail}")]
    InvalidUrl {
        url: String,
        detail: String,
        config_key: &'static str,
    },
    #[error(
        "cannot render the PRM judge prompt with the judge tokenizer's chat template (check `{config_key}`): {detail}"
    )]
    Render {
        detail: String,
        config_key: &'static str,
    },
}

impl From<JudgeError> for ps_core::ports::CallError {
    /// A failed judge call through the port: its message kept whole (a failed vote keeps it as
    /// its reason).
    fn from(e: JudgeError) -> Self {
        Self::new("judge_call", e)
    }
}

/// `e` and its causes, joined (one definition for the product, in `ps-core`).
pub(crate) use ps_core::error_chain;
