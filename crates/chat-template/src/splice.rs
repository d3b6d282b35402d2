//! Encoding a text that differs from an already encoded one only in its middle, by reusing the
//! encoded text's ids at both ends: the OPD teacher's prompt is the turn's prompt with a hint
//! appended to one message, so everything before that message and everything after it is already
//! encoded (in the turn's own prompt ids) and only the hinted message is encoded again.
//!
//! Why this is exact: the tokenizer extracts added tokens (`<|im_start|>`, `<|im_end|>`, …) from a
//! text before normalising and pre-tokenizing the pieces between them, so a text's ids are the
//! concatenation of its pieces' ids. A cut right after an added token (the prefix side, as in
//! [`ChatTokenizer::encode_incremental`]) or right before one (the suffix side) splits the ids
//! there, provided no added token can match across the cut whatever the text holds on its other
//! side, and provided the pieces between added tokens are normalised and pre-tokenized alike wherever
//! they stand. [`AddedTokenFacts`] checks that once per tokenizer, at load (no added token starts
//! with another, none contains the start of one past its first character, none is normalised,
//! stripped or word-bound; no Metaspace prepending only at the text's start; no unknown-token id
//! that is an added token; and a probe of every added token between short texts); when it does
//! not hold, the tokenizer keeps no `split_tokens` and every function here encodes the whole text. The result is
//! always exactly [`ChatTokenizer::encode`]'s when what is reused is its text's own encoding
//! (an engine's ids, [`ChatTokenizer::encoded_from_engine`], are reused as they are).

use std::collections::HashSet;
use tokenizers::ModelWrapper;

use crate::{
    ChatTemplateError, ChatTokenizer, EncodedPrefix, Reused, SharedPrefixCache, TurnInput,
    added_token_boundaries, agreeing_boundaries,
};

/// What the functions of this module need to know of a tokenizer's added tokens.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AddedTokenFacts {
    /// Cuts before and after an added token split the ids (see the module's documentation). The
    /// one condition for every splice of this crate: without it the tokenizer keeps no
    /// `split_tokens` and every text is encoded whole.
    pub cuts_cleanly: bool,
    /// The smallest added-token id (`u32::MAX` when there is none): ids below it are ordinary.
    pub min_id: u32,
}

/// The texts put on both sides of each added token by the load-time probe.
const PROBES: [&str; 4] = ["x", " x", "\nx", "1"];

impl AddedTokenFacts {
    /// Decides once, at load, whether this tokenizer's encodings may be spliced at added tokens,
    /// and logs (info) why not when they may not.
    pub fn of(tokenizer: &tokenizers::Tokenizer) -> Self {
        let added = tokenizer.get_added_tokens_decoder();
        let why_not = why_not_splice(tokenizer);
        if let Some(reason) = &why_not {
            tracing::info!(
                reason = reason.as_str(),
                "tokenizer: encodings are not spliced at added tokens, every text is encoded whole"
            );
        }
        Self {
            cuts_cleanly: why_not.is_none(),
            min_id: added.keys().copied().min().unwrap_or(u32::MAX),
        }
    }
}

