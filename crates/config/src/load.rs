//! Layering: built-in defaults < one settings file < legacy operator variables < `POLICY_SERVING_*`
//! variables < command-line overrides, merged with figment and extracted into [`Settings`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use figment::error::{Actual, Kind};
use figment::providers::{Format, Json, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider, Source};

use crate::dict::insert_path;
use crate::error::ConfigError;
use crate::schema::Settings;
use crate::secret::EnvLookup;

/// Prefix of the product's own environment variables.
pub const ENV_PREFIX: &str = "POLICY_SERVING_";
/// Nesting separator of the product's environment variables: `POLICY_SERVING_SERVER__PORT=8080`
/// sets `server.port`. Prefixed variables without a separator (such as `POLICY_SERVING_CONFIG`)
/// are left to the binary and ignored here.
pub const ENV_SEPARATOR: &str = "__";

/// Legacy variables of the reference system's `env.sh` that are honoured, as
/// (variable, key path). They sit above the settings file and below the `POLICY_SERVING_*`
/// variables. When two of them set the same key, the one listed first wins (`OPENCLAW_PORT`
/// over `PORT`). Empty variables are ignored.
///
/// Besides these, `SGLANG_API_KEY` is honoured as in the reference: when `server.api_key_env` is
/// unset and `SGLANG_API_KEY` is set, its value is the Bearer key clients of the proxy must send
/// (the key sent upstream to SGLang is `sglang.api_key` / `sglang.api_key_env`). Secrets such as
/// `TAOTOKEN_API_KEY` are read through the `*.api_key_env` keys that name them.
///
/// | variable | key |
/// |---|---|
/// | `OPENCLAW_PORT` | `server.port` |
/// | `PORT` | `server.port` |
/// | `HOST` | `server.host` |
/// | `PRM_ROUTER_URL` | `prm.router_url` |
/// | `LOG_LEVEL` | `logging.level` |
/// | `SERVED_MODEL_NAME` | `server.served_model_name` |
/// | `PRM_M` | `prm.num_votes` |
/// | `OPENCLAW_EVAL_MODE` | `opd.eval_mode` |
/// | `OPENCLAW_OPD_TEACHER_LP_MAX_CONCURRENCY` | `teacher.max_concurrency` |
pub const LEGACY_ENV: &[(&str, &str)] = &[
    ("OPENCLAW_PORT", "server.port"),
    ("PORT", "server.port"),
    ("HOST", "server.host"),
    ("PRM_ROUTER_URL", "prm.router_url"),
    ("LOG_LEVEL", "logging.level"),
    ("SERVED_MODEL_NAME", "server.served_model_name"),
    ("PRM_M", "prm.num_votes"),
    ("OPENCLAW_EVAL_MODE", "opd.eval_mode"),
    (
        "OPENCLAW_OPD_TEACHER_LP_MAX_CONCURRENCY",
        "teacher.max_concurrency",
    ),
];

/// Legacy variables the reference reads but this product does not, as (variable, what to use
/// instead). [`ignored_legacy_env`] tells which of them are set, so the binary can warn.
pub const LEGACY_ENV_NOT_HONOURED: &[(&str, &str)] = &[
    (
        "OPENCLAW_RECORD_ENABLED",
        "records are written when logging.record_dir, logging.prm_record_dir or logging.opd_record_dir is set",
    ),
    (
        "OPENCLAW_RECORD_FILE",
        "set logging.record_dir (records are rotated JSONL files in a directory)",
    ),
    (
        "OPENCLAW_PRM_RECORD_FILE",
        "set logging.prm_record_dir (records are rotated JSONL files in a directory)",
    ),
];

/// The legacy variables of [`LEGACY_ENV_NOT_HONOURED`] that are set (non-empty) in `env`.
pub fn ignored_legacy_env(env: EnvLookup<'_>) -> Vec<(&'static str, &'static str)> {
    LEGACY_ENV_NOT_HONOURED
        .iter()
        .filter(|(var, _)| env(var).is_some_and(|v| !v.trim().is_empty()))
        .copied()
        .collect()
}

/// Command-line overrides: the top layer. `None` leaves the key to the layers below.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `server.host`.
    pub host: Option<String>,
    /// `server.port`.
    pub port: Option<u16>,
    /// `server.model_dir`.
    pub model_dir: Option<PathBuf>,
}

/// Loads the configuration from the defaults, `file` (if any), the process environment and
/// `overrides`, then validates it. Secrets are not resolved here: see
/// [`Settings::check_secrets`].
pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Settings, ConfigError> {
    let env: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    load_with_env(file, overrides, &env)
}

