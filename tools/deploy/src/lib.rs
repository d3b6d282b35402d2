//! The operators' deploy files — the Grafana dashboard `deploy/grafana/policy-serving.json` and the
//! Prometheus alerts `deploy/prometheus/alerts.yml` — checked against the metrics catalogue
//! ([`ps_core::metric_names::CATALOGUE`]): every metric, label and function a query or alert names
//! must exist, so a renamed metric or label breaks a test instead of a dashboard.
//!
//! It owns the checks only (a small PromQL reader, the extraction of queries from both files, and a
//! reader of the workspace's `counter!`/`gauge!`/`histogram!` calls that keeps the catalogue's labels
//! honest), and a runner of Debian's Prometheus that evaluates the dashboard's queries against a
//! live `/metrics` ([`prometheus::Prometheus`]). It depends on `ps-core` alone and only tests
//! depend on it.

pub mod prometheus;
pub mod promql;
pub mod source;

use std::collections::BTreeSet;

use ps_core::metric_names::{MetricKind, MetricSpec, lookup};
use serde_json::Value;

pub use promql::{ParseError, Query, Selector};

/// Labels Prometheus adds to every scraped series.
pub const TARGET_LABELS: &[&str] = &["job", "instance"];

/// Series Prometheus itself provides for every target.
pub const PROMETHEUS_SERIES: &[&str] = &["up", "scrape_duration_seconds", "scrape_samples_scraped"];

/// PromQL's functions and aggregation operators.
pub const FUNCTIONS: &[&str] = &[
    "abs",
    "absent",
    "absent_over_time",
    "avg_over_time",
    "ceil",
    "changes",
    "clamp",
    "clamp_max",
    "clamp_min",
    "count_over_time",
    "delta",
    "deriv",
    "exp",
    "floor",
    "histogram_quantile",
    "idelta",
    "increase",
    "irate",
    "last_over_time",
    "ln",
    "log2",
    "log10",
    "max_over_time",
    "min_over_time",
    "predict_linear",
    "present_over_time",
    "quantile_over_time",
    "rate",
    "resets",
    "round",
    "scalar",
    "sgn",
    "sort",
    "sort_desc",
    "sqrt",
    "stddev_over_time",
    "sum_over_time",
    "time",
    "timestamp",
    "vector",
    "sum",
    "avg",
    "min",
    "max",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "group",
];

/// One query of a file and where it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    /// For example `panel "Requests per second" target A` or `alert PolicyServingTeacherMismatch`.
    pub place: String,
    pub expr: String,
    /// Labels the place prints from the result (`{{reason}}` in a legend, `$labels.reason` in an
    /// annotation).
    pub shown_labels: Vec<String>,
}

/// What is wrong with one query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub place: String,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.place, self.message)
    }
}

/// How a series name maps onto the catalogue: a histogram is exported as a summary, whose `_sum`
/// and `_count` series carry no `quantile` label.
fn resolve(name: &str) -> Option<(&'static MetricSpec, bool)> {
    if let Some(spec) = lookup(name) {
        return Some((spec, spec.kind == MetricKind::Histogram));
    }
    for suffix in ["_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix)
            && let Some(spec) = lookup(base)
            && spec.kind == MetricKind::Histogram
        {
            return Some((spec, false));
        }
    }
    None
}

/// Checks one query: its metrics exist, each selector matches only labels its metric has, each
/// grouping and shown label is a label of some metric the query reads, each function exists.
pub fn check(q: &Located) -> Vec<Problem> {
    let problem = |message: String| Problem {
        place: q.place.clone(),
        message,
    };
    let query = match promql::parse(&q.expr) {
        Ok(query) => query,
        Err(e) => return vec![problem(format!("{e} in `{}`", q.expr))],
    };
    let mut out = Vec::new();
    let mut available: BTreeSet<&str> = TARGET_LABELS.iter().copied().collect();
    for sel in &query.selectors {
        let labels: Vec<&str> = if PROMETHEUS_SERIES.contains(&sel.metric.as_str()) {
            Vec::new()
        } else if let Some((spec, quantile)) = resolve(&sel.metric) {
            let mut l = spec.labels.to_vec();
            if quantile {
                l.push("quantile");
            }
            l
        } else {
            out.push(problem(format!(
                "metric `{}` is not in the catalogue (crates/core/src/metric_names.rs)",
                sel.metric
            )));
            continue;
        };
        for label in &sel.labels {
            if !labels.contains(&label.as_str()) && !TARGET_LABELS.contains(&label.as_str()) {
                out.push(problem(format!(
                    "metric `{}` has no label `{label}` (it has: {})",
                    sel.metric,
                    labels.join(", ")
                )));
            }
        }
        available.extend(labels);
    }
    for label in query.grouping.iter().chain(&q.shown_labels) {
        if !available.contains(label.as_str()) {
            out.push(problem(format!(
                "label `{label}` belongs to none of the metrics this query reads"
            )));
        }
    }
    for f in &query.functions {
        if !FUNCTIONS.contains(&f.as_str()) {
            out.push(problem(format!("`{f}` is not a PromQL function")));
        }
    }
    out
}

