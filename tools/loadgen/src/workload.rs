//! The workload: concurrent multi-turn conversations, as an agent drives them. Each session sends a
//! system prompt and a user message, appends the assistant's reply and a new user message, and sends
//! the whole history again, once per turn. One phase runs `sessions` such conversations, at most
//! `concurrency` at once; a session has a fixed number of turns, or a seeded pseudo-random one.
//! [`Shape::Agent`] sessions are shaped like agent traffic instead (see [`crate::agent`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// An agent-like system prompt (~1.6 kB), so that rendering and tokenizing a turn costs what it costs
/// with a real agent rather than with a one-line chat.
pub const SYSTEM_PROMPT: &str = "You are a careful software engineering agent working inside a \
sandboxed Linux container on behalf of a user. You can read and edit files, run shell commands and \
inspect their output. Work in small, verifiable steps: state what you are going to do, do it, then \
check the result before moving on. Prefer reading the existing code and its tests before proposing \
a change; follow the conventions you find there (naming, error handling, logging, formatting). \
Never invent file names, APIs or command-line flags: look them up. When a command fails, read the \
error message fully and explain the cause before retrying. Keep answers short and concrete; use \
code blocks for code and shell commands. Do not expose secrets found in the environment or in \
files, and do not send data to the network unless the user asks for it. If the task is ambiguous, \
ask one precise question instead of guessing. When you are done, summarise what changed, which \
files you touched, and how the user can verify the result (the exact test or command). Budget: at \
most twenty tool calls per task; stop and report if you are stuck. The repository uses Rust 2024, \
tokio, axum and serde; tests run with cargo test; lints with cargo clippy -D warnings. The user's \
time zone is UTC. Today's working directory is /workspace/project.";

const TOPICS: &[&str] = &[
    "the HTTP handler that forwards chat completions upstream",
    "the bounded queue that feeds the capture workers",
    "the configuration loader and its validation errors",
    "the streaming proxy and how it handles a client that disconnects",
    "the session buffer and when a session is considered finished",
    "the retry policy of the upstream client on 503 answers",
    "the metrics catalogue and the labels it allows",
    "the chat template rendering of tool calls",
];

const ASKS: &[&str] = &[
    "Can you explain how it works and point me to the file that implements it?",
    "Please find out why its test is flaky and propose a minimal fix.",
    "Add a short doc comment describing its invariants, then show me the diff.",
    "What happens there when the upstream answers with invalid JSON? Walk me through it.",
    "Is there any blocking call on the async executor in that code path?",
];

/// The `turn`-th user message of session `session` (deterministic, varied across sessions).
pub fn user_message(session: usize, turn: usize) -> String {
    let topic = TOPICS[(session + turn) % TOPICS.len()];
    let ask = ASKS[(session * 3 + turn) % ASKS.len()];
    if turn == 0 {
        format!(
            "Hi! I am new to this codebase (ticket #{session}). I want to understand {topic}. {ask}"
        )
    } else {
        format!("Thanks. Step {turn}: now look at {topic}. {ask} Keep the answer under ten lines.")
    }
}

/// The request body for a history.
pub fn request_body(messages: &[Value], stream: bool) -> Vec<u8> {
    let mut body = json!({
        "model": "default",
        "messages": messages,
        "logprobs": true,
        // What the proxy forwards upstream anyway (it raises `top_logprobs` to at least 1), so the
        // fake does the same work in the direct and the proxied phases.
        "top_logprobs": 1,
        "temperature": 0.7,
        "max_tokens": 512,
    });
    if stream {
        body["stream"] = json!(true);
    }
    serde_json::to_vec(&body).unwrap_or_default()
}

/// How many turns each session of a phase has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turns {
    /// Every session has this many.
    Fixed(usize),
    /// Session `i` has a pseudo-random count in `min..=max`, a function of `(seed, i)` only: the
    /// same seed gives the same counts in every run and every phase.
    Seeded { seed: u64, min: usize, max: usize },
}

