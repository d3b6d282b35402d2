//! Faults and the hold/release gate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::{Duration, Instant};

use common::{chat, generate, spawn, sse_events, user};
use futures::StreamExt;
use ps_fake_sglang::Fault;
use serde_json::{Value, json};

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

#[tokio::test]
async fn refuse_gives_a_connection_error() {
    let fake = spawn().await;
    fake.push_fault(Fault::Refuse);
    let err = client()
        .post(fake.chat_url())
        .json(&json!({"messages": [user("hi")]}))
        .send()
        .await
        .expect_err("connection must fail");
    assert!(!err.is_status(), "{err:?}");
    // Only the next request: the one after is answered.
    assert_eq!(
        chat(&fake, json!({"messages": [user("hi")]}))
            .await
            .status(),
        200
    );

    fake.push_fault(Fault::Refuse);
    let err = client()
        .post(fake.generate_url())
        .json(&json!({"text": "x"}))
        .send()
        .await
        .expect_err("connection must fail");
    assert!(!err.is_status());
    assert_eq!(
        fake.requests().len(),
        3,
        "refused requests are still recorded"
    );
}

#[tokio::test]
async fn status_fault_persists_until_cleared_and_drives_health() {
    let fake = spawn().await;
    fake.set_fault(Some(Fault::Status(503, String::new())));
    let health = client()
        .get(format!("{}/health", fake.base_url()))
        .send()
        .await
        .expect("send");
    assert_eq!(health.status(), 503);
    assert!(health.bytes().await.expect("body").is_empty());
    for _ in 0..2 {
        assert_eq!(
            chat(&fake, json!({"messages": [user("hi")]}))
                .await
                .status(),
            503
        );
    }
    fake.set_fault(Some(Fault::Status(500, "{\"detail\":\"boom\"}".into())));
    let resp = generate(&fake, json!({"text": "x"})).await;
    assert_eq!(resp.status(), 500);
    assert_eq!(
        resp.json::<Value>().await.expect("json"),
        json!({"detail": "boom"})
    );
    let health = client()
        .get(format!("{}/health_generate", fake.base_url()))
        .send()
        .await
        .expect("send");
    assert_eq!(health.status(), 200, "only 503 faults reach /health");
    fake.set_fault(None);
    assert_eq!(
        chat(&fake, json!({"messages": [user("hi")]}))
            .await
            .status(),
        200
    );
}

#[tokio::test]
async fn garbage_is_200_and_not_json() {
    let fake = spawn().await;
    fake.push_fault(Fault::Garbage);
    let resp = chat(&fake, json!({"messages": [user("hi")]})).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.json::<Value>().await.is_err());
}

#[tokio::test]
async fn delay_and_latency_wait_before_answering() {
    let fake = spawn().await;
    fake.push_fault(Fault::Delay(Duration::from_millis(150)));
    let t = Instant::now();
    assert_eq!(
        chat(&fake, json!({"messages": [user("hi")]}))
            .await
            .status(),
        200
    );
    assert!(t.elapsed() >= Duration::from_millis(150));

    let fake = ps_fake_sglang::FakeSglang::builder()
        .latency(Duration::from_millis(100))
        .token_delay(Duration::from_millis(5))
        .spawn()
        .await
        .expect("spawn");
    let t = Instant::now();
    let resp = chat(&fake, json!({"messages": [user("hi")], "stream": true})).await;
    assert!(t.elapsed() >= Duration::from_millis(100));
    let n = sse_events(resp.text().await.expect("text")).len();
    assert!(t.elapsed() >= Duration::from_millis(100 + 5 * (n as u64 - 1)));
}

