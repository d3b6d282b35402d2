//! A trainer, as the soak runs one beside its clients: it pulls samples from the proxy's rollout API
//! (`GET /v1/rollout/samples?after=SEQ&max=N&wait_ms=MS&format=msgpack|json`), commits each page
//! (`POST /v1/rollout/commit {"through": SEQ}`) so that the store can compact what was consumed,
//! drains the PRM scores (`POST /v1/rollout/eval-scores/drain`) as Slime's rollout function does,
//! and tallies what it received: per sample its session and turn, and whether it is trained on.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Pause after a failed pull or commit before trying again.
const RETRY_AFTER: Duration = Duration::from_millis(100);
/// Error messages kept.
const KEPT_ERRORS: usize = 5;

/// The encoding the trainer asks its pages in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PageFormat {
    /// `format=msgpack`, as the Python bridge pulls whenever `msgpack` is installed (it is in
    /// every Ray, so every Slime, environment).
    #[default]
    Msgpack,
    /// JSON, the API's default.
    Json,
}

impl PageFormat {
    /// The name used by the `format` query parameter and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Msgpack => "msgpack",
            Self::Json => "json",
        }
    }
}

/// How the trainer pulls.
#[derive(Debug, Clone)]
pub struct TrainerSpec {
    /// The proxy's base URL (`http://127.0.0.1:PORT`).
    pub base_url: String,
    /// Samples per page (`max`, 1–1024).
    pub page: usize,
    /// Long-poll bound of each pull (`wait_ms`).
    pub wait: Duration,
    /// What the pages are asked in.
    pub format: PageFormat,
}

/// One page of `GET /v1/rollout/samples`, reduced to what the tally needs (the rest of each
/// sample is skipped by the parser, not built).
#[derive(Debug, Deserialize)]
pub struct Page {
    pub samples: Vec<PageItem>,
    pub last_seq: u64,
}

#[derive(Debug, Deserialize)]
pub struct PageItem {
    pub seq: u64,
    pub sample: SampleView,
}

#[derive(Debug, Deserialize)]
pub struct SampleView {
    pub session_id: String,
    pub turn: u64,
    #[serde(default)]
    pub metadata: MetadataView,
}

#[derive(Debug, Default, Deserialize)]
pub struct MetadataView {
    /// Why the loss mask is all zero (`no_next_state`, `score_zero`, …); `None`: trained on.
    #[serde(default)]
    pub excluded: Option<String>,
}

#[derive(Debug, Deserialize)]
struct EvalScores {
    count: u64,
    mean: Option<f64>,
}

/// What the trainer received and did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TrainerTally {
    /// Pull requests answered (empty long-polls included).
    pub pulls: u64,
    /// What the pages were asked in.
    pub format: PageFormat,
    /// Pages that carried samples.
    pub pages: u64,
    pub samples: u64,
    /// Samples with a non-zero loss mask.
    pub effective: u64,
    /// Samples with an all-zero mask, by the reason the proxy gave.
    pub excluded: BTreeMap<String, u64>,
    /// Samples of a (session, turn) received before (at-least-once delivery allows it; a run
    /// without restarts should have none).
    pub duplicates: u64,
    /// The highest seq received and committed.
    pub committed_seq: u64,
    pub commits: u64,
    /// Body bytes of the pages.
    pub page_bytes: u64,
    /// PRM scores drained, and their mean.
    pub eval_scores: u64,
    pub eval_score_mean: Option<f64>,
    pub errors: u64,
    pub first_errors: Vec<String>,
    /// Every (session id, turn) received.
    #[serde(skip)]
    pub received: HashSet<(String, u64)>,
}

impl TrainerTally {
    /// Counts one page's samples.
    pub fn add_page(&mut self, page: &Page) {
        for item in &page.samples {
            self.samples += 1;
            match &item.sample.metadata.excluded {
                None => self.effective += 1,
                Some(reason) => *self.excluded.entry(reason.clone()).or_default() += 1,
            }
            if !self
                .received
                .insert((item.sample.session_id.clone(), item.sample.turn))
            {
                self.duplicates += 1;
            }
        }
    }

