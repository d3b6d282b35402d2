//! The RL pipeline through the real server: chat turns → next states → PRM votes (fake SGLang's
//! /generate) → durable store → the trainer's rollout API.
//!
//! Long because each rollout-API behaviour (pull, commit, pause modes, status, eval scores) has its
//! own end-to-end case over the same harness.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::{ADMIN_VAR, CLIENT_VAR, settings, sorted_votes, user};
use ps_config::{PauseMode, Settings};
use ps_fake_sglang::{FakeHandle, FakeSglang, Fault};
use serde_json::{Value, json};

struct Server {
    url: String,
    fake: FakeHandle,
    running: Option<ps_app::Running>,
}

async fn start(settings: Settings, fake: FakeHandle) -> Server {
    let running = common::spawn(&settings, &common::keys_env).await;
    let url = running.url().to_owned();
    Server {
        url,
        fake,
        running: Some(running),
    }
}

/// Every HTTP call of these tests: bounded (longer than the longest long poll, 30 s), so that a
/// request that is never answered (a hold that never gives up) fails instead of hanging CI.
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

impl Server {
    async fn stop(mut self) -> FakeHandle {
        self.running.take().unwrap().stop().await.unwrap();
        self.fake
    }

    async fn chat(&self, session: &str, messages: Value, done: bool) -> reqwest::Response {
        client()
            .post(format!("{}/v1/chat/completions", self.url))
            .header("x-session-id", session)
            .header("x-session-done", if done { "1" } else { "0" })
            .json(&json!({"messages": messages}))
            .send()
            .await
            .unwrap()
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        client()
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap()
    }

