//! The live conversations we answered, keyed by the fingerprint of "their messages + our reply",
//! and the decision for each request without a session key: continue, fork, or start anew.
//!
//! Rules (docs/internals.md, "Sessions without headers"):
//! - the longest prefix of the request that ends with an assistant message is looked up; if it is
//!   the end of a conversation we answered and nobody continued it yet, the request continues that
//!   session (and claims the end);
//! - if that end was already continued (or a continuation is in flight), the request is a fork: a
//!   new session whose `parent_session` is the one that answered the prefix;
//! - no match: a new session. If the request carries history (an assistant message) it counts as
//!   an unmatched continuation, and when its system prompt and first user message are those of a
//!   live session, that session is recorded as `continued_from` (compaction);
//! - a claim is made permanent only when the answer is complete ([`PendingReply::complete`]); a
//!   request that fails releases it when dropped, so the client's retry continues the same
//!   session instead of forking;
//! - a reply is registered under the request's history and under that history without a short
//!   trailing tail ([`History::tail_bases`]): a client that sends a message once and never again
//!   (crate::ephemeral) still continues. These ends are siblings: claiming one claims all, and a
//!   continuation through a tail says how long the tail was ([`Resolved::ephemeral_tail`]).
//!
//! Memory: per live session its origin and one to three keys per answered turn (the history and
//! up to two tails); a session goes with the
//! session itself: when the session buffer closes it (timeout, eviction, shutdown: the matcher is a
//! [`TurnObserver`] of the buffer and forgets on [`TurnEvent::SessionClosed`]) or the client ends
//! it ([`SessionMatcher::forget`]). Its own idle clock ([`Limits::idle`], checked on every request)
//! and LRU cap ([`Limits::max_sessions`]) are the backstop for a server without a session buffer. The lock is a plain mutex held for a few map operations, never
//! across an await.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ps_core::{SessionOrigin, SessionSource, TurnEvent, TurnObserver};
use serde_json::Value;

use crate::fingerprint::{History, Key};

/// Prefix of every generated session id.
pub const INFERRED_PREFIX: &str = "inferred-";

/// How long sessions are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A session not used for longer is dropped (`server.session_timeout_sec`).
    pub idle: Duration,
    /// Most live sessions (`server.max_sessions`).
    pub max_sessions: usize,
}

/// What was decided for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Continues a live session.
    Continued,
    /// A new conversation (no earlier turns in the request).
    New,
    /// A second continuation of an answered prefix: a new session linked to its parent.
    Fork,
    /// A request with earlier turns that match no live conversation: a new session.
    Unmatched,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Continued => "continued",
            Self::New => "new",
            Self::Fork => "fork",
            Self::Unmatched => "unmatched",
        }
    }
}

/// Counters since start, and what is held now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    pub live_sessions: usize,
    /// Answered conversation ends held (one to three per answered turn of a live session: the
    /// history, and the history without one or two trailing messages).
    pub answered_ends: usize,
    pub continued: u64,
    pub new_sessions: u64,
    pub forks: u64,
    pub unmatched: u64,
    /// Unmatched continuations linked to a live session (`continued_from`).
    pub linked: u64,
    pub expired: u64,
    pub evicted: u64,
}

/// The decision for one request, and the handle that registers our reply.
#[derive(Debug)]
pub struct Resolved {
    pub session_id: String,
    pub origin: SessionOrigin,
    pub outcome: Outcome,
    pub reply: PendingReply,
    /// A continuation through a history without the previous request's last `n` messages: the
    /// client sent them once (0 otherwise). The next state leaves as many out of this request's
    /// end ([`crate::ephemeral::next_state`]).
    pub ephemeral_tail: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// Nobody continued this end yet.
    Open,
    /// A request continuing it is in flight (the claim's number).
    Pending(u64),
    /// Continued by a request that was answered.
    Taken,
}

#[derive(Debug)]
struct End {
    session: String,
    next: Next,
    /// Registered under the history without its last `tail` messages (0: the whole history).
    tail: usize,
    /// The other ends of the same reply (under other tails): claimed, taken and released with it.
    siblings: Box<[Key]>,
}

#[derive(Debug)]
struct Session {
    origin: SessionOrigin,
    ends: Vec<Key>,
    opening: Option<Key>,
    lru: (Instant, u64),
}

#[derive(Debug, Default)]
struct State {
    sessions: HashMap<String, Session>,
    ends: HashMap<Key, End>,
    /// Opening key → the newest live session that began with it.
    openings: HashMap<Key, String>,
    lru: BTreeMap<(Instant, u64), String>,
    tick: u64,
    stats: Stats,
}

/// The matcher shared by every request (wrap it in an [`Arc`]).
#[derive(Debug)]
pub struct SessionMatcher {
    state: Mutex<State>,
    limits: Limits,
    /// Seeds the generated ids, so that ids of different runs differ.
    seed: u64,
    ids: AtomicU64,
}

