//! Reading a chat answer as the chat path writes it: the fields the doors use of a whole answer
//! ([`ChatAnswer`]) and of a streamed one's chunks ([`Chunk`]), read with borrowed strings; the
//! stream's server-sent events ([`SseReader`]: any byte boundaries, LF or CRLF, several `data:`
//! lines); tool-call deltas keyed whatever the engine writes as their index ([`ToolKeys`]).

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

/// A chunk's or an answer's token counts (engines may write `null`).
#[derive(Debug, Deserialize, Default, Clone, Copy)]
pub(crate) struct Usage {
    #[serde(default, deserialize_with = "crate::null_as_default")]
    pub prompt_tokens: u64,
    #[serde(default, deserialize_with = "crate::null_as_default")]
    pub completion_tokens: u64,
}

/// One event's data.
#[derive(Debug)]
pub(crate) enum SseData {
    /// `[DONE]`.
    Done,
    Json(String),
    /// An event that cannot be read (not UTF-8).
    Unreadable(&'static str),
}

/// Splits a byte stream into events' data, keeping an incomplete event for the next bytes.
#[derive(Debug, Default)]
pub(crate) struct SseReader {
    pending: Vec<u8>,
}

impl SseReader {
    /// The data of the events `bytes` completes (events without data are skipped).
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Vec<SseData> {
        self.pending.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some((len, sep)) = find_event_end(&self.pending) {
            let event: Vec<u8> = self.pending.drain(..len + sep).collect();
            let Ok(text) = std::str::from_utf8(&event[..len]) else {
                out.push(SseData::Unreadable("the answer's stream is not UTF-8"));
                continue;
            };
            let data: String = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect::<Vec<_>>()
                .join("\n");
            if data.is_empty() {
                continue;
            }
            out.push(if data.trim() == "[DONE]" {
                SseData::Done
            } else {
                SseData::Json(data)
            });
        }
        out
    }
}

/// The end of the first complete event in `buf`: (its length, the separator's length).
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

#[derive(Deserialize)]
pub(crate) struct Chunk<'a> {
    #[serde(borrow)]
    pub id: Option<Cow<'a, str>>,
    /// The chunk's creation time (Unix seconds).
    pub created: Option<u64>,
    #[serde(borrow, default, deserialize_with = "crate::null_as_default")]
    pub choices: Vec<ChunkChoice<'a>>,
    pub usage: Option<Usage>,
    #[serde(borrow)]
    pub error: Option<ChunkError<'a>>,
}

#[derive(Deserialize)]
pub(crate) struct ChunkError<'a> {
    #[serde(borrow)]
    pub message: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
pub(crate) struct ChunkChoice<'a> {
    #[serde(borrow)]
    pub delta: Option<Delta<'a>>,
    #[serde(borrow)]
    pub finish_reason: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub matched_stop: Option<&'a RawValue>,
    #[serde(borrow)]
    pub stop_reason: Option<&'a RawValue>,
}

#[derive(Deserialize)]
pub(crate) struct Delta<'a> {
    #[serde(borrow)]
    pub content: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub reasoning: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "crate::null_as_default")]
    pub tool_calls: Vec<DeltaCall<'a>>,
}

#[derive(Deserialize)]
pub(crate) struct DeltaCall<'a> {
    /// The engine's index of the call: SGLang writes `-1` for some parsers (and vLLM none in a
    /// whole answer's calls), so it is a hint, not a key.
    pub index: Option<i64>,
    #[serde(borrow)]
    pub id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub function: Option<Function<'a>>,
}

#[derive(Deserialize)]
pub(crate) struct ChatAnswer<'a> {
    #[serde(borrow)]
    pub id: Option<Cow<'a, str>>,
    /// Unix seconds.
    pub created: Option<u64>,
    #[serde(borrow, default, deserialize_with = "crate::null_as_default")]
    pub choices: Vec<Choice<'a>>,
    pub usage: Option<Usage>,
}

#[derive(Deserialize)]
pub(crate) struct Choice<'a> {
    #[serde(borrow)]
    pub message: Option<ChatMessage<'a>>,
    #[serde(borrow)]
    pub finish_reason: Option<Cow<'a, str>>,
    /// SGLang: the stop string (or token id) that ended the answer.
    #[serde(borrow)]
    pub matched_stop: Option<&'a RawValue>,
    /// vLLM: the same, under another name.
    #[serde(borrow)]
    pub stop_reason: Option<&'a RawValue>,
}

#[derive(Deserialize)]
pub(crate) struct ChatMessage<'a> {
    #[serde(borrow)]
    pub content: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub reasoning_content: Option<Cow<'a, str>>,
    /// vLLM's newer name for the reasoning.
    #[serde(borrow)]
    pub reasoning: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "crate::null_as_default")]
    pub tool_calls: Vec<ToolCall<'a>>,
}

#[derive(Deserialize)]
pub(crate) struct ToolCall<'a> {
    #[serde(borrow)]
    pub id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub function: Option<Function<'a>>,
}

#[derive(Deserialize)]
pub(crate) struct Function<'a> {
    #[serde(borrow)]
    pub name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub arguments: Option<Cow<'a, str>>,
}

/// The keys of the tool calls seen so far, in order.
#[derive(Debug, Default)]
pub(crate) struct ToolKeys(Vec<i64>);

impl ToolKeys {
    /// The key of a tool-call delta: the engine's index when it gives a real one; else (none, or
    /// SGLang's `-1`) the open call when the delta continues it, or a new call when it starts one
    /// (it carries an id or a name), keyed past every index seen. `None` for a call whose block
    /// has already ended (a block cannot be reopened).
    pub(crate) fn key(
        &mut self,
        index: Option<i64>,
        position: usize,
        starts: bool,
        open: Option<i64>,
    ) -> Option<i64> {
        let key = match index.filter(|i| *i >= 0) {
            Some(i) => i,
            None => match open {
                Some(k) if !starts => k,
                _ => {
                    let next = self.0.iter().max().map_or(0, |m| m + 1);
                    next.max(position as i64)
                }
            },
        };
        if Some(key) != open && self.0.contains(&key) {
            return None;
        }
        if Some(key) != open {
            self.0.push(key);
        }
        Some(key)
    }
}
