//! Hostile and malformed input on every endpoint of the full app (`ps_app::build_app`, a temporary
//! store and record directory, the in-process fake SGLang): wrong methods, unknown routes, wrong JSON
//! types, huge and deeply nested bodies, invalid UTF-8, header injection attempts over a raw socket,
//! and session ids made of path characters. Every error has the OpenAI shape, nothing is written
//! outside the configured directories, and after each bad request the server still serves a good one.
//!
//! Long because it is the one catalogue of hostile input: one test per endpoint and kind of bad input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{accounted, pending};
use ps_fake_sglang::{FakeHandle, FakeSglang};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `server.max_body_bytes` of these tests: a 1 MB message fits, 2 MiB + 1 does not.
const MAX_BODY: u64 = 2 * 1024 * 1024;

struct Server {
    url: String,
    addr: std::net::SocketAddr,
    dir: tempfile::TempDir,
    _fake: FakeHandle,
    running: Option<ps_app::Running>,
}

impl Server {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeSglang::builder().spawn().await.unwrap();
        let mut s = common::settings(&fake, &dir.path().join("store"));
        s.server.max_body_bytes = MAX_BODY;
        s.logging.record_dir = Some(dir.path().join("records"));
        let running = common::spawn(&s, &common::no_env).await;
        let addr = running.addr();
        Self {
            url: running.url().to_owned(),
            addr,
            dir,
            _fake: fake,
            running: Some(running),
        }
    }

    async fn stop(mut self) -> tempfile::TempDir {
        self.running.take().unwrap().stop().await.unwrap();
        self.dir
    }

    fn http(&self) -> reqwest::Client {
        common::http()
    }

    async fn chat_raw(&self, body: impl Into<reqwest::Body>) -> reqwest::Response {
        self.http()
            .post(format!("{}/v1/chat/completions", self.url))
            .header("content-type", "application/json")
            .header("x-turn-type", "side")
            .body(body)
            .send()
            .await
            .unwrap()
    }

    async fn status(&self) -> Value {
        let r = self
            .http()
            .get(format!("{}/v1/rollout/status", self.url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.json().await.unwrap()
    }

    /// A good chat request (a side turn, so it adds no sample) and a good admin request succeed.
    async fn assert_alive(&self, after: &str) {
        let r = self
            .http()
            .post(format!("{}/v1/chat/completions", self.url))
            .header("x-session-id", "alive-check")
            .header("x-turn-type", "side")
            .json(&json!({"messages": [{"role": "user", "content": "still there?"}]}))
            .send()
            .await
            .unwrap_or_else(|e| panic!("after {after}: the server does not answer: {e}"));
        assert_eq!(r.status(), 200, "after {after}");
        let body: Value = r.json().await.unwrap();
        assert!(
            body["choices"][0]["message"]["content"].is_string(),
            "after {after}: {body}"
        );
        self.status().await;
    }

    /// Waits until no turn is pending, no session is live, and `n` main turns reached an end
    /// (see [`accounted`]); fails when that state is not reached.
    async fn wait_settled(&self, n: u64) -> Value {
        // A generous bound: the turns settle in milliseconds; it only keeps a lost turn from
        // hanging the test.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let st = self.status().await;
            if pending(&st) == 0 && st["live_sessions"] == 0 && accounted(&st) >= n {
                return st;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{n} turns were not accounted for: {st}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn wait_submitted(&self, n: u64) -> Value {
        for _ in 0..400 {
            let st = self.status().await;
            if st["samples"]["submitted"].as_u64().unwrap() >= n {
                return st;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("{n} samples were not submitted: {}", self.status().await);
    }
}

/// Asserts an error in the OpenAI shape `{"error": {"message", "type", "code"}}`; returns the code.
async fn assert_openai_error(resp: reqwest::Response, status: u16, what: &str) -> String {
    assert_eq!(resp.status().as_u16(), status, "{what}");
    let ct = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let text = resp.text().await.unwrap();
    assert!(
        ct.starts_with("application/json"),
        "{what}: content-type {ct:?}, body {text:?}"
    );
    let body: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{what}: body is not JSON ({e}): {text:?}"));
    let err = &body["error"];
    assert!(
        err["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}: {body}"
    );
    assert!(err["type"].is_string(), "{what}: {body}");
    assert!(err["code"].is_string(), "{what}: {body}");
    err["code"].as_str().unwrap().to_owned()
}

/// A raw HTTP/1.1 exchange: writes `request` as is, reads until the server closes or `Content-Length`
/// bytes of body arrived. Returns (status, head, body); status 0 when the server closed without an
/// answer.
async fn raw(addr: std::net::SocketAddr, request: &[u8]) -> (u16, String, Vec<u8>) {
    raw_within(addr, request, Duration::from_secs(20)).await
}

async fn raw_within(
    addr: std::net::SocketAddr,
    request: &[u8],
    within: Duration,
) -> (u16, String, Vec<u8>) {
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    sock.write_all(request).await.unwrap();
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    let read = async {
        loop {
            match sock.read(&mut tmp).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&tmp[..n]),
            }
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok());
                if len.is_some_and(|len| buf.len() >= end + 4 + len) {
                    break;
                }
            }
        }
    };
    tokio::time::timeout(within, read)
        .await
        .unwrap_or_else(|_| panic!("the server answers or closes within {within:?}"));
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return (0, String::from_utf8_lossy(&buf).into_owned(), Vec::new());
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head, buf[end + 4..].to_vec())
}

fn chat_request(headers: &[u8], body: &[u8]) -> Vec<u8> {
    let mut r = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n".to_vec();
    r.extend_from_slice(headers);
    r.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
    r.extend_from_slice(body);
    r
}

const HELLO: &[u8] = br#"{"messages": [{"role": "user", "content": "hello"}]}"#;

/// Every route with the method it serves.
const ROUTES: &[(&str, &str)] = &[
    ("/v1/chat/completions", "POST"),
    ("/v1/models", "GET"),
    ("/v1/rollout/samples", "GET"),
    ("/v1/rollout/commit", "POST"),
    ("/v1/rollout/pause", "POST"),
    ("/v1/rollout/resume", "POST"),
    ("/v1/rollout/status", "GET"),
    ("/v1/rollout/eval-scores/drain", "POST"),
    ("/health", "GET"),
    ("/healthz", "GET"),
    ("/metrics", "GET"),
];

const METHODS: &[&str] = &["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"];

async fn wrong_methods(s: &Server, routes: &[(&str, &str)]) {
    for &(path, allowed) in routes {
        for &method in METHODS {
            if method == allowed || (method == "HEAD" && allowed == "GET") {
                continue;
            }
            let what = format!("{method} {path}");
            let r = s
                .http()
                .request(method.parse().unwrap(), format!("{}{path}", s.url))
                .body("{}")
                .send()
                .await
                .unwrap();
            if method == "HEAD" {
                // No body to look at.
                assert_eq!(r.status(), 405, "{what}");
            } else {
                let code = assert_openai_error(r, 405, &what).await;
                assert_eq!(code, "method_not_allowed", "{what}");
            }
        }
    }
    s.assert_alive("wrong methods").await;
}

#[tokio::test]
async fn wrong_methods_on_the_api_routes_get_405_in_the_openai_shape() {
    let s = Server::start().await;
    wrong_methods(&s, &ROUTES[..8]).await;
    s.stop().await;
}

#[tokio::test]
async fn wrong_methods_on_health_and_metrics_get_405_in_the_openai_shape() {
    let s = Server::start().await;
    wrong_methods(&s, &ROUTES[8..]).await;
    s.stop().await;
}

#[tokio::test]
async fn unknown_routes_get_404_in_the_openai_shape() {
    let s = Server::start().await;
    let long = format!("/v1/{}", "a".repeat(8 * 1024));
    for path in [
        "/",
        "/v1",
        "/v1/",
        "/v1/chat",
        "/v1/chat/completions/",
        "/v1/chat/completions/x",
        "/V1/chat/completions",
        "/v2/chat/completions",
        "/v1/rollout",
        "/v1/rollout/samples/1",
        "/v1/rollout/eval-scores",
        "/v1/completions",
        "/generate",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/v1/%00",
        "/\u{e9}",
        long.as_str(),
    ] {
        for method in ["GET", "POST"] {
            let what = format!("{method} {path}");
            let r = s
                .http()
                .request(method.parse().unwrap(), format!("{}{path}", s.url))
                .send()
                .await
                .unwrap();
            let code = assert_openai_error(r, 404, &what).await;
            assert_eq!(code, "not_found", "{what}");
        }
    }
    // Paths a client library would normalise, sent as they are.
    for path in [
        "/v1/rollout/../chat/completions",
        "/../../etc/passwd",
        "/v1/./models/..",
        "//v1//models",
    ] {
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let (status, head, body) = raw(s.addr, req.as_bytes()).await;
        assert!(matches!(status, 400 | 404), "GET {path}: {status} {head}");
        if status == 404 {
            let v: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["error"]["code"], "not_found", "{path}");
        }
    }
    s.assert_alive("unknown routes").await;
    s.stop().await;
}

