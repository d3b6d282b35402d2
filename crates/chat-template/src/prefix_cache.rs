//! Encoded prefixes shared across sessions: agents send the same system prompt and tool list in
//! every conversation, so its ids are kept once, keyed by the rendered text up to an added-token
//! boundary, and every session (and any other caller that encodes a text starting with it) reuses
//! them instead of encoding the prefix again.
//!
//! Bounded by bytes (key text + 4 bytes per id + a fixed overhead per entry), least recently used
//! first out. An entry is always a text and exactly its own ids (it is cut from an encoding of a
//! longer text at one of its added-token boundaries, where encodings split: see
//! [`crate::ChatTokenizer::encode_incremental`]), so a hit, a miss or an eviction changes what is
//! encoded, never the ids.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Default bound of a [`SharedPrefixCache`]: room for a few hundred distinct system prompts of
/// agent size (a 20 kB prompt with 5,000 ids takes ~40 kB).
pub const DEFAULT_SHARED_PREFIX_BYTES: usize = 16 << 20;
/// Prefixes shorter than this are not kept: encoding them costs less than the lookup.
pub const MIN_SHARED_PREFIX_BYTES: usize = 256;
/// Bytes counted per entry beyond its text and ids (map and LRU bookkeeping).
pub const ENTRY_OVERHEAD_BYTES: usize = 128;
/// At most this many distinct key lengths are probed per lookup, longest first.
const MAX_PROBES: usize = 32;

struct Entry {
    ids: Arc<[u32]>,
    tick: u64,
    cost: usize,
}

#[derive(Default)]
struct Inner {
    map: HashMap<Arc<str>, Entry>,
    /// Last use → key, oldest first.
    lru: BTreeMap<u64, Arc<str>>,
    /// Key length in bytes → how many keys have it.
    lengths: BTreeMap<usize, usize>,
    bytes: usize,
    tick: u64,
}

impl Inner {
    fn touch(&mut self, key: &str) -> Option<Arc<[u32]>> {
        self.tick += 1;
        let tick = self.tick;
        let (k, e) = self.map.get_key_value(key)?;
        let (k, old) = (k.clone(), e.tick);
        self.lru.remove(&old);
        self.lru.insert(tick, k);
        let e = self.map.get_mut(key)?;
        e.tick = tick;
        Some(e.ids.clone())
    }

    fn evict_oldest(&mut self) -> bool {
        let Some((_, key)) = self.lru.pop_first() else {
            return false;
        };
        if let Some(e) = self.map.remove(&key) {
            self.bytes -= e.cost;
        }
        if let Some(n) = self.lengths.get_mut(&key.len()) {
            *n -= 1;
            if *n == 0 {
                self.lengths.remove(&key.len());
            }
        }
        true
    }
}

/// What a [`SharedPrefixCache`] holds and has done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SharedPrefixStats {
    pub entries: usize,
    /// Counted bytes (text + ids + overhead), at most the bound.
    pub bytes: usize,
    pub max_bytes: usize,
    pub hits: u64,
    pub misses: u64,
    pub inserts: u64,
    pub evictions: u64,
}

/// A bounded (bytes, LRU) cache of encoded prefixes, shared by every session of a tokenizer (and
/// by any other caller that encodes texts starting with the same prefix). `Send + Sync`; one short
/// lock per lookup or insert.
pub struct SharedPrefixCache {
    max_bytes: usize,
    inner: Mutex<Inner>,
    hits: AtomicU64,
    misses: AtomicU64,
    inserts: AtomicU64,
    evictions: AtomicU64,
}

impl std::fmt::Debug for SharedPrefixCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedPrefixCache")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Default for SharedPrefixCache {
    fn default() -> Self {
        Self::new(DEFAULT_SHARED_PREFIX_BYTES)
    }
}

