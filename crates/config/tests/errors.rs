//! Every error names what the operator must fix: file, key path, value, expectation, variable.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::result_large_err)]

use std::path::{Path, PathBuf};

use figment::Jail;
use ps_config::{ConfigError, Overrides, load, load_with_env};

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Loads `contents` written to `name` in a jail; returns the error text.
fn load_error(name: &str, contents: &str) -> (ConfigError, String, PathBuf) {
    let mut out = None;
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(name, contents)?;
        let path = jail.directory().join(name);
        match load(Some(&path), &Overrides::default()) {
            Ok(s) => Err(format!("expected an error, loaded {s:?}").into()),
            Err(e) => {
                out = Some((e, path));
                Ok(())
            }
        }
    });
    let (e, path) = out.expect("jail ran");
    let text = e.to_string();
    (e, text, path)
}

#[test]
fn unknown_key_names_key_path_and_file() {
    let (e, text, path) = load_error(
        "settings.json",
        r#"{ "sglang": { "chat_ur": "http://x/v1/chat/completions" } }"#,
    );
    assert!(matches!(e, ConfigError::UnknownKey { .. }), "{e:?}");
    assert!(text.contains("`sglang.chat_ur`"), "{text}");
    assert!(text.contains(&path.display().to_string()), "{text}");
    assert!(
        text.contains("`chat_url`"),
        "lists the accepted keys: {text}"
    );
}

#[test]
fn unknown_section_lists_sections_and_the_alias() {
    let (_, text, path) = load_error("settings.toml", "[sglangg]\nchat_url = \"x\"\n");
    assert!(text.contains("unknown key `sglangg`"), "{text}");
    assert!(text.contains(&path.display().to_string()), "{text}");
    assert!(text.contains("`taotoken`"), "{text}");
}

