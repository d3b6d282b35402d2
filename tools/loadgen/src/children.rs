//! The two child processes (fake SGLang, proxy): settings file, spawning on free loopback ports,
//! health waits, and a guard that kills them however the run ends.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::LoadgenError;
use crate::procfs::Proc;

/// Variables that would change the children's configuration or route their traffic away from
/// loopback: removed from their environment so every run measures the same thing.
const SCRUBBED_ENV: &[&str] = &[
    "RUST_LOG",
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
    "FAKE_SGLANG_API_KEY",
    "HTTP_PROXY",
    "http_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "ALL_PROXY",
    "all_proxy",
];
/// Prefix of the proxy's own configuration variables (all removed).
const SCRUBBED_PREFIX: &str = "POLICY_SERVING_";
/// How often health is polled while a child starts.
const HEALTH_POLL: Duration = Duration::from_millis(50);

/// A running child. Dropping the guard kills and reaps it (also on error and panic).
#[derive(Debug)]
pub struct ChildGuard {
    pub name: &'static str,
    pub port: u16,
    child: Child,
    log: PathBuf,
}

impl ChildGuard {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn proc(&self, ticks_per_second: u64) -> Proc {
        Proc {
            pid: self.pid(),
            ticks_per_second,
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The child's stderr so far (its log).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// An error when the child has exited.
    pub fn ensure_running(&mut self) -> Result<(), LoadgenError> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(LoadgenError::Exited {
                name: self.name,
                status: status.to_string(),
                log_tail: tail(&self.log_text(), 20),
            }),
            Err(source) => Err(LoadgenError::Io {
                context: format!("checking on {}", self.name),
                source,
            }),
        }
    }

    /// Polls `GET /health` until it answers 200, the child exits, or `deadline` passes.
    pub async fn wait_healthy(
        &mut self,
        client: &reqwest::Client,
        deadline: Instant,
    ) -> Result<Duration, LoadgenError> {
        let started = Instant::now();
        let url = format!("{}/health", self.base_url());
        loop {
            self.ensure_running()?;
            let ok = client
                .get(&url)
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ok {
                return Ok(started.elapsed());
            }
            if Instant::now() >= deadline {
                return Err(LoadgenError::NotHealthy {
                    name: self.name,
                    url,
                    waited: started.elapsed(),
                    log_tail: tail(&self.log_text(), 20),
                });
            }
            tokio::time::sleep(HEALTH_POLL).await;
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A free loopback port (bound, read, released; the child binds it a moment later).
pub fn free_port() -> Result<u16, LoadgenError> {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|source| LoadgenError::Io {
            context: "finding a free loopback port".into(),
            source,
        })
}

/// How the fake is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FakeOptions {
    /// It waits this long before each answer.
    pub latency: Duration,
    /// Its cache of encoded prompt prefixes (on by default; off: `--no-prefix-cache`, every prompt
    /// encoded whole, as before issue 14's second round).
    pub prefix_cache: bool,
}

impl FakeOptions {
    /// `latency`, prefix cache on.
    pub fn new(latency: Duration) -> Self {
        Self {
            latency,
            prefix_cache: true,
        }
    }
}

/// The proxy's `server.mode` when the judges are on ([`ProxyOptions::prm`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyMode {
    /// PRM-rewarded samples.
    #[default]
    Rl,
    /// On-policy distillation: hint votes from the fake's `/generate`, the fake's `/generate` as
    /// the teacher.
    Opd,
    /// Both: hint and PRM eval votes, the teacher as in OPD.
    Combine,
}

impl ProxyMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyMode::Rl => "rl",
            ProxyMode::Opd => "opd",
            ProxyMode::Combine => "combine",
        }
    }
}

/// What the proxy's settings change beyond the benchmark's fixed ones.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyOptions {
    /// RL mode with the PRM judge on: `prm.router_url` = the fake's `/generate`, which answers
    /// judge prompts with `\boxed{…}` votes (`prm.num_votes` at its default). Off:
    /// `prm.enabled = false`, every turn is stored at once, excluded.
    pub prm: bool,
    /// `prm.max_concurrency` (judge calls in flight); `None` keeps the default.
    pub prm_max_concurrency: Option<usize>,
    /// `server.session_timeout_sec`; `None` keeps the default.
    pub session_timeout_sec: Option<u64>,
    /// `store.retain_committed`; `None` keeps the default.
    pub retain_committed: Option<u64>,
    /// `sglang.token_ids = "retokenize"`: capture re-tokenizes every turn instead of taking the
    /// engine's ids (as for streamed answers and old SGLang builds).
    pub retokenize: bool,
    /// An admin key ([`crate::page::ADMIN_KEY`], through `server.admin_key_env`), as the emulated
    /// inspection pages send it.
    pub admin_key: bool,
    /// `sglang.max_concurrency` (upstream chat requests in flight; beyond it the proxy answers
    /// 429); `None` keeps the default (256).
    pub sglang_max_concurrency: Option<usize>,
    /// With `prm`: `server.mode`. OPD and Combine get the hint judge from `prm.router_url` (the
    /// fake's `/generate`, `opd.hint_backend` at its default `sglang`) and the fake's `/generate`
    /// as `teacher.url` (`teacher.backend` at its default `sglang`).
    pub mode: ProxyMode,
    /// `teacher.max_concurrency` (OPD and Combine); `None` keeps the default.
    pub teacher_max_concurrency: Option<usize>,
}

