//! The training sample handed to the trainer, with the field names of Slime's `Sample`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Status of a sample, as Slime names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SampleStatus {
    #[default]
    Pending,
    Completed,
    Truncated,
    Aborted,
    Failed,
}

/// `{"score": x}`, read by the trainer with `--reward-key score`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct Reward {
    pub score: f64,
}

/// One training sample (a group of size one). Field names follow Slime's `Sample`; `session_id`,
/// `turn` and `metadata` carry our bookkeeping.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Sample {
    pub index: u64,
    pub group_index: u64,
    /// The rendered prompt text.
    pub prompt: String,
    /// The rendered response text.
    pub response: String,
    /// Prompt ids followed by response ids.
    pub tokens: Vec<u32>,
    pub response_length: usize,
    /// One entry per response token.
    pub loss_mask: Vec<u8>,
    /// One entry per response token; `0.0` where the metadata marks no log-prob.
    pub rollout_log_probs: Vec<f64>,
    pub reward: Reward,
    pub status: SampleStatus,
    pub session_id: String,
    pub turn: u64,
    /// The policy version(s) that produced the response (Slime's `Sample.weight_versions`); empty
    /// when neither the answer nor the trainer's last resume named one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weight_versions: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teacher_log_probs: Option<Vec<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teacher_topk_log_probs: Option<Vec<Vec<f64>>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teacher_topk_indices: Option<Vec<Vec<u32>>>,
    #[serde(default)]
    pub metadata: Map<String, Value>,
    /// The prompt's images in prompt order (Slime's `multimodal_inputs`, by reference): each
    /// stands for a run of `tokens` image pad tokens in `tokens`. Their bytes are kept once per
    /// hash by the store and delivered beside the sample (docs/rollout-api.md, "Images").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<SampleImage>,
    /// A mixture-of-experts policy's routed experts (Slime's `rollout_routed_experts` and
    /// `routed_experts_start_len`), by reference: blocks of rows whose bytes the store keeps once
    /// per hash, as images (docs/rollout-api.md, "Routed experts").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_routed_experts: Option<crate::SampleExperts>,
}

/// Content a sample references by hash (an image, a block of routed experts): the store keeps
/// each hash once and delivers its bytes beside the sample.
#[derive(Debug, Clone, Copy)]
pub struct BlobRef<'a> {
    pub hash: &'a str,
    /// The bytes while the sample travels to its store.
    pub bytes: Option<&'a std::sync::Arc<[u8]>>,
}

impl Sample {
    /// The sample's images, each hash once, in prompt order.
    pub fn distinct_images(&self) -> Vec<&SampleImage> {
        let mut seen = std::collections::HashSet::new();
        self.images
            .iter()
            .filter(|i| seen.insert(i.hash.as_str()))
            .collect()
    }

    /// Everything the sample references by hash, each hash once: its images in prompt order,
    /// then its blocks of routed experts. What a store keeps for it.
    pub fn blobs(&self) -> Vec<BlobRef<'_>> {
        let mut seen = std::collections::HashSet::new();
        let images = self.images.iter().map(|i| BlobRef {
            hash: &i.hash,
            bytes: i.bytes.as_ref(),
        });
        let blocks = self
            .rollout_routed_experts
            .iter()
            .flat_map(|e| &e.blocks)
            .map(|b| BlobRef {
                hash: &b.hash,
                bytes: b.bytes.as_ref(),
            });
        images
            .chain(blocks)
            .filter(|b| seen.insert(b.hash))
            .collect()
    }
}

/// An image of a sample's prompt: its content hash (SHA-256, hex), media type, size in pixels as
/// its header states it, and the number of image pad tokens it became.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SampleImage {
    pub hash: String,
    pub mime: String,
    pub width: u64,
    pub height: u64,
    pub tokens: usize,
    /// The bytes while the sample travels to its store, which keeps them once per hash; never
    /// serialized with the sample.
    #[serde(skip)]
    pub bytes: Option<std::sync::Arc<[u8]>>,
}
