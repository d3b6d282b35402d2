//! `logprobs.content[]` read straight from the text of an answer that was already checked: each
//! entry's `token` and `logprob`, every other value (its `bytes`, its `top_logprobs`) stepped over
//! by its brackets and quotes instead of parsed again.
//!
//! The text comes from an answer the single pass ([`crate::scan`]) or a tree parse accepted, or
//! from a stream chunk a tree parse accepted, so it is JSON; what this reader does not take in
//! stride (an escaped key, text that ends early) it leaves to the serde reader beside it in
//! [`crate::assemble`], which reads the same entries (the property tests hold the two to the same
//! results). The token's text and the log-prob are read as that reader reads them: a string with
//! escapes by `serde_json` itself, a number by the standard library (both round to the nearest
//! `f64`), a value of any other type as none.

use ps_core::SampledToken;

/// Appends the entries of `logprobs` (an object's text) with a numeric log-prob to `out`, as the
/// serde reader would; `None` (with `out` as it was) for text it leaves to that reader.
pub(crate) fn push(logprobs: &str, out: &mut Vec<SampledToken>) -> Option<()> {
    let before = out.len();
    let read = Reader {
        b: logprobs.as_bytes(),
        text: logprobs,
        i: 0,
    }
    .logprobs(out);
    if read.is_none() {
        out.truncate(before);
    }
    read
}

struct Reader<'a> {
    b: &'a [u8],
    text: &'a str,
    i: usize,
}

impl Reader<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    /// The top object: the last `content` decides, as in a tree (an earlier one's entries are
    /// taken back out of `out`).
    fn logprobs(&mut self, out: &mut Vec<SampledToken>) -> Option<()> {
        let before = out.len();
        self.ws();
        self.each_entry(|r, key| {
            if key != "content" {
                return r.skip();
            }
            out.truncate(before);
            if r.peek()? == b'[' {
                r.content(out)
            } else {
                r.skip()
            }
        })?;
        self.ws();
        (self.i == self.b.len()).then_some(())
    }

    /// The entries of `content` (at its `[`), past its `]`.
    fn content(&mut self, out: &mut Vec<SampledToken>) -> Option<()> {
        self.i += 1;
        self.ws();
        if self.peek()? == b']' {
            self.i += 1;
            return Some(());
        }
        loop {
            self.ws();
            if self.peek()? == b'{' {
                let (token, logprob) = self.entry()?;
                if let Some(logprob) = logprob {
                    out.push(SampledToken {
                        token: token.unwrap_or_default(),
                        id: None,
                        logprob,
                    });
                }
            } else {
                // Not an object: an entry without a log-prob.
                self.skip()?;
            }
            self.ws();
            match self.peek()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// One entry (at its `{`), past its `}`: its token's text and its log-prob, the last of each
    /// key winning.
    fn entry(&mut self) -> Option<(Option<String>, Option<f64>)> {
        let (mut token, mut logprob) = (None, None);
        self.each_entry(|r, key| {
            match key {
                "token" => token = r.string()?,
                "logprob" => logprob = r.number()?,
                _ => {}
            }
            r.skip()
        })?;
        Some((token, logprob))
    }

    /// Walks an object (at its `{`), past its `}`: each key goes to `value`, which reads on from
    /// the value's first byte and steps past it. An escaped key ends the read (`None`: the serde
    /// reader reads the text).
    fn each_entry(&mut self, mut value: impl FnMut(&mut Self, &str) -> Option<()>) -> Option<()> {
        if self.peek()? != b'{' {
            return None;
        }
        self.i += 1;
        self.ws();
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(());
        }
        loop {
            self.ws();
            if self.peek()? != b'"' {
                return None;
            }
            let start = self.i + 1;
            let end = self.string_end()?;
            let key = self.text.get(start..end - 1)?;
            if key.contains('\\') {
                return None;
            }
            self.i = end;
            self.ws();
            if self.peek()? != b':' {
                return None;
            }
            self.i += 1;
            self.ws();
            value(self, key)?;
            self.ws();
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// The string at the cursor (not moved), as `serde_json` reads it: `Some(None)` for a value of
    /// another type, `None` for one it refuses.
    fn string(&self) -> Option<Option<String>> {
        if self.peek()? != b'"' {
            return Some(None);
        }
        let end = self.string_end()?;
        let inner = self.text.get(self.i + 1..end - 1)?;
        if inner.contains('\\') {
            serde_json::from_str::<String>(self.text.get(self.i..end)?)
                .ok()
                .map(Some)
        } else {
            Some(Some(inner.to_owned()))
        }
    }

    /// The number at the cursor (not moved), as `serde_json` reads it into an `f64`: `Some(None)`
    /// for a value of another type, `None` for a number it refuses (out of an `f64`'s range).
    fn number(&self) -> Option<Option<f64>> {
        if !matches!(self.peek()?, b'-' | b'0'..=b'9') {
            return Some(None);
        }
        let text = self.text.get(self.i..self.scalar_end())?;
        // A JSON number: `serde_json` (with `float_roundtrip`) and the standard library both give
        // the nearest `f64` (integers too, however long); past an `f64`'s range `serde_json`
        // refuses what the standard library reads as infinite.
        text.parse::<f64>().ok().filter(|v| v.is_finite()).map(Some)
    }

    /// Past the string starting at the cursor's `"`: the index after its closing quote. (A loop,
    /// not `memchr`: the strings here are a token's few bytes.)
    fn string_end(&self) -> Option<usize> {
        let mut i = self.i + 1;
        loop {
            match *self.b.get(i)? {
                b'"' => return Some(i + 1),
                b'\\' => i += 2,
                _ => i += 1,
            }
        }
    }

    /// Past a number or a literal at the cursor.
    fn scalar_end(&self) -> usize {
        let rest = &self.b[self.i.min(self.b.len())..];
        self.i
            + rest
                .iter()
                .position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\n' | b'\t' | b'\r'))
                .unwrap_or(rest.len())
    }

    /// Steps past the value at the cursor (by its quotes and brackets: the text is JSON).
    fn skip(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => self.i = self.string_end()?,
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    // Straight over what is neither a quote nor a bracket.
                    while !STRUCTURAL[usize::from(*self.b.get(self.i)?)] {
                        self.i += 1;
                    }
                    match self.b[self.i] {
                        b'"' => {
                            self.i = self.string_end()?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        _ => {
                            depth -= 1;
                            if depth == 0 {
                                self.i += 1;
                                return Some(());
                            }
                        }
                    }
                    self.i += 1;
                }
            }
            _ => self.i = self.scalar_end(),
        }
        Some(())
    }
}

