//! Writing a dotted key (`server.port`) into a figment dictionary, creating the tables on the way:
//! how the environment, command-line and trainer-file layers are built. A leaf.

use figment::value::{Dict, Value};

/// Inserts `value` at the dotted `key`, replacing any non-table value on the path with a table.
pub(crate) fn insert_path(dict: &mut Dict, key: &str, value: Value) {
    let mut parts = key.split('.').peekable();
    let mut current = dict;
    while let Some(part) = parts.next() {
        if parts.peek().is_none() {
            current.insert(part.to_owned(), value);
            return;
        }
        let entry = current
            .entry(part.to_owned())
            .or_insert_with(|| Value::from(Dict::new()));
        if !matches!(entry, Value::Dict(..)) {
            *entry = Value::from(Dict::new());
        }
        match entry {
            Value::Dict(_, inner) => current = inner,
            _ => return,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn insert_path_nests() {
        let mut d = Dict::new();
        insert_path(&mut d, "a.b", Value::from(1u16));
        insert_path(&mut d, "a.c", Value::from("x"));
        let a = d.get("a").and_then(|v| v.as_dict()).unwrap();
        assert_eq!(a.len(), 2);
    }
}
