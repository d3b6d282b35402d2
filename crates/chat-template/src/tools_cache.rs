//! The request's `tools` as template values, kept for the next renders with the same tools, and
//! what `tojson` printed of them.
//!
//! An agent sends the same tool list with every request, and every turn is rendered at least twice
//! (prompt and prompt + response): converting the list into template values and printing each
//! tool with `tojson` was ~4.5 % of the proxy's CPU in the agent benchmark, for the same bytes
//! every time. [`ToolsCache`] keeps the converted list of the last few distinct tool lists (found
//! again by an order-sensitive comparison of the JSON, so a list whose keys come in another order
//! is another list, as it renders differently). While a render uses a cached list,
//! [`RenderingWith`] makes its `tojson` outputs reusable: `tojson` of one of the list's objects
//! with the same options prints what it printed before. An object is recognised by its address,
//! which is sound because the entry keeps every object of its list alive (no other object can
//! have that address while the entry is in use) and template values cannot be changed. What a
//! template sees is unchanged: the same values that a fresh conversion gives, with no object type
//! of our own.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use indexmap::IndexMap;
use minijinja::Value as MjValue;
use serde_json::Value;

use crate::dump_options::DumpOptions;

/// Distinct tool lists kept (least recently used out first).
pub(crate) const MAX_ENTRIES: usize = 8;
/// A tool list larger than this (its JSON text, about) is converted for each render, not kept.
pub(crate) const MAX_ENTRY_BYTES: usize = 1 << 20;

/// The map type a JSON object becomes (what `Value::from_pairs` builds with `preserve_order`),
/// named so that `tojson` can find the objects of a cached list by address.
type MjMap = IndexMap<MjValue, MjValue>;

/// One tool list: its JSON, its template value, and the `tojson` outputs of its objects.
#[derive(Debug)]
pub(crate) struct ToolsEntry {
    json: Value,
    value: MjValue,
    /// Addresses of the list's objects (each one's map, alive as long as `value`).
    objects: HashSet<usize>,
    printed: Mutex<HashMap<(usize, DumpOptions), String>>,
}

impl ToolsEntry {
    fn new(json: &Value) -> Self {
        let mut objects = HashSet::new();
        let value = convert(json, &mut objects);
        Self {
            json: json.clone(),
            value,
            objects,
            printed: Mutex::new(HashMap::new()),
        }
    }

    /// The list as a template value.
    pub(crate) fn value(&self) -> &MjValue {
        &self.value
    }

