//! The retry policy of provider calls (`docs/upstream-protocols.md` section 4, after openai-python):
//! what one failed attempt was, whether it is retried, and how long to wait before the next one.

use std::time::{Duration, SystemTime};

use backon::ExponentialBuilder;
use reqwest::header::HeaderMap;
use serde_json::Value;

/// First back-off delay; it doubles at each retry.
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(500);
/// Longest back-off delay.
pub const MAX_BACKOFF: Duration = Duration::from_secs(8);
/// Back-off delays are shortened by up to this fraction at random.
pub const JITTER: f64 = 0.25;
/// `Retry-After` / `retry-after-ms` values above this are ignored (the back-off applies instead).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// Longest excerpt of an error body kept in a message.
const SNIPPET_CHARS: usize = 300;

/// One failed attempt.
#[derive(Debug)]
pub(crate) enum Failure {
    Status(StatusFailure),
    /// The attempt did not finish within the per-call timeout.
    Timeout,
    /// No connection could be made.
    Connect(String),
    /// The connection broke before the whole answer arrived.
    Transport(String),
    /// A 2xx answer that is not a chat completion.
    InvalidBody(String),
    /// The concurrency limiter was closed.
    Closed,
}

/// A non-2xx answer.
#[derive(Debug)]
pub(crate) struct StatusFailure {
    pub status: u16,
    /// `error.message` of the nested OpenAI error body, else the start of the body.
    pub message: String,
    /// `error.code`, else `error.type`.
    pub code: Option<String>,
    /// From `retry-after-ms` or `Retry-After`, when within (0, 60] s.
    pub retry_after: Option<Duration>,
    /// `x-should-retry: true|false`.
    pub should_retry: Option<bool>,
}

impl StatusFailure {
    pub fn from_response(status: u16, headers: &HeaderMap, body: &[u8]) -> Self {
        let (message, code) = error_fields(body);
        Self {
            status,
            message,
            code,
            retry_after: retry_after(headers, SystemTime::now()),
            should_retry: should_retry(headers),
        }
    }

    pub fn is_quota(&self) -> bool {
        self.status == 429 && self.code.as_deref() == Some("insufficient_quota")
    }

    pub fn is_unauthorized(&self) -> bool {
        matches!(self.status, 401 | 403)
    }

    /// A status retried by default (408, 409, 429, 5xx) or one the provider asked to retry;
    /// quota and key errors excepted.
    pub fn is_transient(&self) -> bool {
        !self.is_unauthorized()
            && !self.is_quota()
            && (status_reason(self.status).is_some() || self.should_retry == Some(true))
    }
}

impl Failure {
    /// The metric label of a retryable failure (`429`, `5xx`, `timeout`, `connect`, `conflict`,
    /// `transport`), or `None` when it must not be retried.
    pub fn retry_reason(&self) -> Option<&'static str> {
        match self {
            Self::Status(s) => {
                if s.should_retry == Some(false) || s.is_unauthorized() || s.is_quota() {
                    return None;
                }
                let reason = status_reason(s.status);
                if s.should_retry == Some(true) {
                    return Some(reason.unwrap_or("5xx"));
                }
                reason
            }
            Self::Timeout => Some("timeout"),
            Self::Connect(_) => Some("connect"),
            Self::Transport(_) => Some("transport"),
            Self::InvalidBody(_) | Self::Closed => None,
        }
    }

    /// The give-up metric label of this failure as the final one.
    pub fn give_up_reason(&self) -> &'static str {
        match self {
            Self::Status(s) if s.is_unauthorized() => "unauthorized",
            Self::Status(s) if s.is_quota() => "quota",
            Self::Status(s) => status_reason(s.status).unwrap_or("rejected"),
            Self::Timeout => "timeout",
            Self::Connect(_) => "connect",
            Self::Transport(_) | Self::Closed => "transport",
            Self::InvalidBody(_) => "invalid_body",
        }
    }

    /// The wait before the next attempt: the server's `Retry-After` when it gave one, else the
    /// back-off delay with jitter. `None` (no more retries left) stays `None`.
    pub fn next_delay(&self, backoff: Option<Duration>) -> Option<Duration> {
        let backoff = backoff?;
        match self {
            Self::Status(StatusFailure {
                retry_after: Some(d),
                ..
            }) => Some(*d),
            _ => Some(jittered(backoff, fastrand::f64())),
        }
    }
}

