//! Helpers for error messages shared by every crate (the outbound-HTTP ones, quoting upstream
//! error bodies, are in `ps-http`).

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

#[cfg(test)]
mod tests {
    use super::*;

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
