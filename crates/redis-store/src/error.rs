//! The one error type of this crate.

/// Why a Redis store operation failed. Every variant names the Redis URL (password redacted) or the
/// setting to fix; the client's error is kept as the `source`.
#[derive(Debug, thiserror::Error)]
pub enum RedisStoreError {
    /// The sample references an image whose bytes it does not carry and the store does not keep;
    /// it was not stored.
    #[error(
        "the sample references image {hash}, whose bytes it does not carry and Redis does not keep"
    )]
    MissingImage { hash: String },
    /// A configuration value is unusable.
    #[error("invalid Redis store config: {field} = {value:?}: {reason}")]
    Config {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    /// The URL could not be parsed.
    #[error("invalid Redis URL {url} (check `store.redis.url`)")]
    Url {
        url: String,
        #[source]
        source: redis::RedisError,
    },
    /// Redis could not be reached at start-up.
    #[error("cannot reach Redis at {url} (check `store.redis.url` and that redis-server runs)")]
    Unreachable {
        url: String,
        #[source]
        source: redis::RedisError,
    },
    /// A command failed (after the retries that apply to it).
    #[error("Redis at {url} failed to {op}")]
    Command {
        url: String,
        op: &'static str,
        #[source]
        source: redis::RedisError,
    },
    /// An append kept failing for `store.redis.retry_for_sec`.
    #[error(
        "Redis at {url} did not accept a sample within {after:?} of retries (raise `store.redis.retry_for_sec`, or check that Redis runs)"
    )]
    GaveUp {
        url: String,
        after: std::time::Duration,
    },
    /// Redis answered something this store did not write.
    #[error("Redis at {url}: unexpected answer to {op}: {detail}")]
    Unexpected {
        url: String,
        op: &'static str,
        detail: String,
    },
    /// The sample could not be encoded; it was not stored.
    #[error("cannot encode the sample of session {session_id} turn {turn}")]
    Encode {
        session_id: String,
        turn: u64,
        #[source]
        source: ps_core::codec::EncodeError,
    },
    /// A stored entry could not be decoded.
    #[error("cannot decode sample {seq} of the stream {stream} at {url}")]
    Decode {
        seq: u64,
        stream: String,
        url: String,
        #[source]
        source: ps_core::codec::DecodeError,
    },
    /// The trainer tried to commit samples that do not exist yet.
    #[error("cannot commit through sample {through}: the last stored sample is {last_seq}")]
    CommitAhead { through: u64, last_seq: u64 },
}

impl RedisStoreError {
    /// The message followed by its sources, `: `-separated.
    pub fn chain(&self) -> String {
        ps_core::error_chain(self)
    }
}

impl From<RedisStoreError> for ps_core::LogError {
    fn from(e: RedisStoreError) -> Self {
        match e {
            RedisStoreError::CommitAhead { through, last_seq } => {
                ps_core::LogError::CommitAhead { through, last_seq }
            }
            other => ps_core::LogError::store(other.chain()),
        }
    }
}