impl Turns {
    /// The number of turns of session `index`.
    pub fn of(&self, index: usize) -> usize {
        match *self {
            Self::Fixed(n) => n,
            Self::Seeded { seed, min, max } => {
                let (lo, hi) = (min.min(max), min.max(max));
                let span = (hi - lo) as u64 + 1;
                // The modulo bias is below span / 2^64: negligible for a workload.
                lo + (splitmix64(seed ^ splitmix64(index as u64)) % span) as usize
            }
        }
    }

    /// The turns of sessions `0..sessions` together.
    pub fn total(&self, sessions: usize) -> usize {
        (0..sessions).map(|i| self.of(i)).sum()
    }
}

/// SplitMix64's output function: a well-mixed 64-bit hash of `x` (Steele, Lea & Flood, 2014).
/// Written out here so that the seeded turn counts never change with a dependency's version.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One phase: where to send, how, and how much.
#[derive(Debug, Clone)]
pub struct PhaseSpec {
    /// `direct`, `proxy`, `proxy-stream`, …
    pub name: String,
    /// The chat completions URL.
    pub url: String,
    /// Send `X-Session-Id` / `X-Turn-Type: main`.
    pub via_proxy: bool,
    pub stream: bool,
    pub sessions: usize,
    pub turns: Turns,
    /// Sessions in flight at once (at least 1); when one ends the next starts. `sessions` or more:
    /// all start together.
    pub concurrency: usize,
    /// The last turn of each session carries `X-Session-Done: true` (proxied phases). Without it
    /// the proxy closes the session when it has been idle for `server.session_timeout_sec`.
    pub done_header: bool,
    /// Session ids are `{prefix}-{index}` (unique per phase, so the proxy sees new sessions).
    pub session_prefix: String,
    /// Of the first `concurrency` sessions, session `i` starts after `i / concurrency` of this, so
    /// that arrivals are spread rather than in lock-step (matters when the upstream has a latency).
    /// Later sessions start as soon as a slot frees.
    pub ramp: Duration,
    /// Incremented by every answered main turn, for observers while the phase runs.
    pub answered: Arc<AtomicUsize>,
    /// What a session's conversation looks like.
    pub shape: Shape,
    /// Every request sent as a side turn (`X-Turn-Type: side`): forwarded, never captured nor
    /// judged. The yardstick a main turn's proxy CPU is compared with (`proxy-side`).
    pub side_only: bool,
    /// The API the chat sessions speak (`proxy-messages`, `proxy-responses`: the proxy's doors,
    /// non-streamed; the same conversations as `proxy`).
    pub door: Door,
}

/// The API a phase's chat sessions speak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Door {
    #[default]
    ChatCompletions,
    /// Chat completions without asking for log-probs, as the doors' clients do (the proxy asks
    /// for them and takes them out of the answer): the yardstick of the doors (`proxy-plain`).
    ChatPlain,
    /// `POST /v1/messages`.
    Messages,
    /// `POST /v1/responses`.
    Responses,
}

impl Door {
    /// The route under the base URL.
    pub fn path(self) -> &'static str {
        match self {
            Self::ChatCompletions | Self::ChatPlain => "/v1/chat/completions",
            Self::Messages => "/v1/messages",
            Self::Responses => "/v1/responses",
        }
    }
}

/// The request body of a door for a chat history (system first, then user and assistant
/// messages; an assistant message holds its door's answer as it came, under `door_answer`).
pub fn door_body(door: Door, messages: &[Value]) -> Vec<u8> {
    let system = messages
        .first()
        .filter(|m| m["role"] == "system")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default();
    let rest = messages.iter().filter(|m| m["role"] != "system");
    let body = match door {
        Door::ChatCompletions => return request_body(messages, false),
        Door::ChatPlain => {
            let mut b: Value =
                serde_json::from_slice(&request_body(messages, false)).unwrap_or_default();
            if let Some(o) = b.as_object_mut() {
                o.remove("logprobs");
                o.remove("top_logprobs");
            }
            b
        }
        Door::Messages => {
            let msgs: Vec<Value> = rest
                .map(|m| match m.get("door_answer") {
                    Some(a) => json!({"role": "assistant", "content": a}),
                    None => json!({"role": "user", "content": m["content"]}),
                })
                .collect();
            json!({"model": "default", "system": system, "messages": msgs, "max_tokens": 512, "temperature": 0.7})
        }
        Door::Responses => {
            let mut input = Vec::new();
            for m in rest {
                match m.get("door_answer").and_then(Value::as_array) {
                    Some(items) => input.extend(items.iter().cloned()),
                    None => input.push(json!({"role": "user", "content": m["content"]})),
                }
            }
            json!({"model": "default", "instructions": system, "input": input, "max_output_tokens": 512,
                "temperature": 0.7, "store": false, "include": ["reasoning.encrypted_content"]})
        }
    };
    serde_json::to_vec(&body).unwrap_or_default()
}