#[tokio::test]
async fn cut_stream_ends_without_done() {
    let fake = spawn().await;
    fake.push_fault(Fault::CutStream { after_chunks: 3 });
    let resp = chat(
        &fake,
        json!({"messages": [user("a b c d e f")], "stream": true}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let mut received = Vec::new();
    let mut failed = false;
    while let Some(item) = stream.next().await {
        match item {
            Ok(b) => received.extend_from_slice(&b),
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    assert!(failed, "the body must end with an error");
    let text = String::from_utf8(received).expect("utf8");
    assert!(!text.contains("[DONE]"));
    assert_eq!(text.matches("data: ").count(), 3);

    // Non-streaming: a truncated body.
    fake.push_fault(Fault::CutStream { after_chunks: 0 });
    let resp = chat(&fake, json!({"messages": [user("hi")]})).await;
    assert!(resp.json::<Value>().await.is_err());
}

#[tokio::test]
async fn stream_error_sends_an_error_event_then_done() {
    let fake = spawn().await;
    fake.push_fault(Fault::StreamError { after_chunks: 2 });
    let text = chat(
        &fake,
        json!({"messages": [user("hello world")], "stream": true}),
    )
    .await
    .text()
    .await
    .expect("text");
    assert!(text.ends_with("data: [DONE]\n\n"));
    let events = sse_events(text);
    assert_eq!(events.len(), 3);
    let err = events[2].as_ref().expect("json");
    assert_eq!(err["error"]["object"], "error");
    assert_eq!(err["error"]["type"], "BadRequestError");
    assert_eq!(err["error"]["code"], 400);

    fake.push_fault(Fault::StreamError { after_chunks: 1 });
    let text = generate(&fake, json!({"text": "x", "stream": true}))
        .await
        .text()
        .await
        .expect("text");
    let events = sse_events(text);
    assert_eq!(events.len(), 2);
    assert!(events[1].as_ref().expect("json")["error"]["message"].is_string());

    // Non-streaming: a 500 with the route's error body.
    fake.push_fault(Fault::StreamError { after_chunks: 0 });
    let resp = chat(&fake, json!({"messages": [user("hi")]})).await;
    assert_eq!(resp.status(), 500);
    assert_eq!(
        resp.json::<Value>().await.expect("json")["type"],
        "InternalServerError"
    );
}

#[tokio::test]
async fn queued_faults_apply_in_order_before_the_persistent_one() {
    let fake = spawn().await;
    fake.set_fault(Some(Fault::Status(429, "slow".into())));
    fake.push_fault(Fault::Status(502, "bad".into()));
    fake.push_fault(Fault::Status(504, "late".into()));
    let mut codes = Vec::new();
    for _ in 0..3 {
        codes.push(
            generate(&fake, json!({"text": "x"}))
                .await
                .status()
                .as_u16(),
        );
    }
    assert_eq!(codes, vec![502, 504, 429]);
}

#[tokio::test]
async fn hold_and_release_gate_requests() {
    let fake = spawn().await;
    fake.hold();
    let url = fake.chat_url();
    let pending = tokio::spawn(async move {
        client()
            .post(url)
            .json(&json!({"messages": [user("held")]}))
            .send()
            .await
            .expect("send")
            .status()
    });
    tokio::time::timeout(Duration::from_secs(5), fake.wait_for_in_flight(1))
        .await
        .expect("request arrives");
    assert_eq!(fake.in_flight(), 1);
    assert_eq!(fake.requests().len(), 1, "recorded before the gate");
    assert_eq!(fake.requests()[0].body["messages"][0]["content"], "held");
    assert!(!pending.is_finished());
    fake.release();
    assert_eq!(pending.await.expect("join"), 200);
    assert_eq!(fake.in_flight(), 0);
}

#[tokio::test]
async fn streams_count_in_flight_until_the_body_ends() {
    let fake = ps_fake_sglang::FakeSglang::builder()
        .token_delay(Duration::from_millis(20))
        .spawn()
        .await
        .expect("spawn");
    let resp = chat(
        &fake,
        json!({"messages": [user("count me")], "stream": true}),
    )
    .await;
    assert_eq!(fake.in_flight(), 1);
    let _ = resp.text().await.expect("text");
    // The guard drops when the body stream ends; give hyper a moment to drop it.
    tokio::time::timeout(Duration::from_secs(5), async {
        while fake.in_flight() != 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("in_flight returns to 0");
}

#[tokio::test]
async fn shutdown_is_graceful_and_drop_stops() {
    let fake = spawn().await;
    let addr = fake.addr();
    assert_eq!(
        chat(&fake, json!({"messages": [user("hi")]}))
            .await
            .status(),
        200
    );
    fake.shutdown().await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());

    let fake = spawn().await;
    let addr = fake.addr();
    drop(fake);
    // Dropping aborts the serving task, which closes the port when the runtime next gets to it:
    // wait for the refusal (an event) rather than for a fixed time. The bound is generous, only
    // so that a port that stays open fails instead of hanging.
    tokio::time::timeout(Duration::from_secs(30), async {
        while tokio::net::TcpStream::connect(addr).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the port refuses connections after the drop");
}

#[tokio::test]
async fn router_without_kill_switch_still_errors_on_refuse() {
    let state = ps_fake_sglang::FakeSglang::builder().build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = ps_fake_sglang::router(state.clone());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    state.push_fault(Fault::Refuse);
    let result = async {
        let resp = client()
            .post(format!("http://{addr}/v1/chat/completions"))
            .json(&json!({"messages": [user("hi")]}))
            .send()
            .await?;
        resp.bytes().await
    }
    .await;
    assert!(result.is_err());
    server.abort();
}
