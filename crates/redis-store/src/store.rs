//! The store: a stream per deployment, a counter, a commit point, and a hash of pending turns per
//! replica.
//!
//! Keys (all under the hash tag `{<deployment>}`):
//! - `ps:{d}:samples`: the stream; entry `<seq>-0` with field `s` = the sample in MessagePack
//!   (named fields, as the embedded store; `index` and `group_index` are set from the seq on read).
//! - `ps:{d}:seq`: the highest seq handed out (never reused, also when trimming emptied the stream).
//! - `ps:{d}:committed`: the trainer's commit point.
//! - `ps:{d}:append:<token>`: the seq an append got, for a day, so that its retry is idempotent.
//! - `ps:{d}:pending:<replica>`: the turns this replica persisted at shutdown.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use ps_core::sample::Sample;
use ps_core::{
    LogError, PendingStore, PendingTurn, SampleLog, SampleSink, SinkError, StoreStats, StoredSample,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncConnectionConfig, Client, RedisError, RetryMethod, Script, Value};

use crate::{RedisConfig, RedisStoreError};

/// Takes the next seq and adds the entry under it, unless this append's token already got one.
/// KEYS: stream, counter, token. ARGV: payload, token lifetime (s).
const APPEND: &str = r"
local done = redis.call('GET', KEYS[3])
if done then return tonumber(done) end
local seq = redis.call('INCR', KEYS[2])
redis.call('XADD', KEYS[1], string.format('%d-0', seq), 's', ARGV[1])
redis.call('SET', KEYS[3], seq, 'EX', ARGV[2])
return seq
";

/// Acknowledges every pending entry up to `through`, moves the commit point, trims.
/// KEYS: stream, counter, committed. ARGV: through, group, retain.
/// Returns {1, last} when done, {0, last} when `through` is beyond the last seq.
const COMMIT: &str = r"
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
local through = tonumber(ARGV[1])
if through > last then return {0, last} end
local committed = tonumber(redis.call('GET', KEYS[3]) or '0')
if through > committed then
  local upto = string.format('%d-0', through)
  while true do
    local p = redis.call('XPENDING', KEYS[1], ARGV[2], '-', upto, 1000)
    if #p == 0 then break end
    local ids = {}
    for i, e in ipairs(p) do ids[i] = e[1] end
    redis.call('XACK', KEYS[1], ARGV[2], unpack(ids))
  end
  redis.call('SET', KEYS[3], string.format('%d', through))
  committed = through
end
local retain = tonumber(ARGV[3])
if committed > retain then
  redis.call('XTRIM', KEYS[1], 'MINID', string.format('%d-0', committed - retain + 1))
end
return {1, last}
";

/// Returns and removes every pending turn of a replica. KEYS: the hash.
const TAKE_PENDING: &str = r"
local v = redis.call('HVALS', KEYS[1])
redis.call('DEL', KEYS[1])
return v
";

/// How long an append's token is remembered: far beyond any retry.
const TOKEN_TTL_SECS: u64 = 86_400;
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
    /// Unique per process start: prefix of this store's append tokens.
    token_base: String,
    tokens: AtomicU64,
    /// Append attempts that failed and were sent again.
    retries: AtomicU64,
    /// The highest seq an append of this process got: a lower one later means Redis lost its data.
    highest_seq: AtomicU64,
    /// Appends that got a seq below `highest_seq`.
    regressions: AtomicU64,
    append: Script,
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
        for e in items(entries) {
            let parts = items(e);
            let seq = parse_id(bytes_of(parts.first()?)?)?;
            let payload = match parts.get(1) {
                None | Some(Value::Nil) => None,
                Some(fields) => {
                    let f = items(fields);
                    f.chunks(2)
                        .find(|kv| kv.first().and_then(bytes_of) == Some(FIELD))
                        .and_then(|kv| kv.get(1).and_then(bytes_of).map(<[u8]>::to_vec))
                }
            };
            out.push((seq, payload));
        }
    }
    Some(out)
}

