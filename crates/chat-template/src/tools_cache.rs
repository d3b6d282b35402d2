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
/// A tool list larger than this (its JSON text, about) is converted for each turn, not kept.
const MAX_ENTRY_BYTES: usize = 256 * 1024;
/// `tojson` outputs kept per list, in bytes of text: twice the list's own text (every object
/// printed with two option sets, or the list and each of its tools), and at least this.
const MIN_PRINTED_BYTES: usize = 64 * 1024;

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
    value: MjValue,
    /// Addresses of the list's objects (each one's map, alive as long as `value`).
    objects: HashSet<usize>,
    printed: Mutex<Printed>,
    max_printed_bytes: usize,
}

impl ToolsEntry {
    /// `json` converted; `keep`: the entry keeps a copy of `json` to be found again by.
    fn new(json: &Value, bytes: usize, keep: bool) -> Self {
        let mut objects = HashSet::new();
        let value = convert(json, &mut objects);
        Self {
            json: keep.then(|| json.clone()),
            value,
            objects,
            printed: Mutex::new(Printed::default()),
            max_printed_bytes: (2 * bytes).max(MIN_PRINTED_BYTES),
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
    /// The entry for `tools`: a kept one with the same JSON, else a new one, kept unless it is
    /// larger than [`MAX_ENTRY_BYTES`]. Lists are converted outside the lock, so renders of other
    /// lists do not wait for a conversion.
    pub(crate) fn get(&self, tools: &Value) -> Arc<ToolsEntry> {
        let bytes = json_bytes(tools);
        if bytes > MAX_ENTRY_BYTES {
            return Arc::new(ToolsEntry::new(tools, bytes, false));
        }
        if let Some(entry) = self.find(tools) {
            return entry;
        }
        let entry = Arc::new(ToolsEntry::new(tools, bytes, true));
        let evicted = {
            let mut entries = self.lock();
            // Another thread may have converted the same list meanwhile: keep one.
            if let Some(i) = entries.iter().position(|e| e.is(tools)) {
                entries[..=i].rotate_right(1);
                return Arc::clone(&entries[0]);
            }
            entries.insert(0, Arc::clone(&entry));
            let kept = entries.len().min(MAX_ENTRIES);
            entries.split_off(kept)
        };
        drop(evicted);
        entry
    }

    fn find(&self, tools: &Value) -> Option<Arc<ToolsEntry>> {
        let mut entries = self.lock();
        let i = entries.iter().position(|e| e.is(tools))?;
        entries[..=i].rotate_right(1);
        Some(Arc::clone(&entries[0]))
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

/// About the size of `v` as JSON text (strings and keys, plus a few bytes per value).
fn json_bytes(v: &Value) -> usize {
    match v {
        Value::Object(m) => m.iter().map(|(k, v)| k.len() + 4 + json_bytes(v)).sum(),
        Value::Array(a) => a.iter().map(|v| 2 + json_bytes(v)).sum(),
        Value::String(s) => s.len() + 2,
        _ => 8,
    }
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
        let len = out.as_str().map_or(0, str::len);
        let mut printed = entry.lock_printed();
        if printed.bytes + len > entry.max_printed_bytes {
            return;
        }
        let by_addr = match printed.by_options.get_mut(opts) {
            Some(m) => m,
            None => printed.by_options.entry(opts.clone()).or_default(),
        };
        if by_addr.insert(addr, out.clone()).is_none() {
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
        let big = json!([{ "description": "x".repeat(MAX_ENTRY_BYTES) }]);
        let a = cache.get(&big);
        assert!(
            !Arc::ptr_eq(&a, &cache.get(&big)),
            "a list past the bound is not kept"
        );
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
        let long = MjValue::from_safe_string("x".repeat(entry.max_printed_bytes));
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
