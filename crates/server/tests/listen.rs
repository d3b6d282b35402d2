//! The accept loop (`ps_server::listen`): bodies far larger than a connection's read buffer arrive
//! whole, a request head larger than it is a 431, and shutdown lets a request in flight finish.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::Duration;

use common::Harness;
use ps_server::listen::READ_BUFFER_MAX;
use serde_json::{Value, json};

const MAIN: &[(&str, &str)] = &[("x-session-id", "s1"), ("x-turn-type", "main")];

async fn post(url: &str, body: &Value, headers: &[(&str, String)]) -> reqwest::Response {
    let mut req = reqwest::Client::new().post(url).json(body);
    for (k, v) in MAIN {
        req = req.header(*k, *v);
    }
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    req.send().await.unwrap()
}

/// Stops the server while the test's client still holds kept-alive connections to it: shutdown
/// closes idle connections instead of waiting for them.
async fn stop_with_idle_connections_open(h: Harness) -> Vec<ps_core::CapturedTurn> {
    tokio::time::timeout(Duration::from_secs(10), h.stop())
        .await
        .expect("the server stops with idle connections open")
}

fn asking(content: &str) -> Value {
    json!({"messages": [{"role": "user", "content": content}], "logprobs": true})
}

#[tokio::test]
async fn a_body_many_times_the_read_buffer_is_forwarded_and_captured_whole() {
    let mut h = Harness::start().await;
    // 20 read buffers' worth of text, not a repetition of one buffer's (each line numbered).
    let content: String = (0..)
        .map(|i| format!("line {i}: the tool printed this.\n"))
        .take_while({
            let mut len = 0;
            move |l: &String| {
                len += l.len();
                len <= 20 * READ_BUFFER_MAX
            }
        })
        .collect();
    assert!(content.len() > 19 * READ_BUFFER_MAX);
    let resp = post(&h.chat_url(), &asking(&content), &[]).await;
    assert_eq!(resp.status(), 200);
    let sent = &h.fake().requests()[0].body;
    assert_eq!(sent["messages"][0]["content"], content.as_str());
    let turn = h.next_turn().await;
    assert!(turn.prompt_text.contains(&content));
    assert!(stop_with_idle_connections_open(h).await.is_empty());
}

#[tokio::test]
async fn a_request_head_larger_than_the_read_buffer_is_431_and_never_reaches_the_upstream() {
    let mut h = Harness::start().await;
    // A header of half the buffer passes.
    let half = "a".repeat(READ_BUFFER_MAX / 2);
    let resp = post(&h.chat_url(), &asking("hi"), &[("x-trace", half)]).await;
    assert_eq!(resp.status(), 200);
    h.next_turn().await;
    // One over the whole buffer is refused by hyper before the router sees it.
    let over = "a".repeat(READ_BUFFER_MAX + 1);
    let resp = post(&h.chat_url(), &asking("hi"), &[("x-trace", over)]).await;
    assert_eq!(resp.status(), 431);
    assert_eq!(h.fake().requests().len(), 1);
    // The server still serves the next request (on a new connection).
    let resp = post(&h.chat_url(), &asking("again"), &[]).await;
    assert_eq!(resp.status(), 200);
    assert!(h.next_turn().await.prompt_text.contains("again"));
    assert_eq!(h.fake().requests().len(), 2);
    assert!(stop_with_idle_connections_open(h).await.is_empty());
}

#[tokio::test]
async fn at_shutdown_new_connections_are_refused_and_the_request_in_flight_is_answered_and_captured()
 {
    let mut h = Harness::start().await;
    h.fake().hold();
    let url = h.chat_url();
    let in_flight = tokio::spawn(async move { post(&url, &asking("slow"), &[]).await });
    h.fake().wait_for_in_flight(1).await;
    h.signal_stop();
    // The listener closes: connecting fails within a few seconds.
    let addr = h.url.trim_start_matches("http://").to_owned();
    let refused = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if tokio::net::TcpStream::connect(&addr).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(refused.is_ok(), "the server still accepts connections");
    assert!(!in_flight.is_finished());
    h.fake().release();
    let resp = in_flight.await.unwrap();
    assert_eq!(resp.status(), 200);
    let answer: Value = resp.json().await.unwrap();
    assert!(answer["choices"][0]["message"]["content"].is_string());
    let rest = h.stop().await;
    assert_eq!(rest.len(), 1);
    assert!(rest[0].prompt_text.contains("slow"));
}
