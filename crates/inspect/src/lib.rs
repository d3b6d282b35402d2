//! The inspection page: what the trainer gets, session by session and token by token.
//!
//! This crate owns a bounded in-memory history of recent sessions and turns
//! ([`history::InspectHistory`], a [`ps_core::TurnObserver`] told by the server and the session
//! buffer), the JSON of the `/v1/inspect/...` endpoints ([`api`]), the view of a stored sample
//! ([`sample_view`], read from the store through [`ps_core::SampleLog`], so samples written before
//! a restart are inspectable), the axum routes ([`api_router`], [`ui_router`]) and the page itself
//! (plain HTML, CSS and JavaScript under `assets/`, compiled in: no CDN, no build step).
//!
//! It depends on `ps-core` and axum only; the server mounts the routes (the API behind the admin
//! key) and the composition crate plugs the history into the server and the buffer. Untrusted
//! conversation text is data here and text on the page: the page never inserts it as HTML.

pub mod api;
pub mod history;
mod routes;
pub mod sample_view;

pub use history::{HistoryLimits, InspectHistory};
pub use routes::{Inspect, InspectError, api_router, ui_router};

use crate::api::Live;

/// What the server knows now (submission state, pending turns): the overview shows it.
pub trait LiveStatus: Send + Sync {
    fn live(&self) -> Live;
}

/// The text of one token id (the policy's tokenizer), for the sample view.
pub trait TokenText: Send + Sync {
    fn text(&self, id: u32) -> Option<String>;
}