/// Labels named as `{{label}}` (Grafana legends) or `$labels.label` (alert templates) in `text`.
pub fn shown_labels(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let legend = regex::Regex::new(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}");
    let templ = regex::Regex::new(r"\$labels\.([A-Za-z_][A-Za-z0-9_]*)");
    for re in [legend, templ].into_iter().flatten() {
        out.extend(re.captures_iter(text).map(|c| c[1].to_owned()));
    }
    out
}

/// Every query of a Grafana dashboard: each panel's targets (rows' nested panels included) and
/// each query variable (`label_values(metric, label)` is read as `metric` grouped by `label`).
pub fn dashboard_queries(dashboard: &Value) -> Vec<Located> {
    let mut out = Vec::new();
    let mut panels: Vec<&Value> = Vec::new();
    if let Some(ps) = dashboard["panels"].as_array() {
        for p in ps {
            panels.push(p);
            if let Some(inner) = p["panels"].as_array() {
                panels.extend(inner);
            }
        }
    }
    for p in panels {
        let title = p["title"].as_str().unwrap_or("?");
        for t in p["targets"].as_array().into_iter().flatten() {
            let Some(expr) = t["expr"].as_str() else {
                continue;
            };
            let legend = t["legendFormat"].as_str().unwrap_or("");
            out.push(Located {
                place: format!(
                    "panel \"{title}\" target {}",
                    t["refId"].as_str().unwrap_or("?")
                ),
                expr: expr.to_owned(),
                shown_labels: shown_labels(legend),
            });
        }
    }
    let label_values =
        regex::Regex::new(r"^\s*label_values\(\s*(.+?)\s*,\s*([A-Za-z_]\w*)\s*\)\s*$");
    for v in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if v["type"] != "query" {
            continue;
        }
        let q = v["query"]
            .as_str()
            .or_else(|| v["query"]["query"].as_str())
            .unwrap_or("");
        let place = format!("variable {}", v["name"].as_str().unwrap_or("?"));
        match label_values.as_ref().ok().and_then(|re| re.captures(q)) {
            Some(c) => out.push(Located {
                place,
                expr: format!("count by ({}) ({})", &c[2], &c[1]),
                shown_labels: Vec::new(),
            }),
            None => out.push(Located {
                place,
                expr: q.to_owned(),
                shown_labels: Vec::new(),
            }),
        }
    }
    out
}

