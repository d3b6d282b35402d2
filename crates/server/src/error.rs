//! The one place where errors become HTTP responses, in the OpenAI shape
//! `{"error": {"message", "type", "code"}}` (or, through the Messages door, Anthropic's
//! `{"type": "error", "error": {"type", "message"}}`: [`ApiError::into_messages_response`]). One
//! exhaustive match ([`ApiError::answer`]) decides status, type, code and headers; `into_response`
//! stays pure and attaches an [`ErrorReport`], which the router's edge logs once per request, in
//! the request span (`crate::router`).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use ps_sglang_client::SglangError;
use serde_json::json;

/// Every failure a client of the proxy can see.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("the request body is not valid JSON: {0}")]
    InvalidJson(String),
    #[error("{message}")]
    InvalidRequest { code: &'static str, message: String },
    #[error(
        "the request body is larger than {limit} bytes (the chat routes' limit is `server.max_body_bytes`)"
    )]
    PayloadTooLarge {
        limit: usize,
        /// The rest of the body, read and discarded after the answer ([`crate::linger`]).
        unread: crate::linger::Unread,
    },
    #[error(
        "missing or invalid API key: send `Authorization: Bearer <key>` (the chat routes also take `x-api-key: <key>`)"
    )]
    Unauthorized,
    #[error(transparent)]
    Upstream(#[from] SglangError),
    #[error("submission paused for weight update; retry in {retry_after_secs} s")]
    Paused { retry_after_secs: u64 },
    #[error("the rollout API is not enabled in this server (no sample store)")]
    RolloutDisabled,
    #[error(transparent)]
    Store(ps_core::LogError),
    #[error("encoding the answer failed: {0}")]
    Encode(String),
    #[error("{message}")]
    NotFound { code: &'static str, message: String },
    #[error(
        "{limit} upstream requests are already in flight (`sglang.max_concurrency`); retry shortly"
    )]
    Overloaded { limit: usize },
}

impl ApiError {
    pub fn invalid(code: &'static str, message: impl Into<String>) -> Self {
        Self::InvalidRequest {
            code,
            message: message.into(),
        }
    }

    /// How this error answers, decided once for every variant: status, `type`, code, headers, and
    /// how loudly the edge logs it.
    fn answer(&self) -> Answer {
        use StatusCode as S;
        let a = |status, kind, code, class| Answer {
            status,
            kind,
            code,
            class,
            retry_after: None,
        };
        match self {
            Self::InvalidJson(_) => a(S::BAD_REQUEST, INVALID, "invalid_json", Class::Client),
            Self::InvalidRequest { code, .. } => a(S::BAD_REQUEST, INVALID, code, Class::Client),
            Self::PayloadTooLarge { .. } => a(
                S::PAYLOAD_TOO_LARGE,
                INVALID,
                "body_too_large",
                Class::Client,
            ),
            Self::Unauthorized => a(
                S::UNAUTHORIZED,
                "authentication_error",
                "invalid_api_key",
                Class::Unauthorized,
            ),
            Self::Paused { retry_after_secs } => Answer {
                retry_after: Some(HeaderValue::from(*retry_after_secs)),
                ..a(
                    S::SERVICE_UNAVAILABLE,
                    "submission_paused",
                    "submission_paused",
                    Class::Client,
                )
            },
            Self::RolloutDisabled => a(
                S::SERVICE_UNAVAILABLE,
                "rollout_disabled",
                "rollout_disabled",
                Class::Client,
            ),
            Self::Store(ps_core::LogError::CommitAhead { .. }) => {
                a(S::CONFLICT, INVALID, "commit_ahead", Class::Client)
            }
            Self::Store(_) => a(
                S::INTERNAL_SERVER_ERROR,
                "store_error",
                "store_error",
                Class::Internal,
            ),
            Self::NotFound { code, .. } => a(S::NOT_FOUND, INVALID, code, Class::Client),
            Self::Encode(_) => a(
                S::INTERNAL_SERVER_ERROR,
                "server_error",
                "encode_failed",
                Class::Internal,
            ),
            Self::Overloaded { .. } => Answer {
                retry_after: Some(HeaderValue::from_static("1")),
                ..a(
                    S::TOO_MANY_REQUESTS,
                    "rate_limit_error",
                    "too_many_requests",
                    Class::Client,
                )
            },
            Self::Upstream(e) => {
                let (status, code) = match e {
                    SglangError::Connect { .. } => (S::BAD_GATEWAY, "upstream_unreachable"),
                    SglangError::Transport { .. } => (S::BAD_GATEWAY, "upstream_connection_lost"),
                    SglangError::Timeout { .. } => (S::GATEWAY_TIMEOUT, "upstream_timeout"),
                    // Upstream 4xx/5xx pass through with their status (and body).
                    SglangError::Status { status, .. } => (
                        S::from_u16(*status).unwrap_or(S::BAD_GATEWAY),
                        "upstream_status",
                    ),
                    SglangError::InvalidBody { .. } | SglangError::TooLarge { .. } => {
                        (S::BAD_GATEWAY, "upstream_invalid_response")
                    }
                    SglangError::Stream { .. } => (S::BAD_GATEWAY, "upstream_stream_broken"),
                    SglangError::StreamErrorEvent { .. } => {
                        (S::BAD_GATEWAY, "upstream_stream_error")
                    }
                };
                a(status, "upstream_error", code, Class::Upstream)
            }
        }
    }