    fn printed(&self) -> std::sync::MutexGuard<'_, HashMap<(usize, DumpOptions), String>> {
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
                objects.insert(std::ptr::from_ref(m) as usize);
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
    /// The entry for `tools`: a kept one with the same JSON (keys in the same order), else a new
    /// one, kept unless it is larger than [`MAX_ENTRY_BYTES`].
    pub(crate) fn get(&self, tools: &Value) -> Arc<ToolsEntry> {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = entries.iter().position(|e| same_json(&e.json, tools)) {
            let entry = entries.remove(i);
            entries.insert(0, Arc::clone(&entry));
            return entry;
        }
        let entry = Arc::new(ToolsEntry::new(tools));
        if json_bytes(tools) <= MAX_ENTRY_BYTES {
            entries.insert(0, Arc::clone(&entry));
            entries.truncate(MAX_ENTRIES);
        }
        entry
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// Equal JSON with object keys in the same order (`serde_json`'s `==` ignores the order; a
/// template prints keys in order). Numbers compare as `serde_json` holds them, so `1` and `1.0`
/// differ, as they print.
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
        (Value::Object(_) | Value::Array(_), _) | (_, Value::Object(_) | Value::Array(_)) => false,
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

/// While alive, `tojson` on this thread reuses and keeps its outputs for `entry`'s objects.
pub(crate) struct RenderingWith {
    previous: Option<Arc<ToolsEntry>>,
}

impl RenderingWith {
    pub(crate) fn new(entry: Option<Arc<ToolsEntry>>) -> Self {
        Self {
            previous: CURRENT.with(|c| c.replace(entry)),
        }
    }
}

impl Drop for RenderingWith {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CURRENT.with(|c| *c.borrow_mut() = previous);
    }
}

/// The address of `value`'s map when it is one of the current entry's objects.
fn known_object(value: &MjValue) -> Option<(Arc<ToolsEntry>, usize)> {
    let map = value.downcast_object_ref::<MjMap>()?;
    let addr = std::ptr::from_ref(map) as usize;
    let entry = CURRENT.with(|c| c.borrow().clone())?;
    entry.objects.contains(&addr).then_some((entry, addr))
}

/// What `tojson` printed before for `value` with `opts`, during a render with its list.
pub(crate) fn printed(value: &MjValue, opts: &DumpOptions) -> Option<String> {
    let (entry, addr) = known_object(value)?;
    entry.printed().get(&(addr, opts.clone())).cloned()
}

/// Keeps what `tojson` printed for `value` with `opts`, when `value` is an object of the current
/// render's list.
pub(crate) fn remember(value: &MjValue, opts: &DumpOptions, out: &str) {
    if let Some((entry, addr)) = known_object(value) {
        entry.printed().insert((addr, opts.clone()), out.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_and_number_kind_make_another_list() {
        let a = json!([{"name": "ls", "parameters": {"n": 1}}]);
        assert!(same_json(
            &a,
            &json!([{"name": "ls", "parameters": {"n": 1}}])
        ));
        assert!(!same_json(
            &a,
            &json!([{"parameters": {"n": 1}, "name": "ls"}])
        ));
        assert!(!same_json(
            &a,
            &json!([{"name": "ls", "parameters": {"n": 1.0}}])
        ));
        assert!(!same_json(
            &a,
            &json!([{"name": "ls", "parameters": {"n": [1]}}])
        ));
        assert!(!same_json(
            &a,
            &json!([{"name": "ls", "parameters": {"n": 1}}, 2])
        ));
    }

    #[test]
    fn the_cache_keeps_the_last_lists_and_finds_them_again() {
        let cache = ToolsCache::default();
        let first = cache.get(&json!([{"name": "t0"}]));
        assert!(Arc::ptr_eq(&first, &cache.get(&json!([{"name": "t0"}]))));
        for i in 1..=MAX_ENTRIES {
            cache.get(&json!([{ "name": format!("t{i}") }]));
        }
        assert_eq!(cache.len(), MAX_ENTRIES);
        // t0 was the least recently used: it went, and comes back as a new entry.
        assert!(!Arc::ptr_eq(&first, &cache.get(&json!([{"name": "t0"}]))));
        let big = json!([{ "description": "x".repeat(MAX_ENTRY_BYTES) }]);
        let a = cache.get(&big);
        assert!(
            !Arc::ptr_eq(&a, &cache.get(&big)),
            "a list past the bound is not kept"
        );
    }

    #[test]
    fn only_the_current_lists_objects_are_remembered() {
        let cache = ToolsCache::default();
        let entry = cache.get(&json!([{"name": "ls"}]));
        let tool = entry.value().get_item_by_index(0).unwrap();
        let opts = DumpOptions::default();
        remember(&tool, &opts, "outside");
        assert_eq!(
            printed(&tool, &opts),
            None,
            "no render with the list is running"
        );
        {
            let _rendering = RenderingWith::new(Some(Arc::clone(&entry)));
            remember(&tool, &opts, "printed");
            assert_eq!(printed(&tool, &opts).as_deref(), Some("printed"));
            let indented = DumpOptions {
                indent: Some("  ".into()),
                ..DumpOptions::default()
            };
            assert_eq!(
                printed(&tool, &indented),
                None,
                "other options, other output"
            );
            // An equal object that is not the list's own is not taken for it.
            let other = crate::json_to_value(&json!({"name": "ls"}));
            assert_eq!(printed(&other, &opts), None);
        }
        assert_eq!(printed(&tool, &opts), None, "the render ended");
    }
}
