//! Check 7: the sample store and every configured record directory: `store.path` (embedded store)
//! and the record directories exist (created when missing) and accept a new file (a probe file is
//! created and removed); with `store.kind = "redis"`, Redis answers at `store.redis.url` and its
//! persistence is reported.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use ps_config::{Settings, StoreKind};

use crate::report::Outcome;

/// The directories the server writes, with the key that sets each.
fn dirs(s: &Settings) -> Vec<(&'static str, PathBuf)> {
    let l = &s.logging;
    let mut out = Vec::new();
    if s.store.kind == StoreKind::Embedded {
        out.push(("store.path", s.store.path.clone()));
    }
    if let Some(d) = l.conversation_records() {
        out.push(("logging.record_dir", d));
    }
    if let Some(d) = l.prm_records() {
        let key = if l.prm_record_dir.is_some() {
            "logging.prm_record_dir"
        } else {
            "logging.record_dir"
        };
        out.push((key, d));
    }
    if let Some(d) = l.opd_records() {
        let key = if l.opd_record_dir.is_some() {
            "logging.opd_record_dir"
        } else {
            "logging.record_dir"
        };
        out.push((key, d));
    }
    out
}

/// Creates `dir` if missing, then creates, writes and removes a probe file in it.
fn probe(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let file = dir.join(format!(".policy-serving-check-{}", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&file)
        .and_then(|mut f| f.write_all(b"policy-serving check\n"));
    let removed = std::fs::remove_file(&file);
    written?;
    removed
}

fn run(s: &Settings) -> Outcome {
    let mut ok = Vec::new();
    let mut failed = Vec::new();
    for (key, dir) in dirs(s) {
        match probe(&dir) {
            Ok(()) => ok.push(format!("{key} {}", dir.display())),
            Err(e) => failed.push((key, format!("{key} = {}: {e}", dir.display()))),
        }
    }
    match failed.as_slice() {
        [] => Outcome::ok(ok.join(", ")),
        [(key, cause)] => Outcome::fail(
            format!("cannot write in {cause}"),
            format!("make it a directory the server's user can write, or set {key} to one"),
        ),
        many => Outcome::fail(
            format!(
                "cannot write in {}",
                many.iter()
                    .map(|(_, c)| c.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            format!(
                "make them directories the server's user can write, or set {} to such directories",
                many.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
            ),
        ),
    }
}

pub(crate) async fn check(s: &Settings) -> Outcome {
    let owned = s.clone();
    let dirs = match tokio::task::spawn_blocking(move || run(&owned)).await {
        Ok(outcome) => outcome,
        Err(e) => Outcome::fail(
            format!("the directory probe failed: {e}"),
            "check store.path and the logging.*record_dir keys",
        ),
    };
    match (s.store.kind, dirs) {
        (StoreKind::Redis, Outcome::Ok { detail }) => redis(s, detail).await,
        (_, dirs) => dirs,
    }
}

/// Opens the Redis store as `serve` would and reports how Redis keeps what it accepts; `dirs` is
/// what the directory probe found.
async fn redis(s: &Settings, dirs: String) -> Outcome {
    use ps_core::SampleLog as _;
    let store = match ps_redis_store::RedisStore::open(ps_app::redis_config(s)).await {
        Ok(store) => store,
        Err(e) => {
            return Outcome::fail(
                e.chain(),
                "start redis-server, or set store.redis.url to a Redis this machine reaches \
                 (or store.kind = \"embedded\")",
            );
        }
    };
    let risks = ps_app::redis_risks(&store);
    if !risks.is_empty() {
        return Outcome::fail(
            format!("{}: {}", store.describe(), risks.join("; ")),
            "configure Redis with appendonly yes, appendfsync always and maxmemory-policy \
             noeviction (redis.conf, or CONFIG SET then CONFIG REWRITE)",
        );
    }
    let mut detail = store.describe();
    if let Ok(st) = store.stats().await {
        detail.push_str(&format!(" (last seq {}, lag {})", st.last_seq, st.lag));
    }
    detail.push_str(", appendfsync always, noeviction");
    if !dirs.is_empty() {
        detail.push_str(", ");
        detail.push_str(&dirs);
    }
    Outcome::ok(detail)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn record_dirs_are_named_by_the_key_that_sets_them() {
        let mut s = Settings::default();
        s.logging.record_dir = Some(PathBuf::from("/r"));
        s.logging.opd_record_dir = Some(PathBuf::from("/o"));
        let keys: Vec<&str> = dirs(&s).into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [
                "store.path",
                "logging.record_dir",
                "logging.record_dir",
                "logging.opd_record_dir"
            ]
        );
    }

    #[tokio::test]
    async fn a_redis_store_is_probed_instead_of_store_path() {
        let mut s = Settings::default();
        s.store.kind = StoreKind::Redis;
        s.store.path = PathBuf::from("/proc/not-writable");
        s.store.redis.timeout_sec = 2;
        s.store.redis.url = format!("redis://127.0.0.1:{}", ps_test_support::redis::free_port());
        match check(&s).await {
            Outcome::Fail { cause, fix } => {
                assert!(cause.contains("store.redis.url"), "{cause}");
                assert!(cause.contains(&s.store.redis.url), "{cause}");
                assert!(fix.contains("store.redis.url"), "{fix}");
            }
            other => panic!("expected a failure, got {other:?}"),
        }
        let Some(redis) = ps_test_support::redis::TestRedis::shared_or_start() else {
            return;
        };
        s.store.redis.url = redis.url();
        s.store.redis.deployment = redis.deployment().into();
        match check(&s).await {
            Outcome::Ok { detail } => {
                assert!(
                    detail.contains(&format!(
                        "Redis stream ps:{{{}}}:samples",
                        redis.deployment()
                    )),
                    "{detail}"
                );
                assert!(!detail.contains("store.path"), "{detail}");
            }
            other => panic!("expected ok, got {other:?}"),
        }
        // A Redis that would lose accepted samples fails the check, naming what to set.
        let Some(server) = ps_test_support::redis::RedisServer::start() else {
            return;
        };
        let client = redis::Client::open(server.url()).unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory-policy")
            .arg("allkeys-lru")
            .query_async(&mut c)
            .await
            .unwrap();
        s.store.redis.url = server.url();
        match check(&s).await {
            Outcome::Fail { cause, fix } => {
                assert!(cause.contains("maxmemory-policy allkeys-lru"), "{cause}");
                assert!(fix.contains("noeviction"), "{fix}");
            }
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn probes_leave_nothing_behind() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        probe(&dir).unwrap();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    }
}