#[tokio::test]
async fn chat_bodies_of_the_wrong_types_are_400_with_a_code() {
    let s = Server::start().await;
    let cases: Vec<(Value, &str)> = vec![
        (json!([]), "invalid_type"),
        (json!("messages"), "invalid_type"),
        (json!(1), "invalid_type"),
        (json!(null), "invalid_type"),
        (json!(true), "invalid_type"),
        (json!({}), "missing_messages"),
        (json!({"messages": null}), "missing_messages"),
        (json!({"messages": {}}), "invalid_type"),
        (json!({"messages": "hi"}), "invalid_type"),
        (json!({"messages": 5}), "invalid_type"),
        (json!({"messages": []}), "empty_messages"),
        (json!({"messages": [1]}), "invalid_type"),
        (json!({"messages": [null]}), "invalid_type"),
        (json!({"messages": [[]]}), "invalid_type"),
        (json!({"messages": [{"content": "x"}]}), "invalid_message"),
        (
            json!({"messages": [{"role": 5, "content": "x"}]}),
            "invalid_type",
        ),
        (
            json!({"messages": [{"role": null, "content": "x"}]}),
            "invalid_type",
        ),
        (
            json!({"messages": [{"role": ["user"], "content": "x"}]}),
            "invalid_type",
        ),
        (
            json!({"messages": [{"role": "user", "content": 5}]}),
            "invalid_type",
        ),
        (
            json!({"messages": [{"role": "user", "content": {}}]}),
            "invalid_type",
        ),
        (
            json!({"messages": [{"role": "user", "content": true}]}),
            "invalid_type",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}, 7]}),
            "invalid_type",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}),
            "invalid_type",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "stream": 1}),
            "invalid_type",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "tools": {}}),
            "invalid_type",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "tools": "all"}),
            "invalid_type",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "turn_type": 5}),
            "invalid_turn_type",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "turn_type": "primary"}),
            "invalid_turn_type",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "turn_type": true}),
            "invalid_turn_type",
        ),
    ];
    for (body, code) in cases {
        // Without the side-turn header, so that the body's turn type is read.
        let r = s
            .http()
            .post(format!("{}/v1/chat/completions", s.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        let got = assert_openai_error(r, 400, &body.to_string()).await;
        assert_eq!(got, code, "{body}");
        s.assert_alive(&body.to_string()).await;
    }
    // Our keys of odd types are ignored, not fatal: answered, and never forwarded.
    // Each case: the body, the key whose value the upstream must receive and that value, and the
    // upstream's verdict on it.
    let x = || json!([{"role": "user", "content": "x"}]);
    let ours: Vec<Value> = vec![
        json!({"messages": x(), "session_id": {"a": 1}}),
        json!({"messages": x(), "session_id": [1, 2]}),
        json!({"messages": x(), "session_done": {"a": 1}}),
    ];
    // The sampling keys we set are replaced; other OpenAI fields of odd types are forwarded as
    // sent, and the upstream's answer (the fake, like SGLang, refuses some) comes back unchanged:
    // its status and its own flat error body.
    let forwarded: Vec<(Value, &str, Value, Result<(), &str>)> = vec![
        (
            json!({"messages": x(), "model": 5}),
            "model",
            json!("default"),
            Ok(()),
        ),
        (
            json!({"messages": x(), "top_logprobs": "many"}),
            "top_logprobs",
            json!(1),
            Ok(()),
        ),
        (
            json!({"messages": x(), "logprobs": "yes"}),
            "logprobs",
            json!(true),
            Ok(()),
        ),
        (
            json!({"messages": x(), "max_tokens": "x"}),
            "max_tokens",
            json!("x"),
            Err("max_tokens: Input should be a non-negative integer"),
        ),
        (
            json!({"messages": x(), "temperature": "hot"}),
            "temperature",
            json!("hot"),
            Ok(()),
        ),
        (
            json!({"messages": x(), "chat_template_kwargs": 5}),
            "chat_template_kwargs",
            json!(5),
            Ok(()),
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}),
            "messages",
            json!([{"role": "user", "content": [{"type": "text", "text": 5}]}]),
            Ok(()),
        ),
        (
            json!({"messages": [{"role": "tool", "content": null}]}),
            "messages",
            json!([{"role": "tool", "content": null}]),
            Ok(()),
        ),
        (
            json!({"messages": [{"role": "user", "content": "x", "tool_calls": "nope"}]}),
            "messages",
            json!([{"role": "user", "content": "x", "tool_calls": "nope"}]),
            Ok(()),
        ),
        (
            json!({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"function": 5}]}, {"role": "user", "content": "x"}]}),
            "messages",
            json!([{"role": "assistant", "content": null, "tool_calls": [{"function": 5}]}, {"role": "user", "content": "x"}]),
            Err("chat template error"),
        ),
    ];
    let cases = ours
        .into_iter()
        .map(|b| (b, "messages", x(), Ok(())))
        .chain(forwarded);
    for (body, key, sent, verdict) in cases {
        let r = s
            .http()
            .post(format!("{}/v1/chat/completions", s.url))
            .header("x-session-id", "odd-types")
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let answer: Value = r.json().await.unwrap();
        // (The fake is the judge too: the last chat request is this one.)
        let upstream = s
            ._fake
            .requests()
            .into_iter()
            .rfind(|r| r.path == "/v1/chat/completions")
            .unwrap()
            .body;
        assert_eq!(upstream[key], sent, "{body}: forwarded {upstream}");
        for ours in ["session_id", "session_done", "turn_type"] {
            assert!(upstream.get(ours).is_none(), "{body}: forwarded {upstream}");
        }
        match verdict {
            Ok(()) => {
                assert_eq!(status, 200, "{body}: {answer}");
                assert!(
                    answer["choices"][0]["message"]["content"].is_string(),
                    "{body}: {answer}"
                );
                assert_eq!(answer["session_id"], "odd-types", "{body}: {answer}");
            }
            Err(message) => {
                assert_eq!(status, 400, "{body}: {answer}");
                assert_eq!(answer["object"], "error", "{body}: {answer}");
                assert_eq!(answer["code"], 400, "{body}: {answer}");
                assert!(
                    answer["message"].as_str().unwrap().contains(message),
                    "{body}: {answer}"
                );
            }
        }
        s.assert_alive(&body.to_string()).await;
    }
    s.stop().await;
}

