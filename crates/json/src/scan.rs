//! One pass over a non-streamed answer's bytes: it checks that they are what a tree parse accepts
//! and records where the parts the proxy reads are, as offsets, so that nothing is read again to
//! find them: the top-level entries, the elements of `choices`, and each object choice's entries.
//! Every other value is skipped in the same pass (validated, not built).
//!
//! What the pass cannot decide alone it flags instead of guessing (the answer then goes through a
//! tree parse, as [`crate::needs_tree_check`] sends other text): a `\u` escape of a UTF-16
//! surrogate that is not a valid pair, and a number that may be out of an `f64`'s range (an
//! exponent of three digits or more, or more than 200 characters). Nesting deeper than
//! [`DEPTH`] stops the pass (serde_json refuses from 128 levels on).
//!
//! The recorded entries follow `serde_json::Map` with `preserve_order`, as [`crate::RawObject`]
//! does: a repeated key keeps its first position and its last value.

use std::ops::Range;

use crate::Keyed;

/// Nesting the pass follows before it leaves the text to a tree parse.
pub const DEPTH: usize = 100;

/// A value of the answer: where its text is, and what the pass recorded inside it.
#[derive(Debug, Clone)]
pub struct Node {
    pub span: Range<usize>,
    pub sub: Sub,
}

/// What the pass recorded inside a value.
#[derive(Debug, Clone)]
pub enum Sub {
    /// Nothing (a value it only skipped).
    Leaf,
    Object(Obj),
    Array(Vec<Node>),
}

/// An object's entries in order, their values as [`Node`]s.
#[derive(Debug, Clone, Default)]
pub struct Obj(Keyed<Box<str>, Node>);

/// An object without entries (a choice that is not an object reads as one).
pub static EMPTY: Obj = Obj(Keyed::new());

impl Obj {
    fn insert(&mut self, key: Box<str>, value: Node) {
        self.0.insert(key, value);
    }

    pub fn get(&self, key: &str) -> Option<&Node> {
        self.0.get(key)
    }

    pub fn entries(&self) -> impl Iterator<Item = (&str, &Node)> {
        self.0.iter().map(|(k, v)| (&**k, v))
    }
}

/// Why the pass stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fail {
    /// Not JSON a tree parse accepts, or JSON whose top is not an object.
    Refused,
    /// Nested deeper than the pass follows.
    Deep,
}

/// The answer's top-level object, and whether a tree parse must confirm it (see the module).
pub fn answer(bytes: &[u8], depth: usize) -> Result<(Obj, bool), Fail> {
    let mut s = Scanner {
        b: bytes,
        i: 0,
        depth: 0,
        max_depth: depth,
        unsure: false,
    };
    s.ws();
    if s.peek() != Some(b'{') {
        return Err(Fail::Refused);
    }
    let top = s.object(|s, key| match key {
        "choices" => s.choices(),
        _ => s.leaf(),
    })?;
    s.ws();
    if s.i != bytes.len() {
        return Err(Fail::Refused);
    }
    Ok((top, s.unsure))
}

struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
    depth: usize,
    max_depth: usize,
    unsure: bool,
}

