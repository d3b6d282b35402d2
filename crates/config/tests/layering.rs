//! Precedence: defaults < file < legacy variables < POLICY_SERVING_* variables < overrides.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::result_large_err)]

use std::path::{Path, PathBuf};

use figment::Jail;
use ps_config::{Overrides, Settings, load, load_with_env};

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// `load` (real process environment, which the jail controls) with errors as the jail's.
fn load_in_jail(_jail: &mut Jail, file: Option<&str>, o: &Overrides) -> figment::Result<Settings> {
    load(file.map(Path::new), o).map_err(|e| figment::Error::from(e.to_string()))
}

const FILE: &str = r#"
[server]
port = 31000
host = "10.0.0.1"
served_model_name = "from-file"

[prm]
router_url = "http://file:1/generate"
num_votes = 5

[logging]
level = "debug"
"#;

#[test]
fn defaults_apply_without_file_or_env() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        let s = load_in_jail(jail, None, &Overrides::default())?;
        assert_eq!(s, Settings::default());
        assert_eq!(s.server.host, "127.0.0.1");
        assert_eq!(s.server.port, 30000);
        Ok(())
    });
}

#[test]
fn file_beats_defaults() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file("settings.toml", FILE)?;
        let s = load_in_jail(jail, Some("settings.toml"), &Overrides::default())?;
        assert_eq!(s.server.port, 31000);
        assert_eq!(s.server.host, "10.0.0.1");
        assert_eq!(s.prm.num_votes, 5);
        assert_eq!(s.server.session_timeout_sec, 600);
        Ok(())
    });
}

#[test]
fn legacy_env_beats_file() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file("settings.toml", FILE)?;
        jail.set_env("OPENCLAW_PORT", "32000");
        jail.set_env("PORT", "1"); // OPENCLAW_PORT wins over PORT
        jail.set_env("HOST", "0.0.0.0");
        jail.set_env("PRM_ROUTER_URL", "http://legacy:2/generate");
        jail.set_env("LOG_LEVEL", "WARNING");
        jail.set_env("SERVED_MODEL_NAME", "123"); // digits stay a string
        jail.set_env("PRM_M", "7");
        jail.set_env("OPENCLAW_EVAL_MODE", "opd_prm");
        jail.set_env("OPENCLAW_OPD_TEACHER_LP_MAX_CONCURRENCY", "9");
        let s = load_in_jail(jail, Some("settings.toml"), &Overrides::default())?;
        assert_eq!(s.server.port, 32000);
        assert_eq!(s.server.host, "0.0.0.0");
        assert_eq!(s.prm.router_url, "http://legacy:2/generate");
        assert_eq!(s.logging.level, "WARNING");
        assert_eq!(s.logging.level_filter(), Some("warn"));
        assert_eq!(s.server.served_model_name, "123");
        assert_eq!(s.prm.num_votes, 7);
        assert!(s.opd.eval_votes_enabled());
        assert_eq!(s.teacher.max_concurrency, 9);
        Ok(())
    });
}

#[test]
fn port_alone_sets_the_port() {
    let s = load_with_env(None, &Overrides::default(), &env(&[("PORT", "30500")])).unwrap();
    assert_eq!(s.server.port, 30500);
}

#[test]
fn prefixed_env_beats_legacy_env() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file("settings.toml", FILE)?;
        jail.set_env("OPENCLAW_PORT", "32000");
        jail.set_env("POLICY_SERVING_SERVER__PORT", "8080");
        jail.set_env("PRM_ROUTER_URL", "http://legacy:2/generate");
        jail.set_env(
            "POLICY_SERVING_PRM__ROUTER_URL",
            "http://prefixed:3/generate",
        );
        jail.set_env(
            "POLICY_SERVING_SGLANG__CHAT_URL",
            "http://prefixed:4/v1/chat/completions",
        );
        jail.set_env("POLICY_SERVING_PRM__TEMPERATURE", "0.7");
        jail.set_env("POLICY_SERVING_SGLANG__STREAM", "false");
        jail.set_env("POLICY_SERVING_SERVER__MODEL_DIR", "/models/x");
        // Without `__` the variable belongs to the binary (e.g. the config path) and is ignored.
        jail.set_env("POLICY_SERVING_CONFIG", "/somewhere/settings.toml");
        let s = load_in_jail(jail, Some("settings.toml"), &Overrides::default())?;
        assert_eq!(s.server.port, 8080);
        assert_eq!(s.prm.router_url, "http://prefixed:3/generate");
        assert_eq!(s.sglang.chat_url, "http://prefixed:4/v1/chat/completions");
        assert_eq!(s.prm.temperature, 0.7);
        assert!(!s.sglang.stream);
        assert_eq!(s.server.model_dir, Some(PathBuf::from("/models/x")));
        assert_eq!(
            s.server.host, "10.0.0.1",
            "untouched keys keep the file's value"
        );
        Ok(())
    });
}

#[test]
fn overrides_beat_everything() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file("settings.toml", FILE)?;
        jail.set_env("OPENCLAW_PORT", "32000");
        jail.set_env("POLICY_SERVING_SERVER__PORT", "8080");
        jail.set_env("POLICY_SERVING_SERVER__HOST", "192.168.0.1");
        let o = Overrides {
            host: Some("::1".to_owned()),
            port: Some(9090),
            model_dir: Some(PathBuf::from("/models/override")),
        };
        let s = load_in_jail(jail, Some("settings.toml"), &o)?;
        assert_eq!(s.server.port, 9090);
        assert_eq!(s.server.host, "::1");
        assert_eq!(s.server.model_dir, Some(PathBuf::from("/models/override")));
        assert_eq!(s.prm.num_votes, 5);
        Ok(())
    });
}

