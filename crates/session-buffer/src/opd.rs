//! On-policy distillation and Combine: what one judged turn becomes.
//!
//! OPD: the hint judge votes; the best hint (if any) is appended to the last user message; the teacher
//! scores the ORIGINAL response tokens under that hinted prompt; the sample carries the teacher's
//! log-probs (and top-K), reward 1.0 and an all-ones loss mask, as the reference does. A turn without a
//! next state (with `opd.drop_without_next_state`), without an accepted hint, whose teacher call
//! failed, or whose teacher echoed other token ids than ours, yields no sample: it is counted,
//! logged and recorded with its reason, never padded.
//!
//! Combine: hint votes and PRM eval votes run at once; at most one sample per turn —
//! hint + eval ±1 → teacher signal, reward = eval; hint + eval 0 → teacher signal, reward 0;
//! no hint (or a failed teacher) + eval ±1 → an RL sample whose teacher log-probs are its rollout
//! log-probs; otherwise nothing. So every sample of a batch carries the teacher fields.

use std::sync::Arc;

use ps_chat_template::ChatTokenizer;
use ps_core::CapturedTurn;
use ps_core::sample::Sample;
use ps_opd_judge::{HintJudge, HintOutcome};
use ps_prm_client::PrmScore;
use ps_teacher_client::{TeacherLogprobs, TeacherScorer};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::rules::{RlDecision, list_trained_placeholders, rl_sample};

/// What OPD needs besides the PRM: the hint judge, the teacher and the policy's tokenizer (to render
/// the hinted prompt), with the cap on concurrent teacher calls (`teacher.max_concurrency`).
#[derive(Clone)]
pub struct OpdParts {
    pub hint: Arc<dyn HintJudge>,
    pub teacher: Arc<dyn TeacherScorer>,
    pub tokenizer: Arc<ChatTokenizer>,
    pub teacher_permits: Option<Arc<Semaphore>>,
}

impl std::fmt::Debug for OpdParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpdParts")
            .field("teacher", &self.teacher.describe())
            .finish_non_exhaustive()
    }
}

/// Why a teacher signal could not be used.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TeacherFailure {
    pub reason: &'static str,
    pub detail: String,
}

/// Renders the hinted prompt + original response, tokenizes it once, asks the teacher for the last
/// `T` positions and checks that the teacher scored our very response tokens.
pub(crate) async fn teacher_signal(
    parts: &OpdParts,
    turn: &CapturedTurn,
    hint: &str,
    top_k: usize,
) -> Result<TeacherLogprobs, TeacherFailure> {
    // A turn with the engine's own ids is scored on exactly those response ids, after the hinted
    // prompt; a re-tokenized turn's response text is appended and the whole text tokenized once.
    let engine_response =
        (turn.token_source == ps_core::TokenSource::Engine).then(|| turn.response_ids.clone());
    let (tok, messages, tools, kwargs, response_text, hint_owned) = (
        parts.tokenizer.clone(),
        turn.messages.clone(),
        turn.tools.clone(),
        turn.template_kwargs.clone(),
        turn.response_text.clone(),
        hint.to_owned(),
    );
    // Rendering and tokenizing are blocking work: off the executor.
    let ids = tokio::task::spawn_blocking(move || {
        let text = ps_opd_judge::teacher_input_text(
            &tok,
            &messages,
            tools.as_ref(),
            &hint_owned,
            if engine_response.is_some() {
                ""
            } else {
                &response_text
            },
            kwargs.as_ref(),
        )?;
        let mut ids = tok.encode(&text)?;
        ids.extend(engine_response.unwrap_or_default());
        Ok::<_, ps_chat_template::ChatTemplateError>(ids)
    })
    .await
    .map_err(|e| TeacherFailure {
        reason: "teacher_error",
        detail: format!("rendering the teacher prompt panicked: {e}"),
    })?
    .map_err(|e| TeacherFailure {
        reason: "teacher_error",
        detail: format!("rendering the teacher prompt failed: {e}"),
    })?;
    let t = turn.response_ids.len();
    let _permit = match &parts.teacher_permits {
        Some(s) => Some(
            s.clone()
                .acquire_owned()
                .await
                .map_err(|_| TeacherFailure {
                    reason: "teacher_error",
                    detail: "the teacher is shut down".into(),
                })?,
        ),
        None => None,
    };
    let started = tokio::time::Instant::now();
    let result = parts.teacher.score(&ids, t, top_k).await;
    metrics::histogram!(ps_core::metric_names::TEACHER_SECONDS)
        .record(started.elapsed().as_secs_f64());
    let signal = result.map_err(|e| TeacherFailure {
        reason: "teacher_error",
        detail: e.to_string(),
    })?;
    if let Err(m) = signal.check_alignment(&turn.response_ids) {
        return Err(TeacherFailure {
            reason: "teacher_token_mismatch",
            detail: format!(
                "first differing position {} (ours {:?}, teacher {:?}; lengths {} and {})",
                m.first_position, m.ours, m.theirs, m.len_ours, m.len_theirs
            ),
        });
    }
    Ok(signal)
}

