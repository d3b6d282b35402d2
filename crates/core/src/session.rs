//! Session identity and turn type, as carried by headers or body keys of a chat request.

use serde::{Deserialize, Serialize};

/// Whether a turn trains the policy (`main`) or is only forwarded (`side`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TurnType {
    Main,
    Side,
}

impl TurnType {
    /// Parses `main` or `side`, case-insensitively and ignoring surrounding white space.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "main" => Some(Self::Main),
            "side" => Some(Self::Side),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Main => "main",
            Self::Side => "side",
        }
    }
}

/// `1`, `true`, `yes` and `on` (any case) are truthy, as in the reference server.
pub fn is_truthy(s: &str) -> bool {
    matches!(
        s.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on"
    )
}

/// The session keys of one request, before defaults are applied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionHeaders {
    pub session_id: Option<String>,
    pub turn_type: Option<TurnType>,
    pub done: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truthy_values() {
        for v in ["1", "true", "TRUE", " yes ", "On"] {
            assert!(is_truthy(v), "{v}");
        }
        for v in ["0", "false", "", "no", "off", "2"] {
            assert!(!is_truthy(v), "{v}");
        }
    }

    #[test]
    fn turn_type_parse() {
        assert_eq!(TurnType::parse(" MAIN "), Some(TurnType::Main));
        assert_eq!(TurnType::parse("side"), Some(TurnType::Side));
        assert_eq!(TurnType::parse("other"), None);
    }
}
