//! The operators' trainer-side `config.toml` (`[rollout]`, `[policy]`, `[reward]`, `[training]`,
//! and the teacher keys of `[opd]`), read by this server and by the Python rollout bridge alike:
//! one file configures both sides. [`TRAINER_FILE_KEYS`] is the one list of its keys and of who
//! reads each; [`translate`] turns the keys this server reads into its own keys before layering,
//! and remembers the trainer-side ones, which `serve` reports at start (not as errors). A key of
//! these tables that neither side knows is an error naming it.

use std::collections::BTreeMap;

use figment::value::{Dict, Value};

use crate::dict::insert_path;
use crate::error::ConfigError;

/// Who reads a key of the trainer-side file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    /// This server, as the product key(s) named.
    Server(&'static str),
    /// The trainer (the Python rollout bridge, Slime) only.
    Trainer,
    /// Both: this server as the product key(s) named, and the trainer.
    Both(&'static str),
}

impl Reader {
    /// Whether the trainer side reads it.
    pub fn trainer_reads(self) -> bool {
        matches!(self, Self::Trainer | Self::Both(_))
    }
}

/// Every key of the operators' `config.toml` and who reads it. `training.*` stands for every key of
/// `[training]`, which is the trainer's alone.
pub const TRAINER_FILE_KEYS: &[(&str, Reader)] = &[
    ("rollout.mode", Reader::Trainer),
    (
        "rollout.api_server_url",
        Reader::Both("server.host and server.port (where this server listens)"),
    ),
    ("rollout.output_queue_size", Reader::Trainer),
    (
        "rollout.sample_timeout_sec",
        Reader::Both("server.session_timeout_sec"),
    ),
    (
        "policy.model_name",
        Reader::Both(
            "server.model_dir when it is a directory on this machine; else \
             server.served_model_name unless policy.served_model_name is set",
        ),
    ),
    (
        "policy.served_model_name",
        Reader::Server("server.served_model_name"),
    ),
    ("policy.tp_size", Reader::Trainer),
    ("reward.prm_enabled", Reader::Server("prm.enabled")),
    ("reward.prm_num_votes", Reader::Server("prm.num_votes")),
    (
        "opd.enabled",
        Reader::Server("opd.enabled and server.mode (true: \"opd\", false: \"rl\")"),
    ),
    (
        "opd.teacher_base_url",
        Reader::Server(
            "teacher.url (a /generate URL: teacher.backend \"sglang\"; a /v1/completions URL: \
             \"openai_completions\"; a chat API is refused when OPD is on)",
        ),
    ),
    (
        "opd.teacher_api_key_env",
        Reader::Server("teacher.api_key_env"),
    ),
    ("opd.teacher_model", Reader::Server("teacher.model")),
    ("opd.top_k", Reader::Server("opd.top_k")),
    ("training.*", Reader::Trainer),
];

/// The trainer-side keys of [`TRAINER_FILE_KEYS`] (read by the trainer; some by this server too).
pub fn trainer_side_keys() -> impl Iterator<Item = &'static str> {
    TRAINER_FILE_KEYS
        .iter()
        .filter(|(_, r)| r.trainer_reads())
        .map(|(k, _)| *k)
}

/// Tables of the trainer-side file that are not sections of the settings.
const TRAINER_TABLES: &[&str] = &["rollout", "policy", "reward", "training"];
/// The `[opd]` keys of the trainer-side file (the other `[opd]` keys are the settings' own).
const TRAINER_OPD_KEYS: &[&str] = &["teacher_base_url", "teacher_api_key_env", "teacher_model"];

/// What [`translate`] found.
#[derive(Debug, Default)]
pub(crate) struct Translated {
    /// Product key → the operator's key that set it, for error messages.
    pub renamed: BTreeMap<String, String>,
    /// The trainer-side keys present, as written (`rollout.mode`, `training.lr`, …).
    pub trainer_side: Vec<String>,
}

fn get<'a>(dict: &'a Dict, path: &str) -> Option<&'a Value> {
    let mut parts = path.split('.');
    let mut cur = dict.get(parts.next()?)?;
    for p in parts {
        cur = cur.as_dict()?.get(p)?;
    }
    Some(cur)
}

/// Sets `key` to `value` unless the file sets it itself, remembering that `from` set it.
fn set(dict: &mut Dict, out: &mut Translated, key: &str, from: &str, value: Value) {
    if get(dict, key).is_none() {
        insert_path(dict, key, value);
        out.renamed.insert(key.to_owned(), from.to_owned());
    }
}

