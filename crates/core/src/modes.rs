//! The wire enums that select behaviour and that more than one crate reads: the settings name
//! them (`server.pause_mode`, `sglang.token_ids`, `server.session_inference`), `ps-config` parses
//! them, the server and the session matcher act on them. They live here, low, so that loading the
//! settings needs no crate above core.

use serde::{Deserialize, Serialize};

/// What chat requests get while submission is paused (`server.pause_mode`).
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

/// `capture.sampling`: what a main turn is sampled with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SamplingMode {
    /// The client's sampling parameters, untouched (each sample records them).
    #[default]
    AsSent,
    /// `top_p = 1`, `top_k = -1`, `min_p = 0` sent upstream on main turns (temperature kept): the
    /// log-probs are of the full distribution the trainer recomputes.
    FullDistribution,
}

impl SamplingMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AsSent => "as_sent",
            Self::FullDistribution => "full_distribution",
        }
    }
}

/// `capture.routed_experts`: whether main turns carry a mixture-of-experts engine's routed experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoutedExpertsMode {
    /// Never asked for nor kept.
    Off,
    /// Kept when the engine returns them (vLLM with `--enable-return-routed-experts`), asked of
    /// SGLang when it reports `enable_return_routed_experts`; once an engine returned them, a turn
    /// without them is counted and marked.
    #[default]
    Auto,
    /// Always asked for; a turn without them (or whose shape does not fit its tokens) gives no
    /// sample, with its reason.
    Require,
}

impl RoutedExpertsMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Auto => "auto",
            Self::Require => "require",
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The names the settings file uses, both ways.
    #[test]
    fn the_settings_names_round_trip() {
        for (v, name) in [
            (serde_json::to_value(PauseMode::Hold), "hold"),
            (serde_json::to_value(TokenIdsMode::Retokenize), "retokenize"),
            (
                serde_json::to_value(SessionInference::WhenMissing),
                "when_missing",
            ),
        ] {
            assert_eq!(v.ok().as_ref().and_then(|v| v.as_str()), Some(name));
        }
        assert_eq!(PauseMode::Serve.as_str(), "serve");
        assert_eq!(TokenIdsMode::Engine.as_str(), "engine");
        assert_eq!(SamplingMode::FullDistribution.as_str(), "full_distribution");
        assert_eq!(
            serde_json::to_value(SamplingMode::FullDistribution).ok(),
            Some(serde_json::json!("full_distribution"))
        );
        assert_eq!(SessionInference::Always.as_str(), "always");
    }
}
