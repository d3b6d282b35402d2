//! One turn captured: the engine's ids taken as they are and checked, or the turn rendered and
//! tokenized as `transformers` would and the log-probs aligned to those tokens
//! ([`capture_turn_with`]).

use std::sync::atomic::Ordering;

use ps_chat_template::{ChatTokenizer, TurnInput};
use ps_core::modes::TokenIdsMode;
use ps_core::{
    AlignPolicy, Alignment, CapturedTurn, JsonText, PositionSource, RolloutResponse, TokenSource,
    WeightVersion, align_logprobs,
};

use ps_core::metric_names as m;

use crate::drift::{UNEXPLAINED_SLACK_CHARS, check_drift};
use crate::job::held_text;
use crate::{CaptureError, CaptureJob, CaptureStats, PrefixCache};

/// Renders, tokenizes and aligns one turn.
pub fn capture_turn(
    tok: &ChatTokenizer,
    job: &CaptureJob,
    policy: AlignPolicy,
) -> Result<CapturedTurn, CaptureError> {
    capture_turn_with(tok, job, policy, None, &CaptureStats::default())
}

/// [`capture_turn`], encoding the prompt incrementally from the session's previous prompt, and
/// counting in `stats`. A turn whose engine returned its own ids takes them (no re-tokenization,
/// every position its own log-prob); otherwise it is re-rendered and re-tokenized
/// (docs/internals.md, "Where a turn's ids come from").
pub fn capture_turn_with(
    tok: &ChatTokenizer,
    job: &CaptureJob,
    policy: AlignPolicy,
    cache: Option<&PrefixCache>,
    stats: &CaptureStats,
) -> Result<CapturedTurn, CaptureError> {
    let mut turn = capture_tokens(tok, job, policy, cache, stats)?;
    let missing = crate::experts::attach(&mut turn, &job.rollout, &stats.experts)?;
    if let Some(reason) = missing
        && stats.first_time(reason)
    {
        tracing::warn!(
            session_id = %job.guard.session_id(), turn = job.guard.turn(), reason,
            "a turn's sample has no routed experts although the engine returned them for earlier \
             turns: counted in /v1/rollout/status routed_experts and marked \
             metadata.routed_experts_missing (capture.routed_experts = \"require\" drops such \
             turns instead; logged once per reason)"
        );
    }
    Ok(turn)
}