    async fn post(&self, path: &str, body: Value) -> reqwest::Response {
        client()
            .post(format!("{}{path}", self.url))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    async fn status(&self) -> Value {
        self.get("/v1/rollout/status").await.json().await.unwrap()
    }

    /// Waits until the status satisfies `until` (`what` names it in the failure). Bounded (20 s),
    /// so that a state that never comes fails instead of hanging.
    async fn wait_status(&self, what: &str, until: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let st = self.status().await;
            if until(&st) {
                return st;
            }
            assert!(tokio::time::Instant::now() < deadline, "never {what}: {st}");
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

    /// Waits until no session is live and no turn is pending anywhere in the pipeline.
    async fn wait_idle(&self) -> Value {
        // A generous bound, only so that a stuck turn fails instead of hanging.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let st = self.status().await;
            let pending: u64 = st["pending"]
                .as_object()
                .unwrap()
                .values()
                .map(|v| v.as_u64().unwrap())
                .sum();
            if pending == 0 && st["live_sessions"] == 0 {
                return st;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "turns still pending: {st}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn pull(&self, after: u64) -> Value {
        let r = self
            .get(&format!("/v1/rollout/samples?after={after}&max=100"))
            .await;
        assert_eq!(r.status(), 200);
        r.json().await.unwrap()
    }
}

/// Runs a two-turn conversation whose second request carries `next_state` and closes the session.
async fn two_turns(s: &Server, session: &str, next_state: &str) {
    let mut history = vec![user("Plan a trip.")];
    let a: Value = s
        .chat(session, json!(history), false)
        .await
        .json()
        .await
        .unwrap();
    history.push(a["choices"][0]["message"].clone());
    history.push(user(next_state));
    assert_eq!(s.chat(session, json!(history), true).await.status(), 200);
}

async fn fresh() -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let s = start(settings(&fake, dir.path()), fake).await;
    (s, dir)
}

#[tokio::test]
async fn a_conversation_becomes_scored_samples_the_trainer_pulls_and_commits() {
    let (s, _dir) = fresh().await;
    two_turns(&s, "s1", "Great, that worked. FAKE_VOTES=1,1,-1").await;
    let st = s.wait_submitted(2).await;
    assert_eq!(st["next_seq"], 3);
    // Both turns went through the capture queue and left it; its bound is the default.
    let q = &st["capture_queue"];
    assert_eq!(
        (q["turns"].as_u64(), q["bytes"].as_u64()),
        (Some(0), Some(0))
    );
    assert!(q["peak_bytes"].as_u64().is_some_and(|b| b > 0), "{q}");
    assert_eq!(q["max_bytes"], 256 << 20);
    let pulled = s.pull(0).await;
    let samples = pulled["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 2);
    assert_eq!(pulled["last_seq"], 2);
    let first = &samples[0]["sample"];
    assert_eq!(samples[0]["seq"], 1);
    assert_eq!(first["turn"], 1);
    assert_eq!(first["reward"], json!({"score": 1.0}));
    assert_eq!(sorted_votes(&first["metadata"]["votes"]), vec![-1, 1, 1]);
    assert_eq!(
        first["response_length"],
        first["loss_mask"].as_array().unwrap().len()
    );
    let response_length = first["response_length"].as_u64().unwrap() as usize;
    assert!(
        first["tokens"].as_array().unwrap().len() > response_length,
        "prompt + response ids"
    );
    assert_eq!(
        first["rollout_log_probs"].as_array().unwrap().len(),
        response_length
    );
    // The judge saw the response and the next state.
    let judge_calls: Vec<_> = s
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.path == "/generate")
        .collect();
    assert_eq!(judge_calls.len(), 3);
    let text = judge_calls[0].body["text"].as_str().unwrap();
    assert!(text.contains("Great, that worked."));
    // Turn 2 ended the session: no next state, excluded.
    assert_eq!(
        samples[1]["sample"]["metadata"]["excluded"],
        "no_next_state"
    );

    let r = s.post("/v1/rollout/commit", json!({"through": 2})).await;
    assert_eq!(r.status(), 200);
    let st = s.status().await;
    assert_eq!(
        (st["committed_seq"].as_u64(), st["lag"].as_u64()),
        (Some(2), Some(0))
    );
    let scores: Value = s
        .post("/v1/rollout/eval-scores/drain", json!({}))
        .await
        .json()
        .await
        .unwrap();
    // Every submitted RL sample's score, as the reference: turn 2 had no next state, so 0.
    assert_eq!(scores["scores"], json!([1.0, 0.0]));
    let scores: Value = s
        .post("/v1/rollout/eval-scores/drain", json!({}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(scores["count"], 0);
    s.stop().await;
}

#[tokio::test]
async fn a_long_poll_returns_as_soon_as_a_sample_arrives() {
    let (s, _dir) = fresh().await;
    let url = format!("{}/v1/rollout/samples?after=0&max=10&wait_ms=30000", s.url);
    let poll = tokio::spawn(async move {
        client()
            .get(url)
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    });
    // The pull is waiting at the server (not merely sent) before the sample is made: bounded, so
    // that a pull that never arrives or never waits fails here.
    s.wait_status("the pull waiting", |st| st["waiting_pulls"] == 1)
        .await;
    assert!(!poll.is_finished(), "nothing newer yet: the poll waits");
    assert_eq!(s.chat("lp", json!([user("hi")]), true).await.status(), 200);
    let got = tokio::time::timeout(Duration::from_secs(20), poll)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got["samples"].as_array().unwrap().len(), 1);
    s.stop().await;
}

#[tokio::test]
async fn bad_admin_requests_get_clear_errors() {
    let (s, _dir) = fresh().await;
    for (q, param) in [
        ("after=-1", "after"),
        ("max=0", "max"),
        ("max=-5", "max"),
        ("max=abc", "max"),
        ("wait_ms=999999", "wait_ms"),
    ] {
        let r = s.get(&format!("/v1/rollout/samples?{q}")).await;
        assert_eq!(r.status(), 400, "{q}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "invalid_query");
        assert!(body["error"]["message"].as_str().unwrap().contains(param));
    }
    let r = s.post("/v1/rollout/commit", json!({"thru": 1})).await;
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "invalid_commit"
    );
    let r = s.post("/v1/rollout/commit", json!({"through": -3})).await;
    assert_eq!(r.status(), 400);
    let r = s.post("/v1/rollout/commit", json!({"through": 5})).await;
    assert_eq!(r.status(), 409);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "commit_ahead");
    assert!(body["error"]["message"].as_str().unwrap().contains('5'));
    let r = client()
        .post(format!("{}/v1/rollout/commit", s.url))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(
        s.status().await["committed_seq"],
        0,
        "nothing was committed"
    );
    s.stop().await;
}

#[tokio::test]
async fn the_rollout_api_needs_the_admin_key_and_not_the_client_key() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let mut set = settings(&fake, dir.path());
    set.server.admin_key_env = Some(ADMIN_VAR.into());
    set.server.api_key_env = Some(CLIENT_VAR.into());
    let s = start(set, fake).await;
    let http = client();
    let pause = format!("{}/v1/rollout/pause", s.url);
    assert_eq!(http.post(&pause).send().await.unwrap().status(), 401);
    assert_eq!(
        http.post(&pause)
            .bearer_auth("client-secret")
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    assert_eq!(s.get("/v1/rollout/status").await.status(), 401);
    let st: Value = http
        .get(format!("{}/v1/rollout/status", s.url))
        .bearer_auth("admin-secret")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        st["submission_enabled"], true,
        "the refused pause did nothing"
    );
    // The admin key is not a chat key either.
    let chat = http
        .post(format!("{}/v1/chat/completions", s.url))
        .bearer_auth("admin-secret")
        .json(&json!({"messages": [user("x")]}))
        .send()
        .await
        .unwrap();
    assert_eq!(chat.status(), 401);
    s.stop().await;
}

async fn paused_server(mode: PauseMode, hold: Duration) -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let mut set = settings(&fake, dir.path());
    set.server.pause_mode = mode;
    set.server.pause_hold_max_sec = hold.as_secs();
    let s = start(set, fake).await;
    assert_eq!(s.post("/v1/rollout/pause", json!({})).await.status(), 200);
    assert_eq!(s.status().await["submission_enabled"], false);
    (s, dir)
}

