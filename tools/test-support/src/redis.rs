//! A real `redis-server` for tests: started on a free loopback port in a temporary directory with
//! an fsynced append-only file, restartable on the same port and data, killed on drop.
//!
//! When `redis-server` is not installed, [`RedisServer::start`] returns `None` and the caller
//! skips, unless `POLICY_SERVING_REQUIRE_REDIS=1` (set by `.ci/run`), where it panics: CI must not
//! skip these tests silently.
#![allow(clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a started server may take to answer PING.
const READY_BOUND: Duration = Duration::from_secs(20);

pub struct RedisServer {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl std::fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .finish()
    }
}

fn binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
        .map(|d| d.join("redis-server"))
        .find(|p| p.is_file())
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl RedisServer {
    /// Starts a server, or `None` when `redis-server` is not installed (see the module docs).
    pub fn start() -> Option<Self> {
        let Some(bin) = binary() else {
            assert!(
                std::env::var("POLICY_SERVING_REQUIRE_REDIS").as_deref() != Ok("1"),
                "redis-server is not installed but POLICY_SERVING_REQUIRE_REDIS=1 \
                 (apt-get install redis-server)"
            );
            eprintln!("redis-server not installed: skipping this test");
            return None;
        };
        let mut server = Self {
            port: free_port(),
            dir: tempfile::tempdir().expect("a temporary directory"),
            child: None,
        };
        server.spawn(&bin);
        Some(server)
    }

    fn spawn(&mut self, bin: &Path) {
        let child = Command::new(bin)
            .args(["--bind", "127.0.0.1", "--port"])
            .arg(self.port.to_string())
            .arg("--dir")
            .arg(self.dir.path())
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--daemonize",
                "no",
                "--protected-mode",
                "yes",
                "--logfile",
                "",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        let started = Instant::now();
        while !self.answers() {
            assert!(
                started.elapsed() < READY_BOUND,
                "redis-server on port {} did not answer within {READY_BOUND:?}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn answers(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        let mut buf = [0u8; 16];
        s.write_all(b"PING\r\n").is_ok()
            && s.read(&mut buf)
                .is_ok_and(|n| buf[..n].starts_with(b"+PONG"))
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server with SIGKILL (no shutdown save: only the fsynced append-only file
    /// survives) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and data directory.
    pub fn restart(&mut self) {
        self.kill();
        let bin = binary().expect("redis-server");
        self.spawn(&bin);
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Redis for a test that does not need to kill it: the one `POLICY_SERVING_REDIS_URL` names
/// (`.ci/run` starts one on loopback) or else a server of its own. Each value has a deployment name
/// of its own, so tests sharing one server never see each other's keys.
#[derive(Debug)]
pub struct TestRedis {
    url: String,
    deployment: String,
    owned: Option<RedisServer>,
}

impl TestRedis {
    /// `None` when there is no shared server and `redis-server` is not installed (see
    /// [`RedisServer::start`]).
    pub fn shared_or_start() -> Option<Self> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let deployment = format!("test-{}-{n}-{nanos}", std::process::id());
        match std::env::var("POLICY_SERVING_REDIS_URL") {
            Ok(url) if !url.trim().is_empty() => Some(Self {
                url: url.trim().to_owned(),
                deployment,
                owned: None,
            }),
            _ => RedisServer::start().map(|server| Self {
                url: server.url(),
                deployment,
                owned: Some(server),
            }),
        }
    }

    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// A deployment name no other test uses.
    pub fn deployment(&self) -> &str {
        &self.deployment
    }

    /// The server this value started (none when it uses the shared one).
    pub fn owned(&self) -> Option<&RedisServer> {
        self.owned.as_ref()
    }
}
