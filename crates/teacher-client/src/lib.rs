//! Teacher log-probs for on-policy distillation. This crate owns getting the teacher's log-probs of
//! **given** tokens — for an input whose last `T` tokens are the original response, the log-prob of
//! each of those tokens and, when `K > 0`, the top-K log-probs and token ids per position — and
//! the implementations of the teacher port (`ps_core::ports::TeacherScorer`; the check that the
//! tokens the teacher scored are our tokens, `check_alignment`, sits there too). It speaks two
//! protocols: SGLang's `/generate` ([`SglangTeacher`]) and an OpenAI-compatible `/v1/completions` with
//! vLLM's `prompt_logprobs` ([`CompletionsTeacher`]). A chat endpoint cannot be a teacher
//! ([`chat_endpoint_error`]).
//!
//! It depends on no server crate (no axum, no configuration crate): the server resolves the settings
//! and the key and hands them over. Values are never padded or filled in: a missing value, a short
//! top-K row or a token mismatch is an error, and the caller drops the sample.

mod completions;
mod error;
mod http;
mod sglang;

pub use completions::{CompletionsTeacher, CompletionsTeacherConfig, completions_url};
pub use error::{
    API_KEY_ENV_KEY, BACKEND_KEY, MODEL_KEY, TIMEOUT_KEY, TeacherError, URL_KEY,
    chat_endpoint_error,
};
pub use sglang::{SglangTeacher, SglangTeacherConfig, generate_url, logprob_start_len};
