//! Chat templates and tokenization for one model: this crate owns loading a tokenizer directory
//! (`tokenizer.json` + `tokenizer_config.json`) and turning a chat turn into exactly the text and
//! token ids that HuggingFace `transformers.apply_chat_template` followed by
//! `tokenizer(text, add_special_tokens=False)` would produce, including the split of one turn into
//! prompt and response tokens used for RL samples ([`ChatTokenizer::split_turn`]) and the
//! `policy-serving tokenize` JSONL tool ([`tokenize_jsonl`]).
//!
//! It is synchronous and CPU-bound; it must not depend on web frameworks, HTTP clients or async
//! runtimes (callers run it on blocking threads). Its only project dependency is `ps-core`, for
//! message normalisation.
//!
//! About 1,080 lines: the whole `ChatTokenizer` API (loading, rendering, encoding, the
//! prompt/response split) stays in one place; the Python emulation, JSONL, the shared prefix
//! cache, the request's tools kept converted with what `tojson` printed of them
//! (`tools_cache.rs`) and the encoding of a text from an encoded one that differs in its middle
//! (`splice.rs`: the OPD teacher's hinted prompt from the turn's prompt) are modules of their own.

mod decode;
mod dump_options;
mod error;
mod jsonl;
mod load;
mod prefix_cache;
mod pyjson;
mod splice;
mod strftime;
mod template;
mod tools_cache;

use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use minijinja::Value as MjValue;
pub use ps_core::message::{image_parts, is_image_part};
use ps_core::message::{normalize_messages_with, normalize_response_message};
pub use ps_vision::{ImageLimits, ImageProcessor, PREPROCESSOR_CONFIG_FILE};
use serde_json::{Map, Value};

pub use error::ChatTemplateError;
pub use jsonl::{TokenizeStats, tokenize_jsonl};
pub use prefix_cache::{
    DEFAULT_SHARED_PREFIX_BYTES, ENTRY_OVERHEAD_BYTES, MIN_SHARED_PREFIX_BYTES, SharedPrefixCache,
    SharedPrefixStats,
};

use template::{Templates, TokenizerConfig};

/// Name of the optional template file that, when present in a tokenizer directory, replaces the
/// config's `chat_template` (as transformers does).
const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

const MINI_TOKENIZER_JSON: &str = include_str!("../../../config/mini-model/tokenizer.json");
const MINI_TOKENIZER_CONFIG_JSON: &str =
    include_str!("../../../config/mini-model/tokenizer_config.json");
const MINI_VL_TOKENIZER_JSON: &str = include_str!("../../../config/mini-vl-model/tokenizer.json");
const MINI_VL_TOKENIZER_CONFIG_JSON: &str =
    include_str!("../../../config/mini-vl-model/tokenizer_config.json");
const MINI_VL_PREPROCESSOR_CONFIG_JSON: &str =
    include_str!("../../../config/mini-vl-model/preprocessor_config.json");

/// The token a Qwen-VL-style template writes once per image, which the processor repeats to the
/// image's token count.
pub const IMAGE_PAD_TOKEN: &str = "<|image_pad|>";

/// How a vision-language model takes images: its processor (`preprocessor_config.json`) and the
/// id of its image pad token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vision {
    pub processor: ImageProcessor,
    pub image_pad_id: u32,
}

impl Vision {
    /// The lengths of the runs of image pad tokens in `ids`, in order: one per image of a
    /// prompt whose pads were expanded.
    pub fn pad_runs(&self, ids: &[u32]) -> Vec<usize> {
        ids.chunk_by(|a, b| a == b)
            .filter(|run| run[0] == self.image_pad_id)
            .map(<[u32]>::len)
            .collect()
    }
}

/// A model's tokenizer plus its compiled chat template.
///
/// Built once (the template is compiled and the special tokens are resolved in the constructor),
/// then shared: it is `Send + Sync` and every method takes `&self`.
pub struct ChatTokenizer {
    tokenizer: tokenizers::Tokenizer,
    /// XXH3-64 of what it was built from (see [`ChatTokenizer::fingerprint`]).
    fingerprint: u64,
    templates: Templates,
    special_tokens: Vec<(&'static str, MjValue)>,
    eos_token: Option<String>,
    eos_token_id: Option<u32>,
    clean_up_tokenization_spaces: bool,
    /// The added tokens (id → text), when a text can be encoded piecewise at their boundaries
    /// (`splice.cuts_cleanly`, decided once at load). `None` disables every reuse of this crate:
    /// [`ChatTokenizer::encode_incremental`]'s, the shared cache's and `splice.rs`'s.
    split_tokens: Option<std::collections::HashMap<u32, String>>,
    /// The added tokens' texts as the tokenizer finds them in a text (leftmost-longest, as
    /// `tokenizers`' own added-token matcher), kept with `split_tokens`.
    added_matcher: Option<aho_corasick::AhoCorasick>,
    /// What [`ChatTokenizer::encode_around`] needs to know of the added tokens (`splice.rs`).
    splice: splice::AddedTokenFacts,
    /// The last tool lists rendered, converted (`tools_cache.rs`).
    tools: tools_cache::ToolsCache,
    /// Each id's bytes, for [`ChatTokenizer::decode`] of a byte-level tokenizer (`decode.rs`).
    byte_table: decode::LazyByteTable,
    /// A vision-language model's image handling, when the directory has a
    /// `preprocessor_config.json`: messages keep their image parts for the template, and
    /// [`ChatTokenizer::expand_image_pads`] repeats each pad to its image's count.
    vision: Option<Vision>,
}

impl fmt::Debug for ChatTokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTokenizer")
            .field("vocab_size", &self.tokenizer.get_vocab_size(true))
            .field("eos_token", &self.eos_token)
            .field("eos_token_id", &self.eos_token_id)
            .field("templates", &self.templates)
            .finish_non_exhaustive()
    }
}

