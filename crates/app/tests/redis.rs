//! The rollout API over the Redis Streams store, with the real server and a real redis-server
//! (skipped when it is not installed, required in CI): several replicas feeding one stream, a
//! Redis outage that the chat path never notices, and Redis unreachable at start.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use ps_config::{Settings, StoreKind};
use ps_fake_sglang::{FakeHandle, FakeSglang};
use ps_test_support::redis::{RedisServer, TestRedis};
use serde_json::{Value, json};

struct Replica {
    url: String,
    running: Option<ps_app::Running>,
    _dir: tempfile::TempDir,
}

fn settings(
    fake: &FakeHandle,
    redis_url: &str,
    deployment: &str,
    replica: &str,
) -> (Settings, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    // The store path is unused by the Redis store; a fresh directory keeps the embedded default
    // out of the way.
    let mut s = common::settings(fake, dir.path());
    s.store.kind = StoreKind::Redis;
    s.store.redis.url = redis_url.to_owned();
    s.store.redis.deployment = deployment.into();
    s.store.redis.replica = Some(replica.into());
    s.store.redis.timeout_sec = 2;
    s.store.redis.retry_for_sec = 60;
    (s, dir)
}

async fn start(fake: &FakeHandle, redis_url: &str, deployment: &str, replica: &str) -> Replica {
    let (settings, dir) = settings(fake, redis_url, deployment, replica);
    let running = common::spawn(&settings, &common::no_env).await;
    let url = running.url().to_owned();
    Replica {
        url,
        running: Some(running),
        _dir: dir,
    }
}

impl Replica {
    async fn stop(mut self) {
        self.running.take().unwrap().stop().await.unwrap();
    }

