//! Lingering close for refused bodies (nginx's `lingering_close`).
//!
//! A body over its limit is refused with 413 at once. If the server then closed the connection
//! while the client was still sending, the kernel would answer the unread bytes with a TCP reset,
//! and a client that writes its whole body before reading (Python `urllib`, `requests`) would see
//! "connection reset" instead of the 413. So the 413 keeps its connection open until the rest of
//! the body has been read and thrown away, at most [`LINGER_MAX_BYTES`] bytes and
//! [`LINGER_TIME`]; the client reads the answer once it has sent everything. The reading happens
//! inside the 413's own body (its bytes go out first, then the body ends when the reading does), so
//! it lives and ends with the connection: no task outlives the request.

use std::convert::Infallible;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::BodyExt;

/// Most bytes of a refused body read and discarded after the 413. A client declaring more than
/// this is not waited for (it would be cut off anyway).
pub const LINGER_MAX_BYTES: u64 = 64 * 1024 * 1024;
/// Longest time spent reading and discarding a refused body after the 413.
pub const LINGER_TIME: Duration = Duration::from_secs(10);

/// The part of a refused request body not read yet, kept so that its 413 can linger
/// ([`Unread::none`] when it is not worth reading).
#[derive(Default)]
pub struct Unread(Mutex<Option<Body>>);

impl std::fmt::Debug for Unread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Unread")
    }
}

impl Unread {
    /// Nothing to read after the answer.
    pub fn none() -> Self {
        Self::default()
    }

    /// The rest of a refused body, `read` bytes of which were already read, when reading it is
    /// worth it: not when the client waits for `100 Continue` (it has not sent the body and will
    /// not), nor when its `Content-Length` announces more than [`LINGER_MAX_BYTES`] still to come.
    pub(crate) fn keep(headers: &HeaderMap, declared: Option<u64>, read: u64, rest: Body) -> Self {
        let expects_continue = headers
            .get(header::EXPECT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("100-continue"));
        let too_much = declared.is_some_and(|n| n.saturating_sub(read) > LINGER_MAX_BYTES);
        if expects_continue || too_much {
            Self::none()
        } else {
            Self(Mutex::new(Some(rest)))
        }
    }

    pub(crate) fn take(&self) -> Option<Body> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// A `status` response with the JSON `bytes` as its body, which ends only once `rest` has been read
/// to its end, [`LINGER_MAX_BYTES`] or [`LINGER_TIME`]. It has no `Content-Length` (it is sent
/// chunked): with one, hyper would finish the response after the last byte and drop the body, and
/// with it the reading of the rest.
pub(crate) fn respond(status: StatusCode, bytes: Vec<u8>, rest: Body) -> Response {
    let answer =
        futures::stream::once(async move { Some(Ok::<_, Infallible>(Bytes::from(bytes))) });
    let linger = futures::stream::once(async move {
        let read = discard(rest).await;
        tracing::debug!(read, "read and discarded the rest of a refused body");
        None
    });
    let body = Body::from_stream(answer.chain(linger).filter_map(std::future::ready));
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// Reads `body` to its end, at most [`LINGER_MAX_BYTES`] and [`LINGER_TIME`]; returns the bytes read.
async fn discard(mut body: Body) -> u64 {
    let mut read = 0u64;
    let reading = async {
        while let Some(Ok(frame)) = body.frame().await {
            if let Some(data) = frame.data_ref() {
                read += data.len() as u64;
                if read > LINGER_MAX_BYTES {
                    break;
                }
            }
        }
    };
    let _ = tokio::time::timeout(LINGER_TIME, reading).await;
    read
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_client_waiting_for_continue_or_declaring_too_much_is_not_waited_for() {
        let mut h = HeaderMap::new();
        assert!(
            Unread::keep(&h, Some(100), 10, Body::empty())
                .take()
                .is_some()
        );
        assert!(Unread::keep(&h, None, 10, Body::empty()).take().is_some());
        assert!(
            Unread::keep(&h, Some(LINGER_MAX_BYTES + 11), 10, Body::empty())
                .take()
                .is_none()
        );
        h.insert(header::EXPECT, HeaderValue::from_static("100-continue"));
        assert!(
            Unread::keep(&h, Some(100), 0, Body::empty())
                .take()
                .is_none()
        );
    }

    #[tokio::test]
    async fn the_answer_comes_whole_and_the_rest_is_read() {
        let rest = Body::from(vec![b'x'; 1000]);
        let resp = respond(StatusCode::PAYLOAD_TOO_LARGE, b"{}".to_vec(), rest);
        assert_eq!(resp.status(), 413);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"{}");
    }
}