/// The retry label of a status that is retried by default.
fn status_reason(status: u16) -> Option<&'static str> {
    match status {
        408 => Some("timeout"),
        409 => Some("conflict"),
        429 => Some("429"),
        500.. => Some("5xx"),
        _ => None,
    }
}

/// Exponential back-off of `max_retries` retries: 0.5 s × 2^attempt, capped at 8 s (jitter is
/// applied by [`Failure::next_delay`], shortening by up to 25 %, as openai-python does).
pub(crate) fn backoff(max_retries: u32) -> ExponentialBuilder {
    ExponentialBuilder::new()
        .with_min_delay(INITIAL_BACKOFF)
        .with_factor(2.0)
        .with_max_delay(MAX_BACKOFF)
        .with_max_times(usize::try_from(max_retries).unwrap_or(usize::MAX))
}

/// `delay` shortened by `JITTER × unit` (`unit` in [0, 1)).
pub(crate) fn jittered(delay: Duration, unit: f64) -> Duration {
    delay.mul_f64(1.0 - JITTER * unit.clamp(0.0, 1.0))
}

/// The server's requested wait: `retry-after-ms` (milliseconds), else `Retry-After` (seconds or an
/// HTTP-date), used only when within (0, 60] s.
pub(crate) fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let secs = header("retry-after-ms")
        .and_then(|v| v.parse::<f64>().ok())
        .map(|ms| ms / 1000.0)
        .or_else(|| {
            let v = header("retry-after")?;
            v.parse::<f64>().ok().or_else(|| {
                let at = httpdate::parse_http_date(v).ok()?;
                Some(match at.duration_since(now) {
                    Ok(d) => d.as_secs_f64(),
                    Err(_) => 0.0,
                })
            })
        })?;
    (secs.is_finite() && secs > 0.0 && secs <= MAX_RETRY_AFTER.as_secs_f64())
        .then(|| Duration::from_secs_f64(secs))
}

fn should_retry(headers: &HeaderMap) -> Option<bool> {
    let v = headers.get("x-should-retry")?.to_str().ok()?.trim();
    if v.eq_ignore_ascii_case("true") {
        Some(true)
    } else if v.eq_ignore_ascii_case("false") {
        Some(false)
    } else {
        None
    }
}

/// `(message, code)` of an error body: the nested OpenAI `{"error": {"message", "code", "type"}}`,
/// also tolerating a flat `{"message"}` or `{"error": "…"}`; else the start of the body.
pub(crate) fn error_fields(body: &[u8]) -> (String, Option<String>) {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let err = parsed.as_ref().map(|v| v.get("error").unwrap_or(v));
    let message = err.and_then(|e| {
        e.get("message")
            .and_then(Value::as_str)
            .or_else(|| e.as_str())
            .or_else(|| e.get("detail").and_then(Value::as_str))
    });
    let code = err.and_then(|e| {
        ["code", "type"]
            .iter()
            .find_map(|k| e.get(*k).and_then(Value::as_str))
            .map(str::to_owned)
    });
    let message = match message {
        Some(m) => m.chars().take(SNIPPET_CHARS).collect(),
        None if body.is_empty() => String::new(),
        None => snippet(body),
    };
    (message, code)
}

