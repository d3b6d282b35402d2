//! The per-session state machine: each begun turn waits for its capture and its next state, is
//! judged, then waits for the earlier turns of its session to be submitted first.
//!
//! Pure data and transitions, no tasks and no locks: [`crate::SessionBuffer`] holds the sessions
//! under one lock, calls these transitions, and runs the [`Job`]s they release.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ps_core::metric_names as m;
use ps_core::ports::PrmScore;
use ps_core::sample::Sample;
use ps_core::{CapturedTurn, PendingTurn};
use serde_json::Value;
use tokio::time::Instant;

use crate::session_prompt::SessionPrompt;

/// What a captured turn knows of its next state.
pub(crate) enum Next {
    Pending,
    State(Value),
    Missing,
}

/// A begun turn that is not being judged yet.
pub(crate) struct Slot {
    pub captured: Option<CapturedTurn>,
    pub next: Next,
}

/// A judged turn, waiting for its turn to be submitted.
pub(crate) enum Ready {
    /// The turn was abandoned or dropped: nothing to submit, but later turns may go.
    Skip,
    /// An OPD/Combine sample, final (its rules need no order).
    Sample(Box<Sample>),
    Judged {
        turn: Arc<CapturedTurn>,
        has_next_state: bool,
        judged: Option<PrmScore>,
    },
}

/// A turn ready to be judged.
pub(crate) struct Job {
    pub session_id: String,
    pub turn_no: u64,
    /// Shared with the [`Unfinished`] the buffer keeps of it while it is judged and waits.
    pub turn: Arc<CapturedTurn>,
    pub next: Option<Value>,
    /// The session's latest prompt as the teacher path encoded it (shared with the session).
    pub prompt: SessionPrompt,
}

impl Job {
    /// What to persist of this turn if the server stops before it is a sample: the same turn,
    /// not a copy of it.
    pub fn pending(&self) -> Unfinished {
        Unfinished {
            turn: Arc::clone(&self.turn),
            next: self.next.clone(),
        }
    }
}

/// A turn being judged or waiting for its earlier turns, kept to persist it if the server stops
/// first. Shares the turn with its [`Job`] and [`Ready::Judged`]: a copy would double what the
/// buffer holds of every turn in judging (docs/benchmarks-history.md, "Memory, round two").
pub(crate) struct Unfinished {
    pub turn: Arc<CapturedTurn>,
    pub next: Option<Value>,
}

impl Unfinished {
    /// The turn as persisted (the flags are filled in by `take_unfinished`); a copy only if its
    /// judging still holds it.
    pub fn into_pending(self) -> PendingTurn {
        PendingTurn {
            turn: Arc::unwrap_or_clone(self.turn),
            next: self.next,
            session_had_effective: false,
            conversation_start: false,
            tokenizer: None,
        }
    }
}

pub(crate) struct Session {
    pub next_turn: u64,
    pub next_submit: u64,
    pub last_activity: Instant,
    pub closing: bool,
    pub slots: BTreeMap<u64, Slot>,
    pub scoring: u64,
    pub ready: BTreeMap<u64, Ready>,
    /// What each judged-but-unsubmitted turn was made from, to persist it if the server stops first.
    pub origins: BTreeMap<u64, Unfinished>,
    pub submitting: bool,
    /// The client ended the session (`X-Session-Done`): the id used again is a new conversation.
    /// (A session closed by the idle sweep or eviction and continued is the same conversation.)
    pub done: bool,
    /// The current conversation already has an effective sample (the at-least-one rule).
    pub has_effective: bool,
    /// First turns of later conversations under the same id: when submission reaches one,
    /// `has_effective` starts afresh.
    pub conversation_starts: BTreeSet<u64>,
    /// The latest prompt the teacher path encoded for this session (OPD/Combine, engine-id turns):
    /// the next teacher call encodes only what the conversation added since. Emptied (and
    /// replaced by a fresh one) when the session closes.
    pub prompt: SessionPrompt,
}

impl Session {
    pub fn new(now: Instant) -> Self {
        Self {
            next_turn: 1,
            next_submit: 1,
            last_activity: now,
            closing: false,
            slots: BTreeMap::new(),
            scoring: 0,
            ready: BTreeMap::new(),
            origins: BTreeMap::new(),
            submitting: false,
            done: false,
            has_effective: false,
            conversation_starts: BTreeSet::new(),
            prompt: SessionPrompt::default(),
        }
    }

    pub fn is_drained(&self) -> bool {
        self.slots.is_empty() && self.scoring == 0 && self.ready.is_empty() && !self.submitting
    }

    /// Closes the session: every turn still waiting for a next state will get none. The caller
    /// then collects the turns this made ready.
    pub fn close(&mut self) {
        self.closing = true;
        // The kept prompt goes now, not when the last job of the session does; jobs still holding
        // it cannot refill it, and a continued session starts a fresh one.
        std::mem::take(&mut self.prompt).close();
        for slot in self.slots.values_mut() {
            if matches!(slot.next, Next::Pending) {
                slot.next = Next::Missing;
            }
        }
    }

    /// Gives the latest turn its next state, if it still waits for one (`None`: the request that
    /// followed it added nothing but messages sent once, so it has none).
    fn set_next_state(&mut self, turn: u64, next_state: Option<&Value>) {
        if let Some(prev) = self.slots.get_mut(&turn)
            && matches!(prev.next, Next::Pending)
        {
            prev.next = match next_state {
                Some(state) => Next::State(state.clone()),
                None => Next::Missing,
            };
        }
    }

