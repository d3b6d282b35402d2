//! `GET /health` (and `/healthz`), `GET /v1/models`, `GET /metrics`.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::state::AppState;

/// `{"status":"ok","submission_enabled":true,"upstream":{"url":..,"reachable":..}}`. The proxy itself is
/// up whenever it answers; the upstream's state is reported beside it.
pub async fn health(State(app): State<AppState>) -> Json<Value> {
    let policy = &app.0.policy;
    let mut upstream = json!({"url": policy.chat_url(), "reachable": true});
    if let Err(e) = policy.health().await {
        upstream["reachable"] = json!(false);
        upstream["error"] = json!(e.to_string());
    }
    Json(json!({
        "status": "ok",
        "submission_enabled": app.submission_enabled(),
        "upstream": upstream,
    }))
}

/// The served model and the other names a client may ask for (`server.model_names`).
pub async fn models(State(app): State<AppState>) -> Json<Value> {
    let opts = app.options();
    let names = std::iter::once(&opts.served_model_name).chain(
        opts.model_names
            .keys()
            .filter(|n| **n != opts.served_model_name),
    );
    let data: Vec<Value> = names
        .map(|id| json!({"id": id, "object": "model", "owned_by": "policy-serving"}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// The process's resident memory (`VmRSS` of `/proc/self/status`; `None` where there is none).
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kb * 1024)
}

/// Sets `splice_boundary_mismatches_total` to `count`, the process-wide count the chat-template
/// crate keeps (it records no metrics itself), with its `# HELP`.
fn record_splice_mismatches(count: u64) {
    use ps_core::metric_names as m;
    metrics::describe_counter!(
        m::SPLICE_BOUNDARY_MISMATCHES_TOTAL,
        "Texts whose cached token ids disagreed with them on their added tokens; encoded whole \
         instead (exact). Should stay 0."
    );
    metrics::counter!(m::SPLICE_BOUNDARY_MISMATCHES_TOTAL).absolute(count);
}

/// Sets the gauges from the current state, so that a scrape sees fresh values.
async fn refresh_gauges(app: &AppState) {
    use ps_core::metric_names as m;
    metrics::gauge!(m::SUBMISSION_ENABLED).set(if app.submission_enabled() { 1.0 } else { 0.0 });
    if let Some(bytes) = resident_bytes() {
        metrics::gauge!(m::RESIDENT_MEMORY_BYTES).set(bytes as f64);
    }
    record_splice_mismatches(ps_chat_template::boundary_mismatches());
    let queued = app.capture().queued();
    metrics::gauge!(m::CAPTURE_QUEUED_TURNS).set(queued.turns() as f64);
    metrics::gauge!(m::CAPTURE_QUEUED_BYTES).set(queued.bytes() as f64);
    if let Some(matcher) = &app.0.matcher {
        metrics::gauge!(m::INFERRED_SESSIONS_LIVE).set(matcher.stats().live_sessions as f64);
    }
    if let Some(r) = app.rollout() {
        let b = r.buffer.status();
        metrics::gauge!(m::LIVE_SESSIONS).set(b.live_sessions as f64);
        for (state, n) in [
            ("waiting_capture", b.pending.waiting_capture),
            ("waiting_next_state", b.pending.waiting_next_state),
            ("scoring", b.pending.scoring),
            ("waiting_order", b.pending.waiting_order),
        ] {
            metrics::gauge!(m::PENDING_TURNS, "state" => state).set(n as f64);
        }
        // An unreachable store keeps the last values; the failure is logged where it matters
        // (submission and the rollout routes).
        if let Ok(st) = r.store.stats().await {
            metrics::gauge!(m::STORE_SAMPLES).set(st.stored as f64);
            metrics::gauge!(m::STORE_LAG_SAMPLES).set(st.lag as f64);
        }
    }
}

pub async fn metrics(State(app): State<AppState>) -> Response {
    refresh_gauges(&app).await;
    match &app.0.metrics {
        Some(h) => (
            [(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            h.render(),
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            "metrics are not enabled in this process",
        )
            .into_response(),
    }
}

/// Unknown routes, in the OpenAI error shape.
pub async fn not_found(uri: axum::http::Uri) -> Response {
    let body = crate::error::error_body(
        &format!("no route {}; see the README for the endpoints", uri.path()),
        "invalid_request_error",
        "not_found",
    );
    (StatusCode::NOT_FOUND, Json(body)).into_response()
}

/// A known route with the wrong method, in the OpenAI error shape.
pub async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let body = crate::error::error_body(
        &format!("{method} is not allowed on {}", uri.path()),
        "invalid_request_error",
        "method_not_allowed",
    );
    (StatusCode::METHOD_NOT_ALLOWED, Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counter is exposed with its `# HELP` and `# TYPE`, and `promtool check metrics` accepts
    /// the exposition (when promtool is installed; required with `POLICY_SERVING_REQUIRE_PROMTOOL=1`).
    #[test]
    fn splice_mismatches_are_exposed_with_help() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || record_splice_mismatches(3));
        let text = handle.render();
        let name = ps_core::metric_names::SPLICE_BOUNDARY_MISMATCHES_TOTAL;
        assert!(text.contains(&format!("# HELP {name} ")), "{text}");
        assert!(text.contains(&format!("# TYPE {name} counter")), "{text}");
        assert!(text.contains(&format!("{name} 3")), "{text}");

        let promtool = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn();
        let mut child = match promtool {
            Ok(child) => child,
            Err(_) if std::env::var_os("POLICY_SERVING_REQUIRE_PROMTOOL").is_none() => {
                eprintln!("skipped: promtool not found (apt-get install prometheus)");
                return;
            }
            Err(e) => panic!("POLICY_SERVING_REQUIRE_PROMTOOL=1 but promtool does not run: {e}"),
        };
        {
            use std::io::Write as _;
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(text.as_bytes()).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "promtool check metrics: {}{}\n{text}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
