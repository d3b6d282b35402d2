//! The `policy-serving demo`: starts the fake SGLang (policy and judge) and the real proxy on
//! loopback, drives a short scripted conversation through the proxy (main turns, one streamed, a side
//! turn, a tool call, the session closed by the client) and a one-turn conversation about a picture
//! (an image captured exactly: the mini-vl model's pads), then pulls the resulting samples through
//! the rollout API like a trainer, prints them (session, turn, score, votes, effective tokens, and
//! each response token with its log-prob, source and loss-mask bit) and commits them.
//!
//! Everything it needs is embedded (`config/demo.toml`, the mini-vl model, a 64x48 PNG), so it runs
//! on a fresh
//! checkout. It is a client of the public crates only; nothing in the product depends on it.

use std::fmt::Write as _;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use futures::StreamExt;
use ps_chat_template::ChatTokenizer;
use ps_config::{Mode, Settings};
use ps_core::sample::Sample;
use ps_fake_sglang::FakeSglang;
use ps_sample_store::StoredSample;
use serde_json::{Value, json};

/// The embedded demo settings.
pub const DEMO_SETTINGS: &str = include_str!("../../../config/demo.toml");
const SESSION: &str = "demo-session-1";
/// The conversation about a picture.
const IMAGE_SESSION: &str = "demo-session-2";
/// The picture (64x48 PNG).
const DEMO_IMAGE: &[u8] = include_bytes!("../../../config/demo-image.png");
/// Main turns the script sends: three in the first conversation, one with the picture.
const MAIN_TURNS: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("the embedded demo settings are invalid: {0}")]
    Settings(String),
    #[error(transparent)]
    Startup(#[from] ps_app::StartupError),
    #[error("demo I/O failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("demo request failed: {0}")]
    Http(#[from] reqwest::Error),
    #[error("the proxy answered HTTP {status}: {body}")]
    Status { status: u16, body: String },
    #[error("only {got} of the main turns' samples arrived within 20 s")]
    MissingSamples { got: u64 },
}

/// What the demo did, for tests.
#[derive(Debug)]
pub struct DemoReport {
    pub replies: Vec<String>,
    /// The samples the trainer side pulled.
    pub samples: Vec<StoredSample>,
}

/// How the demo runs besides its mode.
#[derive(Default)]
pub struct DemoOptions {
    /// Where the proxy's `/metrics` come from (the binary installs the Prometheus recorder).
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// After the scripted conversation, keep serving the proxy and the inspection page until this
    /// resolves (`policy-serving demo` waits for Ctrl-C; `--exit` stops at once).
    pub keep_serving: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
}

impl std::fmt::Debug for DemoOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DemoOptions")
            .field("keep_serving", &self.keep_serving.is_some())
            .finish_non_exhaustive()
    }
}

/// Runs the demo in `mode` (`rl`, `opd` or `combine`), writing what happens to `out`, and stops.
pub async fn run(out: &mut (dyn Write + Send), mode: Mode) -> Result<DemoReport, DemoError> {
    run_with(out, mode, DemoOptions::default()).await
}