    /// A main request arrived: numbers its turn, and `next_state` (what it adds) is the previous
    /// turn's next state. Returns the turn's number.
    pub fn begin(&mut self, next_state: Option<&Value>, done: bool, now: Instant) -> u64 {
        let n = self.next_turn;
        self.closing = false;
        if std::mem::replace(&mut self.done, false) {
            // The id is reused after the session closed (`X-Session-Done`, the shared
            // `unknown` session, a timeout while its last turns were still being judged): a
            // new conversation, whose at-least-one state starts afresh at this turn, as the
            // reference clears it at done. Earlier turns keep the old conversation's state.
            self.conversation_starts.insert(n);
        }
        self.last_activity = now;
        self.next_turn += 1;
        self.set_next_state(n - 1, next_state);
        self.slots.insert(
            n,
            Slot {
                captured: None,
                next: if done { Next::Missing } else { Next::Pending },
            },
        );
        if done {
            metrics::counter!(m::SESSIONS_CLOSED_TOTAL, "reason" => "done").increment(1);
            self.close();
            self.done = true;
        }
        n
    }

    /// A main request that is not a turn itself (served while paused): what it adds is still the
    /// latest turn's next state.
    pub fn advance(&mut self, next_state: Option<&Value>, done: bool, now: Instant) {
        self.last_activity = now;
        self.set_next_state(self.next_turn - 1, next_state);
        if done && !self.closing {
            metrics::counter!(m::SESSIONS_CLOSED_TOTAL, "reason" => "done").increment(1);
            self.close();
        }
        self.done |= done;
    }

    /// The client ended the session.
    pub fn end(&mut self) {
        metrics::counter!(m::SESSIONS_CLOSED_TOTAL, "reason" => "done").increment(1);
        self.close();
        self.done = true;
    }

    /// A begun turn was captured.
    pub fn accept(&mut self, turn: CapturedTurn) {
        match self.slots.get_mut(&turn.turn) {
            Some(slot) => slot.captured = Some(turn),
            None => {
                // Not begun here (a sink that does not number turns, or a session removed
                // meanwhile): it has no next state to wait for.
                self.slots.insert(
                    turn.turn,
                    Slot {
                        captured: Some(turn),
                        next: Next::Missing,
                    },
                );
            }
        }
    }

    /// A begun turn will not become a sample. Returns whether the caller must start submission.
    pub fn abandon(&mut self, turn: u64) -> bool {
        self.slots.remove(&turn);
        self.ready.insert(turn, Ready::Skip);
        !std::mem::replace(&mut self.submitting, true)
    }

    /// A judged turn (`origin` is what it was made from). Returns whether the caller must start
    /// submission.
    pub fn judged(&mut self, turn_no: u64, ready: Ready, origin: Unfinished) -> bool {
        if !matches!(ready, Ready::Skip) {
            self.origins.insert(turn_no, origin);
        }
        self.ready.insert(turn_no, ready);
        !std::mem::replace(&mut self.submitting, true)
    }

    /// Takes ready turns out of the session: captured and with a resolved next state (or, when
    /// `needs_next` is false, any captured turn).
    pub fn collect_ready(&mut self, id: &str, needs_next: bool, jobs: &mut Vec<Job>) {
        let ready: Vec<u64> = self
            .slots
            .iter()
            .filter(|(_, slot)| {
                slot.captured.is_some() && (!needs_next || !matches!(slot.next, Next::Pending))
            })
            .map(|(n, _)| *n)
            .collect();
        for n in ready {
            if let Some(Slot {
                captured: Some(turn),
                next,
            }) = self.slots.remove(&n)
            {
                self.scoring += 1;
                jobs.push(Job {
                    session_id: id.to_owned(),
                    turn_no: n,
                    turn: Arc::new(turn),
                    next: match next {
                        Next::State(v) => Some(v),
                        Next::Pending | Next::Missing => None,
                    },
                    prompt: self.prompt.clone(),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ps_chat_template::EncodedPrefix;

    use super::*;

    fn prompt(text: &str) -> Arc<EncodedPrefix> {
        Arc::new(EncodedPrefix {
            text: text.to_owned(),
            ids: vec![1, 2, 3],
            boundaries: Vec::new(),
        })
    }

    #[test]
    fn closing_a_session_drops_its_prompt_and_a_late_job_cannot_refill_it() {
        let mut session = Session::new(Instant::now());
        let held_by_job = session.prompt.clone();
        held_by_job.set(prompt("first"));
        assert!(session.prompt.get().is_some());
        session.close();
        assert!(held_by_job.get().is_none(), "not cleared on close");
        assert!(session.prompt.get().is_none());
        // A job still judging a turn of the closed session sets its prompt: ignored.
        held_by_job.set(prompt("late"));
        assert!(held_by_job.get().is_none(), "refilled after close");
        assert!(
            session.prompt.get().is_none(),
            "the session got the late prompt"
        );
        // The session, continued, keeps its new prompts again.
        session.prompt.set(prompt("continued"));
        assert_eq!(session.prompt.get().unwrap().text, "continued");
    }
}
