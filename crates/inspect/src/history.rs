//! The bounded in-memory history of recent sessions and their turns.
//!
//! Every [`TurnEvent`] costs O(1): one hash lookup, a few field writes and at most one eviction,
//! under a std `Mutex` that is never held across an await or any I/O (amortised: the
//! least-recently-used queue is compacted once per `max_sessions` events). Reads for the page copy
//! what they need under the same lock and build JSON after releasing it.
//!
//! Bounds: at most `max_sessions` sessions (the least recently active is forgotten first), at most
//! `max_turns_per_session` requests per session (the oldest first), hints and failure details cut
//! at [`MAX_TEXT_CHARS`] characters, a fixed ring of [`SERIES_BUCKETS`] time buckets.
//!
//! Over ~600 lines because of its unit tests (from line ~530), one per bound and event kind.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use ps_core::{SessionSource, TeacherOutcome, TurnEvent, TurnObserver, TurnType};

use crate::api::{
    HistoryInfo, SeriesPoint, SessionList, SessionSummary, SessionTimeline, TeacherView, Totals,
    TurnStatus, TurnView,
};

/// Default of `max_sessions`.
pub const DEFAULT_MAX_SESSIONS: usize = 1000;
/// Default of `max_turns_per_session`.
pub const DEFAULT_MAX_TURNS_PER_SESSION: usize = 256;
/// Hints and failure details longer than this are cut (with `…`).
pub const MAX_TEXT_CHARS: usize = 2000;
/// Width of one bucket of the recent series.
pub const BUCKET_MS: u64 = 5_000;
/// Buckets kept: ten minutes.
pub const SERIES_BUCKETS: usize = 120;

/// How much the history holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryLimits {
    pub max_sessions: usize,
    pub max_turns_per_session: usize,
}

impl Default for HistoryLimits {
    fn default() -> Self {
        Self {
            max_sessions: DEFAULT_MAX_SESSIONS,
            max_turns_per_session: DEFAULT_MAX_TURNS_PER_SESSION,
        }
    }
}

/// The history; tell it events through [`TurnObserver::observe`].
#[derive(Debug)]
pub struct InspectHistory {
    limits: HistoryLimits,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    sessions: HashMap<Arc<str>, Session>,
    /// `(session, stamp)` per touch; an entry is current while the session's stamp equals it.
    lru: VecDeque<(Arc<str>, u64)>,
    stamp: u64,
    forgotten_sessions: u64,
    totals: Totals,
    series: Vec<Bucket>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    slot: u64,
    requests: u64,
    samples: u64,
    drops: u64,
    reward_sum: f64,
    reward_n: u64,
}

#[derive(Debug)]
struct Session {
    stamp: u64,
    source: SessionSource,
    closed_reason: Option<String>,
    first_ms: u64,
    last_ms: u64,
    requests: u64,
    main_turns: u64,
    samples: u64,
    drops: u64,
    turns: VecDeque<TurnView>,
    /// Position (arrival number) of `turns[0]`.
    first_pos: u64,
    /// Main turn number → position.
    by_turn: HashMap<u64, u64>,
    turns_forgotten: u64,
}

impl Session {
    fn new(source: SessionSource, now_ms: u64) -> Self {
        Self {
            stamp: 0,
            source,
            closed_reason: None,
            first_ms: now_ms,
            last_ms: now_ms,
            requests: 0,
            main_turns: 0,
            samples: 0,
            drops: 0,
            turns: VecDeque::new(),
            first_pos: 0,
            by_turn: HashMap::new(),
            turns_forgotten: 0,
        }
    }

    fn push(&mut self, view: TurnView, max_turns: usize) -> &mut TurnView {
        let pos = self.first_pos + self.turns.len() as u64;
        if let Some(t) = view.turn {
            self.by_turn.insert(t, pos);
        }
        self.turns.push_back(view);
        while self.turns.len() > max_turns.max(1) {
            if let Some(old) = self.turns.pop_front()
                && let Some(t) = old.turn
                && self.by_turn.get(&t) == Some(&self.first_pos)
            {
                self.by_turn.remove(&t);
            }
            self.first_pos += 1;
            self.turns_forgotten += 1;
        }
        let last = self.turns.len() - 1;
        &mut self.turns[last]
    }

