//! An open inspection page, emulated: while a proxied phase runs, each "page" polls the proxy's
//! `/v1/inspect/*` API as `crates/inspect/assets/app.js` does, with the admin key, so that the
//! phase's proxy CPU per request and added latency include what an open page costs the chat path.
//!
//! The page JS refreshes the view on screen: the overview every 2 s, the session list
//! (`?limit=500`) every 5 s, a session's timeline every 3 s; the sample view loads once. One
//! emulated page shows all four views at once (an upper bound on one person): the overview, the
//! list, the timeline of the session the list shows first, and that session's newest sample, each
//! at its view's period (the sample at the timeline's, as someone clicking through turns). The
//! first request of each view goes out when the phase starts, so a short phase still sees one.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use crate::stats::Summary;

/// Refresh periods of the page's views (`schedule(id, …)` in `app.js`).
pub const OVERVIEW_EVERY: Duration = Duration::from_millis(2000);
pub const SESSIONS_EVERY: Duration = Duration::from_millis(5000);
pub const TIMELINE_EVERY: Duration = Duration::from_millis(3000);
pub const SAMPLE_EVERY: Duration = TIMELINE_EVERY;
/// How soon a view that has nothing to show yet (no session, no sample) looks again.
const RETRY_EMPTY: Duration = Duration::from_millis(100);
/// Bound of one page request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The admin key the proxy is given when pages are open (through [`ADMIN_KEY_ENV`]).
pub const ADMIN_KEY: &str = "loadgen-admin-key";
/// The variable the proxy's `server.admin_key_env` names (not `POLICY_SERVING_*`, which the
/// children's environment is scrubbed of).
pub const ADMIN_KEY_ENV: &str = "PS_LOADGEN_ADMIN_KEY";

const KEPT_ERRORS: usize = 5;

/// What the open pages of one phase did, pooled over its rounds.
#[derive(Debug, Clone, Default)]
pub(crate) struct PageTally {
    pub latencies_ms: Vec<f64>,
    pub by_view: [usize; 4],
    pub errors: usize,
    pub first_errors: Vec<String>,
}

impl PageTally {
    pub(crate) fn absorb(&mut self, other: Self) {
        self.latencies_ms.extend(other.latencies_ms);
        for (a, b) in self.by_view.iter_mut().zip(other.by_view) {
            *a += b;
        }
        self.errors += other.errors;
        self.first_errors.extend(other.first_errors);
        self.first_errors.truncate(KEPT_ERRORS);
    }

    fn record(&mut self, view: View, result: Result<(Value, f64), String>) -> Option<Value> {
        match result {
            Ok((body, ms)) => {
                self.latencies_ms.push(ms);
                self.by_view[view as usize] += 1;
                Some(body)
            }
            Err(e) => {
                self.errors += 1;
                if self.first_errors.len() < KEPT_ERRORS {
                    self.first_errors.push(format!("{view:?}: {e}"));
                }
                None
            }
        }
    }

    pub(crate) fn report(&self, pages: usize) -> PageReport {
        PageReport {
            pages,
            requests: self.latencies_ms.len(),
            overview: self.by_view[View::Overview as usize],
            sessions: self.by_view[View::Sessions as usize],
            timeline: self.by_view[View::Timeline as usize],
            sample: self.by_view[View::Sample as usize],
            errors: self.errors,
            first_errors: self.first_errors.clone(),
            latency_ms: Summary::of(self.latencies_ms.iter().copied()),
        }
    }
}

/// The open pages of a phase, in its report.
#[derive(Debug, Clone, Serialize)]
pub struct PageReport {
    /// Pages open during the phase.
    pub pages: usize,
    /// Answered page requests, in all and per view.
    pub requests: usize,
    pub overview: usize,
    pub sessions: usize,
    pub timeline: usize,
    pub sample: usize,
    pub errors: usize,
    pub first_errors: Vec<String>,
    /// Latency of the page's requests.
    pub latency_ms: Option<Summary>,
}

#[derive(Debug, Clone, Copy)]
enum View {
    Overview = 0,
    Sessions = 1,
    Timeline = 2,
    Sample = 3,
}

/// What the session list and the timeline showed, for the views that follow them.
#[derive(Default)]
struct Shown {
    session: Option<String>,
    seq: Option<u64>,
}

/// Open pages against `base_url` until [`OpenPages::close`].
pub(crate) struct OpenPages {
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<PageTally>>,
}

impl OpenPages {
    /// Opens `pages` pages (each its own task) polling the proxy at `base_url`.
    pub(crate) fn open(client: &reqwest::Client, base_url: &str, pages: usize) -> Self {
        let (stop, rx) = tokio::sync::watch::channel(false);
        let tasks = (0..pages)
            .map(|_| {
                let page = Page {
                    client: client.clone(),
                    base_url: base_url.to_owned(),
                    shown: Arc::new(Mutex::new(Shown::default())),
                };
                tokio::spawn(page.run(rx.clone()))
            })
            .collect();
        Self { stop, tasks }
    }

    /// Stops polling, lets the requests in flight finish, and returns what the pages did.
    pub(crate) async fn close(self) -> PageTally {
        let _ = self.stop.send(true);
        let mut tally = PageTally::default();
        for task in self.tasks {
            match task.await {
                Ok(t) => tally.absorb(t),
                Err(e) => {
                    tally.errors += 1;
                    tally.first_errors.push(format!("page task: {e}"));
                }
            }
        }
        tally
    }
}

struct Page {
    client: reqwest::Client,
    base_url: String,
    shown: Arc<Mutex<Shown>>,
}

