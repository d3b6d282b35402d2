//! What the policy server says about the model it serves: SGLang's `GET /get_model_info`
//! (`model_path`, `tokenizer_path`, and `vocab_size` where a build reports it), else vLLM's
//! `GET /v1/models` (`data[].root`, the path the model was loaded from).

use serde_json::Value;

/// The policy server's report. Every field is optional: servers differ in what they say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelInfo {
    /// The URL that answered, or the URLs tried when none reported anything.
    pub url: String,
    /// `tokenizer_path` (SGLang).
    pub tokenizer_path: Option<String>,
    /// `model_path` (SGLang) or `root` (vLLM, SGLang's `/v1/models`).
    pub model_path: Option<String>,
    /// `vocab_size`, when the server reports it.
    pub vocab_size: Option<u64>,
    /// The engine that answered: SGLang when `/get_model_info` did, else what `/v1/models`'s
    /// `owned_by` names.
    pub engine: Option<ps_core::Engine>,
}

impl ModelInfo {
    /// The tokenizer's directory as the server names it: `tokenizer_path`, else `model_path`.
    pub fn tokenizer_dir(&self) -> Option<&str> {
        self.tokenizer_path
            .as_deref()
            .or(self.model_path.as_deref())
    }

    /// Whether the server reported anything.
    pub fn is_reported(&self) -> bool {
        self.tokenizer_path.is_some() || self.model_path.is_some() || self.vocab_size.is_some()
    }
}

fn text(v: &Value, key: &str) -> Option<String> {
    v.get(key)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

/// Reads SGLang's `/get_model_info` answer.
pub(crate) fn from_sglang(url: &str, v: &Value) -> ModelInfo {
    ModelInfo {
        url: url.to_owned(),
        tokenizer_path: text(v, "tokenizer_path"),
        model_path: text(v, "model_path"),
        vocab_size: v.get("vocab_size").and_then(Value::as_u64),
        engine: Some(ps_core::Engine::Sglang),
    }
}

/// Reads a `/v1/models` answer: the `root` of the entry whose `id` is `served`, else of the first.
pub(crate) fn from_models(url: &str, v: &Value, served: &str) -> ModelInfo {
    let data = v.get("data").and_then(Value::as_array);
    let entry = data.and_then(|d| {
        d.iter()
            .find(|e| e.get("id").and_then(Value::as_str) == Some(served))
            .or_else(|| d.first())
    });
    ModelInfo {
        url: url.to_owned(),
        tokenizer_path: None,
        model_path: entry.and_then(|e| text(e, "root")),
        vocab_size: entry
            .and_then(|e| e.get("vocab_size"))
            .and_then(Value::as_u64),
        engine: entry
            .and_then(|e| e.get("owned_by"))
            .and_then(Value::as_str)
            .and_then(ps_core::Engine::from_owned_by),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sglang_fields_are_read_and_empty_ones_ignored() {
        let i = from_sglang(
            "u",
            &json!({"model_path": "/m/Qwen3-4B", "tokenizer_path": "", "is_generation": true}),
        );
        assert_eq!(i.tokenizer_dir(), Some("/m/Qwen3-4B"));
        assert_eq!(i.vocab_size, None);
        let i = from_sglang(
            "u",
            &json!({"model_path": "/m", "tokenizer_path": "/t", "vocab_size": 151936}),
        );
        assert_eq!(i.tokenizer_dir(), Some("/t"));
        assert_eq!(i.vocab_size, Some(151936));
        assert!(!from_sglang("u", &json!({})).is_reported());
    }

    #[test]
    fn the_served_models_root_is_preferred() {
        let v = json!({"object": "list", "data": [
            {"id": "other", "root": "/o"}, {"id": "qwen3-4b", "root": "/q"}]});
        assert_eq!(
            from_models("u", &v, "qwen3-4b").model_path.as_deref(),
            Some("/q")
        );
        assert_eq!(from_models("u", &v, "x").model_path.as_deref(), Some("/o"));
        assert_eq!(from_models("u", &v, "x").engine, None);
        // What vLLM 0.32 answers (recorded): `owned_by: "vllm"` names the engine.
        let vllm = json!({"object": "list", "data": [{"id": "qwen3-4b", "object": "model",
            "owned_by": "vllm", "root": "/m", "parent": null, "max_model_len": 4096}]});
        assert_eq!(
            from_models("u", &vllm, "qwen3-4b").engine,
            Some(ps_core::Engine::Vllm)
        );
        assert_eq!(
            from_sglang("u", &json!({"model_path": "/m"})).engine,
            Some(ps_core::Engine::Sglang)
        );
        assert!(!from_models("u", &json!({"data": [{"id": "a"}]}), "a").is_reported());
    }
}
