use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use eventsource_stream::Eventsource;
use futures::{Stream, StreamExt};
use serde_json::Value;

use crate::error::SglangError;

/// The configuration key named in errors about the chat URL.
const CHAT_URL_KEY: &str = "sglang.chat_url";
const TIMEOUT_KEY: &str = "sglang.timeout_sec";
/// Largest non-streamed answer read from the upstream (a 4,096-token answer with 20 top log-probs
/// per token is about 10 MB).
pub const MAX_ANSWER_BYTES: usize = 128 * 1024 * 1024;
/// How much of an unparsable body an error message quotes.
const SNIPPET_BYTES: usize = 80;

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
#[async_trait]
pub trait PolicyClient: Send + Sync {
    /// Sends a non-streamed chat completion (`body` is its JSON) and returns the answer's bytes,
    /// unparsed ([`crate::Answer::parse`] reads them).
    async fn chat(&self, body: Bytes) -> Result<Bytes, SglangError>;
    /// Sends a streamed chat completion (`body` is its JSON); returns once the upstream answered
    /// with a success status.
    async fn chat_stream(&self, body: Bytes) -> Result<ChatEventStream, SglangError>;
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
    pub api_key: Option<ps_core::Secret>,
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
    /// The largest non-streamed answer read ([`MAX_ANSWER_BYTES`] unless set).
    max_answer_bytes: usize,
}

impl SglangClient {
    /// Reads non-streamed answers of up to `bytes` (`sglang.max_answer_mib`).
    pub fn with_max_answer_bytes(mut self, bytes: usize) -> Self {
        self.max_answer_bytes = bytes.max(1);
        self
    }