/// As [`load`], with the environment given as (name, value) pairs instead of read from the process
/// (a later pair wins over an earlier one with the same name).
pub fn load_with_env(
    file: Option<&Path>,
    overrides: &Overrides,
    env: &[(String, String)],
) -> Result<Settings, ConfigError> {
    let layers = Layers::build(file, overrides, env)?;
    let settings: Settings = layers
        .figment
        .extract_lossy()
        .map_err(|e| layers.convert(e))?;
    settings.validate().map_err(|e| layers.annotate(e))?;
    Ok(Settings {
        trainer_side: layers.trainer_side,
        ..settings
    })
}

/// Keys whose environment values are parsed as `f64` (figment would read `0.6` as an `f32`).
const FLOAT_KEYS: &[&str] = &["prm.temperature"];

/// Top-level sections, for the "expected one of" of an unknown section.
const SECTIONS: &str = "`server`, `sglang`, `prm`, `provider` (or its alias `taotoken`), \
                        `teacher`, `opd`, `logging`, `capture`, `store`, `inspect`, and the trainer-side \
                        config.toml's `rollout`, `policy`, `reward`, `training`";

/// One layer, already read: its metadata (for error messages) and its data.
struct Layer {
    metadata: Metadata,
    dict: Dict,
}

impl Provider for Layer {
    fn metadata(&self) -> Metadata {
        self.metadata.clone()
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(Profile::Default.collect(self.dict.clone()))
    }
}

/// The merged layers, plus what is needed to explain errors.
struct Layers {
    figment: Figment,
    /// The settings file's path as printed, when its `taotoken` section was read as `provider`.
    aliased: Option<String>,
    /// The settings file's path as printed.
    file_origin: Option<String>,
    /// Product key → the trainer-side file's key that set it.
    renamed: BTreeMap<String, String>,
    /// The trainer-side keys the file carried.
    trainer_side: Vec<String>,
}

impl Layers {
    fn build(
        file: Option<&Path>,
        overrides: &Overrides,
        env: &[(String, String)],
    ) -> Result<Self, ConfigError> {
        let mut figment = Figment::new();
        let mut aliased = None;
        let mut translated = crate::trainer_file::Translated::default();
        let mut file_origin = None;
        if let Some(path) = file {
            let mut layer = file_layer(path)?;
            let describe = path.display().to_string();
            translated = crate::trainer_file::translate(&mut layer.dict, &describe)?;
            if rename_taotoken(&mut layer.dict, &describe)? {
                aliased = Some(describe.clone());
            }
            file_origin = Some(describe);
            figment = figment.merge(layer);
        }
        let env: BTreeMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        figment = figment.merge(legacy_layer(&env));
        let mut prefixed = prefixed_layer(&env);
        rename_taotoken(&mut prefixed.dict, "environment variables")?;
        figment = figment.merge(prefixed);
        figment = figment.merge(overrides_layer(overrides));
        Ok(Self {
            figment,
            aliased,
            file_origin,
            renamed: translated.renamed,
            trainer_side: translated.trainer_side,
        })
    }

    /// Figment's errors, as ours.
    fn convert(&self, error: figment::Error) -> ConfigError {
        let errors: Vec<ConfigError> = error.into_iter().map(|e| self.convert_one(e)).collect();
        match ConfigError::from_list(errors) {
            Err(e) => e,
            Ok(()) => ConfigError::Layering("unknown error".to_owned()),
        }
    }

    fn convert_one(&self, e: figment::Error) -> ConfigError {
        let origin = origin(e.metadata.as_ref(), &e.path);
        let key = self.display_key(&e.path.join("."), &origin);
        match e.kind {
            Kind::UnknownField(_, expected) => ConfigError::UnknownKey {
                expected: if e.path.len() <= 1 {
                    SECTIONS.to_owned()
                } else {
                    one_of(expected)
                },
                key,
                origin,
            },
            Kind::InvalidType(actual, expected) | Kind::InvalidValue(actual, expected) => {
                ConfigError::BadValue {
                    value: self.render_value(&e.path, &actual),
                    expected: friendly_expectation(&expected),
                    key,
                    origin,
                }
            }
            Kind::UnknownVariant(found, expected) => ConfigError::BadValue {
                value: serde_json::Value::String(found).to_string(),
                expected: format!("one of {}", one_of(expected)),
                key,
                origin,
            },
            other => ConfigError::Layering(if key.is_empty() {
                format!("{other} in {origin}")
            } else {
                format!("{key}: {other} in {origin}")
            }),
        }
    }

    /// Adds to validation errors where each value came from.
    fn annotate(&self, error: ConfigError) -> ConfigError {
        match error {
            ConfigError::Many(all) => {
                ConfigError::Many(all.into_iter().map(|e| self.annotate(e)).collect())
            }
            ConfigError::Invalid {
                key,
                value,
                expected,
                origin: None,
            } => {
                let origin = self.figment.find_metadata(&key).map(|md| {
                    let path: Vec<&str> = key.split('.').collect();
                    origin(Some(md), &path)
                });
                let key = match &origin {
                    Some(o) => self.display_key(&key, o),
                    None => key,
                };
                ConfigError::Invalid {
                    key,
                    value,
                    expected,
                    origin,
                }
            }
            other => other,
        }
    }