pub(crate) fn snippet(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .chars()
        .take(SNIPPET_CHARS)
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use reqwest::header::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn status(code: u16, body: &str, pairs: &[(&'static str, &str)]) -> Failure {
        Failure::Status(StatusFailure::from_response(
            code,
            &headers(pairs),
            body.as_bytes(),
        ))
    }

    #[test]
    fn retry_after_forms() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let ra = |pairs: &[(&'static str, &str)]| retry_after(&headers(pairs), now);
        assert_eq!(ra(&[("retry-after", "2")]), Some(Duration::from_secs(2)));
        assert_eq!(
            ra(&[("retry-after", "1.5")]),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            ra(&[("retry-after-ms", "250"), ("retry-after", "9")]),
            Some(Duration::from_millis(250)),
            "retry-after-ms wins"
        );
        let in_5s = httpdate::fmt_http_date(now + Duration::from_secs(5));
        assert_eq!(ra(&[("retry-after", &in_5s)]), Some(Duration::from_secs(5)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(5));
        assert_eq!(ra(&[("retry-after", &past)]), None);
        assert_eq!(ra(&[("retry-after", "0")]), None);
        assert_eq!(ra(&[("retry-after", "61")]), None);
        assert_eq!(ra(&[("retry-after", "60")]), Some(Duration::from_secs(60)));
        assert_eq!(ra(&[("retry-after", "-1")]), None);
        assert_eq!(ra(&[("retry-after", "soon")]), None);
        assert_eq!(ra(&[("retry-after", "NaN")]), None);
        assert_eq!(ra(&[]), None);
    }

    #[test]
    fn what_is_retried() {
        for (code, reason) in [
            (408, "timeout"),
            (409, "conflict"),
            (429, "429"),
            (500, "5xx"),
            (502, "5xx"),
            (503, "5xx"),
            (504, "5xx"),
            (529, "5xx"),
        ] {
            assert_eq!(status(code, "", &[]).retry_reason(), Some(reason), "{code}");
        }
        for code in [400, 401, 403, 404, 422] {
            assert_eq!(status(code, "", &[]).retry_reason(), None, "{code}");
        }
        let quota = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
        assert_eq!(status(429, quota, &[]).retry_reason(), None);
        assert_eq!(status(429, quota, &[]).give_up_reason(), "quota");
        let limited =
            r#"{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}"#;
        assert_eq!(status(429, limited, &[]).retry_reason(), Some("429"));
        assert_eq!(
            status(500, "", &[("x-should-retry", "false")]).retry_reason(),
            None
        );
        assert_eq!(
            status(400, "", &[("x-should-retry", "true")]).retry_reason(),
            Some("5xx")
        );
        assert_eq!(
            status(401, "", &[("x-should-retry", "true")]).retry_reason(),
            None,
            "a rejected key is never retried"
        );
        assert_eq!(Failure::Timeout.retry_reason(), Some("timeout"));
        assert_eq!(
            Failure::Connect(String::new()).retry_reason(),
            Some("connect")
        );
        assert_eq!(Failure::InvalidBody(String::new()).retry_reason(), None);
        assert_eq!(status(401, "", &[]).give_up_reason(), "unauthorized");
        assert_eq!(status(404, "", &[]).give_up_reason(), "rejected");
    }

    #[test]
    fn backoff_doubles_from_half_a_second_up_to_eight() {
        use backon::BackoffBuilder;
        let delays: Vec<Duration> = backoff(7).build().collect();
        let ms: Vec<u128> = delays.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, vec![500, 1000, 2000, 4000, 8000, 8000, 8000]);
        assert_eq!(backoff(0).build().count(), 0);
    }

    #[test]
    fn jitter_shortens_by_at_most_a_quarter() {
        let d = Duration::from_secs(4);
        assert_eq!(jittered(d, 0.0), d);
        assert_eq!(jittered(d, 1.0), Duration::from_secs(3));
        for _ in 0..100 {
            let j = Failure::Timeout.next_delay(Some(d)).unwrap();
            assert!(j > Duration::from_secs(3) && j <= d, "{j:?}");
        }
        assert_eq!(Failure::Timeout.next_delay(None), None);
        let ra = status(429, "", &[("retry-after", "3")]);
        assert_eq!(
            ra.next_delay(Some(Duration::from_millis(500))),
            Some(Duration::from_secs(3))
        );
        assert_eq!(ra.next_delay(None), None, "retries are still bounded");
    }

    #[test]
    fn error_bodies() {
        let (m, c) = error_fields(
            br#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#,
        );
        assert_eq!(
            (m.as_str(), c.as_deref()),
            ("Incorrect API key provided", Some("invalid_api_key"))
        );
        let (m, c) =
            error_fields(br#"{"error":{"message":"x","type":"server_error","code":null}}"#);
        assert_eq!((m.as_str(), c.as_deref()), ("x", Some("server_error")));
        let (m, c) = error_fields(br#"{"object":"error","message":"flat"}"#);
        assert_eq!((m.as_str(), c), ("flat", None));
        let (m, _) = error_fields(br#"{"error":"Unauthorized"}"#);
        assert_eq!(m, "Unauthorized");
        let (m, _) = error_fields(b"<html>bad gateway</html>");
        assert_eq!(m, "<html>bad gateway</html>");
        assert_eq!(error_fields(b"").0, "");
    }
}
