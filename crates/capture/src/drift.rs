//! The sampled drift check: an engine-id turn re-tokenized with our template and compared
//! ([`DriftCheck`]), its prompt and its response text.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ps_chat_template::ChatTokenizer;
use ps_core::CapturedTurn;
use serde_json::Value;

use ps_core::metric_names as m;

use crate::{CaptureError, CaptureJob, PrefixCache};

/// Engine-id turns re-tokenized to check that our template and tokenizer agree with the engine:
/// the first `first` of the process, then one in `every`. Each comparison of a prompt is also
/// recorded in [`DriftCheck::engine_prompts`], which the OPD teacher path reads.
#[derive(Debug, Default)]
pub struct DriftCheck {
    pub(crate) first: u64,
    pub(crate) every: u64,
    pub(crate) seen: AtomicU64,
    pub(crate) checked: AtomicU64,
    pub(crate) drifted: AtomicU64,
    pub(crate) last: std::sync::Mutex<Option<serde_json::Value>>,
    pub(crate) prompts: ps_core::EnginePrompts,
}

impl DriftCheck {
    pub fn new(first: u64, every: u64) -> Self {
        Self {
            first,
            every,
            ..Self::default()
        }
    }

    /// What the prompt comparisons found, shared (clones see later comparisons).
    pub fn engine_prompts(&self) -> ps_core::EnginePrompts {
        self.prompts.clone()
    }

    pub(crate) fn due(&self) -> bool {
        let n = self.seen.fetch_add(1, Ordering::Relaxed);
        n < self.first || (self.every > 0 && (n - self.first).is_multiple_of(self.every))
    }
}

/// Unexplained text tolerated in a streamed answer: bytes the detokenizer held back can shift a few
/// characters between chunks.
pub(crate) const UNEXPLAINED_SLACK_CHARS: usize = 8;

