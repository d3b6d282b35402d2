//! The options of Python's `json.dumps` that the `tojson` filter exposes: what `pyjson.rs` prints
//! with, and part of what `tools_cache.rs` keeps a printed tool under.

/// Options of `json.dumps` that the `tojson` filter exposes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct DumpOptions {
    pub ensure_ascii: bool,
    /// `None`: everything on one line; `Some(s)`: one item per line, indented by `s` per level.
    pub indent: Option<String>,
    pub item_separator: String,
    pub key_separator: String,
    pub sort_keys: bool,
}

impl Default for DumpOptions {
    fn default() -> Self {
        Self {
            ensure_ascii: false,
            indent: None,
            item_separator: ", ".into(),
            key_separator: ": ".into(),
            sort_keys: false,
        }
    }
}
