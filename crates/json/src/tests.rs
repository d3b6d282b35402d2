//! Unit tests of the raw reader: the same entries, values and refusals as `serde_json`'s tree.

use super::*;
use proptest::prelude::*;

const KEYS: &[&str] = &["a", "b", "messages", "role", "content", "tools"];

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// What the raw reading accepts (with its tree check) is what a tree parse accepts, and
    /// it reads the same entries in the same order (first place, last value).
    #[test]
    fn raw_and_tree_accept_and_read_alike(text in text_gen::object(KEYS)) {
        let tree = serde_json::from_str::<serde_json::Value>(&text);
        let raw = RawObject::parse(&text)
            .ok()
            .filter(|_| !needs_tree_check(text.as_bytes()) || tree.is_ok());
        prop_assert_eq!(raw.is_some(), tree.is_ok(), "{}", text);
        if let (Some(raw), Ok(tree)) = (raw, tree) {
            let tree = tree.as_object().expect("an object");
            let raw_keys: Vec<&str> = raw.entries().map(|(k, _)| k).collect();
            let tree_keys: Vec<&str> = tree.keys().map(String::as_str).collect();
            prop_assert_eq!(raw_keys, tree_keys, "{}", &text);
            for (k, v) in raw.entries() {
                prop_assert_eq!(Some(&to_value(v)), tree.get(k), "{}", &text);
                prop_assert_eq!(raw.get(k).map(RawValue::get), Some(v.get()));
                if let Some(s) = tree.get(k).and_then(serde_json::Value::as_str) {
                    let read = as_str(v);
                    prop_assert_eq!(read.as_deref(), Some(s));
                }
            }
        }
    }
}

/// An element of an id list as text: mostly ids, sometimes what must not read as one.
fn id_text() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => (0u32..200_000).prop_map(|n| n.to_string()),
        2 => any::<u32>().prop_map(|n| n.to_string()),
        1 => prop::sample::select(
            &[
                "0", "4294967295", "4294967296", "18446744073709551615",
                "18446744073709551616", "99999999999999999999999", "-0", "-1", "01", "00",
                "1.0", "1.5", "1e2", "1E+0", "0e0", "-0.0", "null", "true", "\"7\"", "[1]",
                "{}",
            ][..]
        )
        .prop_map(str::to_owned),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// The id reader reads exactly what serde reads as `Vec<u32>`, and refuses what it refuses.
    #[test]
    fn ids_read_as_serde_reads_them(
        elems in prop::collection::vec((id_text(), 0usize..5, 0usize..5), 0..40),
        inner in 0usize..5,
    ) {
        let ws = ["", " ", "\n", "\t\r ", "  \n  "];
        let body: Vec<String> = elems
            .iter()
            .map(|(e, a, b)| format!("{}{e}{}", ws[*a], ws[*b]))
            .collect();
        let text = if body.is_empty() {
            format!("[{}]", ws[inner])
        } else {
            format!("[{}]", body.join(","))
        };
        let want = serde_json::from_str::<Vec<u32>>(&text).ok();
        prop_assert_eq!(as_ids_text(&text), want.clone(), "{}", &text);
        if let Ok(raw) = RawValue::from_string(text.clone()) {
            prop_assert_eq!(as_ids(&raw), want, "{}", &text);
        }
    }
}