    /// The stable snake_case code of this error.
    pub fn code(&self) -> &'static str {
        self.answer().code
    }

    /// The HTTP status this error answers with.
    pub fn status_code(&self) -> StatusCode {
        self.answer().status
    }

    /// Whether the client is at fault (4xx, refusals) rather than the upstream or this server. A
    /// trainer committing past the store's last seq (409 `commit_ahead`) is the client's fault.
    pub fn is_client_error(&self) -> bool {
        matches!(self.answer().class, Class::Client | Class::Unauthorized)
    }
}

/// The OpenAI `type` of a malformed request.
const INVALID: &str = "invalid_request_error";

/// Who is at fault, which decides how loudly the edge logs the error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// A request refused for what it is or when it came (info).
    Client,
    /// A request without a valid key (warn: someone may be probing).
    Unauthorized,
    /// The policy server failed (warn).
    Upstream,
    /// This server failed, e.g. its sample store (error).
    Internal,
}

/// How one error answers.
struct Answer {
    status: StatusCode,
    /// The OpenAI error `type`.
    kind: &'static str,
    code: &'static str,
    class: Class,
    retry_after: Option<HeaderValue>,
}

/// What the edge logs about an error answer, attached to the response as an extension by
/// `into_response` (which stays pure) and logged once by [`ErrorReport::log`] in the request span.
#[derive(Debug, Clone)]
pub struct ErrorReport {
    class: Class,
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ErrorReport {
    /// Logs the error once, at the level its class says.
    /// `chat`: the request was a chat completion, whose lines keep their long-standing messages.
    pub fn log(&self, method: &http::Method, path: &str, chat: bool) {
        let (status, code, error) = (self.status.as_u16(), self.code, &self.message);
        match self.class {
            Class::Client if chat => {
                tracing::info!(%method, path, status, code, error, "rejected chat request");
            }
            Class::Client => {
                tracing::info!(%method, path, status, code, error, "request rejected");
            }
            Class::Unauthorized => tracing::warn!(
                %method,
                path,
                status,
                code,
                "rejected a request without a valid API key"
            ),
            Class::Upstream if chat => {
                tracing::warn!(%method, path, status, code, error, "chat request failed upstream");
            }
            Class::Upstream => {
                tracing::warn!(%method, path, status, code, error, "request failed upstream");
            }
            Class::Internal => {
                tracing::error!(%method, path, status, code, error, "request failed");
            }
        }
    }
}

/// The Anthropic error `type` of a status (the Messages API's table of them).
fn anthropic_kind(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    }
}

