//! A hand-filled history and store for the router and browser tests: two sessions, one of them
//! with a message that tries to run script, and samples with every kind of position.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ps_core::sample::{Reward, Sample, SampleStatus};
use ps_core::{
    LogError, PendingStore, PendingTurn, SampleLog, SampleSink, SessionSource, SinkError,
    StoreStats, StoredSample, TeacherOutcome, TurnEvent, TurnObserver, TurnType,
};
use ps_inspect::api::Live;
use ps_inspect::{Inspect, InspectHistory, LiveStatus, TokenText};
use serde_json::json;

/// Text that would run script if the page inserted it as HTML.
pub const HOSTILE: &str =
    "<script>window.__pwned = 1</script><img src=x onerror=\"window.__pwned = 2\">";

/// A store of samples in memory.
#[derive(Default)]
pub struct MemLog {
    pub samples: Mutex<Vec<StoredSample>>,
    pub committed: Mutex<u64>,
}

#[async_trait::async_trait]
impl SampleSink for MemLog {
    async fn submit(&self, sample: &Sample) -> Result<u64, SinkError> {
        let mut s = self.samples.lock().unwrap();
        let seq = s.len() as u64 + 1;
        let mut sample = sample.clone();
        sample.index = seq;
        sample.group_index = seq;
        s.push(StoredSample { seq, sample });
        Ok(seq)
    }
}

#[async_trait::async_trait]
impl PendingStore for MemLog {
    async fn save_pending(&self, turns: Vec<PendingTurn>) -> Result<usize, SinkError> {
        Ok(turns.len())
    }
    async fn take_pending(&self) -> Result<Vec<PendingTurn>, SinkError> {
        Ok(Vec::new())
    }
}

#[async_trait::async_trait]
impl SampleLog for MemLog {
    async fn read(&self, after: u64, max: usize, _: &str) -> Result<Vec<StoredSample>, LogError> {
        let s = self.samples.lock().unwrap();
        Ok(s.iter()
            .filter(|x| x.seq > after)
            .take(max)
            .cloned()
            .collect())
    }
    async fn get(&self, seq: u64) -> Result<Option<StoredSample>, LogError> {
        Ok(self
            .samples
            .lock()
            .unwrap()
            .iter()
            .find(|x| x.seq == seq)
            .cloned())
    }
    async fn wait_newer(&self, _: u64, _: Duration) -> Result<u64, LogError> {
        Ok(self.samples.lock().unwrap().len() as u64)
    }
    async fn commit(&self, through: u64, _: &str) -> Result<(), LogError> {
        *self.committed.lock().unwrap() = through;
        Ok(())
    }
    async fn stats(&self) -> Result<StoreStats, LogError> {
        let last = self.samples.lock().unwrap().len() as u64;
        let committed = *self.committed.lock().unwrap();
        Ok(StoreStats {
            last_seq: last,
            committed,
            stored: last,
            lag: last - committed,
        })
    }
    async fn close(&self) -> Result<(), LogError> {
        Ok(())
    }
    fn describe(&self) -> String {
        "memory".into()
    }
}

/// Token `id`'s text: a few words, a newline, and the hostile text at id 666.
pub struct Vocab;

impl TokenText for Vocab {
    fn text(&self, id: u32) -> Option<String> {
        Some(match id {
            666 => HOSTILE.to_owned(),
            10 => "\n".to_owned(),
            151645 => "<|im_end|>".to_owned(),
            n => format!("w{n} "),
        })
    }
}

/// Response tokens of the long sample.
pub const LONG: usize = 2000;

pub struct FixedLive;

impl LiveStatus for FixedLive {
    fn live(&self) -> Live {
        Live {
            submission_enabled: false,
            pause_mode: "hold".into(),
            mode: "opd".into(),
            live_sessions: 2,
            pending: [
                ("waiting_next_state".to_owned(), 1),
                ("scoring".to_owned(), 0),
            ]
            .into_iter()
            .collect(),
        }
    }
}

/// The RL sample of session `alpha` turn 1 (seq 1): sampled tokens with falling log-probs, a
/// template-inserted position without a log-prob (masked) and the end-of-turn token.
pub fn rl_sample() -> Sample {
    let mut metadata = serde_json::Map::new();
    metadata.insert("mode".into(), json!("rl"));
    metadata.insert("votes".into(), json!([1, 1, -1]));
    metadata.insert("logprob_missing_positions".into(), json!([4]));
    metadata.insert(
        "logprob_sources".into(),
        json!([
            "sampled",
            "sampled",
            "sampled",
            "sampled",
            "unsampled",
            "sampled"
        ]),
    );
    Sample {
        prompt: format!("<|im_start|>user\n{HOSTILE}<|im_end|>\n<|im_start|>assistant\n"),
        response: "…".into(),
        tokens: vec![1, 2, 3, 100, 101, 666, 102, 10, 151645],
        response_length: 6,
        loss_mask: vec![1, 1, 1, 1, 0, 1],
        rollout_log_probs: vec![-0.01, -0.7, -5.0, -0.2, 0.0, -0.05],
        reward: Reward { score: 1.0 },
        status: SampleStatus::Completed,
        session_id: "alpha".into(),
        turn: 1,
        metadata,
        ..Sample::default()
    }
}