#[test]
fn repeated_keys_keep_the_first_place_and_the_last_value() {
    let o = RawObject::parse(r#"{"a":1,"b":{"x":[1,2]},"a":"z","c":null}"#).expect("object");
    let keys: Vec<_> = o.entries().map(|(k, v)| (k.to_owned(), v.get())).collect();
    assert_eq!(
        keys,
        [
            ("a".to_owned(), "\"z\""),
            ("b".to_owned(), "{\"x\":[1,2]}"),
            ("c".to_owned(), "null")
        ]
    );
    assert!(o.contains_key("c"));
    assert!(o.get("d").is_none());
    let mut out = Vec::new();
    write_object(
        &mut out,
        &o,
        |k, _| match k {
            "b" => Edit::Drop,
            "c" => Edit::Replace(Cow::Borrowed(b"[]")),
            _ => Edit::Keep,
        },
        &[("d\"", b"1")],
    );
    assert_eq!(
        String::from_utf8(out).expect("utf-8"),
        r#"{"a":"z","c":[],"d\"":1}"#
    );
}

/// Many keys (found through the index) keep the same semantics: first place, last value.
#[test]
fn a_large_object_keeps_map_semantics() {
    let n = 100_000;
    let mut text = String::from("{");
    for i in 0..n {
        text.push_str(&format!("\"k{i}\":{i},"));
    }
    // Every tenth key again, with another value; an escaped spelling of k5.
    for i in (0..n).step_by(10) {
        text.push_str(&format!("\"k{i}\":\"again\","));
    }
    text.push_str(r#""\u006b5":"escaped"}"#);
    let o = RawObject::parse(&text).expect("object");
    assert_eq!(o.len(), n);
    let keys: Vec<String> = o.entries().map(|(k, _)| k.to_owned()).collect();
    assert_eq!(keys, (0..n).map(|i| format!("k{i}")).collect::<Vec<_>>());
    assert_eq!(o.get("k0").map(RawValue::get), Some("\"again\""));
    assert_eq!(o.get("k1").map(RawValue::get), Some("1"));
    assert_eq!(o.get("k5").map(RawValue::get), Some("\"escaped\""));
    assert_eq!(o.get("k99990").map(RawValue::get), Some("\"again\""));
    assert!(o.get("k100000").is_none());
    let small = RawObject::from_entries(
        o.entries()
            .take(3)
            .map(|(k, v)| (Cow::Owned(k.to_owned()), v)),
    );
    assert_eq!(small.len(), 3);
}

#[test]
fn what_a_tree_parse_refuses_is_sent_to_one() {
    assert!(!needs_tree_check(br#"{"a": ["\u00e9 [[[", {"b": "\"}"}]}"#));
    assert!(needs_tree_check(br#"{"a": "\ud800"}"#));
    assert!(needs_tree_check(br#"{"a": "\uDC00"}"#));
    // A valid pair (an emoji escaped by an `ensure_ascii` client) needs no tree; a high
    // surrogate not followed by a low one, or a low one first, does.
    assert!(!needs_tree_check(
        br#"{"a": "\ud83d\ude00 and \uD83D\uDE01"}"#
    ));
    assert!(needs_tree_check(br#"{"a": "\ud83d\ud83d"}"#));
    assert!(needs_tree_check(br#"{"a": "\ud83d x"}"#));
    assert!(needs_tree_check(br#"{"a": "\ud83d"}"#));
    assert!(needs_tree_check(br#"{"a": "\ude00\ud83d"}"#));
    assert!(needs_tree_check(br#"{"a": "\ud83d\ude00\ude00"}"#));
    // An escaped backslash before `ud800` is text, not an escape.
    assert!(!needs_tree_check(br#"{"a": "\\ud800"}"#));
    assert!(needs_tree_check("[".repeat(101).as_bytes()));
    assert!(!needs_tree_check("[".repeat(100).as_bytes()));
    for out_of_range in [
        "1e400",
        "-1e400",
        "[1E+400]",
        r#"{"a":2.5e-999}"#,
        r#"{"a": [1, 1e308]}"#,
    ] {
        assert!(needs_tree_check(out_of_range.as_bytes()), "{out_of_range}");
    }
    let long = format!("[{}]", "9".repeat(400));
    assert!(needs_tree_check(long.as_bytes()));
    for in_range in [
        r#"{"a": [1, -2.5, 1e10, 3E-7, true, false, null]}"#,
        r#"{"a": "1e400 9999e999"}"#,
        "12345",
    ] {
        assert!(!needs_tree_check(in_range.as_bytes()), "{in_range}");
    }
}

#[test]
fn lenient_readers_follow_value_semantics() {
    let raw = |s: &str| RawValue::from_string(s.to_owned()).expect("json");
    assert_eq!(as_u64(&raw("5")), Some(5));
    assert_eq!(as_u64(&raw("5.0")), None);
    assert_eq!(as_u64(&raw("-1")), None);
    assert_eq!(as_u64(&raw("\"5\"")), None);
    assert_eq!(as_ids(&raw("[1,2]")), Some(vec![1, 2]));
    assert_eq!(as_ids(&raw("[1,4294967296]")), None);
    assert_eq!(as_ids(&raw("[1,\"2\"]")), None);
    assert_eq!(as_str(&raw(r#""a\nb""#)).as_deref(), Some("a\nb"));
    assert_eq!(as_str(&raw("1")), None);
    assert!(matches!(
        as_str(&raw(r#""plain é""#)),
        Some(Cow::Borrowed("plain é"))
    ));
    assert_eq!(as_str(&raw(r#""""#)).as_deref(), Some(""));
    assert_eq!(as_str(&raw(r#""\u00e9\"""#)).as_deref(), Some("é\""));
    assert_eq!(as_bool(&raw("true")), Some(true));
    let l: Vec<Lax<f64>> =
        serde_json::from_str(r#"[1, -2.5, "x", null, [1], {"a": 1}]"#).expect("lenient");
    let got: Vec<_> = l.into_iter().map(|x| x.0).collect();
    assert_eq!(got, [Some(1.0), Some(-2.5), None, None, None, None]);
    let s: Vec<Lax<String>> =
        serde_json::from_str(r#"["a\u00e9", 1, null, {"x": "y"}]"#).expect("lenient");
    let got: Vec<_> = s.into_iter().map(|x| x.0).collect();
    assert_eq!(got, [Some("aé".to_owned()), None, None, None]);
}
