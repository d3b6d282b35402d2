//! The Redis store's contract against a real redis-server (skipped when it is not installed,
//! required in CI).
//!
//! Long because each clause of the store's contract (seqs, idempotence, requeue, trim) has its own case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use ps_core::sample::{Reward, Sample, SampleStatus};
use ps_core::{PendingStore, StoreStats};
use ps_redis_store::{Durability, RedisConfig, RedisStore, RedisStoreError};
use ps_test_support::redis::{RedisServer, TestRedis};

fn sample(tag: &str) -> Sample {
    Sample {
        prompt: format!("prompt {tag}"),
        response: format!("response {tag}"),
        tokens: vec![1, 2, 3, 4],
        response_length: 2,
        loss_mask: vec![1, 1],
        rollout_log_probs: vec![-0.5, -1.25],
        reward: Reward { score: 1.0 },
        status: SampleStatus::Completed,
        session_id: tag.to_owned(),
        turn: 1,
        ..Sample::default()
    }
}

fn config(server: &TestRedis) -> RedisConfig {
    RedisConfig {
        deployment: server.deployment().into(),
        ..RedisConfig::new(server.url())
    }
}

async fn open(server: &TestRedis) -> RedisStore {
    RedisStore::open(config(server)).await.unwrap()
}

fn seqs(v: &[ps_core::StoredSample]) -> Vec<u64> {
    v.iter().map(|s| s.seq).collect()
}

async fn append_n(store: &RedisStore, prefix: &str, n: usize) -> Vec<u64> {
    let mut out = Vec::new();
    for i in 0..n {
        out.push(
            store
                .append(&sample(&format!("{prefix}{i}")))
                .await
                .unwrap(),
        );
    }
    out
}

#[tokio::test]
async fn appends_read_redeliver_until_committed_like_the_embedded_store() {
    let Some(server) = TestRedis::shared_or_start() else {
        return;
    };
    let store = open(&server).await;
    // The store reports how the server keeps what it accepts, as the server itself says.
    let client = redis::Client::open(server.url()).unwrap();
    let c = client.get_multiplexed_async_connection().await.unwrap();
    let config = |key: &'static str| {
        let mut c = c.clone();
        async move {
            let v: Vec<String> = redis::cmd("CONFIG")
                .arg("GET")
                .arg(key)
                .query_async(&mut c)
                .await
                .unwrap();
            v[1].clone()
        }
    };
    let (appendonly, fsync) = (config("appendonly").await, config("appendfsync").await);
    // The servers the tests start, and the shared one CI starts (.ci/run), run with
    // `appendonly yes` and `appendfsync always`: there the assertion below is the exact one.
    if server.owned().is_some()
        || std::env::var("POLICY_SERVING_REQUIRE_REDIS").as_deref() == Ok("1")
    {
        assert_eq!(
            (appendonly.as_str(), fsync.as_str()),
            ("yes", "always"),
            "the test servers and CI's shared server fsync every write"
        );
    }
    let expected = match (appendonly.as_str(), fsync.as_str()) {
        ("yes", "always") => Durability::EveryWrite,
        ("yes", f) => Durability::AppendOnly {
            fsync: f.to_owned(),
        },
        _ => Durability::NoAppendOnly,
    };
    assert_eq!(store.durability(), &expected);
    assert_eq!(append_n(&store, "s", 5).await, vec![1, 2, 3, 4, 5]);

    let read = store.read(0, 100, "trainer").await.unwrap();
    assert_eq!(seqs(&read), vec![1, 2, 3, 4, 5]);
    for (i, item) in read.iter().enumerate() {
        assert_eq!(item.sample.index, item.seq);
        assert_eq!(item.sample.group_index, item.seq);
        assert_eq!(item.sample.session_id, format!("s{i}"));
        assert_eq!(item.sample.rollout_log_probs, vec![-0.5, -1.25]);
    }
    // Delivered but not committed: a trainer restarting from its commit point gets them again.
    assert_eq!(
        seqs(&store.read(0, 100, "trainer").await.unwrap()),
        vec![1, 2, 3, 4, 5]
    );
    assert_eq!(
        seqs(&store.read(2, 2, "trainer").await.unwrap()),
        vec![3, 4]
    );

    store.commit(3, "trainer").await.unwrap();
    assert_eq!(
        seqs(&store.read(0, 100, "trainer").await.unwrap()),
        vec![4, 5]
    );
    assert_eq!(
        store.stats().await.unwrap(),
        StoreStats {
            last_seq: 5,
            committed: 3,
            stored: 2,
            lag: 2
        }
    );
    // The commit point never moves back; committing ahead is refused and changes nothing.
    store.commit(1, "trainer").await.unwrap();
    let e = store.commit(9, "trainer").await.unwrap_err();
    assert!(
        matches!(
            e,
            RedisStoreError::CommitAhead {
                through: 9,
                last_seq: 5
            }
        ),
        "{e}"
    );
    assert_eq!(store.stats().await.unwrap().committed, 3);
    assert_eq!(
        seqs(&store.read(0, 100, "trainer").await.unwrap()),
        vec![4, 5]
    );
}

