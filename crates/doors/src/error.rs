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

    /// A request that is not what its API says (a missing or ill-typed field).
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new("invalid_request", message)
    }

    /// A request this proxy cannot serve exactly (a content type, a prefill, …).
    pub(crate) fn unsupported(message: impl Into<String>) -> Self {
        Self::new("unsupported_content", message)
    }

    /// An answer the engine aborted (SGLang's `finish_reason: "abort"`: a pause or a weight
    /// update), which no door gives its client as an answer.
    pub(crate) fn aborted() -> Self {
        Self::new("engine_aborted", ABORTED)
    }

    pub(crate) fn json(e: &serde_json::Error) -> Self {
        Self::new(
            "invalid_json",
            format!("the request body does not parse: {e}"),
        )
    }
}

/// Why an answer the engine aborted is not an answer (the error of [`DoorError::aborted`], and a
/// stream's closing error).
pub(crate) const ABORTED: &str = "the engine aborted the answer (finish_reason \"abort\": a pause or \
     a weight update); retry the request";
