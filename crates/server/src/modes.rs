//! The wire enums that select server behaviour, named in the settings file (`server.pause_mode`,
//! `sglang.token_ids`). They live here, beside the behaviour; `ps-config` re-exports them.

use serde::{Deserialize, Serialize};

/// What chat requests get while submission is paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseMode {
    #[default]
    Reject,
    Hold,
    Serve,
}

impl PauseMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reject => "reject",
            Self::Hold => "hold",
            Self::Serve => "serve",
        }
    }
}

/// `sglang.token_ids`: where a main turn's token ids come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenIdsMode {
    /// The engine's ids when it returns them, exact re-tokenization otherwise (counted, logged).
    #[default]
    Auto,
    /// Only the engine's ids: a turn without them gives no sample.
    Engine,
    /// Never ask for ids: render and re-tokenize every turn.
    Retokenize,
}

impl TokenIdsMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Engine => "engine",
            Self::Retokenize => "retokenize",
        }
    }
}