#[tokio::test]
async fn a_commit_ahead_of_delivery_skips_the_committed_samples() {
    let Some(server) = TestRedis::shared_or_start() else {
        return;
    };
    let store = open(&server).await;
    append_n(&store, "s", 6).await;
    store.commit(4, "trainer").await.unwrap();
    assert_eq!(
        seqs(&store.read(0, 100, "trainer").await.unwrap()),
        vec![5, 6]
    );
}

#[tokio::test]
async fn two_replicas_appending_at_once_give_unique_contiguous_seqs_and_no_loss() {
    let Some(server) = TestRedis::shared_or_start() else {
        return;
    };
    let a = open(&server).await;
    let b = open(&server).await;
    let n = 150;
    let (sa, sb) = tokio::join!(
        async {
            let mut v = Vec::new();
            for i in 0..n {
                v.push(a.append(&sample(&format!("a{i}"))).await.unwrap());
            }
            v
        },
        async {
            let mut v = Vec::new();
            for i in 0..n {
                v.push(b.append(&sample(&format!("b{i}"))).await.unwrap());
            }
            v
        }
    );
    let all: BTreeSet<u64> = sa.iter().chain(&sb).copied().collect();
    assert_eq!(all, (1..=2 * n as u64).collect());
    // The trainer drains through either replica, commits, and sees each sample exactly once.
    let mut tags = Vec::new();
    let mut after = 0;
    loop {
        let page = b.read(after, 64, "trainer").await.unwrap();
        let Some(last) = page.last() else { break };
        after = last.seq;
        tags.extend(page.into_iter().map(|s| s.sample.session_id));
        a.commit(after, "trainer").await.unwrap();
    }
    let unique: BTreeSet<&String> = tags.iter().collect();
    assert_eq!(tags.len(), 2 * n);
    assert_eq!(unique.len(), 2 * n);
    assert!(a.read(0, 64, "trainer").await.unwrap().is_empty());
}

#[tokio::test]
async fn entries_of_a_dead_consumer_are_requeued_for_the_next_reader_whatever_its_cursor() {
    let Some(server) = TestRedis::shared_or_start() else {
        return;
    };
    // Two handles on the same deployment: one whose claim_idle no entry reaches in this test (an
    // hour), one whose claim_idle worker 1's entries are then made to pass.
    let mut patient = config(&server);
    patient.claim_idle = Duration::from_secs(3600);
    let patient = RedisStore::open(patient).await.unwrap();
    let claim_idle = Duration::from_millis(200);
    let mut cfg = config(&server);
    cfg.claim_idle = claim_idle;
    let store = RedisStore::open(cfg).await.unwrap();
    append_n(&store, "s", 4).await;
    // Worker 1 takes 1..=3 and dies without committing.
    assert_eq!(
        seqs(&store.read(0, 3, "worker-1").await.unwrap()),
        vec![1, 2, 3]
    );
    // Worker 2 while worker 1's entries are not idle long enough: only what nobody holds; it
    // moves its cursor to 4.
    assert_eq!(
        seqs(&patient.read(0, 10, "worker-2").await.unwrap()),
        vec![4]
    );
    // Once worker 1's entries have been idle long enough they come back under new seqs, above
    // worker 2's cursor, so a pull from that cursor gets them. (Sleeping longer than asked only
    // makes them idler.)
    tokio::time::sleep(claim_idle * 3).await;
    let again = store.read(4, 10, "worker-2").await.unwrap();
    assert_eq!(seqs(&again), vec![5, 6, 7]);
    let tags: Vec<&str> = again.iter().map(|s| s.sample.session_id.as_str()).collect();
    assert_eq!(tags, vec!["s0", "s1", "s2"]);
    assert_eq!(again[0].sample.index, 5, "index follows the new seq");
    store.commit(7, "worker-2").await.unwrap();
    assert!(store.read(0, 10, "worker-1").await.unwrap().is_empty());
    assert!(store.read(0, 10, "worker-2").await.unwrap().is_empty());
    assert_eq!(
        store.stats().await.unwrap().stored,
        0,
        "all consumed and trimmed"
    );
}

