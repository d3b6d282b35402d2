//! Property tests of log-prob alignment: no panic on any input; one entry per response token in
//! every output vector; every value is the log-prob of an upstream token equal to the response token
//! at that position, taken in increasing order on both sides; the diff is minimal (as many values as
//! the longest common subsequence); and an upstream that is a subsequence of the response is placed
//! entirely.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use ps_core::{AlignPolicy, FinishReason, PositionSource, SampledToken, align_logprobs};
use serde_json::{Value, json};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        ..ProptestConfig::default()
    }
}

const VOCAB: u32 = 24;
const EOS: u32 = 7;

/// Decoded text of one id. Several ids share a text (as byte-level BPE pieces can), so matching by
/// text is exercised with ambiguity.
fn text(id: u32) -> String {
    const TEXTS: [&str; 10] = ["a", "b", " c", "\n", "<|im_end|>", "é", "", "d", "🙂", "a"];
    if id == EOS {
        "<|im_end|>".to_owned()
    } else {
        TEXTS[(id % 10) as usize].to_owned()
    }
}

/// How the upstream ids are reported.
#[derive(Debug, Clone, Copy)]
enum Ids {
    All,
    None,
    /// Some tokens have an id and some do not: matching falls back to text.
    Some,
}

#[derive(Debug, Clone)]
enum Edit {
    Keep,
    Drop,
    /// Keep, and insert a token after it.
    KeepThenInsert(u32),
    Replace(u32),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        5 => Just(Edit::Keep),
        2 => Just(Edit::Drop),
        1 => (0..VOCAB + 3).prop_map(Edit::KeepThenInsert),
        1 => (0..VOCAB + 3).prop_map(Edit::Replace),
    ]
}

fn finish() -> impl Strategy<Value = FinishReason> {
    (
        prop_oneof![
            Just(None),
            Just(Some("stop".to_owned())),
            Just(Some("length".to_owned())),
            Just(Some("tool_calls".to_owned())),
            Just(Some("abort".to_owned())),
        ],
        prop_oneof![
            Just(Value::Null),
            Just(json!(EOS)),
            Just(json!(EOS + 1)),
            Just(json!("</s>")),
            Just(json!(-1)),
        ],
    )
        .prop_map(|(reason, matched_stop)| FinishReason {
            reason,
            matched_stop,
        })
}

fn policy() -> impl Strategy<Value = AlignPolicy> {
    (any::<bool>(), any::<bool>()).prop_map(|(a, b)| AlignPolicy {
        train_eos_without_logprob: a,
        train_unsampled: b,
    })
}

/// The upstream tokens for `ids`, each with a distinct log-prob so that a value names its token.
fn tokens(ids: &[u32], mode: Ids, some_mask: &[bool]) -> Vec<SampledToken> {
    ids.iter()
        .enumerate()
        .map(|(k, &id)| SampledToken {
            token: text(id),
            id: match mode {
                Ids::All => Some(id),
                Ids::None => None,
                Ids::Some => some_mask.get(k).copied().unwrap_or(true).then_some(id),
            },
            logprob: -0.5 - k as f64,
        })
        .collect()
}

fn lcs<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    let mut dp = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            dp[i][j] = if a[i] == b[j] {
                dp[i + 1][j + 1] + 1
            } else {
                dp[i + 1][j].max(dp[i][j + 1])
            };
        }
    }
    dp[0][0]
}

/// Checks every invariant of one alignment.
fn check(
    response: &[u32],
    upstream: &[SampledToken],
    finish: &FinishReason,
    eos: Option<u32>,
    policy: AlignPolicy,
) -> Result<ps_core::Alignment, TestCaseError> {
    let a = align_logprobs(response, text, upstream, finish, eos, policy);
    let n = response.len();
    prop_assert_eq!(a.logprobs.len(), n);
    prop_assert_eq!(a.loss_mask.len(), n);
    prop_assert_eq!(a.sources.len(), n);
    prop_assert_eq!(a.dense_logprobs().len(), n);
    let by_ids = !upstream.is_empty() && upstream.iter().all(|t| t.id.is_some());
    prop_assert_eq!(a.matched_by_ids, by_ids);

    // Each value names its upstream token (log-probs are distinct); matches go forward on both sides.
    let mut last_upstream: Option<usize> = None;
    let mut matched = vec![false; upstream.len()];
    for (pos, lp) in a.logprobs.iter().enumerate() {
        let Some(lp) = lp else { continue };
        let k = upstream
            .iter()
            .position(|t| t.logprob == *lp)
            .ok_or_else(|| TestCaseError::fail(format!("value {lp} is no upstream log-prob")))?;
        if by_ids {
            prop_assert_eq!(upstream[k].id, Some(response[pos]), "position {}", pos);
        } else {
            prop_assert_eq!(&upstream[k].token, &text(response[pos]), "position {}", pos);
        }
        prop_assert!(
            last_upstream.is_none_or(|l| k > l),
            "upstream {} matched after {:?}",
            k,
            last_upstream
        );
        last_upstream = Some(k);
        matched[k] = true;
    }
    let unmatched = matched.iter().filter(|m| !**m).count();
    prop_assert_eq!(a.unmatched_upstream, unmatched);
    prop_assert_eq!(a.first_unmatched_upstream, matched.iter().position(|m| !m));
    prop_assert_eq!(
        a.marked(),
        a.logprobs.iter().filter(|l| l.is_none()).count()
    );

    // A minimal diff places as many values as the longest common subsequence.
    let placed = a.logprobs.iter().filter(|l| l.is_some()).count();
    let longest = if by_ids {
        let theirs: Vec<u32> = upstream.iter().map(|t| t.id.unwrap()).collect();
        lcs(response, &theirs)
    } else {
        let ours: Vec<String> = response.iter().map(|&id| text(id)).collect();
        let theirs: Vec<String> = upstream.iter().map(|t| t.token.clone()).collect();
        lcs(&ours, &theirs)
    };
    prop_assert_eq!(placed, longest, "minimal diff");

    // Sources and mask follow the documented table.
    let eos_pos = eos.and_then(|e| response.iter().rposition(|&id| id == e));
    for i in 0..n {
        let expected = if a.logprobs[i].is_some() {
            PositionSource::Sampled
        } else if Some(i) == eos_pos && finish.sampled_eos(eos) {
            PositionSource::EosUnreported
        } else {
            PositionSource::Unsampled
        };
        prop_assert_eq!(a.sources[i], expected, "source at {}", i);
        let bit = match expected {
            PositionSource::Sampled => 1,
            PositionSource::EosUnreported => u8::from(policy.train_eos_without_logprob),
            PositionSource::Unsampled => u8::from(policy.train_unsampled),
        };
        prop_assert_eq!(a.loss_mask[i], bit, "mask at {}", i);
    }
    Ok(a)
}