impl SessionMatcher {
    pub fn new(limits: Limits) -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Self {
            state: Mutex::new(State::default()),
            limits: Limits {
                max_sessions: limits.max_sessions.max(1),
                ..limits
            },
            seed,
            ids: AtomicU64::new(0),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn new_id(&self) -> String {
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.seed.to_le_bytes());
        b[8..].copy_from_slice(&n.to_le_bytes());
        format!("{INFERRED_PREFIX}{:016x}", xxhash_rust::xxh3::xxh3_64(&b))
    }

    /// Decides the session of a request whose messages have `history`, at time `now`.
    pub fn resolve(self: &Arc<Self>, history: &History, now: Instant) -> Resolved {
        let mut st = self.lock();
        st.expire(now, self.limits.idle);
        let found = history.answered_prefixes().find_map(|k| {
            st.ends
                .get(&k)
                .map(|e| (k, e.session.clone(), e.next, e.tail))
        });
        let ephemeral_tail = match found {
            Some((_, _, Next::Open, tail)) => tail,
            _ => 0,
        };
        let (session_id, origin, outcome, claimed, created) = match found {
            Some((key, owner, Next::Open, _)) => {
                st.tick += 1;
                let claim = st.tick;
                st.set_next(key, Next::Open, Next::Pending(claim));
                st.touch(&owner, now);
                st.stats.continued += 1;
                let origin = st
                    .sessions
                    .get(&owner)
                    .map(|s| s.origin.clone())
                    .unwrap_or_default();
                (owner, origin, Outcome::Continued, Some((key, claim)), false)
            }
            Some((_, parent, _, _)) => {
                let id = self.new_id();
                let origin = SessionOrigin {
                    source: SessionSource::Fork,
                    parent_session: Some(parent),
                    ..SessionOrigin::default()
                };
                st.stats.forks += 1;
                (id, origin, Outcome::Fork, None, true)
            }
            None => {
                let id = self.new_id();
                let mut origin = SessionOrigin::of(SessionSource::Inferred);
                let outcome = if history.has_history() {
                    st.stats.unmatched += 1;
                    origin.continued_from =
                        history.opening().and_then(|o| st.openings.get(&o)).cloned();
                    if origin.continued_from.is_some() {
                        st.stats.linked += 1;
                    }
                    Outcome::Unmatched
                } else {
                    st.stats.new_sessions += 1;
                    Outcome::New
                };
                (id, origin, outcome, None, true)
            }
        };
        if created {
            st.create(
                &session_id,
                origin.clone(),
                history.opening(),
                now,
                self.limits.max_sessions,
            );
        }
        drop(st);
        Resolved {
            reply: PendingReply {
                matcher: self.clone(),
                session_id: session_id.clone(),
                base: history.key(),
                tails: history.tail_bases().to_vec(),
                claimed,
                created,
                done: false,
            },
            session_id,
            origin,
            outcome,
            ephemeral_tail,
        }
    }

    /// The client ended the session: its conversation cannot be continued any more.
    pub fn forget(&self, session_id: &str) {
        self.lock().remove(session_id);
    }

    /// Drops the sessions idle for longer than [`Limits::idle`] as of `now`; returns how many.
    /// [`SessionMatcher::resolve`] does this on every call.
    pub fn expire(&self, now: Instant) -> usize {
        self.lock().expire(now, self.limits.idle)
    }

    pub fn stats(&self) -> Stats {
        let st = self.lock();
        Stats {
            live_sessions: st.sessions.len(),
            answered_ends: st.ends.len(),
            ..st.stats
        }
    }

    fn complete(&self, r: &PendingReply, reply: &Value, now: Instant) {
        let mut st = self.lock();
        if let Some((key, claim)) = r.claimed {
            st.set_next(key, Next::Pending(claim), Next::Taken);
        }
        if !st.sessions.contains_key(&r.session_id) {
            // Ended, idled out or evicted meanwhile: nothing to continue.
            return;
        }
        let reply_key = crate::fingerprint::message_key(reply);
        let ends: Vec<(Key, usize)> = std::iter::once((r.base, 0))
            .chain(r.tails.iter().copied())
            .map(|(base, tail)| (crate::fingerprint::chain_key(base, reply_key), tail))
            .collect();
        for (i, &(key, tail)) in ends.iter().enumerate() {
            let end = End {
                session: r.session_id.clone(),
                next: Next::Open,
                tail,
                siblings: ends
                    .iter()
                    .enumerate()
                    .filter(|&(j, _)| j != i)
                    .map(|(_, &(k, _))| k)
                    .collect(),
            };
            match st.ends.entry(key) {
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert(end);
                }
                // A whole history wins over another session's guess that a tail was sent once
                // (that session's request ended with one message more, answered alike): this
                // conversation's next request must continue this session.
                std::collections::hash_map::Entry::Occupied(mut slot)
                    if tail == 0 && slot.get().tail > 0 && slot.get().next == Next::Open =>
                {
                    slot.insert(end);
                }
                // The same conversation answered the same way in another live session: the
                // first keeps it (the two cannot be told apart).
                std::collections::hash_map::Entry::Occupied(_) => continue,
            }
            if let Some(s) = st.sessions.get_mut(&r.session_id) {
                s.ends.push(key);
            }
        }
        st.touch(&r.session_id, now);
    }

    fn release(&self, r: &PendingReply) {
        let mut st = self.lock();
        if let Some((key, claim)) = r.claimed {
            st.set_next(key, Next::Pending(claim), Next::Open);
        }
        if r.created
            && st
                .sessions
                .get(&r.session_id)
                .is_some_and(|s| s.ends.is_empty())
        {
            // A new session whose only request failed: the retry starts afresh, and is not linked
            // to this empty one.
            st.remove(&r.session_id);
        }
    }
}