/// Moves the trainer-side file's keys of `dict` (a file's top level) to the product keys they mean
/// (a product key the file also sets itself is left alone), and records the trainer-side ones.
/// `origin` names the file in errors.
pub(crate) fn translate(dict: &mut Dict, origin: &str) -> Result<Translated, ConfigError> {
    let mut out = Translated::default();
    let mut errors = Vec::new();
    // `opd.enabled` chooses the mode only in the trainer-side file; in the settings it must agree
    // with `server.mode`.
    let trainer_file = TRAINER_TABLES.iter().any(|t| dict.contains_key(*t))
        || TRAINER_OPD_KEYS
            .iter()
            .any(|k| get(dict, &format!("opd.{k}")).is_some());
    for table in TRAINER_TABLES {
        let Some(value) = dict.remove(*table) else {
            continue;
        };
        let Some(keys) = value.as_dict() else {
            errors.push(ConfigError::BadValue {
                key: (*table).to_owned(),
                value: serde_json::to_string(&value).unwrap_or_default(),
                origin: origin.to_owned(),
                expected: "a table (object) of keys".to_owned(),
            });
            continue;
        };
        for (name, v) in keys {
            let key = format!("{table}.{name}");
            let known =
                *table == "training" || TRAINER_FILE_KEYS.iter().any(|(k, _)| *k == key.as_str());
            if !known {
                let expected: Vec<String> = TRAINER_FILE_KEYS
                    .iter()
                    .filter_map(|(k, _)| k.strip_prefix(&format!("{table}.")))
                    .map(|k| format!("`{k}`"))
                    .collect();
                errors.push(ConfigError::UnknownKey {
                    key,
                    origin: origin.to_owned(),
                    expected: format!(
                        "{} (this table belongs to the trainer-side config.toml; see the README's \
                         operator table)",
                        expected.join(", ")
                    ),
                });
                continue;
            }
            if *table == "training"
                || TRAINER_FILE_KEYS
                    .iter()
                    .any(|(k, r)| *k == key.as_str() && r.trainer_reads())
            {
                out.trainer_side.push(key.clone());
            }
            match key.as_str() {
                "rollout.api_server_url" => match listen_address(v) {
                    Some((host, port)) => {
                        set(dict, &mut out, "server.host", &key, Value::from(host));
                        set(dict, &mut out, "server.port", &key, Value::from(port));
                    }
                    None => errors.push(ConfigError::Invalid {
                        key,
                        value: serde_json::to_string(v).unwrap_or_default(),
                        expected:
                            "an http:// URL with a host, such as \"http://127.0.0.1:30000\": \
                                   this server listens on its host and port"
                                .to_owned(),
                        origin: Some(origin.to_owned()),
                    }),
                },
                "rollout.sample_timeout_sec" => {
                    set(
                        dict,
                        &mut out,
                        "server.session_timeout_sec",
                        &key,
                        v.clone(),
                    );
                }
                "policy.served_model_name" => {
                    set(dict, &mut out, "server.served_model_name", &key, v.clone());
                }
                "policy.model_name" => {
                    let is_dir = v.as_str().is_some_and(|p| std::path::Path::new(p).is_dir());
                    if is_dir {
                        set(dict, &mut out, "server.model_dir", &key, v.clone());
                    }
                    let served_named = keys.contains_key("served_model_name");
                    if !is_dir && !served_named {
                        set(dict, &mut out, "server.served_model_name", &key, v.clone());
                    }
                }
                "reward.prm_enabled" => set(dict, &mut out, "prm.enabled", &key, v.clone()),
                "reward.prm_num_votes" => set(dict, &mut out, "prm.num_votes", &key, v.clone()),
                _ => {}
            }
        }
    }
    // `[opd]`: its teacher keys move to `[teacher]`; `enabled` also chooses the mode.
    if let Some(Value::Dict(_, opd)) = dict.get_mut("opd") {
        let moved: BTreeMap<&str, Value> = TRAINER_OPD_KEYS
            .iter()
            .filter_map(|k| opd.remove(*k).map(|v| (*k, v)))
            .collect();
        let enabled = opd.get("enabled").and_then(Value::to_bool);
        if let Some(url) = moved.get("teacher_base_url") {
            match teacher_backend(url) {
                Some(backend) => {
                    if get(dict, "teacher.backend").is_none() {
                        set(
                            dict,
                            &mut out,
                            "teacher.backend",
                            "opd.teacher_base_url",
                            Value::from(backend),
                        );
                    }
                    set(
                        dict,
                        &mut out,
                        "teacher.url",
                        "opd.teacher_base_url",
                        url.clone(),
                    );
                }
                // Only an error when OPD is on: otherwise nothing calls the teacher.
                None if enabled == Some(true) => errors.push(ConfigError::Invalid {
                    key: "opd.teacher_base_url".to_owned(),
                    value: serde_json::to_string(url).unwrap_or_default(),
                    expected: format!(
                        "the URL of a teacher that scores given tokens: an SGLang /generate URL \
                         (such as \"http://127.0.0.1:30003/generate\") or a vLLM-style \
                         /v1/completions URL, serving a model with the policy's tokenizer. This \
                         is a chat API{}: a chat-only model cannot score given tokens (OPD needs \
                         the teacher's log-prob of each of the policy's response tokens)",
                        moved
                            .get("teacher_model")
                            .and_then(Value::as_str)
                            .map(|m| format!(" and opd.teacher_model = \"{m}\" a chat model"))
                            .unwrap_or_default()
                    ),
                    origin: Some(origin.to_owned()),
                }),
                None => {}
            }
        }
        if let Some(v) = moved.get("teacher_api_key_env") {
            set(
                dict,
                &mut out,
                "teacher.api_key_env",
                "opd.teacher_api_key_env",
                v.clone(),
            );
        }
        if let Some(v) = moved.get("teacher_model") {
            set(
                dict,
                &mut out,
                "teacher.model",
                "opd.teacher_model",
                v.clone(),
            );
        }
        if let Some(enabled) = enabled.filter(|_| trainer_file) {
            let mode = if enabled { "opd" } else { "rl" };
            set(
                dict,
                &mut out,
                "server.mode",
                "opd.enabled",
                Value::from(mode),
            );
        }
    }
    ConfigError::from_list(errors)?;
    // In the order of the list (the file's order is lost in parsing); `training.*` keys last.
    out.trainer_side.sort_by_key(|k| {
        TRAINER_FILE_KEYS
            .iter()
            .position(|(key, _)| key == k)
            .unwrap_or(TRAINER_FILE_KEYS.len())
    });
    Ok(out)
}

