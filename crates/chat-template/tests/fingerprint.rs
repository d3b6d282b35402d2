//! `ChatTokenizer::fingerprint`: the same files give the same fingerprint, any file changed (the
//! tokenizer, its config, a chat template beside them) another one.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use ps_chat_template::ChatTokenizer;

const MINI: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/mini-model");

fn copy_mini(to: &Path) {
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(Path::new(MINI).join(f), to.join(f)).unwrap();
    }
}

#[test]
fn the_same_files_give_the_same_fingerprint_and_any_change_another() {
    let a = tempfile::tempdir().unwrap();
    copy_mini(a.path());
    let base = ChatTokenizer::from_dir(a.path()).unwrap().fingerprint();
    assert_eq!(
        ChatTokenizer::from_dir(a.path()).unwrap().fingerprint(),
        base
    );
    assert_eq!(
        ChatTokenizer::mini().fingerprint(),
        base,
        "the embedded copy of the same files"
    );

    // A chat template beside them (it replaces the config's).
    std::fs::write(
        a.path().join("chat_template.jinja"),
        "{{ messages[0].content }}",
    )
    .unwrap();
    let with_template = ChatTokenizer::from_dir(a.path()).unwrap().fingerprint();
    assert_ne!(with_template, base);

    // The config changed (here: only its formatting; the tokenizer would behave the same, but
    // the fingerprint is of the files, which is what a persisted turn can be checked against).
    let b = tempfile::tempdir().unwrap();
    copy_mini(b.path());
    let cfg = b.path().join("tokenizer_config.json");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, format!("{text}\n")).unwrap();
    assert_ne!(
        ChatTokenizer::from_dir(b.path()).unwrap().fingerprint(),
        base
    );
}
