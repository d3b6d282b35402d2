//! The agent scenario: traffic shaped like an OpenClaw deployment rather than a chat demo, through
//! the proxy in the mode `--mode` picks (RL: 3 PRM votes per turn from the fake's `/generate`; OPD:
//! 3 hint votes per turn and the fake as teacher; Combine: both, 3 hint + 3 eval votes) with a
//! trainer pulling and committing the samples, against the same sessions straight to the fake in
//! the same run. Every answered main turn must come back as one sample or as a turn the proxy
//! counts as dropped or abandoned after its answer ([`Accounting`]).
//!
//! Every session sends the same long system prompt (~2,700 tokens of instructions) and the same
//! 20 tool schemas. A session has a seeded number of main turns (10–30 by default): a user asks,
//! the model often calls a tool (a named `tool_choice`), the tool's result (2–4 kB) goes back, the
//! model answers; side turns (a title request) are mixed in. Every reply is 100–800 tokens long
//! (the fake's `[reply_words=N]` directive) and carries exact per-token log-probs with the engine's
//! ids. The report gives the proxy's CPU per request (capture, judging, storage and serving the
//! trainer included: measured from idle to idle, after every turn is judged, stored and
//! committed), per 1,000 captured tokens, its added latency and its memory.
//!
//! Over ~700 lines (1,550 of code, 200 of unit tests at the end): about 400 of them are the
//! scenario's fixed texts (the system prompt's rule tables, the 20 tool schemas, the user asks),
//! kept beside the generator that draws from them; the rest are the two phases (direct and
//! proxied), the trainer beside them and the report of one run. A tool of the workbench, not the
//! product.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};

use crate::report::{
    CpuPerRequest, Machine, MemoryReport, PhaseReport, ProxyReport, TargetCheck, opt,
};
use crate::soak::{JUDGE_SLOTS_PER_SESSION, Sampler, wait_flushed};
use crate::trainer::{Coverage, TrainerTally};
use crate::workload::{self, PhaseSpec, Sample, SessionRun, Shape, TurnError, Turns, splitmix64};
use crate::{
    FakeOptions, IDLE_BOUND, IDLE_POLL, LoadgenError, Phase, ProxyMode, ProxyOptions, Rig,
    TrainedRig, phase_report,
};

/// Defaults of the `agent` command (see `docs/benchmarks.md`).
pub const DEFAULT_SESSIONS: usize = 64;
pub const DEFAULT_MIN_TURNS: usize = 10;
pub const DEFAULT_MAX_TURNS: usize = 30;
pub const DEFAULT_SEED: u64 = 1;
/// Sessions (of [`WARMUP_TURNS`] main turns) per phase kind in the unmeasured warm-up.
pub const WARMUP_SESSIONS: usize = 4;
pub const WARMUP_TURNS: usize = 3;
/// A reply is this many words of the fake's echo beyond its fixed sentence: ~100–800 tokens after
/// a user message, whose words are ~1.5 tokens each ...
pub const REPLY_WORDS: (usize, usize) = (55, 480);
/// ... and after a tool result, whose words (paths, code) are ~2.5 tokens each.
pub const REPLY_WORDS_AFTER_TOOL: (usize, usize) = (30, 280);
/// A tool result is this many bytes.
pub const TOOL_RESULT_BYTES: (usize, usize) = (2_000, 4_000);
/// Out of 10: how often a user message makes the model call a tool.
const TOOL_CALL_IN_10: u64 = 6;
/// Out of 4: how often a side turn precedes a main turn.
const SIDE_TURN_IN_4: u64 = 1;

/// Targets of issue 14 for this scenario (printed, never asserted).
pub const TARGET_PROXY_CPU_MS: f64 = 0.5;
pub const TARGET_ADDED_P99_MS: f64 = 1.0;
/// The issue's peak is 120 MB (10^6 bytes); `VmHWM` is read in KiB and printed in MiB, so the
/// goal is compared in MiB: 120 MB = 114.44 MiB. (Compared as 120 MiB until 2026-12-02, which
/// printed PASS for peaks above 114.44 and up to 120 MiB, which miss the target.)
pub const TARGET_PEAK_RSS_MB: f64 = 120.0;
pub const TARGET_PEAK_RSS_MIB: f64 = TARGET_PEAK_RSS_MB * 1e6 / (1024.0 * 1024.0);
pub const TARGET_END_OVER_START: f64 = 1.1;

/// What to run.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub fake_bin: PathBuf,
    pub proxy_bin: PathBuf,
    pub model_dir: PathBuf,
    /// Sessions, all in flight at once.
    pub sessions: usize,
    /// Each session has a seeded number of main turns in `min_turns..=max_turns`.
    pub min_turns: usize,
    pub max_turns: usize,
    pub seed: u64,
    /// Each phase runs this many times, interleaved (new sessions each round); figures pool them.
    pub rounds: usize,
    pub fake_latency: Duration,
    pub ramp: Duration,
    /// `prm.max_concurrency` (`None`: [`JUDGE_SLOTS_PER_SESSION`] × sessions).
    pub prm_max_concurrency: Option<usize>,
    /// `teacher.max_concurrency` in OPD and Combine (`None`: one slot per session).
    pub teacher_max_concurrency: Option<usize>,
    pub trainer_page: usize,
    pub trainer_wait: Duration,
    /// What the trainer asks its pages in (MessagePack, as the Python bridge does).
    pub trainer_format: crate::trainer::PageFormat,
    pub rss_every: Duration,
    pub max_duration: Duration,
    /// The proxy re-tokenizes every turn (`sglang.token_ids = "retokenize"`) instead of taking the
    /// engine's ids.
    pub retokenize: bool,
    /// The proxy's mode: RL (PRM votes), OPD (hint votes and the fake as teacher) or Combine.
    pub mode: ProxyMode,
    /// The fake's cache of encoded prompt prefixes (off: every prompt encoded whole).
    pub fake_prefix_cache: bool,
}