#[tokio::test]
async fn rollout_bodies_and_queries_of_the_wrong_types_are_400_with_a_code() {
    let s = Server::start().await;
    let commit = |body: Vec<u8>| {
        s.http()
            .post(format!("{}/v1/rollout/commit", s.url))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    for (body, code) in [
        (&b""[..], "invalid_json"),
        (b"{", "invalid_json"),
        (b"through=1", "invalid_json"),
        (b"{\"through\": 1} trailing", "invalid_json"),
        (b"{\"through\": \"\xff\"}", "invalid_json"),
        (b"[]", "invalid_commit"),
        (b"\"x\"", "invalid_commit"),
        (b"null", "invalid_commit"),
        (b"7", "invalid_commit"),
        (b"{}", "invalid_commit"),
        (b"{\"through\": \"1\"}", "invalid_commit"),
        (b"{\"through\": 1.5}", "invalid_commit"),
        (b"{\"through\": -1}", "invalid_commit"),
        (b"{\"through\": true}", "invalid_commit"),
        (b"{\"through\": null}", "invalid_commit"),
        (b"{\"through\": []}", "invalid_commit"),
        (b"{\"through\": {\"seq\": 1}}", "invalid_commit"),
        (b"{\"through\": 18446744073709551616}", "invalid_commit"),
        (b"{\"through\": 1e400}", "invalid_json"),
    ] {
        let what = format!("commit {}", String::from_utf8_lossy(body));
        let got = assert_openai_error(commit(body.to_vec()).await.unwrap(), 400, &what).await;
        assert_eq!(got, code, "{what}");
        s.assert_alive(&what).await;
    }
    let r = commit(b"{\"through\": 18446744073709551615}".to_vec())
        .await
        .unwrap();
    assert_eq!(
        assert_openai_error(r, 409, "commit u64::MAX").await,
        "commit_ahead"
    );
    assert_eq!(
        s.status().await["committed_seq"],
        0,
        "nothing was committed"
    );

    for q in [
        "after=-1",
        "after=abc",
        "after=",
        "after=18446744073709551616",
        "after=1.0",
        "max=0",
        "max=1025",
        "max=-1",
        "max=%00",
        "wait_ms=60001",
        "wait_ms=-5",
        "wait_ms=1e3",
        "format=xml",
        "format=%FF",
        "after=%FF%FE",
    ] {
        let r = s
            .http()
            .get(format!("{}/v1/rollout/samples?{q}", s.url))
            .send()
            .await
            .unwrap();
        let code = assert_openai_error(r, 400, q).await;
        assert_eq!(code, "invalid_query", "{q}");
        s.assert_alive(q).await;
    }
    // Odd but acceptable queries.
    for q in [
        "after=0&after=0",
        "unknown=1",
        "max=+5",
        "after=%20%201",
        "&&&",
        "=",
        "format=JSON",
    ] {
        let r = s
            .http()
            .get(format!("{}/v1/rollout/samples?{q}", s.url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{q}");
        let page: Value = r.json().await.unwrap();
        assert_eq!(page, json!({"samples": [], "last_seq": 0}), "{q}");
    }
    // Routes without a body ignore whatever is sent; `resume` reads an optional JSON body
    // (`weight_version`), so a body that is not JSON is refused rather than ignored.
    for path in ["pause", "resume", "eval-scores/drain"] {
        for body in [&b"\xff\xfe not json"[..], b"{\"deep\": [[[[[]]]]]}", b""] {
            let r = s
                .http()
                .post(format!("{}/v1/rollout/{path}", s.url))
                .body(body.to_vec())
                .send()
                .await
                .unwrap();
            if path == "resume" && body.starts_with(b"\xff") {
                assert_openai_error(r, 400, "resume with a body that is not JSON").await;
            } else {
                assert_eq!(r.status(), 200, "{path}");
            }
        }
    }
    let r = s
        .http()
        .post(format!("{}/v1/rollout/resume", s.url))
        .json(&json!({"weight_version": ["not", "a", "version"]}))
        .send()
        .await
        .unwrap();
    assert_openai_error(r, 400, "resume with a weight_version of the wrong type").await;
    assert_eq!(s.status().await["submission_enabled"], true, "resumed last");
    s.assert_alive("rollout queries").await;
    s.stop().await;
}

#[tokio::test]
async fn a_chat_body_just_over_the_limit_is_413_and_a_1_mb_message_is_served() {
    let s = Server::start().await;
    let limit = usize::try_from(MAX_BODY).unwrap();
    // Exactly one byte over, with a Content-Length.
    let prefix = r#"{"messages": [{"role": "user", "content": ""#;
    let suffix = r#""}]}"#;
    let fill = limit + 1 - prefix.len() - suffix.len();
    // Words, not one 2 MB word: the fake echoes the first words of the message, and would answer a
    // single huge word with one token (and one log-prob entry) per character.
    let text = |n: usize| "word ".repeat(n / 5 + 1)[..n].to_owned();
    let over = format!("{prefix}{}{suffix}", text(fill));
    assert_eq!(over.len(), limit + 1);
    let r = s.chat_raw(over.clone()).await;
    assert_eq!(
        assert_openai_error(r, 413, "limit + 1").await,
        "body_too_large"
    );
    s.assert_alive("limit + 1").await;
    // The same without a Content-Length (chunked).
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = over
        .as_bytes()
        .chunks(64 * 1024)
        .map(|c| Ok(c.to_vec()))
        .collect();
    let r = s
        .chat_raw(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .await;
    assert_eq!(
        assert_openai_error(r, 413, "chunked").await,
        "body_too_large"
    );
    s.assert_alive("chunked limit + 1").await;
    // Exactly at the limit is read (and validated).
    let at = format!("{prefix}{}{suffix}", text(fill - 1));
    let r = s.chat_raw(at).await;
    assert_eq!(r.status(), 200);
    // A 1 MB message, as a main turn: answered.
    let big = "word ".repeat(200_000);
    let r = s
        .http()
        .post(format!("{}/v1/chat/completions", s.url))
        .header("x-session-id", "big")
        .header("x-turn-type", "main")
        .header("x-session-done", "1")
        .json(&json!({"messages": [{"role": "user", "content": big}]}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(
        body["choices"][0]["message"]["content"].is_string(),
        "{body}"
    );
    assert_eq!(body["session_id"], "big");
    s.assert_alive("1 MB message").await;
    s.stop().await;
}

#[tokio::test]
async fn a_content_length_over_the_limit_is_413_at_once() {
    let s = Server::start().await;
    let (status, head, _) = raw_within(
        s.addr,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 99999999999\r\n\r\n{}",
        Duration::from_secs(3),
    )
    .await;
    assert_eq!(status, 413, "{head}");
    s.assert_alive("huge content-length").await;
    s.stop().await;
}

/// Writes `head` and the whole `body` on a raw socket before reading anything, as Python's `urllib`
/// and `requests` do, then reads the answer to its end (`Connection: close`). A write or read
/// that fails (a connection reset) fails the test with what was received so far.
async fn send_all_then_read(addr: std::net::SocketAddr, head: &str, body: &[u8]) -> String {
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    if let Err(e) = sock.write_all(head.as_bytes()).await {
        panic!("writing the request head failed: {e}");
    }
    if let Err(e) = sock.write_all(body).await {
        panic!("the server reset the connection while the client was still sending the body: {e}");
    }
    let mut answer = Vec::new();
    // Generous bound (shared 2-core machine): the answer is due once the body has been sent.
    let read = tokio::time::timeout(Duration::from_secs(30), sock.read_to_end(&mut answer)).await;
    match read {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => panic!(
            "reading the answer failed ({e}) after {:?}",
            String::from_utf8_lossy(&answer)
        ),
        Err(_) => panic!("no answer within 30 s"),
    }
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn a_client_that_sends_its_whole_oversized_body_before_reading_gets_the_413() {
    let s = Server::start().await;
    // Four times the limit: far more than the socket buffers hold, so the client is still
    // writing when the server has answered.
    let body = vec![b' '; 4 * usize::try_from(MAX_BODY).unwrap()];
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let answer = send_all_then_read(s.addr, &head, &body).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("server.max_body_bytes"), "{answer}");
    // The same body sent chunked, without a Content-Length: cut off once past the limit.
    let mut chunked = Vec::new();
    for c in body.chunks(64 * 1024) {
        chunked.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
        chunked.extend_from_slice(c);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
                Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
    let answer = send_all_then_read(s.addr, head, &chunked).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("server.max_body_bytes"), "{answer}");
    s.assert_alive("oversized bodies sent whole").await;
    s.stop().await;
}

#[tokio::test]
async fn a_huge_admin_body_is_413_in_the_openai_shape() {
    let s = Server::start().await;
    let body = format!(
        r#"{{"through": 0, "pad": "{}"}}"#,
        "x".repeat(3 * 1024 * 1024)
    );
    let r = s
        .http()
        .post(format!("{}/v1/rollout/commit", s.url))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_openai_error(r, 413, "3 MB commit").await;
    s.assert_alive("3 MB commit").await;
    s.stop().await;
}

#[tokio::test]
async fn deeply_nested_json_is_400_not_a_stack_overflow() {
    let s = Server::start().await;
    let depth = 10_000;
    let arrays = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let objects = format!("{}1{}", r#"{"a":"#.repeat(depth), "}".repeat(depth));
    for (what, body) in [
        ("body of nested arrays", arrays.clone()),
        ("body of nested objects", objects.clone()),
        (
            "messages of nested arrays",
            format!(r#"{{"messages": {arrays}}}"#),
        ),
        (
            "content of nested objects",
            format!(r#"{{"messages": [{{"role": "user", "content": "x", "meta": {objects}}}]}}"#),
        ),
        ("unclosed nesting", "[".repeat(depth)),
    ] {
        let r = s.chat_raw(body.clone()).await;
        assert_eq!(
            assert_openai_error(r, 400, what).await,
            "invalid_json",
            "{what}"
        );
        s.assert_alive(what).await;
        let r = s
            .http()
            .post(format!("{}/v1/rollout/commit", s.url))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(
            assert_openai_error(r, 400, what).await,
            "invalid_json",
            "commit {what}"
        );
        s.assert_alive(what).await;
    }
    // Nesting that JSON parsing accepts (under serde_json's limit of 128) reaches the upstream and
    // the capture workers (template rendering) as a main turn, and must not crash them either.
    let deep_args = format!("{}1{}", r#"{"a":"#.repeat(100), "}".repeat(100));
    let body = format!(
        r#"{{"messages": [{{"role": "user", "content": "go"}}, {{"role": "assistant", "content": null, "tool_calls": [{{"id": "c1", "type": "function", "function": {{"name": "f", "arguments": {deep_args}}}}}]}}, {{"role": "tool", "tool_call_id": "c1", "content": "ok"}}], "metadata": {deep_args}}}"#
    );
    let r = s
        .http()
        .post(format!("{}/v1/chat/completions", s.url))
        .header("x-session-id", "deep")
        .header("x-turn-type", "main")
        .header("x-session-done", "1")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    s.assert_alive("deep tool-call arguments").await;
    // The turn is accounted for (a sample, or abandoned), never lost.
    let st = s.wait_settled(1).await;
    assert_eq!(accounted(&st), 1, "{st}");
    s.stop().await;
}

#[tokio::test]
async fn invalid_utf8_bodies_and_headers_are_refused_or_ignored() {
    let s = Server::start().await;
    for (what, body) in [
        (
            "invalid byte in content",
            &b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}"[..],
        ),
        ("invalid byte in a key", b"{\"mess\xc0ages\": []}"),
        (
            "truncated sequence",
            b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xe2\x82\"}]}",
        ),
        (
            "lone surrogate escape",
            br#"{"messages": [{"role": "user", "content": "\ud800"}]}"#,
        ),
        (
            "overlong encoding",
            b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xc0\xaf\"}]}",
        ),
        ("UTF-16 body", b"\xff\xfe{\x00}\x00"),
        ("NUL bytes", b"\x00\x00\x00"),
    ] {
        let r = s.chat_raw(body.to_vec()).await;
        assert_eq!(
            assert_openai_error(r, 400, what).await,
            "invalid_json",
            "{what}"
        );
        s.assert_alive(what).await;
    }
    // Header values with bytes outside ASCII are not strings: ignored, as if absent.
    for header in [
        &b"X-Session-Id: \xff\xfe\r\n"[..],
        b"X-Turn-Type: m\xe9in\r\n",
        b"X-Session-Done: \xc3\x28\r\n",
    ] {
        let (status, head, body) = raw(s.addr, &chat_request(header, HELLO)).await;
        assert_eq!(status, 200, "{}: {head}", String::from_utf8_lossy(header));
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert!(v["choices"].is_array());
        s.assert_alive("non-ASCII header").await;
    }
    s.stop().await;
}

/// A number out of an `f64`'s range anywhere in the body is refused as the tree parse refused
/// it (invalid_json), also where the proxy reads nothing (tools, content parts, unknown fields).
#[tokio::test]
async fn numbers_out_of_range_anywhere_are_invalid_json() {
    let s = Server::start().await;
    for (what, body) in [
        (
            "in tools",
            &br#"{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"n":{"type":"number","maximum":1e400}}}}}]}"#[..],
        ),
        (
            "in content",
            br#"{"messages":[{"role":"user","content":[{"type":"text","text":"hi","x":-1e400}]}]}"#,
        ),
        (
            "as session_id",
            br#"{"messages":[{"role":"user","content":"hi"}],"session_id":1e400}"#,
        ),
        (
            "in chat_template_kwargs",
            br#"{"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"x":1E+999}}"#,
        ),
        (
            "in an unknown field",
            br#"{"messages":[{"role":"user","content":"hi"}],"extra":[0, 1e400]}"#,
        ),
        (
            "a surrogate escape in a message's key",
            br#"{"messages":[{"role":"user","content":"hi","\ud800":1}]}"#,
        ),
    ] {
        let r = s.chat_raw(body.to_vec()).await;
        assert_eq!(
            assert_openai_error(r, 400, what).await,
            "invalid_json",
            "{what}"
        );
        s.assert_alive(what).await;
    }
    s.stop().await;
}

#[tokio::test]
async fn header_injection_attempts_never_reach_the_response_headers() {
    let s = Server::start().await;
    // Over a raw socket, `a\r\nX-Turn-Type: main` is two headers: the server sees both, and the
    // session is `a`.
    let (status, head, _) = raw(
        s.addr,
        &chat_request(
            b"X-Session-Id: a\r\nX-Turn-Type: main\r\nX-Session-Done: 1\r\n",
            HELLO,
        ),
    )
    .await;
    assert_eq!(status, 200, "{head}");
    assert!(
        head.lines()
            .any(|l| l.eq_ignore_ascii_case("x-session-id: a")),
        "{head}"
    );

    // Bare CR, NUL and other control bytes inside a value, obsolete line folding, a header without a
    // colon, and a huge header: refused by the HTTP layer or read as plain values, never a crash.
    for header in [
        &b"X-Session-Id: a\rX-Turn-Type: main\r\n"[..],
        b"X-Session-Id: a\nX-Injected: yes\r\n",
        b"X-Session-Id: a\x00b\r\n",
        b"X-Session-Id: a\x01\x7fb\r\n",
        b"X-Session-Id: a\r\n X-Injected: folded\r\n",
        b"X-Session-Id a\r\n",
        b": empty-name\r\n",
    ] {
        let (status, head, _) = raw(s.addr, &chat_request(header, HELLO)).await;
        let what = String::from_utf8_lossy(header).into_owned();
        assert!(
            matches!(status, 200 | 400 | 431),
            "{what:?}: {status} {head}"
        );
        assert!(
            !head.to_ascii_lowercase().contains("x-injected"),
            "{what:?} reached the answer: {head}"
        );
        s.assert_alive(&what).await;
    }
    let huge = format!("X-Session-Id: {}\r\n", "h".repeat(512 * 1024));
    let (status, head, _) = raw(s.addr, &chat_request(huge.as_bytes(), HELLO)).await;
    assert!(
        matches!(status, 0 | 400 | 431),
        "huge header: {status} {head}"
    );
    s.assert_alive("huge header").await;

    // A session id from the body with CR/LF is never echoed into a header.
    for id in [
        "a\r\nSet-Cookie: injected=1",
        "a\nSet-Cookie: injected=1",
        "a\rSet-Cookie: injected=1",
        "\r\n\r\nHTTP/1.1 200 OK",
    ] {
        let body = json!({"messages": [{"role": "user", "content": "hello"}], "session_id": id})
            .to_string();
        let (status, head, body) = raw(
            s.addr,
            &chat_request(b"X-Turn-Type: side\r\n", body.as_bytes()),
        )
        .await;
        assert_eq!(status, 200, "{id:?}: {head}");
        let lower = head.to_ascii_lowercase();
        assert!(!lower.contains("set-cookie"), "{id:?}: {head}");
        // One status line, then header lines only: nothing was split into the head.
        assert!(
            head.lines().skip(1).all(|l| l.contains(": ")),
            "{id:?}: {head}"
        );
        let v: Value = serde_json::from_slice(&body).unwrap();
        // Session ids are trimmed of surrounding whitespace, otherwise kept as sent.
        assert_eq!(v["session_id"], id.trim(), "{id:?}");
        s.assert_alive(id).await;
    }
    s.stop().await;
}

/// Every file under `root`, recursively.
fn files_under(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out
}

#[tokio::test]
async fn session_ids_with_path_characters_never_reach_file_paths() {
    let s = Server::start().await;
    let long = format!("long-{}", "L".repeat(4096));
    // Sent as `X-Session-Id` headers.
    let header_ids = [
        "../../etc/passwd",
        "../../../../../../tmp/ps-pwned-header",
        "a/b",
        "/abs/ps-pwned",
        "%2e%2e%2fps-pwned",
        "..\\..\\ps-pwned",
        "C:\\ps-pwned",
        "..",
        ".",
        "~",
        "$(touch ps-pwned)",
        "con",
        "a\tb",
        long.as_str(),
    ];
    // Only expressible in the body.
    let body_ids = [
        "nul\u{0}byte",
        "new\nline/../../ps-pwned",
        "../\u{0}/ps-pwned",
        "\u{202e}rtl/ps-pwned",
    ];
    let root = s.dir.path().to_path_buf();
    let outside = [
        root.join("etc"),
        root.parent().unwrap().join("etc/passwd"),
        PathBuf::from("/tmp/ps-pwned-header"),
        PathBuf::from("/abs"),
    ];
    let existed: Vec<bool> = outside.iter().map(|p| p.exists()).collect();

    let mut sent = BTreeSet::new();
    for id in header_ids {
        let r = s
            .http()
            .post(format!("{}/v1/chat/completions", s.url))
            .header("x-session-id", id)
            .header("x-turn-type", "main")
            .header("x-session-done", "1")
            .json(&json!({"messages": [{"role": "user", "content": "hello"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{id:?}");
        assert_eq!(r.headers()["x-session-id"], id, "echoed as sent");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["session_id"], id);
        sent.insert(id.to_owned());
        s.assert_alive(id).await;
    }
    for id in body_ids {
        let r = s
            .http()
            .post(format!("{}/v1/chat/completions", s.url))
            .json(&json!({"messages": [{"role": "user", "content": "hello"}], "session_id": id, "turn_type": "main", "session_done": true}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{id:?}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["session_id"], id);
        sent.insert(id.to_owned());
        s.assert_alive(id).await;
    }
    let n = sent.len() as u64;
    s.wait_submitted(n).await;
    // Every sample carries its session id verbatim.
    let page: Value = s
        .http()
        .get(format!("{}/v1/rollout/samples?after=0&max=1024", s.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let got: BTreeSet<String> = page["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["sample"]["session_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(got, sent);
    // The conversation records are written, with the ids verbatim inside them.
    let conv = root.join("records/conversations");
    let mut recorded = BTreeSet::new();
    for _ in 0..400 {
        recorded = files_under(&conv)
            .iter()
            .filter(|p| p.is_file())
            .flat_map(|p| {
                std::fs::read_to_string(p)
                    .unwrap()
                    .lines()
                    .map(|l| {
                        serde_json::from_str::<Value>(l).unwrap()["session_id"]
                            .as_str()
                            .unwrap()
                            .to_owned()
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        if recorded.is_superset(&sent) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(recorded.is_superset(&sent), "records: {recorded:?}");
    let dir = s.stop().await;

    // Nothing was written outside the store and the record directory, and no file is named after
    // a session.
    for p in files_under(dir.path()) {
        let rel = p.strip_prefix(dir.path()).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .into_owned();
        assert!(
            top == "store" || top == "records",
            "unexpected {}",
            p.display()
        );
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        for needle in ["passwd", "pwned", "LLLL", "etc", "abs", "%2e", "touch"] {
            assert!(
                !name.contains(needle),
                "a file named after a session: {}",
                p.display()
            );
        }
    }
    for (p, existed) in outside.iter().zip(existed) {
        assert_eq!(p.exists(), existed, "{} appeared", p.display());
    }
}
