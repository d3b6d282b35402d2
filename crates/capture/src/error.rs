//! Why a turn could not be captured ([`CaptureError`]): the reason it is abandoned with.

use ps_chat_template::ChatTemplateError;

/// Why a turn cannot become a correct sample (it is abandoned with `reason`).
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error(transparent)]
    Template(#[from] ChatTemplateError),
    #[error("{detail}")]
    Refused {
        reason: &'static str,
        detail: String,
    },
}

impl CaptureError {
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Self::Template(_) => "render_failed",
            Self::Refused { reason, .. } => reason,
        }
    }
}