impl AgentConfig {
    fn turns(&self) -> Turns {
        Turns::Seeded {
            seed: self.seed,
            min: self.min_turns,
            max: self.max_turns,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The conversation.

/// `splitmix64` of the seed, the session, the turn and what is drawn: a function of these only.
fn draw(seed: u64, session: usize, turn: usize, what: u64) -> u64 {
    splitmix64(seed ^ splitmix64(session as u64 ^ splitmix64(turn as u64 ^ splitmix64(what))))
}

fn in_range(x: u64, (lo, hi): (usize, usize)) -> usize {
    lo + (x % (hi - lo + 1) as u64) as usize
}

/// Rules per section of the system prompt.
const RULES_PER_SECTION: usize = 8;
const SECTIONS: &[&str] = &[
    "Identity and scope",
    "Working in the repository",
    "Reading before writing",
    "Editing files",
    "Running commands",
    "Tests and verification",
    "Version control",
    "Talking to the user",
    "Safety and secrets",
    "Networking and external services",
    "Tasks, schedules and reminders",
    "Memory and notes",
    "Errors and recovery",
    "Style of the final answer",
];
const VERBS: &[&str] = &[
    "Always check",
    "Never assume",
    "Before you change anything, read",
    "Prefer to reuse",
    "Write down",
    "Keep track of",
    "Explain to the user",
    "Verify with a command",
    "Do not modify",
    "Ask before you delete",
    "Report every change to",
    "Summarise briefly",
    "Look up in the documentation",
];
const OBJECTS: &[&str] = &[
    "the configuration files and their defaults",
    "the tests that cover the code you are about to touch",
    "the public API of the module and its callers",
    "the error messages printed by the last command",
    "the files the user named in the request",
    "the git history of the lines you edit",
    "the dependencies declared in the manifest",
    "the environment variables the program reads",
    "the logs written during the last run",
    "the tasks still open in the tracker",
    "the limits and quotas of the external services",
    "the conventions of naming, formatting and error handling",
    "the output of the linter and the type checker",
    "the schema of the database tables involved",
    "the notes you saved in earlier sessions",
];
const QUALIFIERS: &[&str] = &[
    "and say what you found in one sentence",
    "so that the next step rests on facts rather than guesses",
    "unless the user explicitly asked you to skip it",
    "and keep the change as small as the task allows",
    "because other people depend on it in production",
    "even when the task looks trivial at first sight",
    "and stop to ask when two readings disagree",
    "then record the result in your notes for later turns",
    "and quote the exact command or file path you used",
    "since the user reviews every diff you produce",
    "while staying within the budget of tool calls",
];

/// The system prompt every session shares: 13,613 characters (2,720 Qwen3 tokens) of
/// instructions in sections, the same in every run.
pub fn system_prompt() -> &'static str {
    static PROMPT: OnceLock<String> = OnceLock::new();
    PROMPT.get_or_init(|| {
        let mut s = String::from(
            "You are OpenClaw, an autonomous software engineering agent. You work for one user at a \
             time inside a sandboxed Linux container with the user's repository checked out under \
             /workspace. You act only through the tools listed below, one call at a time, and you \
             read each result before deciding on the next step.\n",
        );
        let mut k = 0usize;
        for (i, section) in SECTIONS.iter().enumerate() {
            let _ = write!(s, "\n## {}. {section}\n", i + 1);
            for _ in 0..RULES_PER_SECTION {
                let _ = writeln!(
                    s,
                    "- {} {} {}.",
                    VERBS[k % VERBS.len()],
                    OBJECTS[(k * 7 + i) % OBJECTS.len()],
                    QUALIFIERS[(k * 5 + 3 * i) % QUALIFIERS.len()]
                );
                k += 1;
            }
        }
        s.push_str(
            "\nWhen you are done, summarise what changed, which files you touched and how the user \
             can verify it (the exact test or command). The user's time zone is UTC.",
        );
        s
    })
}

/// `(name, description, parameters: (name, JSON type, description, required))`.
type ToolSpec = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str, &'static str, bool)],
);

const TOOL_SPECS: &[ToolSpec] = &[
    (
        "read_file",
        "Read a text file of the workspace and return its lines with line numbers.",
        &[
            (
                "path",
                "string",
                "Path relative to the workspace root.",
                true,
            ),
            (
                "start_line",
                "integer",
                "First line to return (1-based).",
                false,
            ),
            (
                "end_line",
                "integer",
                "Last line to return (inclusive).",
                false,
            ),
        ],
    ),
    (
        "write_file",
        "Create or overwrite a file of the workspace with the given content.",
        &[
            (
                "path",
                "string",
                "Path relative to the workspace root.",
                true,
            ),
            (
                "content",
                "string",
                "The complete new content of the file.",
                true,
            ),
        ],
    ),
    (
        "edit_file",
        "Replace one exact occurrence of a string in a file.",
        &[
            (
                "path",
                "string",
                "Path relative to the workspace root.",
                true,
            ),
            (
                "old",
                "string",
                "The exact text to replace; must occur once.",
                true,
            ),
            ("new", "string", "The replacement text.", true),
        ],
    ),
    (
        "list_dir",
        "List the entries of a directory, with sizes and kinds.",
        &[
            (
                "path",
                "string",
                "Directory relative to the workspace root.",
                true,
            ),
            (
                "depth",
                "integer",
                "How many levels to descend (default 1).",
                false,
            ),
        ],
    ),
    (
        "search_code",
        "Search the workspace for a regular expression and return matching lines.",
        &[
            (
                "pattern",
                "string",
                "A Rust-syntax regular expression.",
                true,
            ),
            ("glob", "string", "Only files matching this glob.", false),
            (
                "max_results",
                "integer",
                "At most this many matches.",
                false,
            ),
        ],
    ),
    (
        "run_shell",
        "Run a shell command in the workspace and return its exit status and output.",
        &[
            (
                "command",
                "string",
                "The command line, run with bash -lc.",
                true,
            ),
            (
                "timeout_sec",
                "integer",
                "Kill the command after this many seconds.",
                false,
            ),
        ],
    ),
    (
        "run_tests",
        "Run the project's test suite, or a part of it, and summarise failures.",
        &[
            (
                "filter",
                "string",
                "Only tests whose name contains this.",
                true,
            ),
            (
                "package",
                "string",
                "Only this package of the workspace.",
                false,
            ),
        ],
    ),
    (
        "git_status",
        "Show the working tree status: changed, staged and untracked files.",
        &[("path", "string", "Limit to this path.", true)],
    ),
    (
        "git_diff",
        "Show the diff of the working tree or between two revisions.",
        &[
            (
                "revision",
                "string",
                "A revision range such as HEAD~1..HEAD.",
                true,
            ),
            ("path", "string", "Limit to this path.", false),
        ],
    ),
    (
        "git_commit",
        "Commit the staged changes with a message.",
        &[(
            "message",
            "string",
            "The commit message: a summary line, a blank line, the why.",
            true,
        )],
    ),
    (
        "open_url",
        "Fetch a web page and return its main text.",
        &[
            ("url", "string", "An http or https URL.", true),
            (
                "max_chars",
                "integer",
                "Truncate the text to this many characters.",
                false,
            ),
        ],
    ),
    (
        "web_search",
        "Search the web and return titles, URLs and snippets.",
        &[
            ("query", "string", "The search terms.", true),
            (
                "results",
                "integer",
                "How many results (at most 10).",
                false,
            ),
        ],
    ),
    (
        "ask_user",
        "Ask the user one precise question and wait for the answer.",
        &[(
            "question",
            "string",
            "The question, answerable in one line.",
            true,
        )],
    ),
    (
        "create_task",
        "Create a task in the user's tracker.",
        &[
            ("title", "string", "A short imperative title.", true),
            ("body", "string", "What has to be done and why.", true),
            ("priority", "string", "low, normal or high.", false),
        ],
    ),
    (
        "update_task",
        "Change the state or the text of a task.",
        &[
            ("task_id", "integer", "The task's number.", true),
            ("state", "string", "open, in_progress or done.", true),
            ("comment", "string", "A comment to add.", false),
        ],
    ),
    (
        "list_tasks",
        "List the tasks of the tracker, newest first.",
        &[
            ("state", "string", "Only tasks in this state.", true),
            ("limit", "integer", "At most this many tasks.", false),
        ],
    ),
    (
        "read_logs",
        "Read the last lines of a service's log.",
        &[
            (
                "service",
                "string",
                "The service name as systemd knows it.",
                true,
            ),
            ("lines", "integer", "How many lines from the end.", false),
            ("grep", "string", "Only lines containing this.", false),
        ],
    ),
    (
        "query_db",
        "Run a read-only SQL query on the development database.",
        &[
            ("sql", "string", "One SELECT statement.", true),
            ("max_rows", "integer", "At most this many rows.", false),
        ],
    ),
    (
        "send_message",
        "Send a chat message to a channel of the user's team.",
        &[
            ("channel", "string", "The channel name, without #.", true),
            ("text", "string", "The message text (Markdown).", true),
        ],
    ),
    (
        "schedule_job",
        "Schedule a command to run later, once or periodically.",
        &[
            ("command", "string", "The command line.", true),
            ("cron", "string", "A cron expression (UTC).", true),
            ("once", "boolean", "Run only at the first match.", false),
        ],
    ),
];

/// The 20 tool schemas every session sends (OpenAI `tools`).
pub fn tools() -> &'static Value {
    static TOOLS: OnceLock<Value> = OnceLock::new();
    TOOLS.get_or_init(|| {
        Value::Array(
            TOOL_SPECS
                .iter()
                .map(|(name, description, params)| {
                    let properties: serde_json::Map<String, Value> = params
                        .iter()
                        .map(|(p, ty, d, _)| ((*p).to_owned(), json!({"type": ty, "description": d})))
                        .collect();
                    let required: Vec<&str> =
                        params.iter().filter(|p| p.3).map(|p| p.0).collect();
                    json!({"type": "function", "function": {
                        "name": name,
                        "description": description,
                        "parameters": {"type": "object", "properties": properties, "required": required},
                    }})
                })
                .collect(),
        )
    })
}

