//! Parsing `tokenizer.json` without building the file twice in memory.
//!
//! `tokenizers` parses a model through an untagged helper enum: serde first buffers the whole
//! `"model"` object (151,643 vocabulary entries and 151,387 merges for Qwen3) as an untyped tree,
//! then copies it into a `serde_json::Value` (`#[serde(flatten)]`), and only then builds the BPE
//! maps from that copy. For the 11 MB Qwen3 file that is a transient peak of well over 100 MB on
//! top of the ~25 MB the tokenizer keeps (docs/benchmarks-history.md, "Memory: one tokenizer").
//!
//! [`parse_tokenizer`] reads a BPE model straight into the maps the library builds it from: the
//! same keys, the same rules and the same builder as the library's own `Deserialize`
//! (`tokenizers::models::bpe::serialization` and `tokenizer::serialization` of 0.23), only the
//! model is streamed instead of buffered. Any other model type, or anything this reader does not
//! expect, goes to the library's parser, so the result (and every error) is the library's. The
//! tests check that both parsers give the same tokenizer, serialized, on every fixture.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use tokenizers::models::bpe::{BPE, BpeBuilder, Merges, Vocab};
use tokenizers::{
    AddedToken, DecoderWrapper, ModelWrapper, NormalizerWrapper, PaddingParams,
    PostProcessorWrapper, PreTokenizerWrapper, Tokenizer, TokenizerBuilder, TokenizerImpl,
    TruncationParams,
};

type Impl = TokenizerImpl<
    ModelWrapper,
    NormalizerWrapper,
    PreTokenizerWrapper,
    PostProcessorWrapper,
    DecoderWrapper,
>;

/// Parses the contents of a `tokenizer.json`: a BPE model streamed into its maps, anything else
/// by `tokenizers` itself.
pub(crate) fn parse_tokenizer(json: &str) -> tokenizers::Result<Tokenizer> {
    match parse_streamed(json) {
        Ok(tokenizer) => Ok(tokenizer),
        // Not a tokenizer this reader knows (another model type, an unexpected shape): the
        // library's parser decides, and its error is the one reported.
        Err(streaming) => {
            // Said once per load: the file costs the library's higher start-up peak.
            log::info!(
                "tokenizer.json read by the tokenizers library's own parser ({streaming}); \
                 start-up memory peaks higher"
            );
            Ok(json.parse::<Tokenizer>()?)
        }
    }
}

/// The streaming reader alone (the tests compare it with the library's parser).
pub(crate) fn parse_streamed(json: &str) -> Result<Tokenizer, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(json);
    let tokenizer = de::Deserializer::deserialize_map(&mut de, TokenizerFile)?;
    de.end()?;
    Ok(Tokenizer::from(tokenizer))
}

/// One entry of `added_tokens`, as the library reads it.
#[derive(Deserialize)]
struct AddedTokenWithId {
    id: u32,
    #[serde(flatten)]
    token: AddedToken,
}

/// The top level of `tokenizer.json`, read as the library's `TokenizerVisitor` reads it.
struct TokenizerFile;

