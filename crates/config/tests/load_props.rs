//! Property tests of configuration loading: any settings text (TOML or JSON), random mutations of the
//! example settings files, and random environment variables give `Ok` or an `Err` whose message is
//! not empty: never a panic. A loaded configuration can be printed and its secrets checked.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::result_large_err)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use ps_config::{ConfigError, Overrides, Settings, load_with_env};
use serde_json::{Value, json};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        ..ProptestConfig::default()
    }
}

/// A directory of this test process, removed at exit of each test that made it.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "ps-config-load-props-{}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn write(&self, ext: &str, contents: &[u8]) -> PathBuf {
        static N: AtomicUsize = AtomicUsize::new(0);
        let path = self.0.join(format!(
            "settings-{}.{ext}",
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, contents).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn example(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../config")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Loads and, when it loads, uses the settings the way the binary does.
fn load_checked(
    file: Option<&Path>,
    env: &[(String, String)],
) -> Result<Option<Settings>, TestCaseError> {
    match load_with_env(file, &Overrides::default(), env) {
        Ok(s) => {
            let lookup = |name: &str| {
                env.iter()
                    .rev()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.clone())
            };
            let _ = s.check_secrets(&lookup);
            let printed = s.redacted_json_pretty();
            prop_assert!(!printed.is_empty());
            let _ = (s.server.session_timeout(), s.server.shutdown_grace());
            let _ = (
                s.sglang.timeout(),
                s.sglang.connect_timeout(),
                s.prm.timeout(),
            );
            let _ = (
                s.provider.chat_completions_url(),
                s.teacher_url(),
                s.teacher_model(),
            );
            let _ = (s.logging.conversation_records(), s.logging.prm_records());
            let _ = (s.capture.align_policy(), s.opd_active());
            Ok(Some(s))
        }
        Err(e) => {
            assert_message(&e)?;
            Ok(None)
        }
    }
}

fn assert_message(e: &ConfigError) -> Result<(), TestCaseError> {
    let text = e.to_string();
    prop_assert!(!text.trim().is_empty(), "empty message for {:?}", e);
    Ok(())
}

/// TOML literals, valid or not, and some values each key rejects.
fn toml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0".to_owned()),
        Just("-1".to_owned()),
        Just("1".to_owned()),
        Just("65536".to_owned()),
        Just("9223372036854775807".to_owned()),
        Just("99999999999999999999".to_owned()),
        Just("nan".to_owned()),
        Just("inf".to_owned()),
        Just("-inf".to_owned()),
        Just("1e308".to_owned()),
        Just("0.5".to_owned()),
        Just("true".to_owned()),
        Just("false".to_owned()),
        Just("\"\"".to_owned()),
        Just("\" \"".to_owned()),
        Just("\"main\"".to_owned()),
        Just("\"combine\"".to_owned()),
        Just("\"provider\"".to_owned()),
        Just("\"http://[::1]:0/v1/chat/completions\"".to_owned()),
        Just("\"https://x/v1/chat/completions\"".to_owned()),
        Just("\"not a url\"".to_owned()),
        Just("\"../../etc\"".to_owned()),
        Just("\"\\u0000\"".to_owned()),
        Just("[1, \"a\"]".to_owned()),
        Just("[]".to_owned()),
        Just("{ a = 1 }".to_owned()),
        Just("{}".to_owned()),
        Just("1979-05-27T07:32:00Z".to_owned()),
        Just("\"\"\"\nmulti\nline\"\"\"".to_owned()),
        "\"[a-zA-Z0-9_./:é ]{0,16}\"",
        "-?[0-9]{1,22}",
        ".{0,10}",
    ]
}

/// Values that often suit the key they replace (so that many mutated files still load).
fn plausible_toml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        "[1-9][0-9]{0,3}",
        Just("true".to_owned()),
        Just("false".to_owned()),
        Just("\"/tmp/ps-config-props\"".to_owned()),
        Just("\"http://127.0.0.1:30002/generate\"".to_owned()),
        Just("\"rl\"".to_owned()),
        Just("\"main\"".to_owned()),
        Just("\"json\"".to_owned()),
        Just("0.7".to_owned()),
    ]
}

#[derive(Debug, Clone)]
enum LineEdit {
    ReplaceValue(prop::sample::Index, String),
    Delete(prop::sample::Index),
    Duplicate(prop::sample::Index),
    Uncomment(prop::sample::Index),
    RenameKey(prop::sample::Index, String),
    InsertRaw(prop::sample::Index, String),
    Truncate(prop::sample::Index),
}