#[derive(Debug, thiserror::Error)]
#[error("the alert rules are not valid YAML: {0}")]
pub struct RulesError(#[from] serde_norway::Error);

/// Every rule of a Prometheus rules file (alerts and recording rules), with the labels its
/// annotations and labels print.
pub fn rule_queries(yaml: &str) -> Result<Vec<Located>, RulesError> {
    let doc: serde_norway::Value = serde_norway::from_str(yaml)?;
    let mut out = Vec::new();
    let groups = doc.get("groups").and_then(|g| g.as_sequence());
    for group in groups.into_iter().flatten() {
        for rule in group
            .get("rules")
            .and_then(|r| r.as_sequence())
            .into_iter()
            .flatten()
        {
            let name = rule
                .get("alert")
                .or_else(|| rule.get("record"))
                .and_then(|n| n.as_str())
                .unwrap_or("?");
            let expr = rule.get("expr").and_then(|e| e.as_str()).unwrap_or("");
            let text = serde_norway::to_string(&(rule.get("annotations"), rule.get("labels")))
                .unwrap_or_default();
            out.push(Located {
                place: format!("rule {name}"),
                expr: expr.to_owned(),
                shown_labels: shown_labels(&text),
            });
        }
    }
    Ok(out)
}

/// Checks every query; the problems of all of them.
pub fn check_all(queries: &[Located]) -> Vec<Problem> {
    queries.iter().flat_map(check).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(expr: &str, shown: &[&str]) -> Located {
        Located {
            place: "test".into(),
            expr: expr.into(),
            shown_labels: shown.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    #[test]
    fn catalogue_metrics_and_labels_pass() {
        let ok = [
            at(
                r#"sum by (reason) (rate(policy_serving_turns_dropped_total{job=~"$job"}[5m]))"#,
                &["reason"],
            ),
            at(
                r#"max by (quantile) (policy_serving_upstream_seconds{quantile="0.99"})"#,
                &[],
            ),
            at(
                "rate(policy_serving_prm_seconds_sum[5m]) / rate(policy_serving_prm_seconds_count[5m])",
                &[],
            ),
            at("up == 0", &["instance"]),
        ];
        for q in &ok {
            assert_eq!(check(q), vec![], "{}", q.expr);
        }
    }

    #[test]
    fn unknown_metrics_labels_and_functions_fail() {
        let msgs =
            |q: Located| -> Vec<String> { check(&q).into_iter().map(|p| p.message).collect() };
        assert_eq!(
            msgs(at("rate(policy_serving_nope_total[5m])", &[])),
            vec![
                "metric `policy_serving_nope_total` is not in the catalogue (crates/core/src/metric_names.rs)"
            ]
        );
        assert_eq!(
            msgs(at(
                r#"policy_serving_turns_dropped_total{outcome="x"}"#,
                &[]
            )),
            vec![
                "metric `policy_serving_turns_dropped_total` has no label `outcome` (it has: reason)"
            ]
        );
        assert_eq!(
            msgs(at("sum by (state) (policy_serving_live_sessions)", &[])),
            vec!["label `state` belongs to none of the metrics this query reads"]
        );
        assert_eq!(
            msgs(at("policy_serving_live_sessions", &["reason"])),
            vec!["label `reason` belongs to none of the metrics this query reads"]
        );
        assert_eq!(
            msgs(at("rates(policy_serving_live_sessions[5m])", &[])),
            vec!["`rates` is not a PromQL function"]
        );
        // A counter has no `_sum`; a summary's `_sum` has no quantile.
        assert_eq!(
            check(&at("policy_serving_requests_total_sum", &[])).len(),
            1
        );
        assert_eq!(
            check(&at(
                r#"policy_serving_prm_seconds_sum{quantile="0.5"}"#,
                &[]
            ))
            .len(),
            1
        );
    }

    #[test]
    fn dashboard_targets_and_variables_are_read() {
        let d = serde_json::json!({
            "panels": [
                {"title": "Row", "type": "row", "panels": [
                    {"title": "Inner", "targets": [{"refId": "A", "expr": "m1", "legendFormat": "{{reason}}"}]}
                ]},
                {"title": "Top", "targets": [{"refId": "B", "expr": "m2"}]}
            ],
            "templating": {"list": [
                {"type": "query", "name": "job", "query": {"query": "label_values(m3, job)"}},
                {"type": "datasource", "name": "ds", "query": "prometheus"}
            ]}
        });
        let q = dashboard_queries(&d);
        let exprs: Vec<_> = q
            .iter()
            .map(|l| (l.place.as_str(), l.expr.as_str()))
            .collect();
        assert_eq!(
            exprs,
            vec![
                ("panel \"Inner\" target A", "m1"),
                ("panel \"Top\" target B", "m2"),
                ("variable job", "count by (job) (m3)"),
            ]
        );
        assert_eq!(q[0].shown_labels, vec!["reason"]);
    }

    #[test]
    fn rules_and_their_templates_are_read() {
        let yaml = r#"
groups:
  - name: g
    rules:
      - alert: A
        expr: rate(m[5m]) > 0
        labels: {severity: page}
        annotations:
          summary: "dropped for {{ $labels.reason }}"
      - record: r:m
        expr: sum(m)
"#;
        let q = rule_queries(yaml).unwrap();
        assert_eq!(q.len(), 2);
        assert_eq!(q[0].place, "rule A");
        assert_eq!(q[0].shown_labels, vec!["reason"]);
        assert_eq!(q[1].expr, "sum(m)");
    }
}
