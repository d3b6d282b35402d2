//! [`Secret`]: an API key carried from configuration to the one header that sends it.
//!
//! `Debug` and `Display` print `<redacted>`, so no derived `Debug`, log line or error message that
//! holds a `Secret` can print the key; [`Secret::expose`] gives the value and is called only where a
//! request header is built or a received key is compared.

use std::fmt;

/// What a secret prints as.
pub const REDACTED: &str = "<redacted>";

/// A resolved secret. `Debug` and `Display` print `<redacted>`; [`Secret::expose`] gives the value.
/// Equality (of value and source) is for comparing configurations, not for checking a received key.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    value: String,
    source: String,
}

impl Secret {
    /// Wraps a value; `source` says where it came from (e.g. `environment variable TAOTOKEN_API_KEY`)
    /// and may be printed.
    pub fn new(value: impl Into<String>, source: impl Into<String>) -> Self {
        Self {
            value: value.into(),
            source: source.into(),
        }
    }

    /// The secret value. Call it only where the header that sends it is built (or a received key
    /// is compared with it); never log it.
    pub fn expose(&self) -> &str {
        &self.value
    }

    /// Where the value came from (safe to print), e.g. `environment variable TAOTOKEN_API_KEY`.
    pub fn source(&self) -> &str {
        &self.source
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

/// Secrets built in code (tests, fakes, the demo) come from a literal.
impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self::new(value, "literal")
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self::new(value, "literal")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatting_never_shows_the_value() {
        let s = Secret::new("sk-abc", "environment variable K");
        assert_eq!(format!("{s:?}"), "<redacted>");
        assert_eq!(format!("{s}"), "<redacted>");
        assert_eq!(format!("{:?}", Some(s.clone())), "Some(<redacted>)");
        assert_eq!(s.expose(), "sk-abc");
        assert_eq!(s.source(), "environment variable K");
    }
}
