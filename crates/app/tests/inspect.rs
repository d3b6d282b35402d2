//! The inspection page wired into the full app: the server and the session buffer tell its
//! history, its API reads the store, the admin key guards it (and the chat key does not open it),
//! and a sample stays inspectable by seq after a restart.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::Duration;

use common::{ADMIN_VAR, CLIENT_VAR, settings};
use ps_config::Settings;
use ps_fake_sglang::FakeSglang;
use serde_json::{Value, json};

const HOSTILE: &str = "<script>window.__pwned=1</script><img src=x onerror=alert(1)>";

async fn start(settings: &Settings) -> ps_app::Running {
    common::spawn(settings, &common::keys_env).await
}

async fn get(url: &str, key: Option<&str>) -> reqwest::Response {
    let mut r = common::http().get(url);
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    r.send().await.unwrap()
}

async fn chat(url: &str, session: &str, messages: Value, done: bool) {
    let r = common::http()
        .post(format!("{url}/v1/chat/completions"))
        .header("x-session-id", session)
        .header("x-session-done", if done { "1" } else { "0" })
        .json(&json!({"messages": messages}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
}

/// Polls the timeline of `session` until `ready` holds (a bound, so a stuck turn fails).
async fn timeline_until(url: &str, session: &str, ready: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..400 {
        let r = get(&format!("{url}/v1/inspect/sessions/{session}"), None).await;
        if r.status() == 200 {
            let v: Value = r.json().await.unwrap();
            if ready(&v) {
                return v;
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the timeline of {session} never got there");
}

#[tokio::test]
async fn the_server_and_buffer_tell_the_history_and_samples_are_read_from_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let set = settings(&fake, dir.path());
    let running = start(&set).await;
    let url = running.url().to_owned();
    let user = |t: &str| json!({"role": "user", "content": t});
    let first = vec![user(HOSTILE)];
    chat(&url, "s1", json!(first), false).await;
    let second = json!([user(HOSTILE), {"role": "assistant", "content": "ok"}, user("thanks")]);
    chat(&url, "s1", second, true).await;
    let tl = timeline_until(&url, "s1", |v| {
        v["turns"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["seq"].is_u64())
            .count()
            == 2
    })
    .await;
    assert_eq!(tl["session"]["source"], "header");
    assert_eq!(tl["session"]["state"], "closed");
    assert_eq!(tl["session"]["closed_reason"], "done");
    let t1 = &tl["turns"][0];
    assert_eq!(
        (t1["turn"].as_u64(), t1["turn_type"].as_str()),
        (Some(1), Some("main"))
    );
    assert!(
        t1["prm_votes"].as_array().is_some_and(|v| !v.is_empty()),
        "{t1}"
    );
    assert!(t1["response_tokens"].as_u64().unwrap() > 0);
    let seq = t1["seq"].as_u64().unwrap();

    let sample: Value = get(&format!("{url}/v1/inspect/samples/{seq}"), None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (sample["session_id"].as_str(), sample["turn"].as_u64()),
        (Some("s1"), Some(1))
    );
    assert!(sample["prompt"].as_str().unwrap().contains(HOSTILE));
    let tokens = sample["tokens"].as_array().unwrap();
    assert!(!tokens.is_empty());
    // Texts come from the policy's tokenizer.
    let text: String = tokens.iter().map(|t| t["text"].as_str().unwrap()).collect();
    assert!(!text.is_empty());
    let overview: Value = get(&format!("{url}/v1/inspect/overview"), None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(overview["totals"]["requests"], 2);
    assert_eq!(overview["totals"]["samples"], 2);
    assert_eq!(overview["live"]["submission_enabled"], true);
    assert_eq!(overview["live"]["mode"], "rl");
    assert!(overview["store"]["last_seq"].as_u64().unwrap() >= 2);
    running.stop().await.unwrap();

    // After a restart the history is empty, but the sample is read from the store by its seq.
    let running = start(&set).await;
    let url = running.url().to_owned();
    assert_eq!(
        get(&format!("{url}/v1/inspect/sessions/s1"), None)
            .await
            .status(),
        404
    );
    let again: Value = get(&format!("{url}/v1/inspect/samples/{seq}"), None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(again["tokens"], sample["tokens"]);
    running.stop().await.unwrap();
}

#[tokio::test]
async fn the_inspect_api_needs_the_admin_key_and_not_the_chat_key_while_the_page_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let mut set = settings(&fake, dir.path());
    set.server.admin_key_env = Some(ADMIN_VAR.into());
    set.server.api_key_env = Some(CLIENT_VAR.into());
    let running = start(&set).await;
    let url = running.url();
    for path in [
        "/v1/inspect/overview",
        "/v1/inspect/sessions",
        "/v1/inspect/sessions/x",
        "/v1/inspect/samples/1",
    ] {
        let u = format!("{url}{path}");
        assert_eq!(get(&u, None).await.status(), 401, "{path} without a key");
        let r = get(&u, Some("client-secret")).await;
        assert_eq!(r.status(), 401, "{path} with the chat key");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "invalid_api_key");
        assert_ne!(
            get(&u, Some("admin-secret")).await.status(),
            401,
            "{path} with the admin key"
        );
    }
    assert_eq!(
        get(&format!("{url}/v1/inspect/overview"), Some("admin-secret"))
            .await
            .status(),
        200
    );
    // The page itself holds no data and is open; it asks for the key.
    let page = get(&format!("{url}/ui/"), None).await;
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("key-form"));
    running.stop().await.unwrap();
}

#[tokio::test]
async fn a_disabled_page_is_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let mut set = settings(&fake, dir.path());
    set.inspect.enabled = false;
    let running = start(&set).await;
    let url = running.url();
    assert_eq!(get(&format!("{url}/ui/"), None).await.status(), 404);
    assert_eq!(
        get(&format!("{url}/v1/inspect/overview"), None)
            .await
            .status(),
        404
    );
    running.stop().await.unwrap();
}

#[tokio::test]
async fn an_opd_timeline_shows_the_hint_votes_the_hint_and_the_teacher_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let mut set = settings(&fake, dir.path());
    set.server.mode = ps_config::Mode::Opd;
    set.teacher.url = Some(fake.generate_url());
    set.teacher.timeout_sec = 5;
    let running = start(&set).await;
    let url = running.url().to_owned();
    let user = |t: &str| json!({"role": "user", "content": t});
    chat(&url, "o", json!([user("Plan a weekend in Rome.")]), false).await;
    let history = json!([
        user("Plan a weekend in Rome."),
        {"role": "assistant", "content": "Eat pasta."},
        user("I wanted museums, not food. FAKE_VOTES=1,1,1")
    ]);
    chat(&url, "o", history, true).await;
    let tl = timeline_until(&url, "o", |v| {
        let t = v["turns"].as_array().unwrap();
        t.len() == 2 && t[0]["seq"].is_u64() && t[1]["status"] == "dropped"
    })
    .await;
    let t1 = &tl["turns"][0];
    assert_eq!(t1["hint_votes"], json!([1, 1, 1]), "{t1}");
    assert!(!t1["hint"].as_str().unwrap().is_empty(), "{t1}");
    assert_eq!(t1["teacher"]["outcome"], "scored");
    assert_eq!(t1["status"], "submitted");
    // Turn 2 ended the session: no next state, no OPD sample, and the timeline says why.
    assert_eq!(tl["turns"][1]["reason"], "no_next_state");
    let sample: Value = get(&format!("{url}/v1/inspect/samples/{}", t1["seq"]), None)
        .await
        .json()
        .await
        .unwrap();
    assert!(sample["has_teacher"].as_bool().unwrap());
    assert!(
        sample["tokens"][0]["adv"].is_f64(),
        "{}",
        sample["tokens"][0]
    );
    running.stop().await.unwrap();
}