    /// Counts drained eval scores into the running mean.
    fn add_scores(&mut self, count: u64, mean: Option<f64>) {
        let Some(mean) = mean.filter(|_| count > 0) else {
            return;
        };
        let total = self.eval_scores + count;
        let before = self.eval_score_mean.unwrap_or(0.0) * self.eval_scores as f64;
        self.eval_score_mean = Some((before + mean * count as f64) / total as f64);
        self.eval_scores = total;
    }

    fn error(&mut self, what: String) {
        self.errors += 1;
        if self.first_errors.len() < KEPT_ERRORS {
            self.first_errors.push(what);
        }
    }
}

/// A running trainer. [`Trainer::committed`] tells how far it got; [`Trainer::finish`] stops it
/// once it has pulled everything stored and returns the tally.
#[derive(Debug)]
pub struct Trainer {
    format: PageFormat,
    committed: Arc<AtomicU64>,
    stop: watch::Sender<bool>,
    task: JoinHandle<TrainerTally>,
}

impl Trainer {
    /// Starts pulling from `spec.base_url` with `client`.
    pub fn spawn(client: reqwest::Client, spec: TrainerSpec) -> Self {
        let committed = Arc::new(AtomicU64::new(0));
        let (stop, stopped) = watch::channel(false);
        let format = spec.format;
        let task = tokio::spawn(pull_loop(client, spec, committed.clone(), stopped));
        Self {
            format,
            committed,
            stop,
            task,
        }
    }

    /// The highest seq received and committed so far.
    pub fn committed(&self) -> u64 {
        self.committed.load(Ordering::Acquire)
    }

    /// Lets the trainer end at its next empty pull (nothing newer stored), and returns its tally.
    pub async fn finish(self) -> TrainerTally {
        let _ = self.stop.send(true);
        match self.task.await {
            Ok(tally) => tally,
            Err(e) => {
                let mut tally = TrainerTally {
                    format: self.format,
                    ..TrainerTally::default()
                };
                tally.error(format!("the trainer task failed: {e}"));
                tally
            }
        }
    }
}

async fn pull_loop(
    client: reqwest::Client,
    spec: TrainerSpec,
    committed: Arc<AtomicU64>,
    stopped: watch::Receiver<bool>,
) -> TrainerTally {
    let mut tally = TrainerTally {
        format: spec.format,
        ..TrainerTally::default()
    };
    let mut after = 0u64;
    loop {
        // Read before the pull: a stop requested during an empty pull ends the loop at the next one.
        let stop = *stopped.borrow();
        let page = match pull(&client, &spec, after).await {
            Ok((page, bytes)) => {
                tally.page_bytes += bytes;
                page
            }
            Err(e) => {
                tally.error(format!("pull after {after}: {e}"));
                tokio::time::sleep(RETRY_AFTER).await;
                continue;
            }
        };
        tally.pulls += 1;
        let Some(last) = page.samples.iter().map(|i| i.seq).max() else {
            if stop {
                break;
            }
            continue;
        };
        tally.pages += 1;
        tally.add_page(&page);
        after = after.max(last);
        loop {
            match post(
                &client,
                &format!("{}/v1/rollout/commit", spec.base_url),
                Some(after),
            )
            .await
            {
                Ok(_) => break,
                Err(e) => {
                    tally.error(format!("commit through {after}: {e}"));
                    tokio::time::sleep(RETRY_AFTER).await;
                }
            }
        }
        tally.commits += 1;
        tally.committed_seq = after;
        committed.store(after, Ordering::Release);
        drain_scores(&client, &spec, &mut tally).await;
    }
    drain_scores(&client, &spec, &mut tally).await;
    tally
}

