//! Asking a judge `m` times in parallel: shared by the PRM scorer and the OPD hint judge.

use serde_json::Value;
use tokio::sync::Semaphore;

use crate::JudgeBackend;

/// Longest tail of an unparseable judge answer quoted in a vote's failure reason.
const TAIL_CHARS: usize = 120;

/// Sends `messages` to `backend` `m` times in parallel; each call holds a permit of `semaphore`
/// (when given) while it runs. Each entry is the judge's answer, or why the call failed.
pub async fn ask_votes(
    backend: &dyn JudgeBackend,
    messages: &[Value],
    m: usize,
    semaphore: Option<&Semaphore>,
) -> Vec<Result<String, String>> {
    let one = || async {
        let _permit = match semaphore {
            Some(sem) => Some(
                sem.acquire()
                    .await
                    .map_err(|_| "the judge concurrency limiter is closed".to_owned())?,
            ),
            None => None,
        };
        backend.complete(messages).await.map_err(|e| e.to_string())
    };
    futures::future::join_all((0..m).map(|_| one())).await
}

/// The last characters of a judge answer, for a failure reason.
pub fn answer_tail(text: &str) -> String {
    let n = text.chars().count();
    text.chars().skip(n.saturating_sub(TAIL_CHARS)).collect()
}