/// A session that spans pause → requests → resume in `pause_mode = "serve"`: the request served
/// while paused is not captured, but it is the next state of the turn before the pause; the first
/// request after the resume starts a new turn and is nobody's next state from before.
#[tokio::test]
async fn a_session_spanning_a_serve_mode_pause_keeps_each_turns_own_next_state() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let mut set = settings(&fake, dir.path());
    set.server.pause_mode = PauseMode::Serve;
    let s = start(set, fake).await;
    let answer = |v: Value| v["choices"][0]["message"].clone();
    let a1: Value = s
        .chat("p", json!([user("q")]), false)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(s.post("/v1/rollout/pause", json!({})).await.status(), 200);
    let h2 = json!([user("q"), answer(a1.clone()), user("said during the pause")]);
    let a2: Value = s.chat("p", h2, false).await.json().await.unwrap();
    assert_eq!(s.post("/v1/rollout/resume", json!({})).await.status(), 200);
    let h3 = json!([
        user("q"),
        answer(a1),
        user("said during the pause"),
        answer(a2),
        user("said after the resume")
    ]);
    assert_eq!(s.chat("p", h3, true).await.status(), 200);
    let st = s.wait_submitted(2).await;
    assert_eq!(
        st["samples"]["submitted"], 2,
        "the paused turn is not captured"
    );
    let judged: Vec<String> = s
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.path == "/generate")
        .map(|r| r.body["text"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        judged.len(),
        3,
        "one turn judged (3 votes); the last has no next state"
    );
    for text in &judged {
        assert!(text.contains("said during the pause"), "{text}");
        assert!(!text.contains("said after the resume"), "{text}");
    }
    let pulled = s.pull(0).await;
    let turns: Vec<(u64, Value)> = pulled["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["sample"]["turn"].as_u64().unwrap(),
                x["sample"]["metadata"]["excluded"].clone(),
            )
        })
        .collect();
    assert_eq!(turns[0].0, 1);
    assert_eq!(turns[1], (2, json!("no_next_state")));
    s.stop().await;
}