/// Bytes that end a run of plain string content: the closing quote, an escape, a control
/// character (which a tree parse refuses unescaped).
static STRING_STOP: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 0x20 {
        t[c] = true;
        c += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

impl Scanner<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    fn expect(&mut self, c: u8) -> Result<(), Fail> {
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(Fail::Refused)
        }
    }

    fn enter(&mut self) -> Result<(), Fail> {
        self.depth += 1;
        if self.depth > self.max_depth {
            return Err(Fail::Deep);
        }
        Ok(())
    }

    /// `choices`: an array's elements recorded, each object's entries too.
    fn choices(&mut self) -> Result<Node, Fail> {
        if self.peek() != Some(b'[') {
            return self.leaf();
        }
        let start = self.i;
        let elems = self.array(|s| {
            if s.peek() != Some(b'{') {
                return s.leaf();
            }
            let start = s.i;
            let obj = s.object(|s, _| s.leaf())?;
            Ok(Node {
                span: start..s.i,
                sub: Sub::Object(obj),
            })
        })?;
        Ok(Node {
            span: start..self.i,
            sub: Sub::Array(elems),
        })
    }

    fn leaf(&mut self) -> Result<Node, Fail> {
        let start = self.i;
        self.value()?;
        Ok(Node {
            span: start..self.i,
            sub: Sub::Leaf,
        })
    }

    /// An object (at its `{`), each entry's value read by `value`.
    fn object(
        &mut self,
        mut value: impl FnMut(&mut Self, &str) -> Result<Node, Fail>,
    ) -> Result<Obj, Fail> {
        let mut obj = Obj::default();
        self.each_entry(|s, key, escaped| {
            let key: Box<str> = if escaped {
                serde_json::from_slice::<String>(&s.b[key])
                    .map_err(|_| Fail::Refused)?
                    .into()
            } else {
                std::str::from_utf8(&s.b[key.start + 1..key.end - 1])
                    .map_err(|_| Fail::Refused)?
                    .into()
            };
            let node = value(s, &key)?;
            obj.insert(key, node);
            Ok(())
        })?;
        Ok(obj)
    }

    /// An array (at its `[`), each element read by `elem`.
    fn array(
        &mut self,
        mut elem: impl FnMut(&mut Self) -> Result<Node, Fail>,
    ) -> Result<Vec<Node>, Fail> {
        let mut out = Vec::new();
        self.each_elem(false, |s| {
            out.push(elem(s)?);
            Ok(())
        })?;
        Ok(out)
    }

    /// Walks an object (at its `{`): each key's text (quotes included) and whether it holds an
    /// escape go to `entry`, which reads the value after the colon.
    fn each_entry(
        &mut self,
        mut entry: impl FnMut(&mut Self, Range<usize>, bool) -> Result<(), Fail>,
    ) -> Result<(), Fail> {
        self.enter()?;
        self.i += 1;
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            self.depth -= 1;
            return Ok(());
        }
        loop {
            self.ws();
            if self.peek() != Some(b'"') {
                return Err(Fail::Refused);
            }
            let start = self.i;
            let escaped = self.string()?;
            let key = start..self.i;
            self.ws();
            self.expect(b':')?;
            self.ws();
            entry(self, key, escaped)?;
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    self.depth -= 1;
                    return Ok(());
                }
                _ => return Err(Fail::Refused),
            }
        }
    }

    /// Walks an array (at its `[`), each element read by `elem`; with `ints`, a run of plain
    /// integers is first checked in one loop ([`Self::int_elements`]), and `elem` reads from the
    /// first element of another shape.
    fn each_elem(
        &mut self,
        ints: bool,
        mut elem: impl FnMut(&mut Self) -> Result<(), Fail>,
    ) -> Result<(), Fail> {
        self.enter()?;
        self.i += 1;
        self.ws();
        if self.peek() == Some(b']') {
            self.i += 1;
            self.depth -= 1;
            return Ok(());
        }
        if ints && self.int_elements() {
            self.depth -= 1;
            return Ok(());
        }
        loop {
            self.ws();
            elem(self)?;
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b']') => {
                    self.i += 1;
                    self.depth -= 1;
                    return Ok(());
                }
                _ => return Err(Fail::Refused),
            }
        }
    }

    /// Skips one value (at its first byte), checking it.
    fn value(&mut self) -> Result<(), Fail> {
        match self.peek() {
            Some(b'"') => self.string().map(|_| ()),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b'{') => self.each_entry(|s, _, _| s.value()),
            Some(b'[') => self.each_elem(true, Self::value),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            _ => Err(Fail::Refused),
        }
    }

    /// The elements of an array (at its first element) while they are plain integers without
    /// whitespace, `12,0,345`: the shape of the engine's 10,000–20,000 prompt ids, checked in
    /// one tight loop. Returns `true` past the closing `]`; otherwise stops at the first byte of
    /// the first element of another shape (a sign, a fraction, an exponent, a leading zero,
    /// whitespace, 200 digits or more, any other value), where the general loop takes over, so
    /// what is accepted is exactly what [`Self::value`] accepts.
    fn int_elements(&mut self) -> bool {
        let b = self.b;
        let mut i = self.i;
        loop {
            let elem = i;
            match b.get(i) {
                Some(b'0') => i += 1,
                Some(b'1'..=b'9') => {
                    i += 1;
                    while let Some(b'0'..=b'9') = b.get(i) {
                        i += 1;
                    }
                }
                _ => {
                    self.i = elem;
                    return false;
                }
            }
            if i - elem >= 200 {
                self.i = elem;
                return false;
            }
            match b.get(i) {
                Some(b',') => i += 1,
                Some(b']') => {
                    self.i = i + 1;
                    return true;
                }
                _ => {
                    self.i = elem;
                    return false;
                }
            }
        }
    }

    fn literal(&mut self, lit: &[u8]) -> Result<(), Fail> {
        if self.b[self.i..].starts_with(lit) {
            self.i += lit.len();
            Ok(())
        } else {
            Err(Fail::Refused)
        }
    }

    /// A number (at its first byte): JSON's grammar; flags one that may be out of range.
    fn number(&mut self) -> Result<(), Fail> {
        let start = self.i;
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek() {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(Fail::Refused),
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(Fail::Refused);
            }
            self.digits();
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(Fail::Refused);
            }
            let exp = self.i;
            self.digits();
            if self.i - exp >= 3 {
                self.unsure = true;
            }
        }
        if self.i - start > 200 {
            self.unsure = true;
        }
        Ok(())
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
    }

    /// A string (at its opening quote); whether it holds an escape.
    fn string(&mut self) -> Result<bool, Fail> {
        self.i += 1;
        let mut escaped = false;
        loop {
            let run = self.b[self.i..]
                .iter()
                .position(|&c| STRING_STOP[usize::from(c)])
                .ok_or(Fail::Refused)?;
            self.i += run;
            match self.b[self.i] {
                b'"' => {
                    self.i += 1;
                    return Ok(escaped);
                }
                b'\\' => {
                    escaped = true;
                    self.escape()?;
                }
                _ => return Err(Fail::Refused),
            }
        }
    }

    /// An escape (at its backslash).
    fn escape(&mut self) -> Result<(), Fail> {
        match self.b.get(self.i + 1) {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                self.i += 2;
                Ok(())
            }
            Some(b'u') => {
                let unit = self.hex4(self.i + 2).ok_or(Fail::Refused)?;
                match unit {
                    0xD800..=0xDBFF
                        if self.b.get(self.i + 6) == Some(&b'\\')
                            && self.b.get(self.i + 7) == Some(&b'u')
                            && self
                                .hex4(self.i + 8)
                                .is_some_and(|low| (0xDC00..=0xDFFF).contains(&low)) =>
                    {
                        // A valid pair (an emoji from an `ensure_ascii` writer).
                        self.i += 12;
                    }
                    0xD800..=0xDFFF => {
                        self.unsure = true;
                        self.i += 6;
                    }
                    _ => self.i += 6,
                }
                Ok(())
            }
            _ => Err(Fail::Refused),
        }
    }

    fn hex4(&self, at: usize) -> Option<u32> {
        let digits = self.b.get(at..at + 4)?;
        digits.iter().try_fold(0u32, |n, &c| {
            let d = char::from(c).to_digit(16)?;
            Some(n * 16 + d)
        })
    }
}