    /// A session of `turns` main turns, the last one closing it; every turn's answer must be 200.
    async fn session(&self, id: &str, turns: usize) {
        let client = common::http();
        let mut history = vec![json!({"role": "user", "content": format!("Task {id}.")})];
        for t in 1..=turns {
            let r = client
                .post(format!("{}/v1/chat/completions", self.url))
                .header("x-session-id", id)
                .header("x-session-done", if t == turns { "1" } else { "0" })
                .json(&json!({"messages": history}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "turn {t} of {id}");
            let a: Value = r.json().await.unwrap();
            history.push(a["choices"][0]["message"].clone());
            history.push(
                json!({"role": "user", "content": format!("Next step {t}. FAKE_VOTES=1,1,1")}),
            );
        }
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        common::http()
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap()
    }

    async fn status(&self) -> Value {
        self.get("/v1/rollout/status").await.json().await.unwrap()
    }

    async fn commit(&self, through: u64) -> reqwest::Response {
        common::http()
            .post(format!("{}/v1/rollout/commit", self.url))
            .json(&json!({"through": through}))
            .send()
            .await
            .unwrap()
    }

    /// Waits until this replica has submitted `n` samples (bounded so a bug fails, not hangs).
    async fn wait_submitted(&self, n: u64) {
        for _ in 0..2400 {
            if self.status().await["samples"]["submitted"]
                .as_u64()
                .unwrap()
                >= n
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("{n} samples were not submitted: {}", self.status().await);
    }

    /// Pulls everything after `after` as the default trainer, page by page.
    async fn pull_all(&self, mut after: u64) -> Vec<Value> {
        let mut out = Vec::new();
        loop {
            let page: Value = self
                .get(&format!("/v1/rollout/samples?after={after}&max=7"))
                .await
                .json()
                .await
                .unwrap();
            let samples = page["samples"].as_array().unwrap().clone();
            let Some(last) = samples.last() else { break };
            after = last["seq"].as_u64().unwrap();
            out.extend(samples);
        }
        out
    }
}

fn keys(samples: &[Value]) -> Vec<(String, u64)> {
    samples
        .iter()
        .map(|s| {
            (
                s["sample"]["session_id"].as_str().unwrap().to_owned(),
                s["sample"]["turn"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_feed_one_stream_and_the_trainer_gets_each_sample_once() {
    let Some(redis) = TestRedis::shared_or_start() else {
        return;
    };
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let a = start(&fake, &redis.url(), redis.deployment(), "a").await;
    let b = start(&fake, &redis.url(), redis.deployment(), "b").await;
    // Sticky sessions: each session on one replica, both replicas busy at once.
    let turns = 3;
    tokio::join!(
        async {
            for i in 0..6 {
                a.session(&format!("a{i}"), turns).await;
            }
        },
        async {
            for i in 0..6 {
                b.session(&format!("b{i}"), turns).await;
            }
        }
    );
    a.wait_submitted(18).await;
    b.wait_submitted(18).await;

    // The trainer pulls through A, commits through B: it does not care which replica it asks.
    let pulled = a.pull_all(0).await;
    let got = keys(&pulled);
    let unique: BTreeSet<_> = got.iter().cloned().collect();
    assert_eq!(got.len(), 36, "{got:?}");
    assert_eq!(unique.len(), 36, "duplicates in {got:?}");
    for i in 0..6 {
        for t in 1..=turns as u64 {
            assert!(unique.contains(&(format!("a{i}"), t)));
            assert!(unique.contains(&(format!("b{i}"), t)));
        }
    }
    let seqs: Vec<u64> = pulled.iter().map(|s| s["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=36).collect::<Vec<_>>());
    // Samples keep their trainer shape: index = seq, one log-prob per response token.
    for s in &pulled {
        assert_eq!(s["sample"]["index"], s["seq"]);
        assert_eq!(
            s["sample"]["rollout_log_probs"].as_array().unwrap().len() as u64,
            s["sample"]["response_length"].as_u64().unwrap()
        );
    }
    // Not committed yet: a trainer restarting from 0 gets all of them again.
    assert_eq!(b.pull_all(0).await.len(), 36);

    let r = b.commit(40).await;
    assert_eq!(r.status(), 409);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "commit_ahead");
    assert_eq!(b.commit(36).await.status(), 200);
    assert!(a.pull_all(0).await.is_empty());
    let st = a.status().await;
    assert_eq!(
        (st["last_seq"].as_u64(), st["committed_seq"].as_u64()),
        (Some(36), Some(36))
    );
    assert_eq!(st["lag"], 0);
    let store = st["store"].as_str().unwrap();
    assert!(store.starts_with("Redis stream ps:{"), "{store}");

    let bad = a.get("/v1/rollout/samples?consumer=a%20b").await;
    assert_eq!(bad.status(), 400);
    let bad = common::http()
        .post(format!("{}/v1/rollout/commit", a.url))
        .json(&json!({"through": 1, "consumer": 7}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);

    // Everything is committed and older than the cursor 0: a long-poll waits for the next sample
    // (it used to answer [] at once, and a trainer looping on it spun against Redis).
    let url = format!(
        "{}/v1/rollout/samples?after=0&wait_ms=30000&consumer=late",
        b.url
    );
    let poll = tokio::spawn(async move {
        // Bounded (longer than the poll's own 30 s): a poll that is never answered fails.
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let page: Value = client.get(url).send().await.unwrap().json().await.unwrap();
        page
    });
    // The poll is waiting at replica b (not merely sent) before replica a appends: bounded.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while common::status(&b.url).await["waiting_pulls"] != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the poll never waited"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    a.session("late", 1).await;
    // Well within the poll's 30 s: a wake-up that never comes would still answer the sample at
    // the poll's deadline, so only a bound shorter than it shows the poll woke.
    let page = tokio::time::timeout(Duration::from_secs(15), poll)
        .await
        .expect("the poll woke when the other replica appended")
        .unwrap();
    let got = keys(page["samples"].as_array().unwrap());
    assert_eq!(got, vec![("late".to_owned(), 1)]);
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_never_blocks_the_chat_path_and_loses_no_sample() {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let a = start(&fake, &redis.url(), "outage", "a").await;
    a.session("before", 2).await;
    a.wait_submitted(2).await;

    // Redis goes away; chats still answer at once, their samples wait for it.
    redis.kill();
    for i in 0..4 {
        a.session(&format!("during{i}"), 2).await;
    }
    // The trainer, meanwhile, gets a clear error naming the Redis URL, not a hang.
    let r = a.get("/v1/rollout/samples?after=0").await;
    assert_eq!(r.status(), 500);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "store_error");
    let message = e["error"]["message"].as_str().unwrap();
    assert!(message.contains(&redis.url()), "{message}");
    let redis = tokio::task::spawn_blocking(move || {
        redis.restart();
        redis
    })
    .await
    .unwrap();
    a.wait_submitted(10).await;

    let got = keys(&a.pull_all(0).await);
    let unique: BTreeSet<_> = got.iter().cloned().collect();
    assert_eq!(got.len(), 10, "{got:?}");
    assert_eq!(unique.len(), 10, "duplicates in {got:?}");
    let st = a.status().await;
    assert_eq!(st["samples"]["dropped"], 0);
    a.stop().await;
    drop(redis);
}

#[tokio::test]
async fn redis_unreachable_at_start_names_the_url_and_the_setting() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let port = ps_test_support::redis::free_port();
    let url = format!("redis://:topsecret@127.0.0.1:{port}");
    let (settings, _dir) = settings(&fake, &url, "unreachable", "a");
    let Err(e) = ps_app::build_app(&settings, &|_| None, None).await else {
        panic!("start-up must fail when Redis is unreachable");
    };
    let text = e.to_string();
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(text.contains("store.redis.url"), "{text}");
    assert!(!text.contains("topsecret"), "{text}");
}

/// Over Redis a MessagePack page is the stored entries decoded and encoded again (the store's
/// default `read_records`): the same values as the JSON page, and exactly what encoding the
/// samples writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messagepack_pages_over_redis_carry_the_json_pages_values() {
    let Some(redis) = TestRedis::shared_or_start() else {
        return;
    };
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let a = start(&fake, &redis.url(), redis.deployment(), "mp").await;
    a.session("mp0", 2).await;
    a.wait_submitted(2).await;
    // Delivered to the default consumer and not committed: both pulls return the same entries.
    let json_page: Value = a
        .get("/v1/rollout/samples?after=0&max=1024")
        .await
        .json()
        .await
        .unwrap();
    let r = a
        .get("/v1/rollout/samples?after=0&max=1024&format=msgpack")
        .await;
    assert_eq!(r.headers()["content-type"], "application/msgpack");
    let bytes = r.bytes().await.unwrap();
    let decoded: Value = rmp_serde::from_slice(&bytes).unwrap();
    assert!(
        !json_page["samples"].as_array().unwrap().is_empty(),
        "{json_page}"
    );
    assert_eq!(decoded["samples"], json_page["samples"]);
    common::assert_msgpack_page_is_the_samples_encoded(&bytes);
    a.stop().await;
}