/// The session buffer closed a session (timeout, eviction, shutdown) or the client ended it: its
/// conversation cannot be continued any more, so its answered ends go with it.
impl TurnObserver for SessionMatcher {
    fn observe(&self, event: TurnEvent<'_>) {
        if let TurnEvent::SessionClosed { session, .. } = event
            && session.starts_with(INFERRED_PREFIX)
        {
            self.forget(session);
        }
    }
}

impl State {
    /// Moves the end `key` and its siblings that are in state `from` (and still belong to the
    /// same session) to `to`.
    fn set_next(&mut self, key: Key, from: Next, to: Next) {
        let Some(e) = self.ends.get_mut(&key) else {
            return;
        };
        if e.next != from {
            return;
        }
        e.next = to;
        let (session, siblings) = (e.session.clone(), e.siblings.clone());
        for k in siblings.iter() {
            if let Some(s) = self.ends.get_mut(k)
                && s.session == session
                && s.next == from
            {
                s.next = to;
            }
        }
    }

    fn create(
        &mut self,
        id: &str,
        origin: SessionOrigin,
        opening: Option<Key>,
        now: Instant,
        max_sessions: usize,
    ) {
        while self.sessions.len() >= max_sessions {
            let Some((_, oldest)) = self.lru.pop_first() else {
                break;
            };
            self.remove(&oldest);
            self.stats.evicted += 1;
        }
        self.tick += 1;
        let lru = (now, self.tick);
        self.lru.insert(lru, id.to_owned());
        if let Some(o) = opening {
            self.openings.insert(o, id.to_owned());
        }
        self.sessions.insert(
            id.to_owned(),
            Session {
                origin,
                ends: Vec::new(),
                opening,
                lru,
            },
        );
    }

    fn touch(&mut self, id: &str, now: Instant) {
        self.tick += 1;
        let tick = self.tick;
        let Some(s) = self.sessions.get_mut(id) else {
            return;
        };
        self.lru.remove(&s.lru);
        s.lru = (now.max(s.lru.0), tick);
        self.lru.insert(s.lru, id.to_owned());
    }

    fn remove(&mut self, id: &str) {
        let Some(s) = self.sessions.remove(id) else {
            return;
        };
        self.lru.remove(&s.lru);
        for k in &s.ends {
            if self.ends.get(k).is_some_and(|e| e.session == id) {
                self.ends.remove(k);
            }
        }
        if let Some(o) = s.opening
            && self.openings.get(&o).is_some_and(|s| s == id)
        {
            self.openings.remove(&o);
        }
    }

    fn expire(&mut self, now: Instant, idle: Duration) -> usize {
        let mut n = 0;
        while let Some(entry) = self.lru.first_entry() {
            if now.saturating_duration_since(entry.key().0) <= idle {
                break;
            }
            let id = entry.remove();
            self.remove(&id);
            n += 1;
        }
        if n > 0 {
            self.stats.expired += n as u64;
            // Give memory back after a burst: the maps would otherwise stay sized for it.
            if self.sessions.len() * 4 < self.sessions.capacity() {
                self.sessions.shrink_to_fit();
                self.ends.shrink_to_fit();
                self.openings.shrink_to_fit();
            }
        }
        n
    }
}

/// Registers our reply once the answer is complete; dropped without [`PendingReply::complete`]
/// (the request failed, the client went away) it releases the claim, so a retry is not a fork.
#[derive(Debug)]
pub struct PendingReply {
    matcher: Arc<SessionMatcher>,
    session_id: String,
    base: Key,
    /// The request's history without short trailing tails ([`History::tail_bases`]).
    tails: Vec<(Key, usize)>,
    claimed: Option<(Key, u64)>,
    created: bool,
    done: bool,
}

impl PendingReply {
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// The answer `reply` (the assistant message we returned) is complete: the next request of
    /// this conversation will carry it.
    pub fn complete(mut self, reply: &Value, now: Instant) {
        self.done = true;
        self.matcher.complete(&self, reply, now);
    }
}

impl Drop for PendingReply {
    fn drop(&mut self) {
        if !self.done {
            self.matcher.release(self);
        }
    }
}