impl<'de> Visitor<'de> for TokenizerFile {
    type Value = Impl;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("struct Tokenizer")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Impl, A::Error> {
        let mut builder = TokenizerBuilder::new();
        let mut tokens: Vec<AddedTokenWithId> = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "version" => {
                    let v: String = map.next_value()?;
                    if v != "1.0" {
                        return Err(de::Error::custom(format!(
                            "Unknown tokenizer version '{v}'"
                        )));
                    }
                }
                "truncation" => {
                    builder =
                        builder.with_truncation(map.next_value::<Option<TruncationParams>>()?);
                }
                "padding" => {
                    builder = builder.with_padding(map.next_value::<Option<PaddingParams>>()?);
                }
                "added_tokens" => tokens = map.next_value()?,
                "normalizer" => builder = builder.with_normalizer(map.next_value()?),
                "pre_tokenizer" => builder = builder.with_pre_tokenizer(map.next_value()?),
                "model" => {
                    let bpe = map.next_value_seed(BpeModel)?;
                    builder = builder.with_model(ModelWrapper::BPE(bpe));
                }
                "decoder" => builder = builder.with_decoder(map.next_value()?),
                "post_processor" => builder = builder.with_post_processor(map.next_value()?),
                // The library's reader leaves an unknown key's value unread, which its JSON
                // reader then refuses: so does this one (the caller reports the library's error).
                other => return Err(de::Error::custom(format!("unknown key {other}"))),
            }
        }
        let mut tokenizer = builder
            .build()
            .map_err(|e| de::Error::custom(e.to_string()))?;
        // As the library: a token whose id disagrees with the vocabulary is only warned about.
        for t in &tokens {
            if let Some(rid) = tokenizer.token_to_id(&t.token.content)
                && rid != t.id
            {
                log::warn!(
                    "Warning: Token '{}' was expected to have ID '{}' but was given ID '{}'",
                    t.token.content,
                    t.id,
                    rid
                );
            }
        }
        tokenizer
            .add_tokens(tokens.into_iter().map(|t| t.token))
            .map_err(|e| de::Error::custom(e.to_string()))?;
        Ok(tokenizer)
    }
}

/// A `"model"` object of `"type": "BPE"`, read as the library's `BPEVisitor` reads it, with the
/// vocabulary and merges streamed into the builder's inputs. Any other type is an error here (the
/// caller falls back to the library).
struct BpeModel;

impl<'de> DeserializeSeed<'de> for BpeModel {
    type Value = BPE;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<BPE, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for BpeModel {
    type Value = BPE;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a BPE model")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<BPE, A::Error> {
        let mut builder = BpeBuilder::new();
        let mut vocab: Option<Vocab> = None;
        let mut merges: Option<Merges> = None;
        let mut is_bpe = false;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "type" => {
                    let t: String = map.next_value()?;
                    if t != "BPE" {
                        return Err(de::Error::custom(format!("model type {t}, not BPE")));
                    }
                    is_bpe = true;
                }
                "dropout" => {
                    // Read as f64 then narrowed, as the library does (it reads a buffered value).
                    if let Some(v) = map.next_value::<Option<f64>>()? {
                        builder = builder.dropout(v as f32);
                    }
                }
                "unk_token" => {
                    if let Some(v) = map.next_value()? {
                        builder = builder.unk_token(v);
                    }
                }
                "continuing_subword_prefix" => {
                    if let Some(v) = map.next_value()? {
                        builder = builder.continuing_subword_prefix(v);
                    }
                }
                "end_of_word_suffix" => {
                    if let Some(v) = map.next_value()? {
                        builder = builder.end_of_word_suffix(v);
                    }
                }
                "fuse_unk" => {
                    if let Some(v) = map.next_value()? {
                        builder = builder.fuse_unk(v);
                    }
                }
                "byte_fallback" => {
                    if let Some(v) = map.next_value()? {
                        builder = builder.byte_fallback(v);
                    }
                }
                "ignore_merges" => {
                    if let Some(v) = map.next_value()? {
                        builder = builder.ignore_merges(v);
                    }
                }
                "vocab" => vocab = Some(map.next_value()?),
                "merges" => merges = Some(map.next_value_seed(MergeList)?),
                // The library ignores a model key it does not know; a later `tokenizers` may
                // honour it, so this reader never guesses: the library parses such a file.
                other => return Err(de::Error::custom(format!("unknown model key {other}"))),
            }
        }
        // Without `"type"` the library guesses the model from its fields: leave that to it.
        if !is_bpe {
            return Err(de::Error::custom("model without a type"));
        }
        match (vocab, merges) {
            (Some(vocab), Some(merges)) => builder
                .vocab_and_merges(vocab, merges)
                .build()
                .map_err(de::Error::custom),
            _ => Err(de::Error::custom("Missing vocab/merges")),
        }
    }
}

