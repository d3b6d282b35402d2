//! Where the shared fixtures are: `../shared` beside the repository (or `$POLICY_SERVING_SHARED`),
//! read by tests and never copied into the repository.

use std::path::PathBuf;

/// The shared directory: `$POLICY_SERVING_SHARED`, else `../shared` beside the repository.
pub fn shared_dir() -> PathBuf {
    std::env::var_os("POLICY_SERVING_SHARED").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"),
        PathBuf::from,
    )
}

/// The real Qwen3 tokenizer's directory (`fixtures/qwen3` of [`shared_dir`]), or `None` when it
/// is missing; with `POLICY_SERVING_REQUIRE_FIXTURES=1` (CI) a missing directory is a failure,
/// never a silent skip.
///
/// # Panics
/// When the fixtures are missing and required.
pub fn qwen3_dir() -> Option<PathBuf> {
    let dir = shared_dir().join("fixtures/qwen3");
    if dir.join("tokenizer.json").is_file() {
        return Some(dir);
    }
    let required = std::env::var("POLICY_SERVING_REQUIRE_FIXTURES").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "POLICY_SERVING_REQUIRE_FIXTURES=1 but {} is missing",
        dir.display()
    );
    eprintln!(
        "SKIPPED (Qwen3 part): fixtures not found at {}",
        dir.display()
    );
    None
}
