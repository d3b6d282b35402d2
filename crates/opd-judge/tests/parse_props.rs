//! Property tests of hint-vote parsing and best-hint selection: no panic on any input, scores only
//! 1/-1/None, hints trimmed, and the spans and the choice checked against a reference written out
//! by hand.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use ps_core::ports::HintVote;
use ps_opd_judge::{parse_hint_vote, select_best_hint};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        ..ProptestConfig::default()
    }
}

fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(r"\boxed{".to_owned()),
        Just(r"\boxed{1}".to_owned()),
        Just(r"\boxed{-1}".to_owned()),
        Just(r"\boxed{0}".to_owned()),
        Just("{".to_owned()),
        Just("}".to_owned()),
        Just("+".to_owned()),
        Just("-".to_owned()),
        Just("[HINT_START]".to_owned()),
        Just("[HINT_END]".to_owned()),
        Just("[HINT_START".to_owned()),
        Just("HINT_END]".to_owned()),
        Just("[hint_start]".to_owned()),
        Just(" ".to_owned()),
        Just("\t".to_owned()),
        Just("\n".to_owned()),
        Just("\r\n".to_owned()),
        Just("\u{a0}".to_owned()),
        Just("\u{3000}".to_owned()),
        Just("\u{1f}".to_owned()),
        Just("\u{200b}".to_owned()),
        Just("é".to_owned()),
        Just("🙂".to_owned()),
        "[0-9]{1,2}",
        "[A-Za-z .]{0,12}",
        any::<char>().prop_map(String::from),
    ]
}

fn built_text() -> impl Strategy<Value = String> {
    prop::collection::vec(fragment(), 0..40).prop_map(|parts| parts.concat())
}

/// Python's `str.strip()`, as the contract says.
fn strip(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
}

const START: &str = "[HINT_START]";
const END: &str = "[HINT_END]";

/// The last `[HINT_START]…[HINT_END]` span, non-greedy, scanned by hand.
fn reference_hint(text: &str) -> String {
    let mut pos = 0;
    let mut last = None;
    while let Some(i) = text[pos..].find(START).map(|i| pos + i) {
        let body = i + START.len();
        let Some(j) = text[body..].find(END).map(|j| body + j) else {
            break;
        };
        last = Some(&text[body..j]);
        pos = j + END.len();
    }
    last.map(|s| strip(s).to_owned()).unwrap_or_default()
}

/// `text` without any `[HINT_START]` (removing one can form another).
fn without_starts(text: &str) -> String {
    let mut t = text.to_owned();
    while t.contains(START) {
        t = t.replace(START, "");
    }
    t
}

fn vote_strategy() -> impl Strategy<Value = HintVote> {
    (
        prop_oneof![
            Just(None),
            Just(Some(1i8)),
            Just(Some(-1)),
            any::<i8>().prop_map(Some)
        ],
        prop_oneof![built_text(), "[ \ta-zé]{0,30}", any::<String>()],
    )
        .prop_map(|(score, hint)| HintVote { score, hint })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_string_gives_a_valid_vote(text in any::<String>()) {
        let v = parse_hint_vote(&text);
        prop_assert!(matches!(v.score, None | Some(1) | Some(-1)), "{:?}", v.score);
        prop_assert_eq!(v.hint.as_str(), strip(&v.hint), "trimmed");
        prop_assert_eq!(v.hint, reference_hint(&text));
    }

    #[test]
    fn built_strings_follow_the_contract(text in built_text()) {
        let v = parse_hint_vote(&text);
        prop_assert!(matches!(v.score, None | Some(1) | Some(-1)), "{:?}", v.score);
        prop_assert_eq!(v.score, ps_judge::last_boxed_digit(&text).filter(|s| *s == 1 || *s == -1));
        prop_assert_eq!(v.hint.as_str(), strip(&v.hint), "trimmed");
        prop_assert!(!v.hint.contains(END), "the span is non-greedy: {:?}", v.hint);
        prop_assert_eq!(&v.hint, &reference_hint(&text));
        if !v.hint.is_empty() {
            prop_assert!(text.contains(START) && text.contains(END));
        }
    }

    #[test]
    fn a_valid_box_appended_at_the_end_decides_the_score(
        text in prop_oneof![built_text(), any::<String>()],
        (suffix, expected) in prop_oneof![
            Just((r"\boxed{1}", 1i8)),
            Just((r"\boxed{+1}", 1)),
            Just((r"\boxed{-1}", -1)),
        ],
    ) {
        let full = format!("{text}{suffix}");
        let v = parse_hint_vote(&full);
        prop_assert_eq!(v.score, Some(expected));
        // A box after the text does not change the hint.
        prop_assert_eq!(v.hint, parse_hint_vote(&text).hint);
    }

    #[test]
    fn a_closed_span_at_the_end_is_the_hint_when_no_span_is_left_open(
        text in built_text().prop_map(|t| without_starts(&t)),
        hint in "[ \n\t]{0,3}[a-zA-Z0-9é][a-zA-Z0-9 é.]{0,20}[ \n\t]{0,3}",
    ) {
        let full = format!("{text}{START}{hint}{END}\\boxed{{1}}");
        let v = parse_hint_vote(&full);
        prop_assert_eq!(v.score, Some(1));
        prop_assert_eq!(v.hint.as_str(), strip(&hint));
    }

    #[test]
    fn the_best_hint_is_the_longest_eligible_first_on_ties(
        votes in prop::collection::vec(vote_strategy(), 0..8),
        min_chars in 0usize..12,
    ) {
        let best = select_best_hint(&votes, min_chars);
        let eligible: Vec<(usize, &str)> = votes
            .iter()
            .enumerate()
            .filter(|(_, v)| v.score == Some(1))
            .map(|(i, v)| (i, strip(&v.hint)))
            .filter(|(_, h)| h.chars().count() > min_chars)
            .collect();
        let longest = eligible.iter().map(|(_, h)| h.chars().count()).max();
        let expected = longest.and_then(|len| {
            eligible
                .iter()
                .find(|(_, h)| h.chars().count() == len)
                .map(|(i, h)| (*i, (*h).to_owned()))
        });
        prop_assert_eq!(best, expected);
    }
}

#[test]
fn huge_and_pathological_inputs_do_not_panic() {
    let opens = START.repeat(50_000);
    assert_eq!(parse_hint_vote(&opens).hint, "");
    let spans = format!("{START}x{END}").repeat(50_000) + r"\boxed{-1}";
    let v = parse_hint_vote(&spans);
    assert_eq!((v.score, v.hint.as_str()), (Some(-1), "x"));
    let open_then_many = format!("{START}{}", END.repeat(10_000));
    assert_eq!(parse_hint_vote(&open_then_many).hint, "");
    let votes = vec![
        HintVote {
            score: Some(1),
            hint: "é".repeat(10_000),
        };
        100
    ];
    assert_eq!(select_best_hint(&votes, 9_999).map(|(i, _)| i), Some(0));
}
