//! No configuration or options struct prints an API key with `{:?}`: every key is resolved from
//! the environment into a `Secret` and carried in one to the client that sends it.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use ps_config::{EnvLookup, Settings};
use ps_provider_client::{ProviderClient, ProviderConfig};
use ps_server::ServerOptions;
use ps_sglang_client::{SglangClient, SglangClientConfig};
use ps_teacher_client::{
    CompletionsTeacher, CompletionsTeacherConfig, SglangTeacher, SglangTeacherConfig,
};

/// One distinct key per variable, so that any of them showing up is caught.
const KEYS: &[(&str, &str)] = &[
    ("CLIENT_KEY", "sk-client-0123456789"),
    ("ADMIN_KEY", "sk-admin-0123456789"),
    ("UPSTREAM_KEY", "sk-upstream-0123456789"),
    ("PROVIDER_KEY", "sk-provider-0123456789"),
    ("TEACHER_KEY", "sk-teacher-0123456789"),
];
const LITERAL_KEY: &str = "sk-literal-0123456789";

fn env(name: &str) -> Option<String> {
    KEYS.iter()
        .find(|(var, _)| *var == name)
        .map(|(_, key)| (*key).to_owned())
}

fn settings() -> Settings {
    let mut s = Settings::default();
    s.server.api_key_env = Some("CLIENT_KEY".into());
    s.server.admin_key_env = Some("ADMIN_KEY".into());
    s.sglang.api_key = Some(LITERAL_KEY.into());
    s.sglang.api_key_env = Some("UPSTREAM_KEY".into());
    s.provider.api_key_env = Some("PROVIDER_KEY".into());
    s.provider.base_url = Some("http://127.0.0.1:9".into());
    s.teacher.api_key_env = Some("TEACHER_KEY".into());
    s
}

fn assert_no_key(what: &str, text: &str) {
    for key in KEYS.iter().map(|(_, k)| *k).chain([LITERAL_KEY]) {
        assert!(!text.contains(key), "{what} prints a key: {text}");
    }
}

#[test]
fn debug_of_every_config_and_options_struct_hides_the_keys() {
    let s = settings();
    let env: EnvLookup<'_> = &env;
    let upstream = s.sglang_api_key(env).unwrap();
    let provider = s.provider_api_key(env).unwrap();
    let teacher = s.teacher_api_key(env).unwrap();
    // The keys really are there, to be sent.
    assert_eq!(
        upstream.as_ref().unwrap().expose(),
        "sk-upstream-0123456789"
    );
    assert_eq!(teacher.as_ref().unwrap().expose(), "sk-teacher-0123456789");

    let options = ServerOptions {
        client_api_key: s.client_api_key(env).unwrap(),
        admin_api_key: s.admin_api_key(env).unwrap(),
        ..ServerOptions::default()
    };
    let sglang = SglangClientConfig {
        chat_url: s.sglang.chat_url.clone(),
        api_key: upstream,
        timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(1),
    };
    let provider = ProviderConfig {
        name: "provider".into(),
        chat_url: s.provider.chat_completions_url().unwrap(),
        api_key: provider,
        key_var: s.provider.api_key_env.clone(),
        max_concurrency: 1,
        timeout: Duration::from_secs(1),
        max_retries: 0,
        deadline: None,
    };
    let sglang_teacher = SglangTeacherConfig {
        url: "http://127.0.0.1:9".into(),
        timeout: Duration::from_secs(1),
        api_key: teacher.clone(),
        images: false,
    };
    let completions_teacher = CompletionsTeacherConfig {
        base_url: "http://127.0.0.1:9".into(),
        model: "teacher".into(),
        api_key: teacher,
        timeout: Duration::from_secs(1),
    };

    assert_no_key("Settings", &format!("{s:?}"));
    assert_no_key("Settings (pretty)", &format!("{s:#?}"));
    assert_no_key("ServerOptions", &format!("{options:?}"));
    assert_no_key("SglangClientConfig", &format!("{sglang:?}"));
    assert_no_key("ProviderConfig", &format!("{provider:?}"));
    assert_no_key("SglangTeacherConfig", &format!("{sglang_teacher:?}"));
    assert_no_key(
        "CompletionsTeacherConfig",
        &format!("{completions_teacher:?}"),
    );
    // The clients built from them, which hold the configs.
    let c = SglangClient::new(sglang).unwrap();
    assert_no_key("SglangClient", &format!("{c:?}"));
    let c = ProviderClient::new(provider).unwrap();
    assert_no_key("ProviderClient", &format!("{c:?}"));
    let c = SglangTeacher::new(sglang_teacher).unwrap();
    assert_no_key("SglangTeacher", &format!("{c:?}"));
    let c = CompletionsTeacher::new(completions_teacher).unwrap();
    assert_no_key("CompletionsTeacher", &format!("{c:?}"));
}
