//! Debian's Prometheus, run by a test against targets on loopback: it scrapes them every second and
//! answers instant queries, so the dashboard's queries can be evaluated against a running server.
//! [`Prometheus::start`] gives `None` without the `prometheus` package, unless
//! `POLICY_SERVING_REQUIRE_PROMTOOL=1` (CI), where a missing package fails the test.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A running Prometheus (stopped on drop) and its scratch directory.
pub struct Prometheus {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

#[derive(Debug, thiserror::Error)]
pub enum PromError {
    #[error("Prometheus at {addr}: {source}")]
    Io {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("Prometheus answered {status} to {query:?}: {body}")]
    Query {
        query: String,
        status: String,
        body: String,
    },
    #[error("{0}")]
    Start(String),
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// Percent-encodes a query string value.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char);
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

impl Prometheus {
    /// Starts Prometheus scraping each of `targets` (`host:port`, path `/metrics`) every second
    /// as job `policy-serving`; `None` when the package is missing and not required.
    pub fn start(targets: &[String]) -> Result<Option<Prometheus>, PromError> {
        let required = std::env::var("POLICY_SERVING_REQUIRE_PROMTOOL").is_ok_and(|v| v == "1");
        let Some(bin) = on_path("prometheus") else {
            let why = "prometheus is not on PATH (apt-get install prometheus)";
            if required {
                return Err(PromError::Start(format!(
                    "POLICY_SERVING_REQUIRE_PROMTOOL=1 but {why}"
                )));
            }
            eprintln!("skipped: {why}");
            return Ok(None);
        };
        let dir = tempfile::tempdir().map_err(|e| PromError::Start(format!("temp dir: {e}")))?;
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: policy-serving\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        );
        let config_file = dir.path().join("prometheus.yml");
        std::fs::write(&config_file, config)
            .map_err(|e| PromError::Start(format!("{}: {e}", config_file.display())))?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| PromError::Start(format!("no free port: {e}")))?
            .port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let log = std::fs::File::create(dir.path().join("prometheus.log"))
            .map_err(|e| PromError::Start(format!("log file: {e}")))?;
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| PromError::Start(format!("prometheus did not start: {e}")))?;
        Ok(Some(Prometheus { child, addr, dir }))
    }

    /// Prometheus's own log so far, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    fn get(&self, path_and_query: &str) -> Result<(String, String), PromError> {
        let io = |source| PromError::Io {
            addr: self.addr,
            source,
        };
        let mut s = TcpStream::connect(self.addr).map_err(io)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))
            .map_err(io)?;
        write!(
            s,
            "GET {path_and_query} HTTP/1.0\r\nHost: {}\r\nAccept: application/json\r\n\r\n",
            self.addr
        )
        .map_err(io)?;
        let mut raw = String::new();
        s.read_to_string(&mut raw).map_err(io)?;
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        let status = head.lines().next().unwrap_or("").to_owned();
        Ok((status, body.to_owned()))
    }

    /// The result of the instant query `expr`: Prometheus's `data.result` (for a vector, one
    /// entry per series).
    pub fn query(&self, expr: &str) -> Result<Vec<Value>, PromError> {
        let (status, body) = self.get(&format!("/api/v1/query?query={}", encode(expr)))?;
        let fail = || PromError::Query {
            query: expr.to_owned(),
            status: status.clone(),
            body: body.clone(),
        };
        let v: Value = serde_json::from_str(&body).map_err(|_| fail())?;
        if v["status"] != "success" {
            return Err(fail());
        }
        match &v["data"]["result"] {
            Value::Array(a) => Ok(a.clone()),
            // A scalar or string result: one value.
            other => Ok(vec![other.clone()]),
        }
    }

    /// Waits until every target has been scraped at least `scrapes` times successfully
    /// (`up == 1` for each), at most `timeout`.
    pub fn wait_scraped(
        &self,
        targets: usize,
        scrapes: u32,
        timeout: Duration,
    ) -> Result<(), PromError> {
        let started = Instant::now();
        let expr =
            format!("count_over_time(up{{job=\"policy-serving\"}}[1m]) >= {scrapes} and up == 1");
        loop {
            if let Ok(r) = self.query(&expr)
                && r.len() >= targets
            {
                return Ok(());
            }
            if started.elapsed() > timeout {
                return Err(PromError::Start(format!(
                    "Prometheus at {} did not scrape {targets} target(s) {scrapes} times within {timeout:?}; its log:\n{}",
                    self.addr,
                    self.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::encode;

    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(
            encode(r#"sum by (a) (rate(m{j=~"x"}[5m]))"#),
            "sum%20by%20%28a%29%20%28rate%28m%7Bj%3D~%22x%22%7D%5B5m%5D%29%29"
        );
    }
}
