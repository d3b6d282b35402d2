//! Secrets come from the environment through a lookup closure, and are never printed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::result_large_err)]

use std::collections::HashMap;
use std::path::PathBuf;

use ps_config::{ConfigError, Overrides, Settings, load_with_env, process_env, resolve_secret};

fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    move |name: &str| map.get(name).cloned()
}

fn operators() -> Settings {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/operators_settings.json");
    load_with_env(Some(&path), &Overrides::default(), &[]).unwrap()
}

#[test]
fn missing_secret_names_variable_and_key() {
    let s = operators();
    let e = s.provider_api_key(&lookup(&[])).unwrap_err();
    assert!(matches!(e, ConfigError::MissingSecret { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "provider.api_key_env names TAOTOKEN_API_KEY, which is not set in the environment"
    );

    let e = s
        .provider_api_key(&lookup(&[("TAOTOKEN_API_KEY", "  ")]))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "provider.api_key_env names TAOTOKEN_API_KEY, which is set but empty"
    );

    let key = s
        .provider_api_key(&lookup(&[("TAOTOKEN_API_KEY", "sk-123")]))
        .unwrap()
        .unwrap();
    assert_eq!(key.expose(), "sk-123");
    assert_eq!(key.source(), "environment variable TAOTOKEN_API_KEY");
}

#[test]
fn secrets_print_redacted() {
    let key = resolve_secret(
        "provider.api_key_env",
        "K",
        &lookup(&[("K", "sk-top-secret")]),
    )
    .unwrap();
    assert_eq!(format!("{key}"), "<redacted>");
    assert_eq!(format!("{key:?}"), "<redacted>");
    assert_eq!(format!("{:?}", Some(key)), "Some(<redacted>)");
}

#[test]
fn process_env_is_a_lookup() {
    // In a jail: `bad_value_of_the_literal_key_is_not_echoed` clears the whole process's
    // environment while it runs, and figment's jails take turns. (Outside one, this test once saw
    // no PATH in CI, 2026-12-02, when the two ran at the same moment.)
    figment::Jail::expect_with(|jail| {
        jail.set_env("POLICY_SERVING_TEST_LOOKUP", "value");
        assert_eq!(
            process_env("POLICY_SERVING_TEST_LOOKUP").as_deref(),
            Some("value")
        );
        assert_eq!(process_env("POLICY_SERVING_TEST_NEVER_SET"), None);
        let s = Settings::default();
        assert!(s.provider_api_key(&process_env).unwrap().is_none());
        Ok(())
    });
}

#[test]
fn client_key_comes_from_api_key_env_else_legacy_sglang_api_key() {
    let mut s = Settings::default();
    assert!(s.client_api_key(&lookup(&[])).unwrap().is_none());
    assert!(
        s.client_api_key(&lookup(&[("SGLANG_API_KEY", "")]))
            .unwrap()
            .is_none()
    );

    let legacy = s
        .client_api_key(&lookup(&[("SGLANG_API_KEY", "client-key")]))
        .unwrap()
        .unwrap();
    assert_eq!(legacy.expose(), "client-key");

    s.server.api_key_env = Some("PROXY_KEY".to_owned());
    let e = s
        .client_api_key(&lookup(&[("SGLANG_API_KEY", "client-key")]))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "server.api_key_env names PROXY_KEY, which is not set in the environment"
    );
    let key = s
        .client_api_key(&lookup(&[
            ("SGLANG_API_KEY", "legacy"),
            ("PROXY_KEY", "new"),
        ]))
        .unwrap()
        .unwrap();
    assert_eq!(key.expose(), "new");
}

#[test]
fn sglang_key_prefers_api_key_env_over_literal() {
    let mut s = operators();
    assert_eq!(
        s.sglang_api_key(&lookup(&[])).unwrap().unwrap().expose(),
        "EMPTY"
    );

    s.sglang.api_key = Some(String::new());
    assert!(s.sglang_api_key(&lookup(&[])).unwrap().is_none());

    s.sglang.api_key_env = Some("UPSTREAM_KEY".to_owned());
    assert!(matches!(
        s.sglang_api_key(&lookup(&[])),
        Err(ConfigError::MissingSecret { .. })
    ));
    let key = s
        .sglang_api_key(&lookup(&[("UPSTREAM_KEY", "up")]))
        .unwrap()
        .unwrap();
    assert_eq!(key.expose(), "up");
}

