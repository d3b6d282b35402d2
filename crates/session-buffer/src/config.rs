//! The buffer's settings: which samples it makes ([`BufferMode`]), the OPD options and the
//! bounds (sessions, judge backlog, idle timeout). A leaf module.

use std::time::Duration;

/// Which samples the buffer makes (`server.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BufferMode {
    /// Binary RL: PRM-scored samples.
    #[default]
    Rl,
    /// On-policy distillation: hint judge + teacher log-probs.
    Opd,
    /// Both: hint and eval votes per turn, at most one sample.
    Combine,
}

impl BufferMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rl => "rl",
            Self::Opd => "opd",
            Self::Combine => "combine",
        }
    }
}

/// OPD settings (`[opd]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpdOptions {
    /// A turn without a next state yields no OPD sample (`opd.drop_without_next_state`); when false
    /// the hint judge still sees the turn, with an empty next state.
    pub drop_without_next_state: bool,
    /// K of top-K teacher log-probs (`opd.top_k`); 0 = off.
    pub top_k: usize,
    /// PRM eval votes alongside the hint votes in OPD (`opd.eval_mode`); always on in Combine.
    pub eval_votes: bool,
}

impl Default for OpdOptions {
    fn default() -> Self {
        Self {
            drop_without_next_state: true,
            top_k: 0,
            eval_votes: false,
        }
    }
}

/// Settings of the buffer.
#[derive(Debug, Clone)]
pub struct BufferConfig {
    pub mode: BufferMode,
    pub opd: OpdOptions,
    /// Score turns with the PRM (`prm.enabled`). Off: turns are submitted at once, excluded.
    pub prm_enabled: bool,
    /// A session idle this long is closed (`server.session_timeout_sec`).
    pub session_timeout: Duration,
    /// Live sessions held at most (`server.max_sessions`); beyond it the oldest idle one is closed.
    pub max_sessions: usize,
    /// Turns waiting for or in judging at once (`prm.max_backlog`). A turn that needs a judge
    /// beyond it is dropped (`turns_dropped_total{reason="judge_backlog"}`): a judge slower than the
    /// traffic must not grow the proxy's memory without bound.
    pub max_judge_backlog: usize,
}
