//! The report: per-phase figures, the proxy's costs, the targets (pass/miss, never asserted), as a
//! human table or JSON.

use std::fmt::Write as _;

use serde::Serialize;

use crate::stats::Summary;

/// Targets of `docs/benchmarks.md`.
pub const TARGET_ADDED_P99_MS: f64 = 1.0;
/// The session count at which the added-latency target is defined.
pub const TARGET_ADDED_AT_SESSIONS: usize = 64;
pub const TARGET_PROXY_CPU_MS: f64 = 0.5;
pub const TARGET_THROUGHPUT_RATIO: f64 = 0.5;

#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub clock_ticks_per_second: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Config {
    pub sessions: usize,
    pub turns: usize,
    pub rounds: usize,
    pub requests_per_phase: usize,
    pub warmup_sessions: usize,
    pub warmup_turns: usize,
    pub fake_latency_ms: f64,
    pub ramp_ms: f64,
    pub max_seconds: f64,
    pub model_dir: String,
}

/// CPU milliseconds per answered request, per process. `resolution` is one clock tick divided by
/// the requests: figures below it are noise.
#[derive(Debug, Clone, Serialize)]
pub struct CpuPerRequest {
    /// From idle to idle (background capture included); proxied phases only.
    pub proxy: Option<f64>,
    pub fake: Option<f64>,
    pub loadgen: Option<f64>,
    pub resolution: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PhaseReport {
    pub name: String,
    pub via_proxy: bool,
    pub stream: bool,
    pub rounds: usize,
    pub requests: usize,
    pub errors: usize,
    pub first_errors: Vec<String>,
    pub cut_by_deadline: bool,
    pub wall_s: f64,
    pub throughput_rps: f64,
    /// Client latency: send to the last byte.
    pub latency_ms: Option<Summary>,
    /// Send to the first body byte (streamed phases).
    pub ttfb_ms: Option<Summary>,
    /// The proxy's `Server-Timing: upstream;dur=…`.
    pub upstream_ms: Option<Summary>,
    /// Client latency minus the upstream duration, per request.
    pub added_ms: Option<Summary>,
    /// Proxied non-streamed answers without a usable `Server-Timing` header.
    pub missing_server_timing: usize,
    pub mean_request_bytes: Option<f64>,
    pub mean_response_bytes: Option<f64>,
    pub cpu_ms_per_request: CpuPerRequest,
    /// How long the proxy's CPU time kept rising after the last answer (background capture).
    pub proxy_settle_s: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProxyReport {
    pub rss_kib: u64,
    pub peak_rss_kib: u64,
    /// Lines the proxy logged (level warn) during the whole run, and the first few.
    pub log_lines: usize,
    pub log_excerpt: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TargetCheck {
    pub name: String,
    pub goal: String,
    pub value: Option<f64>,
    /// `None` when the figure is missing.
    pub pass: Option<bool>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub unix_time: u64,
    pub machine: Machine,
    pub config: Config,
    pub phases: Vec<PhaseReport>,
    pub proxy: ProxyReport,
    /// Proxy throughput / direct throughput (non-streamed phases).
    pub throughput_ratio: Option<f64>,
    pub targets: Vec<TargetCheck>,
    pub notes: Vec<String>,
}

impl Report {
    pub fn new(
        machine: Machine,
        config: Config,
        phases: Vec<PhaseReport>,
        proxy: ProxyReport,
    ) -> Self {
        let find = |name: &str| phases.iter().find(|p| p.name == name);
        let (direct, proxied) = (find("direct"), find("proxy"));
        let throughput_ratio = match (direct, proxied) {
            (Some(d), Some(p)) if d.throughput_rps > 0.0 => {
                Some(p.throughput_rps / d.throughput_rps)
            }
            _ => None,
        };
        let added_p99 = proxied.and_then(|p| p.added_ms).map(|s| s.p99);
        let cpu = proxied.and_then(|p| p.cpu_ms_per_request.proxy);
        let check =
            |name: String, goal: String, value: Option<f64>, ok: fn(f64) -> bool| TargetCheck {
                name,
                goal,
                value,
                pass: value.map(ok),
            };
        let targets = vec![
            check(
                format!("added latency p99 ({} sessions)", config.sessions),
                format!("< {TARGET_ADDED_P99_MS} ms at {TARGET_ADDED_AT_SESSIONS} sessions"),
                added_p99,
                |v| v < TARGET_ADDED_P99_MS,
            ),
            check(
                format!(
                    "proxy CPU per request ({}-turn conversations)",
                    config.turns
                ),
                format!("< {TARGET_PROXY_CPU_MS} ms"),
                cpu,
                |v| v < TARGET_PROXY_CPU_MS,
            ),
            check(
                "throughput proxy / direct".into(),
                format!(">= {TARGET_THROUGHPUT_RATIO}"),
                throughput_ratio,
                |v| v >= TARGET_THROUGHPUT_RATIO,
            ),
        ];
        let mut notes = Vec::new();
        if config.sessions != TARGET_ADDED_AT_SESSIONS {
            notes.push(format!(
                "the added-latency target is defined at {TARGET_ADDED_AT_SESSIONS} sessions; this run used {}",
                config.sessions
            ));
        }
        for p in &phases {
            if p.errors > 0 {
                notes.push(format!(
                    "{}: {} failed requests, first: {:?}",
                    p.name, p.errors, p.first_errors
                ));
            }
            if p.cut_by_deadline {
                notes.push(format!("{}: cut short by --max-seconds", p.name));
            }
            if p.missing_server_timing > 0 {
                notes.push(format!(
                    "{}: {} answers without `Server-Timing: upstream;dur=…` (is the proxy binary rebuilt?)",
                    p.name, p.missing_server_timing
                ));
            }
            if let (Some(cpu), Some(res)) =
                (p.cpu_ms_per_request.proxy, p.cpu_ms_per_request.resolution)
                && res > cpu / 5.0
            {
                notes.push(format!(
                    "{}: proxy CPU per request is coarse: one clock tick is {res:.3} ms per request",
                    p.name
                ));
            }
        }
        if proxy.log_lines > 0 {
            notes.push(format!(
                "the proxy logged {} lines at warn level",
                proxy.log_lines
            ));
        }
        let unix_time = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self {
            unix_time,
            machine,
            config,
            phases,
            proxy,
            throughput_ratio,
            targets,
            notes,
        }
    }

    /// The human-readable table.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let c = &self.config;
        let _ = writeln!(
            out,
            "policy-serving load test: {} sessions x {} turns x {} rounds = {} requests per phase; \
             fake latency {} ms; ramp {} ms; {} CPUs; model {}",
            c.sessions,
            c.turns,
            c.rounds,
            c.requests_per_phase,
            c.fake_latency_ms,
            c.ramp_ms,
            self.machine.cpus,
            c.model_dir
        );
        let _ = writeln!(
            out,
            "\n{:<14} {:>5} {:>4} {:>7} {:>8}   {:>8} {:>8} {:>8}   {:>8} {:>8} {:>8}",
            "phase",
            "reqs",
            "err",
            "wall s",
            "req/s",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "cpu prx",
            "cpu fake",
            "cpu lg"
        );
        let opt = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
        let row = |out: &mut String, label: &str, s: Option<Summary>| {
            let _ = writeln!(
                out,
                "  {label:<12} {:>5} {:>4} {:>7} {:>8}   {:>8} {:>8} {:>8}",
                "",
                "",
                "",
                "",
                opt(s.map(|s| s.p50)),
                opt(s.map(|s| s.p90)),
                opt(s.map(|s| s.p99)),
            );
        };
        for p in &self.phases {
            let l = p.latency_ms;
            let cpu = &p.cpu_ms_per_request;
            let _ = writeln!(
                out,
                "{:<14} {:>5} {:>4} {:>7.2} {:>8.1}   {:>8} {:>8} {:>8}   {:>8} {:>8} {:>8}",
                p.name,
                p.requests,
                p.errors,
                p.wall_s,
                p.throughput_rps,
                opt(l.map(|s| s.p50)),
                opt(l.map(|s| s.p90)),
                opt(l.map(|s| s.p99)),
                opt(cpu.proxy),
                opt(cpu.fake),
                opt(cpu.loadgen),
            );
            if p.stream {
                row(&mut out, "ttfb", p.ttfb_ms);
            } else if p.via_proxy {
                row(&mut out, "upstream", p.upstream_ms);
                row(&mut out, "added", p.added_ms);
            }
        }
        let _ = writeln!(
            out,
            "\n(latencies in ms; cpu = CPU ms per request of the proxy (idle to idle, capture included), the fake and this load generator)"
        );
        if let Some(p) = self.phases.iter().find(|p| p.name == "proxy") {
            let _ = writeln!(
                out,
                "request body: {} bytes on average; proxy CPU settled {} s after the last answer",
                opt(p.mean_request_bytes),
                opt(p.proxy_settle_s),
            );
        }
        let mib = |kib: u64| kib as f64 / 1024.0;
        let _ = writeln!(
            out,
            "proxy memory: RSS {:.1} MiB now, {:.1} MiB peak",
            mib(self.proxy.rss_kib),
            mib(self.proxy.peak_rss_kib)
        );
        let _ = writeln!(
            out,
            "throughput proxy/direct: {}",
            opt(self.throughput_ratio)
        );
        let _ = writeln!(out, "\ntargets:");
        for t in &self.targets {
            let verdict = match t.pass {
                Some(true) => "PASS",
                Some(false) => "MISS",
                None => "n/a ",
            };
            let _ = writeln!(
                out,
                "  [{verdict}] {:<45} {:>9}   (target {})",
                t.name,
                opt(t.value),
                t.goal
            );
        }
        if !self.notes.is_empty() {
            let _ = writeln!(out, "\nnotes:");
            for n in &self.notes {
                let _ = writeln!(out, "  - {n}");
            }
        }
        out
    }
}
