use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;
use eventsource_stream::Eventsource;
use futures::{Stream, StreamExt};
use serde_json::Value;

use crate::error::SglangError;

/// The configuration key named in errors about the chat URL.
const CHAT_URL_KEY: &str = "sglang.chat_url";
const TIMEOUT_KEY: &str = "sglang.timeout_sec";

/// One server-sent event of a streamed chat completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    /// The `data:` payload of one chunk (a JSON object, not yet parsed).
    Data(String),
    /// `data: [DONE]`: the upstream finished the stream.
    Done,
}

pub type ChatEventStream = Pin<Box<dyn Stream<Item = Result<StreamEvent, SglangError>> + Send>>;

/// The policy model's chat endpoint, as the server sees it.
#[cfg_attr(any(test, feature = "test-support"), mockall::automock)]
#[async_trait]
pub trait PolicyClient: Send + Sync {
    /// Sends a non-streamed chat completion and returns the parsed JSON answer.
    async fn chat(&self, body: &Value) -> Result<Value, SglangError>;
    /// Sends a streamed chat completion; returns once the upstream answered with a success status.
    async fn chat_stream(&self, body: &Value) -> Result<ChatEventStream, SglangError>;
    /// Whether the upstream's `/health` answers 200.
    async fn health(&self) -> Result<(), SglangError>;
    /// The chat URL, for messages.
    fn chat_url(&self) -> &str;
}

/// Settings of [`SglangClient`].
#[derive(Debug, Clone)]
pub struct SglangClientConfig {
    pub chat_url: String,
    /// Sent as `Authorization: Bearer` when set.
    pub api_key: Option<String>,
    /// Whole-answer timeout of a non-streamed call; time to the first byte and between two chunks of
    /// a streamed one.
    pub timeout: Duration,
    pub connect_timeout: Duration,
}

/// [`PolicyClient`] over HTTP with `reqwest`; one connection pool, reused.
#[derive(Debug, Clone)]
pub struct SglangClient {
    http: reqwest::Client,
    config: SglangClientConfig,
    health_url: String,
}

impl SglangClient {
    pub fn new(config: SglangClientConfig) -> Result<Self, SglangError> {
        let health_url = health_url(&config.chat_url).ok_or_else(|| SglangError::InvalidBody {
            url: config.chat_url.clone(),
            detail: format!("`{CHAT_URL_KEY}` is not an absolute http(s) URL"),
        })?;
        let http = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .tcp_nodelay(true)
            .pool_max_idle_per_host(1024)
            .build()
            .map_err(|source| SglangError::Connect {
                url: config.chat_url.clone(),
                config_key: CHAT_URL_KEY,
                source,
            })?;
        Ok(Self {
            http,
            config,
            health_url,
        })
    }

    fn post(&self, body: &Value) -> reqwest::RequestBuilder {
        let mut req = self.http.post(&self.config.chat_url).json(body);
        if let Some(key) = &self.config.api_key {
            req = req.bearer_auth(key);
        }
        req
    }

    fn send_error(&self, e: reqwest::Error) -> SglangError {
        if e.is_timeout() {
            self.timeout_error()
        } else if e.is_connect() {
            SglangError::Connect {
                url: self.config.chat_url.clone(),
                config_key: CHAT_URL_KEY,
                source: e,
            }
        } else {
            SglangError::Transport {
                url: self.config.chat_url.clone(),
                source: e,
            }
        }
    }

    fn timeout_error(&self) -> SglangError {
        SglangError::Timeout {
            url: self.config.chat_url.clone(),
            after: self.config.timeout,
            config_key: TIMEOUT_KEY,
        }
    }

    /// Sends the request and returns the response once its status is a success; otherwise reads the
    /// error body into [`SglangError::Status`].
    async fn send(&self, body: &Value) -> Result<reqwest::Response, SglangError> {
        let resp = tokio::time::timeout(self.config.timeout, self.post(body).send())
            .await
            .map_err(|_| self.timeout_error())?
            .map_err(|e| self.send_error(e))?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = tokio::time::timeout(self.config.timeout, resp.bytes())
            .await
            .map_err(|_| self.timeout_error())?
            .unwrap_or_default();
        Err(SglangError::Status {
            url: self.config.chat_url.clone(),
            status,
            content_type,
            body,
        })
    }
}

/// `scheme://host:port/health` for a chat URL.
fn health_url(chat_url: &str) -> Option<String> {
    let mut u = url::Url::parse(chat_url).ok()?;
    if !matches!(u.scheme(), "http" | "https") {
        return None;
    }
    u.set_path("/health");
    u.set_query(None);
    Some(u.to_string())
}

#[async_trait]
impl PolicyClient for SglangClient {
    async fn chat(&self, body: &Value) -> Result<Value, SglangError> {
        let resp = self.send(body).await?;
        let bytes = tokio::time::timeout(self.config.timeout, resp.bytes())
            .await
            .map_err(|_| self.timeout_error())?
            .map_err(|e| SglangError::InvalidBody {
                url: self.config.chat_url.clone(),
                detail: format!("reading the body failed: {e}"),
            })?;
        serde_json::from_slice(&bytes).map_err(|e| SglangError::InvalidBody {
            url: self.config.chat_url.clone(),
            detail: format!("{e} (body starts with {:?})", snippet(&bytes)),
        })
    }

