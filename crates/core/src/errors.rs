//! Helpers for error messages shared by every client crate.

/// `e` and its causes joined with `": "`, skipping a cause whose text the message already holds,
/// so that a message ends with what actually happened ("Connection refused").
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = s.source();
    }
    out
}

/// Longest excerpt of an upstream body quoted in an error message.
pub const SNIPPET_CHARS: usize = 200;

/// The start of a body, as text, for an error message.
pub fn snippet(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(4 * SNIPPET_CHARS)])
        .chars()
        .take(SNIPPET_CHARS)
        .collect()
}

/// The message of an upstream error body, whatever its shape: the nested `{"error":{"message"}}`
/// (SGLang `/generate`, vLLM, hosted providers), the flat `{"message"}` (SGLang's OpenAI routes,
/// older vLLM), `{"error":"…"}`, FastAPI's `{"detail"}`; else the start of the body.
pub fn error_message(bytes: &[u8]) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(bytes).ok();
    let message = parsed.as_ref().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("message"))
            .or_else(|| v.get("error"))
            .or_else(|| v.get("detail"))
            .and_then(serde_json::Value::as_str)
    });
    match message {
        Some(m) => m.chars().take(SNIPPET_CHARS).collect(),
        None if bytes.is_empty() => "(empty body)".to_owned(),
        None => snippet(bytes),
    }
}

#[cfg(test)]
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
    }

    #[derive(Debug, thiserror::Error)]
    #[error("calling the judge failed")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn causes_are_appended_once() {
        let e = Outer(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "Connection refused",
        ));
        assert_eq!(
            error_chain(&e),
            "calling the judge failed: Connection refused"
        );
        let plain = std::io::Error::other("boom");
        assert_eq!(error_chain(&plain), "boom");
    }
}