impl SharedPrefixCache {
    /// A cache that counts at most `max_bytes` (0: keeps nothing).
    pub fn new(max_bytes: usize) -> Self {
        Self {
            max_bytes,
            inner: Mutex::new(Inner::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            inserts: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The bytes an entry of `key` with `ids` counts.
    pub fn cost(key: &str, ids: &[u32]) -> usize {
        key.len() + 4 * ids.len() + ENTRY_OVERHEAD_BYTES
    }

    /// The longest kept prefix of `text` whose end `candidate` accepts (the caller checks that
    /// `text` has an added token ending there), as its byte length and ids; marks it used.
    pub fn lookup(
        &self,
        text: &str,
        candidate: impl Fn(usize) -> bool,
    ) -> Option<(usize, Arc<[u32]>)> {
        let mut inner = self.inner();
        let lengths: Vec<usize> = inner
            .lengths
            .range(..=text.len())
            .rev()
            .map(|(len, _)| *len)
            .filter(|len| text.is_char_boundary(*len) && candidate(*len))
            .take(MAX_PROBES)
            .collect();
        for len in lengths {
            if let Some(ids) = inner.touch(&text[..len]) {
                self.hits.fetch_add(1, Ordering::Relaxed);
                return Some((len, ids));
            }
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// Keeps `key` with its own ids (exactly `encode(key)`), evicting the least recently used
    /// entries to stay within the bound. An entry larger than the bound, or shorter than
    /// [`MIN_SHARED_PREFIX_BYTES`], is not kept; a key already kept is only marked used.
    pub fn insert(&self, key: &str, ids: &[u32]) {
        let cost = Self::cost(key, ids);
        if key.len() < MIN_SHARED_PREFIX_BYTES || cost > self.max_bytes {
            return;
        }
        let mut inner = self.inner();
        if inner.touch(key).is_some() {
            return;
        }
        while inner.bytes + cost > self.max_bytes && inner.evict_oldest() {
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
        inner.tick += 1;
        let tick = inner.tick;
        let key: Arc<str> = Arc::from(key);
        inner.lru.insert(tick, key.clone());
        *inner.lengths.entry(key.len()).or_insert(0) += 1;
        inner.bytes += cost;
        inner.map.insert(
            key,
            Entry {
                ids: Arc::from(ids),
                tick,
                cost,
            },
        );
        self.inserts.fetch_add(1, Ordering::Relaxed);
    }

    pub fn stats(&self) -> SharedPrefixStats {
        let inner = self.inner();
        SharedPrefixStats {
            entries: inner.map.len(),
            bytes: inner.bytes,
            max_bytes: self.max_bytes,
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            inserts: self.inserts.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
        }
    }

    /// Whether `key` is kept (does not mark it used).
    pub fn contains(&self, key: &str) -> bool {
        self.inner().map.contains_key(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(c: char, len: usize) -> String {
        std::iter::repeat_n(c, len).collect()
    }

    #[test]
    fn the_longest_accepted_prefix_wins_and_misses_are_counted() {
        let cache = SharedPrefixCache::new(1 << 20);
        let (a, ab) = (key('a', 300), format!("{}{}", key('a', 300), key('b', 300)));
        cache.insert(&a, &[1, 2]);
        cache.insert(&ab, &[1, 2, 3]);
        let text = format!("{ab}tail");
        assert_eq!(
            cache
                .lookup(&text, |_| true)
                .map(|(l, ids)| (l, ids.to_vec())),
            Some((600, vec![1, 2, 3]))
        );
        // The caller refuses the longer end: the shorter prefix is taken.
        assert_eq!(cache.lookup(&text, |l| l == 300).map(|(l, _)| l), Some(300));
        assert!(cache.lookup(&key('c', 700), |_| true).is_none());
        let s = cache.stats();
        assert_eq!((s.entries, s.hits, s.misses, s.inserts), (2, 2, 1, 2));
        // Too short to keep.
        cache.insert("short", &[9]);
        assert!(!cache.contains("short"));
    }

    #[test]
    fn eviction_drops_the_least_recently_used_and_keeps_the_bound() {
        let one = SharedPrefixCache::cost(&key('a', 400), &[0; 100]);
        let cache = SharedPrefixCache::new(2 * one + one / 2);
        let (a, b, c) = (key('a', 400), key('b', 400), key('c', 400));
        cache.insert(&a, &[0; 100]);
        cache.insert(&b, &[0; 100]);
        // `a` is used, so `b` is the oldest when `c` comes.
        assert!(cache.lookup(&format!("{a}x"), |_| true).is_some());
        cache.insert(&c, &[0; 100]);
        assert!(cache.contains(&a) && !cache.contains(&b) && cache.contains(&c));
        let s = cache.stats();
        assert_eq!((s.entries, s.evictions), (2, 1));
        assert!(s.bytes <= s.max_bytes);
        // An entry larger than the whole bound is never kept, and evicts nothing.
        cache.insert(&key('d', 400), &[0; 1000]);
        assert_eq!(cache.stats().entries, 2);
        // A zero bound keeps nothing.
        let none = SharedPrefixCache::new(0);
        none.insert(&a, &[1]);
        assert_eq!(none.stats().entries, 0);
    }
}
