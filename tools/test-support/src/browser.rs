//! The WebDriver harness of the browser tests (feature `test-support`): Debian's `chromium`,
//! headless, driven through `chromedriver` with fantoccini. A test calls [`Browser::start`], which
//! gives `None` (and says why) when either program is missing, unless
//! `POLICY_SERVING_REQUIRE_BROWSER=1` (CI), where a missing browser fails the test.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

pub use fantoccini::Locator;
use fantoccini::{Client, ClientBuilder};
use serde_json::{Value, json};

/// How long a page may take to show what a test waits for. A bound, not a measurement.
pub const WAIT: Duration = Duration::from_secs(15);

/// A headless chromium session and the chromedriver behind it (killed on drop).
pub struct Browser {
    pub client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// How many times a test tries to get a browser session, each from a fresh chromedriver: one
/// failed start of a program we do not own (its port taken, its session refused) must not fail a
/// test about the page.
const SESSION_ATTEMPTS: u32 = 3;

/// What a chromedriver printed (stdout and stderr), kept for the message of a failed start.
#[derive(Clone, Default)]
struct DriverOutput(Arc<Mutex<Vec<String>>>);

/// Lines of a chromedriver's output kept (the first ones: its start is what a failure needs).
const OUTPUT_LINES: usize = 200;

/// The port in chromedriver's "ChromeDriver was started successfully on port 45749." line.
fn announced_port(line: &str) -> Option<u16> {
    let rest = line.split("started successfully on port ").nth(1)?;
    rest.trim()
        .trim_end_matches('.')
        .parse()
        .ok()
        .filter(|&p| p != 0)
}

impl DriverOutput {
    /// Reads `from` line by line until it ends (bytes that are not UTF-8 are replaced, never a
    /// reason to stop reading: the pipe is drained as long as chromedriver writes to it).
    fn drain(&self, from: impl Read + Send + 'static, port: Option<mpsc::Sender<u16>>) {
        let lines = self.0.clone();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(from);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                let line = String::from_utf8_lossy(&buf);
                let line = line.trim_end_matches(['\n', '\r']);
                if let (Some(tx), Some(p)) = (&port, announced_port(line)) {
                    let _ = tx.send(p);
                }
                if let Ok(mut l) = lines.lock()
                    && l.len() < OUTPUT_LINES
                {
                    l.push(line.to_owned());
                }
            }
        });
    }

    fn text(&self) -> String {
        self.0.lock().map(|l| l.join("\n")).unwrap_or_default()
    }
}

