//! Client of the policy model's SGLang (or any OpenAI-compatible) chat endpoint.
//!
//! This crate owns the wire side of one chat completion: sending the forwarded body, streamed
//! (server-sent events, parsed by `eventsource-stream`) or not, classifying failures (refused,
//! timed out, upstream status, broken body), and assembling an answer's message and per-token
//! log-probs from a response or from stream chunks ([`assemble`]), with a mixture-of-experts
//! engine's routed experts ([`experts`]). It knows nothing about sessions,
//! templates or HTTP serving; it depends only on `ps-core`.

pub mod assemble;
mod client;
mod error;
pub mod experts;
mod model_info;

pub use assemble::{
    Answer, Choice, StreamAssembler, choices_of, engine_ids, rollout_from_response,
    synthesize_chunks,
};
pub use client::{ChatEventStream, PolicyClient, SglangClient, SglangClientConfig, StreamEvent};
pub use error::SglangError;
pub use model_info::ModelInfo;