    pub fn new(config: SglangClientConfig) -> Result<Self, SglangError> {
        let health_url = health_url(&config.chat_url).ok_or_else(|| SglangError::InvalidBody {
            url: config.chat_url.clone(),
            detail: format!("`{CHAT_URL_KEY}` is not an absolute http(s) URL"),
        })?;
        let http = ps_http::ClientOptions::new(config.connect_timeout)
            .max_idle_per_host(1024)
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
            max_answer_bytes: MAX_ANSWER_BYTES,
        })
    }

    fn post(&self, body: Bytes) -> reqwest::RequestBuilder {
        ps_http::with_bearer(
            self.http
                .post(&self.config.chat_url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body),
            self.config.api_key.as_ref(),
        )
    }

    fn send_error(&self, e: reqwest::Error) -> SglangError {
        match ps_http::classify(&e) {
            ps_http::Failure::Timeout => self.timeout_error(),
            ps_http::Failure::Connect => SglangError::Connect {
                url: self.config.chat_url.clone(),
                config_key: CHAT_URL_KEY,
                source: e,
            },
            _ => SglangError::Transport {
                url: self.config.chat_url.clone(),
                source: e,
            },
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
    async fn send(&self, body: Bytes) -> Result<reqwest::Response, SglangError> {
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

impl SglangClient {
    /// What the policy server says about its model: SGLang's `GET /get_model_info`, else (when
    /// that route is missing) `GET /v1/models`'s `root` for `served_model` (vLLM). Both missing:
    /// an empty report. Unreachable, timed out, or another error status: the error, naming the URL.
    pub async fn model_info(&self, served_model: &str) -> Result<crate::ModelInfo, SglangError> {
        let sglang = self.sibling_url("/get_model_info");
        let models = self.sibling_url("/v1/models");
        match self.get_json(&sglang).await? {
            Some(v) => Ok(crate::model_info::from_sglang(&sglang, &v)),
            None => match self.get_json(&models).await? {
                Some(v) => {
                    let mut info = crate::model_info::from_models(&models, &v, served_model);
                    if !info.is_reported() {
                        info.url = format!("{sglang} and {models}");
                    }
                    Ok(info)
                }
                None => Ok(crate::ModelInfo {
                    url: format!("{sglang} and {models}"),
                    ..crate::ModelInfo::default()
                }),
            },
        }
    }

    /// A non-streamed chat completion of a JSON body, its answer parsed as JSON (for checks and
    /// tools; the proxy passes bytes through [`PolicyClient::chat`]). An answer that is not JSON is
    /// [`SglangError::InvalidBody`].
    pub async fn chat_json(&self, body: &Value) -> Result<Value, SglangError> {
        let bytes = self.chat(Bytes::from(body.to_string())).await?;
        serde_json::from_slice(&bytes).map_err(|e| SglangError::InvalidBody {
            url: self.config.chat_url.clone(),
            detail: format!(
                "{e} (body starts with {:?})",
                ps_http::head(&bytes, SNIPPET_BYTES)
            ),
        })
    }

    /// Whether the policy server returns routed experts when asked: SGLang's `GET /get_server_info`
    /// (`enable_return_routed_experts`, its server flag). `None` when the route is missing (vLLM,
    /// which returns them unasked when started with the flag) or does not say.
    pub async fn returns_routed_experts(&self) -> Result<Option<bool>, SglangError> {
        let url = self.sibling_url("/get_server_info");
        Ok(self.get_json(&url).await?.and_then(|v| {
            v.get("enable_return_routed_experts")
                .and_then(Value::as_bool)
        }))
    }

    /// `scheme://host:port/get_model_info` of the chat URL: the first URL [`Self::model_info`] asks.
    pub fn model_info_url(&self) -> String {
        self.sibling_url("/get_model_info")
    }

    /// The chat URL with `path` instead of its own path.
    fn sibling_url(&self, path: &str) -> String {
        // `health_url` was parsed by `new`.
        match url::Url::parse(&self.health_url) {
            Ok(mut u) => {
                u.set_path(path);
                u.to_string()
            }
            Err(_) => self.health_url.replace("/health", path),
        }
    }

    /// `GET url` as JSON; `None` on 404 or 405 (the route does not exist there).
    async fn get_json(&self, url: &str) -> Result<Option<Value>, SglangError> {
        let after = self.config.timeout.min(Duration::from_secs(5));
        let timeout = || SglangError::Timeout {
            url: url.to_owned(),
            after,
            config_key: TIMEOUT_KEY,
        };
        let req = ps_http::with_bearer(self.http.get(url), self.config.api_key.as_ref());
        let resp = tokio::time::timeout(after, req.send())
            .await
            .map_err(|_| timeout())?
            .map_err(|e| match self.send_error(e) {
                SglangError::Connect {
                    config_key, source, ..
                } => SglangError::Connect {
                    url: url.to_owned(),
                    config_key,
                    source,
                },
                SglangError::Transport { source, .. } => SglangError::Transport {
                    url: url.to_owned(),
                    source,
                },
                SglangError::Timeout { .. } => timeout(),
                other => other,
            })?;
        let status = resp.status().as_u16();
        if matches!(status, 404 | 405) {
            return Ok(None);
        }
        let content_type = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = tokio::time::timeout(after, resp.bytes())
            .await
            .map_err(|_| timeout())?
            .unwrap_or_default();
        if !(200..300).contains(&status) {
            return Err(SglangError::Status {
                url: url.to_owned(),
                status,
                content_type,
                body,
            });
        }
        serde_json::from_slice(&body)
            .map(Some)
            .map_err(|e| SglangError::InvalidBody {
                url: url.to_owned(),
                detail: format!(
                    "{e} (body starts with {:?})",
                    ps_http::head(&body, SNIPPET_BYTES)
                ),
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
    async fn chat(&self, body: Bytes) -> Result<Bytes, SglangError> {
        let mut resp = self.send(body).await?;
        let url = &self.config.chat_url;
        let limit = self.max_answer_bytes;
        let too_large = || SglangError::TooLarge {
            url: url.clone(),
            limit,
        };
        if resp.content_length().is_some_and(|n| n > limit as u64) {
            return Err(too_large());
        }
        // Sized from `Content-Length` when the upstream sends one, so that the `Bytes` a capture
        // job keeps until its worker takes it carries no spare capacity.
        let expected = resp
            .content_length()
            .map_or(0, |n| usize::try_from(n).unwrap_or(0).min(limit));
        let read = async {
            let mut bytes = Vec::with_capacity(expected);
            while let Some(chunk) = resp.chunk().await.map_err(|e| SglangError::InvalidBody {
                url: url.clone(),
                detail: format!("reading the body failed: {e}"),
            })? {
                if bytes.len() + chunk.len() > limit {
                    return Err(too_large());
                }
                bytes.extend_from_slice(&chunk);
            }
            Ok(bytes)
        };
        let mut bytes = tokio::time::timeout(self.config.timeout, read)
            .await
            .map_err(|_| self.timeout_error())??;
        // Without a `Content-Length` the vector grew by doubling: give back what is spare.
        if bytes.capacity() > bytes.len() + bytes.len() / 4 {
            bytes.shrink_to_fit();
        }
        Ok(Bytes::from(bytes))
    }

    async fn chat_stream(&self, body: Bytes) -> Result<ChatEventStream, SglangError> {
        let resp = self.send(body).await?;
        let url = self.config.chat_url.clone();
        let idle = self.config.timeout;
        let events = whole_lines(strip_bom(resp.bytes_stream())).eventsource();
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

/// The body cut at line breaks: each item ends with a line's end (the last may not), so that the
/// SSE parser, which reads an unfinished line again from its start with every chunk it is given,
/// reads each line once. A streamed answer's last line can be megabytes long (SGLang's routed
/// experts, base64 in one `data:` line): given chunk by chunk, its parse would be quadratic.
fn whole_lines<S, E>(body: S) -> impl Stream<Item = Result<bytes::Bytes, E>> + Send
where
    S: Stream<Item = Result<bytes::Bytes, E>> + Send + 'static,
    E: Send + 'static,
{
    struct State<S> {
        body: std::pin::Pin<Box<S>>,
        /// The start of a line not yet ended.
        pending: Vec<u8>,
        ended: bool,
    }
    futures::stream::unfold(
        State {
            body: Box::pin(body),
            pending: Vec::new(),
            ended: false,
        },
        |mut st| async move {
            if st.ended {
                return None;
            }
            loop {
                match st.body.next().await {
                    Some(Ok(chunk)) => {
                        let Some(end) = memchr::memrchr2(b'\n', b'\r', &chunk) else {
                            st.pending.extend_from_slice(&chunk);
                            continue;
                        };
                        let out = if st.pending.is_empty() {
                            chunk.slice(..=end)
                        } else {
                            let mut line = std::mem::take(&mut st.pending);
                            line.extend_from_slice(&chunk[..=end]);
                            bytes::Bytes::from(line)
                        };
                        st.pending.extend_from_slice(&chunk[end + 1..]);
                        return Some((Ok(out), st));
                    }
                    Some(Err(e)) => return Some((Err(e), st)),
                    None => {
                        st.ended = true;
                        if st.pending.is_empty() {
                            return None;
                        }
                        return Some((Ok(bytes::Bytes::from(std::mem::take(&mut st.pending))), st));
                    }
                }
            }
        },
    )
}

/// Normalises an SSE body for `eventsource-stream` 0.2.3: drops the UTF-8 byte-order marks at its
/// start (the format says to ignore one; the parser panics on them), even split across chunks, and
/// ends the body with a line feed, so that a last event terminated by a bare CR (legal SSE) is
/// dispatched too.
fn strip_bom<S, E>(body: S) -> impl Stream<Item = Result<bytes::Bytes, E>> + Send
where
    S: Stream<Item = Result<bytes::Bytes, E>> + Send + 'static,
    E: Send + 'static,
{
    struct State<S> {
        body: std::pin::Pin<Box<S>>,
        /// The start of the body, while it may still be byte-order marks.
        head: Option<Vec<u8>>,
        ended: bool,
    }
    futures::stream::unfold(
        State {
            body: Box::pin(body),
            head: Some(Vec::new()),
            ended: false,
        },
        |mut st| async move {
            if st.ended {
                return None;
            }
            loop {
                match st.body.next().await {
                    Some(Ok(chunk)) => {
                        let Some(mut h) = st.head.take() else {
                            return Some((Ok(chunk), st));
                        };
                        h.extend_from_slice(&chunk);
                        while h.starts_with(BOM) {
                            h.drain(..BOM.len());
                        }
                        if BOM.starts_with(&h) {
                            st.head = Some(h); // empty, or a partial mark: wait for more
                            continue;
                        }
                        return Some((Ok(bytes::Bytes::from(h)), st));
                    }
                    Some(Err(e)) => return Some((Err(e), st)),
                    None => {
                        st.ended = true;
                        return Some((Ok(bytes::Bytes::from_static(b"\n")), st));
                    }
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn normalised(chunks: Vec<&'static [u8]>) -> Vec<u8> {
        let chunks: Vec<Result<bytes::Bytes, ()>> = chunks
            .into_iter()
            .map(|c| Ok(bytes::Bytes::from_static(c)))
            .collect();
        let out: Vec<_> = strip_bom(futures::stream::iter(chunks)).collect().await;
        out.into_iter()
            .flat_map(|c| c.expect("no error").to_vec())
            .collect()
    }

    #[tokio::test]
    async fn leading_boms_are_dropped_even_when_split_and_the_body_ends_with_a_line_feed() {
        assert_eq!(
            normalised(vec![b"\xEF", b"\xBB\xBFdata: x\n\n"]).await,
            b"data: x\n\n\n"
        );
        assert_eq!(
            normalised(vec![b"\xEF\xBB\xBF\xEF\xBB\xBFdata: y\r\r"]).await,
            b"data: y\r\r\n"
        );
        assert_eq!(normalised(vec![b"d"]).await, b"d\n");
        assert_eq!(normalised(vec![b"data: z\n\n"]).await, b"data: z\n\n\n");
    }

    /// Every item but the last ends a line; the bytes are the body's, in order; and the events
    /// parsed are those of the body however it was chunked (a 1 MB line in 1 kB pieces).
    #[tokio::test]
    async fn the_parser_is_handed_whole_lines() {
        let long = format!(
            "data: {{\"sglext\":{{\"routed_experts\":\"{}\"}}}}",
            "A".repeat(1 << 20)
        );
        let body = format!("data: {{\"a\":1}}\r\n\r\n{long}\n\ndata: [DONE]\n\n");
        let chunks: Vec<Result<bytes::Bytes, ()>> = body
            .as_bytes()
            .chunks(1000)
            .map(|c| Ok(bytes::Bytes::copy_from_slice(c)))
            .collect();
        let items: Vec<bytes::Bytes> = whole_lines(futures::stream::iter(chunks.clone()))
            .map(|c| c.expect("no error"))
            .collect()
            .await;
        let (last, rest) = items.split_last().unwrap();
        assert!(rest.iter().all(|c| matches!(c.last(), Some(b'\n' | b'\r'))));
        let joined: Vec<u8> = items.iter().flat_map(|c| c.to_vec()).collect();
        assert_eq!(joined, body.as_bytes());
        assert!(last.ends_with(b"\n"));
        let events: Vec<String> = whole_lines(futures::stream::iter(chunks))
            .eventsource()
            .map(|e| e.expect("event").data)
            .collect()
            .await;
        assert_eq!(events.len(), 3);
        assert_eq!(events[0], "{\"a\":1}");
        assert_eq!(events[1].len(), long.len() - "data: ".len());
        assert_eq!(events[2], "[DONE]");
        // A body that does not end its last line: that line still comes out.
        let tail: Vec<Result<bytes::Bytes, ()>> = vec![Ok(bytes::Bytes::from_static(b"a\nb"))];
        let out: Vec<_> = whole_lines(futures::stream::iter(tail)).collect().await;
        assert_eq!(out.len(), 2);
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
