//! Helpers shared by the integration tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::OnceLock;

use ps_chat_template::{ChatTemplateError, ChatTokenizer};
use serde_json::{Value, json};

/// The mini model's tokenizer.json, for building tokenizers with test templates.
pub const MINI_TOKENIZER_JSON: &str = include_str!("../../../../config/mini-model/tokenizer.json");

/// A config JSON with the given `chat_template` value and the mini model's special tokens.
pub fn config_with(chat_template: Value) -> String {
    json!({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": null, "chat_template": chat_template})
        .to_string()
}

/// The mini tokenizer with a custom chat template.
pub fn with_template(template: &str) -> Result<ChatTokenizer, ChatTemplateError> {
    ChatTokenizer::from_json_strs(MINI_TOKENIZER_JSON, &config_with(json!(template)))
}

/// Renders `template` with no messages and `kwargs` as template variables.
pub fn render_kwargs(template: &str, kwargs: Value) -> Result<String, ChatTemplateError> {
    let tok = with_template(template).unwrap();
    tok.render(&[], None, false, kwargs.as_object())
}

/// The real Qwen3 tokenizer with both of its configurations, from `../shared/fixtures/qwen3` (or
/// `$POLICY_SERVING_SHARED`); none when the fixtures are missing, unless
/// `POLICY_SERVING_REQUIRE_FIXTURES=1`, which makes that a failure. Loaded once per test process
/// (the 11 MB tokenizer took ~0.3 s a load, and the property tests ask for it in every case).
pub fn qwen3() -> &'static [ChatTokenizer] {
    static QWEN3: OnceLock<Vec<ChatTokenizer>> = OnceLock::new();
    QWEN3.get_or_init(load_qwen3)
}

fn load_qwen3() -> Vec<ChatTokenizer> {
    let Some(dir) = ps_test_support::fixtures::qwen3_dir() else {
        return Vec::new();
    };
    [
        "tokenizer_config.json",
        "tokenizer_config.qwen3-4b-thinking-2507.json",
    ]
    .iter()
    .map(|c| ChatTokenizer::from_files(&dir.join("tokenizer.json"), &dir.join(c)).unwrap())
    .collect()
}
