//! What the inspection history costs the chat path: the time of one `observe` call (the server
//! and the session buffer make a few per turn), alone and while the page is open and reading.
//!
//! Writers tell the events of whole turns (opened, captured, PRM votes, submitted) for
//! `--sessions` sessions round-robin, `--turns` turns each; "page open" adds a reader that asks for
//! the overview, the sessions list and one timeline every `--read-ms` milliseconds (the page polls
//! every 2 s: the default of 50 ms is forty times harsher). Each call is timed on its own; the
//! report gives p50, p99, p99.9 and the maximum, and `NoObserver` (the server without the page) for
//! reference.
//!
//! Run: `cargo bench -p ps-inspect --bench history -- [--sessions N] [--turns T] [--writers W] [--read-ms MS]`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ps_core::{NoObserver, SessionSource, TurnEvent, TurnObserver, TurnType};
use ps_inspect::history::now_ms;
use ps_inspect::{HistoryLimits, InspectHistory};

/// Options, after `--` (`--bench` and a filter, as cargo passes them, are accepted and ignored).
#[derive(clap::Parser)]
struct Args {
    #[arg(long, default_value_t = 500)]
    sessions: usize,
    #[arg(long, default_value_t = 40)]
    turns: usize,
    #[arg(long, default_value_t = 2)]
    writers: usize,
    #[arg(long, default_value_t = 50)]
    read_ms: usize,
    #[arg(long, hide = true)]
    bench: bool,
    #[arg(hide = true)]
    filter: Option<String>,
}

/// Tells the events of `turns` turns of `sessions` sessions; returns each call's time in ns.
fn write(obs: &dyn TurnObserver, writer: usize, sessions: usize, turns: u64) -> Vec<u64> {
    let ids: Vec<String> = (0..sessions)
        .map(|i| format!("w{writer}-session-{i:05}"))
        .collect();
    let mut times = Vec::with_capacity(sessions * turns as usize * 4);
    let votes = [Some(1i8), Some(1), Some(-1)];
    for t in 1..=turns {
        for id in &ids {
            let events = [
                TurnEvent::Opened {
                    session: id,
                    turn: Some(t),
                    turn_type: TurnType::Main,
                    source: SessionSource::Header,
                    streamed: false,
                    door: ps_core::Door::ChatCompletions,
                },
                TurnEvent::Captured {
                    session: id,
                    turn: t,
                    response_tokens: 300,
                },
                TurnEvent::PrmVotes {
                    session: id,
                    turn: t,
                    votes: &votes,
                    score: 1.0,
                },
                TurnEvent::Submitted {
                    session: id,
                    turn: t,
                    seq: t,
                    reward: 1.0,
                    excluded: None,
                },
            ];
            for e in events {
                let started = Instant::now();
                obs.observe(e);
                times.push(started.elapsed().as_nanos() as u64);
            }
        }
    }
    times
}

fn report(name: &str, mut times: Vec<u64>) {
    times.sort_unstable();
    let q = |p: f64| times[((times.len() as f64 - 1.0) * p) as usize];
    let mean = times.iter().sum::<u64>() as f64 / times.len() as f64;
    println!(
        "{name:<34} {:>9} calls  mean {:>6.0} ns  p50 {:>6} ns  p99 {:>6} ns  p99.9 {:>7} ns  max {:>8} ns",
        times.len(),
        mean,
        q(0.5),
        q(0.99),
        q(0.999),
        times[times.len() - 1]
    );
}

fn run(
    name: &str,
    obs: Arc<dyn TurnObserver>,
    history: Option<Arc<InspectHistory>>,
    args: (usize, u64, usize, u64),
) {
    let (sessions, turns, writers, read_ms) = args;
    let stop = Arc::new(AtomicBool::new(false));
    let reader = history.map(|h| {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let _ = h.overview_at(now_ms());
                let list = h.sessions("", 200);
                if let Some(s) = list.sessions.first() {
                    let _ = h.session(&s.id);
                }
                reads += 1;
                std::thread::sleep(Duration::from_millis(read_ms));
            }
            reads
        })
    });
    let started = Instant::now();
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let obs = Arc::clone(&obs);
            std::thread::spawn(move || write(obs.as_ref(), w, sessions, turns))
        })
        .collect();
    let times: Vec<u64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let reads = reader.map(|r| r.join().unwrap());
    report(name, times);
    if let Some(reads) = reads {
        println!("{:<34} {reads} page reads in {elapsed:.2?}", "");
    }
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    let sessions = args.sessions;
    let turns = args.turns as u64;
    let writers = args.writers;
    let read_ms = args.read_ms as u64;
    let args = (sessions, turns, writers, read_ms);
    println!(
        "{writers} writer threads × {sessions} sessions × {turns} turns × 4 events; history bounds: default ({} sessions, {} turns each)",
        HistoryLimits::default().max_sessions,
        HistoryLimits::default().max_turns_per_session
    );
    run("NoObserver (no page)", Arc::new(NoObserver), None, args);
    let h = Arc::new(InspectHistory::default());
    run("history, page closed", h.clone(), None, args);
    let h = Arc::new(InspectHistory::default());
    run(
        &format!("history, page open (reads every {read_ms} ms)"),
        h.clone(),
        Some(h),
        args,
    );
}
