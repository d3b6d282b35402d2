//! Teacher log-probs for on-policy distillation: for a token sequence whose last `T` tokens are the
//! original response, the teacher's log-prob of each of those tokens and, when `K > 0`, its top-K
//! log-probs and token ids. This crate owns that contract; the SGLang `/generate` and
//! OpenAI-compatible `/v1/completions` implementations come with the OPD mode.

use serde::{Deserialize, Serialize};

/// The teacher's view of the last `T` tokens of an input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TeacherLogprobs {
    /// `[T]`: log-prob of each response token.
    pub log_probs: Vec<f64>,
    /// `[T, K]` when K > 0.
    pub topk_log_probs: Option<Vec<Vec<f64>>>,
    /// `[T, K]` when K > 0.
    pub topk_indices: Option<Vec<Vec<u32>>>,
    /// The token ids the teacher echoed for the last `T` positions, to check alignment.
    pub echoed_ids: Vec<u32>,
}

/// Why the teacher could not score a sequence.
#[derive(Debug, thiserror::Error)]
pub enum TeacherError {
    #[error("teacher call to {url} failed: {detail}")]
    Call { url: String, detail: String },
}

/// Scores the last `response_len` tokens of `input_ids` with the teacher.
#[async_trait::async_trait]
pub trait TeacherScorer: Send + Sync {
    async fn logprobs(
        &self,
        input_ids: &[u32],
        response_len: usize,
        top_k: usize,
    ) -> Result<TeacherLogprobs, TeacherError>;
}