fn line_edit() -> impl Strategy<Value = LineEdit> {
    let idx = any::<prop::sample::Index>;
    prop_oneof![
        4 => (idx(), toml_value()).prop_map(|(i, v)| LineEdit::ReplaceValue(i, v)),
        6 => (idx(), plausible_toml_value()).prop_map(|(i, v)| LineEdit::ReplaceValue(i, v)),
        2 => idx().prop_map(LineEdit::Delete),
        1 => idx().prop_map(LineEdit::Duplicate),
        3 => idx().prop_map(LineEdit::Uncomment),
        1 => (idx(), "[a-z_]{0,3}").prop_map(|(i, s)| LineEdit::RenameKey(i, s)),
        1 => (idx(), prop_oneof![
            Just("[taotoken]".to_owned()),
            Just("[provider]".to_owned()),
            Just("[server]".to_owned()),
            Just("[server.extra]".to_owned()),
            Just("[[server]]".to_owned()),
            Just("extra = 1".to_owned()),
            ".{0,12}",
        ]).prop_map(|(i, s)| LineEdit::InsertRaw(i, s)),
        1 => idx().prop_map(LineEdit::Truncate),
    ]
}

fn apply_toml_edits(text: &str, edits: &[LineEdit]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    for e in edits {
        if lines.is_empty() {
            break;
        }
        match e {
            LineEdit::ReplaceValue(i, v) => {
                // Prefer a line that sets a key.
                let setting: Vec<usize> = (0..lines.len())
                    .filter(|&k| lines[k].contains(" = "))
                    .collect();
                if let Some(&k) = setting.get(i.index(setting.len().max(1))) {
                    let key = lines[k].split(" = ").next().unwrap().to_owned();
                    lines[k] = format!("{key} = {v}");
                }
            }
            LineEdit::Delete(i) => {
                let k = i.index(lines.len());
                lines.remove(k);
            }
            LineEdit::Duplicate(i) => {
                let k = i.index(lines.len());
                let l = lines[k].clone();
                lines.insert(k, l);
            }
            LineEdit::Uncomment(i) => {
                let commented: Vec<usize> = (0..lines.len())
                    .filter(|&k| lines[k].starts_with("# ") && lines[k].contains(" = "))
                    .collect();
                if let Some(&k) = commented.get(i.index(commented.len().max(1))) {
                    lines[k] = lines[k][2..].to_owned();
                }
            }
            LineEdit::RenameKey(i, suffix) => {
                let k = i.index(lines.len());
                if let Some((key, value)) = lines[k].split_once(" = ") {
                    lines[k] = format!("{key}{suffix} = {value}");
                }
            }
            LineEdit::InsertRaw(i, raw) => {
                let k = i.index(lines.len() + 1);
                lines.insert(k, raw.clone());
            }
            LineEdit::Truncate(i) => {
                let k = i.index(lines.len());
                let line = &lines[k];
                let cut = (0..=line.len())
                    .filter(|c| line.is_char_boundary(*c))
                    .nth(i.index(line.chars().count() + 1))
                    .unwrap_or(0);
                lines[k] = line[..cut].to_owned();
            }
        }
    }
    lines.join("\n")
}

/// JSON values, with the shapes and extremes that trip deserialisation.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        Just(json!(0)),
        Just(json!(-1)),
        Just(json!(1)),
        Just(json!(u64::MAX)),
        Just(json!(i64::MIN)),
        Just(json!(1.5)),
        Just(json!(1e300)),
        Just(json!(-0.0)),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        Just(json!("")),
        Just(json!("main")),
        Just(json!("opd")),
        Just(json!("provider")),
        Just(json!("http://127.0.0.1:1/v1/chat/completions")),
        Just(json!("https://x/api/v1")),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(("[a-z_]{1,6}", inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// Values that often suit the key they replace.
fn plausible_json_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        (1u64..5000).prop_map(|n| json!(n)),
        any::<bool>().prop_map(Value::Bool),
        Just(Value::Null),
        Just(json!("rl")),
        Just(json!("json")),
        Just(json!("/tmp/ps-config-props")),
        Just(json!("http://127.0.0.1:30002/generate")),
        Just(json!(0.7)),
    ]
}

#[derive(Debug, Clone)]
enum JsonEdit {
    Set(prop::sample::Index, prop::sample::Index, Value),
    Remove(prop::sample::Index, prop::sample::Index),
    SetSection(prop::sample::Index, Value),
    AddKey(prop::sample::Index, String, Value),
    AliasProvider,
}