/// The policy version of every sample: a non-streamed answer's own `metadata.weight_version`; a
/// streamed answer carries none, so the version the trainer announced at its last resume.
#[tokio::test]
async fn samples_carry_the_policy_version_from_the_answer_or_the_trainer() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder()
        .quirks(ps_fake_sglang::Quirks {
            weight_version: Some("engine-9".into()),
            ..ps_fake_sglang::Quirks::default()
        })
        .spawn()
        .await
        .unwrap();
    let s = start(settings(&fake, dir.path()), fake).await;
    let r: Value = s
        .post("/v1/rollout/resume", json!({"weight_version": "step-7"}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(r["weight_version"], "step-7");
    // A streamed session and a non-streamed one, each closed at once.
    let streamed = client()
        .post(format!("{}/v1/chat/completions", s.url))
        .header("x-session-id", "streamed")
        .header("x-session-done", "1")
        .json(&json!({"messages": [user("q")], "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(streamed.status(), 200);
    streamed.text().await.unwrap();
    assert_eq!(
        s.chat("whole", json!([user("q")]), true).await.status(),
        200
    );
    let st = s.wait_submitted(2).await;
    assert_eq!(st["trainer_weight_version"], "step-7");
    assert_eq!(
        st["samples_by_weight_version"],
        json!({"engine-9": 1, "step-7": 1})
    );
    let pulled = s.pull(0).await;
    for item in pulled["samples"].as_array().unwrap() {
        let sample = &item["sample"];
        let (version, source) = match sample["session_id"].as_str().unwrap() {
            "streamed" => ("step-7", "trainer"),
            _ => ("engine-9", "engine"),
        };
        assert_eq!(sample["weight_versions"], json!([version]), "{sample}");
        assert_eq!(sample["metadata"]["weight_version_source"], source);
    }
    s.stop().await;
}

#[tokio::test]
async fn paused_reject_mode_answers_503_with_retry_after() {
    let (s, _dir) = paused_server(PauseMode::Reject, Duration::from_secs(30)).await;
    let r = s.chat("p", json!([user("x")]), false).await;
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "5");
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "submission_paused"
    );
    assert!(s.fake.requests().is_empty());
    assert_eq!(s.post("/v1/rollout/resume", json!({})).await.status(), 200);
    assert_eq!(s.chat("p", json!([user("x")]), true).await.status(), 200);
    s.wait_submitted(1).await;
    s.stop().await;
}

#[tokio::test]
async fn paused_hold_mode_waits_for_resume() {
    let (s, _dir) = paused_server(PauseMode::Hold, Duration::from_secs(30)).await;
    let url = format!("{}/v1/chat/completions", s.url);
    let held = tokio::spawn(async move {
        client()
            .post(url)
            .header("x-session-id", "h")
            .header("x-session-done", "1")
            .json(&json!({"messages": [{"role": "user", "content": "x"}]}))
            .send()
            .await
            .unwrap()
            .status()
    });
    // Held at the server (not merely sent): bounded, so that a request that is never held fails.
    s.wait_status("the request held", |st| st["held_requests"] == 1)
        .await;
    assert!(!held.is_finished(), "held while paused");
    assert!(s.fake.requests().is_empty());
    s.post("/v1/rollout/resume", json!({})).await;
    assert_eq!(held.await.unwrap(), 200);
    assert_eq!(s.status().await["held_requests"], 0);
    s.wait_submitted(1).await;
    s.stop().await;
}

#[tokio::test]
async fn paused_hold_mode_gives_up_after_its_bound() {
    let hold = Duration::from_secs(1);
    let (s, _dir) = paused_server(PauseMode::Hold, hold).await;
    let asked = std::time::Instant::now();
    let r = s.chat("h", json!([user("x")]), false).await;
    // Held for the whole bound (a lower bound only: a slow machine can only make it longer),
    // where reject mode would answer at once.
    let held = asked.elapsed();
    assert!(
        held >= hold,
        "answered after {held:?}, before the hold bound {hold:?}"
    );
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "5");
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "submission_paused"
    );
    assert!(s.fake.requests().is_empty());
    s.stop().await;
}

#[tokio::test]
async fn paused_serve_mode_answers_but_collects_nothing() {
    let (s, _dir) = paused_server(PauseMode::Serve, Duration::from_secs(30)).await;
    let r = s.chat("v", json!([user("x")]), true).await;
    assert_eq!(r.status(), 200);
    let answer: Value = r.json().await.unwrap();
    assert!(
        answer["choices"][0]["message"]["content"].is_string(),
        "{answer}"
    );
    assert_eq!(s.fake.requests().len(), 1, "served by the policy");
    // A turn after the resume goes through the whole pipeline; once it is in the store and
    // nothing is pending, a turn collected while paused would be there too.
    assert_eq!(s.post("/v1/rollout/resume", json!({})).await.status(), 200);
    assert_eq!(
        s.chat("after", json!([user("y")]), true).await.status(),
        200
    );
    s.wait_submitted(1).await;
    let st = s.wait_idle().await;
    assert_eq!(st["samples"]["submitted"], 1, "{st}");
    assert_eq!(st["turns_abandoned"], 0, "{st}");
    assert_eq!(st["turns_dropped"], 0, "{st}");
    let page = s.pull(0).await;
    let sessions: Vec<&str> = page["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["sample"]["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        sessions,
        vec!["after"],
        "nothing of the paused turn in the store"
    );
    assert_eq!(page["last_seq"], 1, "{page}");
    s.stop().await;
}

