//! Other APIs' front doors in chat completions' terms. A request that arrives through another API
//! (today the Anthropic Messages API, [`messages`]) is translated into the chat-completions body a
//! client of `/v1/chat/completions` would have sent for the same conversation, so that it is served,
//! sessioned and captured by the one chat path; the chat answer (whole, or streamed event by event)
//! is translated back into that API's answer.
//!
//! Pure: bytes in, bytes out, no I/O and no knowledge of the server. What a translation leaves out
//! because the engine cannot honour it (a hosted tool, a redacted thinking block) is reported in
//! [`Dropped`] for the server to count and log; everything else is translated or refused with a
//! [`DoorError`] naming the field.

mod chunks;
mod error;
pub mod messages;
pub mod responses;

pub use error::DoorError;

/// What a translated request left out, for the caller to count and log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Tools the engine cannot run (an Anthropic server or client tool with a `type` of its own,
    /// such as `web_search_20250305`), left out of the engine's tool list, by name.
    pub hosted_tools: Vec<String>,
    /// `redacted_thinking` blocks of the history: encrypted reasoning of another model, which the
    /// engine cannot read.
    pub redacted_thinking: usize,
}

impl Dropped {
    pub fn is_empty(&self) -> bool {
        self.hosted_tools.is_empty() && self.redacted_thinking == 0
    }
}

/// A field that engines send as `null` when empty (`tool_calls: null`): read as its default.
pub(crate) fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de> + Default,
{
    use serde::Deserialize as _;
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}
