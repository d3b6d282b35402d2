//! The sampling parameters a main turn was sampled with ([`Sampling`]), as they were sent upstream
//! (after `capture.sampling`), and what they mean for the trainer ([`SamplingKind`]).
//!
//! A truncated sampler (`top_p < 1`, `top_k > 0`, `min_p > 0`, greedy) draws from a distribution
//! other than the full softmax the trainer recomputes, so rollout log-probs and the trainer's own
//! differ by more than numerics. No engine returns the kept token sets on the OpenAI endpoints the
//! proxy uses (docs/upstream-protocols.md section 9), so such a sample is marked
//! (`metadata.truncated_sampling_without_sets`) and counted, never passed off as full.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// The parameters of a main turn's upstream request that shape its sampling distribution; `None`
/// where the request did not set one and the engine's default applied (SGLang and vLLM both
/// default to the model's `generation_config.json`, which for Qwen3 is `top_p` 0.95, `top_k` 20).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Sampling {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f64>,
    /// `capture.sampling = "full_distribution"` set `top_p`, `top_k` and `min_p` in place of the
    /// client's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rewritten: bool,
    /// The request set one of the four to a value that is not a number the proxy reads (a
    /// string, say) which the engine may still take: counted as truncated, never as full.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unreadable: bool,
}

/// Below this temperature SGLang and vLLM sample greedily (vLLM's cut-off is 1e-5, SGLang's
/// 1e-6).
pub const GREEDY_BELOW: f64 = 1e-5;

/// What a turn's sampling means for its log-probs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SamplingKind {
    /// All four sent and none truncates: the full distribution at the recorded temperature.
    Full,
    /// A sent parameter truncates the distribution, and the kept sets are not carried.
    Truncated,
    /// A temperature below [`GREEDY_BELOW`]: the engine took the most likely token.
    Greedy,
    /// Nothing sent truncates, but some of the four were left to the engine's defaults (the
    /// model's `generation_config.json`), which may truncate or set another temperature.
    EngineDefaults,
}

impl SamplingKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Truncated => "truncated",
            Self::Greedy => "greedy",
            Self::EngineDefaults => "engine_defaults",
        }
    }

    /// Whether the sampler kept only part of the distribution (and the sample has no sets).
    pub fn is_truncated(self) -> bool {
        matches!(self, Self::Truncated | Self::Greedy)
    }
}

/// `metadata` key marking a sample whose response was sampled from a truncated distribution whose
/// kept sets the sample does not carry.
pub const TRUNCATED_WITHOUT_SETS: &str = "truncated_sampling_without_sets";

impl Sampling {
    /// What `full_distribution` sends: no truncation, the temperature kept.
    pub fn full_distribution(temperature: Option<f64>) -> Self {
        Self {
            temperature,
            top_p: Some(1.0),
            top_k: Some(-1),
            min_p: Some(0.0),
            rewritten: true,
            unreadable: false,
        }
    }

    pub fn kind(&self) -> SamplingKind {
        if self.temperature.is_some_and(|t| t < GREEDY_BELOW) {
            return SamplingKind::Greedy;
        }
        let truncates = self.unreadable
            || self.top_p.is_some_and(|p| p < 1.0)
            || self.top_k.is_some_and(|k| k > 0)
            || self.min_p.is_some_and(|m| m > 0.0);
        if truncates {
            SamplingKind::Truncated
        } else if self.temperature.is_none()
            || self.top_p.is_none()
            || self.top_k.is_none()
            || self.min_p.is_none()
        {
            SamplingKind::EngineDefaults
        } else {
            SamplingKind::Full
        }
    }

    /// Writes `sampling` (the four parameters, `null` where the engine's default applied),
    /// `sampling_kind`, and the truncation mark when it applies.
    pub fn write_metadata(&self, metadata: &mut Map<String, Value>) {
        metadata.insert(
            "sampling".into(),
            json!({
                "temperature": self.temperature,
                "top_p": self.top_p,
                "top_k": self.top_k,
                "min_p": self.min_p,
                "rewritten": self.rewritten,
            }),
        );
        let kind = self.kind();
        metadata.insert("sampling_kind".into(), json!(kind.as_str()));
        if kind.is_truncated() {
            metadata.insert(TRUNCATED_WITHOUT_SETS.into(), json!(true));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(t: Option<f64>, p: Option<f64>, k: Option<i64>, m: Option<f64>) -> Sampling {
        Sampling {
            temperature: t,
            top_p: p,
            top_k: k,
            min_p: m,
            rewritten: false,
            unreadable: false,
        }
    }

    #[test]
    fn kinds() {
        use SamplingKind::*;
        for (sampling, kind) in [
            (s(Some(1.0), Some(1.0), Some(-1), Some(0.0)), Full),
            (s(Some(0.6), Some(1.0), Some(0), Some(0.0)), Full),
            (s(None, Some(1.0), Some(0), Some(0.0)), EngineDefaults),
            (s(Some(1e-6), Some(1.0), Some(-1), Some(0.0)), Greedy),
            (s(Some(0.7), Some(0.9), Some(-1), Some(0.0)), Truncated),
            (s(Some(0.7), Some(1.0), Some(20), Some(0.0)), Truncated),
            (s(Some(0.7), Some(1.0), Some(-1), Some(0.05)), Truncated),
            (s(Some(0.7), Some(0.95), None, None), Truncated),
            (s(Some(0.0), Some(1.0), Some(-1), Some(0.0)), Greedy),
            (s(Some(0.7), None, None, None), EngineDefaults),
            (s(Some(0.7), Some(1.0), None, Some(0.0)), EngineDefaults),
            (Sampling::full_distribution(Some(0.6)), Full),
            (Sampling::full_distribution(None), EngineDefaults),
            (
                Sampling {
                    unreadable: true,
                    ..Sampling::full_distribution(Some(0.6))
                },
                Truncated,
            ),
        ] {
            assert_eq!(sampling.kind(), kind, "{sampling:?}");
        }
    }

    #[test]
    fn metadata_marks_only_truncated_samples() {
        let mut m = Map::new();
        s(Some(0.7), Some(0.9), None, None).write_metadata(&mut m);
        assert_eq!(m[TRUNCATED_WITHOUT_SETS], true);
        assert_eq!(m["sampling_kind"], "truncated");
        assert_eq!(
            m["sampling"],
            json!({"temperature": 0.7, "top_p": 0.9, "top_k": null, "min_p": null, "rewritten": false})
        );
        let mut m = Map::new();
        Sampling::full_distribution(Some(1.0)).write_metadata(&mut m);
        assert!(!m.contains_key(TRUNCATED_WITHOUT_SETS));
        assert_eq!(m["sampling_kind"], "full");
        assert_eq!(m["sampling"]["rewritten"], true);
        assert_eq!(m["sampling"]["top_k"], -1);
    }
}
