//! Which tokenizer captures the policy's token ids, and why. `serve` never trains with a tokenizer
//! that is not the policy's: it takes `server.model_dir` (or `--model-dir`); else the directory the
//! policy server reports (SGLang `GET /get_model_info` `tokenizer_path`/`model_path`, vLLM
//! `GET /v1/models` `root`) when that directory exists on this machine; else it refuses to start.
//! Only `policy-serving demo` uses the embedded mini model. Whatever the source, a vocabulary size
//! or tokenizer directory the policy server reports that clearly disagrees with the loaded
//! tokenizer is refused at start. [`choose`] is the rule, over what the server reported
//! ([`Reported`]), so it can be tested without a server.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ps_chat_template::ChatTokenizer;
use ps_sglang_client::ModelInfo;

use crate::error::StartupError;

/// How many more ids than the tokenizer the model's embedding may have before the two are called
/// different models: embeddings are padded (Qwen3-4B: 151,936 rows for 151,669 ids).
pub const VOCAB_PADDING_SLACK: u64 = 1024;

/// Where the policy tokenizer came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenizerSource {
    /// `server.model_dir` (or `--model-dir`).
    Setting { dir: PathBuf },
    /// The directory the policy server reported, found on this machine.
    PolicyServer { dir: PathBuf, url: String },
    /// The embedded mini model: `policy-serving demo` only.
    EmbeddedDemo,
}

impl TokenizerSource {
    /// The directory the tokenizer was loaded from (none for the embedded mini model).
    pub fn dir(&self) -> Option<&Path> {
        match self {
            Self::Setting { dir } | Self::PolicyServer { dir, .. } => Some(dir),
            Self::EmbeddedDemo => None,
        }
    }
}

impl fmt::Display for TokenizerSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Setting { dir } => {
                write!(f, "{} (source: setting server.model_dir)", dir.display())
            }
            Self::PolicyServer { dir, url } => write!(
                f,
                "{} (source: policy server, reported by {url}; server.model_dir is unset)",
                dir.display()
            ),
            Self::EmbeddedDemo => f.write_str("the embedded mini-vl model (source: embedded demo)"),
        }
    }
}

/// The policy tokenizer and where it came from.
#[derive(Debug, Clone)]
pub struct PolicyTokenizer {
    pub tokenizer: Arc<ChatTokenizer>,
    pub source: TokenizerSource,
}

impl PolicyTokenizer {
    /// The embedded mini model with images (`ChatTokenizer::mini_vl`: the mini model's tokens and
    /// template plus vision tokens and a small Qwen-VL processor), for `policy-serving demo` (whose
    /// fake policy samples with it).
    pub fn embedded_demo() -> Self {
        Self {
            tokenizer: Arc::new(ChatTokenizer::mini_vl()),
            source: TokenizerSource::EmbeddedDemo,
        }
    }

    /// The model's routing shape when it is a mixture of experts: its `config.json`'s
    /// `num_hidden_layers` and `num_experts_per_tok`; for the embedded demo model, the demo's fake
    /// policy's routing ([`DEMO_MOE_SHAPE`]).
    pub fn moe_shape(&self) -> Option<ps_core::MoeShape> {
        match self.source.dir() {
            Some(dir) => moe_shape(dir),
            None => Some(DEMO_MOE_SHAPE),
        }
    }
}

/// How the demo's fake policy routes (`ps_fake_sglang::MoeRouting::default()`, checked by the demo's
/// tests): 4 layers, top-2.
pub const DEMO_MOE_SHAPE: ps_core::MoeShape = ps_core::MoeShape {
    layers: 4,
    top_k: 2,
    experts: Some(16),
};

/// A mixture-of-experts model's routing shape from its `config.json` in `dir`:
/// `num_hidden_layers` and `num_experts_per_tok` (Qwen3-MoE, DeepSeek, Mixtral alike). `None`
/// for a dense model or a directory without it.
pub fn moe_shape(dir: &std::path::Path) -> Option<ps_core::MoeShape> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let config: serde_json::Value = serde_json::from_str(&text).ok()?;
    // Multimodal configs nest the language model's.
    let config = config.get("text_config").unwrap_or(&config);
    let read = |k: &str| {
        config
            .get(k)?
            .as_u64()
            .and_then(|v| usize::try_from(v).ok())
    };
    Some(ps_core::MoeShape {
        layers: read("num_hidden_layers")?,
        top_k: read("num_experts_per_tok")?,
        experts: ["num_experts", "n_routed_experts", "num_local_experts"]
            .iter()
            .find_map(|k| read(k)),
    })
}

