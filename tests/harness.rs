//! The black-box tests of the built binaries: the end-to-end suite of policy-serving. Each test
//! here spawns the real `policy-serving` executable on a free loopback port (in front of the
//! in-process fake SGLang) and talks to it over HTTP, as an operator or a trainer would:
//!
//! | test | what it shows |
//! |---|---|
//! | `crash.rs` | `kill -9` under load loses no sample whose submission completed |
//! | `check.rs` | `policy-serving check` against good and broken services |
//! | `observability.rs` | metrics and log lines of a served conversation; no secret in the logs |
//! | `operators.rs` | the operators' settings and trainer-side files start the server as they are |
//! | `inspect.rs` | the inspection page of `demo` in headless chromium: what a person sees |
//! | `prometheus.rs` | Debian's Prometheus scrapes `demo` and evaluates every dashboard query |
//!
//! Per-crate tests stay beside their crates (`crates/*/tests`); only tests of the executables
//! live here.
//!
//! **Finding the binary.** `CARGO_BIN_EXE_<name>` only exists inside the binary's own package, so
//! [`policy_serving`] finds it next to the test executable instead: a test runs from
//! `<target dir>/<profile>/deps/`, and the binary is `<target dir>/<profile>/policy-serving`. This
//! follows `CARGO_TARGET_DIR`, `--release`/`--profile` and `--target` without reading them. Before
//! the first use in a test process, it runs `cargo build -p policy-serving` for that profile (a
//! no-op when it is fresh; `cargo test` does not build the binary of a package without integration
//! tests), so the suite never runs a stale or missing binary. The variables cargo sets for the
//! test process itself are removed from that build's environment, so it is the same build as a
//! `cargo build` in a shell and neither invalidates the other.
//!
//! Also shared: [`KillOnDrop`] (a failing assertion never leaves a server running),
//! [`free_port`] and [`Demo`] (the demo serving on after its conversation).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Kills the child when dropped, so a failing assertion never leaves a server running.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback port free right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The built `policy-serving` executable of this profile, built first if needed (see the crate
/// header).
pub fn policy_serving() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build("policy-serving"))
}

/// `<target dir>/<profile>`: the test executable lives in its `deps/`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let deps = exe.parent().expect("the test executable's directory");
    let dir = if deps.file_name().is_some_and(|n| n == "deps") {
        deps.parent().expect("the profile directory")
    } else {
        deps
    };
    dir.to_path_buf()
}

/// The variables cargo sets for a test process (besides `CARGO_PKG_*`), none of them configuration.
const TEST_ONLY_ENV: &[&str] = &[
    "CARGO_MANIFEST_DIR",
    "CARGO_MANIFEST_PATH",
    "CARGO_CRATE_NAME",
    "CARGO_BIN_NAME",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_TARGET_TMPDIR",
    "CARGO_RUSTC_CURRENT_DIR",
    "OUT_DIR",
];

/// Builds the package's binary `name` in the test's own profile and returns its path.
fn build(name: &str) -> PathBuf {
    let dir = profile_dir();
    let profile = dir
        .file_name()
        .and_then(|n| n.to_str())
        .expect("a profile directory name")
        .to_owned();
    // `debug` is the directory of the `dev` (and `test`) profile.
    let profile = if profile == "debug" {
        "dev".to_owned()
    } else {
        profile
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root");
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace)
        .args(["build", "--quiet", "-p", name, "--bin", name, "--profile"])
        .arg(&profile);
    // What cargo sets for this test process only (its package, its manifest): build scripts that
    // watch such a variable (ring's watches CARGO_MANIFEST_DIR) would otherwise rerun here and
    // again in the next plain `cargo build`, rebuilding everything above them both times.
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        if TEST_ONLY_ENV.contains(&key) || key.starts_with("CARGO_PKG_") {
            cmd.env_remove(key);
        }
    }
    let status = cmd.status().expect("running cargo build");
    assert!(status.success(), "cargo build -p {name} failed");
    let bin = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(bin.is_file(), "{} was not built", bin.display());
    bin
}

/// `policy-serving demo` (keeping on serving after its conversation), started and read until it
/// prints the inspection page's URL.
pub struct Demo {
    /// The proxy, `http://127.0.0.1:PORT`.
    pub base: String,
    /// What it printed before the URL (the conversation and the samples).
    pub printed: String,
    _child: KillOnDrop,
}

impl Demo {
    /// Starts the demo in `mode` (`rl`, `opd`, `combine`) and waits for its URL (bounded).
    pub fn start(mode: &str) -> Demo {
        use std::io::{BufRead, BufReader};
        let mut child = Command::new(policy_serving())
            .args(["demo", "--mode", mode])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("starting policy-serving demo");
        let stdout = child.stdout.take().expect("the demo's stdout");
        let child = KillOnDrop(child);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut printed = String::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                printed.push_str(&line);
                printed.push('\n');
                if let Some(url) = line
                    .strip_prefix("inspection page: ")
                    .and_then(|r| r.split_whitespace().next())
                {
                    let _ = tx.send((url.to_owned(), printed.clone()));
                }
            }
        });
        let (url, printed) = rx
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("the demo printed its inspection page's URL");
        let base = url.trim_end_matches('/').trim_end_matches("/ui").to_owned();
        Demo {
            base,
            printed,
            _child: child,
        }
    }
}
