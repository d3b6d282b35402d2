//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong while loading a tokenizer directory, rendering a chat template or
/// tokenizing. Variants name the file (`origin` is a path, or `<string>` for in-memory input), the
/// config key or the template involved.
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    /// A tokenizer file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `tokenizer.json` is not a valid HuggingFace tokenizer.
    #[error("invalid tokenizer file {origin}: {source}")]
    TokenizerJson {
        origin: String,
        #[source]
        source: tokenizers::Error,
    },
    /// `tokenizer_config.json` is not valid JSON or not an object.
    #[error("invalid tokenizer config {origin}: {message}")]
    ConfigJson { origin: String, message: String },
    /// A key of `tokenizer_config.json` has an unusable value.
    #[error("invalid `{key}` in tokenizer config {origin}: {message}")]
    ConfigKey {
        origin: String,
        key: String,
        message: String,
    },
    /// A rendered prompt holds another number of image pad tokens than the turn has images: the
    /// template does not write one placeholder per image part.
    #[error(
        "the rendered prompt holds {found} image pad tokens for {images} images: the chat \
         template does not write one <|image_pad|> per image part"
    )]
    ImagePads { found: usize, images: usize },
    /// The tokenizer config has no `chat_template` (and the directory has no `chat_template.jinja`).
    #[error("tokenizer config {origin} has no `chat_template`")]
    MissingChatTemplate { origin: String },
    /// A chat template does not compile.
    #[error("chat template `{name}` does not compile: {message}")]
    TemplateSyntax { name: String, message: String },
    /// Rendering failed; for `raise_exception(msg)` the message is the template's own.
    #[error("chat template `{name}` failed to render: {message}")]
    Render { name: String, message: String },
    /// A list of named chat templates has neither the one needed for this request nor `default`.
    #[error(
        "no chat template to use: the config has named templates {available:?} but no `default`"
    )]
    NoDefaultTemplate { available: Vec<String> },
    /// The tokenizer could not encode a text.
    #[error("tokenizer failed to encode text ({len} bytes): {source}")]
    Encode {
        len: usize,
        #[source]
        source: tokenizers::Error,
    },
    /// Reading the JSONL input of [`crate::tokenize_jsonl`] failed.
    #[error("cannot read tokenize input after line {line}: {source}")]
    ReadInput {
        line: usize,
        #[source]
        source: std::io::Error,
    },
    /// Writing the JSONL output of [`crate::tokenize_jsonl`] failed.
    #[error("cannot write tokenize output for line {line}: {source}")]
    WriteOutput {
        line: usize,
        #[source]
        source: std::io::Error,
    },
}
