//! Prompt encoding with a radix-like cache of encoded prefixes, as a real SGLang reuses the KV
//! cache of a prefix it has seen: a conversation's next prompt repeats the previous one, so only
//! what is new is encoded.
//!
//! The cache is `ps_chat_template::SharedPrefixCache` (bounded by bytes, least recently used out
//! first), shared by every request of the fake. Each encoded prompt is kept up to its last
//! added-token boundary (for Qwen3's template, everything but the generation prompt's `assistant\n`),
//! and, for a conversation's first turn, up to the last boundary inside the system prompt and tools
//! that every session of an agent repeats. A later prompt that starts with a kept prefix encodes
//! only the rest. Every kept entry is a text and exactly its own ids, cut where encodings split, so
//! the ids are always exactly those of a full encode ([`ChatTokenizer::encode`]); with the cache off
//! (a bound of 0) or a tokenizer that does not split at added tokens, every prompt is encoded whole.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use ps_chat_template::{ChatTemplateError, ChatTokenizer, SharedPrefixCache, SharedPrefixStats};

/// Default bound of the fake's prefix cache: a few hundred agent prompts of ~10,000 tokens
/// (an entry counts its text, 4 bytes per id and 128 bytes).
pub const DEFAULT_PREFIX_CACHE_BYTES: usize = 64 << 20;

/// Encodes prompts, reusing kept prefixes (see the module docs).
pub(crate) struct PromptEncoder {
    cache: Option<SharedPrefixCache>,
    /// Texts being encoded now ([`PromptEncoder::encode_shared`]), so that concurrent requests
    /// with the same text (a judge's votes on one turn) wait for one encode instead of each
    /// missing the cache. Empty between requests.
    in_flight: Mutex<HashMap<Arc<str>, Arc<Encoding>>>,
}

/// One encode in progress: the ids, or `None` when it failed (each waiter then encodes again to get
/// its own error).
type Encoding = OnceLock<Option<Arc<[u32]>>>;

impl PromptEncoder {
    /// A bound of 0 turns the cache off.
    pub(crate) fn new(max_bytes: usize) -> Self {
        Self {
            cache: (max_bytes > 0).then(|| SharedPrefixCache::new(max_bytes)),
            in_flight: Mutex::new(HashMap::new()),
        }
    }

    /// [`PromptEncoder::encode`] for a text that other requests may be sending at the same time
    /// (`/generate` prompts: a judge sends its votes on one turn together): one of them encodes,
    /// the others wait for its ids. Without the cache every text is encoded whole, as before.
    pub(crate) fn encode_shared(
        &self,
        tok: &ChatTokenizer,
        text: &str,
    ) -> Result<Vec<u32>, ChatTemplateError> {
        if self.cache.is_none() || !tok.splices() {
            return tok.encode(text);
        }
        let lock = || {
            self.in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
        };
        let cell = lock().entry(Arc::from(text)).or_default().clone();
        let ids = cell
            .get_or_init(|| self.encode(tok, text, None).ok().map(Arc::from))
            .clone();
        {
            let mut map = lock();
            if map.get(text).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                map.remove(text);
            }
        }
        match ids {
            Some(ids) => Ok(ids.to_vec()),
            None => self.encode(tok, text, None),
        }
    }

    /// The ids of `text`, exactly [`ChatTokenizer::encode`]'s. `shared_prefix`: for a
    /// conversation's first turn, the length of the start of `text` that other conversations with
    /// the same system prompt and tools share (`model::shared_system_prefix`); it is kept up to its
    /// last boundary for them.
    pub(crate) fn encode(
        &self,
        tok: &ChatTokenizer,
        text: &str,
        shared_prefix: Option<usize>,
    ) -> Result<Vec<u32>, ChatTemplateError> {
        let Some(cache) = self.cache.as_ref().filter(|_| tok.splices()) else {
            return tok.encode(text);
        };
        let (ids, encoded) = tok.encode_cached(text, None, Some(cache))?;
        let Some(encoded) = encoded else {
            return Ok(ids);
        };
        let b = &encoded.boundaries;
        if let Some(len) = shared_prefix {
            let k = b.partition_point(|(end, _)| *end <= len);
            if let Some(&(end, n)) = k.checked_sub(1).map(|k| &b[k]) {
                cache.insert(&text[..end], &ids[..n]);
            }
        }
        if let Some(&(end, n)) = b.last() {
            cache.insert(&text[..end], &ids[..n]);
        }
        Ok(ids)
    }

    /// What the cache holds and has done; `None` when it is off.
    pub(crate) fn stats(&self) -> Option<SharedPrefixStats> {
        self.cache.as_ref().map(SharedPrefixCache::stats)
    }
}

impl std::fmt::Debug for PromptEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptEncoder")
            .field("stats", &self.stats())
            .finish()
    }
}
