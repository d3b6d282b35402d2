//! Aligns the log-probs an upstream reported for the sampled tokens with the response tokens obtained by
//! re-rendering the conversation with the chat template.
//!
//! The two sequences differ: the template inserts tokens the model never sampled (Qwen3's empty
//! `<think>\n\n</think>\n\n` block, the `\n` after `<|im_end|>`), re-serialises tool calls, and BPE may
//! merge differently at boundaries; a streamed answer may lack entries for empty deltas. Instead of
//! padding or truncating (which shifts every value onto the wrong token), we compute a minimal diff of the
//! two token sequences, compared by id when the upstream returned ids and by decoded text otherwise.
//! Each response position then either carries the log-prob of that very token or is marked as having
//! none, with the reason.

use serde::{Deserialize, Serialize};
use similar::{Algorithm, DiffOp, capture_diff_slices_deadline};

/// Longest time one alignment may search for the minimal diff. Similar sequences take microseconds;
/// two unrelated long ones (a teacher or template that tokenizes differently) could take seconds.
/// Past it the diff is still order-preserving and only pairs equal tokens, just not minimal.
pub const ALIGN_DEADLINE: std::time::Duration = std::time::Duration::from_millis(200);

use crate::rollout::{FinishReason, SampledToken};

/// Where the value at one response position comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PositionSource {
    /// The upstream reported this very token; its log-prob is exact.
    Sampled,
    /// The end-of-turn token, which the model did sample (it stopped on it), but whose log-prob the
    /// upstream did not report (streaming drops empty deltas).
    EosUnreported,
    /// Inserted by the chat template or otherwise not reported: the model never sampled it here.
    Unsampled,
}

/// How marked positions enter the loss mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlignPolicy {
    /// Train the end-of-turn token the model produced even when its log-prob was not reported.
    pub train_eos_without_logprob: bool,
    /// Train tokens the model never sampled (template scaffolding). Off by default.
    pub train_unsampled: bool,
}

impl Default for AlignPolicy {
    fn default() -> Self {
        Self {
            train_eos_without_logprob: true,
            train_unsampled: false,
        }
    }
}

/// The result of aligning one response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Alignment {
    /// One entry per response token: the exact log-prob, or `None`.
    pub logprobs: Vec<Option<f64>>,
    pub sources: Vec<PositionSource>,
    /// 1 = trained, 0 = excluded, from `sources` and the [`AlignPolicy`].
    pub loss_mask: Vec<u8>,
    /// Whether the comparison used token ids (exact) or decoded token text.
    pub matched_by_ids: bool,
    /// Upstream tokens that found no place in the re-rendered response.
    pub unmatched_upstream: usize,
    /// Index of the first upstream token that found no place, for logs.
    pub first_unmatched_upstream: Option<usize>,
}

impl Alignment {
    /// Response positions without a log-prob.
    pub fn marked(&self) -> usize {
        self.logprobs.iter().filter(|l| l.is_none()).count()
    }

    /// Log-probs as the trainer wants them: one float per response token, `0.0` where marked. Use
    /// together with [`Alignment::sources`] (or the loss mask): a `0.0` there is not a value.
    pub fn dense_logprobs(&self) -> Vec<f64> {
        self.logprobs.iter().map(|l| l.unwrap_or(0.0)).collect()
    }
}