/// Why cuts at this tokenizer's added tokens would not split its ids, or `None` when they do:
/// an added token that is normalised, stripped or word-bound; added tokens that overlap; a
/// Metaspace pre-tokenizer that prepends its replacement only at the start of the whole text
/// (`prepend_scheme: "first"`); an unknown-token id that is an added token (an unknown character
/// would then read as that token's text); or a failed probe: for each added token `c` and probes
/// `a`, `b`, `encode(a+c+b) == encode(a+c) ++ encode(b) == encode(a) ++ encode(c+b)`.
fn why_not_splice(tokenizer: &tokenizers::Tokenizer) -> Option<String> {
    let added = tokenizer.get_added_tokens_decoder();
    if let Some(t) = added
        .values()
        .find(|t| t.lstrip || t.rstrip || t.single_word || t.normalized)
    {
        return Some(format!(
            "added token {:?} is stripped, word-bound or normalized",
            t.content
        ));
    }
    let contents: Vec<&str> = added
        .values()
        .map(|t| t.content.as_str())
        .filter(|c| !c.is_empty())
        .collect();
    if !no_added_token_overlaps(&contents) {
        return Some("added tokens overlap".to_owned());
    }
    // Only the pre-tokenizer is serialized (small); the model's unknown token is read from the
    // model itself: serializing a BPE model would build its whole vocabulary as a JSON tree,
    // the start-up peak `load.rs` exists to avoid.
    let pre: Option<serde_json::Value> =
        match tokenizer.get_pre_tokenizer().map(serde_json::to_value) {
            None => None,
            Some(Ok(pre)) => Some(pre),
            Some(Err(_)) => return Some("the pre-tokenizer could not be inspected".to_owned()),
        };
    if pre.as_ref().is_some_and(has_metaspace_prepending_first) {
        return Some("a Metaspace pre-tokenizer with prepend_scheme \"first\"".to_owned());
    }
    let unk_id = match tokenizer.get_model() {
        ModelWrapper::BPE(bpe) => bpe
            .get_unk_token()
            .as_deref()
            .and_then(|t| tokenizer.token_to_id(t)),
        ModelWrapper::WordPiece(wp) => tokenizer.token_to_id(&wp.unk_token),
        ModelWrapper::WordLevel(wl) => tokenizer.token_to_id(&wl.unk_token),
        // Unigram keeps its unknown id private: read it from its serialized form (Unigram
        // vocabularies are not what the streaming loader is for).
        unigram @ ModelWrapper::Unigram(_) => match serde_json::to_value(unigram) {
            Ok(model) => model
                .get("unk_id")
                .and_then(serde_json::Value::as_u64)
                .and_then(|id| u32::try_from(id).ok()),
            Err(_) => return Some("the model could not be inspected".to_owned()),
        },
    };
    if let Some(t) = unk_id.and_then(|id| added.get(&id)) {
        return Some(format!(
            "the unknown token {:?} is an added token",
            t.content
        ));
    }
    let encode = |text: &str| {
        tokenizer
            .encode_fast(text, false)
            .map(|e| e.get_ids().to_vec())
            .ok()
    };
    let joined = |a: &str, b: &str| Some([encode(a)?, encode(b)?].concat());
    for c in &contents {
        for a in PROBES {
            for b in PROBES {
                let whole = encode(&format!("{a}{c}{b}"));
                if whole.is_none()
                    || whole != joined(&format!("{a}{c}"), b)
                    || whole != joined(a, &format!("{c}{b}"))
                {
                    return Some(format!(
                        "the probe {a:?} + {c:?} + {b:?} does not encode piecewise"
                    ));
                }
            }
        }
    }
    None
}

/// Whether a serialized pre-tokenizer is, or holds (in a `Sequence`), a Metaspace that prepends
/// its replacement only at the start of the whole text.
fn has_metaspace_prepending_first(pre: &serde_json::Value) -> bool {
    match pre {
        serde_json::Value::Object(map) => {
            (map.get("type").and_then(serde_json::Value::as_str) == Some("Metaspace")
                && map
                    .get("prepend_scheme")
                    .and_then(serde_json::Value::as_str)
                    == Some("first"))
                || map.values().any(has_metaspace_prepending_first)
        }
        serde_json::Value::Array(items) => items.iter().any(has_metaspace_prepending_first),
        _ => false,
    }
}

/// Whether no added token can match across a cut made at the start or the end of another match:
/// no token is a proper prefix of another, and no token's tail (from its second character on)
/// starts with a token or is the beginning of one.
fn no_added_token_overlaps(contents: &[&str]) -> bool {
    let tokens: HashSet<&str> = contents.iter().copied().collect();
    // Every non-empty beginning of a token, the whole token included.
    let beginnings: HashSet<&str> = contents
        .iter()
        .flat_map(|t| {
            t.char_indices()
                .map(|(i, c)| &t[..i + c.len_utf8()])
                .collect::<Vec<_>>()
        })
        .collect();
    // Whether some token is a beginning of `s` ending before `limit`.
    let has_token_beginning = |s: &str, limit: usize| {
        s.char_indices()
            .map(|(i, c)| i + c.len_utf8())
            .take_while(|end| *end <= limit)
            .any(|end| tokens.contains(&s[..end]))
    };
    contents.iter().all(|t| {
        // The whole token: no other token begins with it, and it begins with no other token.
        let longer_exists = contents
            .iter()
            .any(|u| u.len() > t.len() && u.starts_with(t));
        if longer_exists || has_token_beginning(t, t.len() - 1) {
            return false;
        }
        t.char_indices().skip(1).all(|(i, _)| {
            let tail = &t[i..];
            !beginnings.contains(tail) && !has_token_beginning(tail, tail.len())
        })
    })
}

