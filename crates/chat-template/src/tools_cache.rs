//! The request's `tools` as template values, kept for the next turns with the same tools, and
//! what `tojson` printed of them.
//!
//! An agent sends the same tool list with every request, and every turn is rendered at least twice
//! (prompt and prompt + response): converting the list into template values once per turn and
//! printing each tool with `tojson` in every render was ~4.4 % of the proxy's CPU in the agent
//! benchmark, for the same bytes every time. [`ToolsCache`] keeps the converted list of the last
//! few distinct tool lists, found again by comparing the JSON in order and by representation:
//! a list whose keys come in another order, or with `1.0` for `1` or `-0.0` for `0.0`, is another
//! list, as it prints differently. While a render uses a kept list, [`RenderingWith`] makes its
//! `tojson` outputs reusable: `tojson` of one of the list's objects with the same options prints
//! what it printed before (kept with the list, up to a byte budget). An object is recognised by
//! its address, which is sound because the entry keeps every object of its list alive (no other
//! object can have that address while the entry is in use) and template values cannot be changed.
//! What a template sees is unchanged: the same values that a fresh conversion gives, with no
//! object type of our own.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};

use indexmap::IndexMap;
use minijinja::Value as MjValue;
use serde_json::Value;

use crate::dump_options::DumpOptions;

/// Distinct tool lists kept (least recently used out first).
const MAX_ENTRIES: usize = 8;
/// A tool list that would hold more memory than this once kept ([`held_bytes`]: its JSON copy and
/// its template values) is converted for each turn instead. 20 tools of an agent hold ~50 KB.
const MAX_ENTRY_BYTES: usize = 1024 * 1024;
/// `tojson` outputs kept per list, in bytes (their text and a map slot each): as much as the list
/// itself holds (each tool and its `function` object printed once or twice), and at least this.
const MIN_PRINTED_BYTES: usize = 64 * 1024;
/// What one kept `tojson` output costs beside its text: its slot in the maps and its value.
const PRINTED_OVERHEAD_BYTES: usize = 64;

/// The map type a JSON object becomes (what `Value::from_pairs` builds with `preserve_order`),
/// named so that `tojson` can find the objects of a kept list by address.
type MjMap = IndexMap<MjValue, MjValue>;

/// What `tojson` printed, by option set and object address.
#[derive(Debug, Default)]
struct Printed {
    by_options: HashMap<DumpOptions, HashMap<usize, MjValue>>,
    bytes: usize,
}

/// One tool list: its JSON, its template value, and the `tojson` outputs of its objects.
#[derive(Debug)]
pub(crate) struct ToolsEntry {
    json: Option<Value>,
    /// [`fingerprint`] of `json`: lists are compared only when theirs are equal.
    hash: u64,
    value: MjValue,
    /// Addresses of the list's objects (each one's map, alive as long as `value`).
    objects: HashSet<usize>,
    printed: Mutex<Printed>,
    max_printed_bytes: usize,
}

impl ToolsEntry {
    /// `json` converted; `keep`: the entry keeps a copy of `json` to be found again by.
    fn new(json: &Value, hash: u64, bytes: usize, keep: bool) -> Self {
        let mut objects = HashSet::new();
        let value = convert(json, &mut objects);
        Self {
            json: keep.then(|| json.clone()),
            hash,
            value,
            objects,
            printed: Mutex::new(Printed::default()),
            max_printed_bytes: bytes.max(MIN_PRINTED_BYTES),
        }
    }

    /// The list as a template value.
    pub(crate) fn value(&self) -> &MjValue {
        &self.value
    }

    fn is(&self, tools: &Value) -> bool {
        self.json.as_ref().is_some_and(|j| same_json(j, tools))
    }

    fn lock_printed(&self) -> std::sync::MutexGuard<'_, Printed> {
        self.printed.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`crate::json_to_value`], building each object as an [`MjMap`] and noting its address.
