//! [`SessionInference`]: when a chat request's session is recognised from its history
//! (`server.session_inference`). Defined here, beside the matcher it switches; `ps-config` reads it.

use serde::{Deserialize, Serialize};

/// How a request without a session key finds its session (`server.session_inference`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionInference {
    Off,
    #[default]
    WhenMissing,
    Always,
}

impl SessionInference {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::WhenMissing => "when_missing",
            Self::Always => "always",
        }
    }
}