/// The turn's ids, log-probs and texts: the engine's or re-tokenized.
fn capture_tokens(
    tok: &ChatTokenizer,
    job: &CaptureJob,
    policy: AlignPolicy,
    cache: Option<&PrefixCache>,
    stats: &CaptureStats,
) -> Result<CapturedTurn, CaptureError> {
    // A prompt with audio, a video, a file or any part that is not text (nor an image, for a
    // vision-language model) is not captured exactly (not even on the engine's ids, which hold
    // its pads but not what the trainer needs): the turn is dropped with its reason, whichever
    // path its ids would take. A VL model's images are read and counted here; one that cannot
    // be read exactly drops the turn with its reason too.
    let images_captured = stats.captures_images(tok);
    if let Some((reason, mut detail)) =
        ps_core::message::unsupported_part_with(&job.messages, images_captured)
    {
        if reason == "image_unsupported" && tok.vision().is_some() {
            detail.push_str(
                " (the model takes images, but the sample store does not keep them \
                 (SampleLog::keeps_images): use the embedded or the Redis store to train on \
                 image turns)",
            );
        }
        return Err(CaptureError::Refused { reason, detail });
    }
    let images = tok
        .images(&job.messages, &stats.image_limits())
        .map_err(|e| CaptureError::Refused {
            reason: e.reason(),
            detail: e.to_string(),
        })?;
    let pads: Vec<usize> = images.iter().map(|i| i.tokens).collect();
    let sample_images = || {
        images
            .iter()
            .map(|i| ps_core::sample::SampleImage {
                hash: i.image.hash.clone(),
                mime: i.image.mime.clone(),
                width: i.image.width,
                height: i.image.height,
                tokens: i.tokens,
                bytes: Some(i.image.bytes.clone()),
            })
            .collect::<Vec<_>>()
    };
    let rollout = &job.rollout;
    let weight_version = match (&rollout.weight_version, &job.trainer_weight_version) {
        (Some(v), _) => Some(WeightVersion {
            version: v.clone(),
            source: "engine".into(),
        }),
        (None, Some(v)) => Some(WeightVersion {
            version: v.clone(),
            source: "trainer".into(),
        }),
        (None, None) => None,
    };
    let use_engine = job.token_ids != TokenIdsMode::Retokenize;
    let engine = match (use_engine, &rollout.engine_ids) {
        (true, Some(ids)) => match engine_turn(tok, job, ids, !pads.is_empty()) {
            // A stream without parsers loses the end-of-turn token's log-prob while its sglext ids
            // include the token: under `auto` such a turn is re-tokenized (its placeholder marked
            // and counted) rather than lost; `engine` refuses it.
            Err(e @ CaptureError::Refused { .. }) if job.token_ids == TokenIdsMode::Auto => {
                if stats.first_time("engine_logprob_count_mismatch") {
                    tracing::warn!(
                        session_id = %job.guard.session_id(), turn = job.guard.turn(), error = %e,
                        "the engine's ids and its log-probs differ in number: re-tokenizing such turns \
                         (logged once)"
                    );
                }
                None
            }
            other => Some(other?),
        },
        _ => None,
    };
    if let Some(mut turn) = engine {
        if let Some(v) = tok.vision() {
            check_engine_pads(&turn.prompt_ids, v, &pads)?;
        }
        turn.images = sample_images();
        turn.weight_version = weight_version;
        if let (Some(cache), true) = (cache, job.session_done) {
            cache.forget(job.guard.session_id());
        }
        if stats.drift.due() {
            check_drift(tok, job, &turn, &pads, cache, &stats.drift)?;
        }
        turn.engine_prompts_agreed = stats.drift.prompts.agree();
        stats.engine.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(m::TOKEN_SOURCE_TOTAL, "source" => "engine").increment(1);
        return Ok(turn);
    }
    if job.asked_for_ids && rollout.engine_ids.is_none() {
        stats.engine_ids_missing.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(m::ENGINE_IDS_MISSING_TOTAL).increment(1);
        let engine_only = job.token_ids == TokenIdsMode::Engine;
        if stats.first_time("no_engine_ids") {
            tracing::warn!(
                session_id = %job.guard.session_id(), turn = job.guard.turn(),
                "the policy server was asked for its token ids (return_token_ids) and answered without \
                 them: an SGLang build before July 2026, or a router that strips them. {} \
                 (logged once; counted as engine_ids_missing in /v1/rollout/status)",
                if engine_only {
                    "sglang.token_ids = \"engine\": such turns give no sample; upgrade SGLang or use \"auto\""
                } else {
                    "Falling back to exact re-tokenization for such turns"
                }
            );
        }
        if engine_only {
            return Err(CaptureError::Refused {
                reason: "no_engine_ids",
                detail: "the engine returned no token ids and sglang.token_ids = \"engine\"".into(),
            });
        }
    } else if job.token_ids == TokenIdsMode::Engine {
        return Err(CaptureError::Refused {
            reason: "no_engine_ids",
            detail: "the answer carries no engine token ids (a streamed answer without sglext ids, or \
                     the client's own return_token_ids: false) and sglang.token_ids = \"engine\"; set \
                     sglang.stream = false so the upstream call is whole"
                .into(),
        });
    }
    if rollout.streamed && stream_logprobs_incomplete(rollout) {
        return Err(CaptureError::Refused {
            reason: "stream_logprobs_missing",
            detail: format!(
                "the streamed answer's log-probs do not explain its text ({} characters without a \
                 reported token, {} log-probs in all): this SGLang build drops them with a reasoning or \
                 tool parser. Set sglang.stream = false so the upstream call is whole and every token's \
                 log-prob comes back",
                rollout.unexplained_chars,
                rollout.tokens.len()
            ),
        });
    }
    let mut turn = retokenized_turn(tok, job, &pads, policy, cache)?;
    // Re-tokenized pads are this model's processor's counts: where the engine says how many
    // prompt tokens it used (`usage.prompt_tokens`), an image turn must come to the same number,
    // or the engine resized its images otherwise.
    if let (false, Some(engine)) = (pads.is_empty(), rollout.prompt_tokens)
        && engine != turn.prompt_ids.len() as u64
    {
        return Err(CaptureError::Refused {
            reason: "image_pad_mismatch",
            detail: format!(
                "the engine used {engine} prompt tokens where this model's processor gives {} \
                 (its images expanded to {pads:?} pads): the engine resizes images otherwise \
                 than preprocessor_config.json in the model directory; serve both with the \
                 same processor settings",
                turn.prompt_ids.len()
            ),
        });
    }
    turn.images = sample_images();
    turn.weight_version = weight_version;
    stats.retokenized.fetch_add(1, Ordering::Relaxed);
    metrics::counter!(m::TOKEN_SOURCE_TOTAL, "source" => "retokenized").increment(1);
    Ok(turn)
}