fn convert(v: &Value, objects: &mut HashSet<usize>) -> MjValue {
    match v {
        Value::Array(items) => MjValue::from(
            items
                .iter()
                .map(|i| convert(i, objects))
                .collect::<Vec<_>>(),
        ),
        Value::Object(map) => {
            let map: MjMap = map
                .iter()
                .map(|(k, v)| (MjValue::from(k.as_str()), convert(v, objects)))
                .collect();
            let value = MjValue::from_object(map);
            if let Some(m) = value.downcast_object_ref::<MjMap>() {
                objects.insert(std::ptr::from_ref(m).addr());
            }
            value
        }
        scalar => crate::json_to_value(scalar),
    }
}

/// The converted tool lists, shared by every render of one tokenizer.
#[derive(Debug, Default)]
pub(crate) struct ToolsCache {
    entries: Mutex<Vec<Arc<ToolsEntry>>>,
}

impl ToolsCache {
    /// The entry for `tools`: a kept one with the same JSON, else a new one, kept unless it
    /// would hold more than [`MAX_ENTRY_BYTES`] (measured only on a miss: a hit walks the list
    /// to hash and to compare it, nothing more). The lock is held only to look at and reorder the
    /// entries: lists are hashed, compared and converted outside it, so a large or new list does
    /// not hold up renders of other lists. The one comparison under the lock is the re-check
    /// after a miss, and only against a kept list of the same hash: when several threads meet a
    /// new list at once, each converts it and one copy is kept.
    pub(crate) fn get(&self, tools: &Value) -> Arc<ToolsEntry> {
        let hash = fingerprint(tools);
        if let Some(entry) = self.find(tools, hash) {
            return entry;
        }
        let bytes = held_bytes(tools);
        let keep = bytes <= MAX_ENTRY_BYTES;
        let entry = Arc::new(ToolsEntry::new(tools, hash, bytes, keep));
        if !keep {
            return entry;
        }
        let mut entries = self.lock();
        // Another thread may have kept the same list meanwhile: keep one.
        let same = entries
            .iter()
            .find(|e| e.hash == hash && e.is(tools))
            .cloned();
        if let Some(same) = same {
            drop(entries);
            self.refresh(&same);
            return same;
        }
        entries.insert(0, Arc::clone(&entry));
        let kept = entries.len().min(MAX_ENTRIES);
        let evicted = entries.split_off(kept);
        // The lock first, then the evicted lists (their memory is freed outside it).
        drop(entries);
        drop(evicted);
        entry
    }

    fn find(&self, tools: &Value, hash: u64) -> Option<Arc<ToolsEntry>> {
        let candidates: Vec<Arc<ToolsEntry>> = self
            .lock()
            .iter()
            .filter(|e| e.hash == hash)
            .cloned()
            .collect();
        let found = candidates.into_iter().find(|e| e.is(tools))?;
        self.refresh(&found);
        Some(found)
    }

    /// Moves `entry` to the front (most recently used), if it is still kept.
    fn refresh(&self, entry: &Arc<ToolsEntry>) {
        let mut entries = self.lock();
        if let Some(i) = entries.iter().position(|e| Arc::ptr_eq(e, entry)) {
            entries[..=i].rotate_right(1);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<ToolsEntry>>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

/// Equal JSON with object keys in the same order (`serde_json`'s `==` ignores the order; a
/// template prints keys in order) and numbers of the same representation: `serde_json` tells
/// `1` from `1.0` but not `0.0` from `-0.0`, which print differently.
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|((ka, va), (kb, vb))| ka == kb && same_json(va, vb))
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_json(p, q))
        }
        (Value::Number(x), Value::Number(y)) => {
            x == y && x.as_f64().map(f64::to_bits) == y.as_f64().map(f64::to_bits)
        }
        (Value::Object(_) | Value::Array(_) | Value::Number(_), _)
        | (_, Value::Object(_) | Value::Array(_) | Value::Number(_)) => false,
        (p, q) => p == q,
    }
}