/// The assistant message of a door's whole answer, its answer kept for the next request.
pub fn reply_from_door(door: Door, body: &[u8]) -> Result<Value, TurnError> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| TurnError::Body(format!("not JSON: {e}")))?;
    let answer = match door {
        Door::ChatCompletions | Door::ChatPlain => return reply_from_json(body),
        Door::Messages => v["content"].clone(),
        Door::Responses => v["output"].clone(),
    };
    if !answer.is_array() {
        return Err(TurnError::Body(format!(
            "no answer in {}",
            &v.to_string()[..v.to_string().len().min(200)]
        )));
    }
    Ok(json!({"role": "assistant", "door_answer": answer}))
}

/// The kind of conversation a phase's sessions hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Shape {
    /// The chat demo: a 1.6 kB system prompt, user messages and short replies, every request main.
    #[default]
    Chat,
    /// Agent traffic ([`crate::agent`]): one long system prompt and ~20 tools shared by every
    /// session, tool calls and tool results, long replies, side turns mixed in.
    Agent,
}

/// One answered request.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Send to last byte of the answer, as the client sees it.
    pub total_ms: f64,
    /// Send to the first byte of the body.
    pub ttfb_ms: f64,
    /// The `upstream` duration of the answer's `Server-Timing` header, if any.
    pub upstream_ms: Option<f64>,
    pub request_bytes: usize,
    pub response_bytes: usize,
    /// A main turn (side turns are forwarded but not captured).
    pub main: bool,
    /// The answer's `usage`: prompt and completion tokens (agent sessions only).
    pub tokens: Option<(usize, usize)>,
}

/// Why one request failed (the session stops there: its history cannot continue).
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    #[error("transport error: {0}")]
    Transport(#[from] reqwest::Error),
    #[error("HTTP {status}: {body}")]
    Status { status: u16, body: String },
    #[error("unusable answer: {0}")]
    Body(String),
}

/// What a phase produced.
#[derive(Debug, Default)]
pub struct PhaseRun {
    pub samples: Vec<Sample>,
    /// Answered turns of each session, by session index.
    pub answered: Vec<usize>,
    pub errors: usize,
    /// The first few error messages.
    pub first_errors: Vec<String>,
    /// From the first send to the last answer.
    pub wall: Duration,
    /// The global time bound cut the phase short.
    pub cut_by_deadline: bool,
}

const KEPT_ERRORS: usize = 5;

/// Runs `spec.sessions` conversations, `spec.concurrency` at a time, until all are done or
/// `deadline` passes; `drive` runs one conversation (this module's [`session`] for chat-shaped
/// phases; `crate::run_phase` picks by [`PhaseSpec::shape`]).
pub(crate) async fn run_phase_with<F, Fut>(
    client: &reqwest::Client,
    spec: &PhaseSpec,
    deadline: Instant,
    drive: F,
) -> PhaseRun
where
    F: Fn(reqwest::Client, Arc<PhaseSpec>, usize, Instant) -> Fut + Copy + Send + 'static,
    Fut: std::future::Future<Output = SessionRun> + Send,
{
    let spec = Arc::new(spec.clone());
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let slots = spec.concurrency.clamp(1, spec.sessions.max(1));
    let tasks: Vec<_> = (0..slots)
        .map(|_| {
            let (client, spec, next) = (client.clone(), spec.clone(), next.clone());
            tokio::spawn(async move {
                let mut done = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= spec.sessions {
                        return done;
                    }
                    let run = drive(client.clone(), spec.clone(), i, deadline).await;
                    done.push((i, run));
                }
            })
        })
        .collect();
    let mut run = PhaseRun {
        answered: vec![0; spec.sessions],
        ..PhaseRun::default()
    };
    let mut errors = Vec::new();
    for task in tasks {
        match task.await {
            Ok(sessions) => {
                for (i, s) in sessions {
                    run.answered[i] = s.samples.iter().filter(|s| s.main).count();
                    run.samples.extend(s.samples);
                    run.cut_by_deadline |= s.cut;
                    errors.extend(s.errors);
                }
            }
            Err(e) => errors.push(format!("session task failed: {e}")),
        }
    }
    run.errors = errors.len();
    errors.truncate(KEPT_ERRORS);
    run.first_errors = errors;
    run.wall = started.elapsed();
    run
}

