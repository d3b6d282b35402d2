//! Score extraction and the PRM majority vote (contract in `docs/upstream-protocols.md` section 6).

use std::sync::LazyLock;

use regex::Regex;

/// A literal `\boxed{`, an optional sign, exactly one ASCII digit, `}`.
#[allow(
    clippy::expect_used,
    reason = "a constant pattern, compiled by every test of this module"
)]
static BOXED: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\\boxed\{([+-]?[0-9])\}").expect("valid boxed regex"));

/// The value of the **last** `\boxed{±d}` in `text` (any single digit), or `None` without a match.
/// `\boxed{10}` and `\boxed{ 1 }` do not match. Judges with other accepted sets (the OPD hint judge
/// accepts only 1 and -1) filter this value.
pub fn last_boxed_digit(text: &str) -> Option<i8> {
    BOXED
        .captures_iter(text)
        .last()
        .and_then(|c| c.get(1))
        .and_then(|m| m.as_str().parse::<i8>().ok())
}

/// The PRM score of one judge answer: the last `\boxed{±d}` when it is 1, -1 or 0 (`\boxed{+1}` is 1);
/// anything else (no match, or another digit such as `\boxed{2}`) is `None`, a failed vote.
pub fn parse_boxed_score(text: &str) -> Option<i8> {
    last_boxed_digit(text).filter(|v| matches!(v, -1..=1))
}

/// The PRM majority: failed votes are dropped; with none left the result is 0.0; otherwise the value
/// with the highest count, or 0.0 when more than one value reaches that count (a tie).
pub fn majority_vote(votes: &[Option<i8>]) -> f64 {
    let mut counts: Vec<(i8, usize)> = Vec::new();
    for v in votes.iter().flatten() {
        match counts.iter_mut().find(|(value, _)| value == v) {
            Some((_, n)) => *n += 1,
            None => counts.push((*v, 1)),
        }
    }
    let Some(top) = counts.iter().map(|(_, n)| *n).max() else {
        return 0.0;
    };
    let mut leaders = counts.iter().filter(|(_, n)| *n == top);
    match (leaders.next(), leaders.next()) {
        (Some((value, _)), None) => f64::from(*value),
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_examples_parse() {
        assert_eq!(parse_boxed_score(r"\boxed{1}"), Some(1));
        assert_eq!(parse_boxed_score(r"\boxed{-1}"), Some(-1));
        assert_eq!(parse_boxed_score(r"\boxed{0}"), Some(0));
        assert_eq!(parse_boxed_score(r"\boxed{+1}"), Some(1));
        assert_eq!(parse_boxed_score(r"\boxed{10}"), None);
        assert_eq!(parse_boxed_score(r"\boxed{ 1 }"), None);
        assert_eq!(parse_boxed_score(r"\boxed{1.0}"), None);
        assert_eq!(parse_boxed_score(r"\boxed{}"), None);
        assert_eq!(parse_boxed_score(r"boxed{1}"), None);
        assert_eq!(parse_boxed_score(r"\Boxed{1}"), None);
        assert_eq!(parse_boxed_score(r"\boxed{--1}"), None);
        assert_eq!(parse_boxed_score(r"\boxed{+-1}"), None);
        assert_eq!(parse_boxed_score(""), None);
        assert_eq!(parse_boxed_score("The answer is 1."), None);
    }

    #[test]
    fn other_digits_are_invalid_for_prm() {
        assert_eq!(parse_boxed_score(r"\boxed{2}"), None);
        assert_eq!(parse_boxed_score(r"\boxed{-2}"), None);
        assert_eq!(parse_boxed_score(r"\boxed{9}"), None);
        assert_eq!(last_boxed_digit(r"\boxed{2}"), Some(2));
        assert_eq!(last_boxed_digit(r"\boxed{-9}"), Some(-9));
        // The last match decides, even when it is invalid for PRM.
        assert_eq!(parse_boxed_score(r"\boxed{1} then \boxed{2}"), None);
    }

    #[test]
    fn last_match_wins() {
        assert_eq!(parse_boxed_score(r"\boxed{1} no wait \boxed{-1}"), Some(-1));
        assert_eq!(parse_boxed_score(r"\boxed{-1}\boxed{0}"), Some(0));
        // A non-matching later box does not hide the last real match.
        assert_eq!(parse_boxed_score(r"\boxed{1} and \boxed{10}"), Some(1));
        assert_eq!(parse_boxed_score(r"\boxed{-1} and \boxed{ 1 }"), Some(-1));
    }

    #[test]
    fn nested_and_surrounded_text() {
        assert_eq!(parse_boxed_score(r"$\boxed{\boxed{1}}$"), Some(1));
        assert_eq!(
            parse_boxed_score(r"\boxed{\text{yes}} \boxed{-1}."),
            Some(-1)
        );
        assert_eq!(
            parse_boxed_score(
                "<think>\nIt could be \\boxed{1}.\n</think>\n\nThe user corrected it, so \\boxed{-1}<|im_end|>"
            ),
            Some(-1)
        );
        assert_eq!(parse_boxed_score("é\\boxed{0}ü"), Some(0));
        // Unicode digits are not digits here.
        assert_eq!(parse_boxed_score("\\boxed{\u{0661}}"), None);
    }

    #[test]
    fn majority_contract_examples() {
        assert_eq!(majority_vote(&[Some(1), Some(1), Some(-1)]), 1.0);
        assert_eq!(majority_vote(&[Some(1), Some(-1), None]), 0.0);
        assert_eq!(majority_vote(&[Some(1), None, None]), 1.0);
        assert_eq!(majority_vote(&[Some(0), Some(0), Some(1)]), 0.0);
    }

    #[test]
    fn majority_edge_cases() {
        assert_eq!(majority_vote(&[None, None, None]), 0.0);
        assert_eq!(majority_vote(&[]), 0.0);
        assert_eq!(majority_vote(&[Some(-1)]), -1.0);
        assert_eq!(majority_vote(&[Some(-1), Some(-1), Some(1)]), -1.0);
        assert_eq!(majority_vote(&[Some(1), Some(-1), Some(0)]), 0.0);
        assert_eq!(majority_vote(&[Some(1), Some(1), Some(-1), Some(-1)]), 0.0);
        assert_eq!(
            majority_vote(&[Some(-1), Some(-1), Some(1), None, None]),
            -1.0
        );
    }
}
