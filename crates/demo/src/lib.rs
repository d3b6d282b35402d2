//! The `policy-serving demo`: starts the fake SGLang and the real proxy on loopback, drives a short
//! scripted conversation through the proxy (main turns, one streamed, a side turn, a tool call) and
//! prints the replies and what was captured for each main turn, token by token.
//!
//! Everything it needs is embedded (`config/demo.toml`, the mini model), so it runs on a fresh
//! checkout. It is a client of the public crates only; nothing in the product depends on it.

use std::fmt::Write as _;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use ps_chat_template::ChatTokenizer;
use ps_config::Settings;
use ps_core::{CapturedTurn, PositionSource, TurnSink};
use ps_fake_sglang::FakeSglang;
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// The embedded demo settings.
pub const DEMO_SETTINGS: &str = include_str!("../../../config/demo.toml");
const SESSION: &str = "demo-session-1";
/// Main turns the script sends.
const MAIN_TURNS: usize = 3;

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("the embedded demo settings are invalid: {0}")]
    Settings(String),
    #[error(transparent)]
    Startup(#[from] ps_server::StartupError),
    #[error("demo I/O failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("demo request failed: {0}")]
    Http(#[from] reqwest::Error),
    #[error("the proxy answered HTTP {status}: {body}")]
    Status { status: u16, body: String },
    #[error("only {got} of {MAIN_TURNS} main turns were captured within 10 s")]
    MissingTurns { got: usize },
}

/// What the demo did, for tests.
#[derive(Debug)]
pub struct DemoReport {
    pub replies: Vec<String>,
    pub turns: Vec<CapturedTurn>,
}

struct ChannelSink(Mutex<mpsc::UnboundedSender<CapturedTurn>>);

impl TurnSink for ChannelSink {
    fn accept(&self, turn: CapturedTurn) {
        let tx = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let _ = tx.send(turn);
    }
}

/// Runs the demo, writing what happens to `out`.
pub async fn run(out: &mut (dyn Write + Send)) -> Result<DemoReport, DemoError> {
    let mut settings: Settings =
        toml::from_str(DEMO_SETTINGS).map_err(|e| DemoError::Settings(e.to_string()))?;
    settings
        .validate()
        .map_err(|e| DemoError::Settings(e.to_string()))?;

    let tokenizer = Arc::new(ChatTokenizer::mini());
    let fake = FakeSglang::builder()
        .tokenizer(tokenizer.clone())
        .model_name(&settings.server.served_model_name)
        .spawn()
        .await?;
    settings.sglang.chat_url = fake.chat_url();

    let (tx, mut rx) = mpsc::unbounded_channel();
    let sink = Arc::new(ChannelSink(Mutex::new(tx)));
    let no_env = |_: &str| None;
    let app = ps_server::wiring::build_app(&settings, &no_env, sink, None)?;
    let listener = ps_server::wiring::bind(&settings).await?;
    let base = format!("http://{}", listener.local_addr()?);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(ps_server::serve(listener, app, async {
        let _ = stop_rx.await;
    }));
    writeln!(out, "fake SGLang  : {}", fake.base_url())?;
    writeln!(out, "proxy        : {base}   (session {SESSION})\n")?;

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
    history.push(json!({"role": "user", "content": "And what about Italy?"}));
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
    history.push(json!({"role": "user", "content": "[call_tool] What is the weather in Rome?"}));
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

    let mut turns = Vec::new();
    while turns.len() < MAIN_TURNS {
        match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
            Ok(Some(t)) => turns.push(t),
            _ => return Err(DemoError::MissingTurns { got: turns.len() }),
        }
    }
    turns.sort_by_key(|t| t.arrival_seq);
    writeln!(out, "=== captured main turns ===")?;
    for (i, t) in turns.iter().enumerate() {
        out.write_all(describe(i + 1, t, &tokenizer).as_bytes())?;
    }
    let _ = stop_tx.send(());
    if let Ok(r) = server.await {
        r?;
    }
    fake.shutdown().await;
    Ok(DemoReport { replies, turns })
}

async fn post_json(
    http: &reqwest::Client,
    url: &str,
    body: Value,
    turn_type: &str,
    done: bool,
) -> Result<Value, DemoError> {
    let resp = http
        .post(url)
        .header("x-session-id", SESSION)
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

/// A readable account of one captured turn: sizes, then each response token with its log-prob or
/// the reason it has none, and whether it is trained.
pub fn describe(n: usize, t: &CapturedTurn, tok: &ChatTokenizer) -> String {
    let a = &t.alignment;
    let trained = a.loss_mask.iter().filter(|b| **b == 1).count();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nturn {n} (session {}, {}): {} prompt tokens, {} response tokens, {} with a log-prob, {} marked, {} trained",
        t.session_id,
        if t.streamed {
            "streamed"
        } else {
            "not streamed"
        },
        t.prompt_ids.len(),
        t.response_ids.len(),
        a.logprobs.iter().filter(|l| l.is_some()).count(),
        a.marked(),
        trained,
    );
    let _ = writeln!(
        s,
        "  {:>4}  {:>6}  {:<18} {:>9}  {:<15} mask",
        "pos", "id", "token", "logprob", "source"
    );
    for (i, id) in t.response_ids.iter().enumerate() {
        let lp = a.logprobs[i].map_or_else(|| "-".to_owned(), |l| format!("{l:.4}"));
        let src = match a.sources[i] {
            PositionSource::Sampled => "sampled",
            PositionSource::EosUnreported => "eos, unreported",
            PositionSource::Unsampled => "template/unrep.",
        };
        let text = format!("{:?}", tok.token_text(*id));
        let _ = writeln!(
            s,
            "  {i:>4}  {id:>6}  {text:<18} {lp:>9}  {src:<15} {}",
            a.loss_mask[i]
        );
    }
    s
}
