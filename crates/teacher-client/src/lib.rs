//! Teacher log-probs for on-policy distillation. This crate owns getting the teacher's log-probs of
//! **given** tokens — for an input whose last `T` tokens are the original response, the log-prob of
//! each of those tokens and, when `K > 0`, the top-K log-probs and token ids per position — and
//! checking that the tokens the teacher scored are our tokens ([`check_alignment`]). It speaks two
//! protocols: SGLang's `/generate` ([`SglangTeacher`]) and an OpenAI-compatible `/v1/completions` with
//! vLLM's `prompt_logprobs` ([`CompletionsTeacher`]). A chat endpoint cannot be a teacher
//! ([`chat_endpoint_error`]).
//!
//! It depends on no server crate (no axum, no configuration crate): the server resolves the settings
//! and the key and hands them over. Values are never padded or filled in: a missing value, a short
//! top-K row or a token mismatch is an error, and the caller drops the sample.

mod align;
mod completions;
mod error;
mod http;
mod sglang;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

pub use align::{Mismatch, TEACHER_TOKEN_MISMATCH, check_alignment};
pub use completions::{CompletionsTeacher, CompletionsTeacherConfig, completions_url};
pub use error::{
    API_KEY_ENV_KEY, BACKEND_KEY, MODEL_KEY, TIMEOUT_KEY, TeacherError, URL_KEY,
    chat_endpoint_error,
};
pub use sglang::{SglangTeacher, SglangTeacherConfig, generate_url, logprob_start_len};

/// The teacher's view of the last `T` tokens of an input (`T` = the `response_len` asked for).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TeacherLogprobs {
    /// `[T]`: the teacher's log-prob of each response token. Every entry is a value the teacher sent
    /// (vLLM's `-9999.0` clamp of `-inf` is passed through as is).
    pub log_probs: Vec<f64>,
    /// `[T][K]` when K > 0, best first.
    pub topk_log_probs: Option<Vec<Vec<f64>>>,
    /// `[T][K]` when K > 0, the token ids of [`Self::topk_log_probs`].
    pub topk_indices: Option<Vec<Vec<u32>>>,
    /// `[T]`: the token ids the teacher says it scored at those positions. Use only when they equal the
    /// response ids ([`Self::check_alignment`]).
    pub echoed_ids: Vec<u32>,
    /// Whether [`Self::echoed_ids`] came from the teacher. `false` when a completions server does not
    /// echo `prompt_token_ids` (older vLLM builds): the ids are then the ones we sent.
    pub echo_verified: bool,
}

impl TeacherLogprobs {
    /// The result for `T = 0` (no call is made).
    pub(crate) fn empty(top_k: usize) -> Self {
        Self {
            log_probs: Vec::new(),
            topk_log_probs: (top_k > 0).then(Vec::new),
            topk_indices: (top_k > 0).then(Vec::new),
            echoed_ids: Vec::new(),
            echo_verified: true,
        }
    }

    /// [`check_alignment`] of `response_ids` against [`Self::echoed_ids`].
    pub fn check_alignment(&self, response_ids: &[u32]) -> Result<(), Mismatch> {
        check_alignment(response_ids, &self.echoed_ids)
    }
}

/// Scores the last `response_len` tokens of a token sequence with the teacher.
#[cfg_attr(any(test, feature = "test-support"), mockall::automock)]
#[async_trait]
pub trait TeacherScorer: Send + Sync {
    /// The teacher's log-probs of the last `response_len` (`T`) tokens of `input_ids` (`L` tokens: the
    /// hinted prompt, then the original response), and with `top_k` (`K`) > 0 its top-K per position.
    /// `T = 0` gives an empty result without a call; `T >= L` is [`TeacherError::NoContext`] (the first
    /// input token has no log-prob). One call, bounded by the configured timeout.
    async fn score(
        &self,
        input_ids: &[u32],
        response_len: usize,
        top_k: usize,
    ) -> Result<TeacherLogprobs, TeacherError>;

    /// A short description for logs, such as `sglang /generate at http://…` (never the key).
    fn describe(&self) -> String;

    /// Whether [`Self::score_with_images`] can score an input whose prompt holds images. By
    /// default not: such a turn gets no teacher values (`teacher_without_images`).
    fn takes_images(&self) -> bool {
        false
    }

    /// [`Self::score`] of an input whose prompt holds images: `input_ids` hold each image's run of
    /// pad tokens, `image_data` the images in prompt order, as data URLs. By default an error
    /// ([`TeacherError::ImagesUnsupported`]).
    async fn score_with_images(
        &self,
        input_ids: &[u32],
        response_len: usize,
        top_k: usize,
        image_data: &[String],
    ) -> Result<TeacherLogprobs, TeacherError> {
        let _ = (input_ids, response_len, top_k, image_data);
        Err(TeacherError::ImagesUnsupported {
            teacher: self.describe(),
        })
    }
}

#[async_trait]
impl<S: TeacherScorer + ?Sized> TeacherScorer for std::sync::Arc<S> {
    async fn score(
        &self,
        input_ids: &[u32],
        response_len: usize,
        top_k: usize,
    ) -> Result<TeacherLogprobs, TeacherError> {
        (**self).score(input_ids, response_len, top_k).await
    }

    fn describe(&self) -> String {
        (**self).describe()
    }

    fn takes_images(&self) -> bool {
        (**self).takes_images()
    }

    async fn score_with_images(
        &self,
        input_ids: &[u32],
        response_len: usize,
        top_k: usize,
        image_data: &[String],
    ) -> Result<TeacherLogprobs, TeacherError> {
        (**self)
            .score_with_images(input_ids, response_len, top_k, image_data)
            .await
    }
}