#[tokio::test]
async fn a_slow_consumer_keeps_its_own_entries() {
    let Some(server) = TestRedis::shared_or_start() else {
        return;
    };
    let mut cfg = config(&server);
    cfg.claim_idle = Duration::from_millis(100);
    let store = RedisStore::open(cfg).await.unwrap();
    append_n(&store, "s", 2).await;
    assert_eq!(
        seqs(&store.read(0, 10, "trainer").await.unwrap()),
        vec![1, 2]
    );
    // A training step longer than claim_idle: the same consumer's entries are not requeued.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(store.read(2, 10, "trainer").await.unwrap().is_empty());
    assert_eq!(
        seqs(&store.read(0, 10, "trainer").await.unwrap()),
        vec![1, 2]
    );
}

#[tokio::test]
async fn one_workers_commit_does_not_consume_another_workers_samples() {
    let Some(server) = TestRedis::shared_or_start() else {
        return;
    };
    let mut cfg = config(&server);
    cfg.retain_committed = 0;
    let store = RedisStore::open(cfg).await.unwrap();
    append_n(&store, "s", 4).await;
    assert_eq!(
        seqs(&store.read(0, 2, "worker-1").await.unwrap()),
        vec![1, 2]
    );
    assert_eq!(
        seqs(&store.read(0, 2, "worker-2").await.unwrap()),
        vec![3, 4]
    );
    store.commit(4, "worker-2").await.unwrap();
    // Worker 1's samples are still its own, with their payloads (not trimmed).
    let mine = store.read(0, 10, "worker-1").await.unwrap();
    assert_eq!(seqs(&mine), vec![1, 2]);
    assert_eq!(mine[0].sample.session_id, "s0");
    store.commit(2, "worker-1").await.unwrap();
    assert_eq!(store.stats().await.unwrap().stored, 0);
}

#[tokio::test]
async fn a_cursor_ahead_of_the_stream_does_not_swallow_samples() {
    let Some(server) = TestRedis::shared_or_start() else {
        return;
    };
    let store = open(&server).await;
    append_n(&store, "s", 4).await;
    // A cursor from elsewhere (another deployment, a reset): the samples are still handed out.
    assert_eq!(
        seqs(&store.read(10, 10, "trainer").await.unwrap()),
        vec![1, 2, 3, 4]
    );
}

