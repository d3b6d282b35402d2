//! The soak: a long, bounded run of many sessions through the proxy in RL mode (PRM votes served by
//! the fake's `/generate`), with a trainer pulling and committing the samples as they come, to see
//! whether the proxy's memory returns to its baseline once every session is flushed (by
//! `X-Session-Done`, or by `server.session_timeout_sec`) and every sample committed.
//!
//! Order: start the children; warm up (direct and proxied, unmeasured); phase A, the soak's first
//! `direct_sessions` sessions straight to the fake (the baseline throughput of the same run); wait
//! until the proxy has flushed everything and the trainer committed it, and the proxy is idle: the
//! baseline RSS; phase B, the soak; wait for the flush and idle again: the end RSS. The proxy's RSS
//! is read every `rss_every` during phase B and its drain.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::procfs::Proc;
use crate::report::{MemoryReport, RssPoint, SoakConfigReport, SoakReport};
use crate::workload::{PhaseSpec, Turns};
use crate::{
    IDLE_BOUND, IDLE_POLL, LoadgenError, ProxyOptions, Rig, TrainedRig, WARMUP_SESSIONS,
    measure_round, phase_report, warm_up,
};

/// Defaults of the `soak` command (see `docs/benchmarks.md`).
pub const DEFAULT_SESSIONS: usize = 10_000;
pub const DEFAULT_MIN_TURNS: usize = 5;
pub const DEFAULT_MAX_TURNS: usize = 20;
pub const DEFAULT_SEED: u64 = 1;
pub const DEFAULT_CONCURRENCY: usize = 64;
/// The proxy's `prm.num_votes` (its default, which the soak keeps): judge calls per scored turn.
pub const PRM_VOTES: usize = 3;
/// Default judge slots (`prm.max_concurrency`) per session in flight: a turn needs [`PRM_VOTES`]
/// judge calls, each as slow as a chat answer from the same fake, plus headroom.
pub const JUDGE_SLOTS_PER_SESSION: usize = PRM_VOTES + 1;
pub const DEFAULT_DIRECT_SESSIONS: usize = 1_000;
pub const DEFAULT_TRAINER_PAGE: usize = 256;
pub const DEFAULT_TRAINER_WAIT: Duration = Duration::from_millis(500);
pub const DEFAULT_RSS_EVERY: Duration = Duration::from_secs(1);
/// How often the proxy's status is polled while waiting for the flush.
const FLUSH_POLL: Duration = Duration::from_millis(200);
/// A progress line every this many RSS readings.
const PROGRESS_EVERY: usize = 10;

/// How the soak's sessions end in the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionClose {
    /// The last turn carries `X-Session-Done: true`.
    DoneHeader,
    /// No done header: the proxy closes each session after `secs` idle (`server.session_timeout_sec`).
    Timeout { secs: u64 },
}

/// What to run.
#[derive(Debug, Clone)]
pub struct SoakConfig {
    pub fake_bin: PathBuf,
    pub proxy_bin: PathBuf,
    pub model_dir: PathBuf,
    pub sessions: usize,
    /// Each session has a seeded pseudo-random number of turns in `min_turns..=max_turns`.
    pub min_turns: usize,
    pub max_turns: usize,
    pub seed: u64,
    /// Sessions in flight at once.
    pub concurrency: usize,
    /// Phase A: this many of the soak's sessions (the first ones, same turn counts) straight to the
    /// fake; 0 skips it.
    pub direct_sessions: usize,
    /// Sessions of the unmeasured warm-up, per phase kind.
    pub warmup_sessions: usize,
    pub close: SessionClose,
    /// The proxy's `prm.max_concurrency` (`None`: its default, 64). With fewer judge slots than
    /// [`PRM_VOTES`] × `concurrency` the judge cannot keep up with the sessions and the turns
    /// waiting for it pile up in the proxy (see `docs/benchmarks-history.md`).
    pub prm_max_concurrency: Option<usize>,
    pub fake_latency: Duration,
    /// `store.retain_committed` for the proxy (`None`: its default).
    pub retain_committed: Option<u64>,
    /// The trainer's page size and long-poll bound.
    pub trainer_page: usize,
    pub trainer_wait: Duration,
    /// What the trainer asks its pages in (MessagePack, as the Python bridge does).
    pub trainer_format: crate::trainer::PageFormat,
    /// Period of the RSS readings.
    pub rss_every: Duration,
    /// The whole run stops by itself after this long.
    pub max_duration: Duration,
    /// After the end reading, stop the trainer, wait this long (no request at all; cut short at
    /// `max_duration`) and read the RSS once more: with 200 s, what stays once the client pools
    /// have closed the connections the soak opened (hyper-util closes an idle connection 90–180 s
    /// after its last use: a 90 s timeout checked every 90 s); zero: no wait.
    pub idle_after: Duration,
}