const TOPICS: &[&str] = &[
    "the retry policy of the HTTP client when the upstream answers 503",
    "the migration that adds an index to the orders table",
    "the flaky integration test of the payment webhook",
    "the memory growth of the worker after a burst of jobs",
    "the configuration loader and its error messages",
    "the nightly export job that sometimes writes an empty file",
    "the rate limiter shared by the API gateway replicas",
    "the CSV parser that mis-reads quoted newlines",
];
const ASKS: &[&str] = &[
    "Find where it is implemented and explain how it works.",
    "Find out why it fails and propose the smallest fix.",
    "Add a regression test for it and run the suite.",
    "Check the logs of the last deployment for related errors.",
    "Write a short design note on how to improve it.",
];

/// A directive for the fake: its reply goes on for a number of words in `range`.
fn reply_directive(
    seed: u64,
    session: usize,
    turn: usize,
    what: u64,
    range: (usize, usize),
) -> String {
    format!(
        " [reply_words={}]",
        in_range(draw(seed, session, turn, what), range)
    )
}

/// The user's message before main turn `turn` of `session`.
pub fn user_message(seed: u64, session: usize, turn: usize) -> String {
    let topic = TOPICS[(session + turn) % TOPICS.len()];
    let ask = ASKS[(session * 3 + turn) % ASKS.len()];
    let mut m = if turn == 0 {
        format!(
            "Hi! I am working on ticket #{session} about {topic}. {ask} The code is in the \
             repository under /workspace; the service runs in staging, and I can give you access to \
             its logs if you need them. Please keep changes minimal and explain your reasoning."
        )
    } else {
        format!(
            "Thanks. Next step ({turn}): look again at {topic}. {ask} If you change code, run the \
             relevant tests and show me the diff; otherwise tell me what you checked."
        )
    };
    m.push_str(&reply_directive(seed, session, turn, 1, REPLY_WORDS));
    m
}

/// The result of the tool call of main turn `turn` (2–4 kB of file excerpts and command output).
pub fn tool_result(seed: u64, session: usize, turn: usize, tool: &str) -> String {
    let len = in_range(draw(seed, session, turn, 2), TOOL_RESULT_BYTES);
    let mut s = format!("$ {tool} (exit status 0)\n");
    let mut line = 1 + (draw(seed, session, turn, 3) % 400) as usize;
    while s.len() < len {
        let i = line % OBJECTS.len();
        let _ = writeln!(
            s,
            "src/service/module_{}.rs:{line}:    let step_{line} = check_{}(&ctx, {}).await?; // {}",
            (session + line) % 17,
            i,
            line % 97,
            OBJECTS[i]
        );
        line += 1 + line % 5;
    }
    s.push_str(&reply_directive(
        seed,
        session,
        turn,
        4,
        REPLY_WORDS_AFTER_TOOL,
    ));
    s
}

/// A side turn's request: a conversation title, with its own short prompt.
fn side_body(first_user_message: &str) -> Vec<u8> {
    let body = json!({
        "model": "default",
        "messages": [
            {"role": "system", "content": "You write titles of at most six words for conversations. Answer with the title only."},
            {"role": "user", "content": format!("Title for a conversation that starts with: {first_user_message}")},
        ],
        "logprobs": true,
        "top_logprobs": 1,
        "temperature": 0.2,
        "max_tokens": 64,
    });
    serde_json::to_vec(&body).unwrap_or_default()
}

/// A main turn's request: the whole history, the tools, and a named tool when the model is to
/// call one.
fn main_body(messages: &[Value], call: Option<&str>) -> Vec<u8> {
    let mut body = json!({
        "model": "default",
        "messages": messages,
        "tools": tools(),
        "logprobs": true,
        // What the proxy forwards upstream anyway, so the fake does the same work in both phases.
        "top_logprobs": 1,
        "temperature": 0.7,
        "max_tokens": 2048,
    });
    if let Some(name) = call {
        body["tool_choice"] = json!({"type": "function", "function": {"name": name}});
    }
    serde_json::to_vec(&body).unwrap_or_default()
}

/// What a session keeps of a non-streamed answer.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentReply {
    /// The assistant message to append to the history (with its tool calls).
    pub message: Value,
    /// The answer's `usage`: prompt and completion tokens.
    pub tokens: Option<(usize, usize)>,
    /// The id and function name of its first tool call.
    pub call: Option<(String, String)>,
}

/// The [`AgentReply`] of a non-streamed answer.
pub fn agent_reply(body: &[u8]) -> Result<AgentReply, TurnError> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| TurnError::Body(format!("not JSON: {e}")))?;
    let msg = &v["choices"][0]["message"];
    if !msg.is_object() {
        return Err(TurnError::Body("no choices[0].message".into()));
    }
    let mut reply =
        json!({"role": "assistant", "content": msg["content"].as_str().unwrap_or_default()});
    if let Some(r) = msg["reasoning_content"].as_str().filter(|r| !r.is_empty()) {
        reply["reasoning_content"] = json!(r);
    }
    let mut call = None;
    if let Some(calls) = msg["tool_calls"].as_array().filter(|c| !c.is_empty()) {
        reply["tool_calls"] = Value::Array(calls.clone());
        call = Some((
            calls[0]["id"].as_str().unwrap_or("call_0").to_owned(),
            calls[0]["function"]["name"]
                .as_str()
                .unwrap_or("tool")
                .to_owned(),
        ));
    }
    let usage = &v["usage"];
    let tokens = usage["prompt_tokens"]
        .as_u64()
        .zip(usage["completion_tokens"].as_u64())
        .map(|(p, c)| (p as usize, c as usize));
    Ok(AgentReply {
        message: reply,
        tokens,
        call,
    })
}