/// One chat turn as the proxy sees it: the request and the upstream's answer, both raw.
#[derive(Debug, Clone, Copy)]
pub struct TurnInput<'a> {
    /// Request messages exactly as the client sent them (normalised by [`ChatTokenizer::split_turn`]).
    pub messages: &'a [Value],
    /// The request's `tools`, when it has the key (it may be `[]`).
    pub tools: Option<&'a Value>,
    /// The assistant message as the policy server returned it.
    pub response_message: &'a Value,
    /// Extra template variables (`chat_template_kwargs`, e.g. `enable_thinking`).
    pub template_kwargs: Option<&'a Map<String, Value>>,
}

/// A turn rendered and tokenized: what one RL training sample is made of.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TurnTokens {
    /// The conversation rendered with the generation prompt.
    pub prompt_text: String,
    /// The conversation plus the response, rendered without the generation prompt.
    pub full_text: String,
    /// `full_text` minus the `prompt_text` prefix, or all of `full_text` when it is not a prefix.
    pub response_text: String,
    /// Whether `full_text` starts with `prompt_text`.
    pub prompt_is_prefix: bool,
    /// Token ids of `prompt_text`.
    pub prompt_ids: Vec<u32>,
    /// Token ids of `response_text`, tokenized on its own.
    pub response_ids: Vec<u32>,
}

/// A turn rendered but not tokenized: the texts of [`TurnTokens`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnTexts {
    pub prompt_text: String,
    pub full_text: String,
    pub response_text: String,
    pub prompt_is_prefix: bool,
}

/// The image handling of a model directory's `preprocessor_config.json` (its text): a Qwen-VL
/// image processor (`image_processor_type` of the `Qwen2VLImageProcessor` family, which Qwen2-VL
/// to Qwen3.5 use, or none named) with an `<|image_pad|>` token in the tokenizer; why not
/// otherwise (another model family's processor, whose images this proxy does not model).
fn vision_of(tokenizer: &tokenizers::Tokenizer, text: &str) -> Result<Vision, String> {
    let kind = serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| v.get("image_processor_type")?.as_str().map(str::to_owned));
    if let Some(kind) = kind.filter(|k| !k.starts_with("Qwen2VLImageProcessor")) {
        return Err(format!(
            "the image processor {kind} is not a Qwen-VL one (Qwen2VLImageProcessor), the only \
             kind whose images this proxy counts"
        ));
    }
    let processor =
        ImageProcessor::from_json(text, PREPROCESSOR_CONFIG_FILE).map_err(|e| e.to_string())?;
    let image_pad_id = tokenizer
        .token_to_id(IMAGE_PAD_TOKEN)
        .ok_or_else(|| format!("the tokenizer has no {IMAGE_PAD_TOKEN} token"))?;
    Ok(Vision {
        processor,
        image_pad_id,
    })
}

/// An image of a turn's prompt and the number of pad tokens it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnImage {
    pub image: ps_vision::Image,
    pub tokens: usize,
}

/// Why a turn's images cannot be captured.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error(
        "the turn has images and the model directory has no preprocessor_config.json: a text \
         model's samples cannot hold images (serve a vision-language model's directory to \
         capture them)"
    )]
    NoVision,
    #[error(transparent)]
    Image(#[from] ps_vision::VisionError),
}

impl ImageError {
    /// The turn's drop reason.
    pub fn reason(&self) -> &'static str {
        match self {
            ImageError::NoVision => "image_unsupported",
            ImageError::Image(e) => e.reason(),
        }
    }
}

/// The files [`ChatTokenizer::from_dir`] reads from a model directory (the last two optional).
pub const TOKENIZER_FILES: [&str; 4] = [
    "tokenizer.json",
    "tokenizer_config.json",
    CHAT_TEMPLATE_FILE,
    PREPROCESSOR_CONFIG_FILE,
];

/// Tokenizers built by this process (every constructor of [`ChatTokenizer`] counts one).
static BUILT: AtomicU64 = AtomicU64::new(0);

/// Whether two model directories give the same [`ChatTokenizer`]: the same directory, or the same
/// bytes in each of [`TOKENIZER_FILES`] (the optional `chat_template.jinja` and
/// `preprocessor_config.json` may be absent from both). Reads the files, so call it where blocking is fine; a directory that cannot be read is
/// not the same.
pub fn same_tokenizer_dir(a: &Path, b: &Path) -> bool {
    if let (Ok(a), Ok(b)) = (a.canonicalize(), b.canonicalize())
        && a == b
    {
        return true;
    }
    TOKENIZER_FILES.iter().all(|name| {
        let read = |dir: &Path| match std::fs::read(dir.join(name)) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    && [CHAT_TEMPLATE_FILE, PREPROCESSOR_CONFIG_FILE].contains(name) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        };
        matches!((read(a), read(b)), (Ok(x), Ok(y)) if x == y)
    })
}

fn read_file(path: &Path) -> Result<String, ChatTemplateError> {
    std::fs::read_to_string(path).map_err(|source| ChatTemplateError::ReadFile {
        path: path.to_owned(),
        source,
    })
}