/// A streamed answer whose log-probs cannot explain its text: text beyond what the reported tokens
/// spell (more than a few characters and a twentieth of the text), or no log-prob at all for a
/// non-empty answer. Builds that put a step's log-probs on its first chunk pass; builds that send
/// reasoning or tool-call chunks with `logprobs: null` do not.
pub(crate) fn stream_logprobs_incomplete(rollout: &RolloutResponse) -> bool {
    let text: usize = ["content", "reasoning_content"]
        .iter()
        .filter_map(|k| rollout.message.get(*k).and_then(serde_json::Value::as_str))
        .map(|s| s.chars().count())
        .sum();
    let has_text = text > 0
        || rollout
            .message
            .get("tool_calls")
            .and_then(serde_json::Value::as_array)
            .is_some_and(|c| !c.is_empty());
    let unexplained = rollout.unexplained_chars;
    (unexplained > UNEXPLAINED_SLACK_CHARS && unexplained * 20 > text)
        || (has_text && rollout.tokens.is_empty())
}

/// A turn from the engine's own ids: tokens = engine prompt + response ids, one engine log-prob per
/// response id. The response text is still rendered with the template (what the judges read: the
/// rendered conversation after the prompt), in one render of the whole conversation that starts
/// with the engine's prompt decoded; only where it does not (a template or tokenizer that differs
/// from the engine's, a prompt whose image pads the engine expanded) is the prompt rendered too.
pub(crate) fn engine_turn(
    tok: &ChatTokenizer,
    job: &CaptureJob,
    ids: &ps_core::EngineIds,
    has_images: bool,
) -> Result<CapturedTurn, CaptureError> {
    let rollout = &job.rollout;
    if ids.response.len() != rollout.tokens.len() {
        return Err(CaptureError::Refused {
            reason: "engine_logprob_count_mismatch",
            detail: format!(
                "the engine returned {} response ids ({}) but {} log-probs: no exact log-prob per token",
                ids.response.len(),
                ids.field,
                rollout.tokens.len()
            ),
        });
    }
    let known_prompt =
        (!has_images && !ids.prompt.is_empty()).then(|| tok.decode_verbatim(&ids.prompt, false));
    let texts = tok.render_turn_after(&job.turn_input(), known_prompt)?;
    let n = ids.response.len();
    let alignment = Alignment {
        logprobs: rollout.tokens.iter().map(|t| Some(t.logprob)).collect(),
        sources: vec![PositionSource::Sampled; n],
        loss_mask: vec![1; n],
        matched_by_ids: true,
        unmatched_upstream: 0,
        first_unmatched_upstream: None,
    };
    Ok(captured_turn(
        job,
        texts,
        (ids.prompt.clone(), ids.response.clone()),
        alignment,
        TokenSource::Engine,
    ))
}

/// The captured turn of `job`, whichever path gave its ids (the policy version is set by the
/// caller).
pub(crate) fn captured_turn(
    job: &CaptureJob,
    texts: ps_chat_template::TurnTexts,
    (prompt_ids, response_ids): (Vec<u32>, Vec<u32>),
    alignment: Alignment,
    token_source: TokenSource,
) -> CapturedTurn {
    CapturedTurn {
        images: Vec::new(),
        session_id: job.guard.session_id().to_owned(),
        turn: job.guard.turn(),
        arrival_seq: job.arrival_seq,
        // Held as JSON text while the turn waits for its sample (a tree of a 56 kB `messages`
        // array takes ~4–5 times that); the job's trees are dropped with the job. The client's
        // own texts when the capture thread parsed them: writing the trees out again cost ~2.7 %
        // of the proxy's CPU in the agent benchmark.
        messages: held_text(job.texts.as_ref().map(|t| &t.messages), &job.messages),
        tools: job
            .tools
            .as_ref()
            .map(|tree| held_text(job.texts.as_ref().and_then(|t| t.tools.as_ref()), tree)),
        template_kwargs: job.template_kwargs.as_ref().map(JsonText::new),
        response_message: job.rollout.message.clone(),
        prompt_text: texts.prompt_text,
        response_text: texts.response_text,
        prompt_is_prefix: texts.prompt_is_prefix,
        prompt_ids,
        response_ids,
        alignment,
        finish_reason: job.rollout.finish.reason.clone(),
        streamed: job.rollout.streamed,
        token_source,
        weight_version: None,
        origin: job.origin.clone(),
        engine_prompts_agreed: false,
        sampling: job.sampling,
        routed_experts: None,
        routed_experts_missing: None,
    }
}

