//! Which inference engine serves the policy (`sglang.engine`): what the proxy may ask of it and
//! where its answers put things differ between SGLang and vLLM (docs/upstream-protocols.md, 1 and
//! "vLLM as the policy engine"). The setting is a wire enum read by the config, the upstream
//! client and the server; the engine in effect is learned once and then read on every request
//! ([`EngineCell`], lock-free).

use std::sync::atomic::{AtomicU8, Ordering};

use serde::{Deserialize, Serialize};

/// An inference engine whose answers the proxy reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Engine {
    Sglang,
    Vllm,
}

impl Engine {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sglang => "sglang",
            Self::Vllm => "vllm",
        }
    }

    /// Whether a streamed request may carry `return_token_ids`: vLLM then sends the prompt's ids
    /// on the first chunk and each chunk's sampled ids; SGLang refuses the flag on streamed
    /// requests with 400.
    pub fn streams_token_ids(self) -> bool {
        self == Self::Vllm
    }

    /// The engine a `/v1/models` entry's `owned_by` names (`"vllm"`, `"sglang"`).
    pub fn from_owned_by(owned_by: &str) -> Option<Self> {
        match owned_by.trim().to_ascii_lowercase().as_str() {
            "vllm" => Some(Self::Vllm),
            "sglang" => Some(Self::Sglang),
            _ => None,
        }
    }
}

/// `sglang.engine`: the engine behind `sglang.chat_url`, or `auto` to learn it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineSetting {
    /// Learned from what the policy server says at start (`GET /get_model_info` answers: SGLang;
    /// `GET /v1/models` `owned_by`) or, when it was not reachable then, from its first answer.
    #[default]
    Auto,
    Sglang,
    Vllm,
}

impl EngineSetting {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Sglang => "sglang",
            Self::Vllm => "vllm",
        }
    }

    /// The engine this setting names, `None` for `auto`.
    pub fn fixed(self) -> Option<Engine> {
        match self {
            Self::Auto => None,
            Self::Sglang => Some(Engine::Sglang),
            Self::Vllm => Some(Engine::Vllm),
        }
    }
}

/// The engine in effect: fixed by the setting, or learned once (the first report wins:
/// [`EngineCell::learn`] says whether it set it, and the caller warns when a later report
/// disagrees); [`EngineCell::correct`] overrides it when the engine itself proved it wrong.
#[derive(Debug, Default)]
pub struct EngineCell(AtomicU8);

const UNKNOWN: u8 = 0;

fn code(e: Engine) -> u8 {
    match e {
        Engine::Sglang => 1,
        Engine::Vllm => 2,
    }
}

impl EngineCell {
    pub fn new(setting: EngineSetting) -> Self {
        Self(AtomicU8::new(setting.fixed().map_or(UNKNOWN, code)))
    }

    /// The engine, when known.
    pub fn get(&self) -> Option<Engine> {
        match self.0.load(Ordering::Relaxed) {
            1 => Some(Engine::Sglang),
            2 => Some(Engine::Vllm),
            _ => None,
        }
    }

    pub fn is_known(&self) -> bool {
        self.0.load(Ordering::Relaxed) != UNKNOWN
    }

    /// Records `engine` unless one is known already. Returns whether this call set it.
    pub fn learn(&self, engine: Engine) -> bool {
        self.0
            .compare_exchange(UNKNOWN, code(engine), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// Sets `engine` whatever was known (the engine's own answer proved the setting wrong).
    pub fn correct(&self, engine: Engine) {
        self.0.store(code(engine), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixed_setting_is_known_and_the_first_learned_engine_wins() {
        assert_eq!(
            EngineCell::new(EngineSetting::Vllm).get(),
            Some(Engine::Vllm)
        );
        assert!(!EngineCell::new(EngineSetting::Vllm).learn(Engine::Sglang));
        let cell = EngineCell::new(EngineSetting::Auto);
        assert_eq!(cell.get(), None);
        assert!(cell.learn(Engine::Sglang));
        assert!(!cell.learn(Engine::Vllm));
        assert_eq!(cell.get(), Some(Engine::Sglang));
        cell.correct(Engine::Vllm);
        assert_eq!(cell.get(), Some(Engine::Vllm));
    }

    #[test]
    fn owned_by_names_the_engine() {
        assert_eq!(Engine::from_owned_by("vllm"), Some(Engine::Vllm));
        assert_eq!(Engine::from_owned_by(" SGLang"), Some(Engine::Sglang));
        assert_eq!(Engine::from_owned_by("openai"), None);
        assert!(Engine::Vllm.streams_token_ids() && !Engine::Sglang.streams_token_ids());
    }
}
