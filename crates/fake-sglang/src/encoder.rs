//! Prompt encoding with a radix-like cache of encoded prefixes, as a real SGLang reuses the KV
//! cache of a prefix it has seen: a conversation's next prompt repeats the previous one, so only
//! what is new is encoded.
//!
//! The cache is `ps_chat_template::SharedPrefixCache` (bounded by bytes, least recently used out
//! first), shared by every request of the fake. Each encoded prompt is kept up to its last
//! added-token boundary (for Qwen3's template, everything but the generation prompt's `assistant\n`),
//! and up to the last boundary before its first non-system message (the system prompt and tools
//! that every session of an agent repeats). A later prompt that starts with a kept prefix encodes
//! only the rest. Every kept entry is a text and exactly its own ids, cut where encodings split, so
//! the ids are always exactly those of a full encode ([`ChatTokenizer::encode`]); with the cache off
//! (a bound of 0) or a tokenizer that does not split at added tokens, every prompt is encoded whole.

use ps_chat_template::{ChatTemplateError, ChatTokenizer, SharedPrefixCache, SharedPrefixStats};

/// Default bound of the fake's prefix cache: a few hundred agent prompts of ~10,000 tokens
/// (an entry counts its text, 4 bytes per id and 128 bytes).
pub const DEFAULT_PREFIX_CACHE_BYTES: usize = 64 << 20;

/// Encodes prompts, reusing kept prefixes (see the module docs).
pub(crate) struct PromptEncoder {
    cache: Option<SharedPrefixCache>,
}

impl PromptEncoder {
    /// A bound of 0 turns the cache off.
    pub(crate) fn new(max_bytes: usize) -> Self {
        Self {
            cache: (max_bytes > 0).then(|| SharedPrefixCache::new(max_bytes)),
        }
    }

    /// The ids of `text`, exactly [`ChatTokenizer::encode`]'s. `first_turn_text`: the text of the
    /// prompt's first message after its system message(s), if known: the prefix before it is kept
    /// for other conversations that share the system prompt and tools.
    pub(crate) fn encode(
        &self,
        tok: &ChatTokenizer,
        text: &str,
        first_turn_text: Option<&str>,
    ) -> Result<Vec<u32>, ChatTemplateError> {
        let Some(cache) = self.cache.as_ref().filter(|_| tok.splices()) else {
            return tok.encode(text);
        };
        let (ids, encoded) = tok.encode_cached(text, None, Some(cache))?;
        let Some(encoded) = encoded else {
            return Ok(ids);
        };
        let b = &encoded.boundaries;
        if let Some(start) = first_turn_text
            .filter(|t| !t.is_empty())
            .and_then(|t| text.find(t))
        {
            let k = b.partition_point(|(end, _)| *end <= start);
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