impl ChatTokenizer {
    /// Loads `tokenizer.json` and `tokenizer_config.json` from a model directory. A
    /// `chat_template.jinja` file next to them, if present, replaces the config's template.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self, ChatTemplateError> {
        let dir = dir.as_ref();
        let tok_path = dir.join("tokenizer.json");
        let cfg_path = dir.join("tokenizer_config.json");
        let template_path = dir.join(CHAT_TEMPLATE_FILE);
        let template_override = if template_path.is_file() {
            Some(read_file(&template_path)?)
        } else {
            None
        };
        let processor_path = dir.join(PREPROCESSOR_CONFIG_FILE);
        let processor = if processor_path.is_file() {
            Some((
                read_file(&processor_path)?,
                processor_path.display().to_string(),
            ))
        } else {
            None
        };
        Self::build_with(
            &read_file(&tok_path)?,
            &tok_path.display().to_string(),
            &read_file(&cfg_path)?,
            &cfg_path.display().to_string(),
            template_override,
            processor.as_ref().map(|(t, o)| (t.as_str(), o.as_str())),
        )
    }

    /// Loads a tokenizer and its config from explicit paths.
    pub fn from_files(
        tokenizer_json: &Path,
        tokenizer_config_json: &Path,
    ) -> Result<Self, ChatTemplateError> {
        Self::build(
            &read_file(tokenizer_json)?,
            &tokenizer_json.display().to_string(),
            &read_file(tokenizer_config_json)?,
            &tokenizer_config_json.display().to_string(),
            None,
        )
    }

    /// Builds from the contents of `tokenizer.json` and `tokenizer_config.json`.
    pub fn from_json_strs(
        tokenizer_json: &str,
        tokenizer_config_json: &str,
    ) -> Result<Self, ChatTemplateError> {
        Self::build(
            tokenizer_json,
            "<tokenizer.json string>",
            tokenizer_config_json,
            "<tokenizer_config.json string>",
            None,
        )
    }

    /// The small self-made model of `config/mini-model` (a byte-level BPE of about a thousand tokens
    /// with a Qwen3-like ChatML template), embedded in the binary for demos and tests.
    ///
    /// # Panics
    /// Never in practice: the embedded files are checked by this crate's tests.
    #[allow(clippy::panic)]
    pub fn mini() -> Self {
        match Self::from_json_strs(MINI_TOKENIZER_JSON, MINI_TOKENIZER_CONFIG_JSON) {
            Ok(tok) => tok,
            Err(e) => panic!("the embedded mini model (config/mini-model) is invalid: {e}"),
        }
    }

    /// The mini model with images (`config/mini-vl-model`): the mini tokenizer plus the vision
    /// tokens, its template writing image parts as Qwen-VL templates do, and a small Qwen-VL
    /// image processor (at most 64 tokens an image), embedded for the demo and tests.
    ///
    /// # Panics
    /// Never in practice: the embedded files are checked by this crate's tests.
    #[allow(clippy::panic)]
    pub fn mini_vl() -> Self {
        match Self::build_with(
            MINI_VL_TOKENIZER_JSON,
            "<mini-vl tokenizer.json>",
            MINI_VL_TOKENIZER_CONFIG_JSON,
            "<mini-vl tokenizer_config.json>",
            None,
            Some((
                MINI_VL_PREPROCESSOR_CONFIG_JSON,
                "<mini-vl preprocessor_config.json>",
            )),
        ) {
            Ok(tok) => tok,
            Err(e) => panic!("the embedded mini-vl model (config/mini-vl-model) is invalid: {e}"),
        }
    }

    /// How many tokenizers this process has built (parsed from files or strings, the mini model
    /// included): the composition root's tests check that the policy, judges, teacher and capture
    /// share one.
    pub fn built_count() -> u64 {
        BUILT.load(Ordering::Relaxed)
    }

    fn build(
        tokenizer_json: &str,
        tokenizer_origin: &str,
        config_json: &str,
        config_origin: &str,
        template_override: Option<String>,
    ) -> Result<Self, ChatTemplateError> {
        Self::build_with(
            tokenizer_json,
            tokenizer_origin,
            config_json,
            config_origin,
            template_override,
            None,
        )
    }

    /// [`ChatTokenizer::build`] with a `preprocessor_config.json`'s text and origin.
    fn build_with(
        tokenizer_json: &str,
        tokenizer_origin: &str,
        config_json: &str,
        config_origin: &str,
        template_override: Option<String>,
        processor: Option<(&str, &str)>,
    ) -> Result<Self, ChatTemplateError> {
        BUILT.fetch_add(1, Ordering::Relaxed);
        let mut fingerprint =
            fingerprint_of(tokenizer_json, config_json, template_override.as_deref());
        if let Some((text, _)) = processor {
            // The pad counts depend on it: a turn persisted under one processor is not resumed
            // under another. Text models keep the fingerprint they had.
            fingerprint ^= xxhash_rust::xxh3::xxh3_64(text.as_bytes()).rotate_left(1);
        }
        // Streamed into the model's maps rather than through the library's intermediate trees:
        // the same tokenizer at a fraction of the start-up peak (`load.rs`).
        let mut tokenizer = load::parse_tokenizer(tokenizer_json).map_err(|source| {
            ChatTemplateError::TokenizerJson {
                origin: tokenizer_origin.to_owned(),
                source,
            }
        })?;
        // transformers disables truncation and padding for a plain `tokenizer(text)` call.
        tokenizer
            .with_truncation(None)
            .map_err(|source| ChatTemplateError::TokenizerJson {
                origin: tokenizer_origin.to_owned(),
                source,
            })?;
        tokenizer.with_padding(None);

        let cfg = TokenizerConfig::parse(config_origin, config_json, template_override)?;
        let templates = Templates::compile(&cfg)?;
        let eos_token_id = cfg
            .eos_token
            .as_deref()
            .and_then(|t| tokenizer.token_to_id(t));
        // The one condition for every splice: `split_tokens` is kept only when cuts at added
        // tokens split the ids (`splice.rs`).
        let splice = splice::AddedTokenFacts::of(&tokenizer);
        let split_tokens: Option<std::collections::HashMap<u32, String>> =
            splice.cuts_cleanly.then(|| {
                tokenizer
                    .get_added_tokens_decoder()
                    .iter()
                    .map(|(id, t)| (*id, t.content.clone()))
                    .collect()
            });
        // The matcher cannot fail to build for a tokenizer's few added tokens; if it did, the
        // tokenizer would simply not splice.
        let added_matcher = split_tokens.as_ref().and_then(|added| {
            aho_corasick::AhoCorasick::builder()
                .match_kind(aho_corasick::MatchKind::LeftmostLongest)
                .build(added.values().filter(|c| !c.is_empty()))
                .ok()
        });
        let split_tokens = split_tokens.filter(|_| added_matcher.is_some());
        let vision = processor.and_then(|(text, origin)| match vision_of(&tokenizer, text) {
            Ok(v) => Some(v),
            Err(why) => {
                tracing::warn!(
                    file = origin,
                    "{why}: this model is served as a text model (turns with images are not \
                     captured: image_unsupported)"
                );
                None
            }
        });
        Ok(Self {
            tokenizer,
            fingerprint,
            templates,
            special_tokens: cfg.special_tokens,
            eos_token: cfg.eos_token,
            eos_token_id,
            clean_up_tokenization_spaces: cfg.clean_up_tokenization_spaces,
            split_tokens,
            added_matcher,
            splice,
            tools: tools_cache::ToolsCache::default(),
            byte_table: decode::LazyByteTable::default(),
            vision,
        })
    }

    /// A vision-language model's image handling (`None`: a text model, whose turns with images
    /// are not captured).
    pub fn vision(&self) -> Option<&Vision> {
        self.vision.as_ref()
    }

    /// The request's messages as the template receives them (`ps_core::message`'s
    /// normalisation): content lists are kept as they are for a template that loops over a
    /// message's content, as engines hand them to such a template ([`Self::keeps_content_lists`]),
    /// and flattened for the others.
    pub fn normalize(&self, messages: &[Value]) -> Vec<Value> {
        normalize_messages_with(messages, self.templates.iterates_content)
    }

    /// Whether the template loops over a message's content (vLLM's and SGLang's "openai" content
    /// format): content lists reach it as they are, text parts joined by the template itself.
    pub fn keeps_content_lists(&self) -> bool {
        self.templates.iterates_content
    }

    /// The images of `messages` in prompt order, each read ([`ps_vision::read_image_part`]) and
    /// with the number of pad tokens this model's processor gives it. `Ok(empty)` without
    /// images; an error whose `reason()` drops the turn when one cannot be read, or when there
    /// are images and the model has no vision (`image_unsupported`).
    pub fn images(
        &self,
        messages: &[Value],
        limits: &ps_vision::ImageLimits,
    ) -> Result<Vec<TurnImage>, ImageError> {
        let mut parts = ps_core::message::image_parts(messages).peekable();
        if parts.peek().is_none() {
            return Ok(Vec::new());
        }
        let Some(v) = self.vision else {
            return Err(ImageError::NoVision);
        };
        let count = ps_core::message::image_parts(messages).count();
        if count > limits.max_images {
            return Err(ps_vision::VisionError::TooMany {
                count,
                limit: limits.max_images,
            }
            .into());
        }
        parts
            .map(|p| {
                let image = ps_vision::read_image_part(p, limits)?;
                let tokens = v.processor.pad_tokens(image.width, image.height)?;
                Ok(TurnImage { image, tokens })
            })
            .collect()
    }

    /// `ids` (a rendered prompt's) with the `i`-th image pad token repeated `counts[i]` times, as
    /// the processor expands the text before tokenizing (the pad is a special token: the text
    /// around it tokenizes alike either way). An error when the ids hold another number of pads
    /// than `counts` has entries, or the model has no vision.
    pub fn expand_image_pads(
        &self,
        ids: &[u32],
        counts: &[usize],
    ) -> Result<Vec<u32>, ChatTemplateError> {
        let Some(v) = self.vision else {
            return Err(ChatTemplateError::ImagePads {
                found: 0,
                images: counts.len(),
            });
        };
        let found = ids.iter().filter(|&&id| id == v.image_pad_id).count();
        if found != counts.len() {
            return Err(ChatTemplateError::ImagePads {
                found,
                images: counts.len(),
            });
        }
        let mut out = Vec::with_capacity(ids.len() + counts.iter().sum::<usize>());
        let mut next = counts.iter();
        for &id in ids {
            if id == v.image_pad_id {
                let n = next.next().copied().unwrap_or(1);
                out.extend(std::iter::repeat_n(id, n));
            } else {
                out.push(id);
            }
        }
        Ok(out)
    }

    /// Identifies the files this tokenizer was built from (`tokenizer.json`, `tokenizer_config.json`,
    /// and a `chat_template.jinja` and a vision model's `preprocessor_config.json` beside them): equal for the same files, different (but for a
    /// 64-bit hash collision) when any of them differs. What a turn persisted at shutdown carries,
    /// so that a restart with another tokenizer or template does not train on ids it did not make.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Renders already-normalised `messages` with the chat template, as
    /// `apply_chat_template(messages, tools=tools, add_generation_prompt=.., tokenize=False, **template_kwargs)`.
    pub fn render(
        &self,
        messages: &[Value],
        tools: Option<&Value>,
        add_generation_prompt: bool,
        template_kwargs: Option<&Map<String, Value>>,
    ) -> Result<String, ChatTemplateError> {
        let messages: Vec<MjValue> = messages.iter().map(json_to_value).collect();
        let prepared = self.prepare(tools, template_kwargs);
        self.render_prepared(messages, &prepared, add_generation_prompt)
    }

    /// The tools and keyword arguments of a render as template values; the tools from the cache
    /// of converted lists.
    fn prepare(
        &self,
        tools: Option<&Value>,
        template_kwargs: Option<&Map<String, Value>>,
    ) -> Prepared {
        let tools = tools.filter(|t| !t.is_null()).map(|t| self.tools.get(t));
        Prepared {
            // transformers passes `tools=None` when the request has none: defined, and none.
            tools: tools
                .as_ref()
                .map_or_else(|| MjValue::from(()), |e| e.value().clone()),
            tools_entry: tools,
            kwargs: template_kwargs
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), json_to_value(v)))
                .collect(),
        }
    }

    fn render_prepared(
        &self,
        messages: Vec<MjValue>,
        prepared: &Prepared,
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let name = self.templates.select(prepared.tools_entry.is_some())?;
        let _printing = tools_cache::RenderingWith::new(prepared.tools_entry.clone());
        // Same precedence as transformers: special tokens, then kwargs, then the named arguments.
        let ctx = MjValue::from_pairs(
            self.special_tokens
                .iter()
                .map(|(k, v)| (*k, v.clone()))
                .chain(prepared.kwargs.iter().map(|(k, v)| (k.as_str(), v.clone())))
                .chain([
                    ("messages", MjValue::from(messages)),
                    ("tools", prepared.tools.clone()),
                    ("documents", MjValue::from(())),
                    (
                        "add_generation_prompt",
                        MjValue::from(add_generation_prompt),
                    ),
                ]),
        );
        self.templates.render(name, ctx)
    }

    /// The ids of `text`, reusing `prev` (an earlier text of the same conversation with its ids) up to
    /// the last added-token boundary inside their common prefix, and the state to reuse next time.
    ///
    /// The tokenizer splits added tokens (such as `<|im_start|>`) out of a text before normalising
    /// and pre-tokenizing the pieces between them, so for a prefix that ends right after one,
    /// `encode(prefix + rest) == encode(prefix) ++ encode(rest)`. A conversation's next prompt
    /// repeats the previous prompt's history, so only what a turn adds (and what the template
    /// re-renders differently, back to the last boundary before it) is encoded again. The result is
    /// always exactly [`ChatTokenizer::encode`]'s.
    pub fn encode_incremental(
        &self,
        text: &str,
        prev: Option<&EncodedPrefix>,
    ) -> Result<(Vec<u32>, Option<EncodedPrefix>), ChatTemplateError> {
        self.encode_cached(text, prev, None)
    }

    /// [`ChatTokenizer::encode_incremental`], and when `prev` has nothing to reuse, the longest
    /// prefix of `text` kept in `shared` (another session's system prompt and tools, say) is reused
    /// instead. Nothing is added to `shared` here ([`ChatTokenizer::split_turn_cached`] does).
    /// The result is always exactly [`ChatTokenizer::encode`]'s.
    pub fn encode_cached(
        &self,
        text: &str,
        prev: Option<&EncodedPrefix>,
        shared: Option<&SharedPrefixCache>,
    ) -> Result<(Vec<u32>, Option<EncodedPrefix>), ChatTemplateError> {
        self.encode_reusing(text, prev, shared)
            .map(|(ids, next, _)| (ids, next))
    }

    fn encode_reusing(
        &self,
        text: &str,
        prev: Option<&EncodedPrefix>,
        shared: Option<&SharedPrefixCache>,
    ) -> Result<(Vec<u32>, Option<EncodedPrefix>, Reused), ChatTemplateError> {
        let (Some(added), Some(matcher)) = (&self.split_tokens, &self.added_matcher) else {
            return Ok((self.encode(text)?, None, Reused::Nothing));
        };
        let (ids, reused) = match prev.and_then(|p| p.reusable(text).map(|r| (p, r))) {
            Some((p, (end, n))) => {
                let mut ids = p.ids[..n].to_vec();
                ids.extend(self.encode(&text[end..])?);
                (ids, Reused::Session)
            }
            None => {
                // Only a prefix that ends right after an added token can be reused.
                let ends_with_added = |len: usize| {
                    added
                        .values()
                        .any(|c| !c.is_empty() && text[..len].ends_with(c.as_str()))
                };
                match shared.and_then(|c| c.lookup(text, ends_with_added)) {
                    Some((end, head)) => {
                        let mut ids = Vec::with_capacity(head.len() + (text.len() - end) / 3);
                        ids.extend_from_slice(&head);
                        ids.extend(self.encode(&text[end..])?);
                        (ids, Reused::Shared)
                    }
                    None => (self.encode(text)?, Reused::Nothing),
                }
            }
        };
        let boundaries = added_token_boundaries(text, &ids, added, matcher, self.splice.min_id);
        Ok((
            ids.clone(),
            Some(EncodedPrefix {
                text: text.to_owned(),
                ids,
                boundaries,
            }),
            reused,
        ))
    }

    /// Whether encodings are spliced at added tokens (reusing encoded prefixes, the shared cache,
    /// [`ChatTokenizer::encode_around`]): decided once at load, and false for a tokenizer whose
    /// texts do not encode piecewise at its added tokens. When false every text is encoded whole
    /// and callers gain nothing from keeping encoded prefixes.
    pub fn splices(&self) -> bool {
        self.split_tokens.is_some()
    }

    /// Token ids of `text`, as `tokenizer(text, add_special_tokens=False)["input_ids"]`.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ChatTemplateError> {
        self.tokenizer
            .encode_fast(text, false)
            .map(|enc| enc.get_ids().to_vec())
            .map_err(|source| ChatTemplateError::Encode {
                len: text.len(),
                source,
            })
    }

    /// The text of one token decoded on its own with special tokens kept (what SGLang reports as
    /// the `token` of a log-prob entry). Unknown ids give an empty string; a token that is only part
    /// of a UTF-8 character gives U+FFFD, as in Python.
    pub fn token_text(&self, id: u32) -> String {
        self.decode(&[id], false)
    }

    /// The text of `ids` decoded together (`tokenizer.decode(ids, skip_special_tokens=...)`):
    /// bytes split across tokens are joined before they are read. Engines write their answers'
    /// text with special tokens skipped (SGLang's and vLLM's default).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> String {
        let text = self.decode_verbatim(ids, skip_special_tokens);
        if self.clean_up_tokenization_spaces {
            clean_up_tokenization(&text)
        } else {
            text
        }
    }

    /// [`ChatTokenizer::decode`] without the config's `clean_up_tokenization_spaces` (which
    /// `transformers` applies to decoded text, never to a rendered prompt): the text the ids were
    /// encoded from, when they were encoded from a text.
    pub fn decode_verbatim(&self, ids: &[u32], skip_special_tokens: bool) -> String {
        match self.byte_table.get(&self.tokenizer) {
            Some(table) => table.decode(ids, skip_special_tokens),
            None => self.decode_slow(ids, skip_special_tokens),
        }
    }

    /// Whether [`ChatTokenizer::decode`] reads a table of each id's bytes (a byte-level
    /// tokenizer's) rather than asking `tokenizers`.
    #[doc(hidden)]
    pub fn decodes_from_table(&self) -> bool {
        self.byte_table.get(&self.tokenizer).is_some()
    }

    /// `tokenizers`' own decoding (what [`ChatTokenizer::decode_verbatim`] gives, by another road).
    #[doc(hidden)]
    pub fn decode_slow(&self, ids: &[u32], skip_special_tokens: bool) -> String {
        self.tokenizer
            .decode(ids, skip_special_tokens)
            .unwrap_or_default()
    }

    /// The end-of-sequence token of the config (`eos_token`), if any.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// Number of ids the tokenizer can produce, added (special) tokens included.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// The id of [`Self::eos_token`] in the vocabulary.
    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos_token_id
    }

    /// Splits one turn into prompt and response text and tokens, exactly as the reference server:
    /// the prompt is the normalised conversation rendered with the generation prompt, the full text
    /// adds the normalised response and no generation prompt, the response text is what follows the
    /// prompt (all of the full text when the prompt is not a prefix of it), and prompt and response
    /// are tokenized separately.
    pub fn split_turn(&self, input: &TurnInput<'_>) -> Result<TurnTokens, ChatTemplateError> {
        self.split_turn_incremental(input, None).map(|(t, _)| t)
    }

    /// [`ChatTokenizer::split_turn`], encoding the prompt with [`ChatTokenizer::encode_incremental`]
    /// from the previous turn's prefix; returns the prefix for the next turn too. Same result.
    pub fn split_turn_incremental(
        &self,
        input: &TurnInput<'_>,
        prev: Option<&EncodedPrefix>,
    ) -> Result<(TurnTokens, Option<EncodedPrefix>), ChatTemplateError> {
        self.split_turn_cached(input, prev, None)
    }

    /// [`ChatTokenizer::split_turn_incremental`] with a cache of prefixes shared by all sessions:
    /// a prompt that `prev` cannot help with (a session's first turn) reuses the longest kept
    /// prefix (see [`ChatTokenizer::encode_cached`]); when none is kept, the prompt's leading
    /// system message(s) and tools, up to their last added-token boundary, are kept for the next
    /// session. Same result as [`ChatTokenizer::split_turn`].
    pub fn split_turn_cached(
        &self,
        input: &TurnInput<'_>,
        prev: Option<&EncodedPrefix>,
        shared: Option<&SharedPrefixCache>,
    ) -> Result<(TurnTokens, Option<EncodedPrefix>), ChatTemplateError> {
        let TurnTexts {
            prompt_text,
            full_text,
            response_text,
            prompt_is_prefix,
        } = self.render_turn(input)?;
        let (prompt_ids, next, reused) = self.encode_reusing(&prompt_text, prev, shared)?;
        if let (Some(shared), Some(next), Reused::Nothing) = (shared, &next, reused) {
            self.share_leading_system(input, next, shared);
        }
        let response_ids = self.encode(&response_text)?;
        Ok((
            TurnTokens {
                prompt_text,
                full_text,
                response_text,
                prompt_is_prefix,
                prompt_ids,
                response_ids,
            },
            next,
        ))
    }

    /// Keeps in `shared` the part of `encoded` (a prompt of `input`, encoded in full) that every
    /// conversation with the same leading system message(s) and tools renders alike: up to the last
    /// added-token boundary within the common prefix of the prompt and those messages rendered with
    /// a placeholder user message. Whatever is kept is a prefix of the prompt cut at one of its own
    /// boundaries, so its ids are exactly its own; the placeholder only chooses where to cut.
    fn share_leading_system(
        &self,
        input: &TurnInput<'_>,
        encoded: &EncodedPrefix,
        shared: &SharedPrefixCache,
    ) {
        let normalized = self.normalize(input.messages);
        let leading = leading_system_messages(&normalized);
        let has_tools = input.tools.is_some_and(|t| !t.is_null());
        if leading == 0 && !has_tools {
            return;
        }
        let Some(common) = self.leading_system_prefix_len(
            &normalized[..leading],
            input.tools,
            input.template_kwargs,
            &encoded.text,
        ) else {
            return;
        };
        let k = encoded
            .boundaries
            .partition_point(|(end, _)| *end <= common);
        if let Some(&(end, n)) = k.checked_sub(1).map(|k| &encoded.boundaries[k]) {
            shared.insert(&encoded.text[..end], &encoded.ids[..n]);
        }
    }

    /// How much of `text` (a rendered prompt) every conversation that starts with the normalised
    /// `system` messages and has the same `tools` and kwargs renders alike: the length of the
    /// common prefix of `text` and those messages rendered with a placeholder user message after
    /// them. Comparing renders (not searching for the first message's text) stays right when that
    /// text also occurs in the system prompt or tools. `None` when the render fails.
    pub fn leading_system_prefix_len(
        &self,
        system: &[Value],
        tools: Option<&Value>,
        template_kwargs: Option<&Map<String, Value>>,
        text: &str,
    ) -> Option<usize> {
        let mut probe: Vec<MjValue> = system.iter().map(json_to_value).collect();
        probe.push(json_to_value(
            &serde_json::json!({"role": "user", "content": "\u{1}"}),
        ));
        let prepared = self.prepare(tools, template_kwargs);
        let rendered = self.render_prepared(probe, &prepared, false).ok()?;
        Some(
            rendered
                .bytes()
                .zip(text.bytes())
                .take_while(|(a, b)| a == b)
                .count(),
        )
    }

    /// Renders a turn as [`ChatTokenizer::split_turn`] does, without tokenizing: for turns whose
    /// ids come from the engine, the texts are what the judges read.
    pub fn render_turn(&self, input: &TurnInput<'_>) -> Result<TurnTexts, ChatTemplateError> {
        self.render_turn_after(input, None)
    }

    /// [`ChatTokenizer::render_turn`] with the prompt's text already known (an engine-id turn's
    /// prompt ids decoded): the whole conversation is rendered once, and where that render starts
    /// with `known_prompt` the prompt is taken as it is and the response is the rest. Otherwise
    /// (the engine's template or tokenizer differs from ours, a normalizer changed a character, a
    /// vision prompt's pads were expanded) the prompt is rendered too, as `render_turn` does: the
    /// texts are then the same as without `known_prompt`.
    pub fn render_turn_after(
        &self,
        input: &TurnInput<'_>,
        known_prompt: Option<String>,
    ) -> Result<TurnTexts, ChatTemplateError> {
        let prepared = self.prepare(input.tools, input.template_kwargs);
        let messages: Vec<MjValue> = self
            .normalize(input.messages)
            .iter()
            .map(json_to_value)
            .collect();
        // Values of minijinja share their maps: a copy of the list costs one count per message.
        let with_response = |mut m: Vec<MjValue>| {
            m.push(json_to_value(&normalize_response_message(
                input.response_message,
            )));
            m
        };
        let (prompt_text, full_text) = match known_prompt {
            None => {
                let prompt_text = self.render_prepared(messages.clone(), &prepared, true)?;
                let full = self.render_prepared(with_response(messages), &prepared, false)?;
                (prompt_text, full)
            }
            Some(known) => {
                let full =
                    self.render_prepared(with_response(messages.clone()), &prepared, false)?;
                if full.starts_with(known.as_str()) {
                    (known, full)
                } else {
                    (self.render_prepared(messages, &prepared, true)?, full)
                }
            }
        };
        let (prompt_is_prefix, response_text) = match full_text.strip_prefix(prompt_text.as_str()) {
            Some(rest) => (true, rest.to_owned()),
            None => (false, full_text.clone()),
        };
        Ok(TurnTexts {
            prompt_text,
            full_text,
            response_text,
            prompt_is_prefix,
        })
    }
}

