//! [`ProviderClient`]: one OpenAI-compatible chat endpoint, one key, one concurrency cap.

use std::{fmt, sync::Arc, time::Duration};

use backon::Retryable;
use metrics::{counter, histogram};
use ps_core::metric_names::{
    PROVIDER_GIVE_UPS_TOTAL, PROVIDER_RATE_LIMITED_TOTAL, PROVIDER_RETRIES_TOTAL, PROVIDER_SECONDS,
    PROVIDER_UNAUTHORIZED_TOTAL,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tokio::sync::Semaphore;

use crate::error::{ProviderError, error_chain};
use crate::policy::{self, Failure, StatusFailure, snippet};

/// Settings of one provider (from `[provider]`, alias `[taotoken]`).
#[derive(Clone, Debug, PartialEq)]
pub struct ProviderConfig {
    /// The provider's name as messages show it (`provider`, or `taotoken` as the operator wrote it).
    pub name: String,
    /// The chat endpoint, `<base_url>/v1/chat/completions` (`ProviderSettings::chat_completions_url`).
    pub chat_url: String,
    /// The Bearer key; `None` sends no `Authorization` header.
    pub api_key: Option<ps_core::Secret>,
    /// The NAME of the variable the key came from (`provider.api_key_env`), for messages.
    pub key_var: Option<String>,
    /// Cap on simultaneous calls in flight, across every role and session (at least 1).
    pub max_concurrency: usize,
    /// Timeout of one attempt (connect, answer and body).
    pub timeout: Duration,
    /// Retries after the first attempt (429, 408, 409, 5xx, time-outs, connection errors).
    pub max_retries: u32,
    /// Bound of one whole call, attempts, back-off and `Retry-After` waits included; `None`: only
    /// `timeout` × attempts bounds it.
    pub deadline: Option<Duration>,
}

/// Token counts of one completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
}

/// The first choice of a chat completion.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatAnswer {
    /// `choices[0].message.content` (may be null).
    pub content: Option<String>,
    /// `message.reasoning_content` (DeepSeek-style) or `message.reasoning`.
    pub reasoning: Option<String>,
    pub finish_reason: Option<String>,
    pub usage: Option<Usage>,
    /// The model the provider says answered.
    pub model: Option<String>,
}

impl ChatAnswer {
    /// The answer's text: `content`, or `reasoning` when the content is null or blank.
    pub fn text(&self) -> Option<&str> {
        fn non_blank(s: Option<&str>) -> Option<&str> {
            s.filter(|t| !t.trim().is_empty())
        }
        non_blank(self.content.as_deref()).or_else(|| non_blank(self.reasoning.as_deref()))
    }
}

/// A client of one external OpenAI-compatible provider, shared by every judge role and session:
/// one connection pool, one key, and one semaphore of `max_concurrency` permits. Each attempt holds
/// a permit only while it is in flight (not while waiting to retry). Cheap to clone.
#[derive(Clone)]
pub struct ProviderClient {
    http: reqwest::Client,
    url: reqwest::Url,
    config: Arc<ProviderConfig>,
    permits: Arc<Semaphore>,
}

impl fmt::Debug for ProviderClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderClient")
            .field("config", &self.config)
            .field("available_permits", &self.permits.available_permits())
            .finish_non_exhaustive()
    }
}

