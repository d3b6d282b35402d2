//! Request plumbing shared by the handlers: reading a body within its limit ([`read_body`]), and
//! the context of a main turn ([`TurnContext`]) that the chat path hands to the streamed body and
//! to capture. It names no handler.

use axum::body::Body;
use axum::http::{HeaderMap, header};
use bytes::Bytes;

use crate::error::ApiError;
use ps_capture::{CaptureJob, CaptureQueue, RequestJson};

/// What a main turn needs captured, taken from the request before it is forwarded.
pub(crate) struct TurnContext {
    pub guard: ps_core::TurnGuard,
    pub arrival_seq: u64,
    /// `messages`, `tools` and `chat_template_kwargs` as the client sent them: slices of the
    /// client's body (not copies), parsed on a capture thread, not on the chat path.
    pub messages: Bytes,
    pub tools: Option<Bytes>,
    pub template_kwargs: Option<Bytes>,
    pub session_done: bool,
    pub token_ids: ps_core::modes::TokenIdsMode,
    /// Whether the upstream call asked the engine for its ids.
    pub asked_for_ids: bool,
    pub trainer_weight_version: Option<String>,
    pub origin: ps_core::SessionOrigin,
    /// The sampling parameters sent upstream.
    pub sampling: ps_core::Sampling,
}

impl TurnContext {
    /// Queues the turn for capture with the upstream's answer, assembled (a stream: see
    /// [`CaptureQueue::submit_json`]).
    pub fn submit(self, capture: &CaptureQueue, rollout: ps_core::RolloutResponse) -> bool {
        self.queue(capture, rollout, None)
    }

    /// Queues the turn for capture with the upstream's whole answer, whose rollout the capture
    /// thread reads.
    pub fn submit_answer(self, capture: &CaptureQueue, answer: ps_sglang_client::Answer) -> bool {
        self.queue(capture, ps_core::RolloutResponse::default(), Some(answer))
    }

    fn queue(
        self,
        capture: &CaptureQueue,
        rollout: ps_core::RolloutResponse,
        answer: Option<ps_sglang_client::Answer>,
    ) -> bool {
        let request = RequestJson {
            messages: self.messages,
            tools: self.tools,
            template_kwargs: self.template_kwargs,
            answer,
        };
        let job = CaptureJob {
            guard: self.guard,
            arrival_seq: self.arrival_seq,
            messages: Vec::new(),
            tools: None,
            template_kwargs: None,
            rollout,
            session_done: self.session_done,
            token_ids: self.token_ids,
            asked_for_ids: self.asked_for_ids,
            trainer_weight_version: self.trainer_weight_version,
            origin: self.origin,
            sampling: self.sampling,
            texts: None,
        };
        capture.submit_json(job, request)
    }
}

/// Reads a request body of at most `limit` bytes: a `Content-Length` over the limit is refused at
/// once, without waiting for bytes that may never come; a body that grows past it is cut off. The
/// 413 keeps the unread rest of the body, so that the answer lingers until the client has sent it
/// ([`crate::linger`]) and the client reads the 413 instead of a connection reset.
pub(crate) async fn read_body(
    headers: &HeaderMap,
    mut body: Body,
    limit: usize,
) -> Result<Bytes, ApiError> {
    use http_body_util::BodyExt as _;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let too_large = |read: u64, rest: Body| ApiError::PayloadTooLarge {
        limit,
        unread: crate::linger::Unread::keep(headers, declared, read, rest),
    };
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large(0, body));
    }
    let mut buf = Vec::with_capacity(declared.map_or(0, |n| n as usize));
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            ApiError::invalid(
                "body_read_failed",
                format!("reading the request body failed: {e}"),
            )
        })?;
        if let Some(data) = frame.data_ref() {
            if buf.len() + data.len() > limit {
                return Err(too_large((buf.len() + data.len()) as u64, body));
            }
            buf.extend_from_slice(data);
        }
    }
    // Without a `Content-Length` the buffer grew by doubling; capture keeps slices of it (and so
    // all of it) while a turn waits, counted by its length (`capture.max_queued_mib`).
    if buf.capacity() > buf.len() + buf.len() / 8 {
        buf.shrink_to_fit();
    }
    Ok(Bytes::from(buf))
}