impl ChatTokenizer {
    /// `text` with `ids`, which the caller knows to be exactly `encode(text)` (a prompt this
    /// tokenizer encoded, such as a re-tokenized turn's), ready for [`ChatTokenizer::encode_around`]
    /// and [`ChatTokenizer::encode_concat`]. Never pass ids that merely decode to `text` (an
    /// engine's, say): reusing them would give other ids than a full encode
    /// ([`ChatTokenizer::encoded_from_engine`] is for those, where that is wanted).
    pub fn encoded_from(&self, text: String, ids: Vec<u32>) -> EncodedPrefix {
        let boundaries = match &self.split_tokens {
            Some(added) => match &self.added_matcher {
                Some(matcher) => {
                    added_token_boundaries(&text, &ids, added, matcher, self.splice.min_id)
                }
                None => Vec::new(),
            },
            None => Vec::new(),
        };
        EncodedPrefix {
            text,
            ids,
            boundaries,
        }
    }

    /// `text` with an engine's `ids` for it, ready for [`ChatTokenizer::encode_around`]: `None`
    /// when the ids disagree with the text on its added tokens (they are not this text's
    /// encoding, and nothing of them can be reused), neither counted nor logged as
    /// [`ChatTokenizer::encoded_from`] does. Where the engine's ordinary tokens differ from our
    /// encoding, `encode_around` keeps the engine's (the caller wants the engine's context); where
    /// they do not, its result is exactly a full encode. A tokenizer that does not splice gives
    /// the text with no boundary (nothing is reused).
    pub fn encoded_from_engine(&self, text: String, ids: Vec<u32>) -> Option<EncodedPrefix> {
        let boundaries = match (&self.split_tokens, &self.added_matcher) {
            (Some(added), Some(matcher)) => {
                agreeing_boundaries(&text, &ids, added, matcher, self.splice.min_id)?
            }
            _ => Vec::new(),
        };
        Some(EncodedPrefix {
            text,
            ids,
            boundaries,
        })
    }

    /// The ids of `text`, reusing `base` (a text with exactly its own ids) where the two texts
    /// agree: up to the last added token that ends inside their common beginning, and from the
    /// first added token that starts inside their common end. Only what lies between is encoded;
    /// the result is exactly [`ChatTokenizer::encode`]'s, whatever the two texts are, when
    /// `base.ids` are `encode(base.text)`.
    pub fn encode_around(
        &self,
        text: &str,
        base: &EncodedPrefix,
    ) -> Result<EncodedPrefix, ChatTemplateError> {
        let Some(added) = &self.split_tokens else {
            return Ok(self.encoded_from(text.to_owned(), self.encode(text)?));
        };
        let common = common_prefix(&base.text, text);
        let k = base.boundaries.partition_point(|(end, _)| *end <= common);
        let (head_end, head_ids) = k.checked_sub(1).map_or((0, 0), |k| base.boundaries[k]);
        // The common end may not reach back into the reused beginning, in either text.
        let room = text.len().min(base.text.len()) - head_end;
        let tail_start = base.text.len() - common_suffix(&base.text, text).min(room);
        let tail = first_added_from(base, tail_start, |id| added.get(&id).map(String::len));
        let mut ids =
            Vec::with_capacity(base.ids.len() + text.len().saturating_sub(base.text.len()));
        ids.extend_from_slice(&base.ids[..head_ids]);
        match tail {
            Some((start, i)) => {
                let end_in_text = text.len() - (base.text.len() - start);
                ids.extend(self.encode(&text[head_end..end_in_text])?);
                ids.extend_from_slice(&base.ids[i..]);
            }
            None => ids.extend(self.encode(&text[head_end..])?),
        }
        Ok(self.encoded_from(text.to_owned(), ids))
    }