/// The bytes [`Reader::skip`] stops at inside an array or object: a quote and the brackets.
static STRUCTURAL: [bool; 256] = {
    let mut t = [false; 256];
    t[b'"' as usize] = true;
    t[b'{' as usize] = true;
    t[b'}' as usize] = true;
    t[b'[' as usize] = true;
    t[b']' as usize] = true;
    t
};

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KEYS: &[&str] = &["content", "token", "logprob", "bytes", "top_logprobs"];

    /// What the serde reader reads from `text`, the log-probs as bits (so that `-0.0` and `0.0`
    /// differ).
    fn by_serde(text: &str) -> Result<Vec<(String, u64)>, String> {
        let mut out = Vec::new();
        crate::assemble::push_logprob_entries_serde(text, &mut out).map_err(|e| e.to_string())?;
        Ok(bits(&out))
    }

    fn bits(tokens: &[SampledToken]) -> Vec<(String, u64)> {
        tokens
            .iter()
            .map(|t| (t.token.clone(), t.logprob.to_bits()))
            .collect()
    }

    /// A log-prob as the engines write it, or an edge of what a number reads as.
    fn logprob() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => (-30.0f64..0.0).prop_map(|f| f.to_string()),
            2 => any::<f64>().prop_map(|f| serde_json::Number::from_f64(f)
                .map_or_else(|| "-0.5".to_owned(), |n| n.to_string())),
            2 => prop::sample::select(&[
                "0", "-0", "0.0", "-0.0", "-1", "5", "18446744073709551616",
                "-9223372036854775809", "1e-400", "-2.5e-999", "1e308", "-1.7976931348623157e308",
                "4.9e-324", "2.2250738585072011e-308", "-3.0000000000000004e-5", "1E2",
                "-1.5e+1", "null", "\"-1.0\"", "true", "[]", "{}",
            ][..]).prop_map(str::to_owned),
        ]
    }

    /// A token as text: plain, with escapes, or of another type.
    fn token() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => "[a-zA-Z0-9 ]{0,6}".prop_map(|s| format!("\"{s}\"")),
            2 => ".{0,4}".prop_map(|s| serde_json::to_string(&s).unwrap_or_default()),
            1 => prop::sample::select(&[
                r#""\n""#, r#""\"""#, r#""\\""#, r#""\u00e9t\u00E9""#, r#""\ud83d\ude00""#,
                r#""a\/b""#, "null", "7", "[\"x\"]",
            ][..]).prop_map(str::to_owned),
        ]
    }

    /// An entry: its keys in any order (sometimes repeated, sometimes with other values).
    fn entry() -> impl Strategy<Value = String> {
        let part = prop_oneof![
            3 => token().prop_map(|t| ("token", t)),
            3 => logprob().prop_map(|l| ("logprob", l)),
            1 => "[a-z]{0,4}".prop_map(|s| ("bytes", format!("{:?}", s.as_bytes()))),
            1 => (token(), logprob()).prop_map(|(t, l)| ("top_logprobs",
                format!(r#"[{{"token":{t},"bytes":[1, 2],"logprob":{l}}}, {{"x":"]}}"}}]"#))),
            1 => crate::raw::text_gen::value(KEYS).prop_map(|v| ("top_logprobs", v)),
        ];
        let ws = prop::sample::select(&["", " ", "\n  "][..]);
        (prop::collection::vec((part, ws.clone()), 0..6), ws).prop_map(|(parts, w)| {
            let body: Vec<String> = parts
                .into_iter()
                .map(|((k, v), a)| format!("{a}\"{k}\"{a}:{a}{v}{a}"))
                .collect();
            format!("{{{w}{}}}", body.join(","))
        })
    }

    /// `logprobs` as text: `content` arrays of entries (sometimes two `content` keys, or another
    /// value under it), other keys beside.
    fn logprobs() -> impl Strategy<Value = String> {
        let content = prop_oneof![
            6 => prop::collection::vec(
                prop_oneof![8 => entry(), 1 => crate::raw::text_gen::value(KEYS)], 0..8)
                .prop_map(|e| format!("[{}]", e.join(", "))),
            1 => crate::raw::text_gen::value(KEYS),
        ];
        let other = crate::raw::text_gen::value(KEYS);
        prop::collection::vec(
            prop_oneof![
                4 => content.prop_map(|c| format!("\"content\":{c}")),
                1 => other.prop_map(|v| format!("\"refusal\": {v}")),
                1 => Just(r#""\u0063ontent":[]"#.to_owned()),
            ],
            0..3,
        )
        .prop_map(|parts| format!("{{{}}}", parts.join(",")))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

        /// On text a tree parse accepts (what this reader is given), it reads what the serde
        /// reader reads, or leaves the text to it (`out` untouched).
        #[test]
        fn reads_what_the_serde_reader_reads(text in logprobs()) {
            prop_assume!(serde_json::from_str::<serde_json::Value>(&text).is_ok());
            let mut out = vec![SampledToken { token: "before".into(), id: Some(1), logprob: -1.0 }];
            match push(&text, &mut out) {
                Some(()) => prop_assert_eq!(Ok(bits(&out[1..])), by_serde(&text), "{}", &text),
                None => prop_assert_eq!(out.len(), 1, "{}", &text),
            }
        }
    }

    /// The entries the engines send are read here, not left to serde: every token, escapes,
    /// a `bytes` list and a top list with brackets inside its strings stepped over.
    #[test]
    fn engine_entries_are_read_without_serde() {
        let text = r#"{"content": [
            {"token":"Hi","bytes":[72,105],"logprob":-0.0001234,"top_logprobs":[{"token":"Hi","bytes":[72,105],"logprob":-0.0001234}]},
            {"token":"\n\"}]","bytes":[10],"logprob":-2.5e-3,"top_logprobs":[{"token":"]}","logprob":-3}]},
            {"token":"<|im_end|>","logprob":0,"top_logprobs":[]},
            {"token":"x","logprob":null},
            {"logprob":-1.0}
        ], "refusal": null}"#;
        let mut out = Vec::new();
        assert_eq!(push(text, &mut out), Some(()));
        assert_eq!(bits(&out), by_serde(text).unwrap());
        let read: Vec<(&str, f64)> = out.iter().map(|t| (t.token.as_str(), t.logprob)).collect();
        assert_eq!(
            read,
            [
                ("Hi", -0.0001234),
                ("\n\"}]", -2.5e-3),
                ("<|im_end|>", 0.0),
                ("", -1.0)
            ]
        );
    }

    /// An escaped key and a number past an `f64`'s range go to serde (which decides).
    #[test]
    fn what_it_does_not_read_goes_to_serde() {
        for text in [
            r#"{"\u0063ontent":[{"token":"a","logprob":-1.0}]}"#,
            r#"{"content":[{"token":"a","logprob":-1.5e400}]}"#,
            r#"{"content":[{"token":"a","logprob":-1.0}]"#,
        ] {
            let mut out = Vec::new();
            assert_eq!(push(text, &mut out), None, "{text}");
            assert!(out.is_empty());
        }
    }
}