#[tokio::test]
async fn judge_faults_become_failed_votes_and_the_turn_is_still_a_sample() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let judge = FakeSglang::builder().spawn().await.unwrap();
    let mut set = settings(&fake, dir.path());
    set.prm.router_url = judge.generate_url();
    let s = start(set, fake).await;
    judge.push_fault(Fault::Status(
        500,
        "{\"error\":{\"message\":\"boom\"}}".into(),
    ));
    judge.push_fault(Fault::Garbage);
    judge.push_fault(Fault::Status(503, String::new()));
    let a: Value = s
        .chat("f", json!([user("q")]), false)
        .await
        .json()
        .await
        .unwrap();
    let history = json!([user("q"), a["choices"][0]["message"], user("next")]);
    assert_eq!(s.chat("f", history, true).await.status(), 200);
    s.wait_submitted(2).await;
    let pulled = s.pull(0).await;
    let first = &pulled["samples"][0]["sample"];
    assert_eq!(first["metadata"]["votes"], json!([null, null, null]));
    assert_eq!(first["reward"]["score"], 0.0);
    // The session's first scored turn is kept by the at-least-one guarantee.
    assert_eq!(first["metadata"]["at_least_one"], true);
    s.stop().await;
}

#[tokio::test]
async fn a_refused_judge_gives_failed_votes_too() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let mut set = settings(&fake, dir.path());
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    set.prm.router_url = format!("http://127.0.0.1:{closed}/generate");
    let s = start(set, fake).await;
    two_turns(&s, "r", "ok").await;
    s.wait_submitted(2).await;
    let pulled = s.pull(0).await;
    assert_eq!(
        pulled["samples"][0]["sample"]["metadata"]["votes"],
        json!([null, null, null])
    );
    s.stop().await;
}

#[tokio::test]
async fn after_a_restart_the_trainer_resumes_from_its_committed_point() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let s = start(settings(&fake, dir.path()), fake).await;
    two_turns(&s, "a", "FAKE_VOTES=1").await;
    two_turns(&s, "b", "FAKE_VOTES=-1").await;
    s.wait_submitted(4).await;
    let before = s.pull(0).await;
    assert_eq!(
        s.post("/v1/rollout/commit", json!({"through": 2}))
            .await
            .status(),
        200
    );
    let fake = s.stop().await;

    let s = start(settings(&fake, dir.path()), fake).await;
    let st = s.status().await;
    assert_eq!(
        (st["committed_seq"].as_u64(), st["last_seq"].as_u64()),
        (Some(2), Some(4))
    );
    let after = s.pull(2).await;
    assert_eq!(
        after["samples"],
        json!(before["samples"].as_array().unwrap()[2..]),
        "same samples, same seqs"
    );
    // New samples continue the sequence.
    two_turns(&s, "c", "FAKE_VOTES=1").await;
    s.wait_submitted(2).await;
    let newer = s.pull(4).await;
    assert_eq!(newer["samples"][0]["seq"], 5);
    s.stop().await;
}

fn jsonl_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    files.sort();
    files
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

