//! The real engine: the built `policy-serving` in front of vLLM (`../shared/real-engine/`: vLLM
//! 0.32 on this CPU serving a tiny random-weight Qwen3 with the real tokenizer, reasoning and tool
//! parsers), in each mode (RL; OPD and Combine with vLLM's `/v1/completions` as the teacher),
//! streamed and not, thinking on and off, with a tool call. Every turn must be trained on the
//! engine's own ids with the engine's log-prob at every response position, the samples must equal
//! what the engine answered (a recorder between the proxy and the engine keeps each answer), and
//! the drift check must find no drift.
//!
//! Needs a running engine: `POLICY_SERVING_REAL_VLLM_URL` (`http://127.0.0.1:PORT`, `.ci/run`
//! starts it). Without it the test says so and passes, unless `POLICY_SERVING_REQUIRE_REAL_ENGINE=1`
//! (CI), which makes it fail. The judges are the in-process fake's `/generate`: a random model
//! cannot vote or hint, and the judges are not what this test is about.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "harness.rs"]
mod harness;
#[path = "recorder.rs"]
mod recorder;

use std::time::Duration;

use harness::{KillOnDrop, free_port};
use ps_fake_sglang::FakeSglang;
use serde_json::{Value, json};

/// Every HTTP call of these tests, bounded (an answer of the engine takes seconds on this CPU).
fn http() -> reqwest::Client {
    harness::http(Duration::from_secs(300))
}

/// The engine's base URL, or `None` (the test then passes with a note, unless required).
fn engine_url() -> Option<String> {
    match std::env::var("POLICY_SERVING_REAL_VLLM_URL") {
        Ok(u) if !u.trim().is_empty() => Some(u.trim().trim_end_matches('/').to_owned()),
        _ => {
            assert!(
                std::env::var("POLICY_SERVING_REQUIRE_REAL_ENGINE").as_deref() != Ok("1"),
                "POLICY_SERVING_REQUIRE_REAL_ENGINE=1 but POLICY_SERVING_REAL_VLLM_URL is unset: \
                 start the engine with ../shared/real-engine/serve.sh (see .ci/run)"
            );
            eprintln!(
                "skipped: no real engine (set POLICY_SERVING_REAL_VLLM_URL, see .ci/run and \
                 ../shared/real-engine/README.md)"
            );
            None
        }
    }
}

/// The name the engine serves its model under.
async fn served_model(engine: &str) -> String {
    let v: Value = http()
        .get(format!("{engine}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["data"][0]["id"].as_str().unwrap().to_owned()
}

struct Serve {
    base: String,
    _child: KillOnDrop,
    _dir: tempfile::TempDir,
}

/// `policy-serving serve` in `mode` in front of `chat_base` (the recorder), with the fake's
/// `/generate` as the judges and the engine's `/v1/completions` as the teacher.
async fn serve(mode: &str, chat_base: &str, judge: &str, engine: &str, model: &str) -> Serve {
    serve_with(mode, chat_base, judge, engine, model, "").await
}

/// [`serve`] with more `[capture]` settings (`capture` is their TOML lines).
async fn serve_with(
    mode: &str,
    chat_base: &str,
    judge: &str,
    engine: &str,
    model: &str,
    capture: &str,
) -> Serve {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let teacher = if mode == "rl" {
        String::new()
    } else {
        format!(
            "[teacher]\nbackend = \"openai_completions\"\nurl = \"{engine}/v1/completions\"\nmodel = \"{model}\"\n\
             timeout_sec = 300\n[opd]\ntop_k = {}\n",
            if mode == "opd" { 2 } else { 0 }
        )
    };
    let config = dir.path().join("settings.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nport = {port}\nmode = \"{mode}\"\n\
             [sglang]\nchat_url = \"{chat_base}/v1/chat/completions\"\ntimeout_sec = 300\n\
             [prm]\nrouter_url = \"{judge}\"\n{teacher}\
             [capture]\ndrift_check_first = 1000000\n{capture}\
             [store]\npath = \"{}\"\n",
            dir.path().join("store").display()
        ),
    )
    .unwrap();
    let (child, base) = harness::serve(&config, port).await;
    Serve {
        base,
        _child: child,
        _dir: dir,
    }
}

/// One variant of a conversation.
#[derive(Debug, Clone, Copy)]
struct Variant {
    stream: bool,
    thinking: bool,
    tool: bool,
    /// The call forced with a named `tool_choice` (vLLM's grammar) instead of a regex.
    named: bool,
    /// `max_tokens` (a forced tool call takes ~37 tokens: fewer cut it off).
    max_tokens: u32,
}

const TURNS: usize = 3;

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
}