/// XXH3-64 over the inputs of [`ChatTokenizer::build`], each part's length first so that no two
/// different inputs run together into the same bytes.
fn fingerprint_of(tokenizer_json: &str, config_json: &str, template: Option<&str>) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for part in [Some(tokenizer_json), Some(config_json), template] {
        match part {
            Some(p) => {
                h.update(&(p.len() as u64).to_le_bytes());
                h.update(p.as_bytes());
            }
            None => h.update(&u64::MAX.to_le_bytes()),
        }
    }
    h.digest()
}

/// How many of the normalised `messages` are leading `system` or `developer` messages (what
/// [`ChatTokenizer::leading_system_prefix_len`] renders).
pub fn leading_system_messages(messages: &[Value]) -> usize {
    messages
        .iter()
        .take_while(|m| {
            matches!(
                m.get("role").and_then(Value::as_str),
                Some("system" | "developer")
            )
        })
        .count()
}

/// Where the start of an encoded text came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reused {
    Nothing,
    Session,
    Shared,
}

/// A rendered text with its token ids and the places right after each added token (byte end in the
/// text, ids up to there), for [`ChatTokenizer::encode_incremental`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncodedPrefix {
    pub text: String,
    pub ids: Vec<u32>,
    /// `(byte end, id count)` after each added token, in text order.
    pub boundaries: Vec<(usize, usize)>,
}

