//! `serve` never trains with a tokenizer that is not the policy's: `server.model_dir`, else the
//! directory the policy server reports (when it exists on this machine), else it refuses to start
//! with an error naming `server.model_dir`; a vocabulary the policy server contradicts is refused.
//! Against the in-process fake SGLang, whose model report is switched per test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use ps_app::policy_tokenizer::TokenizerSource;
use ps_config::Settings;
use ps_fake_sglang::{FakeBuilder, FakeHandle, FakeSglang, MINI_MODEL_DIR};

fn settings(chat_url: &str, store: &Path) -> Settings {
    let mut s = Settings::default();
    s.server.port = 0;
    s.sglang.chat_url = chat_url.to_owned();
    s.prm.enabled = false;
    s.store.path = store.to_owned();
    s
}

async fn fake(b: FakeBuilder) -> FakeHandle {
    b.spawn().await.unwrap()
}

/// Starts `serve` as `ps_app::spawn` does; the error text when it refuses.
async fn start(s: &Settings) -> Result<(), String> {
    let env = |_: &str| None;
    match ps_app::spawn(s, &env, None).await {
        Ok(running) => {
            running.stop().await.unwrap();
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    }
}

fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn serve_without_model_dir_uses_the_directory_the_policy_server_reports() {
    let f = fake(FakeSglang::builder()).await;
    let tmp = tempfile::tempdir().unwrap();
    let s = settings(&f.chat_url(), tmp.path());
    let client = ps_app::policy_client(&s, &|_: &str| None).unwrap();
    let t = ps_app::policy_tokenizer(&s, &client).await.unwrap();
    assert_eq!(
        t.source,
        TokenizerSource::PolicyServer {
            dir: PathBuf::from(MINI_MODEL_DIR),
            url: format!("{}/get_model_info", f.base_url()),
        }
    );
    assert!(t.source.to_string().contains("source: policy server"));
    start(&s).await.unwrap();
}

#[tokio::test]
async fn serve_without_model_dir_reads_vllms_model_root_when_get_model_info_is_missing() {
    let f = fake(FakeSglang::builder().model_info_route(false)).await;
    let tmp = tempfile::tempdir().unwrap();
    let s = settings(&f.chat_url(), tmp.path());
    let client = ps_app::policy_client(&s, &|_: &str| None).unwrap();
    let t = ps_app::policy_tokenizer(&s, &client).await.unwrap();
    assert_eq!(
        t.source,
        TokenizerSource::PolicyServer {
            dir: PathBuf::from(MINI_MODEL_DIR),
            url: format!("{}/v1/models", f.base_url()),
        }
    );
}

#[tokio::test]
async fn serve_refuses_to_start_when_the_reported_model_path_is_not_on_this_machine() {
    let f = fake(FakeSglang::builder().model_path(Some("/models/Qwen3-4B-not-here"))).await;
    let tmp = tempfile::tempdir().unwrap();
    let e = start(&settings(&f.chat_url(), tmp.path()))
        .await
        .unwrap_err();
    assert!(e.contains("server.model_dir"), "{e}");
    assert!(e.contains("/models/Qwen3-4B-not-here"), "{e}");
    assert!(e.contains("not a directory on this machine"), "{e}");
}

#[tokio::test]
async fn serve_refuses_to_start_when_the_policy_server_reports_no_model_path() {
    let f = fake(FakeSglang::builder().model_path(None)).await;
    let tmp = tempfile::tempdir().unwrap();
    let e = start(&settings(&f.chat_url(), tmp.path()))
        .await
        .unwrap_err();
    assert!(e.contains("server.model_dir"), "{e}");
    assert!(e.contains("does not report its model path"), "{e}");
    assert!(e.contains("/get_model_info"), "{e}");
}

#[tokio::test]
async fn serve_refuses_to_start_when_the_policy_server_is_unreachable_and_model_dir_is_unset() {
    let tmp = tempfile::tempdir().unwrap();
    let port = closed_port();
    let s = settings(
        &format!("http://127.0.0.1:{port}/v1/chat/completions"),
        tmp.path(),
    );
    let e = start(&s).await.unwrap_err();
    assert!(e.contains("server.model_dir"), "{e}");
    assert!(
        e.contains(&format!("http://127.0.0.1:{port}/get_model_info")),
        "{e}"
    );
}

#[tokio::test]
async fn serve_with_model_dir_starts_while_the_policy_server_is_unreachable() {
    let tmp = tempfile::tempdir().unwrap();
    let mut s = settings(
        &format!("http://127.0.0.1:{}/v1/chat/completions", closed_port()),
        tmp.path(),
    );
    s.server.model_dir = Some(PathBuf::from(MINI_MODEL_DIR));
    start(&s).await.unwrap();
}

#[tokio::test]
async fn serve_refuses_a_tokenizer_whose_vocabulary_the_policy_server_contradicts() {
    let have = ps_chat_template::ChatTokenizer::mini().vocab_size() as u64;
    let f = fake(FakeSglang::builder().vocab_size(Some(have + 50_000))).await;
    let tmp = tempfile::tempdir().unwrap();
    let mut s = settings(&f.chat_url(), tmp.path());
    s.server.model_dir = Some(PathBuf::from(MINI_MODEL_DIR));
    let e = start(&s).await.unwrap_err();
    assert!(e.contains(&format!("vocab_size {}", have + 50_000)), "{e}");
    assert!(e.contains(&format!("has {have} ids")), "{e}");
    assert!(e.contains("server.model_dir"), "{e}");
    // Padding the embedding a little is not a mismatch.
    let f = fake(FakeSglang::builder().vocab_size(Some(have + 64))).await;
    s.sglang.chat_url = f.chat_url();
    start(&s).await.unwrap();
}

#[tokio::test]
async fn serve_refuses_a_model_dir_whose_tokenizer_differs_from_the_reported_one() {
    let other = tempfile::tempdir().unwrap();
    let mini = Path::new(MINI_MODEL_DIR);
    for f in ["tokenizer_config.json", "tokenizer.json"] {
        std::fs::copy(mini.join(f), other.path().join(f)).unwrap();
    }
    // The same tokenizer in another directory, even written differently, is fine…
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(other.path().join("tokenizer.json")).unwrap())
            .unwrap();
    std::fs::write(
        other.path().join("tokenizer.json"),
        serde_json::to_vec_pretty(&json).unwrap(),
    )
    .unwrap();
    let f = fake(FakeSglang::builder()).await;
    let tmp = tempfile::tempdir().unwrap();
    let mut s = settings(&f.chat_url(), tmp.path());
    s.server.model_dir = Some(other.path().to_owned());
    start(&s).await.unwrap();
    // …another one is not.
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(other.path().join("tokenizer.json")).unwrap())
            .unwrap();
    json["added_tokens"][8]["content"] = serde_json::json!("</tool_result>");
    std::fs::write(
        other.path().join("tokenizer.json"),
        serde_json::to_vec(&json).unwrap(),
    )
    .unwrap();
    let e = start(&s).await.unwrap_err();
    assert!(e.contains("different tokenizer.json"), "{e}");
    assert!(e.contains("server.model_dir"), "{e}");
}
