//! Per-session turn buffering: from captured main turns to training samples (RL, OPD, Combine).
//!
//! Each main turn is numbered when its request arrives ([`ps_core::TurnSink::begin`]); the next main
//! request of the same session brings its *next state* (that request's last message). Once a turn is
//! captured and its next state is known (or known to be missing: the client said the session is
//! done, the session timed out, was evicted, or the server shuts down), it is scored by the PRM and
//! turned into a sample by the [`rules`]; samples of one session are handed to the
//! [`ps_core::SampleSink`] strictly in turn order.
//!
//! In modes OPD and Combine the judged turn goes through the hint judge and the teacher instead
//! ([`opd`]).
//!
//! This crate owns that state machine and nothing else: scoring goes through
//! the ports of `ps_core::ports` ([`ps_core::ports::TurnScorer`], hints through
//! [`ps_core::ports::HintJudge`], teacher log-probs through [`ps_core::ports::TeacherScorer`],
//! records through [`ps_core::ports::RecordSink`]), storage through [`ps_core::SampleSink`]; of
//! the OPD crate it uses only the hint's injection into the teacher prompt. It must not depend on
//! the server or the teacher, provider or store clients, and names no judge: the OPD crate brings
//! the judge crate's vote machinery (and with it the judge's HTTP client) along, unused here.
//!
//! Modules, each depending only on those listed before it (no cycles; checked with
//! `grep -o 'crate::[a-z_]*'` per file): `config` (settings), `records` (a judged turn's records, through the
//! port), `input` (what a judge sees), [`rules`] (the RL sample rules), `status` (counters),
//! `state` (the per-session state machine), [`opd`] (judging an OPD/Combine turn and what it
//! becomes), `judge` (judging: PRM votes, backlog, dropped turns), `submit` (ordered submission),
//! `persist` (shutdown and resume), `buffer` ([`SessionBuffer`], which holds the sessions and
//! drives the others).

mod buffer;
mod config;
mod input;
mod judge;
pub mod opd;
mod persist;
mod records;
pub mod rules;
mod session_prompt;
mod state;
mod status;
mod submit;

pub use buffer::SessionBuffer;
pub use config::{BufferConfig, BufferMode, OpdOptions};
pub use opd::OpdParts;
pub use status::{BufferStatus, MAX_TRACKED_VERSIONS, PendingCounts};
