//! What happens to sessions and turns, told to an observer as it happens: the server tells when a
//! request opens a turn, the session buffer tells the votes, the hint, the teacher's outcome, the
//! sample's seq or why there is none. The inspection page's history (`ps-inspect`) is the
//! observer; the composition crate plugs it in.
//!
//! An observer is called on the chat path and on scoring tasks: [`TurnObserver::observe`] must
//! return at once (no I/O, no await, no lock held for longer than a copy). Events borrow their
//! text, so telling a [`NoObserver`] costs nothing.

use crate::session::{SessionSource, TurnType};

/// How a turn's teacher call ended (OPD and Combine).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TeacherOutcome<'a> {
    /// The teacher scored every response token; the sample carries its log-probs.
    Scored,
    /// The teacher echoed other token ids than the response's: the turn is dropped.
    Mismatch { detail: &'a str },
    /// The call failed or timed out.
    Failed { detail: &'a str },
}

/// One thing that happened to a session or one of its turns. `turn` is the number
/// [`crate::TurnSink::begin`] gave the main turn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TurnEvent<'a> {
    /// A chat request of `session` arrived. Main turns carry their number; side turns, and main
    /// requests served while submission is paused, carry none.
    Opened {
        session: &'a str,
        turn: Option<u64>,
        turn_type: TurnType,
        source: SessionSource,
        streamed: bool,
        /// The API the request came through.
        door: crate::session::Door,
    },
    /// The main turn's answer was captured (`response_tokens` ids): it waits for its next state.
    Captured {
        session: &'a str,
        turn: u64,
        response_tokens: usize,
    },
    /// The main turn will never become a sample (`reason`: a short snake_case word): it was not
    /// captured, or (`tokenizer_changed`) it was persisted at a shutdown by a run with another
    /// policy tokenizer.
    Abandoned {
        session: &'a str,
        turn: u64,
        reason: &'a str,
    },
    /// The PRM votes (`None`: a failed vote) and their majority.
    PrmVotes {
        session: &'a str,
        turn: u64,
        votes: &'a [Option<i8>],
        score: f64,
    },
    /// The hint judge's votes and the hint chosen, if any (OPD, Combine).
    HintVotes {
        session: &'a str,
        turn: u64,
        votes: &'a [Option<i8>],
        hint: Option<&'a str>,
    },
    /// The teacher's outcome (OPD, Combine).
    Teacher {
        session: &'a str,
        turn: u64,
        outcome: TeacherOutcome<'a>,
    },
    /// The turn gave no sample (`reason` as in `turns_dropped_total` or `samples_dropped_total`).
    Dropped {
        session: &'a str,
        turn: u64,
        reason: &'a str,
        detail: Option<&'a str>,
    },
    /// The turn's sample was stored under `seq`. `excluded` names why an excluded sample (all-zero
    /// loss mask) is not trained on.
    Submitted {
        session: &'a str,
        turn: u64,
        seq: u64,
        reward: f64,
        excluded: Option<&'a str>,
    },
    /// The session was closed (`done`, `timeout`, `evicted`, `shutdown`).
    SessionClosed { session: &'a str, reason: &'a str },
}

impl TurnEvent<'_> {
    /// The session the event is about.
    pub fn session(&self) -> &str {
        match self {
            Self::Opened { session, .. }
            | Self::Captured { session, .. }
            | Self::Abandoned { session, .. }
            | Self::PrmVotes { session, .. }
            | Self::HintVotes { session, .. }
            | Self::Teacher { session, .. }
            | Self::Dropped { session, .. }
            | Self::Submitted { session, .. }
            | Self::SessionClosed { session, .. } => session,
        }
    }
}

/// Told every [`TurnEvent`]; must return at once (see the module's documentation).
pub trait TurnObserver: Send + Sync {
    fn observe(&self, event: TurnEvent<'_>);
}

/// The observer of a server without an inspection page.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;

impl TurnObserver for NoObserver {
    fn observe(&self, _event: TurnEvent<'_>) {}
}

/// Several observers told the same events, in order (the inspection page's history and the
/// session matcher both follow the session buffer).
#[derive(Clone, Default)]
pub struct Observers(pub Vec<std::sync::Arc<dyn TurnObserver>>);

impl TurnObserver for Observers {
    fn observe(&self, event: TurnEvent<'_>) {
        for o in &self.0 {
            o.observe(event);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_names_its_session() {
        let events = [
            TurnEvent::Opened {
                session: "s",
                turn: None,
                turn_type: TurnType::Side,
                source: SessionSource::Header,
                streamed: false,
                door: crate::session::Door::ChatCompletions,
            },
            TurnEvent::Teacher {
                session: "s",
                turn: 1,
                outcome: TeacherOutcome::Scored,
            },
            TurnEvent::SessionClosed {
                session: "s",
                reason: "done",
            },
        ];
        for e in events {
            assert_eq!(e.session(), "s");
            NoObserver.observe(e);
        }
    }

    #[derive(Default)]
    struct Count(std::sync::atomic::AtomicUsize);

    impl TurnObserver for Count {
        fn observe(&self, _event: TurnEvent<'_>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    #[test]
    fn observers_tell_each_of_them() {
        let (a, b) = (
            std::sync::Arc::new(Count::default()),
            std::sync::Arc::new(Count::default()),
        );
        let all = Observers(vec![a.clone(), b.clone()]);
        all.observe(TurnEvent::SessionClosed {
            session: "s",
            reason: "timeout",
        });
        assert_eq!(a.0.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert_eq!(b.0.load(std::sync::atomic::Ordering::Relaxed), 1);
    }
}
