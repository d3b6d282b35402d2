//! The chat path under upstream faults, through the full app (`ps_app::build_app`) in front of two
//! in-process fakes: the policy (refused connections, timeouts, 5xx and 429 answers, garbage, streams
//! cut or broken mid-way) and the PRM judge (slow, timing out, 429 storms, refused). Every request
//! gets the right status and shape (streams end with `[DONE]`), and no captured turn is lost: every
//! main request ends as a sample, an abandoned turn or a dropped turn, and nothing stays pending.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::Duration;

use common::{accounted, pending};
use futures::StreamExt;
use ps_config::Settings;
use ps_fake_sglang::{FakeHandle, FakeSglang, Fault};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Server {
    url: String,
    _dir: tempfile::TempDir,
    running: Option<ps_app::Running>,
}

impl Server {
    async fn start(settings: Settings, dir: tempfile::TempDir) -> Self {
        let running = common::spawn(&settings, &common::no_env).await;
        let url = running.url().to_owned();
        Self {
            url,
            _dir: dir,
            running: Some(running),
        }
    }

    async fn stop(mut self) {
        self.running.take().unwrap().stop().await.unwrap();
    }

    async fn status(&self) -> Value {
        common::status(&self.url).await
    }

    /// Waits until no turn is pending and `expected` main turns are accounted for; returns the
    /// last status either way.
    async fn wait_accounted(&self, expected: u64, within: Duration) -> Value {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let st = self.status().await;
            if (pending(&st) == 0 && accounted(&st) >= expected)
                || tokio::time::Instant::now() > deadline
            {
                return st;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A fault's delay that `sglang.timeout_sec` (6 s) always cuts: the round is a 504.
const TIMEOUT_DELAY: Duration = Duration::from_millis(9000);

fn settings(policy: &FakeHandle, judge: &FakeHandle, dir: &std::path::Path) -> Settings {
    let mut s = common::settings(policy, &dir.join("store"));
    // Long enough that a healthy round never times out on a loaded 2-core CI machine (the fake
    // answers in milliseconds; 2 s was seen to fail there as 504), short enough to time out the
    // few rounds whose fault delays past it (TIMEOUT_DELAY) without making the test slow.
    s.sglang.timeout_sec = 6;
    s.sglang.connect_timeout_sec = 1;
    s.prm.router_url = judge.generate_url();
    s.prm.timeout_sec = 1;
    s.logging.record_dir = Some(dir.join("records"));
    s
}

/// What one request should look like to its client.
fn expected_outcome(fault: Option<&Fault>, stream: bool) -> String {
    match fault {
        None => "ok".into(),
        Some(Fault::Delay(d)) if *d < Duration::from_millis(500) => "ok".into(),
        Some(Fault::Delay(_)) => "504".into(),
        Some(Fault::Refuse | Fault::Garbage) => "502".into(),
        Some(Fault::Status(code, _)) => code.to_string(),
        Some(Fault::CutStream { after_chunks }) if stream && *after_chunks > 0 => {
            "200+error_event".into()
        }
        Some(Fault::CutStream { .. }) => "502".into(),
        Some(Fault::StreamError { .. }) if stream => "200+error_event".into(),
        Some(Fault::StreamError { .. }) => "500".into(),
    }
}

/// A small deterministic generator, so that a failure replays.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

fn random_fault(rng: &mut Lcg, timeouts_left: &mut u32) -> Option<Fault> {
    let upstream_error = |code: u16| {
        json!({"object": "error", "message": format!("fault {code}"), "type": "Fault", "code": code})
            .to_string()
    };
    match rng.next(20) {
        0..=6 => None,
        7 => Some(Fault::Refuse),
        8 => Some(Fault::Status(500, upstream_error(500))),
        9 => Some(Fault::Status(503, upstream_error(503))),
        10 => Some(Fault::Status(429, upstream_error(429))),
        11 => Some(Fault::Garbage),
        12 | 13 => Some(Fault::CutStream {
            after_chunks: usize::try_from(rng.next(4)).unwrap(),
        }),
        14 | 15 => Some(Fault::StreamError {
            after_chunks: usize::try_from(rng.next(4)).unwrap(),
        }),
        16 => Some(Fault::Delay(Duration::from_millis(30))),
        _ if *timeouts_left > 0 && rng.next(4) == 0 => {
            *timeouts_left -= 1;
            Some(Fault::Delay(TIMEOUT_DELAY))
        }
        _ => None,
    }
}

/// The SSE data payloads of a streamed answer.
fn sse_events(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            e.lines()
                .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect()
}

/// Sends one main turn and checks the answer's shape; returns (outcome, assistant message if any).
async fn send(
    http: &reqwest::Client,
    url: &str,
    session: &str,
    messages: &[Value],
    stream: bool,
    done: bool,
    cancel: bool,
) -> (String, Option<Value>) {
    let what = format!("session {session} turn {} stream {stream}", messages.len());
    let r = http
        .post(format!("{url}/v1/chat/completions"))
        .header("x-session-id", session)
        .header("x-turn-type", "main")
        .header("x-session-done", if done { "1" } else { "0" })
        .json(&json!({"messages": messages, "stream": stream}))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{what}: no answer: {e}"));
    let status = r.status().as_u16();
    if cancel {
        // The client goes away after the first bytes.
        let mut body = r.bytes_stream();
        let _ = body.next().await;
        drop(body);
        return ("cancelled".into(), None);
    }
    let content_type = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let text = tokio::time::timeout(Duration::from_secs(30), r.text())
        .await
        .unwrap_or_else(|_| panic!("{what}: the body does not end"))
        .unwrap_or_else(|e| panic!("{what}: the body breaks: {e}"));
    if status != 200 {
        let body: Value = serde_json::from_str(&text).unwrap_or_else(|e| {
            panic!("{what}: {status} with a body that is not JSON ({e}): {text}")
        });
        if matches!(status, 502 | 504) {
            // Our own errors, in the OpenAI shape.
            let err = &body["error"];
            let code = err["code"].as_str().unwrap_or_default();
            assert!(code.starts_with("upstream_"), "{what}: {body}");
            assert!(
                err["type"].is_string() && err["message"].is_string(),
                "{what}: {body}"
            );
        } else {
            // The upstream's answer (SGLang's flat error), passed through unchanged.
            let message = body["message"].as_str().unwrap_or_default();
            assert!(message.contains("fault"), "{what}: {status} {body}");
        }
        return (status.to_string(), None);
    }
    if !stream {
        assert!(content_type.starts_with("application/json"), "{what}");
        let body: Value = serde_json::from_str(&text).unwrap();
        let msg = body["choices"][0]["message"].clone();
        assert!(msg["content"].is_string(), "{what}: {body}");
        assert_eq!(body["session_id"], session, "{what}");
        return (
            "ok".into(),
            Some(json!({"role": "assistant", "content": msg["content"]})),
        );
    }
    assert!(
        content_type.starts_with("text/event-stream"),
        "{what}: {content_type}"
    );
    let events = sse_events(&text);
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{what}: {text}"
    );
    assert_eq!(
        events.iter().filter(|e| *e == "[DONE]").count(),
        1,
        "{what}: {text}"
    );
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap_or_else(|err| panic!("{what}: {err}: {e}")))
        .collect();
    let errors = chunks.iter().filter(|c| c.get("error").is_some()).count();
    if errors > 0 {
        assert_eq!(errors, 1, "{what}: {text}");
        assert!(
            chunks.last().unwrap().get("error").is_some(),
            "{what}: the error event is the last before [DONE]: {text}"
        );
        return ("200+error_event".into(), None);
    }
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert!(!content.is_empty(), "{what}: {text}");
    assert!(
        chunks
            .iter()
            .any(|c| c["choices"][0]["finish_reason"].is_string()),
        "{what}: no finish reason: {text}"
    );
    (
        "ok".into(),
        Some(json!({"role": "assistant", "content": content})),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_turn_is_lost_and_every_answer_is_right_under_mixed_faults() {
    const ROUNDS: usize = 50;
    const SLOTS: usize = 4;
    const TURNS_PER_SESSION: usize = 5;

    let dir = tempfile::tempdir().unwrap();
    let policy = FakeSglang::builder().spawn().await.unwrap();
    let judge = FakeSglang::builder().spawn().await.unwrap();
    let s = Server::start(settings(&policy, &judge, dir.path()), dir).await;
    let http = common::http();
    let mut rng = Lcg(0x5eed);
    let mut timeouts_left = 2;
    let mut histories: Vec<Vec<Value>> = vec![Vec::new(); SLOTS];
    let mut main_requests = 0u64;
    let mut outcomes: std::collections::BTreeMap<String, usize> = Default::default();

    for round in 0..ROUNDS {
        // The judge: a 429 storm, then slow answers, then answers slower than `prm.timeout_sec`,
        // then refused and garbage answers, then healthy again.
        match round {
            8 => judge.set_fault(Some(Fault::Status(
                429,
                json!({"error": {"message": "rate limited"}}).to_string(),
            ))),
            18 => judge.set_fault(Some(Fault::Delay(Duration::from_millis(200)))),
            24 => judge.set_fault(Some(Fault::Delay(Duration::from_millis(1500)))),
            28 => {
                judge.set_fault(None);
                for _ in 0..6 {
                    judge.push_fault(Fault::Refuse);
                    judge.push_fault(Fault::Garbage);
                }
            }
            32 => judge.set_fault(Some(Fault::Status(503, String::new()))),
            36 => judge.set_fault(None),
            _ => {}
        }
        let stream = round % 2 == 1;
        let session_gen = round / TURNS_PER_SESSION;
        let done = round % TURNS_PER_SESSION == TURNS_PER_SESSION - 1;
        // Every seventh round the clients of streamed answers go away after the first bytes instead.
        let cancel_round = stream && round % 7 == 0;
        let faults: Vec<Option<Fault>> = (0..SLOTS)
            .map(|_| {
                if cancel_round {
                    None
                } else {
                    random_fault(&mut rng, &mut timeouts_left)
                }
            })
            .collect();
        for f in faults.iter().flatten() {
            policy.push_fault(f.clone());
        }
        let mut expected: Vec<String> = faults
            .iter()
            .map(|f| expected_outcome(f.as_ref(), stream))
            .collect();
        let tasks: Vec<_> = (0..SLOTS)
            .map(|slot| {
                let history = &mut histories[slot];
                if round % TURNS_PER_SESSION == 0 {
                    history.clear();
                }
                history.push(json!({"role": "user", "content": format!("Round {round}, slot {slot}: go on.")}));
                let messages = history.clone();
                let session = format!("g{session_gen}-s{slot}");
                let http = http.clone();
                let url = s.url.clone();
                let cancel = cancel_round && slot % 2 == 0;
                tokio::spawn(async move {
                    send(&http, &url, &session, &messages, stream, done, cancel).await
                })
            })
            .collect();
        let mut got = Vec::new();
        for (slot, t) in tasks.into_iter().enumerate() {
            let (outcome, answer) = t.await.unwrap();
            if let Some(a) = answer {
                histories[slot].push(a);
            }
            *outcomes.entry(outcome.clone()).or_default() += 1;
            got.push(outcome);
            main_requests += 1;
        }
        // Which request met which fault depends on arrival order: compare as multisets.
        if cancel_round {
            for (slot, e) in expected.iter_mut().enumerate() {
                if slot % 2 == 0 {
                    *e = "cancelled".into();
                }
            }
        }
        got.sort();
        expected.sort();
        assert_eq!(
            got, expected,
            "round {round} (stream {stream}), faults {faults:?}"
        );
    }
    judge.set_fault(None);
    policy.set_fault(None);

    let st = s
        .wait_accounted(main_requests, Duration::from_secs(60))
        .await;
    assert_eq!(pending(&st), 0, "turns left pending: {st}");
    assert_eq!(st["live_sessions"], 0, "{st}");
    assert_eq!(
        accounted(&st),
        main_requests,
        "every main turn ends as a sample, an abandoned turn or a dropped turn: {st}; outcomes {outcomes:?}"
    );
    assert_eq!(
        st["samples"]["dropped"], 0,
        "the store took every sample: {st}"
    );
    // Every answered turn became a sample and every failed one was abandoned; a client that went
    // away may have done so after its answer was complete.
    let answered = outcomes.get("ok").copied().unwrap_or(0) as u64;
    let cancelled = outcomes.get("cancelled").copied().unwrap_or(0) as u64;
    let submitted = st["samples"]["submitted"].as_u64().unwrap();
    assert!(
        (answered..=answered + cancelled).contains(&submitted),
        "{st}; outcomes {outcomes:?}"
    );
    // The judge faults happened (429s, timeouts, refusals): some turns were scored with failed
    // votes, others with real ones, and none of it blocked scoring.
    let judge_calls = judge
        .requests()
        .iter()
        .filter(|r| r.path == "/generate")
        .count();
    let page: Value = common::http()
        .get(format!("{}/v1/rollout/samples?after=0&max=1024", s.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let votes: Vec<&Value> = page["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x["sample"]["metadata"]["votes"].as_array())
        .flatten()
        .collect();
    assert!(votes.iter().any(|v| v.is_null()), "some failed votes");
    assert!(votes.iter().any(|v| v.is_number()), "some real votes");
    eprintln!("outcomes {outcomes:?}, judge calls {judge_calls}, status {st}");
    s.stop().await;
}

/// A tiny upstream that answers every chat request with `body` as `text/event-stream`.
async fn raw_upstream(body: &'static [u8]) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut tmp = [0u8; 4096];
                // Read the head and the announced body.
                loop {
                    let Ok(n) = sock.read(&mut tmp).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&tmp[..n]);
                    if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        if buf.len() >= end + 4 + len {
                            break;
                        }
                    }
                }
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = sock.write_all(head.as_bytes()).await;
                let _ = sock.write_all(body).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    format!("http://{addr}/v1/chat/completions")
}

#[tokio::test]
async fn an_upstream_stream_starting_with_a_bom_is_answered() {
    let chunk = r#"{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}"#;
    let body: &'static [u8] = Box::leak(
        format!("\u{feff}data: {chunk}\n\ndata: [DONE]\n\n")
            .into_bytes()
            .into_boxed_slice(),
    );
    let dir = tempfile::tempdir().unwrap();
    let judge = FakeSglang::builder().spawn().await.unwrap();
    let mut set = settings(&judge, &judge, dir.path());
    set.sglang.chat_url = raw_upstream(body).await;
    // This upstream answers every request with the same stream, so it cannot say which model it
    // serves: the tokenizer comes from the setting.
    set.server.model_dir = Some(ps_fake_sglang::MINI_MODEL_DIR.into());
    let s = Server::start(set, dir).await;
    let r = common::http()
        .post(format!("{}/v1/chat/completions", s.url))
        .header("x-session-id", "bom")
        .header("x-session-done", "1")
        .json(&json!({"messages": [{"role": "user", "content": "hi"}], "stream": true}))
        .send()
        .await
        .expect("an answer, not a dropped connection");
    let status = r.status().as_u16();
    let text = r.text().await.expect("a complete body");
    // The BOM is skipped (as the SSE parser one level down does): the stream is answered, not
    // refused as garbage.
    assert_eq!(status, 200, "{text}");
    let events = sse_events(&text);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{text}");
    let content: String = events
        .iter()
        .filter(|e| e.as_str() != "[DONE]")
        .map(|e| serde_json::from_str::<Value>(e).unwrap_or_else(|err| panic!("{err}: {e}")))
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(
        content, "hi",
        "the upstream's content reaches the client: {text}"
    );
    assert!(!text.contains("\"error\""), "no error event: {text}");
    let st = s.wait_accounted(1, Duration::from_secs(10)).await;
    assert_eq!(accounted(&st), 1, "{st}");
    s.stop().await;
}