fn json_edit() -> impl Strategy<Value = JsonEdit> {
    let idx = any::<prop::sample::Index>;
    prop_oneof![
        4 => (idx(), idx(), json_value()).prop_map(|(s, k, v)| JsonEdit::Set(s, k, v)),
        8 => (idx(), idx(), plausible_json_value()).prop_map(|(s, k, v)| JsonEdit::Set(s, k, v)),
        2 => (idx(), idx()).prop_map(|(s, k)| JsonEdit::Remove(s, k)),
        1 => (idx(), json_value()).prop_map(|(s, v)| JsonEdit::SetSection(s, v)),
        1 => (idx(), "[a-z_]{1,8}", json_value()).prop_map(|(s, k, v)| JsonEdit::AddKey(s, k, v)),
        1 => Just(JsonEdit::AliasProvider),
    ]
}

fn apply_json_edits(mut doc: Value, edits: &[JsonEdit]) -> Value {
    for e in edits {
        let Some(root) = doc.as_object_mut() else {
            break;
        };
        let sections: Vec<String> = root.keys().cloned().collect();
        if sections.is_empty() {
            break;
        }
        match e {
            JsonEdit::Set(s, k, _) | JsonEdit::Remove(s, k) => {
                let section = &sections[s.index(sections.len())];
                if let Some(obj) = root.get_mut(section).and_then(Value::as_object_mut) {
                    let keys: Vec<String> = obj.keys().cloned().collect();
                    if keys.is_empty() {
                        continue;
                    }
                    let key = keys[k.index(keys.len())].clone();
                    match e {
                        JsonEdit::Set(_, _, v) => {
                            obj.insert(key, v.clone());
                        }
                        _ => {
                            obj.remove(&key);
                        }
                    }
                }
            }
            JsonEdit::SetSection(s, v) => {
                let section = sections[s.index(sections.len())].clone();
                root.insert(section, v.clone());
            }
            JsonEdit::AddKey(s, k, v) => {
                let section = &sections[s.index(sections.len())];
                if let Some(obj) = root.get_mut(section).and_then(Value::as_object_mut) {
                    obj.insert(k.clone(), v.clone());
                }
            }
            JsonEdit::AliasProvider => {
                // `taotoken` is an alias of `provider`; both together are an error.
                let p = root.get("provider").cloned().unwrap_or(json!({}));
                root.insert("taotoken".into(), p);
            }
        }
    }
    doc
}

const LEGACY: &[&str] = &[
    "OPENCLAW_PORT",
    "PORT",
    "HOST",
    "PRM_ROUTER_URL",
    "LOG_LEVEL",
    "SERVED_MODEL_NAME",
    "PRM_M",
    "OPENCLAW_EVAL_MODE",
    "OPENCLAW_OPD_TEACHER_LP_MAX_CONCURRENCY",
    "SGLANG_API_KEY",
    "OPENCLAW_RECORD_ENABLED",
];