impl EncodedPrefix {
    /// The last boundary inside the common prefix of `self.text` and `text`, if any.
    fn reusable(&self, text: &str) -> Option<(usize, usize)> {
        let common = self
            .text
            .bytes()
            .zip(text.bytes())
            .take_while(|(a, b)| a == b)
            .count();
        let k = self.boundaries.partition_point(|(end, _)| *end <= common);
        k.checked_sub(1).map(|k| self.boundaries[k])
    }
}

/// Where each added token of `ids` ends in `text`: the k-th added-token id is the k-th added-token
/// match of the text (the tokenizer extracts them left to right, leftmost-longest, as `matcher`
/// does). Any disagreement (an added id whose text is not the next match, a match skipped or left
/// over) means no boundary at all: the ids are not this text's encoding (ids from an older
/// tokenizer, say), and whatever reuses this encodes the whole text. Linear in the text.
fn added_token_boundaries(
    text: &str,
    ids: &[u32],
    added: &std::collections::HashMap<u32, String>,
    matcher: &aho_corasick::AhoCorasick,
    min_added_id: u32,
) -> Vec<(usize, usize)> {
    agreeing_boundaries(text, ids, added, matcher, min_added_id).unwrap_or_else(mismatch)
}

/// [`added_token_boundaries`], or `None` (neither counted nor logged) when the ids and the text
/// disagree on their added tokens.
fn agreeing_boundaries(
    text: &str,
    ids: &[u32],
    added: &std::collections::HashMap<u32, String>,
    matcher: &aho_corasick::AhoCorasick,
    min_added_id: u32,
) -> Option<Vec<(usize, usize)>> {
    let mut out = Vec::new();
    let mut matches = matcher.find_iter(text);
    for (i, id) in ids.iter().enumerate() {
        // Most ids are ordinary tokens below every added one: no lookup for them.
        if *id < min_added_id {
            continue;
        }
        let Some(content) = added.get(id).filter(|c| !c.is_empty()) else {
            continue;
        };
        match matches.next() {
            Some(m) if text[m.range()] == *content => out.push((m.end(), i + 1)),
            _ => return None,
        }
    }
    if matches.next().is_some() {
        return None;
    }
    Some(out)
}

