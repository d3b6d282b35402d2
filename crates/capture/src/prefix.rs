//! The per-session cache of encoded prompt prefixes ([`PrefixCache`]): a conversation's next
//! turn encodes only what it adds.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ps_chat_template::{EncodedPrefix, SharedPrefixCache};

/// Sessions whose last prompt is kept for incremental tokenization; past it the cache starts over.
pub const PREFIX_CACHE_SESSIONS: usize = 1024;
/// How long an unused prefix is kept when [`CaptureQueue::with_prefix_idle`] sets nothing: the
/// default `server.session_timeout_sec`.
pub const DEFAULT_PREFIX_IDLE: Duration = Duration::from_secs(600);

pub(crate) struct CachedPrefix {
    pub(crate) prefix: Arc<EncodedPrefix>,
    pub(crate) used: Instant,
}

/// Each live session's last encoded prompt, so that the next turn encodes only what it adds
/// ([`ChatTokenizer::encode_incremental`]; the result is the same as a full encode). A session's
/// entry goes when the client closes the session, or when it has not been used for the idle time
/// (the session timeout: the session buffer has closed the session by then), so a finished
/// conversation does not keep its prompt in memory; at most [`PREFIX_CACHE_SESSIONS`] are kept.
/// A session's first turn reuses the system prompt and tools another session encoded
/// (`shared`, bounded by bytes).
pub struct PrefixCache {
    pub(crate) map: std::sync::Mutex<HashMap<String, CachedPrefix>>,
    pub(crate) shared: SharedPrefixCache,
    /// Idle time before an entry is dropped, in ms.
    pub(crate) idle_ms: AtomicU64,
    /// When entries were last checked for idleness.
    pub(crate) swept: std::sync::Mutex<Instant>,
}

impl Default for PrefixCache {
    fn default() -> Self {
        Self::new(DEFAULT_PREFIX_IDLE)
    }
}

impl PrefixCache {
    pub fn new(idle: Duration) -> Self {
        let cache = Self {
            map: std::sync::Mutex::new(HashMap::new()),
            shared: SharedPrefixCache::default(),
            idle_ms: AtomicU64::new(0),
            swept: std::sync::Mutex::new(Instant::now()),
        };
        cache.set_idle(idle);
        cache
    }

    pub(crate) fn set_idle(&self, idle: Duration) {
        let ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX).max(1);
        self.idle_ms.store(ms, Ordering::Relaxed);
    }

    pub(crate) fn idle(&self) -> Duration {
        Duration::from_millis(self.idle_ms.load(Ordering::Relaxed))
    }

    pub(crate) fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, CachedPrefix>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sessions with a cached prefix.
    pub fn len(&self) -> usize {
        self.map().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn get(&self, session_id: &str) -> Option<Arc<EncodedPrefix>> {
        self.map().get(session_id).map(|c| c.prefix.clone())
    }

    pub(crate) fn put(&self, session_id: &str, prefix: EncodedPrefix) {
        let mut map = self.map();
        if map.len() >= PREFIX_CACHE_SESSIONS && !map.contains_key(session_id) {
            map.clear();
        }
        map.insert(
            session_id.to_owned(),
            CachedPrefix {
                prefix: Arc::new(prefix),
                used: Instant::now(),
            },
        );
    }

    pub(crate) fn forget(&self, session_id: &str) {
        self.map().remove(session_id);
    }

    /// Drops the entries unused for longer than the idle time as of `now`; returns how many.
    pub fn expire(&self, now: Instant) -> usize {
        let idle = self.idle();
        let mut map = self.map();
        let before = map.len();
        map.retain(|_, c| now.saturating_duration_since(c.used) <= idle);
        if map.is_empty() {
            // Give the table's memory back too: after a burst of sessions it would stay sized for
            // the burst.
            map.shrink_to_fit();
        }
        before - map.len()
    }

    /// [`PrefixCache::expire`] when a quarter of the idle time has passed since the last check.
    pub(crate) fn expire_if_due(&self, now: Instant) {
        {
            let mut swept = self.swept.lock().unwrap_or_else(|p| p.into_inner());
            if now.saturating_duration_since(*swept) < self.idle() / 4 {
                return;
            }
            *swept = now;
        }
        self.expire(now);
    }
}
