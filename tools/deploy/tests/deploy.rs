//! The files under `deploy/` against the catalogue, the catalogue against the code, and the alert
//! rules through Debian's `promtool` (skipped without it unless `POLICY_SERVING_REQUIRE_PROMTOOL=1`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use ps_core::metric_names::{CATALOGUE, MetricKind};
use ps_deploy::source::{constants, recorded, rust_files};
use ps_deploy::{Located, check_all, dashboard_queries, rule_queries};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn read(rel: &str) -> String {
    let p = root().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn dashboard() -> Vec<Located> {
    let json: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/policy-serving.json")).unwrap();
    dashboard_queries(&json)
}

fn rules() -> Vec<Located> {
    rule_queries(&read("deploy/prometheus/alerts.yml")).unwrap()
}

fn assert_no_problems(what: &str, queries: &[Located]) {
    let problems = check_all(queries);
    assert!(
        problems.is_empty(),
        "{what}: {} problem(s):\n{}",
        problems.len(),
        problems
            .iter()
            .map(|p| format!("  {p}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn every_dashboard_query_names_catalogued_metrics_and_labels() {
    let queries = dashboard();
    assert!(queries.len() > 30, "only {} queries found", queries.len());
    assert_no_problems("deploy/grafana/policy-serving.json", &queries);
}

#[test]
fn every_alert_names_catalogued_metrics_and_labels() {
    let queries = rules();
    let names: Vec<_> = queries.iter().map(|q| q.place.as_str()).collect();
    for alert in [
        "rule PolicyServingSamplesStalled",
        "rule PolicyServingTrainerLagGrowing",
        "rule PolicyServingPrmJudgeFailing",
        "rule PolicyServingTeacherFailing",
        "rule PolicyServingTeacherTokenMismatch",
        "rule PolicyServingStoreAppendRetries",
        "rule PolicyServingStoreDataLoss",
    ] {
        assert!(names.contains(&alert), "{alert} missing from {names:?}");
    }
    assert_no_problems("deploy/prometheus/alerts.yml", &queries);
}

/// The catalogue lists every constant of `metric_names.rs` exactly once.
#[test]
fn the_catalogue_lists_every_metric_name_once() {
    let consts: BTreeSet<String> = constants(&read("crates/core/src/metric_names.rs"))
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    let listed: Vec<&str> = CATALOGUE.iter().map(|m| m.name).collect();
    let unique: BTreeSet<String> = listed.iter().map(|s| (*s).to_owned()).collect();
    assert_eq!(unique.len(), listed.len(), "a name is listed twice");
    assert_eq!(unique, consts);
}

/// Every `counter!`/`gauge!`/`histogram!` of the workspace records a catalogued constant, as the
/// kind the catalogue says, with exactly the catalogue's labels; every catalogued label is
/// recorded somewhere.
#[test]
fn the_code_records_what_the_catalogue_says() {
    let names: BTreeMap<String, String> = constants(&read("crates/core/src/metric_names.rs"))
        .into_iter()
        .collect();
    let mut problems = Vec::new();
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    let mut calls = 0;
    for dir in ["crates", "bins", "tools", "tests"] {
        for file in rust_files(&root().join(dir)) {
            let rel = file.strip_prefix(root()).unwrap_or(&file);
            // This crate's own tests spell macro calls inside strings.
            if rel.starts_with("tools/deploy") {
                continue;
            }
            let rel = rel.display().to_string();
            let text = std::fs::read_to_string(&file).unwrap();
            for r in recorded(&rel, &text) {
                calls += 1;
                let Some(name) = names.get(&r.constant) else {
                    problems.push(format!(
                        "{}: `{}` is not a constant of crates/core/src/metric_names.rs",
                        r.place, r.constant
                    ));
                    continue;
                };
                let Some(spec) = ps_core::metric_names::lookup(name) else {
                    problems.push(format!("{}: `{name}` is not in CATALOGUE", r.place));
                    continue;
                };
                seen.insert(spec.name);
                if spec.kind != r.kind {
                    problems.push(format!(
                        "{}: `{name}` recorded as {:?}, catalogued as {:?}",
                        r.place, r.kind, spec.kind
                    ));
                }
                let got: BTreeSet<&str> = r.labels.iter().map(String::as_str).collect();
                let want: BTreeSet<&str> = spec.labels.iter().copied().collect();
                if got != want {
                    problems.push(format!(
                        "{}: `{name}` recorded with labels {got:?}, catalogued with {want:?}",
                        r.place
                    ));
                }
            }
        }
    }
    assert!(
        calls > 50,
        "only {calls} metrics calls found: is the scan broken?"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let never: Vec<_> = CATALOGUE
        .iter()
        .filter(|m| !seen.contains(m.name))
        .map(|m| m.name)
        .collect();
    assert!(never.is_empty(), "catalogued but never recorded: {never:?}");
    assert!(
        CATALOGUE.iter().any(|m| m.kind == MetricKind::Histogram),
        "histograms expected"
    );
}

/// `promtool`, or `None` when it is missing and not required.
fn promtool() -> Option<PathBuf> {
    let required = std::env::var("POLICY_SERVING_REQUIRE_PROMTOOL").is_ok_and(|v| v == "1");
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("promtool"))
            .find(|p| p.is_file())
    });
    match found {
        Some(p) => Some(p),
        None if required => panic!(
            "POLICY_SERVING_REQUIRE_PROMTOOL=1 but promtool is not on PATH (apt-get install prometheus)"
        ),
        None => {
            eprintln!("skipped: promtool not found (apt-get install prometheus)");
            None
        }
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn promtool_checks_and_tests_the_alert_rules() {
    let Some(promtool) = promtool() else { return };
    let dir = root().join("deploy/prometheus");
    run(Command::new(&promtool)
        .args(["check", "rules", "alerts.yml"])
        .current_dir(&dir));
    run(Command::new(&promtool)
        .args(["test", "rules", "alerts_test.yml"])
        .current_dir(&dir));
}

/// Every dashboard query is valid PromQL: each becomes a recording rule (Grafana's variables
/// replaced by values) that `promtool check rules` parses.
#[test]
fn promtool_parses_every_dashboard_query() {
    let Some(promtool) = promtool() else { return };
    let mut yaml = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, q) in dashboard().iter().enumerate() {
        let expr = q
            .expr
            .replace("$__rate_interval", "5m")
            .replace("$job", ".*");
        yaml.push_str(&format!(
            "      - record: dashboard:query_{i}\n        expr: {}\n",
            serde_json::to_string(&expr).unwrap()
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard_rules.yml");
    std::fs::write(&file, yaml).unwrap();
    run(Command::new(&promtool).arg("check").arg("rules").arg(&file));
}

/// A `/metrics` page with a series of every catalogued metric: each label takes the values
/// `ok`, `failed` and `teacher_error`, summaries have their quantiles, `_sum` and `_count`, and
/// counters grow with every scrape.
fn exposition(scrape: u64) -> String {
    let mut out = String::new();
    let values = ["ok", "failed", "teacher_error"];
    for m in CATALOGUE {
        let mut label_sets = vec![String::new()];
        for l in m.labels {
            label_sets = label_sets
                .iter()
                .flat_map(|prefix| {
                    values.iter().map(move |v| {
                        let sep = if prefix.is_empty() { "" } else { "," };
                        format!("{prefix}{sep}{l}=\"{v}\"")
                    })
                })
                .collect();
        }
        match m.kind {
            MetricKind::Histogram => {
                out.push_str(&format!("# TYPE {} summary\n", m.name));
                for q in ["0.5", "0.9", "0.99"] {
                    out.push_str(&format!("{}{{quantile=\"{q}\"}} 0.25\n", m.name));
                }
                out.push_str(&format!(
                    "{}_sum {}\n{}_count {}\n",
                    m.name,
                    scrape,
                    m.name,
                    4 * scrape
                ));
            }
            kind => {
                let ty = if kind == MetricKind::Counter {
                    "counter"
                } else {
                    "gauge"
                };
                out.push_str(&format!("# TYPE {} {ty}\n", m.name));
                for set in &label_sets {
                    out.push_str(&format!("{}{{{set}}} {}\n", m.name, scrape + 1));
                }
            }
        }
    }
    out
}

/// Serves [`exposition`] on a loopback port from a thread; returns `host:port`.
fn serve_exposition() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for (scrape, stream) in listener.incoming().enumerate() {
            let Ok(mut s) = stream else { continue };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let body = exposition(scrape as u64);
            let _ = write!(
                s,
                "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr.to_string()
}

/// Grafana's variables as Prometheus sees them after substitution.
fn grafana_to_promql(expr: &str) -> String {
    expr.replace("$__rate_interval", "30s")
        .replace("$job", ".*")
}

/// Prometheus scrapes a page with every catalogued series and evaluates every dashboard query to
/// at least one series. (The end-to-end tests do the same against the running demo.)
#[test]
fn prometheus_evaluates_every_dashboard_query_to_series() {
    let target = serve_exposition();
    let Some(prom) =
        ps_deploy::prometheus::Prometheus::start(std::slice::from_ref(&target)).unwrap()
    else {
        return;
    };
    prom.wait_scraped(1, 3, std::time::Duration::from_secs(60))
        .unwrap();
    let mut empty = Vec::new();
    for q in dashboard() {
        let result = prom
            .query(&grafana_to_promql(&q.expr))
            .unwrap_or_else(|e| panic!("{}: {e}", q.place));
        if result.is_empty() {
            empty.push(format!("{}: {}", q.place, q.expr));
        }
    }
    assert!(
        empty.is_empty(),
        "queries without series:\n{}",
        empty.join("\n")
    );
}
