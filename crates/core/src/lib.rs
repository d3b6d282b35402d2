//! Core types of policy-serving.
//!
//! This crate owns the vocabulary every other crate speaks: chat messages and their normalisation
//! ([`message`]), session and turn identities ([`session`]), the tokens an upstream reported for a
//! response ([`rollout`]), the alignment of those tokens to the re-rendered response ([`align`]),
//! the captured main turn ([`capture`]) and the compact JSON its request parts wait in
//! ([`json_text`]), the trainer's [`sample::Sample`] and the traits of where
//! samples go ([`sink`], [`log`]), the [`secret::Secret`] an API key travels in, the engine serving the policy ([`engine`]), the sampling parameters a turn was sampled with ([`sampling`]), a mixture-of-experts policy's routed experts ([`experts`]), the wire
//! enums several crates read ([`modes`]), and the events
//! observers of sessions and turns are told ([`observe`]).
//!
//! It must not depend on a web framework, an async runtime or any other crate of this workspace:
//! the dependency arrows of the workspace all point here.

pub mod align;
pub mod capture;
pub mod codec;
pub mod engine;
pub mod errors;
pub mod experts;
pub mod json_text;
pub mod log;
pub mod message;
pub mod metric_names;
pub mod modes;
pub mod observe;
pub mod pending;
pub mod ports;
pub mod rollout;
pub mod rollout_control;
pub mod sample;
pub mod sampling;
pub mod secret;
pub mod session;
pub mod sink;

pub use align::{AlignPolicy, Alignment, PositionSource, align_logprobs};
pub use capture::{CapturedTurn, EnginePrompts, TokenSource, TurnGuard, TurnSink, WeightVersion};
pub use engine::{Engine, EngineCell, EngineSetting};
pub use errors::error_chain;
pub use experts::{EngineExperts, ExpertBudget, ExpertRows, ExpertWidth, MoeShape, SampleExperts};
pub use json_text::JsonText;
pub use log::{EncodedSample, LogError, SampleLog, StoreStats, StoredSample};
pub use modes::{PauseMode, RoutedExpertsMode, SamplingMode, SessionInference, TokenIdsMode};
pub use observe::{NoObserver, Observers, TeacherOutcome, TurnEvent, TurnObserver};
pub use pending::{PendingStore, PendingTurn};
pub use rollout::{EngineIds, FinishReason, RolloutResponse, SampledToken};
pub use rollout_control::{BufferStatus, PendingCounts, RolloutControl};
pub use sampling::{Sampling, SamplingKind};
pub use secret::Secret;
pub use session::{DefaultTurnType, Door, SessionHeaders, SessionOrigin, SessionSource, TurnType};
pub use sink::{SampleSink, SinkError};