/// The client's view of one answer: the message it sends back next turn.
async fn ask(base: &str, session: &str, body: &Value, done: bool) -> Value {
    let mut req = http()
        .post(format!("{base}/v1/chat/completions"))
        .header("X-Session-Id", session)
        .header("X-Turn-Type", "main")
        .json(body);
    if done {
        req = req.header("X-Session-Done", "1");
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), 200, "{session}");
    if body["stream"] == true {
        let text = r.text().await.unwrap();
        assert!(
            !text.contains("token_ids"),
            "{session}: the ids asked for training reached the client: {text}"
        );
        let (mut content, mut calls) = (String::new(), Vec::<Value>::new());
        for data in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
            if data == "[DONE]" {
                continue;
            }
            let c: Value = serde_json::from_str(data).unwrap();
            assert!(c.get("error").is_none(), "{session}: {c}");
            let Some(delta) = c["choices"].get(0).map(|ch| &ch["delta"]) else {
                continue;
            };
            content.push_str(delta["content"].as_str().unwrap_or(""));
            for tc in delta["tool_calls"].as_array().into_iter().flatten() {
                let i = tc["index"].as_u64().unwrap_or(0) as usize;
                if calls.len() <= i {
                    calls.push(json!({"id": tc["id"], "type": "function",
                        "function": {"name": "", "arguments": ""}}));
                }
                let f = &mut calls[i]["function"];
                for k in ["name", "arguments"] {
                    let piece = tc["function"][k].as_str().unwrap_or("");
                    f[k] = json!(format!("{}{piece}", f[k].as_str().unwrap_or("")));
                }
            }
        }
        let mut m = json!({"role": "assistant", "content": content});
        if !calls.is_empty() {
            m["tool_calls"] = Value::Array(calls);
        }
        m
    } else {
        let v: Value = r.json().await.unwrap();
        assert!(
            v.get("prompt_token_ids").is_none() && v["choices"][0].get("token_ids").is_none(),
            "{session}: the ids asked for training reached the client: {v}"
        );
        let m = &v["choices"][0]["message"];
        let mut out = json!({"role": "assistant", "content": m["content"].as_str().unwrap_or("")});
        if m["tool_calls"].is_array() {
            out["tool_calls"] = m["tool_calls"].clone();
        }
        out
    }
}

/// A conversation of [`TURNS`] main turns, the last ending the session. A tool call is forced
/// with a regex over the hermes markup (with random weights a named `tool_choice` seldom closes
/// its arguments; docs/upstream-protocols.md, section 7), so that the real tool parser answers
/// `tool_calls`.
async fn conversation(base: &str, model: &str, session: &str, v: Variant) {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a helpful assistant."}),
        json!({"role": "user", "content": "Hello there, tell me about the weather."}),
    ];
    for turn in 0..TURNS {
        let mut body = json!({"model": model, "messages": messages, "max_tokens": v.max_tokens,
            "stream": v.stream, "chat_template_kwargs": {"enable_thinking": v.thinking}});
        if !v.thinking && !v.tool {
            // An answer that ends by itself (a random model never does): its text is compared
            // by the drift check, as a cut one's is not.
            body["structured_outputs"] = json!({"regex": "(Sunny|Rainy), [1-3][0-9] degrees\\."});
        }
        if v.tool && v.named {
            // vLLM decodes a named tool_choice with a grammar that forces the call's head; with
            // random weights its arguments seldom close, and the answer is mostly cut by
            // max_tokens (now and then it closes them, spaced its own way: a case of its own).
            body["tools"] = tools();
            body["tool_choice"] = json!({"type": "function", "function": {"name": "get_weather"}});
        } else if v.tool {
            body["tools"] = tools();
            body["tool_choice"] = json!("auto");
            body["structured_outputs"] = json!({"regex":
                "<tool_call>\n\\{\"name\": \"get_weather\", \"arguments\": \\{\"city\": \"(Paris|Rome)\"\\}\\}\n</tool_call>"});
        }
        let reply = ask(base, session, &body, turn + 1 == TURNS).await;
        let call = reply["tool_calls"][0].clone();
        if v.tool && !v.named && !v.thinking && v.max_tokens >= 64 {
            assert!(
                call.is_object(),
                "{session}: the forced call was parsed: {reply}"
            );
        }
        messages.push(reply);
        messages.push(if call.is_object() {
            json!({"role": "tool", "tool_call_id": call["id"], "content": "sunny, 21 C"})
        } else {
            json!({"role": "user", "content": format!("Go on, part {}.", turn + 2)})
        });
    }
}