    /// The ids of `head.text + tail.text`, both given with exactly their own ids: `head`'s up to
    /// its last added token and `tail`'s from its first are reused, and only the text between
    /// those two is encoded. Exactly [`ChatTokenizer::encode`] of the concatenation.
    pub fn encode_concat(
        &self,
        head: &EncodedPrefix,
        tail: &EncodedPrefix,
    ) -> Result<Vec<u32>, ChatTemplateError> {
        let Some(added) = &self.split_tokens else {
            return self.encode(&format!("{}{}", head.text, tail.text));
        };
        let (head_end, head_ids) = head.boundaries.last().copied().unwrap_or((0, 0));
        let first = first_added_from(tail, 0, |id| added.get(&id).map(String::len));
        let (tail_start, tail_ids) = first.unwrap_or((tail.text.len(), tail.ids.len()));
        let mut ids = Vec::with_capacity(head.ids.len() + tail.ids.len() + 8);
        ids.extend_from_slice(&head.ids[..head_ids]);
        ids.extend(self.encode(&format!(
            "{}{}",
            &head.text[head_end..],
            &tail.text[..tail_start]
        ))?);
        ids.extend_from_slice(&tail.ids[tail_ids..]);
        Ok(ids)
    }

    /// The ids of `prompt_text`, the rendering of `input`'s messages with the generation prompt
    /// (as [`ChatTokenizer::render_turn`] gives it; `input.response_message` is not used), reusing
    /// `prev` or `shared` as [`ChatTokenizer::encode_cached`] does; when neither helped, the
    /// prompt's leading system message(s) and tools are kept in `shared` for the next caller, as
    /// [`ChatTokenizer::split_turn_cached`] does for a turn's prompt. Exactly `encode(prompt_text)`.
    pub fn encode_prompt_cached(
        &self,
        input: &TurnInput<'_>,
        prompt_text: &str,
        prev: Option<&EncodedPrefix>,
        shared: Option<&SharedPrefixCache>,
    ) -> Result<EncodedPrefix, ChatTemplateError> {
        let (ids, next, reused) = self.encode_reusing(prompt_text, prev, shared)?;
        match next {
            Some(next) => {
                if let (Some(shared), Reused::Nothing) = (shared, reused) {
                    self.share_leading_system(input, &next, shared);
                }
                Ok(next)
            }
            None => Ok(EncodedPrefix {
                text: prompt_text.to_owned(),
                ids,
                boundaries: Vec::new(),
            }),
        }
    }
}

/// The first added token of `encoded` that starts at or after byte `from`: its start and its
/// index in the ids. `len_of` gives an added token's length by id.
fn first_added_from(
    encoded: &EncodedPrefix,
    from: usize,
    len_of: impl Fn(u32) -> Option<usize>,
) -> Option<(usize, usize)> {
    // Boundaries ending before `from` belong to tokens that start before it.
    let k = encoded.boundaries.partition_point(|(end, _)| *end < from);
    encoded.boundaries[k..].iter().find_map(|&(end, n)| {
        let id = *encoded.ids.get(n.checked_sub(1)?)?;
        let start = end.checked_sub(len_of(id)?)?;
        (start >= from).then_some((start, n - 1))
    })
}

fn common_prefix(a: &str, b: &str) -> usize {
    a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count()
}

fn common_suffix(a: &str, b: &str) -> usize {
    a.bytes()
        .rev()
        .zip(b.bytes().rev())
        .take_while(|(x, y)| x == y)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_added_tokens_are_found() {
        // Qwen-like tokens: none overlaps.
        assert!(no_added_token_overlaps(&[
            "<|im_start|>",
            "<|im_end|>",
            "<think>",
            "</think>",
            "<tool_call>",
            "<tool_response>",
        ]));
        // One begins with another.
        assert!(!no_added_token_overlaps(&["<a>", "<a>b"]));
        // One's tail begins another.
        assert!(!no_added_token_overlaps(&["x<|", "<|im_end|>"]));
        // One's tail is the beginning of another ("]<" then "<x>").
        assert!(!no_added_token_overlaps(&["[]<", "<x>"]));
        // One contains another past its first character.
        assert!(!no_added_token_overlaps(&["[<x>]", "<x>"]));
        // A token whose own tail begins itself ("aa" in "aaa").
        assert!(!no_added_token_overlaps(&["aa"]));
        assert!(no_added_token_overlaps(&["ab"]));
    }

    #[test]
    fn the_mini_model_cuts_cleanly() {
        let tok = ChatTokenizer::mini();
        assert!(tok.splice.cuts_cleanly);
        assert!(tok.splice.min_id > 0);
    }
}