pub(crate) struct SessionRun {
    pub(crate) samples: Vec<Sample>,
    pub(crate) errors: Vec<String>,
    pub(crate) cut: bool,
}

/// Waits for session `index`'s start in the phase's ramp (the first `concurrency` sessions are
/// spread over `spec.ramp`; later ones start when a slot frees). `false`: the start would fall
/// after `deadline`, so the session is cut before its first request.
pub(crate) async fn ramp_start(spec: &PhaseSpec, index: usize, deadline: Instant) -> bool {
    let slots = spec.concurrency.clamp(1, spec.sessions.max(1));
    let start = if index < slots {
        spec.ramp.mul_f64(index as f64 / slots as f64)
    } else {
        Duration::ZERO
    };
    if Instant::now() + start >= deadline {
        return false;
    }
    tokio::time::sleep(start).await;
    true
}

pub(crate) async fn session(
    client: reqwest::Client,
    spec: Arc<PhaseSpec>,
    index: usize,
    deadline: Instant,
) -> SessionRun {
    let session_id = format!("{}-{index}", spec.session_prefix);
    let mut messages = vec![
        json!({"role": "system", "content": SYSTEM_PROMPT}),
        json!({"role": "user", "content": user_message(index, 0)}),
    ];
    let turns = spec.turns.of(index);
    let mut out = SessionRun {
        samples: Vec::with_capacity(turns),
        errors: Vec::new(),
        cut: false,
    };
    if !ramp_start(&spec, index, deadline).await {
        out.cut = true;
        return out;
    }
    for turn in 0..turns {
        let body = match spec.door {
            Door::ChatCompletions => request_body(&messages, spec.stream),
            door => door_body(door, &messages),
        };
        let done = spec.done_header && turn + 1 == turns;
        let answer = tokio::time::timeout_at(
            tokio::time::Instant::from_std(deadline),
            one_turn(&client, &spec, &session_id, done, body),
        )
        .await;
        match answer {
            Err(_) => {
                out.cut = true;
                break;
            }
            Ok(Err(e)) => {
                out.errors
                    .push(format!("{} session {index} turn {turn}: {e}", spec.name));
                break;
            }
            Ok(Ok((sample, reply))) => {
                out.samples.push(sample);
                spec.answered.fetch_add(1, Ordering::Relaxed);
                messages.push(reply);
                messages.push(json!({"role": "user", "content": user_message(index, turn + 1)}));
            }
        }
    }
    out
}

async fn one_turn(
    client: &reqwest::Client,
    spec: &PhaseSpec,
    session_id: &str,
    done: bool,
    body: Vec<u8>,
) -> Result<(Sample, Value), TurnError> {
    let (sample, buf) = send(client, spec, session_id, true, done, body).await?;
    let reply = if spec.door != Door::ChatCompletions {
        reply_from_door(spec.door, &buf)?
    } else if spec.stream {
        reply_from_sse(&buf)?
    } else {
        reply_from_json(&buf)?
    };
    Ok((sample, reply))
}