fn ids_mode() -> impl Strategy<Value = Ids> {
    prop_oneof![Just(Ids::All), Just(Ids::None), Just(Ids::Some)]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn edited_upstreams_align_within_the_invariants(
        (response, edits) in prop::collection::vec(0..VOCAB, 0..40)
            .prop_flat_map(|r| { let n = r.len(); (Just(r), prop::collection::vec(edit(), n)) }),
        prefix in prop::collection::vec(0..VOCAB + 3, 0..3),
        mode in ids_mode(),
        some_mask in prop::collection::vec(any::<bool>(), 48),
        finish in finish(),
        eos in prop_oneof![Just(Some(EOS)), Just(None), Just(Some(VOCAB + 100))],
        policy in policy(),
    ) {
        let mut ids = prefix;
        for (&id, e) in response.iter().zip(&edits) {
            match e {
                Edit::Keep => ids.push(id),
                Edit::Drop => {}
                Edit::KeepThenInsert(x) => {
                    ids.push(id);
                    ids.push(*x);
                }
                Edit::Replace(x) => ids.push(*x),
            }
        }
        let upstream = tokens(&ids, mode, &some_mask);
        check(&response, &upstream, &finish, eos, policy)?;
    }

    #[test]
    fn unrelated_upstreams_align_within_the_invariants(
        response in prop::collection::vec(any::<u32>().prop_map(|x| x % (VOCAB + 5)), 0..30),
        upstream_ids in prop::collection::vec(any::<u32>().prop_map(|x| x % (VOCAB + 5)), 0..30),
        mode in ids_mode(),
        some_mask in prop::collection::vec(any::<bool>(), 30),
        finish in finish(),
        policy in policy(),
    ) {
        let upstream = tokens(&upstream_ids, mode, &some_mask);
        check(&response, &upstream, &finish, Some(EOS), policy)?;
    }

    #[test]
    fn a_subsequence_of_the_response_is_placed_entirely(
        (response, keep) in prop::collection::vec(0..VOCAB, 0..48)
            .prop_flat_map(|r| { let n = r.len(); (Just(r), prop::collection::vec(any::<bool>(), n)) }),
        with_ids in any::<bool>(),
        finish in finish(),
        policy in policy(),
    ) {
        let ids: Vec<u32> = response.iter().zip(&keep).filter(|(_, k)| **k).map(|(id, _)| *id).collect();
        let mode = if with_ids { Ids::All } else { Ids::None };
        let upstream = tokens(&ids, mode, &[]);
        let a = check(&response, &upstream, &finish, Some(EOS), policy)?;
        prop_assert_eq!(a.unmatched_upstream, 0);
        prop_assert_eq!(a.first_unmatched_upstream, None);
        prop_assert_eq!(a.logprobs.iter().filter(|l| l.is_some()).count(), ids.len());
    }

    #[test]
    fn odd_log_prob_values_never_panic(
        response in prop::collection::vec(0..VOCAB, 0..20),
        lps in prop::collection::vec(prop_oneof![Just(f64::NAN), Just(f64::INFINITY), Just(f64::NEG_INFINITY), Just(-0.0), any::<f64>()], 0..20),
        tokens_text in prop::collection::vec(".{0,4}", 20),
    ) {
        let upstream: Vec<SampledToken> = lps
            .iter()
            .zip(&tokens_text)
            .map(|(lp, t)| SampledToken { token: t.clone(), id: None, logprob: *lp })
            .collect();
        let a = align_logprobs(&response, text, &upstream, &FinishReason::default(), Some(EOS), AlignPolicy::default());
        prop_assert_eq!(a.logprobs.len(), response.len());
    }
}

#[test]
fn large_inputs_align_quickly() {
    // A long answer with a few template tokens around it: the diff stays fast.
    let response: Vec<u32> = (0..20_000u32).map(|i| i % VOCAB).collect();
    let upstream = tokens(&response[3..response.len() - 2], Ids::All, &[]);
    let started = std::time::Instant::now();
    let a = align_logprobs(
        &response,
        text,
        &upstream,
        &FinishReason::default(),
        Some(EOS),
        AlignPolicy::default(),
    );
    assert_eq!(a.unmatched_upstream, 0);
    assert_eq!(a.marked(), 5);
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}
