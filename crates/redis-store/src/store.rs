//! The store: a stream per deployment, a counter, a commit point, and a hash of pending turns per
//! replica.
//!
//! Keys (all under the hash tag `{<deployment>}`):
//! - `ps:{d}:samples`: the stream; entry `<seq>-0` with field `s` = the sample in MessagePack
//!   (named fields, as the embedded store; `index` and `group_index` are set from the seq on read).
//! - `ps:{d}:seq`: the highest seq handed out (never reused, also when trimming emptied the stream).
//! - `ps:{d}:committed`: the trainer's commit point.
//! - `ps:{d}:append:<token>`: the seq an append got (token: XXH3-128 of the encoded sample), for
//!   [`TOKEN_TTL_RETRIES`] × `retry_for` and at least [`TOKEN_TTL_MIN`], so that its retry is
//!   idempotent.
//! - `ps:{d}:pending:<replica>`: the turns this replica persisted at shutdown.
//! - `ps:{d}:blob:<hash>`: an image samples reference, once per content hash (SHA-256, hex);
//!   `ps:{d}:images`: hash → the highest seq of an entry that references it (a sorted set). An
//!   entry with images carries their hashes (field `i`); trimming deletes the images no kept
//!   entry references.
//!
//! The Lua scripts are in `scripts.rs`. This file stays above 600 lines on purpose: every
//! operation is a method of [`RedisStore`] over the same keys, scripts, connection manager and
//! retry policy (~985 lines of code), and about 80 lines are the unit tests of its reply parsing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use ps_core::codec;
use ps_core::sample::Sample;
use ps_core::{
    LogError, PendingStore, PendingTurn, SampleLog, SampleSink, SinkError, StoreStats, StoredSample,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncConnectionConfig, Client, RedisError, RetryMethod, Script, Value};

use crate::scripts::{APPEND, COMMIT, REQUEUE, TAKE_PENDING};
use crate::{RedisConfig, RedisStoreError};

/// An append's token (a hash of the encoded sample) is remembered this many times `retry_for`,
/// and at least [`TOKEN_TTL_MIN`]: longer than the store's own retries and the session buffer's
/// retries of a failed submission together, short enough that the keys stay few (about 180
/// bytes each).
const TOKEN_TTL_RETRIES: u32 = 6;
const TOKEN_TTL_MIN: Duration = Duration::from_secs(600);
/// How many pending entries one pull looks at for reclaiming.
const REQUEUE_SCAN: usize = 1000;
/// Long-polls waiting at once (each holds a Redis connection); more wait for a slot.
const MAX_LONG_POLLS: usize = 32;
/// Back-off of retried appends.
const RETRY_MIN: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(2);
/// The stream field holding the sample.
const FIELD: &[u8] = b"s";

/// What Redis does to keep what it accepted, as reported by `CONFIG GET` at open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Durability {
    /// `appendonly yes`, `appendfsync always`: an acknowledged append survives a machine crash.
    EveryWrite,
    /// `appendonly yes` with `appendfsync everysec` (or `no`): up to about a second may be lost.
    AppendOnly { fsync: String },
    /// No append-only file: a restart loses everything since the last snapshot.
    NoAppendOnly,
    /// `CONFIG GET` is not allowed (managed Redis): the operator must check.
    Unknown,
}

struct Keys {
    stream: String,
    counter: String,
    committed: String,
    token_prefix: String,
    pending: String,
    epoch: String,
    dead_letter: String,
    images: String,
    blob_prefix: String,
}

impl Keys {
    fn new(c: &RedisConfig) -> Self {
        let base = format!("ps:{{{}}}", c.deployment);
        Self {
            stream: format!("{base}:samples"),
            counter: format!("{base}:seq"),
            committed: format!("{base}:committed"),
            token_prefix: format!("{base}:append:"),
            pending: format!("{base}:pending:{}", c.replica),
            epoch: format!("{base}:epoch"),
            dead_letter: format!("{base}:undecodable"),
            images: format!("{base}:images"),
            blob_prefix: format!("{base}:blob:"),
        }
    }
}

/// The Redis Streams sample log. Cheap to clone (clones share one connection manager);
/// `Send + Sync`.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    conn: ConnectionManager,
    config: RedisConfig,
    /// The URL with its password redacted.
    url: String,
    keys: Keys,
    durability: Durability,
    /// `maxmemory-policy` at open (`None`: `CONFIG GET` refused).
    eviction: Option<String>,
    /// Unique per process start: the value this store writes to the epoch key.
    epoch: String,
    /// Append attempts that failed and were sent again.
    retries: AtomicU64,
    /// Appends that found the epoch key missing: Redis lost its data.
    data_losses: AtomicU64,
    /// Long-polls in flight, each on a connection of its own: at most [`MAX_LONG_POLLS`].
    polls: tokio::sync::Semaphore,
    append: Script,
    requeue: Script,
    commit: Script,
    take_pending: Script,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.inner.url)
            .field("stream", &self.inner.keys.stream)
            .finish_non_exhaustive()
    }
}

