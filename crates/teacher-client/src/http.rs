//! The transport both teachers share: one POST of a JSON body to one URL, with an optional Bearer
//! key, bounded as a whole (connect, answer, body) by the per-call timeout.

use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;

use crate::error::{API_KEY_ENV_KEY, TIMEOUT_KEY, TeacherError, URL_KEY, error_chain};

/// Error-body excerpts and messages, shared by every client crate.
pub(crate) use ps_http::{error_message, snippet};

/// Where and how to call one teacher. `Debug` never shows the key.
#[derive(Clone, Debug)]
pub(crate) struct Endpoint {
    pub http: reqwest::Client,
    /// The URL every call is POSTed to.
    pub url: String,
    pub api_key: Option<ps_core::Secret>,
    pub timeout: Duration,
}

/// A client with its own connection pool, its connect phase bounded by `timeout`.
pub(crate) fn build_client(url: &str, timeout: Duration) -> Result<reqwest::Client, TeacherError> {
    ps_http::client(timeout).map_err(|e| TeacherError::Connect {
        url: url.to_owned(),
        config_key: URL_KEY,
        detail: error_chain(&e),
        source: Some(e),
    })
}

/// `url` parsed as an absolute http(s) URL with a host, or the reason it is not.
pub(crate) fn parse_http_url(url: &str) -> Result<reqwest::Url, String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| e.to_string())?;
    if !matches!(parsed.scheme(), "http" | "https") || !parsed.has_host() {
        return Err("expected an absolute http(s) URL such as http://host:port/…".to_owned());
    }
    Ok(parsed)
}

/// Whether `path` (a URL path) names a chat endpoint.
pub(crate) fn is_chat_path(path: &str) -> bool {
    path.trim_end_matches('/').ends_with("/chat/completions")
}

impl Endpoint {
    /// POSTs `body` and returns the successful answer's bytes, all within the timeout.
    pub(crate) async fn post<B: Serialize + Sync>(&self, body: &B) -> Result<Bytes, TeacherError> {
        tokio::time::timeout(self.timeout, self.exchange(body))
            .await
            .map_err(|_| self.timeout_error())?
    }

    async fn exchange<B: Serialize + Sync>(&self, body: &B) -> Result<Bytes, TeacherError> {
        let req = ps_http::with_bearer(self.http.post(&self.url).json(body), self.api_key.as_ref());
        let resp = req.send().await.map_err(|e| self.send_error(e))?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| self.send_error(e))?;
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            return Err(TeacherError::Unauthorized {
                url: self.url.clone(),
                status: status.as_u16(),
                key_sent: self.api_key.is_some(),
                config_key: API_KEY_ENV_KEY,
            });
        }
        if !status.is_success() {
            return Err(TeacherError::Status {
                url: self.url.clone(),
                status: status.as_u16(),
                body: error_message(&bytes),
                config_key: URL_KEY,
            });
        }
        Ok(bytes)
    }

    fn send_error(&self, e: reqwest::Error) -> TeacherError {
        let kind = ps_http::classify(&e);
        if kind == ps_http::Failure::Timeout {
            return self.timeout_error();
        }
        let detail = error_chain(&e);
        if kind == ps_http::Failure::Connect {
            TeacherError::Connect {
                url: self.url.clone(),
                config_key: URL_KEY,
                detail,
                source: Some(e),
            }
        } else {
            TeacherError::Transport {
                url: self.url.clone(),
                config_key: URL_KEY,
                detail,
                source: Some(e),
            }
        }
    }

    fn timeout_error(&self) -> TeacherError {
        TeacherError::Timeout {
            url: self.url.clone(),
            after: self.timeout,
            config_key: TIMEOUT_KEY,
        }
    }

    pub(crate) fn invalid_body(&self, detail: String) -> TeacherError {
        TeacherError::InvalidBody {
            url: self.url.clone(),
            detail,
            config_key: URL_KEY,
        }
    }

    /// The error for an answer that did not hold what was asked (`top_k` = K of the request).
    pub(crate) fn parse_error(&self, e: crate::sglang::ParseError, top_k: usize) -> TeacherError {
        use crate::sglang::ParseError;
        match e {
            ParseError::Invalid(detail) => self.invalid_body(detail),
            ParseError::Missing {
                field,
                position,
                input_position,
            } => TeacherError::MissingValue {
                url: self.url.clone(),
                field,
                position,
                input_position,
                config_key: URL_KEY,
            },
            ParseError::ShortTopK { position, got } => TeacherError::ShortTopK {
                url: self.url.clone(),
                position,
                got,
                k: top_k,
                config_key: URL_KEY,
            },
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_key() {
        let e = Endpoint {
            http: reqwest::Client::new(),
            url: "http://t/generate".into(),
            api_key: Some("sk-very-secret".into()),
            timeout: Duration::from_secs(1),
        };
        let text = format!("{e:?}");
        assert!(!text.contains("sk-very-secret") && text.contains("<redacted>"));
    }
}
