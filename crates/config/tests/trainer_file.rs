//! The operators' trainer-side `config.toml` (operator guide, "The two configuration layers"):
//! the server reads its keys, keeps the trainer-side ones aside, and names every problem by the
//! key as written in that file.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::result_large_err)]

use std::path::PathBuf;

use figment::Jail;
use ps_config::{ConfigError, Mode, Overrides, Settings, TeacherBackend, load};

/// The operators' file, exactly as the operator guide gives it.
fn operators_config() -> String {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/operators_config.toml");
    std::fs::read_to_string(path).unwrap()
}

/// The operators' file with its teacher on a URL that scores given tokens.
fn with_scoring_teacher() -> String {
    let text = operators_config();
    let edited = text.replace(
        "teacher_base_url = \"https://taotoken.net/api\"",
        "teacher_base_url = \"http://127.0.0.1:30003/generate\"",
    );
    assert_ne!(edited, text);
    edited
}

fn load_text(contents: &str) -> Result<Settings, ConfigError> {
    let mut out = None;
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file("config.toml", contents)?;
        out = Some(load(
            Some(&jail.directory().join("config.toml")),
            &Overrides::default(),
        ));
        Ok(())
    });
    out.expect("jail ran")
}

#[test]
fn the_operators_config_toml_is_refused_only_for_its_chat_only_teacher() {
    let e = load_text(&operators_config()).unwrap_err();
    let errors = e.errors();
    assert_eq!(errors.len(), 1, "{e}");
    let text = e.to_string();
    assert!(
        text.starts_with("opd.teacher_base_url = \"https://taotoken.net/api\""),
        "{text}"
    );
    assert!(text.contains("config.toml"), "{text}");
    assert!(
        text.contains("a chat-only model cannot score given tokens"),
        "{text}"
    );
    assert!(
        text.contains("opd.teacher_model = \"claude-sonnet-4-20250514\""),
        "{text}"
    );
    assert!(!text.contains("unknown key"), "{text}");
}

#[test]
fn the_operators_config_toml_configures_the_server_and_keeps_the_trainer_keys_aside() {
    let s = load_text(&with_scoring_teacher()).unwrap();
    // [rollout]: where this server listens, and how long a turn may wait.
    assert_eq!(s.server.host, "127.0.0.1");
    assert_eq!(s.server.port, 30000);
    assert_eq!(s.server.session_timeout_sec, 300);
    // [policy]
    assert_eq!(s.server.served_model_name, "qwen3-4b");
    assert_eq!(s.server.model_dir, None);
    // [reward]
    assert!(s.prm.enabled);
    assert_eq!(s.prm.num_votes, 3);
    // [opd]
    assert_eq!(s.server.mode, Mode::Opd);
    assert_eq!(s.opd.enabled, Some(true));
    assert!(s.opd_active());
    assert_eq!(s.opd.top_k, 20);
    assert_eq!(s.teacher.backend, TeacherBackend::Sglang);
    assert_eq!(
        s.teacher.url.as_deref(),
        Some("http://127.0.0.1:30003/generate")
    );
    assert_eq!(s.teacher.api_key_env.as_deref(), Some("TAOTOKEN_API_KEY"));
    assert_eq!(s.teacher_model(), Some("claude-sonnet-4-20250514"));
    // The trainer's keys, reported at start.
    assert_eq!(
        s.trainer_side,
        [
            "rollout.mode",
            "rollout.api_server_url",
            "rollout.output_queue_size",
            "rollout.sample_timeout_sec",
            "policy.model_name",
            "policy.tp_size",
        ]
    );
}

#[test]
fn opd_disabled_in_the_operators_file_selects_rl_and_leaves_the_teacher_unused() {
    let text = operators_config().replace("\nenabled = true", "\nenabled = false");
    assert!(text.contains("prm_enabled = true"));
    let s = load_text(&text).unwrap();
    assert_eq!(s.server.mode, Mode::Rl);
    assert!(!s.opd_active());
    assert_eq!(s.teacher.url, None);
}

#[test]
fn a_key_neither_side_knows_is_an_error_naming_it() {
    let text = with_scoring_teacher().replace("[rollout]\n", "[rollout]\nqueue_sise = 8\n");
    let e = load_text(&text).unwrap_err().to_string();
    assert!(e.contains("unknown key `rollout.queue_sise`"), "{e}");
    assert!(e.contains("`output_queue_size`"), "{e}");

    let text = format!("{}\n[trainer]\nlr = 1e-6\n", with_scoring_teacher());
    let e = load_text(&text).unwrap_err().to_string();
    assert!(e.contains("unknown key `trainer`"), "{e}");
    assert!(
        e.contains("`rollout`, `policy`, `reward`, `training`"),
        "{e}"
    );

    let text = with_scoring_teacher().replace("top_k = 20", "top_k = 20\nteacher_url = \"x\"");
    let e = load_text(&text).unwrap_err().to_string();
    assert!(e.contains("unknown key `opd.teacher_url`"), "{e}");
}

#[test]
fn a_bad_value_is_named_by_the_trainer_files_key() {
    let text = with_scoring_teacher().replace("sample_timeout_sec = 300", "sample_timeout_sec = 0");
    let e = load_text(&text).unwrap_err().to_string();
    assert!(e.starts_with("rollout.sample_timeout_sec = 0"), "{e}");

    let text = with_scoring_teacher().replace("prm_num_votes = 3", "prm_num_votes = \"three\"");
    let e = load_text(&text).unwrap_err().to_string();
    assert!(e.contains("reward.prm_num_votes"), "{e}");

    let text = with_scoring_teacher().replace("http://127.0.0.1:30000", "127.0.0.1:30000");
    let e = load_text(&text).unwrap_err().to_string();
    assert!(
        e.starts_with("rollout.api_server_url = \"127.0.0.1:30000\""),
        "{e}"
    );
}

#[test]
fn the_servers_own_keys_in_the_same_file_win() {
    let text = format!(
        "{}\n[server]\nhost = \"0.0.0.0\"\nsession_timeout_sec = 900\n",
        with_scoring_teacher()
    );
    let s = load_text(&text).unwrap();
    assert_eq!(s.server.host, "0.0.0.0");
    assert_eq!(s.server.port, 30000);
    assert_eq!(s.server.session_timeout_sec, 900);
}