    /// The key as the operator wrote it: `taotoken.*` when that layer used the alias; the
    /// trainer-side file's own key (`rollout.sample_timeout_sec`) when that file set it.
    fn display_key(&self, key: &str, origin: &str) -> String {
        if self.file_origin.as_deref() == Some(origin)
            && let Some(written) = self.renamed.get(key)
        {
            return written.clone();
        }
        let env_alias = format!("{ENV_PREFIX}TAOTOKEN{ENV_SEPARATOR}");
        let aliased = self.aliased.as_deref() == Some(origin)
            || origin.to_ascii_uppercase().contains(&env_alias);
        match key.strip_prefix("provider") {
            Some(rest) if aliased && (rest.is_empty() || rest.starts_with('.')) => {
                format!("taotoken{rest}")
            }
            _ => key.to_owned(),
        }
    }

    /// The offending value in JSON syntax (secrets redacted).
    fn render_value(&self, path: &[String], actual: &Actual) -> String {
        let key = path.join(".");
        if key == "sglang.api_key" {
            return crate::secret::REDACTED_JSON.to_owned();
        }
        self.figment
            .find_value(&key)
            .ok()
            .and_then(|v| serde_json::to_string(&v).ok())
            .unwrap_or_else(|| actual.to_string())
    }
}

/// Where a value came from: the file path, or the variable / override that set it.
fn origin<K: AsRef<str>>(md: Option<&Metadata>, path: &[K]) -> String {
    match md {
        None => "the configuration".to_owned(),
        Some(md) => match &md.source {
            Some(Source::File(p)) => p.display().to_string(),
            _ if path.is_empty() => md.name.to_string(),
            _ => format!("{} {}", md.name, md.interpolate(&Profile::Default, path)),
        },
    }
}

/// Renames a `taotoken` section to `provider`; an error if both are present. Returns whether it
/// renamed.
fn rename_taotoken(dict: &mut Dict, origin: &str) -> Result<bool, ConfigError> {
    let Some(section) = dict.remove("taotoken") else {
        return Ok(false);
    };
    if dict.contains_key("provider") {
        return Err(ConfigError::DuplicateProviderSection {
            origin: origin.to_owned(),
        });
    }
    dict.insert("provider".to_owned(), section);
    Ok(true)
}

/// Reads and parses the settings file (JSON or TOML, chosen by extension).
fn file_layer(path: &Path) -> Result<Layer, ConfigError> {
    let extension = path.extension().map(|e| e.to_string_lossy().into_owned());
    let is_json = match extension.as_deref().map(str::to_ascii_lowercase).as_deref() {
        Some("json") => true,
        Some("toml") => false,
        _ => {
            return Err(ConfigError::UnsupportedExtension {
                path: path.to_owned(),
                extension,
            });
        }
    };
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ConfigError::FileNotFound {
                path: path.to_owned(),
            });
        }
        Err(source) => {
            return Err(ConfigError::ReadFile {
                path: path.to_owned(),
                source,
            });
        }
    };
    let parsed = if is_json {
        Json::string(&text).data()
    } else {
        Toml::string(&text).data()
    };
    let mut parsed = parsed.map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    let format = if is_json { "JSON file" } else { "TOML file" };
    Ok(Layer {
        metadata: Metadata::from(format, path),
        dict: parsed.remove(&Profile::Default).unwrap_or_default(),
    })
}

/// The legacy operator variables of [`LEGACY_ENV`].
fn legacy_layer(env: &BTreeMap<&str, &str>) -> Layer {
    let mut dict = Dict::new();
    let mut names = BTreeMap::new();
    for (var, key) in LEGACY_ENV {
        if names.contains_key(*key) {
            continue;
        }
        if let Some(value) = env.get(var).filter(|v| !v.trim().is_empty()) {
            insert_path(&mut dict, key, env_value(key, value));
            names.insert((*key).to_owned(), (*var).to_owned());
        }
    }
    Layer {
        metadata: env_metadata("legacy environment variable", names),
        dict,
    }
}

