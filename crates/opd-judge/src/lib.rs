//! The hindsight-hint judge of on-policy distillation (OPD). For one main turn, `m` judge votes say
//! whether the next state reveals something that would have improved the assistant's response
//! (`\boxed{1}` with a hint between `[HINT_START]` and `[HINT_END]`) or not (`\boxed{-1}`); the best
//! hint is appended to the turn's last user message, and that enhanced prompt plus the original
//! response is what the teacher scores.
//!
//! This crate owns that contract (`docs/upstream-protocols.md` section 6): the hint prompt
//! ([`hint_messages`], in our own words), vote parsing ([`parse_hint_vote`]), best-hint selection
//! ([`select_best_hint`]), hint injection ([`append_hint`], [`teacher_input_text`], and
//! [`teacher_input_ids`], which encodes only what the hint changes in the turn's encoded prompt) and the voting
//! port's implementation ([`HintScorer`], a `ps_core::ports::HintJudge` over any
//! `ps_core::ports::JudgeBackend`). It reuses the judge crate's vote machinery
//! ([`ps_judge::VoteScorer`]) and boxed-score parsing, and depends otherwise only on `ps-core` and
//! `ps-chat-template`. It must not depend on the
//! server, the session buffer, the teacher client or any web framework.

mod inject;
mod parse;
mod prompt;
mod scorer;

pub use inject::{
    HINT_MARKER, TeacherResponse, append_hint, append_hint_keeping_lists, teacher_input_ids,
    teacher_input_text,
};
pub use parse::{parse_hint_vote, select_best_hint};
pub use prompt::hint_messages;
pub use scorer::{HintScorer, HintVotes};

/// Default of `opd.min_hint_chars`: a hint is a candidate only when its trimmed length (in
/// characters) is strictly greater than this.
pub const DEFAULT_MIN_HINT_CHARS: usize = 10;