impl SoakConfig {
    fn turns(&self) -> Turns {
        Turns::Seeded {
            seed: self.seed,
            min: self.min_turns,
            max: self.max_turns,
        }
    }
}

/// Runs the soak; `progress` receives one line per step and one every few seconds during the soak.
/// Ctrl-C or SIGTERM stops it, and the children are killed as the run is dropped.
pub async fn run(cfg: &SoakConfig, progress: impl Fn(&str)) -> Result<SoakReport, LoadgenError> {
    tokio::select! {
        report = run_to_end(cfg, progress) => report,
        signal = crate::interrupted() => Err(LoadgenError::Interrupted(signal)),
    }
}

/// RSS readings of the proxy, taken when due.
pub(crate) struct Sampler {
    proc: Proc,
    pub(crate) answered: Arc<AtomicUsize>,
    started: Instant,
    every: Duration,
    due: Instant,
    pub(crate) series: Vec<RssPoint>,
}

impl Sampler {
    pub(crate) fn new(proc: Proc, answered: Arc<AtomicUsize>, every: Duration) -> Self {
        let now = Instant::now();
        Self {
            proc,
            answered,
            started: now,
            every,
            due: now,
            series: Vec::new(),
        }
    }

    /// Takes a reading if one is due; returns it.
    pub(crate) fn sample(&mut self) -> Result<Option<RssPoint>, LoadgenError> {
        let now = Instant::now();
        if now < self.due {
            return Ok(None);
        }
        self.due = now + self.every;
        let point = RssPoint {
            t_s: now.duration_since(self.started).as_secs_f64(),
            turns: self.answered.load(Ordering::Relaxed),
            rss_kib: self.proc.rss_kib()?.0,
        };
        self.series.push(point);
        Ok(Some(point))
    }
}

/// The numbers of `GET /v1/rollout/status` the flush waits on.
fn flushed(status: &Value) -> bool {
    let pending: u64 = status["pending"]
        .as_object()
        .map_or(u64::MAX, |p| p.values().filter_map(Value::as_u64).sum());
    status["live_sessions"].as_u64() == Some(0) && pending == 0 && status["lag"].as_u64() == Some(0)
}