/// Waits until every one of `turns` is settled: a stored sample, a counted drop or a counted
/// abandon, none pending, none queued for capture, no live session (each conversation ended
/// itself).
async fn settled(base: &str, turns: u64) -> Value {
    // Bounded so that a stuck pipeline fails with its status; judging and the teacher are local.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        let st: Value = http()
            .get(format!("{base}/v1/rollout/status"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let pending: u64 = st["pending"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum();
        let done = ["turns_dropped", "turns_abandoned"]
            .iter()
            .map(|k| st[k].as_u64().unwrap())
            .sum::<u64>()
            + st["stored"].as_u64().unwrap();
        if done == turns
            && pending == 0
            && st["capture_queue"]["turns"] == 0
            && st["live_sessions"] == 0
        {
            return st;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the run never settled: {st}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// One mode through every variant; returns how many samples were checked.
async fn run_mode(mode: &str) -> Option<usize> {
    let engine = engine_url()?;
    let model = served_model(&engine).await;
    let rec = recorder::Recorder::start(&engine).await;
    let judge = FakeSglang::builder().spawn().await.unwrap();
    let s = serve(mode, &rec.url(), &judge.generate_url(), &engine, &model).await;
    let mut variants = Vec::new();
    for stream in [true, false] {
        for thinking in [true, false] {
            variants.push(Variant {
                stream,
                thinking,
                tool: false,
                named: false,
                max_tokens: 24,
            });
        }
        variants.push(Variant {
            stream,
            thinking: false,
            tool: true,
            named: false,
            max_tokens: 64,
        });
        variants.push(Variant {
            stream,
            thinking: false,
            tool: true,
            named: true,
            max_tokens: 24,
        });
    }
    // A tool call cut off by `max_tokens`, streamed: the parser has announced the call, its
    // arguments never closed.
    variants.push(Variant {
        stream: true,
        thinking: false,
        tool: true,
        named: false,
        max_tokens: 20,
    });
    for (i, v) in variants.iter().enumerate() {
        conversation(&s.base, &model, &format!("{mode}-{i}-{v:?}"), *v).await;
    }
    let turns = variants.len() * TURNS;
    let st = settled(&s.base, turns as u64).await;
    let t = &st["token_ids"];
    assert_eq!(
        t["engine"], turns,
        "{mode}: every turn on the engine's ids: {st}"
    );
    assert_eq!(t["retokenized"], 0, "{mode}: {st}");
    assert_eq!(t["engine_ids_missing"], 0, "{mode}: {st}");
    assert_eq!(
        t["drift_checked"], turns,
        "{mode}: every turn checked: {st}"
    );
    assert_eq!(t["drift"], 0, "{mode}: no false drift: {}", t["last_drift"]);
    assert_eq!(t["engine_prompts_agree"], true, "{mode}: {st}");
    assert_eq!(st["turns_abandoned"], 0, "{mode}: {st}");
    assert_eq!(st["teacher_mismatches"], 0, "{mode}: {st}");

    let page: Value = http()
        .get(format!("{}/v1/rollout/samples?after=0&max=1024", s.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let samples = page["samples"].as_array().unwrap();
    let submitted = st["samples"]["submitted"].as_u64().unwrap() as usize;
    assert_eq!(samples.len(), submitted, "{mode}: {st}");
    let dropped = st["turns_dropped"].as_u64().unwrap() as usize;
    assert_eq!(
        submitted + dropped,
        turns,
        "{mode}: every turn a sample or a counted drop: {st}"
    );
    if mode == "rl" {
        assert_eq!(
            submitted, turns,
            "{mode}: in RL every turn is a sample: {st}"
        );
    } else {
        assert!(submitted > 0, "{mode}: no OPD sample at all: {st}");
    }
    // Each sample is exactly one answer of the engine: its prompt ids, its sampled ids and its
    // log-prob of each.
    let chats: Vec<_> = rec
        .exchanges()
        .into_iter()
        .filter(|e| e.path.starts_with("/v1/chat/completions"))
        .collect();
    assert_eq!(chats.len(), turns, "{mode}: one engine call per turn");
    // The answers forced to end by themselves (plain ones without thinking, whole tool calls):
    // their responses were compared as text by the drift check, not only their prompts. The
    // conversations ran one after the other, so the k-th call is turn k % TURNS of variant
    // k / TURNS. A named tool_choice's grammar-forced call may or may not close its arguments
    // within max_tokens (random weights): either is fine.
    for (k, e) in chats.iter().enumerate() {
        let v = variants[k / TURNS];
        if !v.thinking && !v.named && v.max_tokens >= 24 {
            assert!(
                matches!(e.finish_reason().as_deref(), Some("stop" | "tool_calls")),
                "{mode}: the forced answer {k} ({v:?}) ended by itself: {:?}",
                e.finish_reason()
            );
        }
        // The forced call cut off by `max_tokens` (20 tokens, fewer than the call needs).
        if v.tool && !v.named && v.max_tokens < 24 {
            assert_eq!(
                e.finish_reason().as_deref(),
                Some("length"),
                "{mode}: the call {k} ({v:?}) was cut"
            );
        }
    }
    let answers: Vec<(Vec<u32>, Vec<u32>, Vec<f64>)> = chats
        .iter()
        .map(|e| {
            assert_eq!(
                e.request["return_token_ids"], true,
                "{mode}: ids asked for: {:?}",
                e.request
            );
            e.ids_and_logprobs().expect("the engine returned its ids")
        })
        .collect();
    for item in samples {
        let x = &item["sample"];
        let what = format!("{mode} {} turn {}", x["session_id"], x["turn"]);
        assert_eq!(x["metadata"]["token_source"], "engine", "{what}");
        let tokens = ids(&x["tokens"]);
        let rl = x["response_length"].as_u64().unwrap() as usize;
        let (prompt, response) = tokens.split_at(tokens.len() - rl);
        let (_, _, logprobs) = answers
            .iter()
            .find(|(p, r, _)| p == prompt && r == response)
            .unwrap_or_else(|| panic!("{what}: no engine answer has these ids"));
        let lps: Vec<f64> = x["rollout_log_probs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                v.as_f64()
                    .unwrap_or_else(|| panic!("{what}: a position without a log-prob"))
            })
            .collect();
        assert_eq!(
            &lps, logprobs,
            "{what}: the engine's log-prob at every position"
        );
        // Every sampled position trains, unless the sample is excluded (RL: no next state, or a
        // score of 0 after an effective one), where none does.
        let mask = if x["metadata"]["excluded"].is_null() {
            1
        } else {
            0
        };
        assert!(
            x["loss_mask"]
                .as_array()
                .unwrap()
                .iter()
                .all(|m| *m == mask),
            "{what}: loss mask not all {mask}: {}",
            x["metadata"]
        );
        assert_eq!(
            x["metadata"]["logprob_missing_positions"],
            json!([]),
            "{what}"
        );
        if mode != "rl" {
            let teacher = x["teacher_log_probs"].as_array().unwrap();
            assert_eq!(
                teacher.len(),
                rl,
                "{what}: a teacher log-prob per response token"
            );
            assert!(teacher.iter().all(Value::is_number), "{what}");
        }
    }
    Some(samples.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rl_on_the_real_engine() {
    if let Some(n) = run_mode("rl").await {
        eprintln!("rl: {n} samples checked against the engine's answers");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opd_with_the_real_engine_as_policy_and_teacher() {
    if let Some(n) = run_mode("opd").await {
        eprintln!("opd: {n} samples checked against the engine's answers");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn combine_with_the_real_engine_as_policy_and_teacher() {
    if let Some(n) = run_mode("combine").await {
        eprintln!("combine: {n} samples checked against the engine's answers");
    }
}

/// Sampling parameters against the real engine: what a client sends reaches vLLM as sent and the
/// sample says what it means (`top_p: 0.9` truncated and marked; nothing sent left to the model's
/// `generation_config.json`, which for this model is itself truncating); `capture.sampling =
/// "full_distribution"` sends `top_p: 1, top_k: -1, min_p: 0`, which the real vLLM takes (every
/// turn answered, every sample full).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_parameters_on_the_real_engine() {
    let Some(engine) = engine_url() else { return };
    let model = served_model(&engine).await;
    let judge = FakeSglang::builder().spawn().await.unwrap();
    for (capture, want) in [
        ("", ["truncated", "engine_defaults"]),
        ("sampling = \"full_distribution\"\n", ["full", "full"]),
    ] {
        let rec = recorder::Recorder::start(&engine).await;
        let s = serve_with(
            "rl",
            &rec.url(),
            &judge.generate_url(),
            &engine,
            &model,
            capture,
        )
        .await;
        for (i, extra) in [
            json!({"top_p": 0.9, "temperature": 0.8}),
            json!({"temperature": 0.8}),
        ]
        .into_iter()
        .enumerate()
        {
            for stream in [false, true] {
                let session = format!("sampling-{i}-{stream}");
                let mut history = vec![json!({"role": "user", "content": "Name a colour."})];
                for turn in 0..2 {
                    let mut body = json!({"model": model, "messages": history, "max_tokens": 12,
                        "stream": stream, "chat_template_kwargs": {"enable_thinking": false}});
                    for (k, v) in extra.as_object().unwrap() {
                        body[k] = v.clone();
                    }
                    let m = ask(&s.base, &session, &body, turn == 1).await;
                    history.push(m);
                    history.push(json!({"role": "user", "content": "Another."}));
                }
            }
        }
        let st = settled(&s.base, 8).await;
        let samples: Value = http()
            .get(format!("{}/v1/rollout/samples?after=0&max=100", s.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let samples = samples["samples"].as_array().unwrap();
        assert_eq!(samples.len(), 8, "{st}");
        for x in samples {
            let m = &x["sample"]["metadata"];
            let i = usize::from(
                !x["sample"]["session_id"]
                    .as_str()
                    .unwrap()
                    .starts_with("sampling-0"),
            );
            assert_eq!(m["sampling_kind"], want[i], "{capture:?}: {m}");
            assert_eq!(m["sampling"]["temperature"], 0.8);
            assert_eq!(
                m.get("truncated_sampling_without_sets").is_some(),
                want[i] == "truncated"
            );
        }
        // What vLLM was sent.
        let bodies: Vec<Value> = rec
            .exchanges()
            .into_iter()
            .filter(|e| e.path == "/v1/chat/completions")
            .map(|e| e.request)
            .collect();
        assert_eq!(bodies.len(), 8);
        for b in &bodies {
            if capture.is_empty() {
                assert!(b.get("top_k").is_none() && b.get("min_p").is_none(), "{b}");
                assert!(b.get("top_p").is_none_or(|p| p == 0.9), "{b}");
            } else {
                assert_eq!(
                    (&b["top_p"], &b["top_k"], &b["min_p"]),
                    (&json!(1), &json!(-1), &json!(0))
                );
            }
        }
    }
}
