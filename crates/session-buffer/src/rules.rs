//! The RL sample rules of the reference, as pure functions.
//!
//! - reward = the PRM majority score;
//! - a turn without a next state, or scored 0, is excluded (all-zero loss mask);
//! - at-least-one guarantee: a *scored* turn of a session that has no effective sample yet is kept
//!   even with score 0;
//! - with the PRM disabled, turns are submitted at once with score 0 and excluded.
//!
//! "Kept" uses the turn's alignment mask: every token the model sampled is trained, and the chat
//! template's scaffolding follows `capture.*` (see the README), instead of the reference's all-ones.

use ps_core::CapturedTurn;
use ps_core::SampleExperts;
use ps_core::ports::PrmScore;
use ps_core::sample::{Reward, Sample, SampleStatus};
use serde::Serialize;
use serde_json::{Map, Value, json};

/// Why a turn's sample carries an all-zero loss mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Exclusion {
    NoNextState,
    ScoreZero,
    PrmDisabled,
}

impl Exclusion {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoNextState => "no_next_state",
            Self::ScoreZero => "score_zero",
            Self::PrmDisabled => "prm_disabled",
        }
    }
}

/// The RL decision for one turn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RlDecision {
    pub reward: f64,
    /// Trained on (non-zero mask).
    pub effective: bool,
    /// Kept only by the at-least-one guarantee.
    pub at_least_one: bool,
    pub excluded: Option<Exclusion>,
}

/// Decides reward and inclusion. `score` is the PRM majority when the turn was scored (it had a next
/// state and the PRM is enabled), `None` otherwise.
pub fn rl_decision(
    score: Option<f64>,
    has_next_state: bool,
    prm_enabled: bool,
    session_has_effective: bool,
) -> RlDecision {
    let excluded = |reason| RlDecision {
        reward: 0.0,
        effective: false,
        at_least_one: false,
        excluded: Some(reason),
    };
    if !prm_enabled {
        return excluded(Exclusion::PrmDisabled);
    }
    let Some(score) = score.filter(|_| has_next_state) else {
        return excluded(Exclusion::NoNextState);
    };
    if score != 0.0 {
        return RlDecision {
            reward: score,
            effective: true,
            at_least_one: false,
            excluded: None,
        };
    }
    if !session_has_effective {
        return RlDecision {
            reward: 0.0,
            effective: true,
            at_least_one: true,
            excluded: None,
        };
    }
    excluded(Exclusion::ScoreZero)
}

/// `metadata` key listing the response positions that are trained (loss mask 1) although their
/// `rollout_log_probs` entry is a `0.0` placeholder (the upstream reported no log-prob there: the
/// end-of-turn token under `capture.train_eos_without_logprob`, template tokens under
/// `capture.train_unsampled`, every such position of an OPD sample). A trainer that uses rollout
/// log-probs (importance-sampling corrections, Slime's `--use-rollout-logprobs`) must leave them out.
pub const TRAINED_WITHOUT_ROLLOUT_LOGPROB: &str = "trained_without_rollout_logprob";

/// `metadata` key of Combine's RL-only samples: the positions taken out of the loss mask because
/// their rollout log-prob, copied into `teacher_log_probs`, would be a placeholder.
pub const MASKED_WITHOUT_LOGPROB: &str = "masked_without_logprob";

/// Lists (in `metadata`, under [`TRAINED_WITHOUT_ROLLOUT_LOGPROB`]) the trained positions of `s`
/// whose rollout log-prob is a placeholder, from the turn's alignment and the sample's final mask.
pub(crate) fn list_trained_placeholders(s: &mut Sample, turn: &CapturedTurn) {
    let positions: Vec<usize> = turn
        .alignment
        .logprobs
        .iter()
        .zip(&s.loss_mask)
        .enumerate()
        .filter_map(|(i, (lp, &mask))| (lp.is_none() && mask != 0).then_some(i))
        .collect();
    s.metadata
        .insert(TRAINED_WITHOUT_ROLLOUT_LOGPROB.into(), json!(positions));
}