/// What the policy server said when asked at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reported {
    /// It answered (possibly without reporting anything: [`ModelInfo::is_reported`]).
    Info(ModelInfo),
    /// It could not be asked.
    Unreachable { url: String, error: String },
}

/// The rule (see the module documentation): `model_dir` is `server.model_dir`, `reported` what the
/// policy server said. Loads the tokenizer (blocking: call it off the executor, or at start).
pub fn choose(
    model_dir: Option<&Path>,
    reported: &Reported,
) -> Result<PolicyTokenizer, StartupError> {
    let chosen = match (model_dir, reported) {
        (Some(dir), _) => PolicyTokenizer {
            tokenizer: Arc::new(load(dir)?),
            source: TokenizerSource::Setting {
                dir: dir.to_owned(),
            },
        },
        (None, Reported::Unreachable { url, error }) => {
            return Err(StartupError::NoTokenizer {
                reason: format!(
                    "the policy server could not be asked for its model path at {url} ({error})"
                ),
            });
        }
        (None, Reported::Info(info)) => {
            let Some(path) = info.tokenizer_dir() else {
                return Err(StartupError::NoTokenizer {
                    reason: format!(
                        "the policy server does not report its model path (asked {})",
                        info.url
                    ),
                });
            };
            let dir = PathBuf::from(path);
            if !dir.is_dir() {
                return Err(StartupError::NoTokenizer {
                    reason: format!(
                        "the policy server ({}) reports the model path {path}, which is not a \
                         directory on this machine",
                        info.url
                    ),
                });
            }
            PolicyTokenizer {
                tokenizer: Arc::new(load(&dir)?),
                source: TokenizerSource::PolicyServer {
                    dir,
                    url: info.url.clone(),
                },
            }
        }
    };
    if let Reported::Info(info) = reported {
        compare(&chosen, info)?;
    }
    Ok(chosen)
}

fn load(dir: &Path) -> Result<ChatTokenizer, StartupError> {
    ChatTokenizer::from_dir(dir).map_err(|source| StartupError::Tokenizer {
        dir: dir.to_owned(),
        source,
    })
}

/// Whether two `tokenizer.json` files hold different tokenizers: equal bytes are the same (the
/// common case: a copy); otherwise compared as JSON values, so that the same tokenizer written
/// differently is the same too. A file that cannot be read is not compared (false). The JSON
/// trees of a large tokenizer cost several times its size, so they are built only when the bytes
/// differ.
fn differ_as_json(a: &Path, b: &Path) -> bool {
    let (Ok(a), Ok(b)) = (std::fs::read(a), std::fs::read(b)) else {
        return false;
    };
    if a == b {
        return false;
    }
    let value = |bytes: &[u8]| {
        serde_json::from_slice::<serde_json::Value>(bytes).unwrap_or_else(|_| {
            serde_json::Value::String(String::from_utf8_lossy(bytes).into_owned())
        })
    };
    value(&a) != value(&b)
}

