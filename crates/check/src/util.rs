//! Small helpers shared by the checks: error chains, excerpts, secret scrubbing, URL display.

use std::time::Duration;

/// Longest excerpt of a body or answer put in a message.
const EXCERPT_CHARS: usize = 160;

/// `e` and its causes, joined (one definition for the product, in `ps-core`).
pub(crate) use ps_core::error_chain;

/// Whether an error chain says the connection was refused.
pub(crate) fn refused(chain: &str) -> bool {
    let lower = chain.to_ascii_lowercase();
    lower.contains("connection refused") || lower.contains("actively refused")
}

/// At most [`EXCERPT_CHARS`] characters of `text`, on one line.
pub(crate) fn excerpt(text: &str) -> String {
    let one_line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let count = one_line.chars().count();
    if count <= EXCERPT_CHARS {
        one_line
    } else {
        let head: String = one_line.chars().take(EXCERPT_CHARS).collect();
        format!("{head}…")
    }
}

/// The last [`EXCERPT_CHARS`] characters of `text`, on one line.
pub(crate) fn tail(text: &str) -> String {
    let count = text.chars().count();
    let skip = count.saturating_sub(EXCERPT_CHARS);
    let rest: String = text.chars().skip(skip).collect();
    let rest = excerpt(&rest);
    if skip > 0 { format!("…{rest}") } else { rest }
}

/// `text` with every occurrence of `secret` replaced (a provider may echo the key it refused).
pub(crate) fn scrub(text: &str, secret: Option<&str>) -> String {
    match secret {
        Some(s) if s.len() >= 4 => text.replace(s, "<redacted>"),
        _ => text.to_owned(),
    }
}

/// The message of an error body (the shapes `ps_http::body_message` reads), else an excerpt of
/// the body.
pub(crate) fn body_message(bytes: &[u8]) -> String {
    match ps_http::body_message(bytes) {
        Some(m) => excerpt(&m),
        None if bytes.is_empty() => "(empty body)".to_owned(),
        None => excerpt(&String::from_utf8_lossy(bytes)),
    }
}

/// A URL for printing: without user name and password.
pub(crate) fn shown_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if !u.username().is_empty() || u.password().is_some() => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.to_string()
        }
        _ => url.to_owned(),
    }
}

/// A duration in seconds for messages: `10 s`, `0.5 s`.
pub(crate) fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{s:.1} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers() {
        assert_eq!(
            scrub("bad key sk-abcdef", Some("sk-abcdef")),
            "bad key <redacted>"
        );
        assert_eq!(scrub("x", Some("")), "x");
        assert_eq!(body_message(br#"{"error":{"message":"m"}}"#), "m");
        assert_eq!(body_message(br#"{"detail":"Not Found"}"#), "Not Found");
        assert_eq!(body_message(b""), "(empty body)");
        assert_eq!(excerpt("a\nb"), "a b");
        assert!(tail(&"x".repeat(500)).starts_with('…'));
        assert_eq!(
            shown_url("http://u:p@host:1/generate"),
            "http://host:1/generate"
        );
        assert_eq!(shown_url("http://host/x"), "http://host/x");
        assert_eq!(secs(Duration::from_secs(10)), "10 s");
        assert_eq!(secs(Duration::from_millis(500)), "0.5 s");
        assert!(refused(
            "error sending request: Connection refused (os error 111)"
        ));
    }
}