/// As [`run`], with [`DemoOptions`].
pub async fn run_with(
    out: &mut (dyn Write + Send),
    mode: Mode,
    options: DemoOptions,
) -> Result<DemoReport, DemoError> {
    let mut settings: Settings =
        toml::from_str(DEMO_SETTINGS).map_err(|e| DemoError::Settings(e.to_string()))?;
    settings.server.mode = mode;

    let tokenizer = Arc::new(ChatTokenizer::mini_vl());
    let fake = FakeSglang::builder()
        // A mixture-of-experts policy started with `--enable-return-routed-experts`: samples
        // carry the experts each token was routed to.
        .quirks(ps_fake_sglang::Quirks {
            routed_experts: Some(ps_fake_sglang::MoeRouting::default()),
            ..Default::default()
        })
        .tokenizer(tokenizer.clone())
        .model_name(&settings.server.served_model_name)
        .spawn()
        .await?;
    settings.sglang.chat_url = fake.chat_url();
    settings.prm.router_url = fake.generate_url();
    // The fake also plays the teacher (SGLang /generate with input_ids).
    settings.teacher.url = Some(fake.generate_url());
    let store_dir = tempfile::tempdir()?;
    settings.store.path = store_dir.path().to_path_buf();
    settings.logging.opd_record_dir = Some(store_dir.path().join("opd"));
    settings
        .validate()
        .map_err(|e| DemoError::Settings(e.to_string()))?;

    let no_env = |_: &str| None;
    // The fake policy samples with the embedded mini model, so the demo captures with it too
    // (`serve` never does: it needs the policy's own tokenizer).
    let policy_tokenizer = ps_app::policy_tokenizer::PolicyTokenizer::embedded_demo();
    let source = policy_tokenizer.source.to_string();
    let running =
        ps_app::spawn_with(&settings, &no_env, options.metrics, Some(policy_tokenizer)).await?;
    let base = running.url().to_owned();
    writeln!(out, "fake SGLang  : {}", fake.base_url())?;
    writeln!(out, "tokenizer    : {source}")?;
    writeln!(
        out,
        "proxy        : {base}   (session {SESSION}, mode {mode})"
    )?;
    writeln!(
        out,
        "The fake judge is scripted by the FAKE_VOTES directives in the user messages.\n"
    )?;

    let http = reqwest::Client::new();
    let url = format!("{base}/v1/chat/completions");
    let mut replies = Vec::new();
    let mut history = vec![
        json!({"role": "system", "content": "You are a helpful travel assistant."}),
        json!({"role": "user", "content": "What is the capital of France?"}),
    ];

    // 1. A main turn, not streamed.
    let answer = post_json(&http, &url, json!({"messages": history}), "main", false).await?;
    let reply = answer["choices"][0]["message"].clone();
    show(out, 1, "main", &history, &reply)?;
    replies.push(reply["content"].as_str().unwrap_or_default().to_owned());
    history.push(reply);

    // A side turn: forwarded, never trained on.
    let side =
        json!({"messages": [{"role": "user", "content": "Give this chat a three-word title."}]});
    let answer = post_json(&http, &url, side, "side", false).await?;
    writeln!(
        out,
        "[side] title request -> {:?} (forwarded, not captured)\n",
        answer["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
    )?;

    // 2. A main turn, streamed: chunks are printed as they arrive.
    history.push(json!({"role": "user", "content": "And what about Italy? Keep it short, please. [fake judge: FAKE_VOTES=1,1,1]"}));
    write!(out, "[main 2, streamed] assistant: ")?;
    let reply = post_stream(
        &http,
        &url,
        json!({"messages": history, "stream": true}),
        out,
    )
    .await?;
    writeln!(out, "\n")?;
    replies.push(reply.clone());
    history.push(json!({"role": "assistant", "content": reply}));

    // 3. A main turn with a tool; the client says the session is done.
    history.push(json!({"role": "user", "content": "[call_tool] What is the weather in Rome? [fake judge: FAKE_VOTES=-1,-1,-1]"}));
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let answer = post_json(
        &http,
        &url,
        json!({"messages": history, "tools": tools}),
        "main",
        true,
    )
    .await?;
    let reply = answer["choices"][0]["message"].clone();
    show(out, 3, "main", &history, &reply)?;
    replies.push(reply.to_string());

    // The first conversation's turns settle first, so that their samples keep seqs 1 to 3.
    let status_url = format!("{base}/v1/rollout/status");
    settle(&http, &status_url, MAIN_TURNS - 1).await?;

    // 4. Another conversation: a user message with a picture, captured exactly (its pad tokens
    // expanded as the model's processor expands them; the image kept beside the sample).
    let picture = json!([{"role": "user", "content": [
    {"type": "text", "text": "What is in this picture?"},
    {"type": "image_url", "image_url": {"url": format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(DEMO_IMAGE)
    )}}]}]);
    let answer = post_json_in(
        &http,
        &url,
        json!({"messages": picture}),
        IMAGE_SESSION,
        true,
    )
    .await?;
    let reply = answer["choices"][0]["message"].clone();
    writeln!(
        out,
        "[main 1 of {IMAGE_SESSION}, with a 64x48 PNG] assistant: {}\n",
        reply["content"].as_str().unwrap_or_default()
    )?;
    replies.push(reply["content"].as_str().unwrap_or_default().to_owned());

    // The trainer side: wait for the samples, pull them, print them, commit them.
    let dropped = settle(&http, &status_url, MAIN_TURNS).await?;
    let pulled: Value = http
        .get(format!(
            "{base}/v1/rollout/samples?after=0&max=100&wait_ms=1000"
        ))
        .send()
        .await?
        .json()
        .await?;
    let samples: Vec<StoredSample> = serde_json::from_value(pulled["samples"].clone())
        .map_err(|e| DemoError::Settings(format!("the pulled samples do not parse: {e}")))?;
    if mode != Mode::Rl {
        writeln!(out, "=== OPD decisions (logging.opd_record_dir) ===")?;
        for record in read_records(&store_dir.path().join("opd")) {
            writeln!(
                out,
                "  turn {}: {:<9}  hint accepted {:<5}  hint {}  reason {}",
                record["turn"],
                record["outcome"].as_str().unwrap_or("?"),
                record["accepted"],
                record["hint"],
                record["reason"],
            )?;
        }
        writeln!(out, "  ({dropped} turns gave no sample)\n")?;
    }
    writeln!(out, "=== samples pulled from GET /v1/rollout/samples ===")?;
    writeln!(
        out,
        "  {:>3}  {:<16} {:>4}  {:>5}  {:<14} {:>9}  excluded",
        "seq", "session", "turn", "score", "votes", "effective"
    )?;
    for s in &samples {
        let m = &s.sample.metadata;
        writeln!(
            out,
            "  {:>3}  {:<16} {:>4}  {:>5}  {:<14} {:>4}/{:<4}  {}",
            s.seq,
            s.sample.session_id,
            s.sample.turn,
            s.sample.reward.score,
            m.get("votes")
                .filter(|v| !v.is_null())
                .or_else(|| m.get("hint_votes"))
                .map_or_else(String::new, Value::to_string),
            s.sample.loss_mask.iter().filter(|b| **b == 1).count(),
            s.sample.response_length,
            m.get("excluded").and_then(Value::as_str).unwrap_or("-"),
        )?;
    }
    for s in &samples {
        out.write_all(describe(&s.sample, &tokenizer).as_bytes())?;
    }
    if let Some(last) = samples.last() {
        http.post(format!("{base}/v1/rollout/commit"))
            .json(&json!({"through": last.seq}))
            .send()
            .await?;
        writeln!(out, "\ncommitted through seq {}", last.seq)?;
    }
    if let Some(until) = options.keep_serving {
        writeln!(
            out,
            "\ninspection page: {base}/ui/   (the sessions, turns, votes and every token above)"
        )?;
        writeln!(
            out,
            "serving the proxy at {base} until Ctrl-C (`policy-serving demo --exit` stops here)"
        )?;
        out.flush()?;
        until.await;
    }
    running.stop().await?;
    fake.shutdown().await;
    Ok(DemoReport { replies, samples })
}