#[test]
fn json_and_toml_give_the_same_settings() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "a.json",
            r#"{ "server": { "port": 1234, "mode": "combine" }, "teacher": { "url": "http://t:1/generate" },
                 "provider": { "base_url": "https://p.example/api", "hint_model": "h" } }"#,
        )?;
        jail.create_file(
            "b.TOML",
            "[server]\nport = 1234\nmode = \"combine\"\n[teacher]\nurl = \"http://t:1/generate\"\n\
             [provider]\nbase_url = \"https://p.example/api\"\nhint_model = \"h\"\n",
        )?;
        let a = load_in_jail(jail, Some("a.json"), &Overrides::default())?;
        let b = load_in_jail(jail, Some("b.TOML"), &Overrides::default())?;
        assert_eq!(a, b);
        assert!(a.opd_active());
        Ok(())
    });
}

#[test]
fn taotoken_alias_in_env_and_file_layers_merge() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "s.json",
            r#"{ "taotoken": { "base_url": "https://taotoken.net/api", "max_concurrency": 4 } }"#,
        )?;
        // The file says `taotoken`, the environment says `provider`: one section.
        jail.set_env("POLICY_SERVING_PROVIDER__MAX_CONCURRENCY", "8");
        let s = load_in_jail(jail, Some("s.json"), &Overrides::default())?;
        assert_eq!(
            s.provider.base_url.as_deref(),
            Some("https://taotoken.net/api")
        );
        assert_eq!(s.provider.max_concurrency, 8);

        // And the other way round.
        jail.clear_env();
        jail.create_file("p.json", r#"{ "provider": { "max_concurrency": 4 } }"#)?;
        jail.set_env("POLICY_SERVING_TAOTOKEN__HINT_MODEL", "hinter");
        let s = load_in_jail(jail, Some("p.json"), &Overrides::default())?;
        assert_eq!(s.provider.hint_model.as_deref(), Some("hinter"));
        assert_eq!(s.provider.max_concurrency, 4);
        Ok(())
    });
}

#[test]
fn empty_env_values_are_ignored() {
    let s = load_with_env(
        None,
        &Overrides::default(),
        &env(&[("LOG_LEVEL", ""), ("POLICY_SERVING_SERVER__PORT", " ")]),
    )
    .unwrap();
    assert_eq!(s.logging.level, "INFO");
    assert_eq!(s.server.port, 30000);
}

#[test]
fn later_env_pair_wins() {
    let s = load_with_env(
        None,
        &Overrides::default(),
        &env(&[
            ("POLICY_SERVING_SERVER__PORT", "1"),
            ("POLICY_SERVING_SERVER__PORT", "2"),
        ]),
    )
    .unwrap();
    assert_eq!(s.server.port, 2);
}

#[test]
fn eval_mode_accepts_strings_and_booleans() {
    for (value, votes) in [
        (r#""opd_prm""#, true),
        (r#""none""#, false),
        (r#""""#, false),
        (r#""OPD""#, false),
        ("true", true),
        ("false", false),
    ] {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file(
                "s.json",
                &format!(r#"{{ "opd": {{ "eval_mode": {value} }} }}"#),
            )?;
            let s = load_in_jail(jail, Some("s.json"), &Overrides::default())?;
            assert_eq!(s.opd.eval_votes_enabled(), votes, "eval_mode = {value}");
            // The original is kept for printing.
            let printed = s.redacted_json()["opd"]["eval_mode"].to_string();
            assert_eq!(printed, value);
            Ok(())
        });
    }
    // From the legacy variable, "true" and "1" work too.
    for (value, votes) in [("true", true), ("1", true), ("0", false), ("none", false)] {
        let s = load_with_env(
            None,
            &Overrides::default(),
            &env(&[("OPENCLAW_EVAL_MODE", value)]),
        )
        .unwrap();
        assert_eq!(
            s.opd.eval_votes_enabled(),
            votes,
            "OPENCLAW_EVAL_MODE={value}"
        );
    }
}

/// `opd.teacher_temperature` takes a number or `"rollout"`; `capture.sampling` its two words.
#[test]
fn teacher_temperature_and_sampling_load() {
    use ps_core::ports::TeacherTemperature;
    for (written, want) in [
        ("0", TeacherTemperature::Fixed(0.0)),
        ("0.7", TeacherTemperature::Fixed(0.7)),
        ("1", TeacherTemperature::Fixed(1.0)),
        ("\"rollout\"", TeacherTemperature::Rollout),
    ] {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file(
                "settings.toml",
                &format!(
                    "[opd]\nteacher_temperature = {written}\n[capture]\nsampling = \"full_distribution\"\n"
                ),
            )?;
            let s = load_in_jail(jail, Some("settings.toml"), &Overrides::default())?;
            assert_eq!(s.opd.teacher_temperature, want);
            assert_eq!(s.capture.sampling, ps_core::SamplingMode::FullDistribution);
            Ok(())
        });
    }
    assert_eq!(
        Settings::default().opd.teacher_temperature,
        TeacherTemperature::Fixed(0.0)
    );
}