/// The OPD sample of session `beta` turn 1 (seq 2): teacher log-probs and top-2.
pub fn opd_sample() -> Sample {
    let mut metadata = serde_json::Map::new();
    metadata.insert("mode".into(), json!("opd"));
    metadata.insert("hint".into(), json!(HOSTILE));
    metadata.insert("hint_votes".into(), json!([1, null]));
    metadata.insert("teacher".into(), json!("hinted"));
    Sample {
        prompt: "prompt".into(),
        tokens: vec![1, 200, 201, 202],
        response_length: 3,
        loss_mask: vec![1, 1, 1],
        rollout_log_probs: vec![-1.0, -0.1, -2.0],
        teacher_log_probs: Some(vec![-0.1, -0.1, -4.0]),
        teacher_topk_indices: Some(vec![vec![200, 7], vec![201, 8], vec![9, 202]]),
        teacher_topk_log_probs: Some(vec![vec![-0.1, -2.5], vec![-0.1, -3.0], vec![-0.5, -4.0]]),
        reward: Reward { score: 1.0 },
        status: SampleStatus::Completed,
        session_id: "beta".into(),
        turn: 1,
        metadata,
        ..Sample::default()
    }
}

/// A sample of a session the history never saw (seq 3: as if written before a restart), with a
/// long response: `n` tokens, log-probs falling along it.
pub fn long_sample(n: usize) -> Sample {
    let ids: Vec<u32> = (0..n as u32).map(|i| 1000 + i % 500).collect();
    Sample {
        prompt: "long".into(),
        tokens: [vec![1u32], ids].concat(),
        response_length: n,
        loss_mask: vec![1; n],
        rollout_log_probs: (0..n).map(|i| -(i as f64) / n as f64 * 6.0).collect(),
        reward: Reward { score: 0.0 },
        status: SampleStatus::Truncated,
        session_id: "before-restart".into(),
        turn: 7,
        ..Sample::default()
    }
}

/// History, store and live status filled by hand as the server and buffer would.
pub async fn filled() -> Inspect {
    let history = Arc::new(InspectHistory::default());
    let log = Arc::new(MemLog::default());
    let h: &dyn TurnObserver = history.as_ref();
    let opened = |session, turn, turn_type| TurnEvent::Opened {
        session,
        turn,
        turn_type,
        source: SessionSource::Header,
        streamed: false,
        door: ps_core::Door::ChatCompletions,
    };
    // alpha: main turn 1 judged and stored; a side turn; main turn 2 waiting for its next state.
    h.observe(opened("alpha", Some(1), TurnType::Main));
    h.observe(TurnEvent::Captured {
        session: "alpha",
        turn: 1,
        response_tokens: 6,
    });
    h.observe(opened("alpha", None, TurnType::Side));
    h.observe(opened("alpha", Some(2), TurnType::Main));
    h.observe(TurnEvent::PrmVotes {
        session: "alpha",
        turn: 1,
        votes: &[Some(1), Some(1), Some(-1)],
        score: 1.0,
    });
    let seq = log.submit(&rl_sample()).await.unwrap();
    h.observe(TurnEvent::Submitted {
        session: "alpha",
        turn: 1,
        seq,
        reward: 1.0,
        excluded: None,
    });
    h.observe(TurnEvent::Captured {
        session: "alpha",
        turn: 2,
        response_tokens: 4,
    });
    // beta (OPD): turn 1 hinted and scored; turn 2's teacher scored other ids.
    h.observe(opened("beta", Some(1), TurnType::Main));
    h.observe(opened("beta", Some(2), TurnType::Main));
    h.observe(TurnEvent::HintVotes {
        session: "beta",
        turn: 1,
        votes: &[Some(1), None],
        hint: Some(HOSTILE),
    });
    h.observe(TurnEvent::Teacher {
        session: "beta",
        turn: 1,
        outcome: TeacherOutcome::Scored,
    });
    let seq = log.submit(&opd_sample()).await.unwrap();
    h.observe(TurnEvent::Submitted {
        session: "beta",
        turn: 1,
        seq,
        reward: 1.0,
        excluded: None,
    });
    h.observe(TurnEvent::Teacher {
        session: "beta",
        turn: 2,
        outcome: TeacherOutcome::Mismatch {
            detail: "first differing position 0",
        },
    });
    h.observe(TurnEvent::Dropped {
        session: "beta",
        turn: 2,
        reason: "teacher_token_mismatch",
        detail: Some("first differing position 0"),
    });
    h.observe(TurnEvent::SessionClosed {
        session: "beta",
        reason: "done",
    });
    log.submit(&long_sample(LONG)).await.unwrap();
    // A session whose id is itself hostile.
    h.observe(opened("<b>bold</b>", Some(1), TurnType::Main));
    Inspect {
        history,
        log: Some(log),
        live: Some(Arc::new(FixedLive)),
        tokens: Some(Arc::new(Vocab)),
    }
}
