//! The report: one [`CheckResult`] per check, rendered one line each.

use std::fmt::Write as _;
use std::time::Duration;

/// The checks, in the order they run and print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CheckId {
    /// Every variable an active feature's `*_api_key_env` names is set and non-empty.
    KeyVariables,
    /// How clients of the proxy authenticate (`server.api_key_env`, or `SGLANG_API_KEY` as in the
    /// reference), with a curl line that works. Informational: it never fails.
    ClientAuth,
    /// Which requests train: the turn type of requests naming none, with and without a session
    /// key (`server.default_turn_type`, `server.session_inference`). Informational: it never fails.
    TurnTypes,
    /// A one-token chat call to the provider succeeds (reachable, key accepted, model known).
    Provider,
    /// SGLang's `/health` answers 200.
    SglangHealth,
    /// A tiny chat returns per-token log-probs (and token ids when configured).
    ChatLogprobs,
    /// The policy tokenizer `serve` would capture with, and why: `server.model_dir`, or the
    /// directory the policy server reports; fails where `serve` would refuse to start.
    PolicyTokenizer,
    /// The PRM judge's `/generate` answers the real judge prompt with a parseable `\boxed{}`.
    PrmGenerate,
    /// The teacher returns every log-prob of a probe and echoes the policy tokenizer's ids.
    Teacher,
    /// `store.path` and every record directory accept a new file.
    Directories,
    /// A running proxy's `/health` reports submission enabled.
    Submission,
}

impl CheckId {
    /// Every check, in order.
    pub const ALL: [CheckId; 11] = [
        Self::KeyVariables,
        Self::ClientAuth,
        Self::TurnTypes,
        Self::Provider,
        Self::SglangHealth,
        Self::ChatLogprobs,
        Self::PolicyTokenizer,
        Self::PrmGenerate,
        Self::Teacher,
        Self::Directories,
        Self::Submission,
    ];

    /// The name printed in the report.
    pub fn name(self) -> &'static str {
        match self {
            Self::KeyVariables => "key variables",
            Self::ClientAuth => "client auth",
            Self::TurnTypes => "turn types",
            Self::Provider => "provider chat",
            Self::SglangHealth => "sglang health",
            Self::ChatLogprobs => "sglang chat logprobs",
            Self::PolicyTokenizer => "policy tokenizer",
            Self::PrmGenerate => "prm judge /generate",
            Self::Teacher => "teacher logprobs",
            Self::Directories => "directories writable",
            Self::Submission => "submission state",
        }
    }
}

/// What a check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Passed; `detail` says what was measured (never a secret).
    Ok { detail: String },
    /// Failed: the likely cause and the fix, naming the configuration key or variable.
    Fail { cause: String, fix: String },
    /// Not run, because the feature it checks is not active (or, for the submission state, the proxy
    /// is not running). Does not fail the run.
    Skip { reason: String },
}

impl Outcome {
    pub fn ok(detail: impl Into<String>) -> Self {
        Self::Ok {
            detail: detail.into(),
        }
    }

    pub fn fail(cause: impl Into<String>, fix: impl Into<String>) -> Self {
        Self::Fail {
            cause: cause.into(),
            fix: fix.into(),
        }
    }

    pub fn skip(reason: impl Into<String>) -> Self {
        Self::Skip {
            reason: reason.into(),
        }
    }

    pub fn is_fail(&self) -> bool {
        matches!(self, Self::Fail { .. })
    }

    pub fn is_ok(&self) -> bool {
        matches!(self, Self::Ok { .. })
    }

    pub fn is_skip(&self) -> bool {
        matches!(self, Self::Skip { .. })
    }

    /// The four-character status column: `ok  `, `FAIL` or `skip`.
    pub fn status(&self) -> &'static str {
        match self {
            Self::Ok { .. } => "ok  ",
            Self::Fail { .. } => "FAIL",
            Self::Skip { .. } => "skip",
        }
    }
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    pub id: CheckId,
    pub outcome: Outcome,
    /// How long the check took; `None` for a skipped check.
    pub latency: Option<Duration>,
}

impl CheckResult {
    /// The check's name, as printed.
    pub fn name(&self) -> &'static str {
        self.id.name()
    }
}