/// Sends one request of a session (through the proxy: with its session id and turn type) and
/// reads the whole answer; a non-success status is an error.
pub(crate) async fn send(
    client: &reqwest::Client,
    spec: &PhaseSpec,
    session_id: &str,
    main: bool,
    done: bool,
    body: Vec<u8>,
) -> Result<(Sample, Vec<u8>), TurnError> {
    let request_bytes = body.len();
    let mut req = client
        .post(&spec.url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body);
    // A side-only phase sends (and records) every request as a side turn.
    let main = main && !spec.side_only;
    if spec.via_proxy {
        req = req
            .header("x-session-id", session_id)
            .header("x-turn-type", if main { "main" } else { "side" });
        if done {
            // Closes the session, so its last turn is finished (and stored) now rather than at the
            // session timeout, inside the CPU accounting of the round.
            req = req.header("x-session-done", "true");
        }
    }
    let started = Instant::now();
    let mut resp = req.send().await?;
    let status = resp.status();
    let upstream_ms = resp
        .headers()
        .get("server-timing")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| crate::stats::server_timing_dur(v, "upstream"));
    let mut buf = Vec::new();
    let mut ttfb = None;
    while let Some(chunk) = resp.chunk().await? {
        ttfb.get_or_insert_with(|| started.elapsed());
        buf.extend_from_slice(&chunk);
    }
    let total = started.elapsed();
    if !status.is_success() {
        return Err(TurnError::Status {
            status: status.as_u16(),
            body: String::from_utf8_lossy(&buf[..buf.len().min(300)]).into_owned(),
        });
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    Ok((
        Sample {
            total_ms: ms(total),
            ttfb_ms: ms(ttfb.unwrap_or(total)),
            upstream_ms,
            request_bytes,
            response_bytes: buf.len(),
            main,
            tokens: None,
        },
        buf,
    ))
}

/// The assistant message to append to the history.
fn assistant(content: &str, reasoning: &str) -> Value {
    let mut m = json!({"role": "assistant", "content": content});
    if !reasoning.is_empty() {
        m["reasoning_content"] = json!(reasoning);
    }
    m
}

/// The assistant message of a non-streamed answer.
pub fn reply_from_json(body: &[u8]) -> Result<Value, TurnError> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| TurnError::Body(format!("not JSON: {e}")))?;
    let msg = &v["choices"][0]["message"];
    let content = msg["content"]
        .as_str()
        .ok_or_else(|| TurnError::Body("no choices[0].message.content string".into()))?;
    Ok(assistant(
        content,
        msg["reasoning_content"].as_str().unwrap_or_default(),
    ))
}

