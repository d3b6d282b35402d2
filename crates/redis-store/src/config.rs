//! What the Redis store needs to know.

use std::time::Duration;

use crate::RedisStoreError;

/// Where and how to keep samples in Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port[/db]` (or `rediss://`).
    pub url: String,
    /// Names the stream: every replica of one deployment must use the same name.
    pub deployment: String,
    /// The consumer group the trainers read in.
    pub group: String,
    /// This replica's name: where its unfinished turns are kept across a restart. Unique per
    /// replica.
    pub replica: String,
    /// Committed entries kept before trimming (0: trim as soon as committed).
    pub retain_committed: u64,
    /// Pending entries idle longer than this are reclaimed by the next consumer that pulls.
    pub claim_idle: Duration,
    /// Timeout of one Redis command (connecting included).
    pub timeout: Duration,
    /// How long an append keeps retrying while Redis is unreachable before it fails.
    pub retry_for: Duration,
}

impl RedisConfig {
    /// A config for `url` with the defaults: deployment `default`, group `trainer`, replica
    /// `replica`, nothing retained, 5 min claim idle, 5 s timeout, 60 s retry.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            deployment: "default".into(),
            group: ps_core::log::DEFAULT_CONSUMER.into(),
            replica: "replica".into(),
            retain_committed: 0,
            claim_idle: Duration::from_secs(300),
            timeout: Duration::from_secs(5),
            retry_for: Duration::from_secs(60),
        }
    }

    pub(crate) fn validate(&self) -> Result<(), RedisStoreError> {
        for (field, value) in [
            ("store.redis.deployment", &self.deployment),
            ("store.redis.group", &self.group),
            ("store.redis.replica", &self.replica),
        ] {
            if value.is_empty()
                || value.len() > 128
                || !value
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b':'))
            {
                return Err(RedisStoreError::Config {
                    field,
                    value: value.clone(),
                    reason: "expected 1 to 128 of A-Z a-z 0-9 _ . - :",
                });
            }
        }
        if self.timeout.is_zero() {
            return Err(RedisStoreError::Config {
                field: "store.redis.timeout_sec",
                value: "0".into(),
                reason: "must be above 0",
            });
        }
        Ok(())
    }
}

/// `url` with its password replaced by `***`, for logs and errors.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        Ok(u) => u.to_string(),
        // Not a URL at all: show nothing of it after an `@`, which may be a password.
        Err(_) => match url.rsplit_once('@') {
            Some((_, host)) => format!("***@{host}"),
            None => url.to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_hides_the_password_only() {
        assert_eq!(
            redact_url("redis://user:s3cret@10.0.0.5:6380/2"),
            "redis://user:***@10.0.0.5:6380/2"
        );
        assert_eq!(
            redact_url("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
        assert!(!redact_url("not a url:s3cret@host").contains("s3cret"));
    }

    #[test]
    fn names_with_spaces_or_braces_are_refused_naming_the_setting() {
        let mut c = RedisConfig::new("redis://127.0.0.1");
        c.deployment = "a}b".into();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("store.redis.deployment"), "{e}");
        let mut c = RedisConfig::new("redis://127.0.0.1");
        c.replica = String::new();
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("store.redis.replica")
        );
        assert!(RedisConfig::new("redis://127.0.0.1").validate().is_ok());
    }
}
