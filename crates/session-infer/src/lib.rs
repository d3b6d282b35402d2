//! Recognising the session of a chat request that carries no session key, from the conversation
//! itself (`server.session_inference`).
//!
//! An agent sends its whole history with every turn. [`fingerprint`] keys every prefix of a message
//! list in one pass, in a form that survives what clients change when they send history again;
//! [`matcher`] keeps the ends of the live conversations we answered ("their messages + our reply")
//! and decides, per request, whether it continues one, forks one, or starts a new session;
//! [`shape`] marks helper requests (titles, summaries) as side turns by their shape; [`ephemeral`]
//! names messages a client sends once and finds the next state without them. No HTTP, no
//! async: the server calls [`SessionMatcher::resolve`] once per main request without a session id
//! and [`PendingReply::complete`] when the answer is complete.

pub mod ephemeral;
pub mod fingerprint;
pub mod matcher;
pub mod shape;

pub use ephemeral::{EphemeralRule, next_state};
pub use fingerprint::{History, Key};
pub use matcher::{
    INFERRED_PREFIX, Limits, Outcome, PendingReply, Resolved, SessionMatcher, Stats,
};
pub use ps_core::modes::SessionInference;
pub use shape::{ShapeRule, side_rule};
