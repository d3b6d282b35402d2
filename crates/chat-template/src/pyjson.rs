//! Python's `json.dumps` and `repr(float)` for template values.
//!
//! transformers replaces Jinja's `tojson` filter with
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`; the bytes it
//! produces end up in the prompt, so they must match exactly: `", "`/`": "` separators, no HTML
//! escaping, Python's float repr (`1e-05`, `1e+16`, `5.0`) and insertion key order.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{Error, ErrorKind, Value};

use crate::dump_options::DumpOptions;

/// The `tojson` filter: `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`,
/// arguments positional or by keyword, as in transformers.
pub(crate) fn tojson_filter(
    value: &Value,
    args: Rest<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > NAMES.len() {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            format!(
                "tojson() takes at most {} arguments after the value",
                NAMES.len()
            ),
        ));
    }
    let mut picked: [Option<Value>; 4] = Default::default();
    // `x | tojson` (how chat templates print tools and arguments) names nothing: no lookups.
    let named = kwargs.args().next().is_some();
    for (i, name) in NAMES.iter().enumerate() {
        let by_name: Option<Value> = if named { kwargs.get(name)? } else { None };
        picked[i] = match (args.get(i), by_name) {
            (Some(_), Some(_)) => {
                return Err(Error::new(
                    ErrorKind::TooManyArguments,
                    format!("tojson() got multiple values for argument '{name}'"),
                ));
            }
            (p, k) => p.cloned().or(k),
        };
    }
    let [ensure_ascii, indent, separators, sort_keys] = picked;
    kwargs.assert_all_used()?;

    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => Some(indent_string(&v)?),
    };
    let (item_separator, key_separator) = match separators {
        Some(v) if !(v.is_none() || v.is_undefined()) => separator_pair(&v)?,
        _ if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        _ => (", ".to_owned(), ": ".to_owned()),
    };
    let opts = DumpOptions {
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        indent,
        item_separator,
        key_separator,
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
    };
    // A kept tool list's objects print what they printed before (`tools_cache`).
    if let Some(out) = crate::tools_cache::lookup(value, &opts) {
        return Ok(out);
    }
    let out = Value::from_safe_string(dumps(value, &opts)?);
    crate::tools_cache::store(value, &opts, &out);
    Ok(out)
}

/// Python's `indent`: an int is that many spaces (negative counts as zero), a string is used as is.
fn indent_string(v: &Value) -> Result<String, Error> {
    if let Some(s) = v.as_str() {
        return Ok(s.to_owned());
    }
    if v.is_integer() {
        let n = i64::try_from(v.clone())?;
        return Ok(" ".repeat(usize::try_from(n).unwrap_or(0)));
    }
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!(
            "tojson: indent must be an int or a string, not {}",
            v.kind()
        ),
    ))
}

fn separator_pair(v: &Value) -> Result<(String, String), Error> {
    let bad = || {
        Error::new(
            ErrorKind::InvalidOperation,
            "tojson: separators must be a pair of strings (item_separator, key_separator)",
        )
    };
    let items: Vec<Value> = v.try_iter().map_err(|_| bad())?.collect();
    match items.as_slice() {
        [a, b] => match (a.as_str(), b.as_str()) {
            (Some(a), Some(b)) => Ok((a.to_owned(), b.to_owned())),
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

/// `json.dumps(value, **opts)`.
pub(crate) fn dumps(value: &Value, opts: &DumpOptions) -> Result<String, Error> {
    let mut out = String::new();
    write_value(&mut out, value, opts, 0)?;
    Ok(out)
}

fn not_serializable(v: &Value) -> Error {
    let ty = match v.kind() {
        ValueKind::Undefined => "Undefined".to_owned(),
        ValueKind::Bytes => "bytes".to_owned(),
        ValueKind::Invalid => "invalid value".to_owned(),
        other => other.to_string(),
    };
    Error::new(
        ErrorKind::InvalidOperation,
        format!("Object of type {ty} is not JSON serializable"),
    )
}

fn write_value(out: &mut String, v: &Value, opts: &DumpOptions, level: usize) -> Result<(), Error> {
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, v, true)?,
        ValueKind::String => write_string(out, v.as_str().unwrap_or_default(), opts.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            write_array(out, &items, opts, level)?;
        }
        ValueKind::Map => {
            // The pairs as they come: no list of them and no copy of each key (the tools a
            // template prints with `tojson` on every render). With `sort_keys`, ordered by their
            // keys as strings first.
            let pairs: Box<dyn Iterator<Item = (Value, Value)> + '_> =
                match v.as_object().and_then(|o| o.try_iter_pairs()) {
                    Some(it) => it,
                    None => {
                        let keys: Vec<Value> = v.try_iter()?.collect();
                        let mut pairs = Vec::with_capacity(keys.len());
                        for k in keys {
                            let item = v.get_item(&k)?;
                            pairs.push((k, item));
                        }
                        Box::new(pairs.into_iter())
                    }
                };
            if opts.sort_keys {
                let mut keyed: Vec<(String, Value)> = pairs
                    .map(|(k, v)| Ok((key_string(&k)?, v)))
                    .collect::<Result<_, Error>>()?;
                keyed.sort_by(|a, b| a.0.cmp(&b.0));
                let keyed = keyed.into_iter().map(|(k, v)| (Value::from(k), v));
                write_pairs(out, keyed, opts, level)?;
            } else {
                write_pairs(out, pairs, opts, level)?;
            }
        }
        _ => return Err(not_serializable(v)),
    }
    Ok(())
}

fn newline_indent(out: &mut String, indent: &str, level: usize) {
    out.push('\n');
    for _ in 0..level {
        out.push_str(indent);
    }
}

fn write_array(
    out: &mut String,
    items: &[Value],
    opts: &DumpOptions,
    level: usize,
) -> Result<(), Error> {
    if items.is_empty() {
        out.push_str("[]");
        return Ok(());
    }
    out.push('[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&opts.item_separator);
        }
        if let Some(ind) = &opts.indent {
            newline_indent(out, ind, level + 1);
        }
        write_value(out, item, opts, level + 1)?;
    }
    if let Some(ind) = &opts.indent {
        newline_indent(out, ind, level);
    }
    out.push(']');
    Ok(())
}

/// An object's pairs, in the order given.
fn write_pairs(
    out: &mut String,
    pairs: impl Iterator<Item = (Value, Value)>,
    opts: &DumpOptions,
    level: usize,
) -> Result<(), Error> {
    let mut any = false;
    for (key, item) in pairs {
        if any {
            out.push_str(&opts.item_separator);
        } else {
            out.push('{');
        }
        any = true;
        if let Some(ind) = &opts.indent {
            newline_indent(out, ind, level + 1);
        }
        match key.as_str() {
            Some(k) if key.kind() == ValueKind::String => write_string(out, k, opts.ensure_ascii),
            _ => write_string(out, &key_string(&key)?, opts.ensure_ascii),
        }
        out.push_str(&opts.key_separator);
        write_value(out, &item, opts, level + 1)?;
    }
    if !any {
        out.push_str("{}");
        return Ok(());
    }
    if let Some(ind) = &opts.indent {
        newline_indent(out, ind, level);
    }
    out.push('}');
    Ok(())
}

/// Python converts `str`, `int`, `float`, `bool` and `None` keys to strings; anything else is a TypeError.
fn key_string(k: &Value) -> Result<String, Error> {
    match k.kind() {
        ValueKind::String => Ok(k.as_str().unwrap_or_default().to_owned()),
        ValueKind::None => Ok("null".to_owned()),
        ValueKind::Bool => Ok(if k.is_true() { "true" } else { "false" }.to_owned()),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, k, true)?;
            Ok(s)
        }
        other => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("keys must be str, int, float, bool or None, not {other}"),
        )),
    }
}

/// Writes a number: integers as they are, floats as Python's `repr` (JSON spelling of the
/// non-finite values when `json` is set, Python's `str` spelling otherwise).
fn write_number(out: &mut String, v: &Value, json: bool) -> Result<(), Error> {
    if v.is_integer() {
        let _ = write!(out, "{v}");
    } else {
        let f = f64::try_from(v.clone())?;
        out.push_str(&float_repr(f, json));
    }
    Ok(())
}

/// Python's `repr(float)` (shortest round-trip digits; scientific notation when the decimal exponent
/// is below -4 or at least 16; `.0` on integral values). With `json` set, non-finite values are
/// spelt `NaN`/`Infinity`/`-Infinity` as `json.dumps` does, else `nan`/`inf`/`-inf`.
pub(crate) fn float_repr(f: f64, json: bool) -> String {
    if f.is_nan() {
        return if json { "NaN" } else { "nan" }.to_owned();
    }
    if f.is_infinite() {
        return match (json, f.is_sign_negative()) {
            (true, false) => "Infinity",
            (true, true) => "-Infinity",
            (false, false) => "inf",
            (false, true) => "-inf",
        }
        .to_owned();
    }
    // Rust's `{:e}` gives the shortest round-trip digits, e.g. "-1.2345e-7", "1e16", "0e0".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (neg, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let mut out = String::with_capacity(digits.len() + 8);
    if neg {
        out.push('-');
    }
    if !(-4..16).contains(&exp) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(
            out,
            "e{}{:02}",
            if exp < 0 { '-' } else { '+' },
            exp.unsigned_abs()
        );
    } else if exp < 0 {
        out.push_str("0.");
        for _ in 0..(-exp - 1) {
            out.push('0');
        }
        out.push_str(&digits);
    } else {
        let int_len = usize::try_from(exp).unwrap_or(0) + 1;
        if digits.len() <= int_len {
            out.push_str(&digits);
            for _ in digits.len()..int_len {
                out.push('0');
            }
            out.push_str(".0");
        } else {
            out.push_str(&digits[..int_len]);
            out.push('.');
            out.push_str(&digits[int_len..]);
        }
    }
    out
}

/// A JSON string literal as Python writes it.
fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.reserve(s.len() + 2);
    if !ensure_ascii {
        // Runs of characters written as they are (everything but `"`, `\\` and the controls)
        // are copied whole.
        out.push('"');
        let mut rest = s;
        while let Some(i) = rest
            .bytes()
            .position(|b| b < 0x20 || b == b'"' || b == b'\\')
        {
            out.push_str(&rest[..i]);
            // An ASCII byte: `i` and `i + 1` are character boundaries.
            write_escaped_char(out, char::from(rest.as_bytes()[i]));
            rest = &rest[i + 1..];
        }
        out.push_str(rest);
        out.push('"');
        return;
    }
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !(' '..='~').contains(&c) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `"`, `\\` or a control character, escaped as `json.dumps` does.
fn write_escaped_char(out: &mut String, c: char) {
    match c {
        '"' => out.push_str("\\\""),
        '\\' => out.push_str("\\\\"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\u{08}' => out.push_str("\\b"),
        '\u{0c}' => out.push_str("\\f"),
        c => {
            let _ = write!(out, "\\u{:04x}", c as u32);
        }
    }
}

/// Writes a value the way Jinja2 prints it for the cases where minijinja differs: floats use
/// Python's `str(float)`. Everything else goes through minijinja's default formatter.
pub(crate) fn python_formatter(
    out: &mut minijinja::Output,
    state: &mut minijinja::State,
    value: &Value,
) -> Result<(), Error> {
    if value.kind() == ValueKind::Number && !value.is_integer() {
        let f = f64::try_from(value.clone())?;
        out.write_str(&float_repr(f, false))
            .map_err(|_| Error::from(ErrorKind::WriteFailure))
    } else {
        minijinja::escape_formatter(out, state, value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The writer as it was before objects were written pair by pair and strings run by run:
    /// the reference the faster one is checked against.
    mod reference {
        use super::super::{DumpOptions, key_string, newline_indent, write_number};
        use minijinja::value::ValueKind;
        use minijinja::{Error, Value};
        use std::fmt::Write as _;

        pub fn dumps(v: &Value, opts: &DumpOptions) -> Result<String, Error> {
            let mut out = String::new();
            value(&mut out, v, opts, 0)?;
            Ok(out)
        }

        fn value(
            out: &mut String,
            v: &Value,
            opts: &DumpOptions,
            level: usize,
        ) -> Result<(), Error> {
            match v.kind() {
                ValueKind::None => out.push_str("null"),
                ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
                ValueKind::Number => write_number(out, v, true)?,
                ValueKind::String => string(out, v.as_str().unwrap_or_default(), opts.ensure_ascii),
                ValueKind::Seq | ValueKind::Iterable => {
                    let items: Vec<Value> = v.try_iter()?.collect();
                    if items.is_empty() {
                        out.push_str("[]");
                        return Ok(());
                    }
                    out.push('[');
                    for (i, item) in items.iter().enumerate() {
                        if i > 0 {
                            out.push_str(&opts.item_separator);
                        }
                        if let Some(ind) = &opts.indent {
                            newline_indent(out, ind, level + 1);
                        }
                        value(out, item, opts, level + 1)?;
                    }
                    if let Some(ind) = &opts.indent {
                        newline_indent(out, ind, level);
                    }
                    out.push(']');
                }
                ValueKind::Map => {
                    let pairs: Vec<(Value, Value)> = v
                        .as_object()
                        .and_then(|o| o.try_iter_pairs())
                        .unwrap()
                        .collect();
                    if pairs.is_empty() {
                        out.push_str("{}");
                        return Ok(());
                    }
                    let mut pairs: Vec<(String, Value)> = pairs
                        .into_iter()
                        .map(|(k, v)| Ok((key_string(&k)?, v)))
                        .collect::<Result<_, Error>>()?;
                    if opts.sort_keys {
                        pairs.sort_by(|a, b| a.0.cmp(&b.0));
                    }
                    out.push('{');
                    for (i, (key, item)) in pairs.iter().enumerate() {
                        if i > 0 {
                            out.push_str(&opts.item_separator);
                        }
                        if let Some(ind) = &opts.indent {
                            newline_indent(out, ind, level + 1);
                        }
                        string(out, key, opts.ensure_ascii);
                        out.push_str(&opts.key_separator);
                        value(out, item, opts, level + 1)?;
                    }
                    if let Some(ind) = &opts.indent {
                        newline_indent(out, ind, level);
                    }
                    out.push('}');
                }
                _ => return Err(Error::from(minijinja::ErrorKind::InvalidOperation)),
            }
            Ok(())
        }

        fn string(out: &mut String, s: &str, ensure_ascii: bool) {
            out.push('"');
            for c in s.chars() {
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    '\u{08}' => out.push_str("\\b"),
                    '\u{0c}' => out.push_str("\\f"),
                    c if (c as u32) < 0x20 => {
                        let _ = write!(out, "\\u{:04x}", c as u32);
                    }
                    c if ensure_ascii && !(' '..='~').contains(&c) => {
                        let mut buf = [0u16; 2];
                        for unit in c.encode_utf16(&mut buf) {
                            let _ = write!(out, "\\u{unit:04x}");
                        }
                    }
                    c => out.push(c),
                }
            }
            out.push('"');
        }
    }

    fn json() -> impl Strategy<Value = serde_json::Value> {
        let text = prop_oneof![
            "[a-z \"\\\\\n\r\t\u{0}\u{1}\u{8}\u{c}\u{1f}\u{7f}é😀<>&']{0,12}",
            any::<String>(),
        ];
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            (-1e6f64..1e6).prop_map(serde_json::Value::from),
            text.clone().prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(4, 64, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
                prop::collection::vec((text.clone(), inner), 0..6)
                    .prop_map(|kv| { serde_json::Value::Object(kv.into_iter().collect()) }),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Any value, with every combination of `tojson`'s options, is written byte for byte as
        /// the reference writer writes it.
        #[test]
        fn the_writer_writes_what_the_reference_writes(
            v in json(),
            ensure_ascii in any::<bool>(),
            indent in prop::option::of(prop::sample::select(&["", "  ", "\t"][..])),
            compact in any::<bool>(),
            sort_keys in any::<bool>(),
        ) {
            let v = crate::json_to_value(&v);
            let (item_separator, key_separator) = if compact {
                (",".to_owned(), ":".to_owned())
            } else {
                (", ".to_owned(), ": ".to_owned())
            };
            let opts = DumpOptions {
                ensure_ascii,
                indent: indent.map(str::to_owned),
                item_separator,
                key_separator,
                sort_keys,
            };
            prop_assert_eq!(dumps(&v, &opts).unwrap(), reference::dumps(&v, &opts).unwrap());
        }
    }

    /// Keys that are not strings are converted as Python converts them, in both writers.
    #[test]
    fn non_string_keys_are_written_as_python_writes_them() {
        let map: std::collections::BTreeMap<Value, Value> = [
            (Value::from(7), Value::from("a")),
            (Value::from(true), Value::from(2)),
            (Value::from(()), Value::from(1.5)),
            (Value::from("k\"ey"), Value::from(())),
        ]
        .into_iter()
        .collect();
        let v = Value::from(map);
        let opts = DumpOptions {
            ensure_ascii: false,
            indent: None,
            item_separator: ", ".into(),
            key_separator: ": ".into(),
            sort_keys: false,
        };
        let written = dumps(&v, &opts).unwrap();
        assert_eq!(written, reference::dumps(&v, &opts).unwrap());
        for pair in [
            r#""7": "a""#,
            r#""true": 2"#,
            r#""null": 1.5"#,
            r#""k\"ey": null"#,
        ] {
            assert!(written.contains(pair), "{written}");
        }
    }

    #[test]
    fn float_repr_matches_python() {
        let cases: &[(f64, &str)] = &[
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (5.0, "5.0"),
            (1.5, "1.5"),
            (0.1, "0.1"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (9999999999999998.0, "9999999999999998.0"),
            (1e15, "1000000000000000.0"),
            (1e9, "1000000000.0"),
            (123.456, "123.456"),
            (-2.5, "-2.5"),
            (1e100, "1e+100"),
            (1e-100, "1e-100"),
            (f64::MAX, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
            (0.30000000000000004, "0.30000000000000004"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(*f, true), *want, "repr({f:e})");
        }
        assert_eq!(float_repr(f64::NAN, true), "NaN");
        assert_eq!(float_repr(f64::INFINITY, true), "Infinity");
        assert_eq!(float_repr(f64::NEG_INFINITY, false), "-inf");
    }

    #[test]
    fn strings_escape_like_python() {
        let mut s = String::new();
        write_string(&mut s, "a\"b\\c\n\t\u{1}<>&'é😀\u{7f}", false);
        assert_eq!(s, "\"a\\\"b\\\\c\\n\\t\\u0001<>&'é😀\u{7f}\"");
        let mut s = String::new();
        write_string(&mut s, "é😀\u{7f}", true);
        assert_eq!(s, "\"\\u00e9\\ud83d\\ude00\\u007f\"");
    }
}