/// About the memory `v` holds once kept: its JSON copy and its template values (an object's
/// `Arc`ed map and entries, an array's slots, each string twice).
fn held_bytes(v: &Value) -> usize {
    match v {
        Value::Object(m) => {
            192 + m
                .iter()
                .map(|(k, v)| 2 * k.len() + 96 + held_bytes(v))
                .sum::<usize>()
        }
        Value::Array(a) => 64 + a.iter().map(|v| 48 + held_bytes(v)).sum::<usize>(),
        Value::String(s) => 2 * s.len() + 32,
        _ => 16,
    }
}

/// A hash of `v` that tells apart what [`same_json`] tells apart (order, kinds, number bits).
fn fingerprint(v: &Value) -> u64 {
    fn feed(h: &mut xxhash_rust::xxh3::Xxh3, v: &Value) {
        match v {
            Value::Null => h.update(b"n"),
            Value::Bool(b) => h.update(if *b { b"t" } else { b"f" }),
            Value::Number(n) => {
                let (tag, bits) = match (n.as_u64(), n.as_i64(), n.as_f64()) {
                    (Some(u), _, _) => (b'u', u),
                    (None, Some(i), _) => (b'i', i.cast_unsigned()),
                    (None, None, f) => (b'd', f.unwrap_or(f64::NAN).to_bits()),
                };
                h.update(&[tag]);
                h.update(&bits.to_le_bytes());
            }
            Value::String(s) => {
                h.update(b"s");
                h.update(&(s.len() as u64).to_le_bytes());
                h.update(s.as_bytes());
            }
            Value::Array(a) => {
                h.update(b"a");
                h.update(&(a.len() as u64).to_le_bytes());
                a.iter().for_each(|v| feed(h, v));
            }
            Value::Object(m) => {
                h.update(b"o");
                h.update(&(m.len() as u64).to_le_bytes());
                for (k, v) in m {
                    h.update(&(k.len() as u64).to_le_bytes());
                    h.update(k.as_bytes());
                    feed(h, v);
                }
            }
        }
    }
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    feed(&mut h, v);
    h.digest()
}

thread_local! {
    /// The tool list of the render running on this thread, if it came from the cache.
    static CURRENT: RefCell<Option<Arc<ToolsEntry>>> = const { RefCell::new(None) };
}

/// While alive, `tojson` on this thread reuses and keeps its outputs for `entry`'s objects. It
/// restores the list of an enclosing render when dropped, and stays on its thread.
#[must_use = "the list is current only while the guard lives"]
pub(crate) struct RenderingWith {
    previous: Option<Arc<ToolsEntry>>,
    _this_thread: PhantomData<*const ()>,
}

impl RenderingWith {
    pub(crate) fn new(entry: Option<Arc<ToolsEntry>>) -> Self {
        Self {
            previous: CURRENT.with(|c| c.replace(entry)),
            _this_thread: PhantomData,
        }
    }
}

impl Drop for RenderingWith {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CURRENT.with(|c| *c.borrow_mut() = previous);
    }
}

/// Runs `f` with the current entry and `value`'s address when `value` is one of its objects.
fn with_known_object<R>(value: &MjValue, f: impl FnOnce(&ToolsEntry, usize) -> R) -> Option<R> {
    let addr = std::ptr::from_ref(value.downcast_object_ref::<MjMap>()?).addr();
    CURRENT.with(|c| {
        let current = c.borrow();
        let entry = current.as_deref()?;
        entry.objects.contains(&addr).then(|| f(entry, addr))
    })
}

/// What `tojson` printed before for `value` with `opts`, during a render with its list.
pub(crate) fn lookup(value: &MjValue, opts: &DumpOptions) -> Option<MjValue> {
    with_known_object(value, |entry, addr| {
        entry
            .lock_printed()
            .by_options
            .get(opts)
            .and_then(|m| m.get(&addr))
            .cloned()
    })
    .flatten()
}