/// The assistant message of a streamed answer: the concatenated deltas. It must end with `[DONE]`.
pub fn reply_from_sse(body: &[u8]) -> Result<Value, TurnError> {
    let text = std::str::from_utf8(body).map_err(|e| TurnError::Body(e.to_string()))?;
    let (mut content, mut reasoning, mut done) = (String::new(), String::new(), false);
    for data in text.lines().filter_map(|l| l.strip_prefix("data:")) {
        let data = data.trim();
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let chunk: Value = serde_json::from_str(data)
            .map_err(|e| TurnError::Body(format!("bad SSE chunk: {e}")))?;
        if !chunk["error"].is_null() {
            return Err(TurnError::Body(format!("error event: {}", chunk["error"])));
        }
        let delta = &chunk["choices"][0]["delta"];
        content.push_str(delta["content"].as_str().unwrap_or_default());
        reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or_default());
    }
    if !done {
        return Err(TurnError::Body("the stream ended without [DONE]".into()));
    }
    Ok(assistant(&content, &reasoning))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A door's body holds the same conversation, its answers sent back as they came.
    #[test]
    fn door_bodies_carry_the_conversation_and_its_answers() {
        let answer = reply_from_door(
            Door::Messages,
            br#"{"type":"message","content":[{"type":"text","text":"Hi"}]}"#,
        )
        .unwrap_or_default();
        let history = vec![
            json!({"role": "system", "content": "S"}),
            json!({"role": "user", "content": "U1"}),
            answer,
            json!({"role": "user", "content": "U2"}),
        ];
        let m: Value =
            serde_json::from_slice(&door_body(Door::Messages, &history)).unwrap_or_default();
        assert_eq!(m["system"], "S");
        assert_eq!(
            m["messages"][1],
            json!({"role": "assistant", "content": [{"type": "text", "text": "Hi"}]})
        );
        assert_eq!(m["messages"].as_array().map(Vec::len), Some(3));
        let answer = reply_from_door(Door::Responses, br#"{"output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Hi"}]}]}"#)
            .unwrap_or_default();
        let history = vec![
            history[0].clone(),
            history[1].clone(),
            answer,
            history[3].clone(),
        ];
        let r: Value =
            serde_json::from_slice(&door_body(Door::Responses, &history)).unwrap_or_default();
        assert_eq!(r["instructions"], "S");
        assert_eq!(r["input"].as_array().map(Vec::len), Some(3));
        assert!(reply_from_door(Door::Responses, br#"{"error":{}}"#).is_err());
    }

    #[test]
    fn replies_from_both_shapes() {
        let json = br#"{"choices":[{"message":{"role":"assistant","content":"Hi","reasoning_content":"think","tool_calls":null}}]}"#;
        assert_eq!(
            reply_from_json(json).unwrap(),
            json!({"role": "assistant", "content": "Hi", "reasoning_content": "think"})
        );
        let sse =
            b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n\
                    data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"th\"}}]}\n\n\
                    data: {\"choices\":[{\"delta\":{\"content\":\"H\"}}]}\n\n\
                    data: {\"choices\":[{\"delta\":{\"content\":\"i\"}}]}\n\n\
                    data: [DONE]\n\n";
        assert_eq!(
            reply_from_sse(sse).unwrap(),
            json!({"role": "assistant", "content": "Hi", "reasoning_content": "th"})
        );
        assert!(reply_from_sse(b"data: {\"choices\":[]}\n\n").is_err());
        assert!(reply_from_json(b"{}").is_err());
    }

    #[test]
    fn seeded_turn_counts_stay_in_range_and_cover_it() {
        let turns = Turns::Seeded {
            seed: 42,
            min: 5,
            max: 20,
        };
        let counts: Vec<usize> = (0..10_000).map(|i| turns.of(i)).collect();
        assert!(counts.iter().all(|n| (5..=20).contains(n)));
        // Every value of the range occurs, each about 1/16 of the time (625 expected).
        for n in 5..=20 {
            let k = counts.iter().filter(|c| **c == n).count();
            assert!((450..=800).contains(&k), "{n} turns: {k} sessions");
        }
        let mean = counts.iter().sum::<usize>() as f64 / counts.len() as f64;
        assert!((mean - 12.5).abs() < 0.25, "mean {mean}");
        assert_eq!(turns.total(10_000), counts.iter().sum::<usize>());
    }

    #[test]
    fn seeded_turn_counts_depend_on_seed_and_index_only() {
        let a = Turns::Seeded {
            seed: 1,
            min: 5,
            max: 20,
        };
        let b = Turns::Seeded {
            seed: 2,
            min: 5,
            max: 20,
        };
        let of = |t: Turns| (0..64).map(|i| t.of(i)).collect::<Vec<_>>();
        assert_eq!(of(a), of(a));
        assert_ne!(of(a), of(b));
        // Reversed bounds mean the same range; a one-value range is constant.
        let reversed = Turns::Seeded {
            seed: 1,
            min: 20,
            max: 5,
        };
        assert_eq!(of(a), of(reversed));
        let one = Turns::Seeded {
            seed: 9,
            min: 7,
            max: 7,
        };
        assert!(of(one).iter().all(|n| *n == 7));
        assert_eq!(Turns::Fixed(5).of(123), 5);
        assert_eq!(Turns::Fixed(5).total(3), 15);
    }

    #[test]
    fn splitmix64_reference_values() {
        // The first outputs of the reference SplitMix64 generator seeded with 0
        // (state advanced by the golden gamma before each output).
        assert_eq!(splitmix64(0), 0xe220_a839_7b1d_cdaf);
        assert_eq!(splitmix64(0x9e37_79b9_7f4a_7c15), 0x6e78_9e6a_a1b9_65f4);
    }

    #[test]
    fn user_messages_vary() {
        assert_ne!(user_message(0, 0), user_message(1, 0));
        assert_ne!(user_message(0, 1), user_message(0, 2));
    }
}
