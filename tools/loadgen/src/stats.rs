//! Pure helpers: percentiles of a sample and the `Server-Timing` header.

use serde::Serialize;

/// The nearest-rank `p`-th percentile (0 < p ≤ 100) of `sorted` (ascending); `None` when empty.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len();
    // Nearest rank: the smallest value with at least p% of the sample at or below it.
    let rank = (p / 100.0 * n as f64).ceil() as usize;
    sorted.get(rank.clamp(1, n) - 1).copied()
}

/// Count, mean, p50/p90/p99 and max of a sample, in the sample's unit (milliseconds here).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    pub count: usize,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Summary {
    /// Summarises `values` (any order); `None` when empty.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Self> {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        let count = v.len();
        Some(Self {
            count,
            mean: v.iter().sum::<f64>() / count.max(1) as f64,
            p50: percentile(&v, 50.0)?,
            p90: percentile(&v, 90.0)?,
            p99: percentile(&v, 99.0)?,
            max: *v.last()?,
        })
    }
}

/// The `dur` (milliseconds) of metric `name` in a `Server-Timing` header value, e.g.
/// `upstream;dur=12.345` or `db;dur=1, upstream;desc="policy";dur=3.5`. `None` when the metric or
/// its `dur` is absent or not a number.
pub fn server_timing_dur(header: &str, name: &str) -> Option<f64> {
    header.split(',').find_map(|metric| {
        let mut parts = metric.split(';').map(str::trim);
        if !parts.next()?.eq_ignore_ascii_case(name) {
            return None;
        }
        parts.find_map(|param| {
            let (key, value) = param.split_once('=')?;
            key.trim()
                .eq_ignore_ascii_case("dur")
                .then(|| value.trim().trim_matches('"').parse::<f64>().ok())
                .flatten()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 90.0), Some(90.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[1.0, 2.0, 3.0], 50.0), Some(2.0));
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 50.0), Some(2.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn summary_sorts_and_ignores_non_finite() {
        let s = Summary::of([3.0, 1.0, f64::NAN, 2.0, 4.0]).unwrap();
        assert_eq!(s.count, 4);
        assert_eq!((s.p50, s.p90, s.p99, s.max), (2.0, 4.0, 4.0, 4.0));
        assert!((s.mean - 2.5).abs() < 1e-12);
        assert_eq!(Summary::of([]), None);
    }

    #[test]
    fn server_timing_parsing() {
        assert_eq!(
            server_timing_dur("upstream;dur=12.345", "upstream"),
            Some(12.345)
        );
        assert_eq!(
            server_timing_dur(
                "cache;desc=\"hit\", Upstream ; desc=\"policy\" ; dur = 0.250",
                "upstream"
            ),
            Some(0.25)
        );
        assert_eq!(
            server_timing_dur("upstream;dur=\"3\"", "upstream"),
            Some(3.0)
        );
        assert_eq!(server_timing_dur("upstream", "upstream"), None);
        assert_eq!(server_timing_dur("upstream;dur=abc", "upstream"), None);
        assert_eq!(server_timing_dur("db;dur=5", "upstream"), None);
        assert_eq!(server_timing_dur("", "upstream"), None);
    }
}
