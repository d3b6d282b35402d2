//! One tokenizer in memory: `serve` parses the policy's tokenizer once, and capture, the PRM and
//! hint judges, the OPD teacher's input and the inspection page share it, also when
//! `prm.model_dir` names a copy of the same files. Alone in its test binary, because it counts the
//! tokenizers the whole process builds.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ps_chat_template::ChatTokenizer;
use ps_config::{Mode, Settings};
use ps_fake_sglang::FakeSglang;

fn mini_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/mini-model")
}

#[tokio::test]
async fn serve_builds_one_tokenizer_for_capture_judges_teacher_and_page() {
    // The fake samples with a tokenizer built before counting starts.
    let fake = FakeSglang::builder()
        .tokenizer(Arc::new(ChatTokenizer::mini()))
        .spawn()
        .await
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let judge_copy = tmp.path().join("judge-model");
    std::fs::create_dir(&judge_copy).unwrap();
    for name in ps_chat_template::TOKENIZER_FILES {
        let from = mini_dir().join(name);
        if from.exists() {
            std::fs::copy(from, judge_copy.join(name)).unwrap();
        }
    }
    let mut s = Settings::default();
    s.server.port = 0;
    // Combine: the PRM and the hint judge, and the teacher's input, all need a tokenizer.
    s.server.mode = Mode::Combine;
    s.server.model_dir = Some(mini_dir());
    s.sglang.chat_url = fake.chat_url();
    s.prm.enabled = true;
    s.prm.router_url = fake.generate_url();
    s.prm.model_dir = Some(judge_copy);
    s.teacher.url = Some(fake.generate_url());
    s.inspect.enabled = true;
    s.store.path = tmp.path().join("store");

    let before = ChatTokenizer::built_count();
    let running = ps_app::spawn(&s, &|_| None, None).await.unwrap();
    assert_eq!(ChatTokenizer::built_count() - before, 1);
    running.stop().await.unwrap();
}
