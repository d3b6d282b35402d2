//! Hint-vote parsing and best-hint selection (contract in `docs/upstream-protocols.md` section 6).

use std::sync::LazyLock;

use ps_judge::last_boxed_digit;
use regex::Regex;

use ps_core::ports::HintVote;

/// `[HINT_START]`, the shortest run of any characters (newlines included), `[HINT_END]`.
#[allow(
    clippy::expect_used,
    reason = "a constant pattern, compiled by every test of this module"
)]
static HINT_SPAN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?s)\[HINT_START\](.*?)\[HINT_END\]").expect("valid hint regex"));

/// `s` without leading and trailing whitespace as Python's `str.strip()` sees it: Rust's Unicode
/// whitespace plus the ASCII separators U+001C..U+001F, which Python also strips.
pub(crate) fn py_strip(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
}

/// One hint-judge answer as a vote. The score is the last `\boxed{±d}` when it is 1 or -1
/// (`\boxed{+1}` is 1); `\boxed{0}`, any other digit or no match is a failed vote (`None`). The hint
/// is the last `[HINT_START]…[HINT_END]` span (non-greedy, across lines), trimmed, or `""` without
/// one. The hint is kept whatever the score, but only score-1 votes can supply the chosen hint.
pub fn parse_hint_vote(text: &str) -> HintVote {
    let score = last_boxed_digit(text).filter(|v| matches!(v, 1 | -1));
    let hint = HINT_SPAN
        .captures_iter(text)
        .last()
        .and_then(|c| c.get(1))
        .map(|m| py_strip(m.as_str()).to_owned())
        .unwrap_or_default();
    HintVote { score, hint }
}