/// The proxy's settings for the benchmark: upstream = the fake, every turn main, warnings only, the
/// sample store in the run's temporary directory, the PRM judge and the rest as `options` says.
pub fn proxy_settings_toml(
    proxy_port: u16,
    fake_port: u16,
    store: &Path,
    options: &ProxyOptions,
) -> String {
    // A JSON string is a valid TOML basic string (same escapes).
    let store = serde_json::Value::from(store.to_string_lossy().into_owned()).to_string();
    let session_timeout = options
        .session_timeout_sec
        .map(|s| format!("session_timeout_sec = {s}\n"))
        .unwrap_or_default();
    let retain = options
        .retain_committed
        .map(|n| format!("retain_committed = {n}\n"))
        .unwrap_or_default();
    let token_ids = if options.retokenize {
        "token_ids = \"retokenize\"\n"
    } else {
        ""
    };
    let upstream_cap = options
        .sglang_max_concurrency
        .map(|n| format!("max_concurrency = {n}\n"))
        .unwrap_or_default();
    let admin_key = if options.admin_key {
        format!("admin_key_env = \"{}\"\n", crate::page::ADMIN_KEY_ENV)
    } else {
        String::new()
    };
    let (server_mode, prm) = if options.prm {
        (
            format!("mode = \"{}\"\n", options.mode.as_str()),
            format!(
                "enabled = true\nrouter_url = \"http://127.0.0.1:{fake_port}/generate\"\n{}",
                options
                    .prm_max_concurrency
                    .map(|n| format!("max_concurrency = {n}\n"))
                    .unwrap_or_default()
            ),
        )
    } else {
        (String::new(), "enabled = false\n".to_owned())
    };
    let teacher = match options.mode {
        ProxyMode::Opd | ProxyMode::Combine if options.prm => format!(
            "\n[teacher]\nurl = \"http://127.0.0.1:{fake_port}/generate\"\n{}",
            options
                .teacher_max_concurrency
                .map(|n| format!("max_concurrency = {n}\n"))
                .unwrap_or_default()
        ),
        _ => String::new(),
    };
    format!(
        r#"# Written by ps-loadgen for one benchmark run.
[server]
host = "127.0.0.1"
port = {proxy_port}
default_turn_type = "main"
{server_mode}{session_timeout}{admin_key}
[sglang]
chat_url = "http://127.0.0.1:{fake_port}/v1/chat/completions"
{token_ids}{upstream_cap}
[prm]
{prm}{teacher}
[logging]
level = "warn"

[store]
path = {store}
{retain}"#
    )
}

fn command(bin: &Path) -> Command {
    let mut cmd = Command::new(bin);
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with(SCRUBBED_PREFIX) {
            cmd.env_remove(key);
        }
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    cmd
}

fn check_binary(bin: &Path) -> Result<(), LoadgenError> {
    if bin.is_file() {
        Ok(())
    } else {
        Err(LoadgenError::MissingBinary {
            path: bin.to_owned(),
        })
    }
}

fn spawn(
    name: &'static str,
    mut cmd: Command,
    port: u16,
    log: PathBuf,
) -> Result<ChildGuard, LoadgenError> {
    let file = File::create(&log).map_err(|source| LoadgenError::Io {
        context: format!("creating {}", log.display()),
        source,
    })?;
    let child = cmd
        .stderr(Stdio::from(file))
        .spawn()
        .map_err(|source| LoadgenError::Io {
            context: format!("starting {name} ({:?})", cmd.get_program()),
            source,
        })?;
    Ok(ChildGuard {
        name,
        port,
        child,
        log,
    })
}

/// Starts `fake-sglang` with the model directory and answer latency on a free port; its log goes
/// to `dir`.
pub fn spawn_fake(
    bin: &Path,
    model_dir: &Path,
    options: FakeOptions,
    dir: &Path,
) -> Result<ChildGuard, LoadgenError> {
    check_binary(bin)?;
    let port = free_port()?;
    let mut cmd = command(bin);
    cmd.arg("--host")
        .arg("127.0.0.1")
        .arg("--port")
        .arg(port.to_string())
        .arg("--model-dir")
        .arg(model_dir)
        .arg("--latency-ms")
        .arg(options.latency.as_millis().to_string())
        .env("RUST_LOG", "warn");
    if !options.prefix_cache {
        cmd.arg("--no-prefix-cache");
    }
    spawn("fake-sglang", cmd, port, dir.join("fake-sglang.log"))
}