    /// The main turn `turn`; one is made when the history missed its start (a turn resumed after
    /// a restart, or one forgotten).
    fn turn(&mut self, turn: u64, now_ms: u64, max_turns: usize) -> &mut TurnView {
        if let Some(&pos) = self.by_turn.get(&turn)
            && let Some(i) = pos.checked_sub(self.first_pos)
            && (i as usize) < self.turns.len()
        {
            return &mut self.turns[i as usize];
        }
        let mut v = new_turn(Some(turn), TurnType::Main, now_ms, false);
        v.status = TurnStatus::WaitingNextState;
        self.push(v, max_turns)
    }

    fn summary(&self, id: &str) -> SessionSummary {
        SessionSummary {
            id: id.to_owned(),
            source: self.source,
            state: if self.closed_reason.is_some() {
                "closed".into()
            } else {
                "live".into()
            },
            closed_reason: self.closed_reason.clone(),
            first_ms: self.first_ms,
            last_ms: self.last_ms,
            requests: self.requests,
            main_turns: self.main_turns,
            samples: self.samples,
            drops: self.drops,
        }
    }
}

fn new_turn(turn: Option<u64>, turn_type: TurnType, now_ms: u64, streamed: bool) -> TurnView {
    TurnView {
        turn,
        turn_type,
        status: TurnStatus::Answering,
        at_ms: now_ms,
        updated_ms: now_ms,
        streamed,
        door: ps_core::Door::default(),
        response_tokens: None,
        prm_votes: None,
        prm_score: None,
        hint_votes: None,
        hint: None,
        teacher: None,
        reason: None,
        detail: None,
        seq: None,
        reward: None,
    }
}

/// `text`, cut at [`MAX_TEXT_CHARS`] characters.
fn bounded(text: &str) -> String {
    match text.char_indices().nth(MAX_TEXT_CHARS) {
        None => text.to_owned(),
        Some((at, _)) => format!("{}…", &text[..at]),
    }
}