async fn rollout_status(client: &reqwest::Client, base_url: &str) -> Result<Value, LoadgenError> {
    let err = |detail: String| LoadgenError::Rollout {
        what: "GET /v1/rollout/status",
        detail,
    };
    let resp = client
        .get(format!("{base_url}/v1/rollout/status"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .map_err(|e| err(e.to_string()))?;
    let status = resp.status();
    let body = resp.bytes().await.map_err(|e| err(e.to_string()))?;
    if !status.is_success() {
        return Err(err(format!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(&body)
        )));
    }
    serde_json::from_slice(&body).map_err(|e| err(format!("not JSON: {e}")))
}

/// Waits until the proxy holds no live session and no pending turn and the trainer has committed
/// everything stored; samples RSS meanwhile when `sampler` is given. Returns the last status.
pub(crate) async fn wait_flushed(
    rig: &mut Rig,
    mut sampler: Option<&mut Sampler>,
    deadline: Instant,
    what: &'static str,
) -> Result<Value, LoadgenError> {
    let base_url = rig.proxy.base_url();
    loop {
        rig.ensure_running()?;
        if let Some(s) = sampler.as_deref_mut() {
            s.sample()?;
        }
        let status = rollout_status(&rig.client, &base_url).await?;
        if flushed(&status) {
            return Ok(status);
        }
        if Instant::now() >= deadline {
            return Err(LoadgenError::TimeBound(what));
        }
        tokio::time::sleep(FLUSH_POLL).await;
    }
}

async fn run_to_end(cfg: &SoakConfig, progress: impl Fn(&str)) -> Result<SoakReport, LoadgenError> {
    let deadline = Instant::now() + cfg.max_duration;
    let options = ProxyOptions {
        prm: true,
        prm_max_concurrency: cfg.prm_max_concurrency,
        session_timeout_sec: match cfg.close {
            SessionClose::DoneHeader => None,
            SessionClose::Timeout { secs } => Some(secs),
        },
        retain_committed: cfg.retain_committed,
        retokenize: false,
        admin_key: false,
        sglang_max_concurrency: None,
        ..ProxyOptions::default()
    };
    let idle = cfg.concurrency.max(cfg.warmup_sessions) + WARMUP_SESSIONS;
    let TrainedRig {
        mut rig,
        procs,
        start_kib,
        trainer,
        mut direct,
        mut proxy,
    } = Rig::start(
        (&cfg.fake_bin, &cfg.proxy_bin),
        &cfg.model_dir,
        crate::FakeOptions::new(cfg.fake_latency),
        &options,
        idle,
        deadline,
        &progress,
    )
    .await?
    .with_trainer(cfg.trainer_page, cfg.trainer_wait, cfg.trainer_format)?;
    let turns = cfg.turns();
    if cfg.warmup_sessions > 0 {
        // Other seeds than the soak's, so the warm-up is not a replay of its first sessions.
        let warm_turns = Turns::Seeded {
            seed: !cfg.seed,
            min: cfg.min_turns,
            max: cfg.max_turns,
        };
        warm_up(
            &rig.client,
            std::slice::from_ref(&direct),
            WARMUP_SESSIONS.min(cfg.warmup_sessions),
            warm_turns,
            deadline,
            &progress,
        )
        .await?;
        warm_up(
            &rig.client,
            std::slice::from_ref(&proxy),
            cfg.warmup_sessions,
            warm_turns,
            deadline,
            &progress,
        )
        .await?;
    }

    if cfg.direct_sessions > 0 {
        let spec = PhaseSpec {
            concurrency: cfg.concurrency,
            ..direct.spec(
                "soak",
                cfg.direct_sessions.min(cfg.sessions),
                turns,
                Duration::ZERO,
            )
        };
        measure_round(&rig.client, &spec, deadline, &procs, &mut direct).await?;
        progress(&format!(
            "phase A (direct): {} turns of {} sessions, {:.0} turns/s, {} errors",
            direct.run.samples.len(),
            spec.sessions,
            direct.run.samples.len() as f64 / direct.run.wall.as_secs_f64().max(1e-9),
            direct.run.errors
        ));
    }

    wait_flushed(
        &mut rig,
        None,
        deadline,
        "waiting for the warm-up to be flushed",
    )
    .await?;
    let (proxy_before, _) = procs.proxy.wait_idle(IDLE_POLL, IDLE_BOUND).await?;
    let baseline = procs.proxy.rss_kib()?;
    progress(&format!(
        "baseline: proxy RSS {:.1} MiB (VmHWM {:.1} MiB), trainer committed through {}",
        baseline.0 as f64 / 1024.0,
        baseline.1 as f64 / 1024.0,
        trainer.committed()
    ));

    // Phase B: the soak.
    let spec = PhaseSpec {
        concurrency: cfg.concurrency,
        done_header: cfg.close == SessionClose::DoneHeader,
        ..proxy.spec("soak", cfg.sessions, turns, Duration::ZERO)
    };
    let planned = turns.total(cfg.sessions);
    let mut sampler = Sampler::new(procs.proxy, spec.answered.clone(), cfg.rss_every);
    let fake_before = procs.fake.cpu_ticks()?;
    let me_before = procs.me.cpu_ticks()?;
    let client = rig.client.clone();
    let work = crate::run_phase(&client, &spec, deadline);
    tokio::pin!(work);
    let mut tick = tokio::time::interval(cfg.rss_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let run = loop {
        tokio::select! {
            run = &mut work => break run,
            _ = tick.tick() => {
                rig.ensure_running()?;
                if let Some(p) = sampler.sample()?
                    && sampler.series.len() % PROGRESS_EVERY == 1
                {
                    progress(&format!(
                        "soak {:.0} s: {} of {planned} turns answered, proxy RSS {:.1} MiB, trainer committed through {}",
                        p.t_s,
                        p.turns,
                        p.rss_kib as f64 / 1024.0,
                        trainer.committed()
                    ));
                }
            }
        }
    };
    let last_answer = Instant::now();
    progress(&format!(
        "soak: {} turns answered in {:.1} s, {} errors; waiting for the flush",
        run.samples.len(),
        run.wall.as_secs_f64(),
        run.errors
    ));
    let status = wait_flushed(
        &mut rig,
        Some(&mut sampler),
        deadline,
        "waiting for the soak to be flushed",
    )
    .await?;
    let drain_s = last_answer.elapsed().as_secs_f64();
    let (proxy_after, settle) = procs.proxy.wait_idle(IDLE_POLL, IDLE_BOUND).await?;
    proxy.proxy_ticks = proxy_after.saturating_sub(proxy_before);
    proxy.fake_ticks = procs.fake.cpu_ticks()?.saturating_sub(fake_before);
    proxy.me_ticks = procs.me.cpu_ticks()?.saturating_sub(me_before);
    proxy.settle = settle;
    proxy.absorb(run);
    let end = procs.proxy.rss_kib()?;
    sampler.due = Instant::now();
    sampler.sample()?;
    progress(&format!(
        "end: proxy RSS {:.1} MiB ({:.3} x baseline), flushed {drain_s:.1} s after the last answer",
        end.0 as f64 / 1024.0,
        end.0 as f64 / baseline.0.max(1) as f64
    ));

    // The trainer stops before the idle wait, so that its figures do not depend on the wait and
    // the proxy sees no request at all during it.
    let tally = trainer.finish().await;
    let after_idle = if cfg.idle_after.is_zero() {
        None
    } else {
        // Within the run's time bound (`max_duration`): a wait cut short is reported as such.
        let wait = cfg
            .idle_after
            .min(deadline.saturating_duration_since(Instant::now()));
        progress(&format!(
            "waiting {:.0} s idle for a last RSS reading",
            wait.as_secs_f64()
        ));
        tokio::time::sleep(wait).await;
        rig.ensure_running()?;
        let (kib, _) = procs.proxy.rss_kib()?;
        progress(&format!(
            "after {:.0} s idle: proxy RSS {:.1} MiB ({:.3} x baseline)",
            wait.as_secs_f64(),
            kib as f64 / 1024.0,
            kib as f64 / baseline.0.max(1) as f64
        ));
        Some((wait, kib))
    };

    let coverage =
        crate::trainer::coverage(&spec.session_prefix, &proxy.run.answered, &tally.received);
    let proxy_process = rig.proxy_report()?;
    let machine = rig.machine();
    drop(rig);

    let config = SoakConfigReport {
        sessions: cfg.sessions,
        min_turns: cfg.min_turns,
        max_turns: cfg.max_turns,
        seed: cfg.seed,
        planned_turns: planned,
        concurrency: cfg.concurrency,
        close: match cfg.close {
            SessionClose::DoneHeader => "done_header".into(),
            SessionClose::Timeout { .. } => "timeout".into(),
        },
        session_timeout_sec: options.session_timeout_sec,
        prm_max_concurrency: cfg.prm_max_concurrency,
        direct_sessions: if direct.rounds > 0 {
            cfg.direct_sessions.min(cfg.sessions)
        } else {
            0
        },
        warmup_sessions: cfg.warmup_sessions,
        fake_latency_ms: cfg.fake_latency.as_secs_f64() * 1e3,
        trainer_page: cfg.trainer_page,
        trainer_wait_ms: u64::try_from(cfg.trainer_wait.as_millis()).unwrap_or(u64::MAX),
        retain_committed: cfg.retain_committed,
        rss_every_ms: u64::try_from(cfg.rss_every.as_millis()).unwrap_or(u64::MAX),
        max_seconds: cfg.max_duration.as_secs_f64(),
        model_dir: cfg.model_dir.display().to_string(),
        idle_after_s: cfg.idle_after.as_secs_f64(),
    };
    let mut memory = MemoryReport::new(start_kib, baseline, end, sampler.series);
    if let Some((wait, kib)) = after_idle {
        memory = memory.with_after_idle(wait.as_secs_f64(), kib);
    }
    let direct = (direct.rounds > 0).then(|| phase_report(direct, &procs));
    Ok(SoakReport::new(
        machine,
        config,
        direct,
        phase_report(proxy, &procs),
        drain_s,
        tally,
        coverage,
        status,
        memory,
        proxy_process,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn flushed_needs_no_session_no_pending_turn_and_no_lag() {
        let status = |live: u64, scoring: u64, lag: u64| {
            json!({"live_sessions": live, "lag": lag, "pending": {
                "waiting_capture": 0, "waiting_next_state": 0, "scoring": scoring, "waiting_order": 0}})
        };
        assert!(flushed(&status(0, 0, 0)));
        assert!(!flushed(&status(1, 0, 0)));
        assert!(!flushed(&status(0, 2, 0)));
        assert!(!flushed(&status(0, 0, 3)));
        assert!(!flushed(&json!({"live_sessions": 0, "lag": 0})));
    }
}
