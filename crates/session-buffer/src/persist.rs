//! Persistence for shutdown and resume: the turns still unfinished when the shutdown grace runs
//! out are taken out of the sessions and saved to the [`PendingStore`]; the next start puts them
//! back so they are judged again and submitted in turn order.
//!
//! Each turn is either submitted or persisted, never both: a turn taken here is forgotten by its
//! session, and judging results that arrive afterwards for it are discarded.

use std::collections::{BTreeMap, HashMap};

use ps_core::{PendingStore, PendingTurn};
use tokio::time::Instant;

use crate::state::{Next, Ready, Session, Slot, Unfinished};

/// Takes every turn that is captured but not yet a sample: `inflight` (being judged) and the
/// judged turns waiting for an earlier turn. Sorted by session and turn.
pub(crate) fn take_unfinished(
    sessions: &mut HashMap<String, Session>,
    inflight: &mut HashMap<(String, u64), Unfinished>,
) -> Vec<PendingTurn> {
    let mut out: Vec<PendingTurn> = inflight.drain().map(|(_, t)| t.into_pending()).collect();
    for s in sessions.values_mut() {
        let ready = std::mem::take(&mut s.ready);
        for (n, r) in ready {
            let skip = matches!(r, Ready::Skip);
            // A judged sample may share the turn: let it go first, so that `into_pending`
            // takes the turn instead of copying it.
            drop(r);
            if !skip && let Some(origin) = s.origins.remove(&n) {
                out.push(origin.into_pending());
            }
        }
        s.origins.clear();
    }
    for t in &mut out {
        // A turn of a later conversation under the same id (see `conversation_starts`) starts
        // with no effective sample, whatever the earlier conversation had.
        let s = sessions.get(&t.turn.session_id);
        t.session_had_effective = s.is_some_and(|s| {
            s.has_effective && s.conversation_starts.range(..=t.turn.turn).next().is_none()
        });
        t.conversation_start = s.is_some_and(|s| s.conversation_starts.contains(&t.turn.turn));
    }
    out.sort_by(|a, b| (&a.turn.session_id, a.turn.turn).cmp(&(&b.turn.session_id, b.turn.turn)));
    out
}

/// Puts turns persisted by an earlier run back into their sessions, as captured turns whose next
/// state (or its absence) is known. Returns the ids of the sessions touched, for the caller to
/// collect their ready turns.
pub(crate) fn restore(
    sessions: &mut HashMap<String, Session>,
    turns: Vec<PendingTurn>,
) -> Vec<String> {
    let mut by_session: BTreeMap<String, Vec<PendingTurn>> = BTreeMap::new();
    for t in turns {
        by_session
            .entry(t.turn.session_id.clone())
            .or_default()
            .push(t);
    }
    let mut touched = Vec::with_capacity(by_session.len());
    for (id, turns) in by_session {
        let fresh = !sessions.contains_key(&id);
        let s = sessions
            .entry(id.clone())
            .or_insert_with(|| Session::new(Instant::now()));
        let numbers: Vec<u64> = turns.iter().map(|t| t.turn.turn).collect();
        let (lo, hi) = (
            numbers.iter().copied().min().unwrap_or(1),
            numbers.iter().copied().max().unwrap_or(0),
        );
        if fresh {
            s.next_submit = lo;
            s.closing = true;
            // The state of the conversation the first resumed turn belongs to; a later
            // conversation under the same id starts afresh at its first turn.
            s.has_effective = turns
                .iter()
                .min_by_key(|t| t.turn.turn)
                .is_some_and(|t| t.session_had_effective);
            s.conversation_starts = turns
                .iter()
                .filter(|t| t.conversation_start)
                .map(|t| t.turn.turn)
                .collect();
            // Turns between them that were submitted before the restart do not block.
            for n in lo..=hi {
                if !numbers.contains(&n) {
                    s.ready.insert(n, Ready::Skip);
                }
            }
        }
        s.next_turn = s.next_turn.max(hi + 1);
        for t in turns {
            s.slots.insert(
                t.turn.turn,
                Slot {
                    next: t.next.map_or(Next::Missing, Next::State),
                    captured: Some(t.turn),
                },
            );
        }
        touched.push(id);
    }
    touched
}

/// Saves the turns unfinished at the shutdown deadline, logging what happened to them.
pub(crate) async fn save(store: Option<&dyn PendingStore>, unfinished: Vec<PendingTurn>) {
    match store {
        Some(store) if !unfinished.is_empty() => match store.save_pending(unfinished).await {
            Ok(n) => tracing::warn!(
                turns = n,
                "shutdown grace elapsed: unfinished turns persisted; the next start resumes them"
            ),
            Err(e) => {
                tracing::error!(error = %e, "unfinished turns could NOT be persisted: they are lost")
            }
        },
        Some(_) => {}
        None => tracing::error!(
            turns = unfinished.len(),
            "shutdown grace elapsed and no pending store is configured: unfinished turns are lost"
        ),
    }
}