/// The engine's prompt ids must hold one run of image pad tokens per image, each as long as the
/// model's processor makes it: otherwise the engine expanded the images with other processor
/// settings than `preprocessor_config.json` (a sample whose prompt the trainer's processor would
/// not match), and the turn is dropped (`image_pad_mismatch`).
pub(crate) fn check_engine_pads(
    prompt: &[u32],
    vision: &ps_chat_template::Vision,
    pads: &[usize],
) -> Result<(), CaptureError> {
    let runs = vision.pad_runs(prompt);
    if runs == pads {
        return Ok(());
    }
    Err(CaptureError::Refused {
        reason: "image_pad_mismatch",
        detail: format!(
            "the engine's prompt holds runs of {runs:?} image pad tokens where the model's \
             processor gives {pads:?}: the engine resizes images otherwise than \
             preprocessor_config.json in the model directory (its min/max pixels, e.g. \
             --mm-processor-kwargs); serve both with the same processor settings"
        ),
    })
}

/// A turn re-rendered and re-tokenized, its log-probs aligned to the tokens.
pub(crate) fn retokenized_turn(
    tok: &ChatTokenizer,
    job: &CaptureJob,
    pads: &[usize],
    policy: AlignPolicy,
    cache: Option<&PrefixCache>,
) -> Result<CapturedTurn, CaptureError> {
    let session_id = job.guard.session_id();
    let prev = cache.and_then(|c| c.get(session_id));
    let (mut tokens, next) = tok.split_turn_cached(
        &TurnInput {
            messages: &job.messages,
            tools: job.tools.as_ref(),
            response_message: &job.rollout.message,
            template_kwargs: job.template_kwargs.as_ref(),
        },
        prev.as_deref(),
        cache.map(|c| &c.shared),
    )?;
    match (cache, next) {
        (Some(cache), _) if job.session_done => cache.forget(session_id),
        (Some(cache), Some(next)) => cache.put(session_id, next),
        _ => {}
    }
    // The template wrote one pad per image; the processor repeats each to its image's count (the
    // cached prefix keeps the rendered text's own ids: the next turn expands again).
    if !pads.is_empty() {
        tokens.prompt_ids = tok.expand_image_pads(&tokens.prompt_ids, pads)?;
    }
    let alignment = align_logprobs(
        &tokens.response_ids,
        |id| tok.token_text(id),
        &job.rollout.tokens,
        &job.rollout.finish,
        tok.eos_token_id(),
        policy,
    );
    Ok(captured_turn(
        job,
        ps_chat_template::TurnTexts {
            prompt_text: tokens.prompt_text,
            full_text: tokens.full_text,
            response_text: tokens.response_text,
            prompt_is_prefix: tokens.prompt_is_prefix,
        },
        (tokens.prompt_ids, tokens.response_ids),
        alignment,
        TokenSource::Retokenized,
    ))
}

/// Counts and logs what a captured turn tells an operator.
pub(crate) fn report(turn: &CapturedTurn) {
    let a = &turn.alignment;
    if !turn.prompt_is_prefix {
        metrics::counter!(m::PROMPT_NOT_PREFIX_TOTAL).increment(1);
        tracing::warn!(
            session_id = %turn.session_id, turn = turn.turn,
            "the rendered conversation does not start with the rendered prompt; the whole text is taken as the response"
        );
    }
    if a.unmatched_upstream > 0 {
        metrics::counter!(m::TOKEN_MISMATCH_TOTAL).increment(1);
        tracing::warn!(
            session_id = %turn.session_id, turn = turn.turn,
            unmatched = a.unmatched_upstream,
            first_unmatched = a.first_unmatched_upstream,
            by_ids = a.matched_by_ids,
            "sampled tokens differ from the re-rendered response tokens; their positions carry no log-prob"
        );
    }
    let eos = a
        .sources
        .iter()
        .filter(|s| **s == PositionSource::EosUnreported)
        .count();
    let unsampled = a
        .sources
        .iter()
        .filter(|s| **s == PositionSource::Unsampled)
        .count();
    metrics::counter!(m::MARKED_POSITIONS_TOTAL, "source" => "eos_unreported")
        .increment(eos as u64);
    metrics::counter!(m::MARKED_POSITIONS_TOTAL, "source" => "unsampled")
        .increment(unsampled as u64);
}