/// Ids and text that disagree on their added tokens, for [`added_token_boundaries`]: counted
/// (tests read it through [`boundary_mismatches`]) and logged at debug level.
fn mismatch() -> Vec<(usize, usize)> {
    // Said once at warn (an operator sees that some ids disagree with their texts, e.g. turns
    // kept from before a tokenizer change), then at debug.
    if BOUNDARY_MISMATCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 {
        tracing::warn!(
            "token ids disagree with their text on added tokens (ids from another tokenizer?): \
             encoding such texts whole; later cases are logged at debug"
        );
    } else {
        tracing::debug!("ids and text disagree on their added tokens: encoding the whole text");
    }
    Vec::new()
}

static BOUNDARY_MISMATCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times, in this process, ids given with a text disagreed with it on their added tokens
/// (then nothing of them is reused and the whole text is encoded: the result stays exact).
pub fn boundary_mismatches() -> u64 {
    BOUNDARY_MISMATCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// The per-request part of the template context, converted once for both renders of a turn.
struct Prepared {
    tools: MjValue,
    /// The request's tools, when it has any (not null).
    tools_entry: Option<std::sync::Arc<tools_cache::ToolsEntry>>,
    kwargs: Vec<(String, MjValue)>,
}

/// Converts JSON to a template value directly (no serde round trip), keeping key order and the
/// integer/float distinction.
fn json_to_value(v: &Value) -> MjValue {
    match v {
        Value::Null => MjValue::from(()),
        Value::Bool(b) => MjValue::from(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                MjValue::from(i)
            } else if let Some(u) = n.as_u64() {
                MjValue::from(u)
            } else {
                MjValue::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Value::String(s) => MjValue::from(s.as_str()),
        Value::Array(items) => MjValue::from(items.iter().map(json_to_value).collect::<Vec<_>>()),
        Value::Object(map) => {
            MjValue::from_pairs(map.iter().map(|(k, v)| (k.as_str(), json_to_value(v))))
        }
    }
}

/// transformers' `clean_up_tokenization` (only applied when the config asks for it).
fn clean_up_tokenization(s: &str) -> String {
    s.replace(" .", ".")
        .replace(" ?", "?")
        .replace(" !", "!")
        .replace(" ,", ",")
        .replace(" ' ", "'")
        .replace(" n't", "n't")
        .replace(" 'm", "'m")
        .replace(" 's", "'s")
        .replace(" 've", "'ve")
        .replace(" 're", "'re")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn chat_tokenizer_is_send_and_sync() {
        assert_send_sync::<ChatTokenizer>();
    }
}