/// The best hint of `votes` as `(vote index, trimmed hint)`. The candidates are the votes with score
/// 1 whose trimmed hint is longer than `min_chars` characters (strictly); the longest wins and a tie
/// goes to the first in vote order. `None` when there is no candidate: the turn is not accepted.
pub fn select_best_hint(votes: &[HintVote], min_chars: usize) -> Option<(usize, String)> {
    let mut best: Option<(usize, &str, usize)> = None;
    for (i, vote) in votes.iter().enumerate() {
        if vote.score != Some(1) {
            continue;
        }
        let hint = py_strip(&vote.hint);
        let len = hint.chars().count();
        if len <= min_chars {
            continue;
        }
        if best.is_none_or(|(_, _, best_len)| len > best_len) {
            best = Some((i, hint, len));
        }
    }
    best.map(|(i, hint, _)| (i, hint.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vote(score: Option<i8>, hint: &str) -> HintVote {
        HintVote {
            score,
            hint: hint.into(),
        }
    }

    #[test]
    fn scores_accept_only_one_and_minus_one() {
        assert_eq!(parse_hint_vote(r"\boxed{1}").score, Some(1));
        assert_eq!(parse_hint_vote(r"\boxed{-1}").score, Some(-1));
        assert_eq!(parse_hint_vote(r"\boxed{+1}").score, Some(1));
        assert_eq!(parse_hint_vote(r"\boxed{0}").score, None);
        assert_eq!(parse_hint_vote(r"\boxed{-0}").score, None);
        assert_eq!(parse_hint_vote(r"\boxed{2}").score, None);
        assert_eq!(parse_hint_vote(r"\boxed{10}").score, None);
        assert_eq!(parse_hint_vote(r"\boxed{ 1 }").score, None);
        assert_eq!(parse_hint_vote("no verdict").score, None);
        assert_eq!(parse_hint_vote("").score, None);
    }

    #[test]
    fn the_last_boxed_value_decides() {
        assert_eq!(parse_hint_vote(r"\boxed{1} no, \boxed{-1}").score, Some(-1));
        // A later \boxed{0} makes the vote fail even after a \boxed{1}.
        assert_eq!(parse_hint_vote(r"\boxed{1} then \boxed{0}").score, None);
        // A later non-matching box does not hide the real one.
        assert_eq!(parse_hint_vote(r"\boxed{1} and \boxed{10}").score, Some(1));
    }

    #[test]
    fn a_zero_vote_fails_but_keeps_its_hint() {
        let v = parse_hint_vote("[HINT_START] look at the error [HINT_END] \\boxed{0}");
        assert_eq!(v, vote(None, "look at the error"));
    }

    #[test]
    fn the_hint_is_the_last_span_trimmed() {
        let v = parse_hint_vote(
            "[HINT_START]first hint[HINT_END] then [HINT_START]\n  second hint \t\n[HINT_END]\n\\boxed{1}",
        );
        assert_eq!(v, vote(Some(1), "second hint"));
    }

    #[test]
    fn hints_span_lines() {
        let v = parse_hint_vote(
            "<think>\nok\n</think>\n[HINT_START]\nLine one.\nLine two.\n[HINT_END]\n\\boxed{1}<|im_end|>",
        );
        assert_eq!(v, vote(Some(1), "Line one.\nLine two."));
    }

    #[test]
    fn the_span_is_non_greedy() {
        // The first start marker opens the span and the nearest end marker closes it.
        let v = parse_hint_vote("[HINT_START]a [HINT_START]b[HINT_END] c [HINT_END] \\boxed{1}");
        assert_eq!(v.hint, "a [HINT_START]b");
        let v = parse_hint_vote("[HINT_START]x[HINT_END][HINT_START]y[HINT_END]");
        assert_eq!(v.hint, "y");
    }

    #[test]
    fn without_a_span_the_hint_is_empty() {
        assert_eq!(
            parse_hint_vote(r"nothing to add \boxed{-1}"),
            vote(Some(-1), "")
        );
        assert_eq!(
            parse_hint_vote("[HINT_START] unterminated \\boxed{1}").hint,
            ""
        );
        assert_eq!(
            parse_hint_vote("[HINT_END] backwards [HINT_START]").hint,
            ""
        );
        assert_eq!(parse_hint_vote("[HINT_START][HINT_END]").hint, "");
        assert_eq!(parse_hint_vote("[hint_start]x[hint_end]").hint, "");
    }

    #[test]
    fn strip_matches_python() {
        assert_eq!(py_strip(" \t\n\r\x0b\x0cx y\u{a0}\u{3000}"), "x y");
        assert_eq!(py_strip("\x1c\x1d\x1e\x1fx\x1f"), "x");
        assert_eq!(
            py_strip("\u{200b}x"),
            "\u{200b}x",
            "zero-width space is not whitespace"
        );
        assert_eq!(py_strip("   "), "");
    }

    #[test]
    fn the_threshold_is_strictly_greater() {
        let ten = "abcdefghij";
        let eleven = "abcdefghijk";
        assert_eq!(select_best_hint(&[vote(Some(1), ten)], 10), None);
        assert_eq!(
            select_best_hint(&[vote(Some(1), eleven)], 10),
            Some((0, eleven.to_owned()))
        );
        // Surrounding whitespace does not count.
        assert_eq!(
            select_best_hint(&[vote(Some(1), "  abcdefghij \n")], 10),
            None
        );
        // Characters, not bytes.
        assert_eq!(select_best_hint(&[vote(Some(1), "éééééééééé")], 10), None);
        assert_eq!(
            select_best_hint(&[vote(Some(1), "short")], 4),
            Some((0, "short".to_owned()))
        );
        assert_eq!(
            select_best_hint(&[vote(Some(1), "x")], 0),
            Some((0, "x".to_owned()))
        );
        assert_eq!(select_best_hint(&[vote(Some(1), "")], 0), None);
    }

    #[test]
    fn the_longest_wins_and_ties_go_first() {
        let votes = [
            vote(Some(1), "Check the logs first."),
            vote(Some(1), "Ask which file is meant before editing."),
            vote(Some(1), "Ask which file is MEANT before editing."),
        ];
        assert_eq!(
            select_best_hint(&votes, 10),
            Some((1, "Ask which file is meant before editing.".to_owned()))
        );
        let tie = [
            vote(None, ""),
            vote(Some(1), "first of equal"),
            vote(Some(1), "other of equal"),
        ];
        assert_eq!(
            select_best_hint(&tie, 10),
            Some((1, "first of equal".to_owned()))
        );
    }

    #[test]
    fn only_score_one_votes_are_candidates() {
        let votes = [
            vote(Some(-1), "a very long hint from a negative vote, ignored"),
            vote(None, "a very long hint from a failed vote, also ignored"),
            vote(Some(1), "the accepted hint"),
        ];
        assert_eq!(
            select_best_hint(&votes, 10),
            Some((2, "the accepted hint".to_owned()))
        );
    }

    #[test]
    fn no_candidate_gives_none() {
        assert_eq!(select_best_hint(&[], 10), None);
        let votes = [
            vote(Some(-1), ""),
            vote(None, ""),
            vote(Some(1), ""),
            vote(Some(1), "too short"),
        ];
        assert_eq!(select_best_hint(&votes, 10), None);
    }
}