#[test]
fn unknown_key_under_taotoken_is_named_as_written() {
    let (_, text, _) = load_error("settings.json", r#"{ "taotoken": { "base_ur": "x" } }"#);
    assert!(text.contains("`taotoken.base_ur`"), "{text}");
}

#[test]
fn unknown_key_in_env_names_the_variable() {
    let e = load_with_env(
        None,
        &Overrides::default(),
        &env(&[("POLICY_SERVING_SGLANG__CHAT_UR", "http://x")]),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("`sglang.chat_ur`"), "{e}");
    assert!(e.contains("POLICY_SERVING_SGLANG__CHAT_UR"), "{e}");
}

#[test]
fn bad_value_names_key_value_and_expectation() {
    let (e, text, path) = load_error("settings.json", r#"{ "server": { "port": "abc" } }"#);
    assert!(matches!(e, ConfigError::BadValue { .. }), "{e:?}");
    assert!(
        text.starts_with(&format!(
            "server.port = \"abc\" in {}: expected an integer 0..=65535",
            path.display()
        )),
        "{text}"
    );

    let (_, text, _) = load_error("settings.toml", "[server]\nport = 70000\n");
    assert!(text.contains("server.port = 70000"), "{text}");
    assert!(text.contains("0..=65535"), "{text}");

    let (_, text, _) = load_error("settings.toml", "[sglang]\nstream = \"sometimes\"\n");
    assert!(text.contains("sglang.stream = \"sometimes\""), "{text}");
    assert!(text.contains("true or false"), "{text}");

    let (_, text, _) = load_error("settings.toml", "[server]\nmode = \"distill\"\n");
    assert!(text.contains("server.mode = \"distill\""), "{text}");
    assert!(text.contains("`rl`, `opd`, `combine`"), "{text}");

    let (_, text, _) = load_error(
        "settings.json",
        r#"{ "opd": { "eval_mode": "sometimes" } }"#,
    );
    assert!(text.contains("opd.eval_mode = \"sometimes\""), "{text}");
    assert!(text.contains("opd_prm"), "{text}");

    let (_, text, _) = load_error("settings.json", r#"{ "server": 5 }"#);
    assert!(text.contains("server = 5"), "{text}");

    let (_, text, _) = load_error("settings.toml", "[capture]\nsampling = \"top_p\"\n");
    assert!(text.contains("capture.sampling = \"top_p\""), "{text}");
    assert!(text.contains("`as_sent`, `full_distribution`"), "{text}");
    for bad in ["-0.5", "\"warm\""] {
        let (_, text, _) = load_error(
            "settings.toml",
            &format!("[opd]\nteacher_temperature = {bad}\n"),
        );
        assert!(
            text.contains(&format!("opd.teacher_temperature = {bad}")),
            "{text}"
        );
        assert!(
            text.contains("a temperature of at least 0, or \"rollout\""),
            "{text}"
        );
    }
}

#[test]
fn bad_value_from_env_names_the_variable() {
    let e = load_with_env(
        None,
        &Overrides::default(),
        &env(&[("OPENCLAW_PORT", "abc")]),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("server.port = \"abc\""), "{e}");
    assert!(e.contains("OPENCLAW_PORT"), "{e}");

    let e = load_with_env(None, &Overrides::default(), &env(&[("PRM_M", "many")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("prm.num_votes = \"many\""), "{e}");
    assert!(e.contains("PRM_M"), "{e}");
}

#[test]
fn both_provider_and_taotoken_is_an_error() {
    let (e, text, path) = load_error(
        "settings.json",
        r#"{ "provider": { "hint_model": "a" }, "taotoken": { "hint_model": "b" } }"#,
    );
    assert!(
        matches!(e, ConfigError::DuplicateProviderSection { .. }),
        "{e:?}"
    );
    assert!(
        text.contains("`provider`") && text.contains("`taotoken`"),
        "{text}"
    );
    assert!(text.contains(&path.display().to_string()), "{text}");

    let e = load_with_env(
        None,
        &Overrides::default(),
        &env(&[
            ("POLICY_SERVING_PROVIDER__HINT_MODEL", "a"),
            ("POLICY_SERVING_TAOTOKEN__HINT_MODEL", "b"),
        ]),
    )
    .unwrap_err();
    assert!(
        matches!(e, ConfigError::DuplicateProviderSection { .. }),
        "{e:?}"
    );
}

#[test]
fn unsupported_extension_is_an_error() {
    for name in ["settings.yaml", "settings"] {
        let e = load_with_env(Some(Path::new(name)), &Overrides::default(), &[]).unwrap_err();
        assert!(
            matches!(e, ConfigError::UnsupportedExtension { .. }),
            "{e:?}"
        );
        let text = e.to_string();
        assert!(text.contains(name), "{text}");
        assert!(text.contains(".json or .toml"), "{text}");
    }
}

#[test]
fn missing_file_names_the_path() {
    let path = Path::new("/nonexistent/dir/settings.json");
    let e = load_with_env(Some(path), &Overrides::default(), &[]).unwrap_err();
    assert!(matches!(e, ConfigError::FileNotFound { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "configuration file /nonexistent/dir/settings.json does not exist"
    );
}

#[test]
fn syntax_error_names_the_file() {
    let (e, text, path) = load_error("settings.json", r#"{ "server": { "port": 1, } "#);
    assert!(matches!(e, ConfigError::Parse { .. }), "{e:?}");
    assert!(text.contains(&path.display().to_string()), "{text}");
}

#[test]
fn teacher_provider_chat_is_explained() {
    let (e, text, path) = load_error("settings.toml", "[teacher]\nbackend = \"provider_chat\"\n");
    assert!(matches!(e, ConfigError::Invalid { .. }), "{e:?}");
    assert!(
        text.contains("teacher.backend = \"provider_chat\""),
        "{text}"
    );
    assert!(text.contains("cannot return the log-probs"), "{text}");
    assert!(text.contains("/generate"), "{text}");
    assert!(text.contains("/v1/completions"), "{text}");
    assert!(
        text.contains(&path.display().to_string()),
        "names the file: {text}"
    );
}

#[test]
fn validation_errors_name_key_value_expectation_and_origin() {
    let (e, text, path) = load_error(
        "settings.toml",
        "[prm]\nnum_votes = 0\n[sglang]\nchat_url = \"localhost:30001\"\ntimeout_sec = 0\n",
    );
    assert_eq!(e.errors().len(), 3, "all problems at once: {text}");
    let file = path.display().to_string();
    assert!(
        text.contains(&format!("prm.num_votes = 0 (set in {file}): at least 1")),
        "{text}"
    );
    assert!(
        text.contains("sglang.chat_url = \"localhost:30001\""),
        "{text}"
    );
    assert!(text.contains("http:// or https://"), "{text}");
    assert!(text.contains("sglang.timeout_sec = 0"), "{text}");

    let e = load_with_env(None, &Overrides::default(), &env(&[("PRM_M", "0")]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("prm.num_votes = 0 (set in legacy environment variable PRM_M)"),
        "{e}"
    );

    let e = load_with_env(None, &Overrides::default(), &env(&[("LOG_LEVEL", "loud")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("logging.level = \"loud\""), "{e}");
    assert!(e.contains("warn"), "{e}");
}

#[test]
fn provider_base_url_with_or_without_v1_reaches_the_same_path() {
    for base in [
        "https://taotoken.net/api",
        "https://taotoken.net/api/",
        "https://taotoken.net/api/v1",
        "https://taotoken.net/api/v1/",
    ] {
        let mut s = ps_config::Settings::default();
        s.provider.base_url = Some(base.into());
        s.validate().unwrap();
        assert_eq!(
            s.provider.chat_completions_url().as_deref(),
            Some("https://taotoken.net/api/v1/chat/completions"),
            "{base}"
        );
    }
}

#[test]
fn provider_base_url_with_the_endpoint_path_is_rejected_with_what_to_write() {
    let (_, text, _) = load_error(
        "settings.json",
        r#"{ "taotoken": { "base_url": "https://taotoken.net/api/v1/chat/completions" } }"#,
    );
    assert!(
        text.contains("taotoken.base_url = \"https://taotoken.net/api/v1/chat/completions\""),
        "{text}"
    );
    assert!(
        text.contains("write \"https://taotoken.net/api\""),
        "{text}"
    );
}

#[test]
fn opd_mode_requires_teacher_and_hint_judge() {
    let (e, text, _) = load_error("settings.toml", "[server]\nmode = \"opd\"\n");
    let keys: Vec<String> = e
        .errors()
        .iter()
        .filter_map(|e| match e {
            ConfigError::Invalid { key, .. } => Some(key.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(keys, ["teacher.url"], "{text}");

    // With the hint judge on the provider, the provider's root and model are needed too.
    let (e, text, _) = load_error(
        "settings.toml",
        "[server]\nmode = \"opd\"\n[opd]\nhint_backend = \"provider\"\n",
    );
    let keys: Vec<String> = e
        .errors()
        .iter()
        .filter_map(|e| match e {
            ConfigError::Invalid { key, .. } => Some(key.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        keys,
        ["provider.base_url", "provider.hint_model", "teacher.url"],
        "{text}"
    );

    let (_, text, _) = load_error("settings.toml", "[opd]\nenabled = true\n");
    assert!(text.contains("opd.enabled = true"), "{text}");
    assert!(text.contains("server.mode"), "{text}");
}

#[test]
fn api_key_env_holding_a_key_is_rejected_without_echoing_it() {
    let (_, text, _) = load_error(
        "settings.json",
        r#"{ "provider": { "api_key_env": "sk-live-1234567890abcdef" } }"#,
    );
    assert!(
        text.contains("provider.api_key_env = \"<redacted>\""),
        "{text}"
    );
    assert!(!text.contains("sk-live"), "{text}");
}

#[test]
fn combine_mode_refuses_top_k_and_a_disabled_prm() {
    let (_, text, _) = load_error(
        "settings.toml",
        "[server]\nmode = \"combine\"\n[teacher]\nurl = \"http://t/generate\"\n[opd]\ntop_k = 20\n[prm]\nenabled = false\n",
    );
    assert!(text.contains("opd.top_k = 20"), "{text}");
    assert!(
        text.contains("RL-only samples have no teacher top-K"),
        "{text}"
    );
    assert!(text.contains("prm.enabled = false"), "{text}");
}

#[test]
fn redis_store_settings_are_checked_naming_each_key() {
    let (_, text, _) = load_error(
        "settings.json",
        r#"{ "store": { "kind": "redis", "redis": {
            "url": "http://127.0.0.1:6379", "deployment": "a b", "group": "",
            "replica": "x{y}", "claim_idle_sec": 0, "timeout_sec": 0 } } }"#,
    );
    for key in [
        "store.redis.url",
        "store.redis.deployment",
        "store.redis.group",
        "store.redis.replica",
        "store.redis.claim_idle_sec",
        "store.redis.timeout_sec",
    ] {
        assert!(text.contains(key), "{key} missing from: {text}");
    }
    let (_, text, _) = load_error("settings.json", r#"{ "store": { "kind": "kafka" } }"#);
    assert!(text.contains("store.kind"), "{text}");
}

#[test]
fn session_inference_and_side_turn_rules_name_the_key() {
    let (_, text, _) = load_error(
        "settings.toml",
        "[server]\nsession_inference = \"sometimes\"\n",
    );
    assert!(text.contains("server.session_inference"), "{text}");
    assert!(
        text.contains("when_missing"),
        "lists the accepted values: {text}"
    );

    let (e, text, _) = load_error(
        "settings.toml",
        "[[server.side_turn_rules]]\nname = \"everything\"\n\n\
         [[server.side_turn_rules]]\nname = \"\"\nsystem_prefix = \" \"\n\n\
         [[server.side_turn_rules]]\nname = \"small\"\nmodel = \" \"\n",
    );
    assert_eq!(e.errors().len(), 4, "{text}");
    assert!(text.contains("server.side_turn_rules[2].model"), "{text}");
    assert!(text.contains("server.side_turn_rules[0]"), "{text}");
    assert!(text.contains("at least one condition"), "{text}");
    assert!(text.contains("server.side_turn_rules[1].name"), "{text}");
    assert!(
        text.contains("server.side_turn_rules[1].system_prefix"),
        "{text}"
    );

    let (_, text, _) = load_error(
        "settings.toml",
        "[[server.side_turn_rules]]\nname = \"t\"\nmax_token = 5\n",
    );
    assert!(text.contains("max_token"), "{text}");
}

#[test]
fn model_names_need_both_names() {
    let (e, text, _) = load_error(
        "settings.toml",
        "[server]\nserved_model_name = \"qwen3-4b\"\n\n[server.model_names]\n\"\" = \"qwen3-4b\"\n\"claude-haiku-4-5\" = \" \"\n\"qwen3-4b\" = \"other\"\n",
    );
    assert_eq!(e.errors().len(), 3, "{text}");
    assert!(text.contains("server.model_names.qwen3-4b"), "{text}");
    assert!(text.contains("server.model_names"), "{text}");
    assert!(
        text.contains("server.model_names.claude-haiku-4-5"),
        "{text}"
    );
}

#[test]
fn agent_session_keys_name_a_header_or_a_body_key() {
    let (e, text, _) = load_error(
        "settings.toml",
        "[server]\nagent_session_keys = [\"header:x-claude-code-session-id\", \"x-session\", \"body: \", \"header:x session\"]\n",
    );
    assert_eq!(e.errors().len(), 3, "{text}");
    assert!(text.contains("server.agent_session_keys[3]"), "{text}");
    assert!(text.contains("server.agent_session_keys[1]"), "{text}");
    assert!(text.contains("server.agent_session_keys[2]"), "{text}");
    assert!(text.contains("header:NAME"), "{text}");
}

#[test]
fn session_inference_defaults_to_when_missing_and_rules_load() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "settings.toml",
            "[server]\nsession_inference = \"always\"\n\n[[server.side_turn_rules]]\nname = \"title\"\nlast_user_prefix = \"### Task:\"\nwithout_tools = true\n\n[[server.side_turn_rules]]\nname = \"small_fast_model\"\nmodel = \"claude-haiku-4-5\"\n",
        )?;
        let s = load(
            Some(&jail.directory().join("settings.toml")),
            &Overrides::default(),
        )
        .map_err(|e| e.to_string())?;
        assert_eq!(
            s.server.session_inference,
            ps_config::SessionInference::Always
        );
        assert_eq!(s.server.side_turn_rules.len(), 2);
        assert!(s.server.side_turn_rules[0].without_tools);
        assert_eq!(
            s.server.side_turn_rules[1].model.as_deref(),
            Some("claude-haiku-4-5"),
            "a rule on the model alone loads"
        );
        Ok(())
    });
    assert_eq!(
        ps_config::Settings::default().server.session_inference,
        ps_config::SessionInference::WhenMissing
    );
}