#[test]
fn check_secrets_reports_every_missing_variable_of_active_features() {
    // RL mode with the sglang PRM does not call the provider: its key is not needed.
    assert!(operators().check_secrets(&lookup(&[])).is_ok());
    // Nor does OPD with the hint judge on SGLang.
    let mut sglang_opd = operators();
    sglang_opd.server.mode = ps_config::Mode::Opd;
    sglang_opd.teacher.url = Some("http://127.0.0.1:30003/generate".to_owned());
    assert!(sglang_opd.check_secrets(&lookup(&[])).is_ok());

    let mut s = operators();
    s.server.mode = ps_config::Mode::Opd;
    // The operators' hint judge is their provider (taotoken.hint_model).
    s.opd.hint_backend = ps_config::PrmBackend::Provider;
    s.teacher.url = Some("http://127.0.0.1:30003/generate".to_owned());
    s.teacher.api_key_env = Some("TEACHER_KEY".to_owned());
    s.server.api_key_env = Some("PROXY_KEY".to_owned());
    s.validate().unwrap();
    let e = s.check_secrets(&lookup(&[])).unwrap_err();
    let text = e.to_string();
    assert_eq!(e.errors().len(), 3, "{text}");
    for var in ["PROXY_KEY", "TAOTOKEN_API_KEY", "TEACHER_KEY"] {
        assert!(text.contains(var), "{text}");
    }
    assert!(
        s.check_secrets(&lookup(&[
            ("PROXY_KEY", "a"),
            ("TAOTOKEN_API_KEY", "b"),
            ("TEACHER_KEY", "c"),
        ]))
        .is_ok()
    );
}

#[test]
fn redacted_json_never_contains_a_literal_secret() {
    let mut s = operators();
    s.sglang.api_key = Some("sk-literal-upstream-secret".to_owned());
    s.sglang.chat_url = "http://user:url-password@127.0.0.1:30001/v1/chat/completions".to_owned();
    s.prm.router_url = "http://judge:judge-password@127.0.0.1:30002/generate".to_owned();
    s.teacher.api_key_env = Some("sk-pasted-key-by-mistake".to_owned());
    s.store.redis.url = "redis://:redis-password@10.0.0.9:6379/1".to_owned();

    let printed = s.redacted_json().to_string();
    for secret in [
        "sk-literal-upstream-secret",
        "url-password",
        "judge-password",
        "sk-pasted-key-by-mistake",
        "redis-password",
    ] {
        assert!(!printed.contains(secret), "{secret} leaked: {printed}");
    }
    let json = s.redacted_json();
    assert_eq!(json["sglang"]["api_key"], "<redacted>");
    assert_eq!(json["teacher"]["api_key_env"], "<redacted>");
    // Variable names are kept: they tell the operator what to export.
    assert_eq!(json["provider"]["api_key_env"], "TAOTOKEN_API_KEY");
    assert_eq!(
        json["sglang"]["chat_url"],
        "http://user:redacted@127.0.0.1:30001/v1/chat/completions"
    );
    assert!(!s.redacted_json_pretty().contains("sk-literal"));
    assert_eq!(
        json["store"]["redis"]["url"],
        "redis://:redacted@10.0.0.9:6379/1"
    );

    // Secrets resolved from the environment never enter the settings at all.
    let env = vec![("TAOTOKEN_API_KEY".to_owned(), "sk-env-secret".to_owned())];
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/operators_settings.json");
    let loaded = load_with_env(Some(&path), &Overrides::default(), &env).unwrap();
    assert!(!loaded.redacted_json().to_string().contains("sk-env-secret"));
    assert!(!format!("{loaded:?}").contains("sk-env-secret"));
}

#[test]
fn bad_value_of_the_literal_key_is_not_echoed() {
    figment::Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file("s.json", r#"{ "sglang": { "api_key": 987654321 } }"#)?;
        let e = ps_config::load(Some(std::path::Path::new("s.json")), &Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("sglang.api_key = \"<redacted>\""), "{e}");
        assert!(!e.contains("987654321"), "{e}");
        Ok(())
    });
}

#[test]
fn debug_of_settings_hides_the_literal_key() {
    let mut s = Settings::default();
    s.sglang.api_key = Some("sk-literal".to_owned());
    let debug = format!("{s:?}");
    assert!(!debug.contains("sk-literal"), "{debug}");
    assert!(debug.contains("api_key: Some(<redacted>)"), "{debug}");
}

#[test]
fn a_completions_teacher_without_its_own_url_uses_the_provider_root_and_key() {
    let mut s = operators();
    s.server.mode = ps_config::Mode::Opd;
    s.teacher.backend = ps_config::TeacherBackend::OpenaiCompletions;
    s.validate().unwrap();
    assert_eq!(s.teacher_url(), Some("https://taotoken.net/api"));
    assert_eq!(s.teacher_model(), Some("claude-sonnet-4-20250514"));
    let e = s.check_secrets(&lookup(&[])).unwrap_err().to_string();
    assert!(
        e.contains("provider.api_key_env names TAOTOKEN_API_KEY"),
        "{e}"
    );
    let key = s
        .teacher_api_key(&lookup(&[("TAOTOKEN_API_KEY", "k")]))
        .unwrap()
        .unwrap();
    assert_eq!(key.expose(), "k");
}