/// The idempotency token of an append: the XXH3-128 hash of the encoded sample, as 32 hex
/// digits. Equal bytes are the same sample, so answering a repeated append with the first one's
/// seq loses nothing. XXH3 is specified and stable across Rust versions and platforms (std's
/// `DefaultHasher` is neither), so replicas of different builds agree on a sample's token.
fn token(bytes: &[u8]) -> String {
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(bytes))
}

/// A sample as stored: the one sample codec of both stores ([`ps_core::codec`]).
fn encode(sample: &Sample) -> Result<Vec<u8>, RedisStoreError> {
    codec::encode_sample(sample).map_err(|source| RedisStoreError::Encode {
        session_id: sample.session_id.clone(),
        turn: sample.turn,
        source,
    })
}

/// Decodes the sample stored under `seq`, with `index` and `group_index` set to it.
fn decode(
    seq: u64,
    bytes: &[u8],
    stream: &str,
    url: &str,
) -> Result<StoredSample, RedisStoreError> {
    let sample = codec::decode_sample(seq, bytes).map_err(|source| RedisStoreError::Decode {
        seq,
        stream: stream.to_owned(),
        url: url.to_owned(),
        source,
    })?;
    Ok(StoredSample { seq, sample })
}

/// The seq of a stream ID `<seq>-0`.
fn parse_id(id: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(id).ok()?;
    let (ms, _) = text.split_once('-')?;
    ms.parse().ok()
}

fn bytes_of(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn items(v: &Value) -> &[Value] {
    match v {
        Value::Array(a) | Value::Set(a) => a,
        _ => &[],
    }
}

/// One entry of an XRANGE/XREADGROUP answer: its seq and payload (`None`: the entry was trimmed
/// while pending).
type Entry = (u64, Option<Vec<u8>>);

/// The entries of an `XREADGROUP`/`XREAD` answer for one stream (RESP2: `[[key, entries]]`,
/// RESP3: `{key: entries}`; nil when there are none).
fn read_reply_entries(reply: &Value) -> Option<Vec<Entry>> {
    let streams: Vec<&Value> = match reply {
        Value::Nil => return Some(Vec::new()),
        Value::Array(a) => a.iter().filter_map(|s| items(s).get(1)).collect(),
        Value::Map(m) => m.iter().map(|(_, v)| v).collect(),
        _ => return None,
    };
    let mut out = Vec::new();
    for entries in streams {
        out.extend(entry_list(entries)?);
    }
    Some(out)
}

/// A list of stream entries `[[id, [field, value, ...] | nil], ...]`, as `XRANGE` answers and
/// `XREADGROUP` answers per stream.
fn entry_list(entries: &Value) -> Option<Vec<Entry>> {
    items(entries)
        .iter()
        .map(|e| {
            let parts = items(e);
            let seq = parse_id(bytes_of(parts.first()?)?)?;
            let payload = match parts.get(1) {
                None | Some(Value::Nil) => None,
                Some(fields) => items(fields)
                    .chunks(2)
                    .find(|kv| kv.first().and_then(bytes_of) == Some(FIELD))
                    .and_then(|kv| kv.get(1).and_then(bytes_of).map(<[u8]>::to_vec)),
            };
            Some((seq, payload))
        })
        .collect()
}

/// Whether a failed command may succeed when sent again (connection lost, Redis restarting or
/// loading its data, timeout).
fn retryable(e: &RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    // A cluster redirect will not go away by asking the same node again: Redis Cluster is not
    // supported, and the error says so at once.
    if matches!(
        e.kind(),
        ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask)
    ) {
        return false;
    }
    e.is_timeout() || !matches!(e.retry_method(), RetryMethod::NoRetry)
}