/// Refuses a clear mismatch between the loaded tokenizer and what the policy server reports: a
/// vocabulary size the tokenizer's ids do not fit in (or far larger than padding explains), or,
/// with `server.model_dir` set, a reported tokenizer directory on this machine whose
/// `tokenizer.json` differs from ours.
fn compare(chosen: &PolicyTokenizer, info: &ModelInfo) -> Result<(), StartupError> {
    let ours = chosen.source.to_string();
    if let Some(reported) = info.vocab_size {
        let have = chosen.tokenizer.vocab_size() as u64;
        if have > reported || reported - have > VOCAB_PADDING_SLACK {
            return Err(StartupError::TokenizerMismatch {
                detail: format!(
                    "the policy server ({}) reports vocab_size {reported}, the tokenizer {ours} \
                     has {have} ids",
                    info.url
                ),
            });
        }
    }
    if let (TokenizerSource::Setting { dir }, Some(path)) = (&chosen.source, info.tokenizer_dir()) {
        let theirs = Path::new(path);
        let same_dir = match (dir.canonicalize(), theirs.canonicalize()) {
            (Ok(a), Ok(b)) => a == b,
            // Not on this machine (or not readable): nothing to compare.
            _ => true,
        };
        if !same_dir && differ_as_json(&dir.join("tokenizer.json"), &theirs.join("tokenizer.json"))
        {
            return Err(StartupError::TokenizerMismatch {
                detail: format!(
                    "server.model_dir = {} and the policy server's model path {path} \
                     (reported by {}) hold different tokenizer.json files",
                    dir.display(),
                    info.url
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The mini model's directory in this source tree.
    fn mini_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/mini-model")
    }

    fn reported(path: Option<&Path>, vocab: Option<u64>) -> Reported {
        Reported::Info(ModelInfo {
            url: "http://policy:30001/get_model_info".into(),
            tokenizer_path: None,
            model_path: path.map(|p| p.display().to_string()),
            vocab_size: vocab,
            engine: Some(ps_core::Engine::Sglang),
        })
    }

    fn unreachable() -> Reported {
        Reported::Unreachable {
            url: "http://policy:30001/get_model_info".into(),
            error: "connection refused".into(),
        }
    }

    #[test]
    fn the_setting_wins_even_when_the_policy_server_is_unreachable() {
        let t = choose(Some(&mini_dir()), &unreachable()).unwrap();
        assert_eq!(t.source, TokenizerSource::Setting { dir: mini_dir() });
        assert!(
            t.source
                .to_string()
                .contains("source: setting server.model_dir")
        );
    }

    #[test]
    fn without_the_setting_the_reported_directory_is_used_when_it_exists() {
        let t = choose(None, &reported(Some(&mini_dir()), None)).unwrap();
        match &t.source {
            TokenizerSource::PolicyServer { dir, url } => {
                assert_eq!(dir, &mini_dir());
                assert!(url.ends_with("/get_model_info"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(t.tokenizer.vocab_size(), ChatTokenizer::mini().vocab_size());
    }

    #[test]
    fn without_the_setting_a_missing_unreported_or_unreachable_path_refuses_naming_the_setting() {
        let absent = Path::new("/nonexistent/models/Qwen3-4B");
        for (what, r, names) in [
            (
                "absent",
                reported(Some(absent), None),
                "/nonexistent/models/Qwen3-4B",
            ),
            (
                "unreported",
                reported(None, None),
                "does not report its model path",
            ),
            (
                "unreachable",
                unreachable(),
                "http://policy:30001/get_model_info",
            ),
        ] {
            let e = choose(None, &r).unwrap_err().to_string();
            assert!(e.contains("server.model_dir"), "{what}: {e}");
            assert!(e.contains(names), "{what}: {e}");
        }
    }

    #[test]
    fn a_reported_vocab_size_that_the_tokenizer_does_not_fit_is_refused() {
        let have = ChatTokenizer::mini().vocab_size() as u64;
        // Padding is fine.
        choose(Some(&mini_dir()), &reported(None, Some(have + 64))).unwrap();
        for vocab in [have - 1, have + VOCAB_PADDING_SLACK + 1] {
            let e = choose(Some(&mini_dir()), &reported(None, Some(vocab)))
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("vocab_size {vocab}")), "{e}");
            assert!(e.contains(&format!("has {have} ids")), "{e}");
            assert!(e.contains("server.model_dir"), "{e}");
        }
    }

    #[test]
    fn a_reported_directory_with_another_tokenizer_json_is_refused() {
        let other = tempfile::tempdir().unwrap();
        std::fs::write(other.path().join("tokenizer.json"), b"{\"model\": {}}").unwrap();
        let e = choose(Some(&mini_dir()), &reported(Some(other.path()), None))
            .unwrap_err()
            .to_string();
        assert!(e.contains("different tokenizer.json"), "{e}");
        assert!(e.contains(&other.path().display().to_string()), "{e}");
        assert!(e.contains("server.model_dir"), "{e}");
        // The same directory, and one not on this machine, are fine.
        choose(Some(&mini_dir()), &reported(Some(&mini_dir()), None)).unwrap();
        choose(
            Some(&mini_dir()),
            &reported(Some(Path::new("/not/here")), None),
        )
        .unwrap();
    }
}