impl Page {
    async fn run(self, stop: tokio::sync::watch::Receiver<bool>) -> PageTally {
        let views = [View::Overview, View::Sessions, View::Timeline, View::Sample]
            .map(|view| self.view(view, stop.clone()));
        let [a, b, c, d] = views;
        let (a, b, c, d) = tokio::join!(a, b, c, d);
        let mut tally = a;
        for t in [b, c, d] {
            tally.absorb(t);
        }
        tally
    }

    /// One view, refreshed at its period until `stop`.
    async fn view(&self, view: View, mut stop: tokio::sync::watch::Receiver<bool>) -> PageTally {
        let mut tally = PageTally::default();
        let every = match view {
            View::Overview => OVERVIEW_EVERY,
            View::Sessions => SESSIONS_EVERY,
            View::Timeline => TIMELINE_EVERY,
            View::Sample => SAMPLE_EVERY,
        };
        loop {
            if *stop.borrow() {
                return tally;
            }
            let wait = match self.path(view) {
                Some(path) => {
                    let result = self.get(&path).await;
                    if let Some(body) = tally.record(view, result) {
                        self.remember(view, &body);
                    }
                    every
                }
                None => RETRY_EMPTY,
            };
            tokio::select! {
                _ = stop.changed() => return tally,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// The path the view asks for now; `None` while it has nothing to show.
    fn path(&self, view: View) -> Option<String> {
        let shown = self
            .shown
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match view {
            View::Overview => Some("/v1/inspect/overview".to_owned()),
            View::Sessions => Some("/v1/inspect/sessions?limit=500&q=".to_owned()),
            View::Timeline => shown
                .session
                .as_ref()
                .map(|id| format!("/v1/inspect/sessions/{}", encode_segment(id))),
            View::Sample => shown.seq.map(|seq| format!("/v1/inspect/samples/{seq}")),
        }
    }

    /// Keeps what the list and the timeline showed: the first session listed, its newest sample.
    fn remember(&self, view: View, body: &Value) {
        let mut shown = self
            .shown
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match view {
            View::Sessions => {
                if let Some(id) = body["sessions"][0]["id"].as_str() {
                    shown.session = Some(id.to_owned());
                }
            }
            View::Timeline => {
                let newest = body["turns"]
                    .as_array()
                    .and_then(|turns| turns.iter().rev().find_map(|t| t["seq"].as_u64()));
                if newest.is_some() {
                    shown.seq = newest;
                }
            }
            View::Overview | View::Sample => {}
        }
    }

    async fn get(&self, path: &str) -> Result<(Value, f64), String> {
        let started = Instant::now();
        let resp = self
            .client
            .get(format!("{}{path}", self.base_url))
            .bearer_auth(ADMIN_KEY)
            .header("accept", "application/json")
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .map_err(|e| format!("GET {path}: {e}"))?;
        let status = resp.status();
        let body = resp.bytes().await.map_err(|e| format!("GET {path}: {e}"))?;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        if !status.is_success() {
            return Err(format!(
                "GET {path}: HTTP {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            ));
        }
        let json =
            serde_json::from_slice(&body).map_err(|e| format!("GET {path}: not JSON: {e}"))?;
        Ok((json, ms))
    }
}

/// `id` as one URL path segment (`encodeURIComponent`, as the page does).
fn encode_segment(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.!~*'()".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_encoded_as_the_page_encodes_them() {
        assert_eq!(encode_segment("loadgen-r1-proxy-3"), "loadgen-r1-proxy-3");
        assert_eq!(encode_segment("a/b c?é"), "a%2Fb%20c%3F%C3%A9");
    }

    #[test]
    fn the_list_and_the_timeline_choose_what_the_next_views_show() {
        let page = Page {
            client: reqwest::Client::new(),
            base_url: "http://127.0.0.1:9".into(),
            shown: Arc::default(),
        };
        assert_eq!(page.path(View::Timeline), None);
        assert_eq!(page.path(View::Sample), None);
        page.remember(
            View::Sessions,
            &serde_json::json!({"sessions": [{"id": "s 1"}, {"id": "s2"}]}),
        );
        assert_eq!(
            page.path(View::Timeline).as_deref(),
            Some("/v1/inspect/sessions/s%201")
        );
        page.remember(
            View::Timeline,
            &serde_json::json!({"turns": [{"seq": 4}, {"seq": 7}, {"status": "pending"}]}),
        );
        assert_eq!(
            page.path(View::Sample).as_deref(),
            Some("/v1/inspect/samples/7")
        );
        // A timeline without samples keeps the last one shown.
        page.remember(View::Timeline, &serde_json::json!({"turns": []}));
        assert_eq!(
            page.path(View::Sample).as_deref(),
            Some("/v1/inspect/samples/7")
        );
    }

    #[test]
    fn tallies_pool_and_report_per_view() {
        let mut a = PageTally::default();
        a.record(View::Overview, Ok((Value::Null, 1.0)));
        a.record(View::Sample, Ok((Value::Null, 3.0)));
        let mut b = PageTally::default();
        b.record(View::Sample, Err("HTTP 500".into()));
        b.record(View::Sessions, Ok((Value::Null, 2.0)));
        a.absorb(b);
        let r = a.report(2);
        assert_eq!((r.pages, r.requests, r.errors), (2, 3, 1));
        assert_eq!((r.overview, r.sessions, r.timeline, r.sample), (1, 1, 0, 1));
        assert_eq!(r.first_errors, vec!["Sample: HTTP 500".to_owned()]);
        assert_eq!(r.latency_ms.map(|s| s.max), Some(3.0));
    }
}