impl RedisStore {
    /// Connects, checks that Redis answers, creates the consumer group if missing and reads how
    /// Redis persists. Fails with [`RedisStoreError::Unreachable`] (naming the URL) when Redis does
    /// not answer within `config.timeout`.
    pub async fn open(config: RedisConfig) -> Result<Self, RedisStoreError> {
        config.validate()?;
        let url = crate::redact_url(&config.url);
        let client = Client::open(config.url.as_str()).map_err(|source| RedisStoreError::Url {
            url: url.clone(),
            source,
        })?;
        let unreachable = |source| RedisStoreError::Unreachable {
            url: url.clone(),
            source,
        };
        // One plain connection first: the manager would retry an unreachable server for a while.
        let mut probe = client
            .get_multiplexed_async_connection_with_config(
                &AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(config.timeout))
                    .set_response_timeout(Some(config.timeout)),
            )
            .await
            .map_err(unreachable)?;
        let _: String = redis::cmd("PING")
            .query_async(&mut probe)
            .await
            .map_err(unreachable)?;
        let conn = client
            .get_connection_manager_with_config(
                ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(config.timeout))
                    .set_response_timeout(Some(config.timeout))
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_secs(1)),
            )
            .await
            .map_err(unreachable)?;
        let durability = durability(
            config_get(&mut probe, "appendonly").await.as_deref(),
            config_get(&mut probe, "appendfsync").await,
        );
        let eviction = config_get(&mut probe, "maxmemory-policy").await;
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let keys = Keys::new(&config);
        let store = Self {
            inner: Arc::new(Inner {
                client,
                conn,
                epoch: format!("{}:{}:{started}", config.replica, std::process::id()),
                keys,
                config,
                url,
                durability,
                eviction,
                retries: AtomicU64::new(0),
                data_losses: AtomicU64::new(0),
                polls: tokio::sync::Semaphore::new(MAX_LONG_POLLS),
                append: Script::new(APPEND),
                requeue: Script::new(REQUEUE),
                commit: Script::new(COMMIT),
                take_pending: Script::new(TAKE_PENDING),
            }),
        };
        store.ensure_group().await?;
        // The first replica of a deployment marks it; an append that later finds the mark gone
        // knows Redis lost its data.
        let _: Option<String> = redis::cmd("SET")
            .arg(&store.inner.keys.epoch)
            .arg(&store.inner.epoch)
            .arg("NX")
            .query_async(&mut store.conn())
            .await
            .map_err(store.failed("mark the deployment"))?;
        Ok(store)
    }

    /// What Redis reported about its persistence at open.
    pub fn durability(&self) -> &Durability {
        &self.inner.durability
    }

    /// Redis's `maxmemory-policy` at open (`None`: `CONFIG GET` refused). Anything but
    /// `noeviction` lets Redis delete the stream, the counter or append tokens under memory
    /// pressure.
    pub fn eviction_policy(&self) -> Option<&str> {
        self.inner.eviction.as_deref()
    }

    /// How many append attempts failed and were sent again since open (connection loss, Redis
    /// restarting).
    pub fn append_retries(&self) -> u64 {
        self.inner.retries.load(Ordering::Relaxed)
    }

    /// How many appends of this process found that Redis had lost its data (the deployment's mark
    /// was gone): samples accepted before are lost, and seqs may have started again from 1.
    pub fn data_losses(&self) -> u64 {
        self.inner.data_losses.load(Ordering::Relaxed)
    }

    /// The stream key.
    pub fn stream_key(&self) -> &str {
        &self.inner.keys.stream
    }

    /// The URL, password redacted.
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    fn conn(&self) -> ConnectionManager {
        self.inner.conn.clone()
    }

    fn failed(&self, op: &'static str) -> impl Fn(RedisError) -> RedisStoreError + '_ {
        move |source| RedisStoreError::Command {
            url: self.inner.url.clone(),
            op,
            source,
        }
    }

    fn unexpected(&self, op: &'static str, detail: impl Into<String>) -> RedisStoreError {
        RedisStoreError::Unexpected {
            url: self.inner.url.clone(),
            op,
            detail: detail.into(),
        }
    }

    /// Creates the consumer group (and the stream) if missing.
    async fn ensure_group(&self) -> Result<(), RedisStoreError> {
        let created: Result<(), RedisError> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&self.inner.keys.stream)
            .arg(&self.inner.config.group)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut self.conn())
            .await;
        match created {
            Err(e) if e.code() != Some("BUSYGROUP") => {
                Err(self.failed("create the consumer group")(e))
            }
            _ => Ok(()),
        }
    }

    /// Runs `op` once more after re-creating the group when Redis says it is missing (the stream
    /// was deleted, or Redis restarted without its data).
    async fn with_group<T, F, Fut>(&self, op: F) -> Result<T, RedisStoreError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, RedisStoreError>>,
    {
        match op().await {
            Err(RedisStoreError::Command { source, .. }) if source.code() == Some("NOGROUP") => {
                tracing::warn!(
                    url = %self.inner.url,
                    stream = %self.inner.keys.stream,
                    "the consumer group was missing (stream deleted or Redis lost its data); recreated"
                );
                self.ensure_group().await?;
                op().await
            }
            other => other,
        }
    }

    /// Stores `sample` and returns its seq once Redis accepted it. Retried across connection loss
    /// and restarts for up to `retry_for` (wall clock); idempotent: the token is a hash of the
    /// encoded sample, so a retry of an append that did land, also a retry by the caller, returns
    /// the seq it already got instead of adding a second copy.
    pub async fn append(&self, sample: &Sample) -> Result<u64, RedisStoreError> {
        let bytes = encode(sample)?;
        self.append_images(
            &bytes,
            &format!("{}{}", self.inner.keys.token_prefix, token(&bytes)),
            &images_of(sample),
        )
        .await
    }

    /// The bytes of the image stored under `hash`, while a kept entry references it.
    pub async fn blob(&self, hash: &str) -> Result<Option<Vec<u8>>, RedisStoreError> {
        let key = format!("{}{hash}", self.inner.keys.blob_prefix);
        redis::cmd("GET")
            .arg(&key)
            .query_async::<Option<Vec<u8>>>(&mut self.conn())
            .await
            .map_err(self.failed("read an image"))
    }

    /// An append under a chosen token, as a retry after a lost answer would send it.
    #[cfg(feature = "test-support")]
    #[doc(hidden)]
    pub async fn append_with_token(
        &self,
        sample: &Sample,
        token: &str,
    ) -> Result<u64, RedisStoreError> {
        let bytes = encode(sample)?;
        self.append_images(
            &bytes,
            &format!("{}{token}", self.inner.keys.token_prefix),
            &images_of(sample),
        )
        .await
    }

    async fn append_images(
        &self,
        bytes: &[u8],
        token: &str,
        images: &[(String, Option<Arc<[u8]>>)],
    ) -> Result<u64, RedisStoreError> {
        let keys = &self.inner.keys;
        let retry_for = self.inner.config.retry_for;
        let ttl = retry_for
            .saturating_mul(TOKEN_TTL_RETRIES)
            .max(TOKEN_TTL_MIN)
            .as_secs();
        let once = || async {
            let mut call = self.inner.append.prepare_invoke();
            call.key(&keys.stream)
                .key(&keys.counter)
                .key(token)
                .key(&keys.epoch)
                .key(&keys.images);
            for (hash, _) in images {
                call.key(format!("{}{hash}", keys.blob_prefix));
            }
            call.arg(bytes)
                .arg(ttl)
                .arg(&self.inner.epoch)
                .arg(images.len());
            for (hash, _) in images {
                call.arg(hash);
            }
            for (_, data) in images {
                call.arg(data.as_deref().unwrap_or_default());
            }
            call.invoke_async::<(i64, u64)>(&mut self.conn()).await
        };
        let retried = once
            .retry(
                ExponentialBuilder::new()
                    .with_min_delay(RETRY_MIN)
                    .with_max_delay(RETRY_MAX)
                    .with_jitter()
                    .without_max_times(),
            )
            .when(retryable)
            .notify(|e, wait| {
                self.inner.retries.fetch_add(1, Ordering::Relaxed);
                metrics::counter!(ps_core::metric_names::STORE_APPEND_RETRIES_TOTAL).increment(1);
                tracing::warn!(url = %self.inner.url, error = %e, ?wait, "Redis append failed; retrying");
            });
        let (seq, lost) = match tokio::time::timeout(retry_for, retried).await {
            Ok(result) => result.map_err(self.failed("append a sample"))?,
            Err(_) => {
                return Err(RedisStoreError::GaveUp {
                    url: self.inner.url.clone(),
                    after: retry_for,
                });
            }
        };
        let Ok(seq) = u64::try_from(seq) else {
            let i = usize::try_from(lost).unwrap_or(1).saturating_sub(1);
            return Err(RedisStoreError::MissingImage {
                hash: images.get(i).map(|(h, _)| h.clone()).unwrap_or_default(),
            });
        };
        if lost == 1 {
            self.inner.data_losses.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(ps_core::metric_names::STORE_DATA_LOSS_TOTAL).increment(1);
            tracing::error!(
                url = %self.inner.url,
                stream = %self.inner.keys.stream,
                seq,
                "Redis lost its data (the deployment's mark is gone: a restart without its \
                 append-only file, a FLUSHALL or eviction). Samples accepted before are gone and \
                 seqs may have started again below the trainer's cursor: run Redis with \
                 appendonly yes, appendfsync always and maxmemory-policy noeviction"
            );
        }
        Ok(seq)
    }

    /// Up to `max` uncommitted samples for `consumer`, ascending: first those already delivered
    /// to it and not committed with `seq > after`, then new ones. Before reading, entries other
    /// consumers left pending longer than `claim_idle` are added again under new seqs, so that the
    /// next reader gets them whatever its cursor. A new entry is never held back: one at or below
    /// `after` (a cursor ahead of the stream) is returned too rather than left delivered but
    /// unseen.
    pub async fn read(
        &self,
        after: u64,
        max: usize,
        consumer: &str,
    ) -> Result<Vec<StoredSample>, RedisStoreError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        self.with_group(|| self.read_once(after, max, consumer))
            .await
    }

    async fn read_once(
        &self,
        after: u64,
        max: usize,
        consumer: &str,
    ) -> Result<Vec<StoredSample>, RedisStoreError> {
        let (keys, group) = (&self.inner.keys, &self.inner.config.group);
        let mut conn = self.conn();
        let moved: u64 = self
            .inner
            .requeue
            .key(&keys.stream)
            .key(&keys.counter)
            .key(&keys.images)
            .arg(group)
            .arg(consumer)
            .arg(u64::try_from(self.inner.config.claim_idle.as_millis()).unwrap_or(u64::MAX))
            .arg(REQUEUE_SCAN)
            .invoke_async(&mut conn)
            .await
            .map_err(self.failed("requeue the entries of idle consumers"))?;
        if moved > 0 {
            tracing::warn!(
                url = %self.inner.url,
                stream = %keys.stream,
                moved,
                consumer,
                idle = ?self.inner.config.claim_idle,
                "entries other consumers left unacknowledged were requeued under new seqs"
            );
        }
        let committed: Option<u64> = redis::cmd("GET")
            .arg(&keys.committed)
            .query_async(&mut conn)
            .await
            .map_err(self.failed("read the commit point"))?;
        let committed = committed.unwrap_or(0);
        let group_read = |id: String, count: usize| {
            let mut c = redis::cmd("XREADGROUP");
            c.arg("GROUP")
                .arg(group)
                .arg(consumer)
                .arg("COUNT")
                .arg(count)
                .arg("STREAMS")
                .arg(&keys.stream)
                .arg(id);
            c
        };
        let mut stale = Vec::new();
        let mut raw: Vec<(u64, Vec<u8>)> = Vec::new();
        // This consumer's delivered-but-uncommitted entries after `after`.
        let reply: Value = group_read(format!("{after}-0"), max)
            .query_async(&mut conn)
            .await
            .map_err(self.failed("read pending entries"))?;
        let history = self.entries(&reply)?;
        let history_full = history.len() == max;
        for (seq, payload) in history {
            match payload {
                // Trimmed while pending (only a commit's retention does that): nothing to give.
                None => stale.push(seq),
                Some(bytes) => raw.push((seq, bytes)),
            }
        }
        // Then entries never delivered to anyone, unless more history may follow (their IDs are
        // above every pending one: reading them now would jump the cursor past that history).
        let mut rounds = 0;
        while !history_full && raw.len() < max && rounds < 8 {
            rounds += 1;
            let reply: Value = group_read(">".into(), max - raw.len())
                .query_async(&mut conn)
                .await
                .map_err(self.failed("read new entries"))?;
            let fresh = self.entries(&reply)?;
            if fresh.is_empty() {
                break;
            }
            for (seq, payload) in fresh {
                match payload {
                    // Committed by a commit ahead of delivery: consumed already.
                    _ if seq <= committed => stale.push(seq),
                    None => stale.push(seq),
                    Some(bytes) => raw.push((seq, bytes)),
                }
            }
        }
        let out = self.decode_all(raw, &mut stale).await?;
        if !stale.is_empty() {
            let mut ack = redis::cmd("XACK");
            ack.arg(&keys.stream).arg(group);
            for seq in &stale {
                ack.arg(format!("{seq}-0"));
            }
            let _: u64 = ack
                .query_async(&mut conn)
                .await
                .map_err(self.failed("acknowledge consumed entries"))?;
        }
        Ok(out)
    }

    fn entries(&self, reply: &Value) -> Result<Vec<Entry>, RedisStoreError> {
        read_reply_entries(reply).ok_or_else(|| {
            self.unexpected(
                "XREADGROUP",
                ps_core::errors::snippet(format!("{reply:?}").as_bytes()),
            )
        })
    }

    /// Decodes the entries on the blocking pool (a page of large samples is milliseconds of CPU),
    /// ascending. An entry that cannot be decoded (written by an incompatible version) is copied
    /// to the dead-letter stream `ps:{d}:undecodable`, logged, counted and acknowledged (in
    /// `stale`), so that it does not block every later pull.
    async fn decode_all(
        &self,
        mut raw: Vec<(u64, Vec<u8>)>,
        stale: &mut Vec<u64>,
    ) -> Result<Vec<StoredSample>, RedisStoreError> {
        raw.sort_by_key(|(seq, _)| *seq);
        let (stream, url) = (self.inner.keys.stream.clone(), self.inner.url.clone());
        let decoded = tokio::task::spawn_blocking(move || {
            raw.into_iter()
                .map(|(seq, bytes)| match decode(seq, &bytes, &stream, &url) {
                    Ok(sample) => Ok(sample),
                    Err(e) => Err((seq, bytes, e)),
                })
                .collect::<Vec<_>>()
        })
        .await
        .map_err(|e| self.unexpected("decoding a page", e.to_string()))?;
        let mut out = Vec::with_capacity(decoded.len());
        for item in decoded {
            match item {
                Ok(sample) => out.push(sample),
                Err((seq, bytes, e)) => {
                    let _: String = redis::cmd("XADD")
                        .arg(&self.inner.keys.dead_letter)
                        .arg("*")
                        .arg("seq")
                        .arg(seq)
                        .arg("s")
                        .arg(bytes)
                        .query_async(&mut self.conn())
                        .await
                        .map_err(self.failed("set an undecodable entry aside"))?;
                    metrics::counter!(ps_core::metric_names::STORE_UNDECODABLE_TOTAL).increment(1);
                    tracing::error!(
                        error = %e.chain(),
                        dead_letter = %self.inner.keys.dead_letter,
                        "a sample could not be decoded (written by an incompatible version?): set \
                         aside and skipped"
                    );
                    stale.push(seq);
                }
            }
        }
        Ok(out)
    }

    /// Waits until a sample with `seq > after` exists or `timeout` passed; returns the last seq.
    /// Uses its own connection (`XREAD BLOCK` would hold up the shared one).
    pub async fn wait_newer(&self, after: u64, timeout: Duration) -> Result<u64, RedisStoreError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let last = self.stats().await?.last_seq;
        if last > after || timeout.is_zero() {
            return Ok(last);
        }
        let Ok(Ok(_slot)) = tokio::time::timeout(timeout, self.inner.polls.acquire()).await else {
            return Ok(self.stats().await?.last_seq);
        };
        let timeout = deadline.saturating_duration_since(tokio::time::Instant::now());
        if timeout.is_zero() {
            return Ok(self.stats().await?.last_seq);
        }
        let mut blocking = self
            .inner
            .client
            .get_multiplexed_async_connection_with_config(
                &AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(self.inner.config.timeout))
                    .set_response_timeout(Some(timeout + self.inner.config.timeout)),
            )
            .await
            .map_err(self.failed("connect for a long-poll"))?;
        let _: Value = redis::cmd("XREAD")
            .arg("COUNT")
            .arg(1)
            .arg("BLOCK")
            .arg(
                u64::try_from(timeout.as_millis())
                    .unwrap_or(u64::MAX)
                    .max(1),
            )
            .arg("STREAMS")
            .arg(&self.inner.keys.stream)
            .arg(format!("{after}-0"))
            .query_async(&mut blocking)
            .await
            .map_err(self.failed("wait for new entries"))?;
        Ok(self.stats().await?.last_seq)
    }

    /// Records that every sample up to `through` that `consumer` was given is consumed:
    /// acknowledges those pending entries, moves the commit point (never back) and trims to
    /// `retain_committed` committed entries (never at or above an entry still pending for anyone),
    /// in one script.
    pub async fn commit(&self, through: u64, consumer: &str) -> Result<(), RedisStoreError> {
        let keys = &self.inner.keys;
        let (done, last_seq): (u8, u64) = self
            .with_group(|| async {
                self.inner
                    .commit
                    .key(&keys.stream)
                    .key(&keys.counter)
                    .key(&keys.committed)
                    .key(&keys.images)
                    .arg(through)
                    .arg(&self.inner.config.group)
                    .arg(self.inner.config.retain_committed)
                    .arg(consumer)
                    .arg(&keys.blob_prefix)
                    .invoke_async(&mut self.conn())
                    .await
                    .map_err(self.failed("commit"))
            })
            .await?;
        if done == 0 {
            return Err(RedisStoreError::CommitAhead { through, last_seq });
        }
        Ok(())
    }

    /// The counters: last seq, commit point, entries kept, lag.
    pub async fn stats(&self) -> Result<StoreStats, RedisStoreError> {
        let keys = &self.inner.keys;
        let (last, committed, stored): (Option<u64>, Option<u64>, u64) = redis::pipe()
            .get(&keys.counter)
            .get(&keys.committed)
            .xlen(&keys.stream)
            .query_async(&mut self.conn())
            .await
            .map_err(self.failed("read the counters"))?;
        let (last_seq, committed) = (last.unwrap_or(0), committed.unwrap_or(0));
        Ok(StoreStats {
            last_seq,
            committed,
            stored,
            lag: last_seq.saturating_sub(committed),
        })
    }

    /// Every sample kept in the stream, ascending (committed retained ones included), for export.
    pub async fn read_all(
        &self,
        after: u64,
        max: usize,
    ) -> Result<Vec<StoredSample>, RedisStoreError> {
        let reply: Value = redis::cmd("XRANGE")
            .arg(&self.inner.keys.stream)
            .arg(format!("({after}-0"))
            .arg("+")
            .arg("COUNT")
            .arg(max)
            .query_async(&mut self.conn())
            .await
            .map_err(self.failed("read the stream"))?;
        let entries =
            entry_list(&reply).ok_or_else(|| self.unexpected("XRANGE", "not a list of entries"))?;
        entries
            .into_iter()
            .filter_map(|(seq, p)| p.map(|b| (seq, b)))
            .map(|(seq, b)| decode(seq, &b, &self.inner.keys.stream, &self.inner.url))
            .collect()
    }
}

