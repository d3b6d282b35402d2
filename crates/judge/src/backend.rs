//! The SGLang `/generate` implementation of the judge transport port ([`JudgeBackend`]).

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use ps_chat_template::ChatTokenizer;
use ps_core::ports::{CallError, JudgeBackend, with_permit};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::error::{JudgeError, MODEL_DIR_KEY, ROUTER_URL_KEY, TIMEOUT_KEY, error_chain};

/// Error-body excerpts and messages, shared by every client crate.
use ps_http::{error_message, snippet};

/// Settings of [`SglangJudge`] (from `[prm]`).
#[derive(Debug, Clone, PartialEq)]
pub struct SglangJudgeConfig {
    /// The judge's `/generate` URL (`prm.router_url`).
    pub router_url: String,
    /// Whole-call timeout: connect, answer and body (`prm.timeout_sec`).
    pub timeout: Duration,
    /// Sampling temperature (`prm.temperature`).
    pub temperature: f64,
    /// Generation budget of one call (`prm.max_new_tokens`).
    pub max_new_tokens: u32,
}

/// [`JudgeBackend`] over SGLang's native `POST /generate`: the messages are rendered with the judge
/// tokenizer's chat template (with the generation prompt), or joined with `"\n"` without a tokenizer,
/// and sent as one text prompt (`docs/upstream-protocols.md` 2.4). One `reqwest` client is shared by
/// every call.
#[derive(Debug, Clone)]
pub struct SglangJudge {
    http: reqwest::Client,
    config: SglangJudgeConfig,
    tokenizer: Option<Arc<ChatTokenizer>>,
}

impl SglangJudge {
    /// A judge with its own connection pool.
    pub fn new(
        config: SglangJudgeConfig,
        tokenizer: Option<Arc<ChatTokenizer>>,
    ) -> Result<Self, JudgeError> {
        let http = ps_http::client(config.timeout).map_err(|e| JudgeError::Connect {
            url: config.router_url.clone(),
            config_key: ROUTER_URL_KEY,
            detail: error_chain(&e),
            source: Some(e),
        })?;
        Self::with_client(http, config, tokenizer)
    }

    /// A judge sharing `http`'s connection pool.
    pub fn with_client(
        http: reqwest::Client,
        config: SglangJudgeConfig,
        tokenizer: Option<Arc<ChatTokenizer>>,
    ) -> Result<Self, JudgeError> {
        let invalid = |detail: String| JudgeError::InvalidUrl {
            url: config.router_url.clone(),
            detail,
            config_key: ROUTER_URL_KEY,
        };
        let url = reqwest::Url::parse(&config.router_url).map_err(|e| invalid(e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") || !url.has_host() {
            return Err(invalid("expected http://host[:port]/generate".to_owned()));
        }
        Ok(Self {
            http,
            config,
            tokenizer,
        })
    }

    pub fn config(&self) -> &SglangJudgeConfig {
        &self.config
    }

    /// The `/generate` body for one vote on `text` (a rendered prompt).
    pub fn request_body(&self, text: &str) -> Value {
        json!({
            "text": text,
            "sampling_params": {
                "temperature": self.config.temperature,
                "top_p": 1.0,
                "top_k": -1,
                "max_new_tokens": self.config.max_new_tokens,
                "skip_special_tokens": false,
                "no_stop_trim": true,
                "spaces_between_special_tokens": false,
            },
            "return_logprob": false,
        })
    }

    /// The prompt text of `messages`: the judge chat template with the generation prompt, rendered on
    /// the blocking pool, or the contents joined with `"\n"` without a tokenizer.
    pub async fn render(&self, messages: &[Value]) -> Result<String, JudgeError> {
        let Some(tok) = self.tokenizer.clone() else {
            return Ok(join_contents(messages));
        };
        let messages = messages.to_vec();
        let render_error = |detail: String| JudgeError::Render {
            detail,
            config_key: MODEL_DIR_KEY,
        };
        tokio::task::spawn_blocking(move || tok.render(&messages, None, true, None))
            .await
            .map_err(|e| render_error(e.to_string()))?
            .map_err(|e| render_error(error_chain(&e)))
    }

    /// One completion of `messages` ([`JudgeBackend::complete`] with this crate's own error).
    pub async fn complete(&self, messages: &[Value]) -> Result<String, JudgeError> {
        let body = self.encoded_body(messages).await?;
        self.send_body(body).await
    }

    /// The `/generate` body for `messages` as JSON bytes: [`SglangJudge::render`], then
    /// [`SglangJudge::request_body`].
    async fn encoded_body(&self, messages: &[Value]) -> Result<bytes::Bytes, JudgeError> {
        let text = self.render(messages).await?;
        let body =
            serde_json::to_vec(&self.request_body(&text)).map_err(|e| JudgeError::Render {
                detail: format!("the request body does not serialize: {e}"),
                config_key: MODEL_DIR_KEY,
            })?;
        Ok(body.into())
    }

    /// One call with an encoded body, bounded by the whole-call timeout.
    async fn send_body(&self, body: bytes::Bytes) -> Result<String, JudgeError> {
        tokio::time::timeout(self.config.timeout, self.exchange(body))
            .await
            .map_err(|_| self.timeout_error())?
    }

    fn url(&self) -> &str {
        &self.config.router_url
    }

    fn send_error(&self, e: reqwest::Error) -> JudgeError {
        let kind = ps_http::classify(&e);
        if kind == ps_http::Failure::Timeout {
            return self.timeout_error();
        }
        let detail = error_chain(&e);
        if kind == ps_http::Failure::Connect {
            JudgeError::Connect {
                url: self.url().to_owned(),
                config_key: ROUTER_URL_KEY,
                detail,
                source: Some(e),
            }
        } else {
            JudgeError::Transport {
                url: self.url().to_owned(),
                config_key: ROUTER_URL_KEY,
                detail,
                source: Some(e),
            }
        }
    }

    fn timeout_error(&self) -> JudgeError {
        JudgeError::Timeout {
            url: self.url().to_owned(),
            after: self.config.timeout,
            config_key: TIMEOUT_KEY,
        }
    }

    /// POST `body` (JSON) and read the whole answer (no timeout here; the caller bounds it).
    async fn exchange(&self, body: bytes::Bytes) -> Result<String, JudgeError> {
        let resp = self
            .http
            .post(self.url())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| self.send_error(e))?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| self.send_error(e))?;
        if !status.is_success() {
            return Err(JudgeError::Status {
                url: self.url().to_owned(),
                status: status.as_u16(),
                body: error_message(&bytes),
                config_key: ROUTER_URL_KEY,
            });
        }
        reply_text(&bytes).map_err(|detail| JudgeError::InvalidBody {
            url: self.url().to_owned(),
            detail,
            config_key: ROUTER_URL_KEY,
        })
    }
}