/// Re-tokenizes an engine-id turn and compares: the prompt ids must be equal, and every sampled id
/// must find its place in the re-rendered response. A difference is counted and the first one kept
/// (position and both token texts) for `/v1/rollout/status`.
pub(crate) fn check_drift(
    tok: &ChatTokenizer,
    job: &CaptureJob,
    engine: &CapturedTurn,
    pads: &[usize],
    cache: Option<&PrefixCache>,
    drift: &DriftCheck,
) -> Result<(), CaptureError> {
    let session_id = job.guard.session_id();
    let prev = cache.and_then(|c| c.get(session_id));
    let shared = cache.map(|c| &c.shared);
    let (mut ours, next) = tok.split_turn_cached(&job.turn_input(), prev.as_deref(), shared)?;
    if !pads.is_empty() {
        ours.prompt_ids = tok.expand_image_pads(&ours.prompt_ids, pads)?;
    }
    if let (Some(cache), Some(next)) = (cache, next)
        && !job.session_done
    {
        cache.put(session_id, next);
    }
    drift.checked.fetch_add(1, Ordering::Relaxed);
    let first_diff = |a: &[u32], b: &[u32]| {
        a.iter()
            .zip(b)
            .position(|(x, y)| x != y)
            .or_else(|| (a.len() != b.len()).then(|| a.len().min(b.len())))
    };
    let text = |ids: &[u32], i: usize| ids.get(i).map(|&id| tok.token_text(id));
    let prompt_diff = first_diff(&engine.prompt_ids, &ours.prompt_ids);
    let first_prompt_difference = drift.prompts.record(prompt_diff.is_none());
    // An answer's text holds all it sampled only when it stopped by itself: one cut by
    // `max_tokens` may end inside what a parser holds back (a tool call's head, a call whose
    // arguments are not yet an object) or inside a character (whose bytes the detokenizer never
    // sends), and one stopped by a stop string leaves the string out of its text. Such a response
    // is not compared, only its prompt.
    let finish = &job.rollout.finish;
    let text_incomplete =
        finish.reason.as_deref() == Some("length") || finish.matched_stop.is_string();
    // A tool call whose arguments the model wrote otherwise than the template writes them back
    // (the template prints the parsed object with `tojson`; a grammar-forced call may space or
    // escape its JSON differently): no render of the answer holds the sampled text, so the
    // response is not comparable either (the engine renders it the same way in the next prompt,
    // which the prompt check compares).
    let rewritten_arguments = job
        .rollout
        .message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("function")?.get("arguments")?.as_str())
        .any(|args| !ours.response_text.contains(args.trim()));
    let found = if let Some(i) = prompt_diff {
        Some((
            "prompt",
            i,
            text(&engine.prompt_ids, i),
            text(&ours.prompt_ids, i),
        ))
    } else if text_incomplete || rewritten_arguments {
        None
    } else {
        // The response is compared as text: the engine's sampled ids decoded together must all
        // stand, in order, in the response our template renders from the answer (which may add
        // what was not sampled: an empty think block, the newline after the end token). Ids are
        // not comparable here: sampled byte-level tokens need not be what the decoded text
        // encodes back to (a model may sample the bytes of a character apart, or merges the
        // tokenizer would not make), so an exact engine and template would still differ by id.
        // Decoded as the engine wrote the answer's text, without special tokens: a model may
        // sample them anywhere (a random one does) and stop on any of its stop tokens (Qwen3:
        // `<|im_end|>` or `<|endoftext|>`), and the template writes its own end marker.
        let engine_text = tok.decode(&engine.response_ids, true);
        first_unexplained_char(&engine_text, &ours.response_text).map(|i| {
            let around: String = engine_text.chars().skip(i).take(16).collect();
            ("response", i, Some(around), None)
        })
    };
    if let Some((part, position, engine_token, ours_token)) = found {
        let first = drift.drifted.fetch_add(1, Ordering::Relaxed) == 0;
        metrics::counter!(m::RETOKENIZE_DRIFT_TOTAL, "part" => part).increment(1);
        let record = serde_json::json!({
            "session_id": session_id,
            "turn": job.guard.turn(),
            "part": part,
            "position": position,
            "engine_token": engine_token,
            "retokenized_token": ours_token,
        });
        // Once for the first difference, and once more for the first prompt that differs (the
        // OPD teacher path stops building on engines' prompt ids then).
        if first || first_prompt_difference {
            let teacher = if first_prompt_difference {
                "; a prompt differed: in OPD and Combine mode the teacher encodes prompt texts \
                 itself from now on"
            } else {
                ""
            };
            tracing::warn!(
                session_id,
                turn = job.guard.turn(),
                part,
                position,
                ?engine_token,
                ?ours_token,
                "re-tokenizing an engine-id turn gives other ids than the engine used: the chat template \
                 or tokenizer here differs from the engine's (samples use the engine's ids; counted as \
                 retokenize_drift_total, the latest in /v1/rollout/status){teacher}"
            );
        }
        *drift.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(record);
    }
    Ok(())
}

/// The first character of `engine` (by index) that does not stand, in order, in `ours`: a
/// character-level diff in which `ours` may add text but not drop or change any of `engine`'s.
/// Bounded in time (a pathological pair is compared coarsely past the deadline, never wrongly
/// declared equal).
pub(crate) fn first_unexplained_char(engine: &str, ours: &str) -> Option<usize> {
    use similar::{Algorithm, DiffOp, capture_diff_slices_deadline};
    let e: Vec<char> = engine.chars().collect();
    let o: Vec<char> = ours.chars().collect();
    let deadline = Instant::now() + Duration::from_millis(200);
    capture_diff_slices_deadline(Algorithm::Myers, &e, &o, Some(deadline))
        .into_iter()
        .find_map(|op| match op {
            DiffOp::Delete { old_index, .. } | DiffOp::Replace { old_index, .. } => Some(old_index),
            DiffOp::Equal { .. } | DiffOp::Insert { .. } => None,
        })
}