/// A setting of the Redis server (`None`: `CONFIG GET` refused, as on some managed services).
async fn config_get(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Option<String> {
    let pairs: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(key)
        .query_async(conn)
        .await
        .ok()?;
    pairs.get(1).cloned()
}

/// How Redis keeps what it accepted, from its `appendonly` and `appendfsync` settings.
fn durability(appendonly: Option<&str>, appendfsync: Option<String>) -> Durability {
    match (appendonly, appendfsync) {
        (Some("yes"), Some(f)) if f == "always" => Durability::EveryWrite,
        (Some("yes"), f) => Durability::AppendOnly {
            fsync: f.unwrap_or_default(),
        },
        (Some(_), _) => Durability::NoAppendOnly,
        (None, _) => Durability::Unknown,
    }
}

#[async_trait::async_trait]
impl SampleSink for RedisStore {
    async fn submit(&self, sample: &Sample) -> Result<u64, SinkError> {
        self.append(sample)
            .await
            .map_err(|e| SinkError::Store(e.chain()))
    }
}

#[async_trait::async_trait]
impl PendingStore for RedisStore {
    async fn save_pending(&self, turns: Vec<PendingTurn>) -> Result<usize, SinkError> {
        if turns.is_empty() {
            return Ok(0);
        }
        let mut pipe = redis::pipe();
        pipe.atomic();
        for t in &turns {
            let bytes = codec::encode_pending(t).map_err(|e| {
                SinkError::Store(
                    RedisStoreError::Encode {
                        session_id: t.turn.session_id.clone(),
                        turn: t.turn.turn,
                        source: e,
                    }
                    .chain(),
                )
            })?;
            let field = format!("{}\n{}", t.turn.session_id, t.turn.turn);
            pipe.hset(&self.inner.keys.pending, field, bytes).ignore();
        }
        let _: () = pipe
            .query_async(&mut self.conn())
            .await
            .map_err(|e| SinkError::Store(self.failed("save pending turns")(e).chain()))?;
        Ok(turns.len())
    }

    async fn take_pending(&self) -> Result<Vec<PendingTurn>, SinkError> {
        let values: Vec<Vec<u8>> = self
            .inner
            .take_pending
            .key(&self.inner.keys.pending)
            .invoke_async(&mut self.conn())
            .await
            .map_err(|e| SinkError::Store(self.failed("take pending turns")(e).chain()))?;
        let mut turns = Vec::with_capacity(values.len());
        for v in values {
            match codec::decode_pending(&v) {
                Ok(t) => turns.push(t),
                Err(e) => tracing::error!(
                    url = %self.inner.url,
                    key = %self.inner.keys.pending,
                    error = %e,
                    "a pending turn could not be decoded; skipped"
                ),
            }
        }
        turns.sort_by(|a, b| {
            (a.turn.session_id.as_str(), a.turn.turn)
                .cmp(&(b.turn.session_id.as_str(), b.turn.turn))
        });
        Ok(turns)
    }
}

#[async_trait::async_trait]
impl SampleLog for RedisStore {
    async fn read(
        &self,
        after: u64,
        max: usize,
        consumer: &str,
    ) -> Result<Vec<StoredSample>, LogError> {
        Ok(RedisStore::read(self, after, max, consumer).await?)
    }

    async fn get(&self, seq: u64) -> Result<Option<StoredSample>, LogError> {
        let Some(after) = seq.checked_sub(1) else {
            return Ok(None);
        };
        let found = RedisStore::read_all(self, after, 1).await?;
        Ok(found.into_iter().find(|s| s.seq == seq))
    }

    async fn wait_newer(&self, after: u64, timeout: Duration) -> Result<u64, LogError> {
        Ok(RedisStore::wait_newer(self, after, timeout).await?)
    }

    async fn blob(&self, hash: &str) -> Result<Option<Vec<u8>>, LogError> {
        Ok(RedisStore::blob(self, hash).await?)
    }

    fn keeps_images(&self) -> bool {
        true
    }

    async fn commit(&self, through: u64, consumer: &str) -> Result<(), LogError> {
        Ok(RedisStore::commit(self, through, consumer).await?)
    }

    async fn stats(&self) -> Result<StoreStats, LogError> {
        Ok(RedisStore::stats(self).await?)
    }

    async fn close(&self) -> Result<(), LogError> {
        // Every accepted append is already in Redis; connections close with the last handle.
        Ok(())
    }

    fn describe(&self) -> String {
        format!(
            "Redis stream {} at {}",
            self.inner.keys.stream, self.inner.url
        )
    }
}

/// Everything `sample` references by hash (hash, bytes while they travel), each once: its images
/// in prompt order, then its blocks of routed experts (kept as images are).
fn images_of(sample: &Sample) -> Vec<(String, Option<Arc<[u8]>>)> {
    sample
        .blobs()
        .into_iter()
        .map(|b| (b.hash.to_owned(), b.bytes.cloned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durability_follows_appendonly_and_appendfsync() {
        let always = Some("always".to_owned());
        assert_eq!(
            durability(Some("yes"), always.clone()),
            Durability::EveryWrite
        );
        assert_eq!(
            durability(Some("yes"), Some("everysec".into())),
            Durability::AppendOnly {
                fsync: "everysec".into()
            }
        );
        assert_eq!(durability(Some("no"), always), Durability::NoAppendOnly);
        assert_eq!(durability(None, None), Durability::Unknown);
    }

    #[test]
    fn the_append_token_is_xxh3_128_in_hex() {
        // XXH3-128 of the empty input, from the xxHash reference test vectors.
        assert_eq!(token(b""), "99aa06d3014798d86001c324468d497f");
        let t = token(b"a sample");
        assert_eq!(t.len(), 32);
        assert_eq!(t, token(b"a sample"));
        assert_ne!(t, token(b"a sample."));
    }

    #[test]
    fn stream_ids_are_seqs() {
        assert_eq!(parse_id(b"42-0"), Some(42));
        assert_eq!(parse_id(b"42"), None);
        assert_eq!(parse_id(b"x-0"), None);
    }

    #[test]
    fn keys_share_the_deployment_hash_tag() {
        let mut c = RedisConfig::new("redis://127.0.0.1");
        c.deployment = "exp7".into();
        c.replica = "gpu-3".into();
        let k = Keys::new(&c);
        for key in [
            &k.stream,
            &k.counter,
            &k.committed,
            &k.token_prefix,
            &k.pending,
        ] {
            assert!(key.starts_with("ps:{exp7}:"), "{key}");
        }
        assert!(k.pending.ends_with(":gpu-3"));
    }

    #[test]
    fn read_replies_in_both_protocols_and_trimmed_entries() {
        let entry = |id: &str, payload: Option<&[u8]>| {
            Value::Array(vec![
                Value::BulkString(id.as_bytes().to_vec()),
                match payload {
                    Some(p) => Value::Array(vec![
                        Value::BulkString(b"s".to_vec()),
                        Value::BulkString(p.to_vec()),
                    ]),
                    None => Value::Nil,
                },
            ])
        };
        let entries = Value::Array(vec![entry("3-0", Some(b"abc")), entry("4-0", None)]);
        let resp2 = Value::Array(vec![Value::Array(vec![
            Value::BulkString(b"k".to_vec()),
            entries.clone(),
        ])]);
        let resp3 = Value::Map(vec![(Value::BulkString(b"k".to_vec()), entries)]);
        let want = vec![(3, Some(b"abc".to_vec())), (4, None)];
        assert_eq!(read_reply_entries(&resp2), Some(want.clone()));
        assert_eq!(read_reply_entries(&resp3), Some(want));
        assert_eq!(read_reply_entries(&Value::Nil), Some(vec![]));
        assert_eq!(read_reply_entries(&Value::Int(3)), None);
    }
}