/// The results of every check, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckReport {
    pub checks: Vec<CheckResult>,
}

/// Width of the name column.
const NAME_WIDTH: usize = 20;

impl CheckReport {
    /// Whether no check failed (skips are fine).
    pub fn all_passed(&self) -> bool {
        !self.checks.iter().any(|c| c.outcome.is_fail())
    }

    /// The result of one check.
    pub fn get(&self, id: CheckId) -> Option<&CheckResult> {
        self.checks.iter().find(|c| c.id == id)
    }

    /// The failed checks.
    pub fn failures(&self) -> impl Iterator<Item = &CheckResult> {
        self.checks.iter().filter(|c| c.outcome.is_fail())
    }

    /// One line per check — status (`ok  `, `FAIL`, `skip`), name, latency in ms (`-` when skipped),
    /// then what was measured or why it was skipped — and under each failure one indented line
    /// `cause: … — fix: …`. Ends with a newline.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for c in &self.checks {
            let latency = c
                .latency
                .map_or_else(|| "-".to_owned(), |d| format!("{} ms", d.as_millis()));
            let text = match &c.outcome {
                Outcome::Ok { detail } => detail.as_str(),
                Outcome::Skip { reason } => reason.as_str(),
                Outcome::Fail { .. } => "",
            };
            let line = format!(
                "{} {:<NAME_WIDTH$} {latency:>8}  {text}",
                c.outcome.status(),
                c.name()
            );
            let _ = writeln!(out, "{}", line.trim_end());
            if let Outcome::Fail { cause, fix } = &c.outcome {
                let _ = writeln!(out, "     cause: {cause} — fix: {fix}");
            }
        }
        out
    }

    /// One closing line: `all 8 checks passed (2 skipped)` or `2 of 8 checks FAILED (1 skipped)`.
    pub fn summary(&self) -> String {
        let total = self.checks.len();
        let failed = self.failures().count();
        let skipped = self.checks.iter().filter(|c| c.outcome.is_skip()).count();
        let skipped = if skipped > 0 {
            format!(" ({skipped} skipped)")
        } else {
            String::new()
        };
        if failed == 0 {
            format!("all {total} checks passed{skipped}")
        } else {
            format!("{failed} of {total} checks FAILED{skipped}")
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn report() -> CheckReport {
        CheckReport {
            checks: vec![
                CheckResult {
                    id: CheckId::KeyVariables,
                    outcome: Outcome::ok("TAOTOKEN_API_KEY (provider.api_key_env) set"),
                    latency: Some(Duration::from_micros(300)),
                },
                CheckResult {
                    id: CheckId::PrmGenerate,
                    outcome: Outcome::fail(
                        "nothing listens at http://127.0.0.1:30002/generate",
                        "start the judge or set prm.router_url",
                    ),
                    latency: Some(Duration::from_millis(12)),
                },
                CheckResult {
                    id: CheckId::Submission,
                    outcome: Outcome::skip("the proxy is not running"),
                    latency: None,
                },
            ],
        }
    }

    #[test]
    fn one_line_per_check_and_an_indented_line_per_failure() {
        let r = report();
        let text = r.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert_eq!(
            lines[0],
            "ok   key variables            0 ms  TAOTOKEN_API_KEY (provider.api_key_env) set"
        );
        assert_eq!(lines[1], "FAIL prm judge /generate     12 ms");
        assert_eq!(
            lines[2],
            "     cause: nothing listens at http://127.0.0.1:30002/generate — fix: start the judge or set prm.router_url"
        );
        assert_eq!(
            lines[3],
            "skip submission state            -  the proxy is not running"
        );
        assert!(!r.all_passed());
        assert_eq!(r.summary(), "1 of 3 checks FAILED (1 skipped)");
        assert_eq!(r.failures().count(), 1);
        assert!(r.get(CheckId::Submission).unwrap().outcome.is_skip());
    }

    #[test]
    fn skips_do_not_fail_the_run() {
        let mut r = report();
        r.checks.remove(1);
        assert!(r.all_passed());
        assert_eq!(r.summary(), "all 2 checks passed (1 skipped)");
    }
}
