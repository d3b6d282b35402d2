//! Capture: from a finished answer and the request it answered to a captured turn handed to a
//! `TurnSink` — the engine's own ids taken as they are (checked), or the turn rendered with the
//! policy's chat template and tokenized exactly as `transformers` would and the log-probs aligned
//! to those tokens; the session's prefix cache; the sampled drift check of engine ids against
//! our render. The server hands it the request's parts and the answer ([`CaptureQueue::submit`])
//! and knows nothing else of it.
//!
//! The work runs on dedicated threads fed by a bounded queue, so that the chat path never waits
//! for it and a long conversation cannot stall other clients. A full queue drops the turn
//! (counted and logged), it never blocks a request.
//!
//! One pipeline in modules: [`job`] (what a turn carries in) → [`queue`] (the bounded queue and
//! its workers) → [`turn`] (one turn captured, with the session's [`prefix`] cache and the
//! [`drift`] check, and the turn's routed [`experts`]) → the sink; [`stats`] counts, [`error`] says why a turn was not captured.

pub mod drift;
pub mod error;
pub mod experts;
pub mod job;
pub mod prefix;
pub mod queue;
pub mod stats;
#[cfg(test)]
mod tests;
pub mod turn;

pub use drift::*;
pub use error::*;
pub use experts::ExpertStats;
pub use job::*;
pub use prefix::*;
pub use queue::*;
pub use stats::*;
pub use turn::*;
