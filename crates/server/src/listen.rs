//! The accept loop: `axum::serve` with the connection setting it does not expose.
//!
//! hyper grows an HTTP/1 connection's read buffer while reads fill it, up to ~400 KiB, and a
//! connection keeps what it grew. Agents send the whole conversation every turn (tens of kB), so
//! with `axum::serve`'s defaults every client connection held a buffer of up to a few hundred kB,
//! also while its request waited for the upstream (hyper reads on to notice a client that goes
//! away). [`READ_BUFFER_MAX`] bounds it; a body is read in chunks of that size instead
//! (`plumbing::read_body` copies it into one buffer either way), and hyper queues at most that
//! much of a response before it writes (it flushes sooner; a body chunk is not copied). Agent
//! scenario with a 1 s upstream, heap at the peak: 93.5 → 85.0 MB, of which those reads 11.7 →
//! 1.9 MB (docs/benchmarks-history.md, "The proxy's read buffers at 16 KiB").
//!
//! Otherwise this is `axum::serve(..).with_graceful_shutdown(..)`: HTTP/1 only (axum's `http2`
//! feature is off), `TCP_NODELAY`, accept errors retried by axum's listener, no timer (so no
//! header read timeout, as before), and at shutdown no new connection while open ones finish the
//! request they serve (idle ones close at once). One difference: connections are served without
//! HTTP upgrades (no route upgrades a connection).

use std::future::Future;
use std::pin::pin;

use axum::Router;
use axum::body::Body;
use axum::serve::{Listener, ListenerExt};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tower::ServiceExt;

/// Largest read buffer of one client connection, in bytes (hyper's default is 8 KiB + 400 KiB),
/// and so the largest request head (request line and headers) the server reads, as Node.js's
/// default: hyper answers a larger one `431 Request Header Fields Too Large` with an empty body
/// and closes the connection, before the router (so it is neither logged nor counted); a client
/// still writing its body then may see a connection reset instead.
pub const READ_BUFFER_MAX: usize = 16 * 1024;

/// Serves `router` on `listener` until `shutdown` resolves, then stops accepting, lets every
/// connection finish the request it is serving and returns when all are closed (as
/// `axum::serve(..).with_graceful_shutdown(..)`).
pub(crate) async fn serve_router(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    // Without TCP_NODELAY, Nagle's algorithm meets the client's delayed ACK and every streamed
    // answer after the first on a kept-alive connection stalls ~40 ms.
    let mut listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
    });
    // HTTP/1 only, as `axum::serve` without axum's `http2` feature.
    let mut builder = http1::Builder::new();
    builder.max_buf_size(READ_BUFFER_MAX);
    let graceful = GracefulShutdown::new();
    let mut shutdown = pin!(shutdown);
    loop {
        // `accept` of axum's listener retries transient errors itself (and waits a second
        // when out of file descriptors), as `axum::serve` does.
        let (io, _addr) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let service = TowerToHyperService::new(
            router
                .clone()
                .map_request(|req: hyper::Request<Incoming>| req.map(Body::new)),
        );
        let conn = graceful.watch(builder.serve_connection(TokioIo::new(io), service));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::trace!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