/// Waits until `turns` main turns became samples or were dropped; returns how many were dropped.
async fn settle(http: &reqwest::Client, status_url: &str, turns: usize) -> Result<u64, DemoError> {
    let mut settled = 0;
    for _ in 0..400 {
        let st: Value = http.get(status_url).send().await?.json().await?;
        let dropped = st["turns_dropped"].as_u64().unwrap_or(0);
        settled = st["samples"]["submitted"].as_u64().unwrap_or(0) + dropped;
        if settled >= turns as u64 {
            return Ok(dropped);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(DemoError::MissingSamples { got: settled })
}

fn read_records(dir: &std::path::Path) -> Vec<Value> {
    let mut records: Vec<Value> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .flat_map(|text| {
            text.lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect::<Vec<Value>>()
        })
        .collect();
    records.sort_by_key(|r| r["turn"].as_u64());
    records
}

async fn post_json(
    http: &reqwest::Client,
    url: &str,
    body: Value,
    turn_type: &str,
    done: bool,
) -> Result<Value, DemoError> {
    post(http, url, body, SESSION, turn_type, done).await
}

/// A main turn of `session`, not streamed.
async fn post_json_in(
    http: &reqwest::Client,
    url: &str,
    body: Value,
    session: &str,
    done: bool,
) -> Result<Value, DemoError> {
    post(http, url, body, session, "main", done).await
}

async fn post(
    http: &reqwest::Client,
    url: &str,
    body: Value,
    session: &str,
    turn_type: &str,
    done: bool,
) -> Result<Value, DemoError> {
    let resp = http
        .post(url)
        .header("x-session-id", session)
        .header("x-turn-type", turn_type)
        .header("x-session-done", if done { "1" } else { "0" })
        .json(&body)
        .send()
        .await?;
    let status = resp.status().as_u16();
    if status != 200 {
        return Err(DemoError::Status {
            status,
            body: resp.text().await.unwrap_or_default(),
        });
    }
    Ok(resp.json().await?)
}

async fn post_stream(
    http: &reqwest::Client,
    url: &str,
    body: Value,
    out: &mut (dyn Write + Send),
) -> Result<String, DemoError> {
    let resp = http
        .post(url)
        .header("x-session-id", SESSION)
        .header("x-turn-type", "main")
        .json(&body)
        .send()
        .await?;
    let status = resp.status().as_u16();
    if status != 200 {
        return Err(DemoError::Status {
            status,
            body: resp.text().await.unwrap_or_default(),
        });
    }
    let mut content = String::new();
    let mut pending = String::new();
    let mut bytes = resp.bytes_stream();
    while let Some(chunk) = bytes.next().await {
        pending.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(end) = pending.find("\n\n") {
            let event: String = pending.drain(..end + 2).collect();
            let Some(data) = event.trim().strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                continue;
            }
            if let Ok(v) = serde_json::from_str::<Value>(data)
                && let Some(piece) = v["choices"][0]["delta"]["content"].as_str()
            {
                content.push_str(piece);
                write!(out, "{piece}")?;
                out.flush()?;
            }
        }
    }
    Ok(content)
}

fn show(
    out: &mut (dyn Write + Send),
    n: usize,
    kind: &str,
    history: &[Value],
    reply: &Value,
) -> std::io::Result<()> {
    let last = history
        .last()
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default();
    writeln!(out, "[{kind} {n}] user: {last}")?;
    if let Some(r) = reply["reasoning_content"].as_str() {
        writeln!(out, "          reasoning: {r}")?;
    }
    writeln!(
        out,
        "          assistant: {}",
        reply["content"].as_str().unwrap_or_default()
    )?;
    if let Some(calls) = reply["tool_calls"].as_array() {
        for c in calls {
            writeln!(
                out,
                "          tool call: {}({})",
                c["function"]["name"].as_str().unwrap_or_default(),
                c["function"]["arguments"].as_str().unwrap_or_default()
            )?;
        }
    }
    writeln!(out)
}

/// A readable account of one sample: each response token with its log-prob (or why it has none),
/// where the value came from, and whether it is trained.
pub fn describe(s: &Sample, tok: &ChatTokenizer) -> String {
    let mut out = String::new();
    let missing: Vec<u64> = s
        .metadata
        .get("logprob_missing_positions")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let sources: Vec<String> = s
        .metadata
        .get("logprob_sources")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|v| v.as_str().unwrap_or("?").to_owned())
                .collect()
        })
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "\nsession {} turn {}: {} prompt tokens, {} response tokens ({} without a log-prob), reward {}, ids {}{}",
        s.session_id,
        s.turn,
        s.tokens.len() - s.response_length,
        s.response_length,
        missing.len(),
        s.reward.score,
        s.metadata
            .get("token_source")
            .and_then(Value::as_str)
            .map_or("?", |src| if src == "engine" {
                "from the engine"
            } else {
                "re-tokenized"
            }),
        s.weight_versions
            .last()
            .map(|v| format!(", policy version {v}"))
            .unwrap_or_default(),
    );
    for (i, image) in s.images.iter().enumerate() {
        let _ = writeln!(
            out,
            "  image {}: {}x{} {}, {} pad tokens in the prompt (stored once as {}…)",
            i + 1,
            image.width,
            image.height,
            image.mime,
            image.tokens,
            &image.hash[..12]
        );
    }
    match (
        &s.rollout_routed_experts,
        s.metadata.get("routed_experts_missing"),
    ) {
        (Some(e), _) => {
            let _ = writeln!(
                out,
                "  routed experts: {} rows x {} layers x top-{} as {}, in {} block(s) of up to {} rows (each stored once)",
                e.shape[0],
                e.shape[1],
                e.shape[2],
                e.dtype.numpy(),
                e.blocks.len(),
                e.block_rows
            );
        }
        (None, Some(why)) => {
            let why = why.as_str().unwrap_or("?");
            let note = if why == "routed_experts_mismatch" {
                ": the re-rendered tokens are not the engine's"
            } else {
                ""
            };
            let _ = writeln!(out, "  routed experts: none ({why}{note})");
        }
        (None, None) => {}
    }
    let teacher = s.teacher_log_probs.as_ref();
    if teacher.is_some() {
        let _ = writeln!(
            out,
            "  teacher values: {} (hint {})",
            s.metadata
                .get("teacher")
                .and_then(Value::as_str)
                .unwrap_or("?"),
            s.metadata.get("hint").unwrap_or(&Value::Null)
        );
    }
    let _ = writeln!(
        out,
        "  {:>4}  {:>6}  {:<18} {:>9}  {:>9}  {:<15} mask",
        "pos", "id", "token", "logprob", "teacher", "source"
    );
    let prompt_len = s.tokens.len() - s.response_length;
    for (i, id) in s.tokens[prompt_len..].iter().enumerate() {
        let lp = if missing.contains(&(i as u64)) {
            "-".to_owned()
        } else {
            format!("{:.4}", s.rollout_log_probs[i])
        };
        let text = format!("{:?}", tok.token_text(*id));
        let src = sources.get(i).map_or("?", String::as_str);
        let t = teacher.map_or_else(|| "-".to_owned(), |t| format!("{:.4}", t[i]));
        let _ = writeln!(
            out,
            "  {i:>4}  {id:>6}  {text:<18} {lp:>9}  {t:>9}  {src:<15} {}",
            s.loss_mask[i]
        );
    }
    out
}