/// One agent session of a phase: its main turns with tool calls and results, side turns between.
pub(crate) async fn session(
    client: reqwest::Client,
    spec: Arc<PhaseSpec>,
    index: usize,
    deadline: Instant,
) -> SessionRun {
    let session_id = format!("{}-{index}", spec.session_prefix);
    // The seed lives in the turn counts; the conversations follow it.
    let seed = match spec.turns {
        Turns::Seeded { seed, .. } => seed,
        Turns::Fixed(n) => n as u64,
    };
    let first = user_message(seed, index, 0);
    let mut messages = vec![
        json!({"role": "system", "content": system_prompt()}),
        json!({"role": "user", "content": first}),
    ];
    let turns = spec.turns.of(index);
    let mut out = SessionRun {
        samples: Vec::with_capacity(turns + turns / 2),
        errors: Vec::new(),
        cut: false,
    };
    if !workload::ramp_start(&spec, index, deadline).await {
        out.cut = true;
        return out;
    }
    let at_deadline = tokio::time::Instant::from_std(deadline);
    let mut last_is_tool = false;
    for turn in 0..turns {
        if draw(seed, index, turn, 5) % 4 < SIDE_TURN_IN_4 {
            let side = workload::send(&client, &spec, &session_id, false, false, side_body(&first));
            match tokio::time::timeout_at(at_deadline, side).await {
                Err(_) => {
                    out.cut = true;
                    break;
                }
                Ok(Err(e)) => {
                    out.errors.push(format!(
                        "{} session {index} side turn {turn}: {e}",
                        spec.name
                    ));
                    break;
                }
                Ok(Ok((sample, _))) => out.samples.push(sample),
            }
        }
        let call =
            (!last_is_tool && draw(seed, index, turn, 6) % 10 < TOOL_CALL_IN_10).then(|| {
                let k = (draw(seed, index, turn, 7) % TOOL_SPECS.len() as u64) as usize;
                TOOL_SPECS[k].0
            });
        let done = spec.done_header && turn + 1 == turns;
        let main = async {
            let (mut sample, buf) = workload::send(
                &client,
                &spec,
                &session_id,
                true,
                done,
                main_body(&messages, call),
            )
            .await?;
            let reply = agent_reply(&buf)?;
            sample.tokens = reply.tokens;
            Ok::<_, TurnError>((sample, reply.message, reply.call))
        };
        match tokio::time::timeout_at(at_deadline, main).await {
            Err(_) => {
                out.cut = true;
                break;
            }
            Ok(Err(e)) => {
                out.errors
                    .push(format!("{} session {index} turn {turn}: {e}", spec.name));
                break;
            }
            Ok(Ok((sample, reply, called))) => {
                out.samples.push(sample);
                spec.answered.fetch_add(1, Ordering::Relaxed);
                messages.push(reply);
                match called {
                    Some((id, name)) => {
                        messages.push(json!({
                            "role": "tool",
                            "tool_call_id": id,
                            "content": tool_result(seed, index, turn, &name),
                        }));
                        last_is_tool = true;
                    }
                    None => {
                        messages.push(
                            json!({"role": "user", "content": user_message(seed, index, turn + 1)}),
                        );
                        last_is_tool = false;
                    }
                }
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The run.

/// What the requests of the proxied phase held.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AgentWorkload {
    pub main_turns: usize,
    pub side_turns: usize,
    /// Prompt + completion tokens of the main turns (the answers' `usage`): what capture stores.
    pub captured_tokens: usize,
    pub mean_prompt_tokens: Option<f64>,
    pub max_prompt_tokens: usize,
    pub mean_completion_tokens: Option<f64>,
    pub min_completion_tokens: usize,
    pub max_completion_tokens: usize,
    pub mean_request_bytes: Option<f64>,
}

impl AgentWorkload {
    fn of(samples: &[Sample]) -> Self {
        let main: Vec<&Sample> = samples.iter().filter(|s| s.main).collect();
        let tokens: Vec<(usize, usize)> = main.iter().filter_map(|s| s.tokens).collect();
        let n = tokens.len();
        let mean = |f: fn(&(usize, usize)) -> usize| {
            (n > 0).then(|| tokens.iter().map(f).sum::<usize>() as f64 / n as f64)
        };
        Self {
            main_turns: main.len(),
            side_turns: samples.len() - main.len(),
            captured_tokens: tokens.iter().map(|(p, c)| p + c).sum(),
            mean_prompt_tokens: mean(|t| t.0),
            max_prompt_tokens: tokens.iter().map(|t| t.0).max().unwrap_or(0),
            mean_completion_tokens: mean(|t| t.1),
            min_completion_tokens: tokens.iter().map(|t| t.1).min().unwrap_or(0),
            max_completion_tokens: tokens.iter().map(|t| t.1).max().unwrap_or(0),
            mean_request_bytes: (!main.is_empty()).then(|| {
                main.iter().map(|s| s.request_bytes).sum::<usize>() as f64 / main.len() as f64
            }),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct AgentConfigReport {
    pub sessions: usize,
    pub min_turns: usize,
    pub max_turns: usize,
    pub seed: u64,
    pub rounds: usize,
    pub fake_latency_ms: f64,
    pub ramp_ms: f64,
    pub prm_votes: usize,
    pub prm_max_concurrency: usize,
    /// `server.mode`: `rl`, `opd` or `combine`.
    pub mode: ProxyMode,
    /// `teacher.max_concurrency` (OPD and Combine).
    pub teacher_max_concurrency: Option<usize>,
    /// Whether the fake kept encoded prompt prefixes.
    pub fake_prefix_cache: bool,
    /// `engine` (the answers' ids) or `retokenize`.
    pub token_ids: String,
    pub system_prompt_chars: usize,
    pub tools: usize,
    pub tools_json_chars: usize,
    pub model_dir: String,
}

/// The fake's CPU per request in both phases of a run, in the report's JSON as `fake_cpu`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FakeCpu {
    /// The direct phase: the chat answers alone.
    pub direct_ms_per_request: Option<f64>,
    /// The proxied phase: the chat answers, the judge votes per main turn and, in OPD/Combine,
    /// the teacher.
    pub proxied_ms_per_request: Option<f64>,
}

impl FakeCpu {
    /// From the two phases' CPU figures, each taken from its own phase (the fake's column).
    pub fn of(direct: &CpuPerRequest, proxied: &CpuPerRequest) -> Self {
        Self {
            direct_ms_per_request: direct.fake,
            proxied_ms_per_request: proxied.fake,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct AgentReport {
    pub unix_time: u64,
    pub machine: Machine,
    pub config: AgentConfigReport,
    pub direct: PhaseReport,
    pub proxy: PhaseReport,
    pub workload: AgentWorkload,
    /// Proxy CPU per request (main and side), from idle to idle with every turn judged, stored
    /// and committed.
    pub proxy_cpu_ms_per_request: Option<f64>,
    pub proxy_cpu_ms_per_main_turn: Option<f64>,
    pub proxy_cpu_ms_per_1000_captured_tokens: Option<f64>,
    /// The proxied phase's sessions again with every request a side turn (`proxy-side`:
    /// forwarded, never captured), and a main turn's own proxy CPU beside a side turn's: the
    /// proxied phase's total less its side turns at the side phase's cost, per main turn.
    pub proxy_side: Option<PhaseReport>,
    pub main_side: Option<crate::MainSide>,
    /// The fake's CPU per request in the direct phase and the proxied one: the yardstick of the
    /// same run.
    pub fake_cpu: FakeCpu,
    pub throughput_ratio: Option<f64>,
    pub trainer: TrainerTally,
    pub coverage: Coverage,
    /// Answered main turns against samples and the turns the proxy counted as giving none.
    pub accounting: Accounting,
    pub memory: MemoryReport,
    /// The most bytes of main turns waiting for a capture worker at once, in MiB
    /// (`capture_queue.peak_bytes` of `/v1/rollout/status` at the end; `None` from a proxy
    /// that does not report it).
    pub capture_queue_peak_mib: Option<f64>,
    pub proxy_process: ProxyReport,
    pub targets: Vec<TargetCheck>,
}

/// Where the measured rounds' answered main turns went: each is one sample, or a turn the proxy
/// counted in `/v1/rollout/status` as giving none after it was answered (`turns_dropped`:
/// OPD/Combine without a next state or a hint, a teacher failure or mismatch, the judge backlog;
/// `abandoned`: the `turns_abandoned_by_reason` that follow an answer, such as no engine ids or a
/// capture refusal). Anything else is a lost or unexpected sample. Turns the client never got an
/// answer for (the upstream failed, a broken stream, a cancelled request) are not answered turns:
/// they are counted apart in `abandoned_unanswered`, and any client error in the proxied phase
/// fails the check before the balance is looked at.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Accounting {
    pub answered_main_turns: usize,
    pub samples: usize,
    pub dropped: u64,
    pub abandoned: u64,
    pub abandoned_unanswered: u64,
}

/// The judge calls the proxy makes per judged main turn in `mode`, `votes` per kind: RL's PRM
/// votes, OPD's hint votes, or Combine's hint and PRM eval votes.
fn judge_votes(mode: ProxyMode, votes: usize) -> String {
    match mode {
        ProxyMode::Rl => format!("{votes} PRM votes"),
        ProxyMode::Opd => format!("{votes} hint votes"),
        ProxyMode::Combine => format!("{votes} hint + {votes} eval votes"),
    }
}

/// `turns_abandoned_by_reason` keys of turns whose client got no (complete) answer: the proxy
/// set them before or while answering (server chat.rs, proxy_stream.rs), or the turn guard was
/// dropped unfinished. Every other reason follows an answer.
const UNANSWERED_REASONS: [&str; 6] = [
    "upstream_failed",
    "not_completed",
    "client_cancelled",
    "stream_error",
    "stream_unfinished",
    "stream_broken",
];

/// Growth of the proxy's counters over the proxied phases.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CountedDrops {
    /// `turns_dropped`.
    pub dropped: u64,
    /// Abandoned turns that had been answered.
    pub abandoned: u64,
    /// Abandoned turns the client got no answer for ([`UNANSWERED_REASONS`]).
    pub unanswered: u64,
}

impl CountedDrops {
    /// The counters of a `/v1/rollout/status` answer. Without `turns_abandoned_by_reason`,
    /// every abandoned turn counts as answered.
    fn of(status: &Value) -> Self {
        let dropped = status["turns_dropped"].as_u64().unwrap_or(0);
        match status["turns_abandoned_by_reason"].as_object() {
            Some(reasons) => {
                let (mut abandoned, mut unanswered) = (0, 0);
                for (reason, n) in reasons {
                    let n = n.as_u64().unwrap_or(0);
                    if UNANSWERED_REASONS.contains(&reason.as_str()) {
                        unanswered += n;
                    } else {
                        abandoned += n;
                    }
                }
                Self {
                    dropped,
                    abandoned,
                    unanswered,
                }
            }
            None => Self {
                dropped,
                abandoned: status["turns_abandoned"].as_u64().unwrap_or(0),
                unanswered: 0,
            },
        }
    }

    /// Adds the growth from `before` to `after`.
    fn add_growth(&mut self, before: Self, after: Self) {
        self.dropped += after.dropped.saturating_sub(before.dropped);
        self.abandoned += after.abandoned.saturating_sub(before.abandoned);
        self.unanswered += after.unanswered.saturating_sub(before.unanswered);
    }
}

impl Accounting {
    /// Balances `coverage` (answered turns and the samples received for them) against the
    /// counters' growth over the rounds; an error says what does not add up. `client_errors`
    /// (the proxied phase's failed requests) fail it first: a broken session's turns cannot be
    /// balanced, and an error must not hide a lost sample.
    pub fn check(
        coverage: &Coverage,
        counted: CountedDrops,
        client_errors: usize,
        first_error: &str,
    ) -> Result<Self, String> {
        let a = Self {
            answered_main_turns: coverage.turns,
            samples: coverage.received,
            dropped: counted.dropped,
            abandoned: counted.abandoned,
            abandoned_unanswered: counted.unanswered,
        };
        if client_errors > 0 {
            return Err(format!(
                "the proxied phase had {client_errors} client errors ({} turns abandoned \
                 unanswered), so the samples cannot be balanced; first: {first_error}",
                counted.unanswered
            ));
        }
        let accounted = a.samples as u64 + a.dropped + a.abandoned;
        if accounted != a.answered_main_turns as u64 || coverage.unexpected > 0 {
            return Err(format!(
                "{} answered main turns, but {} samples + {} dropped + {} abandoned = {accounted} \
                 ({} unexpected samples; first missing: {})",
                a.answered_main_turns,
                a.samples,
                a.dropped,
                a.abandoned,
                coverage.unexpected,
                coverage.first_missing.join(", ")
            ));
        }
        Ok(a)
    }
}

/// Runs the agent scenario; `progress` receives one line per step. Ctrl-C or SIGTERM stops it.
pub async fn run(cfg: &AgentConfig, progress: impl Fn(&str)) -> Result<AgentReport, LoadgenError> {
    tokio::select! {
        report = run_to_end(cfg, progress) => report,
        signal = crate::interrupted() => Err(LoadgenError::Interrupted(signal)),
    }
}

fn agent_spec(
    phase: &Phase,
    prefix: &str,
    sessions: usize,
    turns: Turns,
    ramp: Duration,
) -> PhaseSpec {
    PhaseSpec {
        shape: Shape::Agent,
        ..phase.spec(prefix, sessions, turns, ramp)
    }
}

async fn run_to_end(
    cfg: &AgentConfig,
    progress: impl Fn(&str),
) -> Result<AgentReport, LoadgenError> {
    let deadline = Instant::now() + cfg.max_duration;
    let prm_slots = cfg
        .prm_max_concurrency
        .unwrap_or(JUDGE_SLOTS_PER_SESSION * cfg.sessions);
    // OPD and Combine: one teacher call per hinted turn, as many in flight as sessions unless set.
    let teacher_slots =
        (cfg.mode != ProxyMode::Rl).then(|| cfg.teacher_max_concurrency.unwrap_or(cfg.sessions));
    let options = ProxyOptions {
        prm: true,
        prm_max_concurrency: Some(prm_slots),
        session_timeout_sec: None,
        retain_committed: None,
        retokenize: cfg.retokenize,
        admin_key: false,
        sglang_max_concurrency: None,
        mode: cfg.mode,
        teacher_max_concurrency: teacher_slots,
    };
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
        FakeOptions {
            latency: cfg.fake_latency,
            prefix_cache: cfg.fake_prefix_cache,
        },
        &options,
        cfg.sessions + WARMUP_SESSIONS,
        deadline,
        &progress,
    )
    .await?
    .with_trainer(cfg.trainer_page, cfg.trainer_wait, cfg.trainer_format)?;
    let mut side = Phase::new("proxy-side", &rig.proxy.base_url(), true, false).side_only();

    // Warm-up, both kinds, unmeasured (other seeds than the measured sessions).
    let warm_turns = Turns::Seeded {
        seed: !cfg.seed,
        min: WARMUP_TURNS,
        max: WARMUP_TURNS,
    };
    for phase in [&direct, &proxy] {
        let spec = agent_spec(phase, "warmup", WARMUP_SESSIONS, warm_turns, Duration::ZERO);
        let run = crate::run_phase(&rig.client, &spec, deadline).await;
        if run.errors > 0 {
            return Err(LoadgenError::WarmUp {
                phase: phase.name.to_owned(),
                errors: run.errors,
                first: run.first_errors.first().cloned().unwrap_or_default(),
            });
        }
        progress(&format!(
            "warm-up {}: {} requests",
            phase.name,
            run.samples.len()
        ));
    }
    wait_flushed(
        &mut rig,
        None,
        deadline,
        "waiting for the warm-up to be flushed",
    )
    .await?;
    let baseline = procs.proxy.rss_kib()?;

    let turns = cfg.turns();
    let mut series_sampler = None::<Sampler>;
    let mut coverage = Coverage::default();
    let mut received_check: Vec<(String, Vec<usize>)> = Vec::new();
    // Growth of the proxy's `turns_dropped` and `turns_abandoned_by_reason` over the proxied
    // phases.
    let mut counted = CountedDrops::default();
    let mut capture_queue_peak_mib = None;
    for round in 1..=cfg.rounds {
        if Instant::now() >= deadline {
            progress("stopped: the time bound is reached");
            break;
        }
        let prefix = format!("r{round}");
        // Phase A: straight to the fake.
        let spec = agent_spec(&direct, &prefix, cfg.sessions, turns, cfg.ramp);
        crate::measure_round(&rig.client, &spec, deadline, &procs, &mut direct).await?;
        progress(&format!(
            "round {round}/{} direct: {} requests, {} errors so far",
            cfg.rounds,
            direct.run.samples.len(),
            direct.run.errors
        ));
        // Phase B: through the proxy, from idle (everything flushed) to idle.
        let spec = agent_spec(&proxy, &prefix, cfg.sessions, turns, cfg.ramp);
        let status_before = wait_flushed(
            &mut rig,
            None,
            deadline,
            "waiting for the proxy to be flushed",
        )
        .await?;
        let (proxy_before, _) = procs.proxy.wait_idle(IDLE_POLL, IDLE_BOUND).await?;
        let threads_before = procs.proxy.thread_ticks()?;
        let fake_before = procs.fake.cpu_ticks()?;
        let me_before = procs.me.cpu_ticks()?;
        let sampler = series_sampler
            .get_or_insert_with(|| Sampler::new(procs.proxy, spec.answered.clone(), cfg.rss_every));
        sampler.answered = spec.answered.clone();
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
                    sampler.sample()?;
                }
            }
        };
        let status_after = wait_flushed(
            &mut rig,
            Some(sampler),
            deadline,
            "waiting for the round to be judged and stored",
        )
        .await?;
        counted.add_growth(
            CountedDrops::of(&status_before),
            CountedDrops::of(&status_after),
        );
        capture_queue_peak_mib = status_after["capture_queue"]["peak_bytes"]
            .as_u64()
            .map(|b| b as f64 / (1u64 << 20) as f64);
        let (proxy_after, settle) = procs.proxy.wait_idle(IDLE_POLL, IDLE_BOUND).await?;
        proxy.proxy_ticks += proxy_after.saturating_sub(proxy_before);
        proxy.add_threads(
            &threads_before,
            &procs.proxy.thread_ticks()?,
            proxy_after.saturating_sub(proxy_before),
        );
        proxy.fake_ticks += procs.fake.cpu_ticks()?.saturating_sub(fake_before);
        proxy.me_ticks += procs.me.cpu_ticks()?.saturating_sub(me_before);
        proxy.settle = proxy.settle.max(settle);
        received_check.push((spec.session_prefix.clone(), run.answered.clone()));
        proxy.absorb(run);
        progress(&format!(
            "round {round}/{} proxy: {} requests, {} errors so far; trainer committed through {}",
            cfg.rounds,
            proxy.run.samples.len(),
            proxy.run.errors,
            trainer.committed()
        ));
        // Phase S: the same sessions, every request a side turn (idle to idle).
        let spec = agent_spec(&side, &prefix, cfg.sessions, turns, cfg.ramp);
        crate::measure_round(&rig.client, &spec, deadline, &procs, &mut side).await?;
        progress(&format!(
            "round {round}/{} proxy-side: {} requests, {} errors so far",
            cfg.rounds,
            side.run.samples.len(),
            side.run.errors
        ));
    }
    let end = procs.proxy.rss_kib()?;
    let tally = trainer.finish().await;
    for (prefix, answered) in &received_check {
        let c = crate::trainer::coverage(prefix, answered, &tally.received);
        coverage.sessions += c.sessions;
        coverage.turns += c.turns;
        coverage.received += c.received;
        coverage.missing += c.missing;
        coverage.unexpected += c.unexpected;
        coverage.first_missing.extend(c.first_missing);
    }
    coverage.first_missing.truncate(5);
    let first_error = proxy.run.first_errors.first().map_or("", String::as_str);
    let accounting =
        Accounting::check(&coverage, counted, proxy.run.errors, first_error).map_err(|detail| {
            LoadgenError::Rollout {
                what: "samples do not account for the answered main turns",
                detail,
            }
        })?;
    let proxy_process = rig.proxy_report()?;
    let machine = rig.machine();
    drop(rig);

    let workload = AgentWorkload::of(&proxy.run.samples);
    let series = series_sampler.map(|s| s.series).unwrap_or_default();
    let memory = MemoryReport::new(start_kib, baseline, end, series);
    let direct = phase_report(direct, &procs);
    let proxy = phase_report(proxy, &procs);
    let side = (side.rounds > 0).then(|| phase_report(side, &procs));
    let config = AgentConfigReport {
        sessions: cfg.sessions,
        min_turns: cfg.min_turns,
        max_turns: cfg.max_turns,
        seed: cfg.seed,
        rounds: cfg.rounds,
        fake_latency_ms: cfg.fake_latency.as_secs_f64() * 1e3,
        ramp_ms: cfg.ramp.as_secs_f64() * 1e3,
        prm_votes: crate::soak::PRM_VOTES,
        prm_max_concurrency: prm_slots,
        mode: cfg.mode,
        teacher_max_concurrency: teacher_slots,
        fake_prefix_cache: cfg.fake_prefix_cache,
        token_ids: if cfg.retokenize {
            "retokenize"
        } else {
            "engine"
        }
        .to_owned(),
        system_prompt_chars: system_prompt().len(),
        tools: TOOL_SPECS.len(),
        tools_json_chars: tools().to_string().len(),
        model_dir: cfg.model_dir.display().to_string(),
    };
    let mut report = AgentReport::new(
        machine,
        config,
        direct,
        proxy,
        workload,
        tally,
        (coverage, accounting),
        memory,
        proxy_process,
    );
    report.capture_queue_peak_mib = capture_queue_peak_mib;
    report.with_side_phase(side);
    Ok(report)
}

/// Whether a peak of `mib` MiB meets the issue's peak target (120 MB).
fn peak_rss_meets_target(mib: f64) -> bool {
    mib <= TARGET_PEAK_RSS_MIB
}

impl AgentReport {
    #[allow(clippy::too_many_arguments)]
    fn new(
        machine: Machine,
        config: AgentConfigReport,
        direct: PhaseReport,
        proxy: PhaseReport,
        workload: AgentWorkload,
        trainer: TrainerTally,
        (coverage, accounting): (Coverage, Accounting),
        memory: MemoryReport,
        proxy_process: ProxyReport,
    ) -> Self {
        let cpu = proxy.cpu_ms_per_request.proxy;
        let total_ms = cpu.map(|c| c * proxy.requests as f64);
        let per_main = total_ms
            .filter(|_| workload.main_turns > 0)
            .map(|t| t / workload.main_turns as f64);
        let per_1000 = total_ms
            .filter(|_| workload.captured_tokens > 0)
            .map(|t| t * 1000.0 / workload.captured_tokens as f64);
        let throughput_ratio =
            (direct.throughput_rps > 0.0).then(|| proxy.throughput_rps / direct.throughput_rps);
        let fake_cpu = FakeCpu::of(&direct.cpu_ms_per_request, &proxy.cpu_ms_per_request);
        let mib = |kib: u64| kib as f64 / 1024.0;
        let check =
            |name: &str, goal: String, value: Option<f64>, ok: &dyn Fn(f64) -> bool| TargetCheck {
                name: name.to_owned(),
                goal,
                value,
                pass: value.map(ok),
            };
        let targets = vec![
            check(
                "proxy CPU per request",
                format!("<= {TARGET_PROXY_CPU_MS} ms"),
                cpu,
                &|v| v <= TARGET_PROXY_CPU_MS,
            ),
            check(
                &format!("added latency p99 ({} ms upstream)", config.fake_latency_ms),
                format!("< {TARGET_ADDED_P99_MS} ms (defined at a 200 ms upstream)"),
                proxy.added_ms.map(|s| s.p99),
                &|v| v < TARGET_ADDED_P99_MS,
            ),
            check(
                "peak RSS (VmHWM), MiB",
                format!("<= {TARGET_PEAK_RSS_MIB:.2} MiB ({TARGET_PEAK_RSS_MB} MB)"),
                Some(mib(memory.hwm_kib)),
                &peak_rss_meets_target,
            ),
            check(
                "end RSS / start RSS",
                format!("<= {TARGET_END_OVER_START}"),
                Some(memory.end_kib as f64 / memory.start_kib.max(1) as f64),
                &|v| v <= TARGET_END_OVER_START,
            ),
        ];
        let unix_time = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self {
            unix_time,
            machine,
            config,
            direct,
            proxy,
            workload,
            proxy_cpu_ms_per_request: cpu,
            proxy_cpu_ms_per_main_turn: per_main,
            proxy_cpu_ms_per_1000_captured_tokens: per_1000,
            proxy_side: None,
            main_side: None,
            fake_cpu,
            throughput_ratio,
            trainer,
            coverage,
            accounting,
            memory,
            capture_queue_peak_mib: None,
            proxy_process,
            targets,
        }
    }

    /// Adds the side-only phase, which sent the proxied phase's very requests, all as side turns:
    /// the two totals differ only by what being main turns added to the main-turn requests, so a
    /// main turn costs a side turn's CPU (the side phase's per request) plus that difference per
    /// main turn. The side phase's mean includes the short title requests, so it understates a
    /// main-shaped body's side cost and the ratio errs high (against the target, not for it).
    fn with_side_phase(&mut self, side: Option<PhaseReport>) {
        let w = &self.workload;
        let main_side = side.as_ref().and_then(|s| {
            if w.main_turns == 0 {
                return None;
            }
            let side_ms = s.cpu_ms_per_request.proxy?;
            let proxied_total = self.proxy_cpu_ms_per_request? * self.proxy.requests as f64;
            let side_total = side_ms * s.requests as f64;
            let main_ms = side_ms + (proxied_total - side_total) / w.main_turns as f64;
            crate::MainSide::new(main_ms, side_ms)
        });
        self.targets
            .push(crate::MainSide::target(main_side.as_ref()));
        self.proxy_side = side;
        self.main_side = main_side;
    }

    /// The SVG plots of the run: latency percentiles of both phases, the added latency and the
    /// proxy's RSS over the run (`agent-<sessions>-<upstream>ms-{latency,added,rss}.svg`).
    pub fn plots(&self) -> Result<Vec<crate::plot::Plot>, LoadgenError> {
        let c = &self.config;
        let stem = crate::plot::stem(&format!("agent-{}", c.sessions), c.fake_latency_ms);
        let title = format!(
            "agent, {} sessions, {:.0} ms upstream",
            c.sessions, c.fake_latency_ms
        );
        let mut plots = crate::plot::phase_plots(&stem, &title, &[&self.direct, &self.proxy])?;
        plots.push(crate::plot::Plot {
            file: format!("{stem}-rss.svg"),
            svg: crate::plot::rss(
                &format!("{title}: proxy RSS"),
                &self.memory.series,
                Some(self.memory.baseline_kib),
            )?,
        });
        Ok(plots)
    }

    /// The human-readable summary.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let c = &self.config;
        let w = &self.workload;
        let _ = writeln!(
            out,
            "policy-serving agent scenario: {} sessions of {}..={} main turns (seed {}), {} round(s); \
             system prompt {} chars + {} tools ({} chars of JSON); {} mode, {} per judged turn \
             ({} judge slots{}); token ids: {}; fake latency {} ms (prefix cache {}); ramp {} \
             ms; {} CPUs; model {}",
            c.sessions,
            c.min_turns,
            c.max_turns,
            c.seed,
            c.rounds,
            c.system_prompt_chars,
            c.tools,
            c.tools_json_chars,
            c.mode.as_str().to_uppercase(),
            judge_votes(c.mode, c.prm_votes),
            c.prm_max_concurrency,
            c.teacher_max_concurrency
                .map(|n| format!(", {n} teacher slots"))
                .unwrap_or_default(),
            c.token_ids,
            c.fake_latency_ms,
            if c.fake_prefix_cache { "on" } else { "off" },
            c.ramp_ms,
            self.machine.cpus,
            c.model_dir
        );
        let _ = writeln!(
            out,
            "workload (proxied phase): {} main turns + {} side turns; prompt tokens mean {} max {}; \
             reply tokens mean {} (min {} max {}); {} captured tokens; request body mean {} bytes",
            w.main_turns,
            w.side_turns,
            opt(w.mean_prompt_tokens),
            w.max_prompt_tokens,
            opt(w.mean_completion_tokens),
            w.min_completion_tokens,
            w.max_completion_tokens,
            w.captured_tokens,
            opt(w.mean_request_bytes),
        );
        let _ = writeln!(
            out,
            "\n{:<8} {:>6} {:>4} {:>8} {:>8}   {:>8} {:>8} {:>8}   {:>9} {:>9} {:>9}   {:>8} {:>8}",
            "phase",
            "reqs",
            "err",
            "wall s",
            "req/s",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "added p50",
            "added p90",
            "added p99",
            "cpu prx",
            "cpu fake"
        );
        for p in [&self.direct, &self.proxy] {
            let l = p.latency_ms;
            let a = p.added_ms;
            let _ = writeln!(
                out,
                "{:<8} {:>6} {:>4} {:>8.1} {:>8.1}   {:>8} {:>8} {:>8}   {:>9} {:>9} {:>9}   {:>8} {:>8}",
                p.name,
                p.requests,
                p.errors,
                p.wall_s,
                p.throughput_rps,
                opt(l.map(|s| s.p50)),
                opt(l.map(|s| s.p90)),
                opt(l.map(|s| s.p99)),
                opt(a.map(|s| s.p50)),
                opt(a.map(|s| s.p90)),
                opt(a.map(|s| s.p99)),
                opt(p.cpu_ms_per_request.proxy),
                opt(p.cpu_ms_per_request.fake),
            );
        }
        let m = &self.memory;
        let mib = |kib: u64| kib as f64 / 1024.0;
        let _ = writeln!(
            out,
            "\nproxy CPU: {} ms per request, {} ms per main turn, {} ms per 1,000 captured tokens \
             (fake: {} ms per request direct, {} proxied with the judge votes per main turn); \
             throughput proxy/direct {}",
            opt(self.proxy_cpu_ms_per_request),
            opt(self.proxy_cpu_ms_per_main_turn),
            opt(self.proxy_cpu_ms_per_1000_captured_tokens),
            opt(self.direct.cpu_ms_per_request.fake),
            opt(self.proxy.cpu_ms_per_request.fake),
            opt(self.throughput_ratio),
        );
        if let Some(m) = &self.main_side {
            let _ = writeln!(
                out,
                "proxy CPU per request: main turn {:.3} ms, side turn {:.3} ms ({:.2} x; the side \
                 turn from the same sessions sent as side turns only)",
                m.main_ms, m.side_ms, m.ratio
            );
        }
        crate::report::write_threads(
            &mut out,
            std::iter::once(&self.proxy).chain(self.proxy_side.as_ref()),
        );
        let _ = writeln!(
            out,
            "proxy RSS, MiB: start {:.1}, after warm-up {:.1}, max sampled {:.1}, VmHWM {:.1}, end {:.1}; \
             turns waiting for capture at most {} MiB",
            mib(m.start_kib),
            mib(m.baseline_kib),
            mib(m.max_sampled_kib),
            mib(m.hwm_kib),
            mib(m.end_kib),
            opt(self.capture_queue_peak_mib)
        );
        let t = &self.trainer;
        let cv = &self.coverage;
        let _ = writeln!(
            out,
            "trainer: {} samples ({} effective) in {} {} pages, {} commits, {} errors; answered \
             main turns {} -> received {}, missing {}, unexpected {}, duplicates {}; proxy log \
             lines {}",
            t.samples,
            t.effective,
            t.pages,
            t.format.name(),
            t.commits,
            t.errors,
            cv.turns,
            cv.received,
            cv.missing,
            cv.unexpected,
            t.duplicates,
            self.proxy_process.log_lines
        );
        let a = &self.accounting;
        let _ = writeln!(
            out,
            "accounting: {} answered main turns = {} samples + {} dropped + {} abandoned after \
             an answer (as the proxy counts them in /v1/rollout/status)",
            a.answered_main_turns, a.samples, a.dropped, a.abandoned
        );
        for e in self
            .direct
            .first_errors
            .iter()
            .chain(&self.proxy.first_errors)
            .chain(&t.first_errors)
        {
            let _ = writeln!(out, "  error: {e}");
        }
        let _ = writeln!(out, "\ntargets (issue 14; printed, not asserted):");
        for tc in &self.targets {
            let verdict = match tc.pass {
                Some(true) => "PASS",
                Some(false) => "MISS",
                None => "n/a",
            };
            let _ = writeln!(
                out,
                "  {verdict:<4} {}: {} (goal {})",
                tc.name,
                opt(tc.value),
                tc.goal
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn the_peak_target_is_120_mb_not_120_mib() {
        // 120 MB = 117,187.5 KiB.
        let mib = |kib: f64| kib / 1024.0;
        assert!(peak_rss_meets_target(mib(117_187.0)));
        assert!(!peak_rss_meets_target(mib(117_188.0)));
        assert!(!peak_rss_meets_target(118.0), "118 MiB is 123.7 MB");
        assert!(peak_rss_meets_target(114.0));
    }

    #[test]
    fn the_fakes_cpu_is_reported_under_the_phase_it_was_measured_in() {
        let phase = |proxy: Option<f64>, fake: f64| CpuPerRequest {
            proxy,
            fake: Some(fake),
            loadgen: Some(0.25),
            resolution: Some(0.01),
        };
        let cpu = FakeCpu::of(&phase(None, 6.5), &phase(Some(3.0), 12.0));
        assert_eq!(
            serde_json::to_value(cpu).ok(),
            Some(json!({"direct_ms_per_request": 6.5, "proxied_ms_per_request": 12.0}))
        );
    }

    #[test]
    fn the_shared_prefix_is_long_and_the_same_every_time() {
        let p = system_prompt();
        assert!((12_000..15_000).contains(&p.len()), "{}", p.len());
        assert!(p.is_ascii());
        assert_eq!(tools().as_array().map(Vec::len), Some(20));
        let names: HashSet<&str> = TOOL_SPECS.iter().map(|t| t.0).collect();
        assert_eq!(names.len(), 20);
    }

    #[test]
    fn messages_carry_a_reply_length_and_depend_on_seed_session_and_turn() {
        let m = user_message(1, 3, 2);
        let n: usize = m
            .rsplit("[reply_words=")
            .next()
            .and_then(|r| r.strip_suffix(']'))
            .and_then(|n| n.parse().ok())
            .expect("directive");
        assert!((REPLY_WORDS.0..=REPLY_WORDS.1).contains(&n));
        assert_eq!(m, user_message(1, 3, 2));
        assert_ne!(m, user_message(1, 3, 3));
        assert_ne!(user_message(1, 3, 2), user_message(2, 3, 2));
        let r = tool_result(1, 3, 2, "read_file");
        assert!(r.len() >= TOOL_RESULT_BYTES.0 && r.len() < TOOL_RESULT_BYTES.1 + 200);
        assert!(r.contains("[reply_words="));
    }

    #[test]
    fn replies_keep_their_tool_calls_and_usage() {
        let body = br#"{"choices":[{"message":{"role":"assistant","content":null,"reasoning_content":"r",
            "tool_calls":[{"id":"call_1","type":"function","function":{"name":"read_file","arguments":"{\"path\": \"a\"}"}}]}}],
            "usage":{"prompt_tokens":10,"completion_tokens":4}}"#;
        let reply = agent_reply(body).expect("parsed");
        assert_eq!(reply.message["content"], "");
        assert_eq!(
            reply.message["tool_calls"][0]["function"]["name"],
            "read_file"
        );
        assert_eq!(reply.tokens, Some((10, 4)));
        assert_eq!(
            reply.call,
            Some(("call_1".to_owned(), "read_file".to_owned()))
        );
        let reply =
            agent_reply(br#"{"choices":[{"message":{"role":"assistant","content":"hi"}}]}"#)
                .expect("parsed");
        assert_eq!(reply.message, json!({"role": "assistant", "content": "hi"}));
        assert!(reply.call.is_none());
        assert!(agent_reply(b"{}").is_err());
    }

    #[test]
    fn workload_counts_main_and_side_turns() {
        let s = |main: bool, tokens: Option<(usize, usize)>| Sample {
            total_ms: 1.0,
            ttfb_ms: 1.0,
            upstream_ms: None,
            request_bytes: 100,
            response_bytes: 10,
            main,
            tokens,
        };
        let w = AgentWorkload::of(&[
            s(true, Some((100, 20))),
            s(false, None),
            s(true, Some((300, 40))),
        ]);
        assert_eq!((w.main_turns, w.side_turns, w.captured_tokens), (2, 1, 460));
        assert_eq!(w.mean_prompt_tokens, Some(200.0));
        assert_eq!((w.min_completion_tokens, w.max_completion_tokens), (20, 40));
    }

    #[test]
    fn accounting_balances_samples_and_counted_drops() {
        let coverage = |turns: usize, received: usize, unexpected: usize| Coverage {
            sessions: 2,
            turns,
            received,
            missing: turns - received,
            unexpected,
            first_missing: vec!["r1-0#3".into()],
        };
        let counted = |dropped: u64, abandoned: u64| CountedDrops {
            dropped,
            abandoned,
            unanswered: 0,
        };
        let check = |c: &Coverage, n: CountedDrops| Accounting::check(c, n, 0, "");
        // RL: every answered turn is a sample.
        let rl = check(&coverage(10, 10, 0), counted(0, 0)).expect("balanced");
        assert_eq!((rl.answered_main_turns, rl.samples), (10, 10));
        // OPD: two turns without a next state and one without a hint, counted as dropped; one
        // abandoned after its answer (no engine ids).
        let opd = check(&coverage(10, 6, 0), counted(3, 1)).expect("balanced");
        assert_eq!((opd.dropped, opd.abandoned), (3, 1));
        // A sample lost without being counted, one counted twice, an unexpected sample.
        let lost = check(&coverage(10, 6, 0), counted(3, 0)).expect_err("one lost");
        assert!(
            lost.contains("10 answered main turns") && lost.contains("r1-0#3"),
            "{lost}"
        );
        assert!(check(&coverage(10, 10, 0), counted(1, 0)).is_err());
        assert!(check(&coverage(10, 10, 1), counted(0, 0)).is_err());
    }

    #[test]
    fn the_header_counts_combine_s_hint_and_eval_votes() {
        assert_eq!(judge_votes(ProxyMode::Rl, 3), "3 PRM votes");
        assert_eq!(judge_votes(ProxyMode::Opd, 3), "3 hint votes");
        assert_eq!(judge_votes(ProxyMode::Combine, 3), "3 hint + 3 eval votes");
    }

    #[test]
    fn accounting_counts_only_abandons_that_follow_an_answer() {
        let coverage = Coverage {
            sessions: 2,
            turns: 10,
            received: 10,
            missing: 0,
            unexpected: 0,
            first_missing: Vec::new(),
        };
        // A clean run whose proxy once failed upstream before any measured round: the unanswered
        // reason is not an answered turn, so it does not unbalance the samples.
        let before = CountedDrops::of(&json!({
            "turns_dropped": 1, "turns_abandoned": 1,
            "turns_abandoned_by_reason": {"upstream_failed": 1}
        }));
        let after = CountedDrops::of(&json!({
            "turns_dropped": 1, "turns_abandoned": 4,
            "turns_abandoned_by_reason": {"upstream_failed": 2, "client_cancelled": 1,
                                          "no_engine_ids": 1}
        }));
        let mut grown = CountedDrops::default();
        grown.add_growth(before, after);
        assert_eq!(
            grown,
            CountedDrops {
                dropped: 0,
                abandoned: 1,
                unanswered: 2
            }
        );
        let mut lost_one = coverage.clone();
        lost_one.received = 9;
        let a = Accounting::check(&lost_one, grown, 0, "").expect("9 samples + 1 abandoned");
        assert_eq!((a.abandoned, a.abandoned_unanswered), (1, 2));
        // Only unanswered abandons: a clean run with every sample balances.
        let unanswered = CountedDrops {
            unanswered: 1,
            ..CountedDrops::default()
        };
        assert!(Accounting::check(&coverage, unanswered, 0, "").is_ok());
        // One proxied 502 fails the check first, with the client's error, even though its
        // session's answered turns all became samples.
        let e = Accounting::check(&coverage, unanswered, 1, "502 Bad Gateway").expect_err("error");
        assert!(
            e.contains("1 client errors") && e.contains("502 Bad Gateway"),
            "{e}"
        );
        // An error (its turn abandoned unanswered) and a lost sample no longer cancel out: under
        // the old sum, 9 samples + 1 abandoned balanced 10 answered turns.
        assert!(Accounting::check(&lost_one, unanswered, 1, "502").is_err());
        // Without the per-reason map (an older proxy), every abandoned turn counts as answered.
        let old = CountedDrops::of(&json!({"turns_dropped": 4, "turns_abandoned": 2, "lag": 0}));
        assert_eq!((old.dropped, old.abandoned, old.unanswered), (4, 2, 0));
        assert_eq!(CountedDrops::of(&json!({})), CountedDrops::default());
    }
}