async fn drain_scores(client: &reqwest::Client, spec: &TrainerSpec, tally: &mut TrainerTally) {
    let url = format!("{}/v1/rollout/eval-scores/drain", spec.base_url);
    match post(client, &url, None).await {
        Ok(body) => match serde_json::from_slice::<EvalScores>(&body) {
            Ok(s) => tally.add_scores(s.count, s.mean),
            Err(e) => tally.error(format!("eval-scores drain: not the expected JSON: {e}")),
        },
        Err(e) => tally.error(format!("eval-scores drain: {e}")),
    }
}

async fn pull(
    client: &reqwest::Client,
    spec: &TrainerSpec,
    after: u64,
) -> Result<(Page, u64), String> {
    let url = format!(
        "{}/v1/rollout/samples?after={after}&max={}&wait_ms={}&format={}",
        spec.base_url,
        spec.page,
        spec.wait.as_millis(),
        spec.format.name()
    );
    let body = success_body(client.get(&url).send().await).await?;
    let page = match spec.format {
        PageFormat::Json => serde_json::from_slice(&body).map_err(|e| e.to_string()),
        PageFormat::Msgpack => rmp_serde::from_slice(&body).map_err(|e| e.to_string()),
    }
    .map_err(|e| format!("unusable {} page: {e}", spec.format.name()))?;
    Ok((page, body.len() as u64))
}

/// The body of a successful answer; a failed request or a non-2xx status (with the start of its
/// body) as text.
async fn success_body(
    sent: Result<reqwest::Response, reqwest::Error>,
) -> Result<bytes::Bytes, String> {
    let resp = sent.map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = resp.bytes().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(300)])
        ));
    }
    Ok(body)
}

/// POSTs `{"through": through}` (or nothing) and returns the answer's body.
async fn post(
    client: &reqwest::Client,
    url: &str,
    through: Option<u64>,
) -> Result<Vec<u8>, String> {
    let mut req = client.post(url);
    if let Some(seq) = through {
        req = req.json(&serde_json::json!({ "through": seq }));
    }
    let body = success_body(req.send().await).await?;
    Ok(body.to_vec())
}

/// Whether every answered turn of the soak's sessions came back as a sample.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Coverage {
    pub sessions: usize,
    /// Turns the clients had answered: each should be one sample.
    pub turns: usize,
    /// Of those, received by the trainer.
    pub received: usize,
    /// Answered turns without a sample.
    pub missing: usize,
    /// Samples of the soak's sessions that match no answered turn.
    pub unexpected: usize,
    /// The first few missing turns, as `session-id#turn`.
    pub first_missing: Vec<String>,
}

