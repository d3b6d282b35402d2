use std::time::Duration;

use bytes::Bytes;

/// Why a call to the policy upstream failed. Each variant names the URL and, where an operator can fix
/// it, the configuration key.
#[derive(Debug, thiserror::Error)]
pub enum SglangError {
    #[error("cannot connect to the policy upstream at {url} (check `{config_key}`): {source}")]
    Connect {
        url: String,
        config_key: &'static str,
        #[source]
        source: reqwest::Error,
    },
    #[error("the connection to the policy upstream at {url} failed before an answer: {source}")]
    Transport {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("the policy upstream at {url} did not answer within {after:?} (raise `{config_key}`)")]
    Timeout {
        url: String,
        after: Duration,
        config_key: &'static str,
    },
    #[error("the policy upstream at {url} answered HTTP {status}")]
    Status {
        url: String,
        status: u16,
        content_type: Option<String>,
        body: Bytes,
    },
    #[error("the policy upstream at {url} sent a body that is not the expected JSON: {detail}")]
    InvalidBody { url: String, detail: String },
    #[error("the policy upstream at {url} sent an answer larger than {limit} bytes")]
    TooLarge { url: String, limit: usize },
    #[error("the stream from the policy upstream at {url} broke: {detail}")]
    Stream { url: String, detail: String },
    #[error("the stream from the policy upstream at {url} reported an error: {message}")]
    StreamErrorEvent { url: String, message: String },
}