impl ProviderClient {
    /// A client with its own connection pool. Fails on a URL that is not absolute http(s), or one
    /// that does not end in `/chat/completions`.
    pub fn new(config: ProviderConfig) -> Result<Self, ProviderError> {
        let invalid = |detail: &str| ProviderError::InvalidUrl {
            name: config.name.clone(),
            url: config.chat_url.clone(),
            detail: detail.to_owned(),
        };
        let url = reqwest::Url::parse(&config.chat_url).map_err(|e| invalid(&e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") || !url.has_host() {
            return Err(invalid("expected http(s)://host/…/v1/chat/completions"));
        }
        if !url.path().ends_with("/chat/completions") {
            return Err(invalid("the chat URL must end in /chat/completions"));
        }
        let http = ps_http::client(config.timeout).map_err(|e| ProviderError::Build {
            name: config.name.clone(),
            detail: error_chain(&e),
        })?;
        let permits = Arc::new(Semaphore::new(config.max_concurrency.max(1)));
        Ok(Self {
            http,
            url,
            config: Arc::new(config),
            permits,
        })
    }

    pub fn config(&self) -> &ProviderConfig {
        &self.config
    }

    /// The provider's name, for messages.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The chat endpoint URL.
    pub fn chat_url(&self) -> &str {
        &self.config.chat_url
    }

    /// Permits free right now (`max_concurrency` minus the attempts in flight).
    pub fn available_permits(&self) -> usize {
        self.permits.available_permits()
    }

    /// The request body of one call: `{"model", "messages", "temperature"?, "max_tokens"?, "stream": false}`.
    pub fn request_body(
        model: &str,
        messages: &[Value],
        max_tokens: Option<u32>,
        temperature: Option<f64>,
    ) -> Value {
        let mut body = Map::new();
        body.insert("model".into(), json!(model));
        body.insert("messages".into(), json!(messages));
        if let Some(t) = temperature {
            body.insert("temperature".into(), json!(t));
        }
        if let Some(m) = max_tokens {
            body.insert("max_tokens".into(), json!(m));
        }
        body.insert("stream".into(), json!(false));
        Value::Object(body)
    }

    /// One chat completion of `messages` by `model`, with retries (at most `max_retries`, waiting
    /// the provider's `Retry-After` when it gives one in (0, 60] s, else an exponential back-off
    /// with jitter). 400, 401, 403, 404 and `insufficient_quota` are not retried.
    pub async fn chat(
        &self,
        model: &str,
        messages: &[Value],
        max_tokens: Option<u32>,
        temperature: Option<f64>,
    ) -> Result<ChatAnswer, ProviderError> {
        let body = Self::request_body(model, messages, max_tokens, temperature);
        let started = tokio::time::Instant::now();
        let attempts = std::sync::atomic::AtomicU32::new(0);
        let call = (|| {
            let n = attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            self.attempt(&body, model, n)
        })
        .retry(policy::backoff(self.config.max_retries))
        .when(|f: &Failure| f.retry_reason().is_some())
        .adjust(|f, backoff| f.next_delay(backoff))
        .notify(|f, delay| self.note_retry(f, delay, model));
        let result = match self.config.deadline {
            None => call.await,
            Some(deadline) => match tokio::time::timeout(deadline, call).await {
                Ok(result) => result,
                Err(_) => {
                    counter!(PROVIDER_GIVE_UPS_TOTAL, "reason" => "deadline").increment(1);
                    return Err(ProviderError::Deadline {
                        name: self.config.name.clone(),
                        url: self.config.chat_url.clone(),
                        after: deadline,
                        attempts: attempts.load(std::sync::atomic::Ordering::Relaxed),
                    });
                }
            },
        };
        let attempts = attempts.load(std::sync::atomic::Ordering::Relaxed);
        match result {
            Ok(answer) => {
                histogram!(PROVIDER_SECONDS).record(started.elapsed().as_secs_f64());
                Ok(answer)
            }
            Err(failure) => {
                counter!(PROVIDER_GIVE_UPS_TOTAL, "reason" => failure.give_up_reason())
                    .increment(1);
                Err(self.error(failure, model, attempts))
            }
        }
    }

    fn note_retry(&self, failure: &Failure, delay: Duration, model: &str) {
        let reason = failure.retry_reason().unwrap_or("other");
        counter!(PROVIDER_RETRIES_TOTAL, "reason" => reason).increment(1);
        let status = match failure {
            Failure::Status(s) => Some(s.status),
            _ => None,
        };
        tracing::warn!(
            provider = %self.config.name,
            url = %self.config.chat_url,
            model,
            reason,
            status,
            delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            "provider call failed; retrying"
        );
    }

    /// One attempt: holds a permit while in flight, bounded by the per-call timeout.
    async fn attempt(
        &self,
        body: &Value,
        model: &str,
        attempt: u32,
    ) -> Result<ChatAnswer, Failure> {
        let _permit = self.permits.acquire().await.map_err(|_| Failure::Closed)?;
        tracing::debug!(
            provider = %self.config.name,
            url = %self.config.chat_url,
            model,
            attempt,
            "provider call"
        );
        tokio::time::timeout(self.config.timeout, self.exchange(body))
            .await
            .map_err(|_| Failure::Timeout)?
    }

    async fn exchange(&self, body: &Value) -> Result<ChatAnswer, Failure> {
        let req = ps_http::with_bearer(
            self.http.post(self.url.clone()).json(body),
            self.config.api_key.as_ref(),
        );
        let resp = req.send().await.map_err(|e| self.transport(&e))?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.map_err(|e| self.transport(&e))?;
        if !(200..300).contains(&status) {
            let failure = StatusFailure::from_response(status, &headers, &bytes);
            if status == 429 {
                let code = if failure.is_quota() {
                    "insufficient_quota"
                } else {
                    "rate_limit"
                };
                counter!(PROVIDER_RATE_LIMITED_TOTAL, "code" => code).increment(1);
            }
            if failure.is_unauthorized() {
                counter!(PROVIDER_UNAUTHORIZED_TOTAL).increment(1);
            }
            return Err(Failure::Status(failure));
        }
        parse_answer(&bytes).map_err(Failure::InvalidBody)
    }

    fn transport(&self, e: &reqwest::Error) -> Failure {
        let detail = self.redact(&error_chain(e));
        match ps_http::classify(e) {
            ps_http::Failure::Timeout => Failure::Timeout,
            ps_http::Failure::Connect => Failure::Connect(detail),
            _ => Failure::Transport(detail),
        }
    }

    /// `text` with any copy of the key replaced (providers sometimes echo part of it).
    fn redact(&self, text: &str) -> String {
        match self.config.api_key.as_ref().map(ps_core::Secret::expose) {
            Some(key) if !key.is_empty() => text.replace(key, "<redacted>"),
            _ => text.to_owned(),
        }
    }

    fn error(&self, failure: Failure, model: &str, attempts: u32) -> ProviderError {
        let name = self.config.name.clone();
        let url = self.config.chat_url.clone();
        match failure {
            Failure::Status(s) if s.is_unauthorized() => ProviderError::Unauthorized {
                name,
                url,
                key_var: self.config.key_var.clone(),
                status: s.status,
                message: self.redact(&s.message),
            },
            Failure::Status(s) if s.is_quota() => ProviderError::Quota {
                name,
                url,
                message: self.redact(&s.message),
            },
            Failure::Status(s) if s.is_transient() => ProviderError::Status {
                name,
                url,
                status: s.status,
                message: self.redact(&s.message),
                attempts,
            },
            Failure::Status(s) => ProviderError::Rejected {
                name,
                url,
                model: model.to_owned(),
                status: s.status,
                code: s.code,
                message: self.redact(&s.message),
            },
            Failure::Timeout => ProviderError::Timeout {
                name,
                url,
                after: self.config.timeout,
                attempts,
            },
            Failure::Connect(detail) => ProviderError::Connect {
                name,
                url,
                attempts,
                detail,
            },
            Failure::Transport(detail) => ProviderError::Transport {
                name,
                url,
                attempts,
                detail,
            },
            Failure::InvalidBody(detail) => ProviderError::InvalidBody {
                name,
                url,
                detail: self.redact(&detail),
            },
            Failure::Closed => ProviderError::Closed { name },
        }
    }
}

/// The first choice of a chat-completion body.
fn parse_answer(bytes: &[u8]) -> Result<ChatAnswer, String> {
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| format!("{e} (body starts with {:?})", snippet(bytes)))?;
    let Some(choice) = v.get("choices").and_then(|c| c.get(0)) else {
        if let Some(m) = v.pointer("/error/message").and_then(Value::as_str) {
            return Err(format!("an error instead of choices: {m}"));
        }
        return Err(format!(
            "no `choices[0]` (body starts with {:?})",
            snippet(bytes)
        ));
    };
    let message = choice
        .get("message")
        .ok_or_else(|| "`choices[0]` has no `message`".to_owned())?;
    let text = |key: &str| -> Result<Option<String>, String> {
        match message.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            // Some providers send content parts; keep their text.
            Some(Value::Array(parts)) => Ok(Some(
                parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join(""),
            )),
            Some(other) => Err(format!("`message.{key}` is {other}, not a string")),
        }
    };
    let reasoning = match text("reasoning_content")? {
        Some(r) => Some(r),
        None => text("reasoning")?,
    };
    Ok(ChatAnswer {
        content: text("content")?,
        reasoning,
        finish_reason: choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map(str::to_owned),
        usage: v
            .get("usage")
            .and_then(|u| serde_json::from_value(u.clone()).ok()),
        model: v.get("model").and_then(Value::as_str).map(str::to_owned),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn answers() {
        let a = parse_answer(
            br#"{"id":"x","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"\\boxed{1}"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#,
        )
        .unwrap();
        assert_eq!(a.content.as_deref(), Some("\\boxed{1}"));
        assert_eq!(a.finish_reason.as_deref(), Some("stop"));
        assert_eq!(a.usage.unwrap().total_tokens, 5);
        assert_eq!(a.model.as_deref(), Some("m"));
        assert_eq!(a.text(), Some("\\boxed{1}"));

        let a = parse_answer(
            br#"{"choices":[{"message":{"content":null,"reasoning_content":"r"},"finish_reason":"length"}]}"#,
        )
        .unwrap();
        assert_eq!((a.content, a.reasoning.as_deref()), (None, Some("r")));
        let a =
            parse_answer(br#"{"choices":[{"message":{"content":" ","reasoning":"r2"}}]}"#).unwrap();
        assert_eq!(a.text(), Some("r2"));
        let a = parse_answer(
            br#"{"choices":[{"message":{"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}}]}"#,
        )
        .unwrap();
        assert_eq!(a.text(), Some("ab"));
        let a = parse_answer(br#"{"choices":[{"message":{"content":""}}]}"#).unwrap();
        assert_eq!(a.text(), None);

        assert!(parse_answer(b"garbage").unwrap_err().contains("garbage"));
        assert!(parse_answer(br#"{"choices":[]}"#).is_err());
        assert!(
            parse_answer(br#"{"error":{"message":"overloaded"}}"#)
                .unwrap_err()
                .contains("overloaded")
        );
        assert!(parse_answer(br#"{"choices":[{"message":{"content":5}}]}"#).is_err());
        assert!(parse_answer(br#"{"choices":[{"finish_reason":"stop"}]}"#).is_err());
    }

    #[test]
    fn body_and_debug() {
        let body = ProviderClient::request_body(
            "m",
            &[json!({"role":"user","content":"hi"})],
            Some(8),
            None,
        );
        assert_eq!(
            body,
            json!({"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":8,"stream":false})
        );
        let cfg = ProviderConfig {
            name: "taotoken".into(),
            chat_url: "http://127.0.0.1:9/v1/chat/completions".into(),
            api_key: Some("sk-very-secret".into()),
            key_var: Some("TAOTOKEN_API_KEY".into()),
            max_concurrency: 2,
            timeout: Duration::from_secs(1),
            max_retries: 1,
            deadline: None,
        };
        let client = ProviderClient::new(cfg.clone()).unwrap();
        let printed = format!("{client:?} {cfg:?}");
        assert!(!printed.contains("sk-very-secret"), "{printed}");
        assert!(printed.contains("TAOTOKEN_API_KEY"));
    }

    #[test]
    fn rejects_bad_urls() {
        let cfg = |url: &str| ProviderConfig {
            name: "provider".into(),
            chat_url: url.into(),
            api_key: None,
            key_var: None,
            max_concurrency: 1,
            timeout: Duration::from_secs(1),
            max_retries: 0,
            deadline: None,
        };
        for bad in [
            "not a url",
            "ftp://h/v1/chat/completions",
            "http://h/v1",
            "unix:/x/chat/completions",
        ] {
            let err = ProviderClient::new(cfg(bad)).unwrap_err();
            assert!(matches!(err, ProviderError::InvalidUrl { .. }), "{err}");
            assert!(err.to_string().contains("provider.base_url"), "{err}");
        }
        assert!(ProviderClient::new(cfg("https://h/api/v1/chat/completions")).is_ok());
    }
}