fn bump(map: &mut BTreeMap<String, u64>, key: &str) {
    match map.get_mut(key) {
        Some(n) => *n += 1,
        None => {
            map.insert(key.to_owned(), 1);
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn bucket(series: &mut Vec<Bucket>, now_ms: u64) -> &mut Bucket {
    if series.is_empty() {
        *series = vec![Bucket::default(); SERIES_BUCKETS];
    }
    let slot = now_ms / BUCKET_MS;
    let b = &mut series[(slot % SERIES_BUCKETS as u64) as usize];
    if b.slot != slot {
        *b = Bucket {
            slot,
            ..Bucket::default()
        };
    }
    b
}

impl Inner {
    /// The key of session `id` (made when missing), marked as the most recently active; the least
    /// recently active sessions beyond `max_sessions` are forgotten.
    fn touch(
        &mut self,
        id: &str,
        source: SessionSource,
        now_ms: u64,
        max_sessions: usize,
    ) -> Arc<str> {
        self.stamp += 1;
        let stamp = self.stamp;
        let key: Arc<str> = match self.sessions.get_key_value(id) {
            Some((k, _)) => Arc::clone(k),
            None => {
                let k: Arc<str> = Arc::from(id);
                self.sessions
                    .insert(Arc::clone(&k), Session::new(source, now_ms));
                k
            }
        };
        if let Some(s) = self.sessions.get_mut(&key) {
            s.stamp = stamp;
            s.last_ms = now_ms;
        }
        self.lru.push_back((Arc::clone(&key), stamp));
        let max = max_sessions.max(1);
        while self.sessions.len() > max {
            let Some((old, old_stamp)) = self.lru.pop_front() else {
                break;
            };
            if self
                .sessions
                .get(&old)
                .is_some_and(|s| s.stamp == old_stamp)
            {
                self.sessions.remove(&old);
                self.forgotten_sessions += 1;
            }
        }
        // Stale entries (sessions touched again since) are dropped once the queue holds twice
        // the sessions: O(max_sessions) once per max_sessions touches.
        if self.lru.len() > 2 * max + 16 {
            let sessions = &self.sessions;
            self.lru
                .retain(|(k, st)| sessions.get(k).is_some_and(|s| s.stamp == *st));
        }
        key
    }

    fn apply(&mut self, event: TurnEvent<'_>, now_ms: u64, limits: HistoryLimits) {
        // Closing a session the history no longer holds would only bring back an empty one.
        if matches!(event, TurnEvent::SessionClosed { .. })
            && !self.sessions.contains_key(event.session())
        {
            return;
        }
        let source = match event {
            TurnEvent::Opened { source, .. } => source,
            _ => SessionSource::default(),
        };
        let key = self.touch(event.session(), source, now_ms, limits.max_sessions);
        let max_turns = limits.max_turns_per_session;
        let b = bucket(&mut self.series, now_ms);
        let Some(s) = self.sessions.get_mut(&key) else {
            return;
        };
        let totals = &mut self.totals;
        match event {
            TurnEvent::Opened {
                turn,
                turn_type,
                source,
                streamed,
                door,
                ..
            } => {
                totals.requests += 1;
                b.requests += 1;
                s.requests += 1;
                s.source = source;
                s.closed_reason = None;
                let mut v = new_turn(turn, turn_type, now_ms, streamed);
                v.door = door;
                match (turn_type, turn) {
                    (TurnType::Side, _) => {
                        totals.side_turns += 1;
                        v.status = TurnStatus::Side;
                    }
                    (TurnType::Main, Some(_)) => {
                        totals.main_turns += 1;
                        s.main_turns += 1;
                    }
                    (TurnType::Main, None) => {
                        totals.main_turns += 1;
                        v.status = TurnStatus::NotCaptured;
                        v.reason = Some("submission_paused".into());
                    }
                }
                s.push(v, max_turns);
            }
            TurnEvent::Captured {
                turn,
                response_tokens,
                ..
            } => {
                let t = s.turn(turn, now_ms, max_turns);
                t.updated_ms = now_ms;
                t.status = TurnStatus::WaitingNextState;
                t.response_tokens = Some(response_tokens);
            }
            TurnEvent::Abandoned { turn, reason, .. } => {
                bump(&mut totals.abandoned, reason);
                b.drops += 1;
                s.drops += 1;
                let t = s.turn(turn, now_ms, max_turns);
                t.updated_ms = now_ms;
                t.status = TurnStatus::Abandoned;
                t.reason = Some(bounded(reason));
            }
            TurnEvent::PrmVotes {
                turn, votes, score, ..
            } => {
                let t = s.turn(turn, now_ms, max_turns);
                t.updated_ms = now_ms;
                t.status = TurnStatus::Judged;
                t.prm_votes = Some(votes.to_vec());
                t.prm_score = Some(score);
            }
            TurnEvent::HintVotes {
                turn, votes, hint, ..
            } => {
                let t = s.turn(turn, now_ms, max_turns);
                t.updated_ms = now_ms;
                t.status = TurnStatus::Judged;
                t.hint_votes = Some(votes.to_vec());
                t.hint = hint.map(bounded);
            }
            TurnEvent::Teacher { turn, outcome, .. } => {
                let (name, detail) = match outcome {
                    TeacherOutcome::Scored => ("scored", None),
                    TeacherOutcome::Mismatch { detail } => {
                        totals.teacher_mismatches += 1;
                        ("mismatch", Some(bounded(detail)))
                    }
                    TeacherOutcome::Failed { detail } => ("failed", Some(bounded(detail))),
                };
                let t = s.turn(turn, now_ms, max_turns);
                t.updated_ms = now_ms;
                t.teacher = Some(TeacherView {
                    outcome: name.into(),
                    detail,
                });
            }
            TurnEvent::Dropped {
                turn,
                reason,
                detail,
                ..
            } => {
                bump(&mut totals.dropped, reason);
                b.drops += 1;
                s.drops += 1;
                let t = s.turn(turn, now_ms, max_turns);
                t.updated_ms = now_ms;
                t.status = TurnStatus::Dropped;
                t.reason = Some(bounded(reason));
                t.detail = detail.map(bounded);
            }
            TurnEvent::Submitted {
                turn,
                seq,
                reward,
                excluded,
                ..
            } => {
                totals.samples += 1;
                b.samples += 1;
                b.reward_sum += reward;
                b.reward_n += 1;
                s.samples += 1;
                if excluded.is_some() {
                    totals.excluded += 1;
                }
                let t = s.turn(turn, now_ms, max_turns);
                t.updated_ms = now_ms;
                t.status = if excluded.is_some() {
                    TurnStatus::Excluded
                } else {
                    TurnStatus::Submitted
                };
                t.seq = Some(seq);
                t.reward = Some(reward);
                t.reason = excluded.map(bounded);
            }
            TurnEvent::SessionClosed { reason, .. } => {
                s.closed_reason = Some(bounded(reason));
            }
        }
    }
}

impl InspectHistory {
    pub fn new(limits: HistoryLimits) -> Self {
        Self {
            limits,
            inner: Mutex::new(Inner::default()),
        }
    }

    pub fn limits(&self) -> HistoryLimits {
        self.limits
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere while holding the lock leaves the history consistent enough to show.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records `event` as happening at `now_ms` (Unix milliseconds).
    pub fn observe_at(&self, event: TurnEvent<'_>, now_ms: u64) {
        self.lock().apply(event, now_ms, self.limits);
    }

    /// The counters, the recent series (oldest first, ending with the bucket of `now_ms`) and
    /// the rates over the last minute.
    pub fn overview_at(&self, now_ms: u64) -> (Totals, Vec<SeriesPoint>, HistoryInfo) {
        let g = self.lock();
        let totals = g.totals.clone();
        let info = HistoryInfo {
            sessions: g.sessions.len(),
            max_sessions: self.limits.max_sessions,
            max_turns_per_session: self.limits.max_turns_per_session,
            forgotten_sessions: g.forgotten_sessions,
        };
        let now_slot = now_ms / BUCKET_MS;
        let first = now_slot.saturating_sub(SERIES_BUCKETS as u64 - 1);
        let series = (first..=now_slot)
            .map(|slot| {
                let b = g
                    .series
                    .get((slot % SERIES_BUCKETS as u64) as usize)
                    .filter(|b| b.slot == slot)
                    .copied()
                    .unwrap_or_default();
                SeriesPoint {
                    t_ms: slot * BUCKET_MS,
                    requests: b.requests,
                    samples: b.samples,
                    drops: b.drops,
                    mean_reward: (b.reward_n > 0).then(|| b.reward_sum / b.reward_n as f64),
                }
            })
            .collect();
        (totals, series, info)
    }

    /// Sessions whose id contains `query` (all when empty), most recently active first, at most
    /// `limit`.
    pub fn sessions(&self, query: &str, limit: usize) -> SessionList {
        let g = self.lock();
        let total = g.sessions.len();
        let mut found: Vec<(&Arc<str>, &Session)> = g
            .sessions
            .iter()
            .filter(|(id, _)| query.is_empty() || id.contains(query))
            .collect();
        let matched = found.len();
        found.sort_by_key(|(_, s)| std::cmp::Reverse(s.stamp));
        found.truncate(limit);
        SessionList {
            sessions: found.into_iter().map(|(id, s)| s.summary(id)).collect(),
            total,
            matched,
        }
    }

    /// The timeline of session `id`.
    pub fn session(&self, id: &str) -> Option<SessionTimeline> {
        let g = self.lock();
        let s = g.sessions.get(id)?;
        Some(SessionTimeline {
            session: s.summary(id),
            turns: s.turns.iter().cloned().collect(),
            turns_forgotten: s.turns_forgotten,
        })
    }
}

impl Default for InspectHistory {
    fn default() -> Self {
        Self::new(HistoryLimits::default())
    }
}

impl TurnObserver for InspectHistory {
    fn observe(&self, event: TurnEvent<'_>) {
        self.observe_at(event, now_ms());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opened(session: &str, turn: Option<u64>, turn_type: TurnType) -> TurnEvent<'_> {
        TurnEvent::Opened {
            session,
            turn,
            turn_type,
            source: SessionSource::Header,
            streamed: false,
            door: ps_core::Door::ChatCompletions,
        }
    }

    fn limits(max_sessions: usize, max_turns_per_session: usize) -> HistoryLimits {
        HistoryLimits {
            max_sessions,
            max_turns_per_session,
        }
    }

    #[test]
    fn a_turn_is_followed_from_request_to_sample() {
        let h = InspectHistory::default();
        h.observe_at(opened("s", Some(1), TurnType::Main), 1_000);
        h.observe_at(opened("s", None, TurnType::Side), 1_100);
        h.observe_at(
            TurnEvent::Captured {
                session: "s",
                turn: 1,
                response_tokens: 12,
            },
            1_200,
        );
        h.observe_at(
            TurnEvent::PrmVotes {
                session: "s",
                turn: 1,
                votes: &[Some(1), Some(1), None],
                score: 1.0,
            },
            2_000,
        );
        h.observe_at(
            TurnEvent::HintVotes {
                session: "s",
                turn: 1,
                votes: &[Some(1), Some(-1)],
                hint: Some("use the cache"),
            },
            2_000,
        );
        h.observe_at(
            TurnEvent::Teacher {
                session: "s",
                turn: 1,
                outcome: TeacherOutcome::Scored,
            },
            2_100,
        );
        h.observe_at(
            TurnEvent::Submitted {
                session: "s",
                turn: 1,
                seq: 42,
                reward: 1.0,
                excluded: None,
            },
            2_200,
        );
        h.observe_at(
            TurnEvent::SessionClosed {
                session: "s",
                reason: "done",
            },
            2_300,
        );
        let tl = h.session("s").unwrap();
        assert_eq!(tl.turns.len(), 2);
        let t = &tl.turns[0];
        assert_eq!(t.status, TurnStatus::Submitted);
        assert_eq!(
            (t.turn, t.seq, t.reward, t.response_tokens),
            (Some(1), Some(42), Some(1.0), Some(12))
        );
        assert_eq!(t.prm_votes, Some(vec![Some(1), Some(1), None]));
        assert_eq!(t.hint.as_deref(), Some("use the cache"));
        assert_eq!(t.teacher.as_ref().unwrap().outcome, "scored");
        assert_eq!((t.at_ms, t.updated_ms), (1_000, 2_200));
        assert_eq!(tl.turns[1].status, TurnStatus::Side);
        assert_eq!(tl.session.state, "closed");
        assert_eq!(tl.session.closed_reason.as_deref(), Some("done"));
        assert_eq!(
            (
                tl.session.requests,
                tl.session.main_turns,
                tl.session.samples
            ),
            (2, 1, 1)
        );

        let (totals, series, _) = h.overview_at(2_300);
        assert_eq!(
            (
                totals.requests,
                totals.main_turns,
                totals.side_turns,
                totals.samples
            ),
            (2, 1, 1, 1)
        );
        let last = series.last().unwrap();
        assert_eq!((last.t_ms, last.requests, last.samples), (0, 2, 1));
        assert_eq!(last.mean_reward, Some(1.0));
    }

    #[test]
    fn drops_abandons_exclusions_and_mismatches_are_counted_by_reason() {
        let h = InspectHistory::default();
        for t in 1..=4 {
            h.observe_at(opened("s", Some(t), TurnType::Main), 10);
        }
        h.observe_at(
            TurnEvent::Abandoned {
                session: "s",
                turn: 1,
                reason: "upstream_failed",
            },
            11,
        );
        h.observe_at(
            TurnEvent::Teacher {
                session: "s",
                turn: 2,
                outcome: TeacherOutcome::Mismatch {
                    detail: "first differing position 3",
                },
            },
            12,
        );
        h.observe_at(
            TurnEvent::Dropped {
                session: "s",
                turn: 2,
                reason: "teacher_token_mismatch",
                detail: Some("first differing position 3"),
            },
            12,
        );
        h.observe_at(
            TurnEvent::Submitted {
                session: "s",
                turn: 3,
                seq: 1,
                reward: 0.0,
                excluded: Some("no_next_state"),
            },
            13,
        );
        // A main request served while paused: not a turn.
        h.observe_at(opened("s", None, TurnType::Main), 14);
        let tl = h.session("s").unwrap();
        let status: Vec<_> = tl.turns.iter().map(|t| t.status).collect();
        assert_eq!(
            status,
            vec![
                TurnStatus::Abandoned,
                TurnStatus::Dropped,
                TurnStatus::Excluded,
                TurnStatus::Answering,
                TurnStatus::NotCaptured
            ]
        );
        assert_eq!(tl.turns[1].teacher.as_ref().unwrap().outcome, "mismatch");
        assert_eq!(tl.turns[2].reason.as_deref(), Some("no_next_state"));
        let (totals, _, _) = h.overview_at(14);
        assert_eq!(totals.abandoned["upstream_failed"], 1);
        assert_eq!(totals.dropped["teacher_token_mismatch"], 1);
        assert_eq!((totals.excluded, totals.teacher_mismatches), (1, 1));
        assert_eq!(tl.session.drops, 2);
    }

    #[test]
    fn sessions_beyond_the_bound_are_forgotten_least_recently_active_first() {
        let h = InspectHistory::new(limits(3, 8));
        for (i, s) in ["a", "b", "c"].iter().enumerate() {
            h.observe_at(opened(s, Some(1), TurnType::Main), i as u64);
        }
        // `a` is active again: `b` is now the least recently active.
        h.observe_at(
            TurnEvent::Captured {
                session: "a",
                turn: 1,
                response_tokens: 1,
            },
            5,
        );
        h.observe_at(opened("d", Some(1), TurnType::Main), 6);
        let ids: Vec<_> = h
            .sessions("", 10)
            .sessions
            .into_iter()
            .map(|s| s.id)
            .collect();
        assert_eq!(ids, vec!["d", "a", "c"]);
        assert!(h.session("b").is_none());
        let (_, _, info) = h.overview_at(6);
        assert_eq!((info.sessions, info.forgotten_sessions), (3, 1));
        // Closing a forgotten session does not bring it back.
        h.observe_at(
            TurnEvent::SessionClosed {
                session: "b",
                reason: "timeout",
            },
            7,
        );
        assert!(h.session("b").is_none());
    }

    #[test]
    fn memory_stays_bounded_under_many_sessions_and_turns() {
        let h = InspectHistory::new(limits(100, 16));
        for i in 0..20_000u64 {
            let id = format!("session-{}", i % 1_000);
            h.observe_at(opened(&id, Some(i), TurnType::Main), i);
            h.observe_at(
                TurnEvent::PrmVotes {
                    session: &id,
                    turn: i,
                    votes: &[Some(1)],
                    score: 1.0,
                },
                i,
            );
        }
        let g = h.lock();
        assert_eq!(g.sessions.len(), 100);
        assert!(g.lru.len() <= 2 * 100 + 16, "lru {}", g.lru.len());
        for s in g.sessions.values() {
            assert!(s.turns.len() <= 16);
            assert!(s.by_turn.len() <= 16);
        }
        assert_eq!(g.series.len(), SERIES_BUCKETS);
        drop(g);
        // One session with more requests than it may hold keeps the newest.
        let h = InspectHistory::new(limits(10, 4));
        for t in 1..=10 {
            h.observe_at(opened("long", Some(t), TurnType::Main), t);
        }
        let tl = h.session("long").unwrap();
        let turns: Vec<_> = tl.turns.iter().map(|t| t.turn.unwrap()).collect();
        assert_eq!(turns, vec![7, 8, 9, 10]);
        assert_eq!(tl.turns_forgotten, 6);
        h.observe_at(
            TurnEvent::Submitted {
                session: "long",
                turn: 9,
                seq: 3,
                reward: 1.0,
                excluded: None,
            },
            11,
        );
        assert_eq!(h.session("long").unwrap().turns[2].seq, Some(3));
    }

    #[test]
    fn long_texts_are_cut() {
        let h = InspectHistory::default();
        let hint = "é".repeat(MAX_TEXT_CHARS + 50);
        h.observe_at(
            TurnEvent::HintVotes {
                session: "s",
                turn: 1,
                votes: &[Some(1)],
                hint: Some(&hint),
            },
            1,
        );
        let got = h.session("s").unwrap().turns[0].hint.clone().unwrap();
        assert_eq!(got.chars().count(), MAX_TEXT_CHARS + 1);
        assert!(got.ends_with('…'));
    }

    #[test]
    fn the_series_covers_ten_minutes_and_forgets_older_buckets() {
        let h = InspectHistory::default();
        h.observe_at(opened("s", Some(1), TurnType::Main), 1_000_000);
        h.observe_at(opened("s", Some(2), TurnType::Main), 1_004_999);
        h.observe_at(opened("s", Some(3), TurnType::Main), 1_060_000);
        let (_, series, _) = h.overview_at(1_060_000);
        assert_eq!(series.len(), SERIES_BUCKETS);
        assert_eq!(series.iter().map(|p| p.requests).sum::<u64>(), 3);
        assert_eq!(series.last().unwrap().requests, 1);
        // Eleven minutes later the old buckets are gone, even where their ring slot was reused.
        let later = 1_000_000 + 11 * 60_000;
        h.observe_at(opened("s", Some(4), TurnType::Main), later);
        let (_, series, _) = h.overview_at(later);
        assert_eq!(series.iter().map(|p| p.requests).sum::<u64>(), 1);
        assert_eq!(
            series.first().unwrap().t_ms,
            (later / BUCKET_MS - 119) * BUCKET_MS
        );
    }

    #[test]
    fn search_matches_part_of_the_id_and_limits_the_list() {
        let h = InspectHistory::default();
        for id in ["alpha-1", "beta-2", "alpha-3"] {
            h.observe_at(opened(id, Some(1), TurnType::Main), 1);
        }
        let l = h.sessions("alpha", 10);
        assert_eq!((l.total, l.matched), (3, 2));
        assert_eq!(l.sessions[0].id, "alpha-3");
        assert_eq!(h.sessions("", 1).sessions.len(), 1);
    }
}
