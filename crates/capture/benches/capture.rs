//! Capture cost per turn with the engine's own ids against re-tokenization, in the same run: a
//! conversation of `--turns` main turns (each a user message and a reply of a few hundred
//! characters) captured turn by turn on one thread, as a capture worker does, with the session's
//! prefix cache. The re-tokenized path renders, encodes incrementally and aligns; the engine path
//! renders (the judges read the text) and takes the ids as they are. Uses the Qwen3 tokenizer of
//! `../shared/fixtures/qwen3` when present, else the embedded mini model.
//! Run: `cargo bench -p ps-capture --bench capture -- [--turns N] [--rounds R]`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use ps_capture::{
    CaptureJob, CaptureStats, DriftCheck, PrefixCache, RequestTexts, capture_turn_with,
};
use ps_chat_template::{ChatTokenizer, TurnInput};
use ps_core::TokenIdsMode;
use ps_core::{AlignPolicy, EngineIds, FinishReason, RolloutResponse, SampledToken, TurnGuard};
use serde_json::{Value, json};

/// Options, after `--` (`--bench` and a filter, as cargo passes them, are accepted and ignored).
#[derive(clap::Parser)]
struct Args {
    #[arg(long, default_value_t = 20)]
    turns: usize,
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    #[arg(long, hide = true)]
    bench: bool,
    #[arg(hide = true)]
    filter: Option<String>,
}

struct Discard;

impl ps_core::TurnSink for Discard {
    fn accept(&self, _turn: ps_core::CapturedTurn) {}
}

fn tokenizer() -> (ChatTokenizer, &'static str) {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/qwen3");
    match ChatTokenizer::from_dir(&dir) {
        Ok(t) => (t, "Qwen3 (../shared/fixtures/qwen3)"),
        Err(_) => (ChatTokenizer::mini(), "the embedded mini model"),
    }
}

/// One turn's job, with the ids an engine using this very template would return.
fn job(
    tok: &ChatTokenizer,
    history: &[Value],
    reply: &Value,
    turn: u64,
    engine: bool,
) -> CaptureJob {
    let t = tok
        .split_turn(&TurnInput {
            messages: history,
            tools: None,
            response_message: reply,
            template_kwargs: None,
        })
        .unwrap();
    let eos = tok.eos_token_id();
    let end = t
        .response_ids
        .iter()
        .rposition(|&id| Some(id) == eos)
        .map_or(t.response_ids.len(), |e| e + 1);
    let sampled = &t.response_ids[..end];
    let tokens: Vec<SampledToken> = sampled
        .iter()
        .enumerate()
        .map(|(i, &id)| SampledToken {
            token: tok.token_text(id),
            id: Some(id),
            logprob: -0.01 * (i % 50) as f64,
        })
        .collect();
    CaptureJob {
        guard: TurnGuard::new(Arc::new(Discard), "bench".into(), turn),
        arrival_seq: turn,
        messages: history.to_vec(),
        tools: None,
        template_kwargs: None,
        rollout: RolloutResponse {
            prompt_tokens: None,
            message: reply.clone(),
            tokens,
            finish: FinishReason {
                reason: Some("stop".into()),
                matched_stop: json!(eos),
            },
            streamed: false,
            engine_ids: engine.then(|| EngineIds {
                prompt: t.prompt_ids.clone(),
                response: sampled.to_vec(),
                field: "response_token_ids".into(),
            }),
            weight_version: None,
            unexplained_chars: 0,
            routed_experts: None,
            routed_experts_encoded: None,
            routed_experts_error: None,
        },
        session_done: false,
        token_ids: if engine {
            TokenIdsMode::Engine
        } else {
            TokenIdsMode::Retokenize
        },
        asked_for_ids: engine,
        trainer_weight_version: None,
        origin: Default::default(),
        sampling: Default::default(),
        // As the capture thread sets it: the texts the trees were parsed from.
        texts: Some(RequestTexts {
            messages: serde_json::to_vec(history).unwrap().into(),
            tools: None,
        }),
    }
}

/// Time to capture every turn of the conversation once, in order, with a fresh prefix cache.
fn run(tok: &ChatTokenizer, jobs: &[CaptureJob]) -> Duration {
    let cache = PrefixCache::default();
    let stats = CaptureStats::new(DriftCheck::new(0, 0));
    let started = Instant::now();
    for j in jobs {
        let t = capture_turn_with(tok, j, AlignPolicy::default(), Some(&cache), &stats).unwrap();
        std::hint::black_box(t);
    }
    started.elapsed()
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    let turns = args.turns;
    let rounds = args.rounds;
    let (tok, which) = tokenizer();
    let mut history =
        vec![json!({"role": "system", "content": "You are a careful assistant. ".repeat(40)})];
    let (mut engine_jobs, mut retok_jobs) = (Vec::new(), Vec::new());
    for i in 0..turns {
        history.push(json!({"role": "user", "content": format!("Step {i}: what comes next, and why? ").repeat(4)}));
        let reply = json!({"role": "assistant", "content": format!("Next comes step {}. ", i + 1).repeat(20),
                           "reasoning_content": "Think about the order of the steps. ".repeat(5)});
        engine_jobs.push(job(&tok, &history, &reply, i as u64 + 1, true));
        retok_jobs.push(job(&tok, &history, &reply, i as u64 + 1, false));
        history.push(json!({"role": "assistant", "content": reply["content"]}));
    }
    let (mut engine, mut retok) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        retok.push(run(&tok, &retok_jobs));
        engine.push(run(&tok, &engine_jobs));
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (e, r) = (median(&mut engine), median(&mut retok));
    let per = |d: Duration| d.as_secs_f64() * 1e6 / turns as f64;
    println!("capture per turn, {turns} turns of one conversation, {which}, median of {rounds}:");
    println!(
        "  re-tokenized (render + incremental encode + align): {:>9.1} us",
        per(r)
    );
    println!(
        "  engine ids   (render only, ids as returned):        {:>9.1} us",
        per(e)
    );
    println!(
        "  engine / re-tokenized: {:.2}",
        e.as_secs_f64() / r.as_secs_f64()
    );
}
