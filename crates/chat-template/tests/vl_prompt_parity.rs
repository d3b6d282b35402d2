//! Full prompt ids of conversations with images equal what `transformers` makes of them for a
//! Qwen-VL model (`vl_prompt_parity.py`: the tokenizer's own `apply_chat_template`, the image
//! processor's grid on the decoded image, each pad repeated as `Qwen2VLProcessor` repeats it):
//! 40 conversations, 60 image sizes, 1 to 3 images a message, images in earlier turns, PNG, JPEG,
//! GIF and WebP. Two models: the embedded mini-vl model, and the real Qwen3 tokenizer (from
//! `../shared`, never copied here) with its template taught image parts as Qwen-VL templates write
//! them (`scripts/make_tiny_vl.py --tokenizer-only`, into a temporary directory) and Qwen2.5-VL's
//! processor bounds.
//!
//! The content lists reach the template as an engine hands them: kept for a template that loops
//! over a message's content ("openai" content format), flattened otherwise. Which format each
//! template has is asked of vLLM's own detection (`vllm.renderers.hf._detect_content_format`),
//! and `ChatTokenizer::keeps_content_lists` must say the same.
//!
//! Python with transformers and vLLM: `POLICY_SERVING_TRANSFORMERS_PYTHON`, else the real engine's
//! venv; without it the test says so and passes unless `POLICY_SERVING_REQUIRE_TRANSFORMERS=1` (CI).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

use ps_chat_template::ChatTokenizer;
use ps_vision::ImageLimits;
use serde_json::Value;

fn python() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("POLICY_SERVING_TRANSFORMERS_PYTHON") {
        return Some(p.into());
    }
    let venv = PathBuf::from(std::env::var("HOME").ok()?).join(".cache/real-vllm/venv/bin/python");
    if venv.exists() {
        return Some(venv);
    }
    assert!(
        std::env::var("POLICY_SERVING_REQUIRE_TRANSFORMERS").as_deref() != Ok("1"),
        "POLICY_SERVING_REQUIRE_TRANSFORMERS=1 and no Python with transformers: set \
         POLICY_SERVING_TRANSFORMERS_PYTHON or install the real engine's venv"
    );
    eprintln!("SKIPPED: no Python with transformers (POLICY_SERVING_TRANSFORMERS_PYTHON)");
    None
}

/// Checks every conversation the script writes for `dir` against `tok`; returns how many.
fn check(python: &Path, dir: &Path, tok: &ChatTokenizer) -> usize {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vl_prompt_parity.py");
    let out = Command::new(python).arg(&script).arg(dir).output().unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut n = 0;
    let mut sizes = std::collections::BTreeSet::new();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let mut lines = stdout.lines().filter(|l| l.starts_with('{'));
    // First the template's content format as vLLM's own detection gives it.
    let header: Value = serde_json::from_str(lines.next().unwrap_or_default()).unwrap();
    let format = header["content_format"].as_str().unwrap();
    assert_eq!(
        tok.keeps_content_lists(),
        format == "openai",
        "{}: vLLM detects the {format:?} content format",
        dir.display()
    );
    for line in lines {
        let case: Value = serde_json::from_str(line).unwrap();
        let messages = case["messages"].as_array().unwrap();
        let images = tok.images(messages, &ImageLimits::default()).unwrap();
        let text = tok
            .render(&tok.normalize(messages), None, true, None)
            .unwrap();
        let counts: Vec<usize> = images.iter().map(|i| i.tokens).collect();
        let ids = tok
            .expand_image_pads(&tok.encode(&text).unwrap(), &counts)
            .unwrap();
        let want: Vec<u32> = serde_json::from_value(case["prompt_ids"].clone()).unwrap();
        if ids != want {
            let at = ids.iter().zip(&want).position(|(a, b)| a != b);
            panic!(
                "{}: prompt ids differ at {at:?} ({} against transformers' {}); images {:?}",
                dir.display(),
                ids.len(),
                want.len(),
                images
                    .iter()
                    .map(|i| (i.image.width, i.image.height, i.tokens))
                    .collect::<Vec<_>>()
            );
        }
        sizes.extend(images.iter().map(|i| (i.image.width, i.image.height)));
        n += 1;
    }
    assert!(sizes.len() >= 50, "{} image sizes", sizes.len());
    n
}

#[test]
fn the_mini_vl_model_expands_images_as_transformers_does() {
    let Some(python) = python() else { return };
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../config/mini-vl-model");
    let tok = ChatTokenizer::from_dir(&dir).unwrap();
    assert_eq!(
        tok.fingerprint(),
        ChatTokenizer::mini_vl().fingerprint(),
        "the embedded mini-vl model is the directory's"
    );
    assert!(check(&python, &dir, &tok) >= 40);
}

#[test]
fn the_real_qwen3_tokenizer_with_a_vl_template_expands_images_as_transformers_does() {
    let Some(qwen3) = ps_test_support::fixtures::qwen3_dir() else {
        return;
    };
    let Some(python) = python() else { return };
    // The Qwen3 tokenizer with its template taught image parts, as the real VL engine test's
    // model has it (scripts/make_tiny_vl.py, the one place that writes it).
    let dir = tempfile::tempdir().unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/make_tiny_vl.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(dir.path())
        .arg(&qwen3)
        .arg("--tokenizer-only")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Qwen2.5-VL's bounds: a 4K image is thousands of tokens.
    std::fs::write(
        dir.path().join("preprocessor_config.json"),
        r#"{"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "merge_size": 2,
            "temporal_patch_size": 2, "image_processor_type": "Qwen2VLImageProcessor"}"#,
    )
    .unwrap();
    let tok = ChatTokenizer::from_dir(dir.path()).unwrap();
    assert!(tok.vision().is_some());
    assert!(check(&python, dir.path(), &tok) >= 40);
}
