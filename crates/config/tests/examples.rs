//! The shipped example files and the operators' own `settings.json` load and validate.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::result_large_err)]

use std::path::PathBuf;

use ps_config::{
    DefaultTurnType, LogFormat, Mode, Overrides, PrmBackend, Settings, StoreKind, TeacherBackend,
    load_with_env,
};

fn repo_file(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn load_clean(path: PathBuf) -> Settings {
    match load_with_env(Some(&path), &Overrides::default(), &[]) {
        Ok(s) => s,
        Err(e) => panic!("{} should load: {e}", path.display()),
    }
}

#[test]
fn operators_settings_json_loads_unchanged() {
    let s = load_clean(fixture("operators_settings.json"));

    assert_eq!(s.server.host, "0.0.0.0");
    assert_eq!(s.server.port, 30000);
    assert!(s.server.submission_enabled);
    assert_eq!(s.server.session_timeout_sec, 600);

    assert_eq!(
        s.sglang.chat_url,
        "http://127.0.0.1:30001/v1/chat/completions"
    );
    assert_eq!(s.sglang.api_key.as_deref(), Some("EMPTY"));
    assert_eq!(s.sglang.timeout_sec, 120);
    assert!(s.sglang.stream);

    assert_eq!(s.prm.router_url, "http://127.0.0.1:30002/generate");
    assert_eq!(s.prm.num_votes, 3);
    assert_eq!(s.prm.timeout_sec, 60);

    // `taotoken` is read as `provider`.
    assert_eq!(
        s.provider.base_url.as_deref(),
        Some("https://taotoken.net/api")
    );
    assert_eq!(s.provider.api_key_env.as_deref(), Some("TAOTOKEN_API_KEY"));
    assert_eq!(
        s.provider.hint_model.as_deref(),
        Some("claude-sonnet-4-20250514")
    );
    assert_eq!(
        s.provider.teacher_model.as_deref(),
        Some("claude-sonnet-4-20250514")
    );
    assert_eq!(s.provider.max_concurrency, 4);
    assert_eq!(s.provider.timeout_sec, 90);
    assert_eq!(
        s.provider.chat_completions_url().as_deref(),
        Some("https://taotoken.net/api/v1/chat/completions")
    );

    assert!(s.opd.eval_votes_enabled());
    assert_eq!(s.opd.eval_mode.original(), serde_json::json!("opd_prm"));
    assert_eq!(s.opd.top_k, 20);
    assert!(s.opd.select_best_hint);
    assert!(s.opd.drop_without_next_state);

    assert_eq!(s.logging.level_filter(), Some("info"));
    assert_eq!(
        s.logging.prm_records(),
        Some(PathBuf::from("./records/prm"))
    );
    assert_eq!(
        s.logging.opd_records(),
        Some(PathBuf::from("./records/opd"))
    );

    // Everything else keeps its default.
    assert_eq!(s.server.mode, Mode::Rl);
    assert_eq!(s.server.default_turn_type, DefaultTurnType::Auto);
    assert_eq!(s.capture, Default::default());
    assert_eq!(s.store, Default::default());
    assert!(!s.opd_active());

    // Printing uses the product's name for the section.
    let json = s.redacted_json();
    assert!(json.get("provider").is_some());
    assert!(json.get("taotoken").is_none());
}

#[test]
fn example_json_loads() {
    let s = load_clean(repo_file("config/settings.example.json"));
    assert_eq!(s.server.host, "0.0.0.0");
    assert_eq!(s.server.port, 30000);
    assert_eq!(s.server.max_sessions, 10_000);
    assert_eq!(s.server.served_model_name, "qwen3-4b");
    assert_eq!(s.server.model_dir, None);
    assert_eq!(s.server.max_body_bytes, 16 * 1024 * 1024);
    assert_eq!(s.sglang.connect_timeout_sec, 5);
    assert_eq!(s.sglang.max_concurrency, 256);
    assert_eq!(s.prm.backend, PrmBackend::Sglang);
    assert!((s.prm.temperature - 0.6).abs() < 1e-12);
    assert_eq!(s.prm.max_new_tokens, 4096);
    assert_eq!(s.provider.max_retries, 3);
    assert_eq!(s.teacher.backend, TeacherBackend::Sglang);
    assert_eq!(s.teacher.max_concurrency, 3);
    assert_eq!(s.opd.enabled, None);
    assert_eq!(s.opd.min_hint_chars, 10);
    assert_eq!(s.logging.format, LogFormat::Text);
    assert!(s.capture.train_eos_without_logprob);
    assert!(!s.capture.train_unsampled);
    assert_eq!(s.store.kind, StoreKind::Embedded);
    assert_eq!(s.store.path, PathBuf::from("./data/samples"));
}

#[test]
fn example_toml_loads_and_matches_example_json() {
    let toml = load_clean(repo_file("config/settings.example.toml"));
    let json = load_clean(repo_file("config/settings.example.json"));
    assert_eq!(toml.server.host, "0.0.0.0");
    assert_eq!(
        toml.provider.base_url.as_deref(),
        Some("https://taotoken.net/api")
    );
    assert_eq!(toml.opd.top_k, 20);
    // The two examples describe the same configuration, except the model name.
    let mut toml_renamed = toml.clone();
    toml_renamed.server.served_model_name = json.server.served_model_name.clone();
    assert_eq!(toml_renamed, json);
}

#[test]
fn example_toml_states_every_default() {
    // Apart from the operator-facing values it sets on purpose, the commented example equals
    // the built-in defaults, so it documents them.
    let mut s = load_clean(repo_file("config/settings.example.toml"));
    let defaults = Settings::default();
    s.server.host = defaults.server.host.clone();
    s.sglang.api_key = None;
    s.provider = defaults.provider.clone();
    s.opd.eval_mode = defaults.opd.eval_mode.clone();
    s.opd.top_k = defaults.opd.top_k;
    s.logging.prm_record_dir = None;
    s.logging.opd_record_dir = None;
    assert_eq!(s, defaults);
}

#[test]
fn demo_toml_loads() {
    let s = load_clean(repo_file("config/demo.toml"));
    assert_eq!(s.server.host, "127.0.0.1");
    assert_eq!(s.server.port, 0);
    assert!(s.prm.enabled, "the demo judges turns with its fake SGLang");
    assert_eq!(s.prm.num_votes, 3);
    assert_eq!(s.server.default_turn_type, DefaultTurnType::Main);
    assert_eq!(s.server.model_dir, None);
    assert_eq!(s.prm_model_dir(), None);
    assert_eq!(s.server.mode, Mode::Rl);
    assert!(s.check_secrets(&|_| None).is_ok());
}

#[test]
fn the_inspect_section_loads_and_its_bounds_must_be_positive() {
    figment::Jail::expect_with(|jail| {
        jail.create_file(
            "s.toml",
            "[inspect]\nenabled = false\nmax_sessions = 5\nmax_turns_per_session = 7\n",
        )?;
        let s = load_clean(jail.directory().join("s.toml"));
        assert_eq!(
            (
                s.inspect.enabled,
                s.inspect.max_sessions,
                s.inspect.max_turns_per_session
            ),
            (false, 5, 7)
        );
        jail.create_file("bad.toml", "[inspect]\nmax_sessions = 0\n")?;
        let path = jail.directory().join("bad.toml");
        let err = load_with_env(Some(&path), &Overrides::default(), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("inspect.max_sessions"), "{err}");
        Ok(())
    });
}

#[test]
fn the_capture_queue_bound_loads_and_must_be_positive() {
    figment::Jail::expect_with(|jail| {
        assert_eq!(Settings::default().capture.max_queued_mib, 256);
        jail.create_file("s.toml", "[capture]\nmax_queued_mib = 64\n")?;
        let s = load_clean(jail.directory().join("s.toml"));
        assert_eq!(s.capture.max_queued_mib, 64);
        jail.create_file("bad.toml", "[capture]\nmax_queued_mib = 0\n")?;
        let path = jail.directory().join("bad.toml");
        let err = load_with_env(Some(&path), &Overrides::default(), &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("capture.max_queued_mib") && err.contains("greater than 0"),
            "{err}"
        );
        Ok(())
    });
}