/// Compares the samples received with the turns answered: session `i` (id `{prefix}-{i}`)
/// answered `answered[i]` turns, numbered from 1 by the proxy. Samples of other sessions
/// (warm-up) are ignored.
pub fn coverage(prefix: &str, answered: &[usize], received: &HashSet<(String, u64)>) -> Coverage {
    let mut c = Coverage {
        sessions: answered.len(),
        turns: answered.iter().sum(),
        ..Coverage::default()
    };
    for (id, turn) in received {
        let Some(index) = id
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix('-'))
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        let n = answered.get(index).copied().unwrap_or(0) as u64;
        if (1..=n).contains(turn) {
            c.received += 1;
        } else {
            c.unexpected += 1;
        }
    }
    c.missing = c.turns - c.received;
    'sessions: for (i, n) in answered.iter().enumerate() {
        for turn in 1..=*n as u64 {
            let id = format!("{prefix}-{i}");
            if !received.contains(&(id.clone(), turn)) {
                c.first_missing.push(format!("{id}#{turn}"));
                if c.first_missing.len() >= KEPT_ERRORS {
                    break 'sessions;
                }
            }
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(json: &str) -> Page {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_page_is_read_without_the_bulk_of_its_samples() {
        let p = page(
            r#"{"samples": [
                {"seq": 7, "sample": {"index": 7, "prompt": "…", "tokens": [1, 2, 3], "loss_mask": [1],
                  "session_id": "s-0", "turn": 1, "metadata": {"excluded": null, "votes": [1, 1, 1]}}},
                {"seq": 8, "sample": {"session_id": "s-0", "turn": 2,
                  "metadata": {"excluded": "no_next_state"}}},
                {"seq": 9, "sample": {"session_id": "s-0", "turn": 2, "metadata": {"excluded": "no_next_state"}}}
            ], "last_seq": 12}"#,
        );
        assert_eq!(p.last_seq, 12);
        let mut t = TrainerTally::default();
        t.add_page(&p);
        assert_eq!((t.samples, t.effective, t.duplicates), (3, 1, 1));
        assert_eq!(t.excluded.get("no_next_state"), Some(&2));
        assert_eq!(t.received.len(), 2);
    }

    /// The MessagePack form of a page (what `format=msgpack` answers) reads the same.
    #[test]
    fn a_messagepack_page_reads_as_its_json() {
        let json = r#"{"samples": [
            {"seq": 300, "sample": {"index": 300, "tokens": [1, 70000], "rollout_log_probs": [-0.5],
              "session_id": "s-1", "turn": 4, "metadata": {"excluded": null, "votes": [1, -1]}}},
            {"seq": 301, "sample": {"session_id": "s-1", "turn": 5,
              "metadata": {"excluded": "score_zero"}}}
        ], "last_seq": 70000}"#;
        let tree: serde_json::Value = serde_json::from_str(json).unwrap();
        let p: Page = rmp_serde::from_slice(&rmp_serde::to_vec_named(&tree).unwrap()).unwrap();
        let j = page(json);
        assert_eq!(p.last_seq, 70_000);
        let view = |p: &Page| -> Vec<(u64, String, u64, Option<String>)> {
            p.samples
                .iter()
                .map(|i| {
                    let s = &i.sample;
                    (
                        i.seq,
                        s.session_id.clone(),
                        s.turn,
                        s.metadata.excluded.clone(),
                    )
                })
                .collect()
        };
        assert_eq!(view(&p), view(&j));
        assert_eq!(view(&p)[1].3.as_deref(), Some("score_zero"));
    }

    #[test]
    fn eval_score_mean_pools_the_drains() {
        let mut t = TrainerTally::default();
        t.add_scores(0, None);
        assert_eq!((t.eval_scores, t.eval_score_mean), (0, None));
        t.add_scores(2, Some(1.0));
        t.add_scores(2, Some(0.0));
        assert_eq!(t.eval_scores, 4);
        assert_eq!(t.eval_score_mean, Some(0.5));
    }

    #[test]
    fn coverage_finds_missing_and_unexpected_turns() {
        let answered = [2, 0, 3];
        let mut got: HashSet<(String, u64)> = [
            ("soak-0", 1),
            ("soak-0", 2),
            ("soak-2", 1),
            ("soak-2", 3),
            // Not answered: turn 4 of session 2, any turn of session 1 or 9.
            ("soak-2", 4),
            ("soak-1", 1),
            ("soak-9", 1),
            // Other sessions are not the soak's.
            ("warmup-0", 1),
            ("soak-x", 1),
        ]
        .into_iter()
        .map(|(s, t)| (s.to_owned(), t))
        .collect();
        let c = coverage("soak", &answered, &got);
        assert_eq!((c.sessions, c.turns), (3, 5));
        assert_eq!((c.received, c.missing, c.unexpected), (4, 1, 3));
        assert_eq!(c.first_missing, vec!["soak-2#2".to_owned()]);
        got.insert(("soak-2".to_owned(), 2));
        let c = coverage("soak", &answered, &got);
        assert_eq!((c.received, c.missing), (5, 0));
        assert!(c.first_missing.is_empty());
    }
}