/// Aligns `upstream` sampled tokens with `response_ids`.
///
/// `token_text(id)` must decode one id on its own, special tokens included (what SGLang puts in the
/// `token` field). `eos_id` is the template's end-of-turn token.
pub fn align_logprobs(
    response_ids: &[u32],
    token_text: impl Fn(u32) -> String,
    upstream: &[SampledToken],
    finish: &FinishReason,
    eos_id: Option<u32>,
    policy: AlignPolicy,
) -> Alignment {
    let deadline = std::time::Instant::now() + ALIGN_DEADLINE;
    let by_ids = !upstream.is_empty() && upstream.iter().all(|t| t.id.is_some());
    let ops = if by_ids {
        let ours: Vec<u32> = response_ids.to_vec();
        let theirs: Vec<u32> = upstream.iter().filter_map(|t| t.id).collect();
        capture_diff_slices_deadline(Algorithm::Myers, &ours, &theirs, Some(deadline))
    } else {
        let ours: Vec<String> = response_ids.iter().map(|&id| token_text(id)).collect();
        let theirs: Vec<&str> = upstream.iter().map(|t| t.token.as_str()).collect();
        let ours_ref: Vec<&str> = ours.iter().map(String::as_str).collect();
        capture_diff_slices_deadline(Algorithm::Myers, &ours_ref, &theirs, Some(deadline))
    };

    let n = response_ids.len();
    let mut logprobs = vec![None; n];
    let mut matched_upstream = vec![false; upstream.len()];
    for op in ops {
        if let DiffOp::Equal {
            old_index,
            new_index,
            len,
        } = op
        {
            for k in 0..len {
                logprobs[old_index + k] = Some(upstream[new_index + k].logprob);
                matched_upstream[new_index + k] = true;
            }
        }
    }

    let eos_pos = eos_id.and_then(|e| response_ids.iter().rposition(|&id| id == e));
    let eos_sampled = finish.sampled_eos(eos_id);
    let sources: Vec<PositionSource> = (0..n)
        .map(|i| {
            if logprobs[i].is_some() {
                PositionSource::Sampled
            } else if Some(i) == eos_pos && eos_sampled {
                PositionSource::EosUnreported
            } else {
                PositionSource::Unsampled
            }
        })
        .collect();
    let loss_mask = sources
        .iter()
        .map(|s| match s {
            PositionSource::Sampled => 1,
            PositionSource::EosUnreported => u8::from(policy.train_eos_without_logprob),
            PositionSource::Unsampled => u8::from(policy.train_unsampled),
        })
        .collect();
    let first_unmatched_upstream = matched_upstream.iter().position(|m| !m);
    Alignment {
        logprobs,
        sources,
        loss_mask,
        matched_by_ids: by_ids,
        unmatched_upstream: matched_upstream.iter().filter(|m| !**m).count(),
        first_unmatched_upstream,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // A toy vocabulary: ids are indexes into this table.
    const VOCAB: &[&str] = &[
        "<think>",
        "\n",
        "</think>",
        "\n\n",
        "Hel",
        "lo",
        "<|im_end|>",
        "!",
        " world",
    ];
    const EOS: u32 = 6;

    fn text(id: u32) -> String {
        VOCAB[id as usize].to_string()
    }

    fn tok(id: u32, lp: f64, with_id: bool) -> SampledToken {
        SampledToken {
            token: text(id),
            id: with_id.then_some(id),
            logprob: lp,
        }
    }

    fn stop() -> FinishReason {
        FinishReason {
            reason: Some("stop".into()),
            matched_stop: json!(EOS),
        }
    }

    #[test]
    fn template_scaffolding_is_marked_not_shifted() {
        // Re-rendered: <think>\n</think>\n\n Hel lo <|im_end|> \n ; sampled: Hel lo <|im_end|>
        let response = [0, 1, 2, 3, 4, 5, 6, 1];
        let upstream = [
            tok(4, -0.1, false),
            tok(5, -0.2, false),
            tok(6, -0.3, false),
        ];
        let a = align_logprobs(
            &response,
            text,
            &upstream,
            &stop(),
            Some(EOS),
            AlignPolicy::default(),
        );
        assert_eq!(
            a.logprobs,
            vec![
                None,
                None,
                None,
                None,
                Some(-0.1),
                Some(-0.2),
                Some(-0.3),
                None
            ]
        );
        assert_eq!(a.loss_mask, vec![0, 0, 0, 0, 1, 1, 1, 0]);
        assert_eq!(a.marked(), 5);
        assert_eq!(a.unmatched_upstream, 0);
        assert!(!a.matched_by_ids);
        assert_eq!(a.dense_logprobs()[4], -0.1);
    }

    #[test]
    fn streamed_eos_without_logprob_is_trained_by_default_and_configurable() {
        let response = [4, 5, 6, 1];
        let upstream = [tok(4, -0.1, false), tok(5, -0.2, false)];
        let a = align_logprobs(
            &response,
            text,
            &upstream,
            &stop(),
            Some(EOS),
            AlignPolicy::default(),
        );
        assert_eq!(
            a.sources,
            vec![
                PositionSource::Sampled,
                PositionSource::Sampled,
                PositionSource::EosUnreported,
                PositionSource::Unsampled
            ]
        );
        assert_eq!(a.loss_mask, vec![1, 1, 1, 0]);
        let strict = AlignPolicy {
            train_eos_without_logprob: false,
            train_unsampled: false,
        };
        let a = align_logprobs(&response, text, &upstream, &stop(), Some(EOS), strict);
        assert_eq!(a.loss_mask, vec![1, 1, 0, 0]);
    }

    #[test]
    fn truncated_answer_never_sampled_eos() {
        let response = [4, 5, 6, 1];
        let upstream = [tok(4, -0.1, false), tok(5, -0.2, false)];
        let length = FinishReason {
            reason: Some("length".into()),
            matched_stop: json!(null),
        };
        let a = align_logprobs(
            &response,
            text,
            &upstream,
            &length,
            Some(EOS),
            AlignPolicy::default(),
        );
        assert_eq!(a.sources[2], PositionSource::Unsampled);
        assert_eq!(a.loss_mask, vec![1, 1, 0, 0]);
    }

    #[test]
    fn ids_are_used_when_every_token_has_one_and_mismatches_are_counted() {
        // The upstream sampled " world" (8) where the re-render has "!" (7).
        let response = [4, 5, 7, 6, 1];
        let upstream = [
            tok(4, -0.1, true),
            tok(5, -0.2, true),
            tok(8, -0.5, true),
            tok(6, -0.3, true),
        ];
        let a = align_logprobs(
            &response,
            text,
            &upstream,
            &stop(),
            Some(EOS),
            AlignPolicy::default(),
        );
        assert!(a.matched_by_ids);
        assert_eq!(
            a.logprobs,
            vec![Some(-0.1), Some(-0.2), None, Some(-0.3), None]
        );
        assert_eq!(a.unmatched_upstream, 1);
        assert_eq!(a.first_unmatched_upstream, Some(2));
    }

    #[test]
    fn empty_upstream_marks_everything() {
        let response = [4, 5, 6];
        let a = align_logprobs(
            &response,
            text,
            &[],
            &stop(),
            Some(EOS),
            AlignPolicy::default(),
        );
        assert_eq!(a.logprobs, vec![None, None, None]);
        assert_eq!(a.loss_mask, vec![0, 0, 1]);
        assert_eq!(a.unmatched_upstream, 0);
    }

    #[test]
    fn unrelated_long_sequences_are_aligned_within_the_deadline() {
        // A tokenizer mismatch: two long sequences with almost nothing in common.
        let n = 20_000u32;
        let response: Vec<u32> = (0..n).map(|i| i % 7).collect();
        let upstream: Vec<SampledToken> = (0..n)
            .map(|i| SampledToken {
                token: String::new(),
                id: Some(7 + i % 5),
                logprob: -1.0,
            })
            .collect();
        let a = align_logprobs(
            &response,
            |_| String::new(),
            &upstream,
            &stop(),
            Some(EOS),
            AlignPolicy::default(),
        );
        assert_eq!(a.logprobs.len(), response.len());
        assert_eq!(
            a.unmatched_upstream,
            upstream.len(),
            "nothing in common, nothing matched"
        );
    }

    #[test]
    fn stop_on_another_token_is_not_our_eos() {
        let f = FinishReason {
            reason: Some("stop".into()),
            matched_stop: json!(151643),
        };
        assert!(!f.sampled_eos(Some(151645)));
        let f = FinishReason {
            reason: Some("tool_calls".into()),
            matched_stop: json!(null),
        };
        assert!(f.sampled_eos(Some(151645)));
        let f = FinishReason {
            reason: Some("stop".into()),
            matched_stop: json!("STOP"),
        };
        assert!(!f.sampled_eos(Some(151645)));
    }
}
