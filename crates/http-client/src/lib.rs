//! Outbound HTTP, once: every crate that calls an upstream (the SGLang policy, PRM and teacher
//! endpoints, a hosted provider, and the operator checks) builds its `reqwest` client here, sends
//! its key through [`with_bearer`], sorts a failed send with [`classify`] and quotes an error body
//! with [`error_message`] / [`snippet`]. Each caller wraps the outcome in its own error enum, whose
//! messages name its own configuration keys.
//!
//! Client rules: the connect phase is bounded by the caller's timeout; `TCP_NODELAY` is on; idle
//! connections are kept alive in the client's pool (one pool per client, reused for every call);
//! proxies named by the environment (`HTTPS_PROXY`, …) are honoured, as `reqwest` does by default,
//! unless [`ClientOptions::no_proxy`] is set.
//!
//! This crate depends on `ps-core` and `reqwest` only: no server, no configuration.

use std::time::Duration;

use ps_core::Secret;

/// `e` and its causes joined (one definition for the product, in `ps-core`).
pub use ps_core::errors::{SNIPPET_CHARS, error_chain, snippet};

/// How a client is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientOptions {
    /// Bound of the connect phase of every call.
    pub connect_timeout: Duration,
    /// Most idle connections kept per host; `None`: `reqwest`'s default (no limit).
    pub max_idle_per_host: Option<usize>,
    /// Ignore the proxy variables of the environment.
    pub no_proxy: bool,
}

impl ClientOptions {
    /// The defaults with the given connect timeout.
    pub fn new(connect_timeout: Duration) -> Self {
        Self {
            connect_timeout,
            max_idle_per_host: None,
            no_proxy: false,
        }
    }

    /// Keeps at most `n` idle connections per host.
    pub fn max_idle_per_host(mut self, n: usize) -> Self {
        self.max_idle_per_host = Some(n);
        self
    }

    /// Builds the client (fails only when the TLS back-end cannot be initialised).
    pub fn build(self) -> Result<reqwest::Client, reqwest::Error> {
        let mut b = reqwest::Client::builder()
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true);
        if let Some(n) = self.max_idle_per_host {
            b = b.pool_max_idle_per_host(n);
        }
        if self.no_proxy {
            b = b.no_proxy();
        }
        b.build()
    }
}

/// A client with the default rules and the given connect timeout.
pub fn client(connect_timeout: Duration) -> Result<reqwest::Client, reqwest::Error> {
    ClientOptions::new(connect_timeout).build()
}

/// `req` with `Authorization: Bearer <key>` when a key is set: the one place a key leaves its
/// [`Secret`]. `bearer_auth` marks the header sensitive, so `reqwest` does not print it either.
pub fn with_bearer(req: reqwest::RequestBuilder, key: Option<&Secret>) -> reqwest::RequestBuilder {
    match key {
        Some(key) => req.bearer_auth(key.expose()),
        None => req,
    }
}

/// What kind of failure a `reqwest` error is, checked in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// A timeout of `reqwest` itself (the callers' own `tokio` timeouts are theirs to report).
    Timeout,
    /// The connection could not be made (refused, DNS, TLS handshake).
    Connect,
    /// An error status turned into an error (`error_for_status`).
    Status,
    /// Reading or decoding the body failed.
    Body,
    /// Anything else on the way (request building, redirects, a reset mid-request).
    Transport,
}

impl Failure {
    /// Whether the caller should report it as a transport failure (neither a timeout nor a
    /// failed connect): the three kinds the clients do not tell apart in their messages.
    pub fn is_transport(self) -> bool {
        matches!(self, Self::Status | Self::Body | Self::Transport)
    }
}

/// Sorts a failed send or body read.
pub fn classify(e: &reqwest::Error) -> Failure {
    if e.is_timeout() {
        Failure::Timeout
    } else if e.is_connect() {
        Failure::Connect
    } else if e.is_status() {
        Failure::Status
    } else if e.is_body() || e.is_decode() {
        Failure::Body
    } else {
        Failure::Transport
    }
}

/// The first `max_bytes` bytes of a body, as text (a cut character becomes `�`): the short
/// quote of a body that failed to parse.
pub fn head(bytes: &[u8], max_bytes: usize) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(max_bytes)]).into_owned()
}

/// The message an upstream error body carries, whatever its shape: the nested
/// `{"error":{"message"}}` (SGLang `/generate`, vLLM, hosted providers), the flat `{"message"}`
/// (SGLang's OpenAI routes, older vLLM), `{"error":"…"}`, FastAPI's `{"detail"}`; `None` when the
/// body is none of these.
pub fn body_message(bytes: &[u8]) -> Option<String> {
    let parsed: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    parsed
        .pointer("/error/message")
        .or_else(|| parsed.get("message"))
        .or_else(|| parsed.get("error"))
        .or_else(|| parsed.get("detail"))
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned)
}

/// [`body_message`] cut to [`SNIPPET_CHARS`] characters, else `(empty body)`, else the start of
/// the body: what an error message quotes of an upstream's answer.
pub fn error_message(bytes: &[u8]) -> String {
    match body_message(bytes) {
        Some(m) => m.chars().take(SNIPPET_CHARS).collect(),
        None if bytes.is_empty() => "(empty body)".to_owned(),
        None => snippet(bytes),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn error_message_shapes() {
        assert_eq!(error_message(br#"{"error":{"message":"bad"}}"#), "bad");
        assert_eq!(
            error_message(br#"{"object":"error","message":"flat"}"#),
            "flat"
        );
        assert_eq!(
            error_message(br#"{"error":"Unauthorized"}"#),
            "Unauthorized"
        );
        assert_eq!(error_message(br#"{"detail":"Not Found"}"#), "Not Found");
        assert_eq!(error_message(b"oops"), "oops");
        assert_eq!(error_message(b""), "(empty body)");
        assert_eq!(
            error_message("x".repeat(1000).as_bytes()).len(),
            SNIPPET_CHARS
        );
        assert_eq!(body_message(b"[1]"), None);
        assert_eq!(head(b"abcdef", 3), "abc");
        assert_eq!(head(b"ab", 3), "ab");
    }

    #[tokio::test]
    async fn a_refused_connection_is_connect() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let http = ClientOptions {
            no_proxy: true,
            ..ClientOptions::new(Duration::from_secs(2))
        }
        .build()
        .unwrap();
        let e = http
            .get(format!("http://127.0.0.1:{port}/"))
            .send()
            .await
            .unwrap_err();
        assert_eq!(classify(&e), Failure::Connect);
        assert!(!classify(&e).is_transport());
    }

    #[test]
    fn the_key_goes_in_a_sensitive_header() {
        let http = client(Duration::from_secs(1)).unwrap();
        let key = Secret::from("sk-abc");
        let req = with_bearer(http.get("http://127.0.0.1:9/"), Some(&key))
            .build()
            .unwrap();
        let header = &req.headers()[reqwest::header::AUTHORIZATION];
        assert_eq!(header, "Bearer sk-abc");
        assert!(header.is_sensitive());
        let req = with_bearer(http.get("http://127.0.0.1:9/"), None)
            .build()
            .unwrap();
        assert!(!req.headers().contains_key(reqwest::header::AUTHORIZATION));
    }
}
