//! Parity with `transformers`' own Qwen-VL image processor: for 4 processor configurations
//! (Qwen2-VL's spelled-out bounds, Qwen3-VL's `size`, tight bounds that make both clamps act,
//! the class defaults) and ~70 image sizes (1×1, exactly on the factor, halves that Python rounds
//! to even, aspect ratios up to 200, 33 megapixels), each encoded by Pillow as PNG, JPEG, WebP or
//! GIF, the size read from the header and the pad count equal the processor's `image_grid_thw`.
//!
//! The Python side (`transformers_parity.py`) runs under `POLICY_SERVING_TRANSFORMERS_PYTHON`,
//! else the real engine's venv (`~/.cache/real-vllm/venv/bin/python`, which `.ci/run` installs);
//! without either the test says so and passes, unless `POLICY_SERVING_REQUIRE_TRANSFORMERS=1`
//! (set by CI) makes it fail.

use std::path::PathBuf;
use std::process::Command;

use ps_vision::{ImageLimits, ImageProcessor, read_image_part};
use serde_json::{Value, json};

fn python() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("POLICY_SERVING_TRANSFORMERS_PYTHON") {
        return Some(p.into());
    }
    let venv = PathBuf::from(std::env::var("HOME").ok()?).join(".cache/real-vllm/venv/bin/python");
    venv.exists().then_some(venv)
}

#[test]
fn pad_counts_equal_the_transformers_processor() {
    let required = std::env::var("POLICY_SERVING_REQUIRE_TRANSFORMERS").as_deref() == Ok("1");
    let Some(python) = python() else {
        assert!(
            !required,
            "POLICY_SERVING_REQUIRE_TRANSFORMERS=1 and no Python with transformers: set \
             POLICY_SERVING_TRANSFORMERS_PYTHON or install the real engine's venv"
        );
        eprintln!("skipped: no Python with transformers (POLICY_SERVING_TRANSFORMERS_PYTHON)");
        return;
    };
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/transformers_parity.py");
    let out = Command::new(&python)
        .arg(&script)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", python.display()));
    assert!(
        out.status.success(),
        "{} {}: {}",
        python.display(),
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(lines.len() >= 200, "{} cases", lines.len());
    let limits = ImageLimits {
        max_image_bytes: 1 << 30,
        ..ImageLimits::default()
    };
    let mut formats = std::collections::BTreeSet::new();
    let mut clamped = (0, 0);
    for case in &lines {
        let config = ImageProcessor::from_json(&case["config"].to_string(), "case").unwrap();
        let part = json!({"type": "image_url", "image_url": {"url": case["data_url"]}});
        let image = read_image_part(&part, &limits).unwrap_or_else(|e| panic!("{e}"));
        let (w, h) = (
            case["width"].as_u64().unwrap(),
            case["height"].as_u64().unwrap(),
        );
        let what = format!("{w}x{h} {} under {}", case["format"], case["config"]);
        assert_eq!((image.width, image.height), (w, h), "{what}: header size");
        let grid = config.grid_thw(w, h).unwrap();
        assert_eq!(json!(grid), case["grid_thw"], "{what}: image_grid_thw");
        assert_eq!(
            json!(config.pad_tokens(w, h).unwrap()),
            case["pads"],
            "{what}: pad tokens"
        );
        formats.insert(case["format"].as_str().unwrap().to_owned());
        let (rh, rw) = config.resized(w, h).unwrap();
        if w * h > config.max_pixels {
            assert!(rh * rw <= config.max_pixels, "{what}: scaled down");
            clamped.0 += 1;
        }
        if w * h < config.min_pixels {
            assert!(rh * rw >= config.min_pixels, "{what}: scaled up");
            clamped.1 += 1;
        }
    }
    assert_eq!(formats.len(), 4, "every header format: {formats:?}");
    assert!(
        clamped.0 > 0 && clamped.1 > 0,
        "both clamps exercised: {clamped:?}"
    );
}
