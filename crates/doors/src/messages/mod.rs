//! The Anthropic Messages API (`POST /v1/messages`) in chat completions' terms.
//!
//! - [`to_chat`] (and [`count_request_to_chat`] for `count_tokens`): a Messages request as the chat-completions body of the same conversation
//!   (`system` first, content blocks as content parts, `tool_use` as tool calls, `tool_result` as
//!   tool messages, `thinking` as `reasoning_content`, tools and sampling parameters renamed).
//! - [`message_from_chat`]: a whole chat answer as a Messages answer (`thinking`, `text` and
//!   `tool_use` blocks, `stop_reason`, `usage`).
//! - [`EventStream`]: a streamed chat answer, chunk by chunk, as the Messages API's events
//!   (`message_start`, `content_block_*`, `message_delta`, `message_stop`, an `error` event when
//!   the stream breaks).
//!
//! What the translation relies on is written down in docs/upstream-protocols.md ("The Anthropic
//! Messages API"); README's table of the doors says what is supported and what is refused.

mod answer;
mod request;
mod stream;

pub use answer::{
    check_answer, error_body, message_from_chat, stop_reason, thinking_from_signature,
    thinking_signature,
};
pub use request::{Translated, count_request_to_chat, to_chat};
pub use stream::EventStream;
