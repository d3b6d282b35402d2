//! Property tests of the judge-output parser and the majority vote: no panic on any input, and the
//! documented contract (last `\boxed{±d}` wins, only -1/0/1 are PRM scores, ties are 0) checked
//! against a small reference implementation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use ps_judge::{last_boxed_digit, majority_vote, parse_boxed_score};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        ..ProptestConfig::default()
    }
}

/// Pieces that judge answers (and adversarial ones) are made of.
fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(r"\boxed{".to_owned()),
        Just(r"\boxed".to_owned()),
        Just(r"\Boxed{".to_owned()),
        Just("boxed{".to_owned()),
        Just("\\".to_owned()),
        Just("{".to_owned()),
        Just("}".to_owned()),
        Just("+".to_owned()),
        Just("-".to_owned()),
        Just(" ".to_owned()),
        Just("\n".to_owned()),
        Just("\r\n".to_owned()),
        Just("[HINT_START]".to_owned()),
        Just("[HINT_END]".to_owned()),
        Just("<think>".to_owned()),
        Just("</think>".to_owned()),
        Just("<|im_end|>".to_owned()),
        Just("\u{0661}".to_owned()), // Arabic-Indic digit one: not an ASCII digit
        Just("\u{ff11}".to_owned()), // fullwidth digit one
        Just("é".to_owned()),
        Just("🙂".to_owned()),
        Just("\u{0}".to_owned()),
        "[0-9]{1,3}",
        "[a-z ]{0,6}",
        any::<char>().prop_map(String::from),
    ]
}

fn built_text() -> impl Strategy<Value = String> {
    prop::collection::vec(fragment(), 0..40).prop_map(|parts| parts.concat())
}

/// The contract, written out by hand: the value of the last position where `\boxed{`, an optional
/// sign, one ASCII digit and `}` follow each other. (Two matches cannot overlap: a match holds one
/// backslash, at its start.)
fn reference_last_boxed(text: &str) -> Option<i8> {
    let bytes = text.as_bytes();
    let head = br"\boxed{";
    let mut last = None;
    for start in 0..bytes.len() {
        if !bytes[start..].starts_with(head) {
            continue;
        }
        let mut i = start + head.len();
        let mut negative = false;
        if let Some(&b) = bytes.get(i)
            && (b == b'+' || b == b'-')
        {
            negative = b == b'-';
            i += 1;
        }
        let Some(&d) = bytes.get(i) else { continue };
        if !d.is_ascii_digit() || bytes.get(i + 1) != Some(&b'}') {
            continue;
        }
        let v = i8::try_from(d - b'0').unwrap();
        last = Some(if negative { -v } else { v });
    }
    last
}

fn assert_prm_domain(score: Option<i8>) -> Result<(), TestCaseError> {
    prop_assert!(
        matches!(score, None | Some(-1..=1)),
        "PRM score out of its domain: {score:?}"
    );
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_string_parses_to_a_prm_score_or_none(text in any::<String>()) {
        let score = parse_boxed_score(&text);
        assert_prm_domain(score)?;
        prop_assert_eq!(last_boxed_digit(&text), reference_last_boxed(&text));
    }

    #[test]
    fn built_strings_follow_the_contract(text in built_text()) {
        let score = parse_boxed_score(&text);
        assert_prm_domain(score)?;
        let reference = reference_last_boxed(&text);
        prop_assert_eq!(last_boxed_digit(&text), reference);
        prop_assert_eq!(score, reference.filter(|v| (-1..=1).contains(v)));
    }

    #[test]
    fn a_valid_box_appended_at_the_end_always_wins(
        text in prop_oneof![built_text(), any::<String>()],
        (suffix, expected) in prop_oneof![
            Just((r"\boxed{1}", 1i8)),
            Just((r"\boxed{+1}", 1)),
            Just((r"\boxed{-1}", -1)),
            Just((r"\boxed{0}", 0)),
        ],
        between in prop_oneof![Just(""), Just(" "), Just("\n"), Just("}")],
    ) {
        let full = format!("{text}{between}{suffix}");
        prop_assert_eq!(parse_boxed_score(&full), Some(expected));
    }

    #[test]
    fn majority_of_valid_votes_is_minus_one_zero_or_one(
        votes in prop::collection::vec(prop_oneof![Just(None), (-1i8..=1).prop_map(Some)], 0..16),
    ) {
        let m = majority_vote(&votes);
        prop_assert!(m == -1.0 || m == 0.0 || m == 1.0, "{m}");
    }

    #[test]
    fn majority_is_permutation_invariant_and_matches_the_rule(
        (votes, shuffled) in prop::collection::vec(
            prop_oneof![Just(None), (-2i8..=2).prop_map(Some), any::<i8>().prop_map(Some)],
            0..16,
        )
        .prop_flat_map(|v| (Just(v.clone()), Just(v).prop_shuffle())),
    ) {
        let m = majority_vote(&votes);
        prop_assert_eq!(m, majority_vote(&shuffled));
        // The rule: failed votes dropped; the unique most frequent value, else 0.
        let valid: Vec<i8> = votes.iter().flatten().copied().collect();
        let count = |x: i8| valid.iter().filter(|&&v| v == x).count();
        let top = valid.iter().map(|&v| count(v)).max().unwrap_or(0);
        let mut leaders: Vec<i8> = valid.iter().copied().filter(|&v| count(v) == top).collect();
        leaders.sort_unstable();
        leaders.dedup();
        let expected = if leaders.len() == 1 { f64::from(leaders[0]) } else { 0.0 };
        prop_assert_eq!(m, expected);
    }
}

#[test]
fn huge_and_pathological_inputs_do_not_panic() {
    let many = r"\boxed{".repeat(100_000);
    assert_eq!(parse_boxed_score(&many), None);
    let many_valid = r"\boxed{-1}".repeat(50_000) + r"\boxed{1}";
    assert_eq!(parse_boxed_score(&many_valid), Some(1));
    let nested = format!("{}1{}", r"\boxed{".repeat(1000), "}".repeat(1000));
    assert_eq!(parse_boxed_score(&nested), Some(1));
    assert_eq!(majority_vote(&vec![Some(1); 100_000]), 1.0);
}
