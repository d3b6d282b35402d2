//! `tojson` must be Python's `json.dumps` as transformers calls it; expected strings come from
//! CPython 3.11's `json.dumps`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::render_kwargs;
use serde_json::{Value, json};

const INPUT: &str = r#"{"b": 1, "a": [1.0, 1e-05, 1e+16, 1000000000.0, 5.0, 0.1, -0.0, 12345678901234567890, -3], "z": {"html": "<b>&'\"</b>", "uni": "é中文😀", "ctl": "a\nb\t\u0001\\"}, "t": true, "f": false, "n": null, "e": [], "o": {}}"#;

fn input() -> Value {
    json!({ "x": serde_json::from_str::<Value>(INPUT).unwrap() })
}

#[test]
fn default_is_python_json_dumps() {
    // Floats in Python repr, unicode kept, no HTML escaping, insertion order, ", " and ": ".
    assert_eq!(render_kwargs("{{ x | tojson }}", input()).unwrap(), INPUT);
}

#[test]
fn indent_matches_python() {
    let want = r#"{
  "b": 1,
  "a": [
    1.0,
    1e-05,
    1e+16,
    1000000000.0,
    5.0,
    0.1,
    -0.0,
    12345678901234567890,
    -3
  ],
  "z": {
    "html": "<b>&'\"</b>",
    "uni": "é中文😀",
    "ctl": "a\nb\t\u0001\\"
  },
  "t": true,
  "f": false,
  "n": null,
  "e": [],
  "o": {}
}"#;
    assert_eq!(
        render_kwargs("{{ x | tojson(indent=2) }}", input()).unwrap(),
        want
    );
    let tab = "{\n\t\"a\": [\n\t\t1,\n\t\t{\n\t\t\t\"b\": []\n\t\t}\n\t]\n}";
    assert_eq!(
        render_kwargs(
            "{{ {'a': [1, {'b': []}]} | tojson(indent='\t') }}",
            json!({})
        )
        .unwrap(),
        tab
    );
}

#[test]
fn ensure_ascii_sort_keys_and_separators() {
    let want = r#"{"a":[1.0,1e-05,1e+16,1000000000.0,5.0,0.1,-0.0,12345678901234567890,-3],"b":1,"e":[],"f":false,"n":null,"o":{},"t":true,"z":{"ctl":"a\nb\t\u0001\\","html":"<b>&'\"</b>","uni":"\u00e9\u4e2d\u6587\ud83d\ude00"}}"#;
    let got = render_kwargs(
        "{{ x | tojson(ensure_ascii=true, sort_keys=true, separators=(',', ':')) }}",
        input(),
    )
    .unwrap();
    assert_eq!(got, want);
    // Positional arguments follow transformers' signature: ensure_ascii, indent, separators, sort_keys.
    let got = render_kwargs("{{ x | tojson(true, none, (',', ':'), true) }}", input()).unwrap();
    assert_eq!(got, want);
}