/// Builds the sample of one turn. `index`/`group_index` are set by the sink.
pub fn rl_sample(turn: &CapturedTurn, decision: &RlDecision, judged: Option<&PrmScore>) -> Sample {
    let a = &turn.alignment;
    let n = turn.response_ids.len();
    let mut tokens = Vec::with_capacity(turn.prompt_ids.len() + n);
    tokens.extend_from_slice(&turn.prompt_ids);
    tokens.extend_from_slice(&turn.response_ids);
    let loss_mask = if decision.effective {
        a.loss_mask.clone()
    } else {
        vec![0; n]
    };
    let missing: Vec<usize> = a
        .logprobs
        .iter()
        .enumerate()
        .filter_map(|(i, l)| l.is_none().then_some(i))
        .collect();
    let mut metadata = Map::new();
    metadata.insert("mode".into(), json!("rl"));
    metadata.insert("score".into(), json!(decision.reward));
    metadata.insert(
        "votes".into(),
        judged.map_or(Value::Null, |j| json!(j.votes)),
    );
    metadata.insert(
        "excluded".into(),
        decision.excluded.map_or(Value::Null, |e| json!(e.as_str())),
    );
    metadata.insert("at_least_one".into(), json!(decision.at_least_one));
    // `engine`: the engine's own prompt and sampled ids; `retokenized`: rendered with the chat
    // template and re-tokenized, log-probs aligned to the tokens.
    metadata.insert("token_source".into(), json!(turn.token_source.as_str()));
    if let Some(v) = &turn.weight_version {
        metadata.insert("weight_version_source".into(), json!(v.source));
    }
    metadata.insert(
        "logprobs_matched_by".into(),
        json!(if a.matched_by_ids { "ids" } else { "text" }),
    );
    metadata.insert("logprob_missing_positions".into(), json!(missing));
    metadata.insert("logprob_sources".into(), json!(a.sources));
    metadata.insert(
        "unmatched_sampled_tokens".into(),
        json!(a.unmatched_upstream),
    );
    metadata.insert("prompt_is_prefix".into(), json!(turn.prompt_is_prefix));
    metadata.insert("finish_reason".into(), json!(turn.finish_reason));
    metadata.insert("streamed".into(), json!(turn.streamed));
    turn.origin.write_metadata(&mut metadata);
    turn.sampling.write_metadata(&mut metadata);
    if let Some(reason) = &turn.routed_experts_missing {
        // `auto`: an engine that returned experts for earlier turns gave none (or none that fit)
        // for this one.
        metadata.insert("routed_experts_missing".into(), json!(reason));
    }
    let mut sample = Sample {
        images: turn.images.clone(),
        // Split into blocks and hashed here, once per sample; the store keeps each block once.
        rollout_routed_experts: turn.routed_experts.as_ref().map(SampleExperts::of),
        index: 0,
        group_index: 0,
        prompt: turn.prompt_text.clone(),
        response: turn.response_text.clone(),
        tokens,
        response_length: n,
        loss_mask,
        rollout_log_probs: a.dense_logprobs(),
        reward: Reward {
            score: decision.reward,
        },
        status: match turn.finish_reason.as_deref() {
            Some("length") => SampleStatus::Truncated,
            Some("abort") => SampleStatus::Aborted,
            _ => SampleStatus::Completed,
        },
        session_id: turn.session_id.clone(),
        turn: turn.turn,
        weight_versions: turn
            .weight_version
            .iter()
            .map(|v| v.version.clone())
            .collect(),
        teacher_log_probs: None,
        teacher_topk_log_probs: None,
        teacher_topk_indices: None,
        metadata,
    };
    list_trained_placeholders(&mut sample, turn);
    sample
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scored_nonzero_is_effective_with_its_reward() {
        for s in [1.0, -1.0] {
            let d = rl_decision(Some(s), true, true, true);
            assert_eq!(d.reward, s);
            assert!(d.effective && !d.at_least_one && d.excluded.is_none());
        }
    }

    #[test]
    fn score_zero_is_excluded_once_the_session_has_an_effective_sample() {
        let d = rl_decision(Some(0.0), true, true, true);
        assert_eq!(d.excluded, Some(Exclusion::ScoreZero));
        assert!(!d.effective);
    }

    #[test]
    fn at_least_one_guarantee_keeps_the_first_scored_turn() {
        let d = rl_decision(Some(0.0), true, true, false);
        assert!(d.effective && d.at_least_one);
        assert_eq!(d.reward, 0.0);
    }

    #[test]
    fn no_next_state_is_excluded_even_without_an_effective_sample() {
        let d = rl_decision(None, false, true, false);
        assert_eq!(d.excluded, Some(Exclusion::NoNextState));
        assert!(!d.effective && !d.at_least_one);
    }

    #[test]
    fn prm_disabled_excludes_with_score_zero() {
        let d = rl_decision(None, true, false, false);
        assert_eq!(d.excluded, Some(Exclusion::PrmDisabled));
        assert_eq!(d.reward, 0.0);
        assert!(!d.effective);
    }
}
