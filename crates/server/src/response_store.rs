//! The conversations of `store: true` responses (the Responses door), by response id, for a later
//! request's `previous_response_id`: in memory, bounded by count and bytes, the oldest first out.
//! Apart from the door's handler so that the server's state can hold it without depending on the
//! chat path.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde_json::Value;

/// Stored responses kept for `previous_response_id` (the oldest go first).
pub const STORE_MAX_RESPONSES: usize = 1024;
/// Their messages' JSON, at most (the oldest go first).
pub const STORE_MAX_BYTES: usize = 64 << 20;

/// The conversations of `store: true` responses, by response id: what a later request's
/// `previous_response_id` continues. In memory and bounded ([`STORE_MAX_RESPONSES`],
/// [`STORE_MAX_BYTES`]): a restart forgets them (the client then gets a clear 404).
#[derive(Debug, Default)]
pub struct Store(Mutex<StoreInner>);

#[derive(Debug, Default)]
struct StoreInner {
    by_id: HashMap<String, (Vec<Value>, usize)>,
    order: VecDeque<String>,
    bytes: usize,
}

impl Store {
    pub(crate) fn get(&self, id: &str) -> Option<Vec<Value>> {
        let g = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        g.by_id.get(id).map(|(m, _)| m.clone())
    }

    /// Keeps `messages` and the `answer` under `id`; `size`: their JSON's length, about (the
    /// chat body's).
    pub(crate) fn put(&self, id: String, mut messages: Vec<Value>, answer: Value, size: usize) {
        messages.push(answer);
        let mut g = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, old)) = g.by_id.insert(id.clone(), (messages, size)) {
            g.bytes -= old;
            g.order.retain(|o| o != &id);
        }
        g.bytes += size;
        g.order.push_back(id);
        while g.order.len() > STORE_MAX_RESPONSES
            || (g.bytes > STORE_MAX_BYTES && g.order.len() > 1)
        {
            let Some(oldest) = g.order.pop_front() else {
                break;
            };
            if let Some((_, n)) = g.by_id.remove(&oldest) {
                g.bytes -= n;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The store keeps at most its bound of responses, the oldest going first; a response put
    /// again under its id replaces itself.
    #[test]
    fn the_store_forgets_the_oldest_beyond_its_bounds() {
        let store = Store::default();
        let msg = |i: usize| vec![json!({"role": "user", "content": format!("m{i}")})];
        for i in 0..STORE_MAX_RESPONSES + 10 {
            store.put(
                format!("r{i}"),
                msg(i),
                json!({"role": "assistant", "content": "a"}),
                100,
            );
        }
        assert!(store.get("r0").is_none() && store.get("r9").is_none());
        let kept = store.get("r10").unwrap_or_default();
        assert_eq!(kept.len(), 2, "the conversation and the answer");
        assert!(
            store
                .get(&format!("r{}", STORE_MAX_RESPONSES + 9))
                .is_some()
        );
        // Bytes: one response over the bound evicts every older one, never itself.
        store.put("big".into(), msg(0), json!({}), STORE_MAX_BYTES + 1);
        assert!(store.get("big").is_some());
        assert!(
            store
                .get(&format!("r{}", STORE_MAX_RESPONSES + 9))
                .is_none()
        );
        store.put("big".into(), msg(1), json!({}), 10);
        assert_eq!(
            store.get("big").map(|m| m[0]["content"].clone()),
            Some(json!("m1"))
        );
    }
}