/// Whether a failed command may succeed when sent again (connection lost, Redis restarting or
/// loading its data, timeout).
fn retryable(e: &RedisError) -> bool {
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
        let durability = durability(&mut probe).await;
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let keys = Keys::new(&config);
        let store = Self {
            inner: Arc::new(Inner {
                client,
                conn,
                token_base: format!(
                    "{}{}:{}:{started}",
                    keys.token_prefix,
                    config.replica,
                    std::process::id()
                ),
                keys,
                config,
                url,
                durability,
                tokens: AtomicU64::new(0),
                retries: AtomicU64::new(0),
                highest_seq: AtomicU64::new(0),
                regressions: AtomicU64::new(0),
                append: Script::new(APPEND),
                commit: Script::new(COMMIT),
                take_pending: Script::new(TAKE_PENDING),
            }),
        };
        store.ensure_group().await?;
        Ok(store)
    }

    /// What Redis reported about its persistence at open.
    pub fn durability(&self) -> &Durability {
        &self.inner.durability
    }

    /// How many append attempts failed and were sent again since open (connection loss, Redis
    /// restarting).
    pub fn append_retries(&self) -> u64 {
        self.inner.retries.load(Ordering::Relaxed)
    }

    /// How many appends got a seq below one this process got before: Redis lost its data.
    pub fn seq_regressions(&self) -> u64 {
        self.inner.regressions.load(Ordering::Relaxed)
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
    /// and restarts for up to `retry_for`; a retry never adds a second copy.
    pub async fn append(&self, sample: &Sample) -> Result<u64, RedisStoreError> {
        let bytes = rmp_serde::to_vec_named(sample).map_err(|source| RedisStoreError::Encode {
            session_id: sample.session_id.clone(),
            turn: sample.turn,
            source,
        })?;
        let n = self.inner.tokens.fetch_add(1, Ordering::Relaxed);
        let seq = self
            .append_token(&bytes, &format!("{}:{n}", self.inner.token_base))
            .await?;
        let before = self.inner.highest_seq.fetch_max(seq, Ordering::Relaxed);
        if seq < before {
            self.inner.regressions.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(ps_core::metric_names::STORE_SEQ_REGRESSIONS_TOTAL).increment(1);
            // Seqs only go back when the counter was lost: Redis restarted without its data.
            tracing::error!(
                url = %self.inner.url,
                stream = %self.inner.keys.stream,
                seq,
                earlier = before,
                "Redis handed out a seq below one it gave before: it lost its data (restart \
                 without appendonly?). Samples accepted before are gone and the trainer's cursor \
                 is ahead of the new seqs: run Redis with appendonly yes, appendfsync always"
            );
        }
        Ok(seq)
    }

    /// An append under a chosen token, as a retry after a lost answer would send it.
    #[cfg(feature = "test-support")]
    #[doc(hidden)]
    pub async fn append_with_token(
        &self,
        sample: &Sample,
        token: &str,
    ) -> Result<u64, RedisStoreError> {
        let bytes = rmp_serde::to_vec_named(sample).map_err(|source| RedisStoreError::Encode {
            session_id: sample.session_id.clone(),
            turn: sample.turn,
            source,
        })?;
        self.append_token(&bytes, &format!("{}{token}", self.inner.keys.token_prefix))
            .await
    }

    async fn append_token(&self, bytes: &[u8], token: &str) -> Result<u64, RedisStoreError> {
        let keys = &self.inner.keys;
        let once = || async {
            self.inner
                .append
                .key(&keys.stream)
                .key(&keys.counter)
                .key(token)
                .arg(bytes)
                .arg(TOKEN_TTL_SECS)
                .invoke_async::<u64>(&mut self.conn())
                .await
        };
        once.retry(
            ExponentialBuilder::new()
                .with_min_delay(RETRY_MIN)
                .with_max_delay(RETRY_MAX)
                .without_max_times()
                .with_total_delay(Some(self.inner.config.retry_for)),
        )
        .when(retryable)
        .notify(|e, wait| {
            self.inner.retries.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(ps_core::metric_names::STORE_APPEND_RETRIES_TOTAL).increment(1);
            tracing::warn!(url = %self.inner.url, error = %e, ?wait, "Redis append failed; retrying");
        })
        .await
        .map_err(self.failed("append a sample"))
    }

    /// Up to `max` uncommitted samples with `seq > after` for `consumer`, ascending: first those
    /// already delivered to it and not committed, then new ones. Entries other consumers left
    /// pending longer than `claim_idle` are claimed first.
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
        let committed: Option<u64> = redis::cmd("GET")
            .arg(&keys.committed)
            .query_async(&mut conn)
            .await
            .map_err(self.failed("read the commit point"))?;
        let committed = committed.unwrap_or(0);
        let _: Value = redis::cmd("XAUTOCLAIM")
            .arg(&keys.stream)
            .arg(group)
            .arg(consumer)
            .arg(u64::try_from(self.inner.config.claim_idle.as_millis()).unwrap_or(u64::MAX))
            .arg("0-0")
            .arg("COUNT")
            .arg(max)
            .arg("JUSTID")
            .query_async(&mut conn)
            .await
            .map_err(self.failed("reclaim idle pending entries"))?;
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
        // This consumer's delivered-but-uncommitted entries after `after`.
        let reply: Value = group_read(format!("{after}-0"), max)
            .query_async(&mut conn)
            .await
            .map_err(self.failed("read pending entries"))?;
        let mut entries = read_reply_entries(&reply)
            .ok_or_else(|| self.unexpected("XREADGROUP", format!("{reply:?}")))?;
        let mut stale = Vec::new();
        let mut out = Vec::with_capacity(entries.len());
        let take = |entries: &mut Vec<Entry>,
                    out: &mut Vec<StoredSample>,
                    stale: &mut Vec<u64>|
         -> Result<(), RedisStoreError> {
            for (seq, payload) in entries.drain(..) {
                match payload {
                    // Committed (by a commit ahead of delivery) or trimmed: acknowledge, skip.
                    _ if seq <= committed => stale.push(seq),
                    None => stale.push(seq),
                    // Delivered now but at or before the trainer's cursor: it has them.
                    Some(_) if seq <= after => {}
                    Some(bytes) => out.push(self.decode(seq, &bytes)?),
                }
            }
            Ok(())
        };
        take(&mut entries, &mut out, &mut stale)?;
        // Then entries never delivered to anyone (their IDs are above every pending one).
        let mut rounds = 0;
        while out.len() < max && rounds < 8 {
            rounds += 1;
            let reply: Value = group_read(">".into(), max - out.len())
                .query_async(&mut conn)
                .await
                .map_err(self.failed("read new entries"))?;
            let mut fresh = read_reply_entries(&reply)
                .ok_or_else(|| self.unexpected("XREADGROUP", format!("{reply:?}")))?;
            if fresh.is_empty() {
                break;
            }
            take(&mut fresh, &mut out, &mut stale)?;
        }
        if !stale.is_empty() {
            let mut ack = redis::cmd("XACK");
            ack.arg(&keys.stream).arg(group);
            for seq in &stale {
                ack.arg(format!("{seq}-0"));
            }
            let _: u64 = ack
                .query_async(&mut conn)
                .await
                .map_err(self.failed("acknowledge committed entries"))?;
        }
        Ok(out)
    }

    fn decode(&self, seq: u64, bytes: &[u8]) -> Result<StoredSample, RedisStoreError> {
        let mut sample: Sample =
            rmp_serde::from_slice(bytes).map_err(|source| RedisStoreError::Decode {
                seq,
                stream: self.inner.keys.stream.clone(),
                url: self.inner.url.clone(),
                source,
            })?;
        sample.index = seq;
        sample.group_index = seq;
        Ok(StoredSample { seq, sample })
    }

    /// Waits until a sample with `seq > after` exists or `timeout` passed; returns the last seq.
    /// Uses its own connection (`XREAD BLOCK` would hold up the shared one).
    pub async fn wait_newer(&self, after: u64, timeout: Duration) -> Result<u64, RedisStoreError> {
        let last = self.stats().await?.last_seq;
        if last > after || timeout.is_zero() {
            return Ok(last);
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

    /// Records that every sample up to `through` was consumed: acknowledges the pending entries up
    /// to it, moves the commit point (never back) and trims to `retain_committed` committed
    /// entries, in one script.
    pub async fn commit(&self, through: u64) -> Result<(), RedisStoreError> {
        let keys = &self.inner.keys;
        let (done, last_seq): (u8, u64) = self
            .with_group(|| async {
                self.inner
                    .commit
                    .key(&keys.stream)
                    .key(&keys.counter)
                    .key(&keys.committed)
                    .arg(through)
                    .arg(&self.inner.config.group)
                    .arg(self.inner.config.retain_committed)
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
        let wrapped = Value::Array(vec![Value::Array(vec![Value::Nil, reply])]);
        let entries = read_reply_entries(&wrapped)
            .ok_or_else(|| self.unexpected("XRANGE", "not a list of entries"))?;
        entries
            .into_iter()
            .filter_map(|(seq, p)| p.map(|b| (seq, b)))
            .map(|(seq, b)| self.decode(seq, &b))
            .collect()
    }
}

async fn durability(conn: &mut redis::aio::MultiplexedConnection) -> Durability {
    let config: Result<Vec<String>, RedisError> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("append*")
        .query_async(conn)
        .await;
    let Ok(pairs) = config else {
        return Durability::Unknown;
    };
    let get = |k: &str| {
        pairs
            .chunks(2)
            .find(|kv| kv.first().map(String::as_str) == Some(k))
            .and_then(|kv| kv.get(1).cloned())
    };
    match (get("appendonly").as_deref(), get("appendfsync")) {
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
    async fn submit(&self, sample: Sample) -> Result<u64, SinkError> {
        self.append(&sample)
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
            let bytes = rmp_serde::to_vec_named(t).map_err(|e| {
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
            match rmp_serde::from_slice::<PendingTurn>(&v) {
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

    async fn wait_newer(&self, after: u64, timeout: Duration) -> Result<u64, LogError> {
        Ok(RedisStore::wait_newer(self, after, timeout).await?)
    }

    async fn commit(&self, through: u64) -> Result<(), LogError> {
        Ok(RedisStore::commit(self, through).await?)
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

#[cfg(test)]
mod tests {
    use super::*;

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
