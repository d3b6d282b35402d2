//! The OpenAI Responses API (`POST /v1/responses`) in chat completions' terms.
//!
//! - [`to_chat`]: a Responses request (its `input` items, `instructions`, tools with `namespace`
//!   tools flattened and hosted ones left out) as the chat-completions body of the same
//!   conversation, a stored response's conversation first when `previous_response_id` names one.
//! - [`response_from_chat`]: a whole chat answer as a `response` object (`reasoning`, `message` and
//!   `function_call` output items; namespaced calls mapped back; the reasoning sealed in
//!   `encrypted_content` when asked, which restores it when sent back).
//! - [`EventStream`]: a streamed chat answer as the Responses events, each with its
//!   `sequence_number`.

mod answer;
mod request;
mod stream;

pub use answer::{ResponseContext, Whole, check_answer, error_body, response_from_chat};
pub use request::{NAMESPACE_SEPARATOR, Namespaces, Translated, flat_name, to_chat};
pub use stream::EventStream;
