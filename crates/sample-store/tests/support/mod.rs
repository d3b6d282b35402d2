//! Helpers shared by the integration tests.
#![allow(dead_code)]
// Test helpers: a failed setup should panic, as in the tests themselves.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::Path;

use ps_core::sample::{Reward, Sample, SampleStatus};
use ps_sample_store::{SampleStore, StoreConfig};
use serde_json::json;

/// A small sample recognisable by `tag` (its session id).
pub fn sample(tag: &str) -> Sample {
    let mut metadata = serde_json::Map::new();
    metadata.insert("tag".into(), json!(tag));
    Sample {
        prompt: format!("prompt {tag}"),
        response: format!("response {tag}"),
        tokens: vec![1, 2, 3, 4],
        response_length: 2,
        loss_mask: vec![1, 1],
        rollout_log_probs: vec![-0.5, -1.25],
        reward: Reward { score: 1.0 },
        status: SampleStatus::Completed,
        session_id: tag.to_owned(),
        turn: 1,
        metadata,
        ..Sample::default()
    }
}

/// `sample` as the store returns it under `seq`.
pub fn stored(mut sample: Sample, seq: u64) -> Sample {
    sample.index = seq;
    sample.group_index = seq;
    sample
}

pub fn config(dir: &Path, retain_committed: u64, max_batch: usize) -> StoreConfig {
    StoreConfig {
        retain_committed,
        max_batch,
        ..StoreConfig::new(dir)
    }
}

pub fn open(dir: &Path) -> SampleStore {
    SampleStore::open(config(dir, 0, 64)).expect("open store")
}

/// Appends `sample(tag)` for each tag, one after the other; returns the seqs.
pub async fn append_tags(store: &SampleStore, tags: impl IntoIterator<Item = String>) -> Vec<u64> {
    let mut seqs = Vec::new();
    for tag in tags {
        seqs.push(store.append(&sample(&tag)).await.expect("append"));
    }
    seqs
}