#[test]
fn html_characters_are_not_escaped() {
    let got = render_kwargs(
        "{{ s | tojson }}",
        json!({"s": "<tool_call> & 'x' </tool_call>"}),
    )
    .unwrap();
    assert_eq!(got, r#""<tool_call> & 'x' </tool_call>""#);
}

#[test]
fn nested_key_order_is_insertion_order() {
    let got = render_kwargs(
        "{{ x | tojson }}",
        json!({"x": {"zeta": {"y": 1, "b": [{"k2": 2, "k1": 1}]}, "alpha": "a", "mid": 2.5}}),
    )
    .unwrap();
    assert_eq!(
        got,
        r#"{"zeta": {"y": 1, "b": [{"k2": 2, "k1": 1}]}, "alpha": "a", "mid": 2.5}"#
    );
}

#[test]
fn template_literals_and_loop_values_serialise() {
    let got = render_kwargs(
        "{{ {'a': 1.5, 'b': none, 'c': true, 'd': [1, 'x']} | tojson }}",
        json!({}),
    )
    .unwrap();
    assert_eq!(got, r#"{"a": 1.5, "b": null, "c": true, "d": [1, "x"]}"#);
}

#[test]
fn undefined_is_not_serialisable() {
    let err = render_kwargs("{{ missing | tojson }}", json!({})).unwrap_err();
    assert!(err.to_string().contains("not JSON serializable"), "{err}");
}

#[test]
fn printed_floats_use_python_str() {
    let got = render_kwargs(
        "{{ a }} {{ b }} {{ c }} {{ d }} {{ 0.00001 }} {{ 3 }}",
        json!({"a": 5.0, "b": 1e16, "c": 1e-5, "d": 0.25}),
    )
    .unwrap();
    assert_eq!(got, "5.0 1e+16 1e-05 0.25 1e-05 3");
}

/// Keyword arguments `json.dumps` does not take, and an argument given both by position and by
/// name, are errors (as Python's TypeError), whether or not other keywords were passed.
#[test]
fn unknown_and_repeated_arguments_are_refused() {
    for template in [
        "{{ x | tojson(colour=1) }}",
        "{{ x | tojson(indent=2, colour=1) }}",
        "{{ x | tojson(true, ensure_ascii=true) }}",
        "{{ x | tojson(1, 2, 3, 4, 5) }}",
    ] {
        let e = render_kwargs(template, input()).expect_err(template);
        assert!(!e.to_string().is_empty(), "{template}");
    }
    let e = render_kwargs("{{ x | tojson(true, ensure_ascii=true) }}", input()).unwrap_err();
    assert!(e.to_string().contains("multiple values"), "{e}");
}

/// The tools of a request are kept converted, and `tojson` of their objects is printed once per
/// option set (`tools_cache.rs`): what a render prints must stay what the same template prints
/// for the same list without the cache, for every option set, list and nesting level, however
/// often the same list comes back and whatever ran between.
#[test]
fn tools_print_the_same_from_the_cache_of_converted_lists() {
    // `alt`: the same lists given as a template variable instead of as tools, so that the
    // expected text is printed without the cache.
    const TEMPLATE: &str = "{% for t in (tools or alt) %}[{{ t | tojson }}|{{ t | tojson(indent=2) }}|\
        {{ t.function | tojson(sort_keys=true) }}|{{ t.function.parameters | tojson(separators=(',', ':')) }}]\
        {% endfor %}{{ (tools or alt) | tojson }}";
    let tool = |name: &str, extra: Value| {
        json!({"type": "function", "function": {"name": name, "description": "é \"q\" <b>",
            "parameters": {"type": "object", "z": 1.0, "a": [1e-05, 2], "x": extra}}})
    };
    let lists = [
        json!([
            tool("ls", json!(null)),
            tool("cat", json!({"deep": [1, {"k": "v"}]}))
        ]),
        // The same tools, one key order changed: prints differently, so it is another list.
        json!([tool("ls", json!(null)), {"function": tool("cat", json!({"deep": [1, {"k": "v"}]}))["function"], "type": "function"}]),
        // The same shape, one number of another kind.
        json!([
            tool("ls", json!(null)),
            tool("cat", json!({"deep": [1.0, {"k": "v"}]}))
        ]),
        // Zero and negative zero: equal to `serde_json`, printed differently.
        json!([tool("ls", json!(0.0))]),
        json!([tool("ls", json!(-0.0))]),
    ];
    let cached = common::with_template(TEMPLATE).unwrap();
    let fresh_render =
        |tools: &Value| common::render_kwargs(TEMPLATE, json!({ "alt": tools })).unwrap();
    let want: Vec<String> = lists.iter().map(fresh_render).collect();
    assert_ne!(want[0], want[1]);
    assert_ne!(want[0], want[2]);
    assert_ne!(want[3], want[4]);
    for round in 0..3 {
        for (i, tools) in lists.iter().enumerate() {
            for generation_prompt in [true, false] {
                let got = cached
                    .render(&[], Some(tools), generation_prompt, None)
                    .unwrap();
                assert_eq!(got, want[i], "list {i}, round {round}");
            }
        }
    }
    // Past the number of lists kept: the first lists were evicted and come back converted anew.
    for n in 0..10 {
        let tools = json!([tool(&format!("t{n}"), json!(n))]);
        assert_eq!(
            cached.render(&[], Some(&tools), false, None).unwrap(),
            fresh_render(&tools)
        );
    }
    for (i, tools) in lists.iter().enumerate() {
        assert_eq!(
            cached.render(&[], Some(tools), false, None).unwrap(),
            want[i]
        );
    }
}
