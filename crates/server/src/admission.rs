//! Admission of a chat request: what it gets while the trainer has paused submission
//! (`server.pause_mode`), and the permit of its upstream call (`sglang.max_concurrency`).

use tokio::sync::OwnedSemaphorePermit;

use crate::error::ApiError;
use crate::state::{AppState, PAUSED_RETRY_AFTER_SECS};
use ps_core::modes::PauseMode;

/// While the trainer has paused submission: refuse, hold (up to `server.pause_hold_max_sec`), or
/// serve without collecting. `Ok(collect)`: whether the answer may become training data.
pub(crate) async fn pause_gate(app: &AppState) -> Result<bool, ApiError> {
    if app.submission_enabled() {
        return Ok(true);
    }
    let opts = app.options();
    let paused = ApiError::Paused {
        retry_after_secs: PAUSED_RETRY_AFTER_SECS,
    };
    match opts.pause_mode {
        PauseMode::Reject => Err(paused),
        PauseMode::Hold => {
            let _held = crate::state::Waiting::new(&app.0.held_requests);
            if app.wait_submission(opts.pause_hold_max).await {
                Ok(true)
            } else {
                Err(paused)
            }
        }
        PauseMode::Serve => Ok(false),
    }
}

/// A permit per upstream request, held until the answer (or the streamed body) ends; none left
/// is a 429.
pub(crate) fn upstream_permit(app: &AppState) -> Result<OwnedSemaphorePermit, ApiError> {
    app.0
        .upstream_permits
        .clone()
        .try_acquire_owned()
        .map_err(|_| ApiError::Overloaded {
            limit: app.options().max_upstream,
        })
}
