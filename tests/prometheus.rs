//! The operators' Grafana dashboard against the real thing: `policy-serving demo` serves its
//! conversation, Debian's Prometheus scrapes its `/metrics`, and every query of
//! `deploy/grafana/policy-serving.json` is evaluated. Every query must be valid PromQL that
//! Prometheus evaluates, and the panels of what the demo exercises (traffic, latency, samples, lag,
//! pending turns, judges) must show real series. Skipped without the `prometheus` package unless
//! `POLICY_SERVING_REQUIRE_PROMTOOL=1` (CI).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::harness;

use std::time::Duration;

use harness::Demo;
use ps_deploy::dashboard_queries;
use ps_deploy::prometheus::Prometheus;

/// Panels that must show series after the demo's conversation (the others may be empty: no
/// provider, no teacher, no Redis in the RL demo).
const MUST_HAVE_SERIES: &[&str] = &[
    "Requests / s",
    "Samples / s",
    "Trainer lag (samples)",
    "Submission",
    "Live sessions",
    "Requests per second by turn type and outcome",
    "Upstream latency (policy server)",
    "Proxy overhead (time added by the proxy)",
    "Capture time per turn",
    "Samples submitted per second",
    "Stored and lagging samples",
    "Pending turns by state",
    "PRM votes per second by outcome",
    "PRM time per turn (all votes)",
    "Capture outcomes",
    "Resident memory per replica",
];

#[test]
fn prometheus_scrapes_the_demo_and_the_dashboard_shows_its_series() {
    let demo = Demo::start("rl");
    let target = demo.base.trim_start_matches("http://").to_owned();
    let Some(prom) = Prometheus::start(std::slice::from_ref(&target)).unwrap() else {
        return;
    };
    prom.wait_scraped(1, 3, Duration::from_secs(60)).unwrap();
    let root = harness::workspace_root();
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("deploy/grafana/policy-serving.json")).unwrap(),
    )
    .unwrap();
    let mut with_series = Vec::new();
    for q in dashboard_queries(&dashboard) {
        let expr = q
            .expr
            .replace("$__rate_interval", "1m")
            .replace("$job", ".*");
        let result = prom
            .query(&expr)
            .unwrap_or_else(|e| panic!("{}: {e}", q.place));
        if !result.is_empty() {
            with_series.push(q.place.clone());
        }
    }
    let missing: Vec<&&str> = MUST_HAVE_SERIES
        .iter()
        .filter(|title| {
            !with_series
                .iter()
                .any(|p| p.starts_with(&format!("panel \"{title}\"")))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "panels without series against the demo: {missing:?}\n(with series: {with_series:#?})"
    );
}