/// Starts chromedriver on a port of its choosing and waits until it says which, or says why it
/// did not start. With `--port=0` chromedriver takes a free IPv6 port and then binds the same
/// number on IPv4, which another process may hold ("IPv4 port not available. Exiting..."), seen
/// in CI with two browser tests starting at once: the caller starts a fresh one.
fn spawn_driver(driver: &Path) -> Result<(Child, SocketAddr, DriverOutput), String> {
    let mut child = Command::new(driver)
        .arg("--port=0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("chromedriver did not start: {e}"));
    let output = DriverOutput::default();
    let (tx, rx) = mpsc::channel();
    if let Some(out) = child.stdout.take() {
        output.drain(out, Some(tx));
    }
    if let Some(err) = child.stderr.take() {
        output.drain(err, None);
    }
    match rx.recv_timeout(WAIT) {
        Ok(port) => Ok((child, SocketAddr::from(([127, 0, 0, 1], port)), output)),
        Err(e) => {
            let exited = child.try_wait().ok().flatten();
            let _ = child.kill();
            let _ = child.wait();
            // Its stderr may still be on the way.
            std::thread::sleep(Duration::from_millis(200));
            let why = match (e, exited) {
                (mpsc::RecvTimeoutError::Timeout, _) => {
                    format!(
                        "did not say its port within {WAIT:?} (a build before mid-2024 does not)"
                    )
                }
                (mpsc::RecvTimeoutError::Disconnected, Some(status)) => {
                    format!("exited ({status}) without saying its port")
                }
                (mpsc::RecvTimeoutError::Disconnected, None) => {
                    "closed its output without saying its port".to_owned()
                }
            };
            Err(format!(
                "chromedriver {why}; its output:\n{}",
                output.text()
            ))
        }
    }
}

/// Opens a headless chromium session (window 1280×900) through the chromedriver at `addr`.
async fn connect(
    addr: SocketAddr,
    chromium: &Path,
    profile: &tempfile::TempDir,
) -> Result<Client, fantoccini::error::NewSessionError> {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chromium,
            "args": [
                "--headless=new",
                // Tests run as root in CI: chromium refuses its sandbox there.
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--window-size=1280,900",
                "--force-device-scale-factor=1",
                format!("--user-data-dir={}", profile.path().display()),
            ],
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(caps)
        .connect(&format!("http://{addr}"))
        .await
}

impl Browser {
    /// Starts chromedriver and a headless chromium session (window 1280×900), or `None` when
    /// they are not installed and not required.
    pub async fn start() -> Option<Browser> {
        let required = std::env::var("POLICY_SERVING_REQUIRE_BROWSER").is_ok_and(|v| v == "1");
        let chromium = std::env::var_os("POLICY_SERVING_CHROMIUM")
            .map(PathBuf::from)
            .or_else(|| on_path("chromium"))
            .or_else(|| on_path("chromium-browser"));
        let driver = on_path("chromedriver");
        let (Some(chromium), Some(driver)) = (chromium, driver) else {
            let why =
                "chromium and chromedriver are needed (apt-get install chromium chromium-driver)";
            assert!(!required, "POLICY_SERVING_REQUIRE_BROWSER=1 but {why}");
            eprintln!("skipped: {why}");
            return None;
        };
        // chromedriver picks its own port (`--port=0`) and prints it: a port chosen here and freed
        // before chromedriver binds it can be taken in between by anything else on the machine.
        let mut last_error = String::new();
        for attempt in 1..=SESSION_ATTEMPTS {
            let profile = tempfile::tempdir().unwrap_or_else(|e| panic!("temporary profile: {e}"));
            let path = driver.clone();
            let started = match tokio::task::spawn_blocking(move || spawn_driver(&path)).await {
                Ok(started) => started,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => panic!("starting chromedriver: {e}"),
            };
            let (mut driver, addr, output) = match started {
                Ok(started) => started,
                Err(e) => {
                    last_error = format!("attempt {attempt}: {e}");
                    eprintln!("no chromedriver yet, {last_error}");
                    continue;
                }
            };
            let session = tokio::time::timeout(WAIT * 2, connect(addr, &chromium, &profile));
            let session = match session.await {
                Ok(started) => started.map_err(|e| e.to_string()),
                Err(_) => Err(format!("no session within {:?}", WAIT * 2)),
            };
            match session {
                Ok(client) => {
                    return Some(Browser {
                        client,
                        driver,
                        _profile: profile,
                    });
                }
                Err(e) => {
                    let exited = driver.try_wait().ok().flatten();
                    let _ = driver.kill();
                    let _ = driver.wait();
                    last_error = format!(
                        "attempt {attempt}: {e} (chromedriver {}); its output:\n{}",
                        exited.map_or("still running".to_owned(), |s| format!("exited: {s}")),
                        output.text()
                    );
                    eprintln!("no chromium session yet, {last_error}");
                }
            }
        }
        panic!(
            "no chromium session through chromedriver after {SESSION_ATTEMPTS} attempts; {last_error}"
        );
    }

    /// Opens `url`.
    pub async fn goto(&self, url: &str) {
        self.client
            .goto(url)
            .await
            .unwrap_or_else(|e| panic!("goto {url}: {e}"));
    }

    /// Runs `script` (a function body; `arguments` holds `args`) and returns its value.
    pub async fn js(&self, script: &str, args: Vec<Value>) -> Value {
        self.client
            .execute(script, args)
            .await
            .unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// The visible text of every element matching `css`.
    pub async fn texts(&self, css: &str) -> Vec<String> {
        let v = self
            .js(
                "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.innerText);",
                vec![json!(css)],
            )
            .await;
        v.as_array()
            .map(|a| {
                a.iter()
                    .map(|s| s.as_str().unwrap_or("").to_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits until an element matching `css` shows text containing `needle`; returns that text.
    pub async fn wait_text(&self, css: &str, needle: &str) -> String {
        let started = Instant::now();
        loop {
            if let Some(t) = self
                .texts(css)
                .await
                .into_iter()
                .find(|t| t.contains(needle))
            {
                return t;
            }
            if started.elapsed() > WAIT {
                let shown = self.texts("body").await.join("\n");
                panic!("no `{css}` showing {needle:?} within {WAIT:?}; the page shows:\n{shown}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until an element matching `css` exists and is displayed.
    pub async fn wait_visible(&self, css: &str) -> fantoccini::elements::Element {
        let started = Instant::now();
        loop {
            if let Ok(e) = self.client.find(Locator::Css(css)).await
                && e.is_displayed().await.unwrap_or(false)
            {
                return e;
            }
            if started.elapsed() > WAIT {
                let shown = self.texts("body").await.join("\n");
                panic!("`{css}` not shown within {WAIT:?}; the page shows:\n{shown}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Types `key` into the page's admin-key prompt (waiting for it to show) and submits it.
    pub async fn submit_key(&self, key: &str) {
        let input = self.wait_visible("#key-input").await;
        input
            .send_keys(key)
            .await
            .unwrap_or_else(|e| panic!("typing the admin key: {e}"));
        self.client
            .find(Locator::Css("#key-form button"))
            .await
            .unwrap_or_else(|e| panic!("the admin-key form's button: {e}"))
            .click()
            .await
            .unwrap_or_else(|e| panic!("submitting the admin key: {e}"));
    }

    /// A PNG of the window.
    pub async fn screenshot(&self) -> Vec<u8> {
        self.client
            .screenshot()
            .await
            .unwrap_or_else(|e| panic!("screenshot: {e}"))
    }

    /// Ends the session and the driver.
    pub async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Browser {
    /// The background colour of the sample view's `i`-th token chip, as `(r, g, b)`.
    pub async fn token_colour(&self, i: usize) -> (i64, i64, i64) {
        let v = self
            .js(
                "return getComputedStyle(document.querySelectorAll('#tokens .tok')[arguments[0]]).backgroundColor;",
                vec![json!(i)],
            )
            .await;
        rgb(v
            .as_str()
            .unwrap_or_else(|| panic!("not a CSS colour: {v}")))
    }
}

/// An `rgb(r, g, b)` or `rgba(r, g, b, a)` colour's channels; panics on anything else (a test
/// helper: a colour that does not parse fails the test).
pub fn rgb(css: &str) -> (i64, i64, i64) {
    let inner = css
        .trim_start_matches("rgba(")
        .trim_start_matches("rgb(")
        .trim_end_matches(')');
    let v: Vec<i64> = inner
        .split(',')
        .take(3)
        .map(|x| {
            x.trim()
                .parse()
                .unwrap_or_else(|e| panic!("colour {css:?}: {e}"))
        })
        .collect();
    (v[0], v[1], v[2])
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::announced_port;

    #[test]
    fn the_port_is_read_from_chromedrivers_start_line_only() {
        let said = "ChromeDriver was started successfully on port 45749.";
        assert_eq!(announced_port(said), Some(45749));
        assert_eq!(announced_port(&format!("{said}\r")), Some(45749));
        assert_eq!(
            announced_port("ChromeDriver was started successfully on port 0."),
            None
        );
        assert_eq!(
            announced_port("Starting ChromeDriver 148.0.7778.167 (65db666a) on port 0"),
            None
        );
        assert_eq!(
            announced_port("ChromeDriver was started successfully."),
            None
        );
    }
}