/// The `POLICY_SERVING_SECTION__KEY` variables.
fn prefixed_layer(env: &BTreeMap<&str, &str>) -> Layer {
    let mut dict = Dict::new();
    let mut names = BTreeMap::new();
    for (var, value) in env {
        let Some(rest) = strip_prefix_ignore_case(var, ENV_PREFIX) else {
            continue;
        };
        if !rest.contains(ENV_SEPARATOR) || value.trim().is_empty() {
            continue;
        }
        let parts: Vec<String> = rest
            .split(ENV_SEPARATOR)
            .map(|p| p.to_ascii_lowercase())
            .collect();
        if parts.iter().any(|p| p.is_empty()) {
            continue;
        }
        let key = parts.join(".");
        names.insert(key.clone(), (*var).to_owned());
        // The section is renamed to `provider` later; errors then name the variable as written.
        if let Some(rest) = key.strip_prefix("taotoken.") {
            names.insert(format!("provider.{rest}"), (*var).to_owned());
        }
        insert_path(&mut dict, &key, env_value(&key, value));
    }
    Layer {
        metadata: env_metadata("environment variable", names),
        dict,
    }
}

/// The command-line overrides.
fn overrides_layer(o: &Overrides) -> Layer {
    let mut dict = Dict::new();
    if let Some(host) = &o.host {
        insert_path(&mut dict, "server.host", Value::from(host.clone()));
    }
    if let Some(port) = o.port {
        insert_path(&mut dict, "server.port", Value::from(port));
    }
    if let Some(dir) = &o.model_dir {
        insert_path(
            &mut dict,
            "server.model_dir",
            Value::from(dir.to_string_lossy().into_owned()),
        );
    }
    Layer {
        metadata: Metadata::named("command-line override of")
            .interpolater(|_: &Profile, keys: &[&str]| keys.join(".")),
        dict,
    }
}

/// Metadata of an environment layer whose interpolater names the variable that set a key path.
fn env_metadata(name: &'static str, names: BTreeMap<String, String>) -> Metadata {
    Metadata::named(name).interpolater(move |_: &Profile, keys: &[&str]| {
        let key = keys.join(".");
        if let Some(var) = names.get(&key) {
            return var.clone();
        }
        // A section-level error: name every variable under it.
        let prefix = format!("{key}.");
        let vars: Vec<&str> = names
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(_, v)| v.as_str())
            .collect();
        if vars.is_empty() {
            key
        } else {
            vars.join(", ")
        }
    })
}

/// An environment value: kept as a string (extraction converts it to the key's type), except for
/// float keys, parsed here as `f64`.
fn env_value(key: &str, value: &str) -> Value {
    if FLOAT_KEYS.contains(&key)
        && let Ok(f) = value.trim().parse::<f64>()
    {
        return Value::from(f);
    }
    Value::from(value.to_owned())
}

fn strip_prefix_ignore_case<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

fn one_of(expected: &[&str]) -> String {
    if expected.is_empty() {
        return "no keys here".to_owned();
    }
    expected
        .iter()
        .map(|e| format!("`{e}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Serde's terse expectation (`u16`, `a boolean`, `struct ServerSettings`), in operator words.
fn friendly_expectation(expected: &str) -> String {
    let text = match expected {
        "u8" => "an integer 0..=255",
        "u16" => "an integer 0..=65535",
        "u32" => "an integer 0..=4294967295",
        "u64" | "usize" => "a non-negative integer",
        "i64" | "isize" => "an integer",
        "f32" | "f64" => "a number",
        "a boolean" => "true or false",
        "a string" => "a string",
        "path string" => "a path (string)",
        "enum Mode" => "one of `rl`, `opd`, `combine`",
        "enum TurnType" => "one of `main`, `side`",
        "enum PrmBackend" => "one of `sglang`, `provider`",
        "enum TeacherBackend" => "one of `sglang`, `openai_completions`, `provider_chat`",
        "enum LogFormat" => "one of `text`, `json`",
        "enum StoreKind" => "`embedded`",
        other if other.starts_with("struct ") => "a table (object) of keys",
        other => other,
    };
    text.to_owned()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn prefix_is_case_insensitive() {
        assert_eq!(
            strip_prefix_ignore_case("policy_serving_X__Y", ENV_PREFIX),
            Some("X__Y")
        );
        assert_eq!(strip_prefix_ignore_case("POLICY", ENV_PREFIX), None);
    }

    #[test]
    fn float_keys_parse_as_f64() {
        assert_eq!(env_value("prm.temperature", "0.6").to_f64(), Some(0.6));
        assert_eq!(env_value("server.host", "0.6").as_str(), Some("0.6"));
    }

    #[test]
    fn legacy_table_keys_exist_in_the_schema() {
        let defaults = serde_json::to_value(Settings::default()).unwrap();
        for (var, key) in LEGACY_ENV {
            let (section, name) = key.split_once('.').unwrap();
            assert!(defaults[section].get(name).is_some(), "{var} -> {key}");
        }
    }

    #[test]
    fn ignored_legacy_variables_are_reported() {
        let env = |k: &str| (k == "OPENCLAW_RECORD_FILE").then(|| "/x.jsonl".to_owned());
        let ignored = ignored_legacy_env(&env);
        assert_eq!(ignored.len(), 1);
        assert_eq!(ignored[0].0, "OPENCLAW_RECORD_FILE");
    }
}
