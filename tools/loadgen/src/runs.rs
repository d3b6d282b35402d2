//! Medians of repeated runs: issue 14's targets are "medians of 3 runs". `loadgen agent --runs N`
//! makes the whole measurement N times (fresh children each time) and reports each run's headline
//! figures and the median of each, taken figure by figure (so the median row need not be one run).

use std::fmt::Write as _;

use serde::Serialize;

use crate::agent::AgentReport;
use crate::report::opt;

/// The headline figures of one agent run (per request, over its proxied phase).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct AgentFigures {
    pub proxy_cpu_ms_per_request: Option<f64>,
    pub proxy_cpu_ms_per_1000_captured_tokens: Option<f64>,
    /// The fake's CPU per request in the direct phase: the yardstick.
    pub fake_cpu_ms_per_request: Option<f64>,
    /// Proxy CPU per request ÷ the fake's, in the same run.
    pub proxy_over_fake: Option<f64>,
    pub added_p50_ms: Option<f64>,
    pub added_p90_ms: Option<f64>,
    pub added_p99_ms: Option<f64>,
    pub rss_start_mib: Option<f64>,
    pub rss_max_mib: Option<f64>,
    pub rss_hwm_mib: Option<f64>,
    pub rss_end_mib: Option<f64>,
    /// The most bytes of turns waiting for a capture worker at once (`/v1/rollout/status`'s
    /// `capture_queue.peak_bytes`), in MiB: how far capture fell behind the chat path.
    pub capture_queue_peak_mib: Option<f64>,
    /// Samples the trainer received, and main turns the proxy counted as giving none.
    pub samples: Option<f64>,
    pub dropped: Option<f64>,
}

impl AgentFigures {
    pub fn of(r: &AgentReport) -> Self {
        let mib = |kib: u64| Some(kib as f64 / 1024.0);
        let fake = r.direct.cpu_ms_per_request.fake;
        let added = r.proxy.added_ms;
        Self {
            proxy_cpu_ms_per_request: r.proxy_cpu_ms_per_request,
            proxy_cpu_ms_per_1000_captured_tokens: r.proxy_cpu_ms_per_1000_captured_tokens,
            fake_cpu_ms_per_request: fake,
            proxy_over_fake: r
                .proxy_cpu_ms_per_request
                .zip(fake.filter(|f| *f > 0.0))
                .map(|(p, f)| p / f),
            added_p50_ms: added.map(|s| s.p50),
            added_p90_ms: added.map(|s| s.p90),
            added_p99_ms: added.map(|s| s.p99),
            rss_start_mib: mib(r.memory.start_kib),
            rss_max_mib: mib(r.memory.max_sampled_kib),
            rss_hwm_mib: mib(r.memory.hwm_kib),
            rss_end_mib: mib(r.memory.end_kib),
            capture_queue_peak_mib: r.capture_queue_peak_mib,
            samples: Some(r.accounting.samples as f64),
            dropped: Some((r.accounting.dropped + r.accounting.abandoned) as f64),
        }
    }

    /// The median of each figure over `runs` (runs without that figure left out).
    pub fn median(runs: &[Self]) -> Self {
        let m = |f: fn(&Self) -> Option<f64>| median(runs.iter().filter_map(f));
        Self {
            proxy_cpu_ms_per_request: m(|r| r.proxy_cpu_ms_per_request),
            proxy_cpu_ms_per_1000_captured_tokens: m(|r| r.proxy_cpu_ms_per_1000_captured_tokens),
            fake_cpu_ms_per_request: m(|r| r.fake_cpu_ms_per_request),
            proxy_over_fake: m(|r| r.proxy_over_fake),
            added_p50_ms: m(|r| r.added_p50_ms),
            added_p90_ms: m(|r| r.added_p90_ms),
            added_p99_ms: m(|r| r.added_p99_ms),
            rss_start_mib: m(|r| r.rss_start_mib),
            rss_max_mib: m(|r| r.rss_max_mib),
            rss_hwm_mib: m(|r| r.rss_hwm_mib),
            rss_end_mib: m(|r| r.rss_end_mib),
            capture_queue_peak_mib: m(|r| r.capture_queue_peak_mib),
            samples: m(|r| r.samples),
            dropped: m(|r| r.dropped),
        }
    }

    fn cells(&self) -> [Option<f64>; 14] {
        [
            self.proxy_cpu_ms_per_request,
            self.proxy_cpu_ms_per_1000_captured_tokens,
            self.fake_cpu_ms_per_request,
            self.proxy_over_fake,
            self.added_p50_ms,
            self.added_p90_ms,
            self.added_p99_ms,
            self.rss_start_mib,
            self.rss_max_mib,
            self.rss_hwm_mib,
            self.rss_end_mib,
            self.capture_queue_peak_mib,
            self.samples,
            self.dropped,
        ]
    }
}

/// The median of `values` (the mean of the middle two for an even count); `None` when empty.
pub fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.into_iter().collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    })
}

/// Every run of `loadgen agent --runs N` and the medians (the `--json` of such a run).
#[derive(Debug, Clone, Serialize)]
pub struct AgentRuns {
    pub runs: Vec<AgentReport>,
    pub figures: Vec<AgentFigures>,
    pub median: AgentFigures,
}

impl AgentRuns {
    pub fn new(runs: Vec<AgentReport>) -> Self {
        let figures: Vec<AgentFigures> = runs.iter().map(AgentFigures::of).collect();
        let median = AgentFigures::median(&figures);
        Self {
            runs,
            figures,
            median,
        }
    }

    /// One row per run, then the medians.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let heads = [
            "cpu ms/req",
            "per 1k tok",
            "fake ms",
            "prx/fake",
            "add p50",
            "add p90",
            "add p99",
            "rss start",
            "rss max",
            "VmHWM",
            "rss end",
            "queue peak",
            "samples",
            "dropped",
        ];
        let _ = write!(out, "{:<7}", "run");
        for h in heads {
            let _ = write!(out, " {h:>10}");
        }
        out.push('\n');
        let rows = self
            .figures
            .iter()
            .enumerate()
            .map(|(i, f)| (format!("{}", i + 1), f))
            .chain([("median".to_owned(), &self.median)]);
        for (name, f) in rows {
            let _ = write!(out, "{name:<7}");
            for c in f.cells() {
                let _ = write!(out, " {:>10}", opt(c));
            }
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median([3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median([4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median([7.5]), Some(7.5));
        assert_eq!(median(std::iter::empty()), None);
    }

    #[test]
    fn medians_are_taken_figure_by_figure_and_skip_missing_values() {
        let run = |cpu: f64, p99: Option<f64>, hwm: f64| AgentFigures {
            proxy_cpu_ms_per_request: Some(cpu),
            added_p99_ms: p99,
            rss_hwm_mib: Some(hwm),
            ..AgentFigures::default()
        };
        let m = AgentFigures::median(&[
            run(5.0, Some(9.0), 300.0),
            run(4.0, None, 280.0),
            run(6.0, Some(1.0), 290.0),
        ]);
        assert_eq!(m.proxy_cpu_ms_per_request, Some(5.0));
        assert_eq!(m.added_p99_ms, Some(5.0), "the two runs that have one");
        assert_eq!(m.rss_hwm_mib, Some(290.0));
        assert_eq!(m.proxy_over_fake, None);
    }
}