#[tokio::test]
async fn an_undecodable_entry_is_set_aside_and_does_not_block_later_samples() {
    let Some(server) = TestRedis::shared_or_start() else {
        return;
    };
    let store = open(&server).await;
    append_n(&store, "s", 1).await;
    let client = redis::Client::open(server.url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let _: String = redis::cmd("XADD")
        .arg(store.stream_key())
        .arg("2-0")
        .arg("s")
        .arg(b"\xc1 not msgpack".as_slice())
        .query_async(&mut c)
        .await
        .unwrap();
    let counter = store.stream_key().replace(":samples", ":seq");
    let _: () = redis::cmd("SET")
        .arg(&counter)
        .arg(2)
        .query_async(&mut c)
        .await
        .unwrap();
    append_n(&store, "t", 1).await;
    assert_eq!(
        seqs(&store.read(0, 10, "trainer").await.unwrap()),
        vec![1, 3]
    );
    let dead_letter = store.stream_key().replace(":samples", ":undecodable");
    let n: u64 = redis::cmd("XLEN")
        .arg(&dead_letter)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(n, 1);
    // Acknowledged: it is not handed out again.
    assert_eq!(
        seqs(&store.read(0, 10, "trainer").await.unwrap()),
        vec![1, 3]
    );
}

#[tokio::test]
async fn a_lost_counter_continues_after_the_stream_instead_of_failing() {
    let Some(server) = TestRedis::shared_or_start() else {
        return;
    };
    let store = open(&server).await;
    append_n(&store, "s", 3).await;
    let client = redis::Client::open(server.url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let counter = store.stream_key().replace(":samples", ":seq");
    let _: () = redis::cmd("DEL")
        .arg(&counter)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(store.append(&sample("n")).await.unwrap(), 4);
    assert_eq!(store.stats().await.unwrap().last_seq, 4);
}

#[tokio::test]
async fn retention_keeps_the_configured_committed_entries_and_never_an_uncommitted_one() {
    let Some(server) = TestRedis::shared_or_start() else {
        return;
    };
    let mut cfg = config(&server);
    cfg.retain_committed = 2;
    let store = RedisStore::open(cfg).await.unwrap();
    append_n(&store, "s", 10).await;
    store.commit(6, "trainer").await.unwrap();
    let kept = store.read_all(0, 100).await.unwrap();
    assert_eq!(seqs(&kept), vec![5, 6, 7, 8, 9, 10]);
    assert_eq!(store.stats().await.unwrap().stored, 6);
    // Reads give the uncommitted ones only.
    assert_eq!(
        seqs(&store.read(0, 100, "trainer").await.unwrap()),
        vec![7, 8, 9, 10]
    );
}

#[tokio::test]
async fn a_retried_append_whose_answer_was_lost_is_not_stored_twice() {
    let Some(server) = TestRedis::shared_or_start() else {
        return;
    };
    let store = open(&server).await;
    let first = store
        .append_with_token(&sample("x"), "tok-1")
        .await
        .unwrap();
    let again = store
        .append_with_token(&sample("x"), "tok-1")
        .await
        .unwrap();
    let other = store
        .append_with_token(&sample("y"), "tok-2")
        .await
        .unwrap();
    assert_eq!((first, again, other), (1, 1, 2));
    // The token of a plain append is the sample's content: the caller's own retry (a new call
    // with the same sample) is idempotent too.
    let z1 = store.append(&sample("z")).await.unwrap();
    let z2 = store.append(&sample("z")).await.unwrap();
    assert_eq!((z1, z2), (3, 3));
    assert_eq!(store.stats().await.unwrap().stored, 3);
}

#[tokio::test]
async fn a_long_poll_wakes_when_another_replica_appends() {
    let Some(server) = TestRedis::shared_or_start() else {
        return;
    };
    let reader = open(&server).await;
    let writer = open(&server).await;
    assert_eq!(reader.wait_newer(0, Duration::ZERO).await.unwrap(), 0);
    // The reader has two seconds to be inside its wait (a blocking XREAD) before the other replica
    // appends, and must wake within a few seconds of the append, not at its 30 s bound (which is
    // there only so that a broken wake-up fails instead of hanging).
    let waiting = tokio::spawn(async move {
        let started = std::time::Instant::now();
        let last = reader.wait_newer(0, Duration::from_secs(30)).await.unwrap();
        (started, last, std::time::Instant::now())
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let appended_at = std::time::Instant::now();
    let seq = writer.append(&sample("late")).await.unwrap();
    let (started, last, woke) = waiting.await.unwrap();
    assert_eq!(last, seq);
    assert!(
        started < appended_at,
        "the reader was waiting before the append"
    );
    assert!(
        woke >= appended_at && woke - appended_at < Duration::from_secs(5),
        "woken {:?} after the append",
        woke.saturating_duration_since(appended_at)
    );
}

#[tokio::test]
async fn a_deleted_stream_gets_its_group_back_and_seqs_are_not_reused() {
    let Some(server) = TestRedis::shared_or_start() else {
        return;
    };
    let store = open(&server).await;
    append_n(&store, "s", 2).await;
    let client = redis::Client::open(server.url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("DEL")
        .arg(store.stream_key())
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(store.read(0, 10, "trainer").await.unwrap().is_empty());
    assert_eq!(store.append(&sample("n")).await.unwrap(), 3);
    assert_eq!(seqs(&store.read(0, 10, "trainer").await.unwrap()), vec![3]);
}

#[tokio::test]
async fn pending_turns_are_kept_per_replica_and_taken_once() {
    let Some(server) = TestRedis::shared_or_start() else {
        return;
    };
    let mut one = config(&server);
    one.replica = "one".into();
    let mut two = config(&server);
    two.replica = "two".into();
    let (one, two) = (
        RedisStore::open(one).await.unwrap(),
        RedisStore::open(two).await.unwrap(),
    );
    let turn = |s: &str, t: u64| ps_core::PendingTurn {
        session_had_effective: t == 2,
        tokenizer: Some(0x0123_4567_89ab_cdef),
        ..ps_core::pending::testing::pending_turn(s, t)
    };
    assert_eq!(
        one.save_pending(vec![turn("a", 2), turn("a", 1)])
            .await
            .unwrap(),
        2
    );
    assert!(two.take_pending().await.unwrap().is_empty());
    let taken = one.take_pending().await.unwrap();
    assert_eq!(taken, vec![turn("a", 1), turn("a", 2)]);
    assert!(one.take_pending().await.unwrap().is_empty());
}

#[tokio::test]
async fn unreachable_redis_at_start_is_a_clear_error_naming_the_url_without_its_password() {
    let port = ps_test_support::redis::free_port();
    let mut cfg = RedisConfig::new(format!("redis://user:hunter2@127.0.0.1:{port}"));
    cfg.timeout = Duration::from_secs(2);
    let e = RedisStore::open(cfg).await.unwrap_err();
    let text = e.chain();
    assert!(matches!(e, RedisStoreError::Unreachable { .. }), "{text}");
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(text.contains("store.redis.url"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
}

#[tokio::test]
async fn a_redis_restart_mid_run_loses_no_accepted_sample_and_duplicates_none() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let mut cfg = RedisConfig::new(server.url());
    cfg.retry_for = Duration::from_secs(60);
    cfg.timeout = Duration::from_secs(2);
    let store = RedisStore::open(cfg).await.unwrap();
    let n = 1000usize;
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut accepted = Vec::new();
            for i in 0..n {
                let seq = store.append(&sample(&format!("r{i}"))).await.unwrap();
                accepted.push((seq, format!("r{i}")));
            }
            accepted
        })
    };
    // Restart (SIGKILL: only the fsynced append-only file survives) once appends are flowing.
    // Bounded: appends that never flow fail here instead of hanging.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while store.stats().await.map(|s| s.last_seq).unwrap_or(0) < 50 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "appends never reached 50"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    let accepted = writer.await.unwrap();
    let stored = store.read_all(0, 10_000).await.unwrap();
    let by_seq: std::collections::BTreeMap<u64, String> = stored
        .iter()
        .map(|s| (s.seq, s.sample.session_id.clone()))
        .collect();
    // Every accepted append is there under the seq it was given, and nothing else is.
    for (seq, tag) in &accepted {
        assert_eq!(by_seq.get(seq), Some(tag), "sample {tag} (seq {seq}) lost");
    }
    assert_eq!(stored.len(), n, "duplicates or strays in {by_seq:?}");
    // The restart did hit appends in flight (else this test proved nothing).
    assert!(store.append_retries() > 0);
    drop(server);
}

#[tokio::test]
async fn redis_losing_its_data_is_detected_and_concurrent_appends_are_not_mistaken_for_it() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = RedisStore::open(RedisConfig::new(server.url()))
        .await
        .unwrap();
    // Many concurrent appends, as the session buffer makes them: no false alarm.
    let mut tasks = Vec::new();
    for t in 0..16 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..20 {
                store.append(&sample(&format!("c{t}-{i}"))).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(store.data_losses(), 0);
    // What a restart without the append-only file does.
    let client = redis::Client::open(server.url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("FLUSHALL").query_async(&mut c).await.unwrap();
    assert_eq!(store.append(&sample("after")).await.unwrap(), 1);
    assert_eq!(store.data_losses(), 1);
    store.append(&sample("after-2")).await.unwrap();
    assert_eq!(store.data_losses(), 1, "reported once");
}

#[tokio::test]
async fn a_sample_is_got_by_seq_without_being_delivered_to_any_consumer() {
    let Some(server) = TestRedis::shared_or_start() else {
        return;
    };
    let store = open(&server).await;
    append_n(&store, "g", 3).await;
    let log: &dyn ps_core::SampleLog = &store;
    let got = log.get(2).await.unwrap().unwrap();
    assert_eq!((got.seq, got.sample.session_id.as_str()), (2, "g1"));
    assert!(log.get(0).await.unwrap().is_none());
    assert!(log.get(9).await.unwrap().is_none());
    // Nothing was handed to a consumer: the trainer still gets every sample.
    assert_eq!(
        seqs(&store.read(0, 10, "trainer").await.unwrap()),
        vec![1, 2, 3]
    );
}

/// Images of samples over Redis: kept once per hash however many entries reference them,
/// readable while a kept entry does, deleted with the trim of the last one; an image without
/// bytes that Redis does not keep refuses its sample before anything is written.
#[tokio::test]
async fn images_are_kept_once_per_hash_and_trimmed_with_their_last_sample() {
    use ps_core::sample::SampleImage;
    let Some(server) = TestRedis::shared_or_start() else {
        return;
    };
    let mut cfg = config(&server);
    cfg.retain_committed = 0;
    let store = RedisStore::open(cfg).await.unwrap();
    let image = |fill: u8, len: usize, with_bytes: bool| SampleImage {
        hash: format!("{fill:064x}"),
        mime: "image/png".into(),
        width: 8,
        height: 8,
        tokens: 4,
        bytes: with_bytes.then(|| vec![fill; len].into()),
    };
    let with = |tag: &str, images: Vec<SampleImage>| Sample {
        images,
        ..sample(tag)
    };
    let big = image(7, 1 << 20, true);
    let small = image(9, 100, true);
    for i in 0..20 {
        let mut images = vec![big.clone()];
        if i == 19 {
            images.push(small.clone());
        }
        store.append(&with(&format!("s{i}"), images)).await.unwrap();
    }
    // Known hash without bytes: referenced; unknown without bytes: refused, nothing written.
    let seq = store
        .append(&with("known", vec![image(7, 0, false)]))
        .await
        .unwrap();
    assert_eq!(seq, 21);
    let err = store
        .append(&with("unknown", vec![image(3, 0, false)]))
        .await
        .unwrap_err();
    assert!(matches!(err, RedisStoreError::MissingImage { .. }), "{err}");
    assert_eq!(store.stats().await.unwrap().last_seq, 21);
    let client = redis::Client::open(server.url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let pattern = format!("ps:{{{}}}:blob:*", server.deployment());
    let blobs = |mut c: redis::aio::MultiplexedConnection| {
        let pattern = pattern.clone();
        async move {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(&pattern)
                .query_async(&mut c)
                .await
                .unwrap();
            keys.len()
        }
    };
    assert_eq!(blobs(c.clone()).await, 2, "each image once");
    assert_eq!(
        store.blob(&big.hash).await.unwrap().as_deref(),
        big.bytes.as_deref()
    );
    let read = store.read(0, 100, "trainer").await.unwrap();
    assert_eq!(read.len(), 21);
    assert_eq!(read[19].sample.images.len(), 2);
    assert_eq!(read[19].sample.images[1].hash, small.hash);
    assert_eq!(
        read[19].sample.images[1].bytes, None,
        "the entry holds the hash"
    );
    // Committed up to the last entry that references `small`: `small` goes, `big` stays while
    // entry 21 references it.
    store.commit(20, "trainer").await.unwrap();
    assert_eq!(store.blob(&small.hash).await.unwrap(), None);
    assert!(store.blob(&big.hash).await.unwrap().is_some());
    store.commit(21, "trainer").await.unwrap();
    assert_eq!(store.blob(&big.hash).await.unwrap(), None);
    assert_eq!(blobs(c.clone()).await, 0);
    let index: u64 = redis::cmd("ZCARD")
        .arg(format!("ps:{{{}}}:images", server.deployment()))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(index, 0);
}