#[async_trait]
impl JudgeBackend for SglangJudge {
    async fn complete(&self, messages: &[Value]) -> Result<String, CallError> {
        Ok(SglangJudge::complete(self, messages).await?)
    }

    /// The prompt is rendered and the body serialized once for the `m` votes; each vote is then
    /// its own POST with its own timeout, answer or failure. A render that fails fails every vote
    /// with its error, as each vote's own render would have.
    async fn complete_votes(
        &self,
        messages: &[Value],
        m: usize,
        semaphore: Option<&Semaphore>,
    ) -> Vec<Result<String, String>> {
        if m == 0 {
            return Vec::new();
        }
        // The render holds a permit too, as each vote's own render did: turns queued behind the
        // judge's concurrency neither render nor keep a body before their turn comes.
        let body = with_permit(semaphore, async { self.encoded_body(messages).await }).await;
        let body = match body {
            Ok(body) => body,
            Err(e) => return vec![Err(e); m],
        };
        let one = || with_permit(semaphore, self.send_body(body.clone()));
        futures::future::join_all((0..m).map(|_| one())).await
    }

    fn describe(&self) -> String {
        format!("sglang /generate at {}", self.url())
    }
}

/// The contents of `messages` joined with `"\n"` (the prompt when no judge tokenizer is configured).
fn join_contents(messages: &[Value]) -> String {
    messages
        .iter()
        .map(|m| match m.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The judge's text from a `/generate` answer: `text`, or its first element when it is a list; a
/// batch answer (a list of results) gives its first result's text.
fn reply_text(bytes: &[u8]) -> Result<String, String> {
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| format!("{e} (body starts with {:?})", snippet(bytes)))?;
    let result = match &v {
        Value::Array(items) => items
            .first()
            .ok_or_else(|| "an empty list of results".to_owned())?,
        other => other,
    };
    match result.get("text") {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(items)) => match items.first() {
            Some(Value::String(s)) => Ok(s.clone()),
            _ => Err("`text` is a list without a string first element".to_owned()),
        },
        _ => Err(format!(
            "no `text` string (body starts with {:?})",
            snippet(bytes)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_text_shapes() {
        assert_eq!(reply_text(br#"{"text":"a"}"#).unwrap(), "a");
        assert_eq!(reply_text(br#"{"text":["b","c"]}"#).unwrap(), "b");
        assert_eq!(reply_text(br#"[{"text":"d"},{"text":"e"}]"#).unwrap(), "d");
        assert!(reply_text(b"not json").unwrap_err().contains("not json"));
        assert!(reply_text(br#"{"output_ids":[]}"#).is_err());
        assert!(reply_text(br#"{"text":[]}"#).is_err());
        assert!(reply_text(b"[]").is_err());
    }

    #[test]
    fn join_without_tokenizer() {
        let msgs = vec![
            json!({"role": "system", "content": "S"}),
            json!({"role": "user", "content": "U"}),
        ];
        assert_eq!(join_contents(&msgs), "S\nU");
    }

    #[test]
    fn rejects_bad_urls() {
        let cfg = |url: &str| SglangJudgeConfig {
            router_url: url.into(),
            timeout: Duration::from_secs(1),
            temperature: 0.6,
            max_new_tokens: 16,
        };
        for bad in ["not a url", "ftp://x/generate", "unix:/tmp/sock"] {
            let err = SglangJudge::new(cfg(bad), None).unwrap_err();
            assert!(matches!(err, JudgeError::InvalidUrl { .. }), "{err}");
            assert!(err.to_string().contains(ROUTER_URL_KEY), "{err}");
        }
        assert!(SglangJudge::new(cfg("http://127.0.0.1:1/generate"), None).is_ok());
    }
}