/// Environment variables: legacy ones, `POLICY_SERVING_*` for every example key (and some that
/// are not keys), with any values.
fn env_pairs() -> impl Strategy<Value = Vec<(String, String)>> {
    let keys: Vec<String> = {
        let doc: Value = serde_json::from_str(&example("settings.example.json")).unwrap();
        let mut keys: Vec<String> = LEGACY.iter().map(|s| (*s).to_owned()).collect();
        for (section, v) in doc.as_object().unwrap() {
            for key in v.as_object().into_iter().flat_map(|o| o.keys()) {
                keys.push(format!(
                    "POLICY_SERVING_{}__{}",
                    section.to_uppercase(),
                    key.to_uppercase()
                ));
            }
        }
        keys.extend(
            [
                "POLICY_SERVING_TAOTOKEN__BASE_URL",
                "POLICY_SERVING_SERVER__NOPE",
                "POLICY_SERVING_NOPE__PORT",
                "POLICY_SERVING_SERVER",
                "POLICY_SERVING_SERVER____PORT",
                "POLICY_SERVING___",
                "policy_serving_server__port",
                "POLICY_SERVING_SERVER__PORT__X",
            ]
            .map(str::to_owned),
        );
        keys
    };
    let value = prop_oneof![
        Just(String::new()),
        Just(" ".to_owned()),
        Just("0".to_owned()),
        Just("-1".to_owned()),
        Just("1".to_owned()),
        Just("99999999999999999999".to_owned()),
        Just("nan".to_owned()),
        Just("inf".to_owned()),
        Just("0.6".to_owned()),
        Just("true".to_owned()),
        Just("main".to_owned()),
        Just("opd".to_owned()),
        Just("[1, 2]".to_owned()),
        Just("{a = 1}".to_owned()),
        Just("http://127.0.0.1:1/generate".to_owned()),
        ".{0,12}",
    ];
    prop_oneof![
        Just(Vec::new()),
        prop::collection::vec((prop::sample::select(keys), value), 1..5),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_text_as_a_settings_file_loads_or_fails_with_a_message(
        text in prop_oneof![
            any::<String>(),
            prop::collection::vec(prop_oneof![
                Just("[server]\n".to_owned()),
                Just("[sglang]\n".to_owned()),
                Just("[taotoken]\n".to_owned()),
                Just("port = ".to_owned()),
                Just("mode = ".to_owned()),
                Just("\"server\": ".to_owned()),
                Just("{".to_owned()),
                Just("}".to_owned()),
                Just("[".to_owned()),
                Just("]".to_owned()),
                Just(",".to_owned()),
                Just("\"".to_owned()),
                Just("\n".to_owned()),
                toml_value(),
            ], 0..24).prop_map(|p| p.concat()),
        ],
        ext in prop_oneof![Just("toml"), Just("json"), Just("JSON"), Just("yaml"), Just("")],
    ) {
        let scratch = Scratch::new("text");
        let path = scratch.write(ext, text.as_bytes());
        load_checked(Some(&path), &[])?;
    }

    #[test]
    fn any_bytes_as_a_settings_file_load_or_fail_with_a_message(
        bytes in prop::collection::vec(any::<u8>(), 0..256),
        json in any::<bool>(),
    ) {
        let scratch = Scratch::new("bytes");
        let path = scratch.write(if json { "json" } else { "toml" }, &bytes);
        load_checked(Some(&path), &[])?;
    }

    #[test]
    fn mutations_of_the_example_toml_load_or_fail_with_a_message(
        edits in prop::collection::vec(line_edit(), 1..4),
        env in env_pairs(),
    ) {
        let text = apply_toml_edits(&example("settings.example.toml"), &edits);
        let scratch = Scratch::new("toml");
        let path = scratch.write("toml", text.as_bytes());
        load_checked(Some(&path), &env)?;
    }

    #[test]
    fn mutations_of_the_example_json_load_or_fail_with_a_message(
        edits in prop::collection::vec(json_edit(), 1..4),
        env in env_pairs(),
    ) {
        let doc: Value = serde_json::from_str(&example("settings.example.json")).unwrap();
        let doc = apply_json_edits(doc, &edits);
        let scratch = Scratch::new("json");
        let path = scratch.write("json", doc.to_string().as_bytes());
        load_checked(Some(&path), &env)?;
    }

    #[test]
    fn any_environment_loads_or_fails_with_a_message(env in env_pairs()) {
        load_checked(None, &env)?;
    }
}

#[test]
fn the_unmodified_examples_load() {
    let scratch = Scratch::new("examples");
    for (name, ext) in [
        ("settings.example.toml", "toml"),
        ("settings.example.json", "json"),
    ] {
        let path = scratch.write(ext, example(name).as_bytes());
        let loaded = load_with_env(Some(&path), &Overrides::default(), &[]);
        assert!(loaded.is_ok(), "{name}: {}", loaded.unwrap_err());
    }
}

#[test]
fn deeply_nested_settings_fail_cleanly() {
    let scratch = Scratch::new("nested");
    let depth = 10_000;
    let json = format!("{{\"server\": {}{}}}", "[".repeat(depth), "]".repeat(depth));
    let path = scratch.write("json", json.as_bytes());
    let e = load_with_env(Some(&path), &Overrides::default(), &[]).unwrap_err();
    assert!(!e.to_string().is_empty());
    let toml = format!(
        "[server]\nport = {}{}\n",
        "[".repeat(depth),
        "]".repeat(depth)
    );
    let path = scratch.write("toml", toml.as_bytes());
    let e = load_with_env(Some(&path), &Overrides::default(), &[]).unwrap_err();
    assert!(!e.to_string().is_empty());
}

#[test]
fn a_missing_file_and_a_directory_fail_cleanly() {
    let scratch = Scratch::new("missing");
    let e = load_with_env(
        Some(&scratch.0.join("absent.toml")),
        &Overrides::default(),
        &[],
    )
    .unwrap_err();
    assert!(!e.to_string().is_empty());
    let dir = scratch.0.join("dir.toml");
    std::fs::create_dir_all(&dir).unwrap();
    let e = load_with_env(Some(&dir), &Overrides::default(), &[]).unwrap_err();
    assert!(!e.to_string().is_empty());
}