/// The message of an upstream error body: its `error.message`, `message` or `detail` when it is
/// JSON (OpenAI's, SGLang's and vLLM's shapes), else its text (at most 2,000 bytes).
fn upstream_message(body: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let found = [
        v.pointer("/error/message"),
        v.get("message"),
        v.get("detail"),
    ]
    .into_iter()
    .flatten()
    .find_map(|m| m.as_str().map(str::to_owned));
    found.unwrap_or_else(|| {
        let text = String::from_utf8_lossy(body);
        let mut end = text.len().min(2000);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text[..end].to_owned()
    })
}

impl ApiError {
    /// This error as the Messages door answers it: the same status and headers, Anthropic's body
    /// (`{"type": "error", "error": {"type", "message"}}`); an upstream error's message is read
    /// out of its body.
    pub fn into_messages_response(self) -> Response {
        let answer = self.answer();
        let message = match &self {
            Self::Upstream(SglangError::Status { status, body, .. }) => {
                format!(
                    "the policy engine answered {status}: {}",
                    upstream_message(body)
                )
            }
            other => other.to_string(),
        };
        let report = ErrorReport {
            class: answer.class,
            status: answer.status,
            code: answer.code,
            message: message.clone(),
        };
        let body = ps_doors::messages::error_body(anthropic_kind(answer.status), &message);
        let unread = match &self {
            Self::PayloadTooLarge { unread, .. } => unread.take(),
            _ => None,
        };
        let mut resp = match unread {
            Some(rest) => crate::linger::respond(answer.status, body, rest),
            None => (answer.status, body).into_response(),
        };
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(v) = answer.retry_after {
            headers.insert(header::RETRY_AFTER, v);
        }
        resp.extensions_mut().insert(report);
        resp
    }
}

impl ApiError {
    /// This error as the Responses door answers it: OpenAI's shape always, also for an engine's
    /// error, whose own body (vLLM's `{"object": "error", …}`, SGLang's) is passed through by the
    /// chat route but read here for its message, so that a Responses client (Codex) finds
    /// `error.message` and `error.code`.
    pub fn into_openai_response(self) -> Response {
        let Self::Upstream(SglangError::Status { status, body, .. }) = &self else {
            return self.into_response();
        };
        let answer = self.answer();
        let message = format!(
            "the policy engine answered {status}: {}",
            upstream_message(body)
        );
        let report = ErrorReport {
            class: answer.class,
            status: answer.status,
            code: answer.code,
            message: message.clone(),
        };
        let kind = if answer.status.is_client_error() {
            INVALID
        } else {
            "server_error"
        };
        let mut resp = (
            answer.status,
            axum::Json(error_body(&message, kind, answer.code)),
        )
            .into_response();
        resp.extensions_mut().insert(report);
        resp
    }
}

/// The OpenAI error body.
pub fn error_body(message: &str, kind: &str, code: &str) -> serde_json::Value {
    json!({"error": {"message": message, "type": kind, "code": code}})
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let answer = self.answer();
        let report = ErrorReport {
            class: answer.class,
            status: answer.status,
            code: answer.code,
            message: self.to_string(),
        };
        let mut resp = match &self {
            Self::Upstream(SglangError::Status {
                content_type, body, ..
            }) => {
                // Upstream 4xx/5xx pass through with their body.
                let mut resp = (answer.status, body.clone()).into_response();
                let ct = content_type
                    .as_deref()
                    .and_then(|c| HeaderValue::from_str(c).ok())
                    .unwrap_or(HeaderValue::from_static("application/json"));
                resp.headers_mut().insert(header::CONTENT_TYPE, ct);
                resp
            }
            Self::PayloadTooLarge { unread, .. } => {
                let body = error_body(&report.message, answer.kind, answer.code);
                match unread.take() {
                    Some(rest) => {
                        let bytes = serde_json::to_vec(&body).unwrap_or_default();
                        crate::linger::respond(answer.status, bytes, rest)
                    }
                    None => (answer.status, axum::Json(body)).into_response(),
                }
            }
            _ => {
                let body = error_body(&report.message, answer.kind, answer.code);
                (answer.status, axum::Json(body)).into_response()
            }
        };
        let headers = resp.headers_mut();
        if answer.class == Class::Unauthorized {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(v) = answer.retry_after {
            headers.insert(header::RETRY_AFTER, v);
        }
        resp.extensions_mut().insert(report);
        resp
    }
}
