//! PRM judging of one main turn for binary RL: given the assistant's rendered response and the next
//! state (the next main request's last message), `m` judge votes of `\boxed{1}`, `\boxed{-1}` or
//! `\boxed{0}` and their majority, which is the turn's reward.
//!
//! This crate owns the judge-facing contract (`docs/upstream-protocols.md` section 6): the judge
//! prompt ([`judge_messages`]), score extraction ([`parse_boxed_score`]), the vote
//! ([`majority_vote`], [`PrmScorer`], a `ps_core::ports::TurnScorer`), the vote machinery every
//! judge shares ([`VoteScorer`] with a [`VotePolicy`]: the OPD hint judge is one too) and the
//! SGLang `/generate` implementation of the transport port `ps_core::ports::JudgeBackend`
//! ([`SglangJudge`], section 2.4). It must not depend on the server, the
//! session buffer or any web framework; template rendering runs on tokio's blocking pool.

mod backend;
mod error;
mod parse;
mod prompt;
mod scorer;
mod votes;

pub use backend::{SglangJudge, SglangJudgeConfig};
pub use error::{JudgeError, MODEL_DIR_KEY, ROUTER_URL_KEY, TIMEOUT_KEY};
pub use parse::{last_boxed_digit, majority_vote, parse_boxed_score};
pub use prompt::{judge_messages, turn_prompt};
pub use scorer::{PrmScorer, PrmVotes};
pub use votes::{VotePolicy, VoteScorer, Voted, answer_tail, ask_votes};
