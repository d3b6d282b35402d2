//! The one error of a translation: a request the door cannot translate, always the client's fault.

/// A request refused by a door, with a stable code and a message naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct DoorError {
    /// A stable snake_case code (`invalid_json`, `invalid_request`, `unsupported_content`, …).
    pub code: &'static str,
    pub message: String,
}

impl DoorError {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    pub(crate) fn json(e: &serde_json::Error) -> Self {
        Self::new(
            "invalid_json",
            format!("the request body does not parse: {e}"),
        )
    }
}