/// Keeps `out`, what `tojson` printed for `value` with `opts`, when `value` is an object of the
/// current render's list and the list's budget has room.
pub(crate) fn store(value: &MjValue, opts: &DumpOptions, out: &MjValue) {
    with_known_object(value, |entry, addr| {
        let len = out.as_str().map_or(0, str::len) + PRINTED_OVERHEAD_BYTES;
        let mut printed = entry.lock_printed();
        if printed.bytes + len > entry.max_printed_bytes {
            return;
        }
        let by_addr = match printed.by_options.get_mut(opts) {
            Some(m) => m,
            None => printed.by_options.entry(opts.clone()).or_default(),
        };
        // Another thread may have printed it meanwhile: the same text, kept once.
        if let std::collections::hash_map::Entry::Vacant(slot) = by_addr.entry(addr) {
            slot.insert(out.clone());
            printed.bytes += len;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_and_number_representation_make_another_list() {
        let a = json!([{"name": "ls", "parameters": {"n": 1, "min": 0.0}}]);
        assert!(same_json(
            &a,
            &json!([{"name": "ls", "parameters": {"n": 1, "min": 0.0}}])
        ));
        for other in [
            json!([{"parameters": {"n": 1, "min": 0.0}, "name": "ls"}]),
            json!([{"name": "ls", "parameters": {"n": 1.0, "min": 0.0}}]),
            json!([{"name": "ls", "parameters": {"n": 1, "min": -0.0}}]),
            json!([{"name": "ls", "parameters": {"n": [1], "min": 0.0}}]),
            json!([{"name": "ls", "parameters": {"n": "1", "min": 0.0}}]),
            json!([{"name": "ls", "parameters": {"n": 1, "min": 0.0}}, 2]),
        ] {
            assert!(!same_json(&a, &other), "{other}");
        }
    }

    #[test]
    fn the_cache_keeps_the_last_used_lists() {
        let cache = ToolsCache::default();
        let list = |i: usize| json!([{ "name": format!("t{i}") }]);
        let first = cache.get(&list(0));
        assert!(Arc::ptr_eq(&first, &cache.get(&list(0))));
        let t1 = cache.get(&list(1));
        for i in 2..MAX_ENTRIES {
            cache.get(&list(i));
        }
        assert_eq!(cache.len(), MAX_ENTRIES);
        // t0 is used again, so t1 is now the least recently used and goes for a new list.
        cache.get(&list(0));
        cache.get(&list(MAX_ENTRIES));
        assert_eq!(cache.len(), MAX_ENTRIES);
        assert!(Arc::ptr_eq(&first, &cache.get(&list(0))), "t0 was kept");
        assert!(!Arc::ptr_eq(&t1, &cache.get(&list(1))), "t1 went");
        for big in [
            json!([{ "description": "x".repeat(MAX_ENTRY_BYTES) }]),
            // Short as text (~400 KB), but each object costs far more than its two bytes.
            Value::Array(vec![json!({}); 131_072]),
        ] {
            let a = cache.get(&big);
            assert!(
                !Arc::ptr_eq(&a, &cache.get(&big)),
                "a list past the bound is not kept"
            );
        }
        assert_eq!(cache.len(), MAX_ENTRIES);
    }

    #[test]
    fn threads_meeting_a_new_list_at_once_keep_one_entry() {
        let cache = ToolsCache::default();
        let tools: Value = (0..200)
            .map(|i| json!({"type": "function", "function": {"name": format!("t{i}"), "parameters": {"n": i}}}))
            .collect();
        let barrier = std::sync::Barrier::new(4);
        let got: Vec<Arc<ToolsEntry>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        cache.get(&tools)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(cache.len(), 1);
        let kept = cache.get(&tools);
        assert!(
            got.iter().all(|e| Arc::ptr_eq(e, &kept)),
            "every thread got the kept entry"
        );
    }

    #[test]
    fn equal_lists_hash_alike_and_the_differences_that_print_do_not() {
        let a = json!([{"name": "ls", "parameters": {"n": 1, "min": 0.0, "max": -3, "big": 18_446_744_073_709_551_615_u64}}]);
        let same: Value = serde_json::from_str(&a.to_string()).unwrap();
        assert_eq!(fingerprint(&a), fingerprint(&same));
        for other in [
            json!([{"parameters": {"n": 1, "min": 0.0, "max": -3, "big": 18_446_744_073_709_551_615_u64}, "name": "ls"}]),
            json!([{"name": "ls", "parameters": {"n": 1.0, "min": 0.0, "max": -3, "big": 18_446_744_073_709_551_615_u64}}]),
            json!([{"name": "ls", "parameters": {"n": 1, "min": -0.0, "max": -3, "big": 18_446_744_073_709_551_615_u64}}]),
            json!([{"name": "ls", "parameters": {"n": 1, "min": 0.0, "max": -3.0, "big": 18_446_744_073_709_551_615_u64}}]),
            json!([{"name": "ls", "parameters": {"n": "1", "min": 0.0, "max": -3, "big": 18_446_744_073_709_551_615_u64}}]),
        ] {
            assert_ne!(fingerprint(&a), fingerprint(&other), "{other}");
        }
    }

    #[test]
    fn the_lists_objects_are_the_maps_a_fresh_conversion_builds() {
        // What `tojson` recognises by address must be the type every JSON object becomes.
        let fresh = crate::json_to_value(&json!({"a": {"b": 1}}));
        assert!(fresh.downcast_object_ref::<MjMap>().is_some());
        let mut objects = HashSet::new();
        let ours = convert(&json!({"a": {"b": 1}}), &mut objects);
        assert_eq!(objects.len(), 2);
        assert_eq!(ours, fresh);
        assert_eq!(ours.to_string(), fresh.to_string());
    }

    #[test]
    fn only_the_current_lists_objects_are_remembered() {
        let cache = ToolsCache::default();
        let entry = cache.get(&json!([{"name": "ls"}]));
        let tool = entry.value().get_item_by_index(0).unwrap();
        let opts = DumpOptions::default();
        let out = |s: &str| MjValue::from_safe_string(s.to_owned());
        store(&tool, &opts, &out("outside"));
        assert_eq!(
            lookup(&tool, &opts),
            None,
            "no render with the list is running"
        );
        {
            let _outer = RenderingWith::new(Some(Arc::clone(&entry)));
            assert_eq!(
                lookup(&tool, &opts),
                None,
                "what was printed outside was not kept"
            );
            store(&tool, &opts, &out("printed"));
            assert_eq!(lookup(&tool, &opts), Some(out("printed")));
            let indented = DumpOptions {
                indent: Some("  ".into()),
                ..DumpOptions::default()
            };
            assert_eq!(
                lookup(&tool, &indented),
                None,
                "other options, other output"
            );
            // An equal object that is not the list's own is not taken for it.
            let other = crate::json_to_value(&json!({"name": "ls"}));
            assert_eq!(lookup(&other, &opts), None);
            {
                let _inner = RenderingWith::new(None);
                assert_eq!(
                    lookup(&tool, &opts),
                    None,
                    "an inner render without the list"
                );
            }
            assert_eq!(
                lookup(&tool, &opts),
                Some(out("printed")),
                "the outer list is back"
            );
        }
        assert_eq!(lookup(&tool, &opts), None, "the render ended");
    }

    #[test]
    fn what_is_printed_is_kept_up_to_the_lists_budget() {
        let cache = ToolsCache::default();
        let entry = cache.get(&json!([{"name": "a"}, {"name": "b"}]));
        let (a, b) = (
            entry.value().get_item_by_index(0).unwrap(),
            entry.value().get_item_by_index(1).unwrap(),
        );
        let opts = DumpOptions::default();
        let _rendering = RenderingWith::new(Some(Arc::clone(&entry)));
        let long =
            MjValue::from_safe_string("x".repeat(entry.max_printed_bytes - PRINTED_OVERHEAD_BYTES));
        store(&a, &opts, &long);
        assert_eq!(lookup(&a, &opts), Some(long));
        store(&b, &opts, &MjValue::from_safe_string("y".into()));
        assert_eq!(
            lookup(&b, &opts),
            None,
            "past the budget: printed each time"
        );
    }
}