async fn wait_lines(dir: &Path, n: usize) -> Vec<Value> {
    for _ in 0..400 {
        let all: Vec<Value> = jsonl_files(dir).iter().flat_map(|f| lines(f)).collect();
        if all.len() >= n {
            return all;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("fewer than {n} records in {}", dir.display());
}

#[tokio::test]
async fn conversation_and_prm_records_are_written_and_pausing_rotates_without_truncating() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let mut set = settings(&fake, dir.path());
    set.logging.record_dir = Some(dir.path().join("records"));
    let s = start(set, fake).await;
    two_turns(&s, "rec", "Perfect. FAKE_VOTES=1,-1,1").await;
    s.wait_submitted(2).await;
    let conv_dir = dir.path().join("records/conversations");
    let prm_dir = dir.path().join("records/prm");
    let mut conv = wait_lines(&conv_dir, 2).await;
    // Written as each turn is resolved, not necessarily in turn order.
    conv.sort_by_key(|r| r["turn"].as_u64());
    assert_eq!(conv[0]["session_id"], "rec");
    assert_eq!(conv[0]["turn"], 1);
    assert_eq!(
        conv[0]["next_state"]["content"],
        "Perfect. FAKE_VOTES=1,-1,1"
    );
    assert!(
        conv[0]["response_text"]
            .as_str()
            .unwrap()
            .contains("<|im_end|>")
    );
    assert_eq!(conv[1]["next_state"], Value::Null);
    let prm = wait_lines(&prm_dir, 1).await;
    assert_eq!(prm[0]["score"], 1.0);
    assert_eq!(sorted_votes(&prm[0]["votes"]), vec![-1, 1, 1]);
    assert!(
        prm[0]["representative"].is_string(),
        "kept when the score is not 0"
    );
    let first_file = jsonl_files(&conv_dir).remove(0);
    let before = std::fs::read(&first_file).unwrap();
    assert!(file_name_ok(&first_file, "conversations"));

    // The trainer pauses (records rotate) and resumes; new records go to a new file.
    s.post("/v1/rollout/pause", json!({})).await;
    s.post("/v1/rollout/resume", json!({})).await;
    two_turns(&s, "rec2", "FAKE_VOTES=-1").await;
    s.wait_submitted(4).await;
    wait_lines(&conv_dir, 4).await;
    assert_eq!(
        std::fs::read(&first_file).unwrap(),
        before,
        "never truncated"
    );
    assert!(jsonl_files(&conv_dir).len() >= 2, "rotated on pause");
    s.stop().await;
}

fn file_name_ok(path: &Path, prefix: &str) -> bool {
    let name = path.file_name().unwrap().to_str().unwrap();
    // <prefix>_YYYYMMDD_HHMMSS[_N].jsonl
    name.starts_with(&format!("{prefix}_"))
        && name.ends_with(".jsonl")
        && name[prefix.len() + 1..]
            .chars()
            .take(15)
            .filter(char::is_ascii_digit)
            .count()
            == 14
}

#[tokio::test]
async fn samples_are_served_as_messagepack_on_request_and_decode_to_the_same_values() {
    let (s, _dir) = fresh().await;
    two_turns(&s, "mp", "FAKE_VOTES=1").await;
    s.wait_submitted(2).await;
    let json_page = s.pull(0).await;
    let r = s.get("/v1/rollout/samples?after=0&max=100").await;
    assert_eq!(r.headers()["content-type"], "application/json");
    assert_eq!(r.json::<Value>().await.unwrap(), json_page);
    for req in [
        client().get(format!(
            "{}/v1/rollout/samples?after=0&max=100&format=msgpack",
            s.url
        )),
        client()
            .get(format!("{}/v1/rollout/samples?after=0&max=100", s.url))
            .header("accept", "application/msgpack"),
    ] {
        let r = req.send().await.unwrap();
        assert_eq!(r.headers()["content-type"], "application/msgpack");
        let bytes = r.bytes().await.unwrap();
        let decoded: Value = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(decoded, json_page);
        assert!(bytes.len() < serde_json::to_vec(&json_page).unwrap().len());
        // The page is written from the store's records, not by encoding the samples: it must
        // be exactly what encoding them writes (the index fields are the seq).
        assert_eq!(
            common::assert_msgpack_page_is_the_samples_encoded(&bytes),
            2
        );
    }
    let r = s.get("/v1/rollout/samples?format=xml").await;
    assert_eq!(r.status(), 400);
    s.stop().await;
}

#[tokio::test]
async fn turns_still_judged_at_shutdown_are_persisted_and_scored_after_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let judge = FakeSglang::builder().spawn().await.unwrap();
    // The judge answers nothing before the server stops: held at the fake's gate, released only
    // after the restart (no wall-clock window for the shutdown to hit).
    judge.hold();
    let mut set = settings(&fake, dir.path());
    set.prm.router_url = judge.generate_url();
    set.server.shutdown_grace_sec = 1;
    // Votes held at the gate must not time out before the stop however slow the machine is.
    set.prm.timeout_sec = 600;
    let s = start(set.clone(), fake).await;
    two_turns(&s, "slow", "Thanks! FAKE_VOTES=1").await;
    // Turn 1 is being judged; turn 2 closed the session and waits behind it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let st = s.status().await;
        if st["pending"]["scoring"].as_u64() == Some(1)
            && st["pending"]["waiting_order"].as_u64() == Some(1)
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "turn 1 never waited for its judge with turn 2 behind it: {st}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(s.status().await["samples"]["submitted"], 0);
    let fake = s.stop().await;

    judge.release();
    let s = start(set, fake).await;
    let st = s.wait_submitted(2).await;
    assert_eq!(st["samples"]["submitted"], 2);
    let pulled = s.pull(0).await;
    let turns: Vec<u64> = pulled["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["sample"]["turn"].as_u64().unwrap())
        .collect();
    assert_eq!(turns, vec![1, 2], "in turn order, each once");
    assert_eq!(pulled["samples"][0]["sample"]["reward"]["score"], 1.0);
    s.stop().await;
}
