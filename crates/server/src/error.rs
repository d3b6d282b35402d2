//! The one place where errors become HTTP responses, in the OpenAI shape
//! `{"error": {"message", "type", "code"}}`.

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
    #[error("missing or invalid API key: send `Authorization: Bearer <key>`")]
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

    /// The stable snake_case code of this error.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidJson(_) => "invalid_json",
            Self::InvalidRequest { code, .. } => code,
            Self::PayloadTooLarge { .. } => "body_too_large",
            Self::Unauthorized => "invalid_api_key",
            Self::Paused { .. } => "submission_paused",
            Self::RolloutDisabled => "rollout_disabled",
            Self::Store(ps_core::LogError::CommitAhead { .. }) => "commit_ahead",
            Self::Store(_) => "store_error",
            Self::Encode(_) => "encode_failed",
            Self::Overloaded { .. } => "too_many_requests",
            Self::Upstream(e) => match e {
                SglangError::Connect { .. } => "upstream_unreachable",
                SglangError::Transport { .. } => "upstream_connection_lost",
                SglangError::Timeout { .. } => "upstream_timeout",
                SglangError::Status { .. } => "upstream_status",
                SglangError::InvalidBody { .. } => "upstream_invalid_response",
                SglangError::Stream { .. } => "upstream_stream_broken",
                SglangError::StreamErrorEvent { .. } => "upstream_stream_error",
            },
        }
    }

    /// The HTTP status this error answers with.
    pub fn status_code(&self) -> StatusCode {
        match self {
            Self::InvalidJson(_) | Self::InvalidRequest { .. } => StatusCode::BAD_REQUEST,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Paused { .. } | Self::RolloutDisabled => StatusCode::SERVICE_UNAVAILABLE,
            Self::Store(ps_core::LogError::CommitAhead { .. }) => StatusCode::CONFLICT,
            Self::Store(_) | Self::Encode(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Overloaded { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Upstream(SglangError::Status { status, .. }) => {
                StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_GATEWAY)
            }
            Self::Upstream(SglangError::Timeout { .. }) => StatusCode::GATEWAY_TIMEOUT,
            Self::Upstream(_) => StatusCode::BAD_GATEWAY,
        }
    }

    /// Whether the client (4xx) or the upstream (5xx) is at fault, for metrics.
    pub fn is_client_error(&self) -> bool {
        !matches!(self, Self::Upstream(_) | Self::Store(_) | Self::Encode(_))
    }
}

/// The OpenAI error body.
pub fn error_body(message: &str, kind: &str, code: &str) -> serde_json::Value {
    json!({"error": {"message": message, "type": kind, "code": code}})
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, kind) = match &self {
            Self::InvalidJson(_) | Self::InvalidRequest { .. } => {
                (StatusCode::BAD_REQUEST, "invalid_request_error")
            }
            Self::PayloadTooLarge { .. } => {
                (StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error")
            }
            Self::Unauthorized => (StatusCode::UNAUTHORIZED, "authentication_error"),
            Self::Paused { .. } => (StatusCode::SERVICE_UNAVAILABLE, "submission_paused"),
            Self::RolloutDisabled => (StatusCode::SERVICE_UNAVAILABLE, "rollout_disabled"),
            Self::Store(ps_core::LogError::CommitAhead { .. }) => {
                (StatusCode::CONFLICT, "invalid_request_error")
            }
            Self::Store(_) => (StatusCode::INTERNAL_SERVER_ERROR, "store_error"),
            Self::Encode(_) => (StatusCode::INTERNAL_SERVER_ERROR, "server_error"),
            Self::Overloaded { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error"),
            Self::Upstream(SglangError::Status {
                status,
                content_type,
                body,
                ..
            }) => {
                // Upstream 4xx/5xx pass through with their status and body.
                let status = StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_GATEWAY);
                let mut resp = (status, body.clone()).into_response();
                let ct = content_type
                    .as_deref()
                    .and_then(|c| HeaderValue::from_str(c).ok())
                    .unwrap_or(HeaderValue::from_static("application/json"));
                resp.headers_mut().insert(header::CONTENT_TYPE, ct);
                return resp;
            }
            Self::Upstream(SglangError::Timeout { .. }) => {
                (StatusCode::GATEWAY_TIMEOUT, "upstream_error")
            }
            Self::Upstream(_) => (StatusCode::BAD_GATEWAY, "upstream_error"),
        };
        let body = error_body(&self.to_string(), kind, self.code());
        if let Self::PayloadTooLarge { unread, .. } = &self
            && let Some(rest) = unread.take()
        {
            let bytes = serde_json::to_vec(&body).unwrap_or_default();
            return crate::linger::respond(status, bytes, rest);
        }
        let mut resp = (status, axum::Json(body)).into_response();
        match &self {
            Self::Unauthorized => {
                resp.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            Self::Paused { retry_after_secs } => {
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_secs));
            }
            Self::Overloaded { .. } => {
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        resp
    }
}