/// Writes the proxy's settings into `dir`, checks them with `policy-serving config`, and starts
/// `policy-serving serve` in front of the fake on a free port.
pub fn spawn_proxy(
    bin: &Path,
    model_dir: &Path,
    fake_port: u16,
    dir: &Path,
    options: &ProxyOptions,
) -> Result<ChildGuard, LoadgenError> {
    check_binary(bin)?;
    let port = free_port()?;
    let settings = dir.join("policy-serving.toml");
    std::fs::write(
        &settings,
        proxy_settings_toml(port, fake_port, &dir.join("samples"), options),
    )
    .map_err(|source| LoadgenError::Io {
        context: format!("writing {}", settings.display()),
        source,
    })?;
    let check = command(bin)
        .arg("config")
        .arg("--config")
        .arg(&settings)
        .stderr(Stdio::piped())
        .output()
        .map_err(|source| LoadgenError::Io {
            context: format!("running {} config", bin.display()),
            source,
        })?;
    if !check.status.success() {
        return Err(LoadgenError::Settings {
            path: settings,
            stderr: String::from_utf8_lossy(&check.stderr).trim().to_owned(),
        });
    }
    let mut cmd = command(bin);
    cmd.arg("serve")
        .arg("--config")
        .arg(&settings)
        .arg("--model-dir")
        .arg(model_dir)
        .arg("--port")
        .arg(port.to_string());
    if options.admin_key {
        cmd.env(crate::page::ADMIN_KEY_ENV, crate::page::ADMIN_KEY);
    }
    spawn("policy-serving", cmd, port, dir.join("policy-serving.log"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_name_the_fake_and_quote_the_store_path() {
        let toml = proxy_settings_toml(
            4000,
            5000,
            Path::new("/tmp/a \"b\"/samples"),
            &ProxyOptions::default(),
        );
        assert!(toml.contains("port = 4000\n"));
        assert!(toml.contains("chat_url = \"http://127.0.0.1:5000/v1/chat/completions\""));
        assert!(toml.contains("path = \"/tmp/a \\\"b\\\"/samples\""));
        assert!(toml.contains("default_turn_type = \"main\""));
        assert!(toml.contains("[prm]\nenabled = false\n"));
        assert!(!toml.contains("session_timeout_sec") && !toml.contains("retain_committed"));
        assert!(!toml.contains("token_ids"));
        assert!(!toml.contains("admin_key") && !toml.contains("max_concurrency"));
    }

    #[test]
    fn rl_settings_point_the_judge_at_the_fake() {
        let options = ProxyOptions {
            prm: true,
            prm_max_concurrency: Some(192),
            session_timeout_sec: Some(2),
            retain_committed: Some(0),
            retokenize: true,
            admin_key: true,
            sglang_max_concurrency: Some(1024),
            ..ProxyOptions::default()
        };
        let toml = proxy_settings_toml(4000, 5000, Path::new("/s"), &options);
        assert!(
            toml.contains("session_timeout_sec = 2\nadmin_key_env = \"PS_LOADGEN_ADMIN_KEY\"\n")
        );
        assert!(toml.contains(
            "/v1/chat/completions\"\ntoken_ids = \"retokenize\"\nmax_concurrency = 1024\n"
        ));
        assert!(toml.contains("[server]\n"));
        assert!(toml.contains("mode = \"rl\"\nsession_timeout_sec = 2\n"));
        assert!(toml.contains(
            "[prm]\nenabled = true\nrouter_url = \"http://127.0.0.1:5000/generate\"\n\
                 max_concurrency = 192\n"
        ));
        assert!(toml.ends_with("path = \"/s\"\nretain_committed = 0\n"));
    }

    #[test]
    fn opd_and_combine_settings_take_the_fake_as_teacher() {
        for mode in [ProxyMode::Opd, ProxyMode::Combine] {
            let options = ProxyOptions {
                prm: true,
                mode,
                teacher_max_concurrency: Some(64),
                ..ProxyOptions::default()
            };
            let toml = proxy_settings_toml(4000, 5000, Path::new("/s"), &options);
            assert!(toml.contains(&format!("mode = \"{}\"\n", mode.as_str())));
            assert!(toml.contains("router_url = \"http://127.0.0.1:5000/generate\"\n"));
            assert!(toml.contains(
                "\n[teacher]\nurl = \"http://127.0.0.1:5000/generate\"\nmax_concurrency = 64\n"
            ));
        }
        let rl = ProxyOptions {
            prm: true,
            ..ProxyOptions::default()
        };
        assert!(!proxy_settings_toml(4000, 5000, Path::new("/s"), &rl).contains("[teacher]"));
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
    }
}
