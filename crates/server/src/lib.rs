//! The policy-serving HTTP server.
//!
//! This crate owns the HTTP surface: the OpenAI-compatible `POST /v1/chat/completions` proxy (streamed
//! and not), the Anthropic Messages and OpenAI Responses doors (`POST /v1/messages`, `POST
//! /v1/responses`, translated by `ps-doors` into the same chat path), the session keys of each request, the hand-off of every main turn to capture (`ps-capture`:
//! the request's parts and the answer go in, a captured turn comes out on its own threads, never on
//! the executor),
//! the trainer-facing rollout API ([`rollout`]: pull, commit, pause/resume with the chat path's pause
//! modes, status, eval scores), health, model and metrics routes, client and admin authentication,
//! request limits, and the one place where errors become HTTP responses ([`error::ApiError`]).
//! It depends only on core (its types and ports), the chat template, the SGLang client, capture,
//! session inference and the doors' translations; the concrete stores, judges, teacher and records are built by `ps-app` (the
//! composition root) and handed in as trait objects.

mod admission;
mod chat;
mod client_shape;
mod door_io;
pub mod error;
mod health;
pub mod infer;
pub mod linger;
pub mod listen;
mod messages;
pub mod metrics;
mod plumbing;
mod proxy_stream;
mod request;
mod response_store;
mod responses;
pub mod rollout;
mod router;
mod state;

pub use error::ApiError;
pub use ps_capture::{self as capture, CaptureQueue};
pub use ps_core::modes::{PauseMode, TokenIdsMode};
pub use router::{ExtraRoutes, build_router, build_router_with};
pub use state::{AppState, ServerOptions};

use std::future::Future;

/// Serves `app` on `listener` until `shutdown` resolves, then lets in-flight requests finish and
/// drains the capture queue (every turn already accepted is still captured). What follows (the
/// session buffer's scoring and submission, the store's close) is the composition's to run:
/// `ps_app::serve` does.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, app, ExtraRoutes::default(), shutdown).await
}

/// As [`serve`], with `extra` routes ([`build_router_with`]).
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    app: AppState,
    extra: ExtraRoutes,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = build_router_with(app.clone(), extra);
    listen::serve_router(listener, router, shutdown).await;
    let capture = app.clone();
    let drained = tokio::task::spawn_blocking(move || capture.capture().shutdown())
        .await
        .unwrap_or(0);
    tracing::info!(drained, "capture queue drained");
    Ok(())
}