/// `"merges"`: all pairs (`["a", "b"]`) or all lines (`"a b"`, `#version` lines skipped), as the
/// library accepts them; a mixed list is an error, as there.
struct MergeList;

/// One element of `"merges"`.
enum Merge {
    Pair(String, String),
    Line(String),
}

impl<'de> Deserialize<'de> for Merge {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct MergeVisitor;

        impl<'de> Visitor<'de> for MergeVisitor {
            type Value = Merge;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a merge: a pair of strings or a line \"a b\"")
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<Merge, E> {
                Ok(Merge::Line(s.to_owned()))
            }

            fn visit_string<E: de::Error>(self, s: String) -> Result<Merge, E> {
                Ok(Merge::Line(s))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Merge, A::Error> {
                let a: String = seq
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(0, &self))?;
                let b: String = seq
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(1, &self))?;
                if seq.next_element::<IgnoredAny>()?.is_some() {
                    return Err(de::Error::invalid_length(3, &self));
                }
                Ok(Merge::Pair(a, b))
            }
        }

        d.deserialize_any(MergeVisitor)
    }
}

impl<'de> DeserializeSeed<'de> for MergeList {
    type Value = Merges;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Merges, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for MergeList {
    type Value = Merges;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of merges")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Merges, A::Error> {
        let mut merges = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        // Whether the list is of pairs (true) or of lines (false), from its first element.
        let mut pairs = None;
        let mut rank = 0usize;
        while let Some(merge) = seq.next_element::<Merge>()? {
            let is_pair = matches!(merge, Merge::Pair(..));
            if *pairs.get_or_insert(is_pair) != is_pair {
                return Err(de::Error::custom("merges mix pairs and lines"));
            }
            match merge {
                Merge::Pair(a, b) => merges.push((a, b)),
                Merge::Line(line) if line.starts_with("#version") => {}
                Merge::Line(line) => {
                    rank += 1;
                    let mut parts = line.split(' ');
                    match (parts.next(), parts.next(), parts.next()) {
                        (Some(a), Some(b), None) => merges.push((a.to_owned(), b.to_owned())),
                        _ => return Err(de::Error::custom(format!("bad merge at rank {rank}"))),
                    }
                }
            }
        }
        Ok(merges)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn both(json: &str) -> (String, String) {
        let ours = parse_streamed(json).unwrap().to_string(false).unwrap();
        let theirs = json.parse::<Tokenizer>().unwrap().to_string(false).unwrap();
        (ours, theirs)
    }

    #[test]
    fn the_mini_model_streamed_is_the_librarys() {
        let (ours, theirs) = both(crate::MINI_TOKENIZER_JSON);
        assert_eq!(ours, theirs);
    }

    /// The real Qwen3 file (`ps_test_support::fixtures::qwen3_dir`, as the golden tests find it;
    /// skipped without it unless `POLICY_SERVING_REQUIRE_FIXTURES=1`).
    #[test]
    fn qwen3_streamed_is_the_librarys() {
        let Some(dir) = ps_test_support::fixtures::qwen3_dir() else {
            return;
        };
        let (ours, theirs) = both(&std::fs::read_to_string(dir.join("tokenizer.json")).unwrap());
        assert_eq!(ours, theirs);
    }

    /// A small BPE file in each accepted shape: merges as lines (with a `#version` line) and as
    /// pairs, an added token, an unknown key in the model (which the library ignores).
    fn small(merges: &str, extra_model_key: &str) -> String {
        format!(
            r#"{{"version": "1.0", "truncation": null, "padding": null,
              "added_tokens": [{{"id": 6, "content": "<|x|>", "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": true}}],
              "normalizer": null, "pre_tokenizer": {{"type": "Whitespace"}},
              "post_processor": null, "decoder": null,
              "model": {{"type": "BPE", "dropout": null, "unk_token": "u", {extra_model_key}
                "continuing_subword_prefix": null, "end_of_word_suffix": null,
                "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": {{"u": 0, "a": 1, "b": 2, "ab": 3, "c": 4, "abc": 5}},
                "merges": {merges}}}}}"#
        )
    }

    #[test]
    fn merges_as_lines_or_pairs_and_unknown_keys_read_as_the_library_reads_them() {
        for json in [
            small(r#"["a b", "ab c"]"#, ""),
            small(r##"["#version: 0.2", "a b", "ab c"]"##, ""),
            small(r#"[["a", "b"], ["ab", "c"]]"#, ""),
        ] {
            let (ours, theirs) = both(&json);
            assert_eq!(ours, theirs, "{json}");
            let tok = parse_tokenizer(&json).unwrap();
            let ids = tok
                .encode("abc ab <|x|>", false)
                .unwrap()
                .get_ids()
                .to_vec();
            assert_eq!(ids, vec![5, 3, 6]);
        }
    }

    #[test]
    fn what_the_reader_does_not_take_goes_to_the_library_with_its_errors() {
        // Mixed merges: refused by both.
        let mixed = small(r#"["a b", ["ab", "c"]]"#, "");
        assert!(parse_streamed(&mixed).is_err());
        assert!(parse_tokenizer(&mixed).is_err());
        // A model without a type: the library's guess, same result.
        let untyped = small(r#"["a b", "ab c"]"#, "").replace(r#""type": "BPE", "#, "");
        assert!(parse_streamed(&untyped).is_err());
        let via_fallback = parse_tokenizer(&untyped).unwrap().to_string(false).unwrap();
        let library = untyped
            .parse::<Tokenizer>()
            .unwrap()
            .to_string(false)
            .unwrap();
        assert_eq!(via_fallback, library);
        // Another model type: the library's.
        let wordlevel = r#"{"version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [], "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"u": 0, "a": 1}, "unk_token": "u"}}"#;
        assert!(parse_streamed(wordlevel).is_err());
        assert_eq!(
            parse_tokenizer(wordlevel)
                .unwrap()
                .encode("a", false)
                .unwrap()
                .get_ids(),
            &[1]
        );
        // An unknown key in the model: the library ignores it, this reader leaves it to the
        // library (a later `tokenizers` may honour it), so the result is the library's.
        let noted = small(r#"[["a", "b"], ["ab", "c"]]"#, r#""note": {"x": [1]},"#);
        assert!(parse_streamed(&noted).is_err());
        assert_eq!(
            parse_tokenizer(&noted).unwrap().to_string(false).unwrap(),
            noted
                .parse::<Tokenizer>()
                .unwrap()
                .to_string(false)
                .unwrap()
        );
        // Every option of the model set away from its default reads as the library reads it
        // (`continuing_subword_prefix` too, but it needs merges written for it; Qwen3 sets it).
        let options = small(r#"["a b", "ab c"]"#, "")
            .replace(
                r#""dropout": null"#,
                r#""dropout": 0.1000000052154064178466796874999999999999"#,
            )
            .replace(
                r#""end_of_word_suffix": null"#,
                r#""end_of_word_suffix": "</w>""#,
            )
            .replace(r#""fuse_unk": false"#, r#""fuse_unk": true"#)
            .replace(r#""byte_fallback": false"#, r#""byte_fallback": true"#)
            .replace(r#""ignore_merges": false"#, r#""ignore_merges": true"#);
        let (ours, theirs) = both(&options);
        assert_eq!(ours, theirs, "{options}");
        // An unknown key at the top: refused by both.
        let unknown = small(r#"["a b", "ab c"]"#, "").replacen('{', r#"{"comment": [1],"#, 1);
        assert!(parse_streamed(&unknown).is_err());
        assert!(unknown.parse::<Tokenizer>().is_err());
        assert!(parse_tokenizer(&unknown).is_err());
        // Not a tokenizer at all: the library's error.
        let e = parse_tokenizer(r#"{"version": "2.0"}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("Unknown tokenizer version"), "{e}");
    }
}
