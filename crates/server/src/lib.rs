//! The policy-serving HTTP server.
//!
//! This crate owns the HTTP surface: the OpenAI-compatible `POST /v1/chat/completions` proxy (streamed
//! and not), the session keys of each request, the hand-off of every main turn to the capture workers
//! (rendering, tokenizing and log-prob alignment run on their own threads, never on the executor),
//! the trainer-facing rollout API ([`rollout`]: pull, commit, pause/resume with the chat path's pause
//! modes, status, eval scores), health, model and metrics routes, client and admin authentication,
//! request limits, and the one place where errors become HTTP responses ([`error::ApiError`]).
//! It depends only on core, the chat template, the SGLang client, the session buffer's traits and
//! session inference; the concrete stores, judges, teacher and records are built by `ps-app` (the
//! composition root) and handed in as trait objects. The wire enums whose behaviour lives here
//! ([`PauseMode`], [`TokenIdsMode`]) are defined here and read by `ps-config`.

mod admission;
pub mod capture;
mod chat;
pub mod error;
mod health;
pub mod infer;
pub mod linger;
pub mod listen;
pub mod metrics;
mod plumbing;
mod proxy_stream;
mod request;
pub mod rollout;
mod router;
mod state;

pub use capture::CaptureQueue;
pub use error::ApiError;
pub use ps_core::modes::{PauseMode, TokenIdsMode};
pub use router::{ExtraRoutes, build_router, build_router_with};
pub use state::{AppState, ServerOptions};

use std::future::Future;

/// Serves `app` on `listener` until `shutdown` resolves, then lets in-flight requests finish and
/// drains the capture queue (every turn already accepted is still captured).
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
    if let Some(r) = app.rollout() {
        let grace = app.options().shutdown_grace;
        if !r.buffer.shutdown(grace).await {
            tracing::warn!(
                ?grace,
                "scoring and submission did not finish within server.shutdown_grace_sec"
            );
        }
        match r.store.stats().await {
            Ok(st) => tracing::info!(
                last_seq = st.last_seq,
                committed = st.committed,
                store = %r.store.describe(),
                "closing the sample store"
            ),
            Err(e) => tracing::warn!(error = %e, "sample store counters unavailable at shutdown"),
        }
        // Stops the embedded store's writer now, so the database is closed when the last handle
        // goes (a restarted server can open it at once).
        if let Err(e) = r.store.close().await {
            tracing::error!(error = %e, "closing the sample store failed");
        }
    }
    Ok(())
}