/// The teacher backend a `opd.teacher_base_url` names: an SGLang `/generate` URL, or a vLLM-style
/// `/v1/completions` URL; `None` for anything else (a provider root or a chat endpoint: chat APIs
/// cannot score given tokens).
fn teacher_backend(v: &Value) -> Option<&'static str> {
    let u = url::Url::parse(v.as_str()?).ok()?;
    let path = u.path().trim_end_matches('/');
    if path.ends_with("/generate") {
        Some("sglang")
    } else if path.ends_with("/completions") && !path.ends_with("/chat/completions") {
        Some("openai_completions")
    } else {
        None
    }
}

/// The host and port of `rollout.api_server_url` (the port of the scheme when it has none).
fn listen_address(v: &Value) -> Option<(String, u16)> {
    let u = url::Url::parse(v.as_str()?).ok()?;
    if !matches!(u.scheme(), "http" | "https") {
        return None;
    }
    let host = match u.host()? {
        url::Host::Ipv6(ip) => ip.to_string(),
        other => other.to_string(),
    };
    Some((host, u.port_or_known_default()?))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_bridges_keys_are_trainer_side() {
        let keys: Vec<&str> = trainer_side_keys().collect();
        for k in [
            "rollout.mode",
            "rollout.api_server_url",
            "rollout.output_queue_size",
            "rollout.sample_timeout_sec",
            "policy.tp_size",
        ] {
            assert!(keys.contains(&k), "{k}");
        }
        assert!(!keys.contains(&"reward.prm_enabled"));
    }

    #[test]
    fn teacher_urls() {
        let b = |s: &str| teacher_backend(&Value::from(s));
        assert_eq!(b("http://t:3/generate"), Some("sglang"));
        assert_eq!(b("http://t:3/v1/completions/"), Some("openai_completions"));
        assert_eq!(b("https://taotoken.net/api"), None);
        assert_eq!(b("https://taotoken.net/api/v1/chat/completions"), None);
    }

    #[test]
    fn listen_addresses() {
        let url = |s: &str| listen_address(&Value::from(s));
        assert_eq!(
            url("http://127.0.0.1:30000"),
            Some(("127.0.0.1".into(), 30000))
        );
        assert_eq!(url("http://[::1]:8"), Some(("::1".into(), 8)));
        assert_eq!(url("http://h"), Some(("h".into(), 80)));
        assert_eq!(url("127.0.0.1:30000"), None);
        assert_eq!(url("ftp://h:1"), None);
    }
}