/// The OPD (or Combine-with-hint) sample: the original prompt and response, all-ones loss mask, the
/// teacher's signal, and `reward`.
pub(crate) fn distill_sample(
    turn: &CapturedTurn,
    reward: f64,
    signal: TeacherLogprobs,
    mode: &str,
    hint: &HintOutcome,
    eval: Option<&PrmScore>,
) -> Sample {
    let decision = RlDecision {
        reward,
        effective: true,
        at_least_one: false,
        excluded: None,
    };
    let mut s = rl_sample(turn, &decision, eval);
    s.loss_mask = vec![1; turn.response_ids.len()];
    list_trained_placeholders(&mut s, turn);
    s.teacher_log_probs = Some(signal.log_probs);
    s.teacher_topk_log_probs = signal.topk_log_probs;
    s.teacher_topk_indices = signal.topk_indices;
    annotate(&mut s, mode, hint, eval);
    s.metadata.insert("teacher".into(), json!("hinted"));
    s
}

/// `metadata` key of Combine's RL-only samples: the positions taken out of the loss mask because
/// their rollout log-prob, copied into `teacher_log_probs`, would be a placeholder.
pub const MASKED_WITHOUT_LOGPROB: &str = "masked_without_logprob";

/// Combine's RL-only sample: the RL rules' mask and reward, with the rollout log-probs as teacher
/// log-probs so that every sample of a batch has the teacher fields (teacher − rollout = 0: no
/// distillation signal). A trained position whose rollout log-prob is a placeholder (the
/// end-of-turn token the upstream reported no value for) would put that `0.0` into a teacher field
/// and give the token a spurious positive advantage in the combined loss, so it is taken out of the
/// loss mask and listed under [`MASKED_WITHOUT_LOGPROB`].
pub(crate) fn combine_rl_sample(
    turn: &CapturedTurn,
    eval: &PrmScore,
    hint: &HintOutcome,
) -> Sample {
    let decision = RlDecision {
        reward: eval.score,
        effective: true,
        at_least_one: false,
        excluded: None,
    };
    let mut s = rl_sample(turn, &decision, Some(eval));
    let mut masked = Vec::new();
    for (i, lp) in turn.alignment.logprobs.iter().enumerate() {
        if lp.is_none()
            && let Some(m) = s.loss_mask.get_mut(i)
            && *m != 0
        {
            *m = 0;
            masked.push(i);
        }
    }
    list_trained_placeholders(&mut s, turn);
    s.metadata
        .insert(MASKED_WITHOUT_LOGPROB.into(), json!(masked));
    s.teacher_log_probs = Some(s.rollout_log_probs.clone());
    annotate(&mut s, "combine", hint, Some(eval));
    s.metadata.insert("teacher".into(), json!("rollout"));
    s
}

fn annotate(s: &mut Sample, mode: &str, hint: &HintOutcome, eval: Option<&PrmScore>) {
    s.metadata.insert("mode".into(), json!(mode));
    s.metadata.insert("hint".into(), json!(hint.hint()));
    s.metadata.insert("hint_votes".into(), json!(hint.scores()));
    s.metadata.insert(
        "eval_votes".into(),
        eval.map_or(Value::Null, |e| json!(e.votes)),
    );
}

/// The OPD record of one judged turn.
pub(crate) fn opd_record(
    session_id: &str,
    turn: u64,
    mode: &str,
    hint: Option<&HintOutcome>,
    eval: Option<&PrmScore>,
    signal: Option<&TeacherLogprobs>,
    dropped: Option<(&str, &str)>,
) -> Value {
    let h = hint.and_then(HintOutcome::hint);
    let outcome = match (signal, dropped) {
        (Some(_), _) => "distilled",
        // Combine keeps a turn without a usable teacher signal as an RL sample when its eval is ±1.
        (None, Some(_)) if mode == "combine" && eval.is_some_and(|e| e.score != 0.0) => "rl",
        _ => "dropped",
    };
    json!({
        "session_id": session_id,
        "turn": turn,
        "outcome": outcome,
        "timestamp_ms": crate::buffer::unix_millis(),
        "mode": mode,
        "accepted": hint.is_some_and(HintOutcome::accepted) && dropped.is_none(),
        "hint": h,
        "hint_len": h.map_or(0, |h| h.chars().count()),
        "votes": hint.map(HintOutcome::scores),
        "vote_failures": hint.map(|o| &o.failures),
        "eval_score": eval.map(|e| e.score),
        "eval_votes": eval.map(|e| &e.votes),
        "teacher_log_probs_len": signal.map(|s| s.log_probs.len()),
        // The operators' field name for the teacher log-probs themselves.
        "teacher_lp": signal.map(|s| &s.log_probs),
        "teacher_log_probs_sum": signal.map(|s| s.log_probs.iter().sum::<f64>()),
        "reason": dropped.map(|d| d.0),
        "detail": dropped.map(|d| d.1),
    })
}