    async fn chat_stream(&self, body: &Value) -> Result<ChatEventStream, SglangError> {
        let resp = self.send(body).await?;
        let url = self.config.chat_url.clone();
        let idle = self.config.timeout;
        let events = strip_bom(resp.bytes_stream()).eventsource();
        let stream = futures::stream::unfold(
            (Box::pin(events), false, url),
            move |(mut events, finished, url)| async move {
                if finished {
                    return None;
                }
                let item = match tokio::time::timeout(idle, events.next()).await {
                    Err(_) => Err(SglangError::Stream {
                        url: url.clone(),
                        detail: format!("no chunk for {idle:?} (raise `{TIMEOUT_KEY}`)"),
                    }),
                    Ok(None) => Err(SglangError::Stream {
                        url: url.clone(),
                        detail: "the stream ended without `data: [DONE]`".into(),
                    }),
                    Ok(Some(Err(e))) => Err(SglangError::Stream {
                        url: url.clone(),
                        detail: e.to_string(),
                    }),
                    Ok(Some(Ok(ev))) if ev.data.trim() == "[DONE]" => Ok(StreamEvent::Done),
                    Ok(Some(Ok(ev))) => Ok(StreamEvent::Data(ev.data)),
                };
                // After [DONE] or an error the stream is over.
                let last = !matches!(item, Ok(StreamEvent::Data(_)));
                Some((item, (events, last, url)))
            },
        );
        Ok(Box::pin(stream))
    }

    async fn health(&self) -> Result<(), SglangError> {
        let after = self.config.timeout.min(Duration::from_secs(5));
        let resp = tokio::time::timeout(after, self.http.get(&self.health_url).send())
            .await
            .map_err(|_| SglangError::Timeout {
                url: self.health_url.clone(),
                after,
                config_key: TIMEOUT_KEY,
            })?
            .map_err(|e| self.send_error(e))?;
        if resp.status().is_success() {
            Ok(())
        } else {
            Err(SglangError::Status {
                url: self.health_url.clone(),
                status: resp.status().as_u16(),
                content_type: None,
                body: bytes::Bytes::new(),
            })
        }
    }

    fn chat_url(&self) -> &str {
        &self.config.chat_url
    }
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Drops a UTF-8 byte-order mark at the start of a body (the SSE format says to ignore it), even when
/// it arrives split across chunks. `eventsource-stream` 0.2.3 panics on one.
fn strip_bom<S, E>(body: S) -> impl Stream<Item = Result<bytes::Bytes, E>> + Send
where
    S: Stream<Item = Result<bytes::Bytes, E>> + Send + 'static,
    E: Send + 'static,
{
    futures::stream::unfold(
        (Box::pin(body), Some(Vec::new())),
        |(mut body, mut head)| async move {
            loop {
                match body.next().await {
                    Some(Ok(chunk)) => {
                        let Some(mut h) = head.take() else {
                            return Some((Ok(chunk), (body, None)));
                        };
                        h.extend_from_slice(&chunk);
                        if h.len() < BOM.len() && BOM.starts_with(&h) {
                            head = Some(h); // could still be a BOM: wait for more
                            continue;
                        }
                        let rest = if h.starts_with(BOM) {
                            h.split_off(BOM.len())
                        } else {
                            h
                        };
                        if rest.is_empty() {
                            continue;
                        }
                        return Some((Ok(bytes::Bytes::from(rest)), (body, None)));
                    }
                    Some(Err(e)) => return Some((Err(e), (body, head))),
                    None => {
                        return head
                            .filter(|h| !h.is_empty() && !BOM.starts_with(h))
                            .map(|h| (Ok(bytes::Bytes::from(h)), (body, None)));
                    }
                }
            }
        },
    )
}

fn snippet(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(80)]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_leading_bom_is_dropped_even_when_split() {
        let chunks: Vec<Result<bytes::Bytes, ()>> = vec![
            Ok(bytes::Bytes::from_static(b"\xEF")),
            Ok(bytes::Bytes::from_static(b"\xBB\xBFdata: x\n\n")),
        ];
        let out: Vec<_> = strip_bom(futures::stream::iter(chunks)).collect().await;
        assert_eq!(out, vec![Ok(bytes::Bytes::from_static(b"data: x\n\n"))]);
        let plain: Vec<Result<bytes::Bytes, ()>> =
            vec![Ok(bytes::Bytes::from_static(b"data: y\n\n"))];
        let out: Vec<_> = strip_bom(futures::stream::iter(plain)).collect().await;
        assert_eq!(out, vec![Ok(bytes::Bytes::from_static(b"data: y\n\n"))]);
        let short: Vec<Result<bytes::Bytes, ()>> = vec![Ok(bytes::Bytes::from_static(b"d"))];
        let out: Vec<_> = strip_bom(futures::stream::iter(short)).collect().await;
        assert_eq!(out, vec![Ok(bytes::Bytes::from_static(b"d"))]);
    }

    #[test]
    fn health_url_replaces_path() {
        assert_eq!(
            health_url("http://127.0.0.1:30001/v1/chat/completions?x=1").as_deref(),
            Some("http://127.0.0.1:30001/health")
        );
        assert_eq!(health_url("ftp://x/y"), None);
        assert_eq!(health_url("not a url"), None);
    }
}
