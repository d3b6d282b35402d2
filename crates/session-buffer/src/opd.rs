//! On-policy distillation and Combine: judging one turn (`OpdJudging`: hint votes beside the eval
//! votes, then the teacher) and what it becomes.
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

use std::future::Future;
use std::sync::Arc;

use ps_chat_template::{ChatTokenizer, EncodedPrefix, SharedPrefixCache, TurnInput};
use ps_core::ports::PrmScore;
use ps_core::ports::{HintJudge, HintOutcome};
use ps_core::ports::{TeacherLogprobs, TeacherScorer};
use ps_core::sample::Sample;
use ps_core::{CapturedTurn, JsonText, TokenSource};
use ps_opd_judge::TeacherResponse;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

pub use crate::rules::MASKED_WITHOUT_LOGPROB;

use crate::config::{BufferMode, OpdOptions};
use crate::input::judge_input;
use ps_core::ports::{OpdFacts, OpdRecord, RecordSink};

use crate::records::record_turn;
use crate::rules::{RlDecision, list_trained_placeholders, rl_sample};
use crate::session_prompt::SessionPrompt;
use crate::state::Job;

/// What OPD needs besides the PRM: the hint judge, the teacher and the policy's tokenizer (to render
/// the hinted prompt), with the cap on concurrent teacher calls (`teacher.max_concurrency`) and
/// what capture's drift check found about engines' prompt ids (`engine_prompts`: while they
/// agree with our encoding, an engine-id turn's teacher prompt is built on its prompt ids; the
/// default, nothing compared, never does).
#[derive(Clone)]
pub struct OpdParts {
    pub hint: Arc<dyn HintJudge>,
    pub teacher: Arc<dyn TeacherScorer>,
    pub tokenizer: Arc<ChatTokenizer>,
    pub teacher_permits: Option<Arc<Semaphore>>,
    pub engine_prompts: ps_core::EnginePrompts,
    /// `opd.teacher_temperature`.
    pub teacher_temperature: ps_core::ports::TeacherTemperature,
}

impl std::fmt::Debug for OpdParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpdParts")
            .field("teacher", &self.teacher.describe())
            .finish_non_exhaustive()
    }
}

/// Where the teacher path finds what is already encoded: the session's latest prompt, and the
/// system prompts and tools of all sessions.
#[derive(Clone, Copy)]
pub(crate) struct EncodedSoFar<'a> {
    pub session: &'a SessionPrompt,
    pub shared: &'a Arc<SharedPrefixCache>,
}

/// Why a teacher signal could not be used.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TeacherFailure {
    pub reason: &'static str,
    pub detail: String,
}

/// The teacher's values of a turn rendered in full: the hinted prompt rendered with content lists
/// kept (as the engine hands them to a template that loops over content) and its images'
/// placeholders, each pad repeated to its image's count as at capture, then the turn's own
/// response ids; the images, if any, go beside the ids (`image_data`, data URLs in prompt order).
/// Rendered in full: the prefix caches of the text path hold flattened, unexpanded ids.
async fn rendered_teacher_signal(
    parts: &OpdParts,
    turn: &CapturedTurn,
    hint: &str,
    top_k: usize,
) -> Result<TeacherLogprobs, TeacherFailure> {
    use base64::Engine as _;
    let failed = |detail: String| TeacherFailure {
        reason: "teacher_error",
        detail,
    };
    let mut image_data = Vec::with_capacity(turn.images.len());
    for image in &turn.images {
        let Some(bytes) = &image.bytes else {
            return Err(failed(format!(
                "image {} has no bytes in memory",
                image.hash
            )));
        };
        image_data.push(format!(
            "data:{};base64,{}",
            image.mime,
            base64::engine::general_purpose::STANDARD.encode(bytes)
        ));
    }
    let messages: Vec<serde_json::Value> = turn
        .messages
        .parse()
        .map_err(|e| failed(format!("the turn's request could not be read back: {e}")))?;
    let tools = turn
        .tools
        .as_ref()
        .map(JsonText::parse)
        .transpose()
        .map_err(|e| failed(format!("the turn's tools could not be read back: {e}")))?;
    let kwargs = turn
        .template_kwargs
        .as_ref()
        .map(JsonText::parse)
        .transpose()
        .map_err(|e| {
            failed(format!(
                "the turn's template kwargs could not be read back: {e}"
            ))
        })?;
    let counts: Vec<usize> = turn.images.iter().map(|i| i.tokens).collect();
    let (tok, hint_owned, response) = (
        parts.tokenizer.clone(),
        hint.to_owned(),
        turn.response_ids.clone(),
    );
    let ids = tokio::task::spawn_blocking(move || {
        let hinted = ps_opd_judge::append_hint_keeping_lists(
            &messages,
            &hint_owned,
            tok.keeps_content_lists(),
        );
        let text = tok.render(&hinted, tools.as_ref(), true, kwargs.as_ref())?;
        let mut ids = tok.expand_image_pads(&tok.encode(&text)?, &counts)?;
        ids.extend_from_slice(&response);
        Ok::<_, ps_chat_template::ChatTemplateError>(ids)
    })
    .await
    .map_err(|e| failed(format!("rendering the teacher prompt panicked: {e}")))?
    .map_err(|e| failed(format!("rendering the teacher prompt failed: {e}")))?;
    score_and_check(parts, turn, &ids, top_k, &image_data).await
}

/// Renders the hinted prompt + original response, tokenizes it (only what the hint changes: the
/// rest is the turn's encoded prompt), asks the teacher for the last `T` positions and checks that
/// the teacher scored our very response tokens.
pub(crate) async fn teacher_signal(
    parts: &OpdParts,
    turn: &CapturedTurn,
    hint: &str,
    top_k: usize,
    encoded: EncodedSoFar<'_>,
) -> Result<TeacherLogprobs, TeacherFailure> {
    // A prompt with images is scored with them (an SGLang teacher takes `image_data` beside the
    // ids); a teacher that scores ids alone would score a prompt the policy never saw.
    if !turn.images.is_empty() {
        if !parts.teacher.takes_images() {
            return Err(TeacherFailure {
                reason: "teacher_without_images",
                detail: format!(
                    "the turn's prompt holds {} image(s) and the teacher ({}) scores token ids \
                     only: no teacher log-probs of the prompt the policy saw",
                    turn.images.len(),
                    parts.teacher.describe()
                ),
            });
        }
        return rendered_teacher_signal(parts, turn, hint, top_k).await;
    }
    // A template that loops over a message's content gets content lists as they are (the
    // engine hands them so): the encoded-prefix path below flattens them, so such a model's
    // teacher prompt is rendered in full, as an image turn's.
    if parts.tokenizer.keeps_content_lists() {
        return rendered_teacher_signal(parts, turn, hint, top_k).await;
    }
    let tok = parts.tokenizer.clone();
    // Built on the engine's prompt ids only if the drift check agreed when the turn was captured
    // and still does.
    let agree = turn.engine_prompts_agreed && parts.engine_prompts.agree();
    let input = TeacherTurn::of(turn, hint, agree)?;
    let (session, shared) = (encoded.session.clone(), encoded.shared.clone());
    let engine_prompts = parts.engine_prompts.clone();
    // Rendering and tokenizing are blocking work: off the executor.
    let ids = tokio::task::spawn_blocking(move || {
        input.input_ids(&tok, &session, &shared, &engine_prompts)
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
    score_and_check(parts, turn, &ids, top_k, &[]).await
}

/// Asks the teacher (within its permits) for its values of the last `T` tokens of `ids` (`T`: the
/// turn's response length), with the prompt's images when there are any, and checks that it
/// scored the turn's very response ids.
async fn score_and_check(
    parts: &OpdParts,
    turn: &CapturedTurn,
    ids: &[u32],
    top_k: usize,
    image_data: &[String],
) -> Result<TeacherLogprobs, TeacherFailure> {
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
    let (temperature, assumed) = parts.teacher_temperature.for_turn(&turn.sampling);
    let result = parts
        .teacher
        .score_at(ids, t, top_k, image_data, temperature)
        .await
        .map(|mut s| {
            s.temperature = temperature;
            s.temperature_assumed = assumed;
            s
        });
    metrics::histogram!(ps_core::metric_names::TEACHER_SECONDS)
        .record(started.elapsed().as_secs_f64());
    let signal = result.map_err(|e| TeacherFailure {
        reason: if e.reason() == ps_core::ports::TEACHER_WITHOUT_IMAGES {
            ps_core::ports::TEACHER_WITHOUT_IMAGES
        } else {
            "teacher_error"
        },
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

/// What the teacher's input is made from, owned for the blocking pool.
struct TeacherTurn {
    hint: String,
    messages: Vec<serde_json::Value>,
    tools: Option<serde_json::Value>,
    template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    prompt_text: String,
    prompt_ids: Vec<u32>,
    response: Response,
}

/// The response the teacher scores.
enum Response {
    /// An engine-id turn's: the engine's own ids, scored as they are. `prompt_ids` holds the
    /// engine's prompt ids when the drift check's prompts agree, else nothing.
    Engine(Vec<u32>),
    /// A re-tokenized turn's: its text and exactly its ids.
    Text(String, Vec<u32>),
}

impl TeacherTurn {
    /// The turn's request parts are parsed back into trees here (the turn holds them as text).
    /// An engine-id turn's prompt ids are kept only when `engine_prompts_agree` (the drift check
    /// compared engines' prompt ids with our encoding and found them equal, every time).
    fn of(
        turn: &CapturedTurn,
        hint: &str,
        engine_prompts_agree: bool,
    ) -> Result<Self, TeacherFailure> {
        let unreadable = |e: serde_json::Error| TeacherFailure {
            reason: "teacher_error",
            detail: format!("the turn's request could not be read back: {e}"),
        };
        let engine = turn.token_source == TokenSource::Engine;
        Ok(Self {
            hint: hint.to_owned(),
            messages: turn.messages.parse().map_err(unreadable)?,
            tools: turn
                .tools
                .as_ref()
                .map(JsonText::parse)
                .transpose()
                .map_err(unreadable)?,
            template_kwargs: turn
                .template_kwargs
                .as_ref()
                .map(JsonText::parse)
                .transpose()
                .map_err(unreadable)?,
            prompt_text: turn.prompt_text.clone(),
            // An engine-id turn's prompt ids are reused only while the drift check agrees (see
            // `SessionPrompt` for the other way).
            prompt_ids: if engine && !engine_prompts_agree {
                Vec::new()
            } else {
                turn.prompt_ids.clone()
            },
            response: if engine {
                Response::Engine(turn.response_ids.clone())
            } else {
                Response::Text(turn.response_text.clone(), turn.response_ids.clone())
            },
        })
    }

    /// The teacher's input ids, encoding only the hinted message and what the turn's encoded
    /// prompt does not already hold: exactly a full encode of the hinted prompt + response text
    /// (an engine-id turn: of the hinted prompt, then the engine's response ids), except for an
    /// engine-id turn kept with its prompt ids, which are built on: the engine's ids before and
    /// after the hinted message around our encode of it, then its response ids (exactly the full
    /// encode wherever the engine's ids are our encoding of the text, as the drift check found
    /// on every prompt it compared, which need not have included this one).
    fn input_ids(
        self,
        tok: &ChatTokenizer,
        session: &SessionPrompt,
        shared: &SharedPrefixCache,
        engine_prompts: &ps_core::EnginePrompts,
    ) -> Result<Vec<u32>, ps_chat_template::ChatTemplateError> {
        let Self {
            hint,
            messages,
            tools,
            template_kwargs,
            prompt_text,
            prompt_ids,
            response,
        } = self;
        let prompt = match &response {
            // A re-tokenized turn's prompt ids are the capture's exact encode of its prompt text.
            Response::Text(..) => Arc::new(tok.encoded_from(prompt_text, prompt_ids)),
            // Without splicing nothing is reused, and `teacher_input_ids` does not read this.
            Response::Engine(_) if !tok.splices() => Arc::new(EncodedPrefix::default()),
            // The engine's prompt ids, while the drift check finds the prompts it compares equal
            // to our encoding (this one may not have been compared).
            Response::Engine(_) if !prompt_ids.is_empty() => {
                match tok.encoded_from_engine(prompt_text, prompt_ids) {
                    Some(prompt) => Arc::new(prompt),
                    // Not this text's encoding even on its added tokens: a prompt that differs,
                    // as the drift check would have found. The whole hinted text is encoded.
                    None => {
                        if engine_prompts.record(false) {
                            tracing::warn!(
                                "an engine-id turn's prompt ids disagree with its text on added \
                                 tokens (<|im_start|> and the like): the chat template here differs \
                                 from the engine's; the OPD teacher encodes prompt texts itself \
                                 from now on (engine_prompts_agree false in /v1/rollout/status)"
                            );
                        }
                        Arc::new(EncodedPrefix::default())
                    }
                }
            }
            Response::Engine(_) => {
                let null = serde_json::Value::Null;
                let input = TurnInput {
                    messages: &messages,
                    tools: tools.as_ref(),
                    response_message: &null,
                    template_kwargs: template_kwargs.as_ref(),
                };
                let previous = session.get();
                let prompt = Arc::new(tok.encode_prompt_cached(
                    &input,
                    &prompt_text,
                    previous.as_deref(),
                    Some(shared),
                )?);
                session.set(prompt.clone());
                prompt
            }
        };
        let text_response;
        let response = match response {
            Response::Engine(ref ids) => TeacherResponse::EngineIds(ids),
            Response::Text(text, ids) => {
                text_response = tok.encoded_from(text, ids);
                TeacherResponse::Text(&text_response)
            }
        };
        ps_opd_judge::teacher_input_ids(
            tok,
            &messages,
            tools.as_ref(),
            &hint,
            response,
            template_kwargs.as_ref(),
            &prompt,
        )
    }
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
    s.metadata
        .insert("teacher_temperature".into(), json!(signal.temperature));
    if signal.temperature_assumed {
        s.metadata
            .insert("teacher_temperature_assumed".into(), json!(true));
    }
    s.teacher_log_probs = Some(signal.log_probs);
    s.teacher_topk_log_probs = signal.topk_log_probs;
    s.teacher_topk_indices = signal.topk_indices;
    annotate(&mut s, mode, hint, eval);
    s.metadata.insert("teacher".into(), json!("hinted"));
    s
}

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

/// What judging an OPD/Combine turn gave.
pub(crate) enum OpdVerdict {
    Sample(Box<Sample>),
    /// No sample: the caller counts and logs it (`reason`, `detail`), then writes `record`.
    Drop {
        reason: &'static str,
        detail: String,
        record: Box<OpdRecord>,
    },
}

/// What judging an OPD/Combine turn needs besides the PRM.
pub(crate) struct OpdJudging<'a> {
    pub parts: Option<&'a OpdParts>,
    pub mode: BufferMode,
    pub options: OpdOptions,
    pub records: Option<&'a dyn RecordSink>,
    pub observer: &'a crate::status::Observer,
    /// The teacher path's system prompts and tools, shared by all sessions.
    pub shared_prefixes: &'a Arc<SharedPrefixCache>,
}

impl OpdJudging<'_> {
    /// Judges one turn: hint votes (and eval votes through `eval`, which runs the PRM on the
    /// given next state), then the teacher; writes the conversation, PRM and OPD records of a
    /// turn that becomes a sample (a dropped turn's OPD record is the caller's to write).
    pub async fn judge<F, Fut>(&self, job: &Job, eval: F) -> OpdVerdict
    where
        F: FnOnce(Value) -> Fut,
        Fut: Future<Output = Option<PrmScore>>,
    {
        let mode = self.mode;
        let combine = mode == BufferMode::Combine;
        let opts = self.options;
        let facts = |dropped: Option<(&'static str, &'static str)>| OpdFacts {
            session_id: &job.session_id,
            turn: job.turn_no,
            mode: mode.as_str(),
            hint: None,
            eval: None,
            signal: None,
            dropped,
        };
        let Some(parts) = self.parts else {
            return OpdVerdict::Drop {
                reason: "opd_not_configured",
                detail: "no hint judge or teacher is configured".into(),
                record: Box::new(OpdRecord::new(facts(Some(("opd_not_configured", ""))))),
            };
        };
        let next = match (&job.next, opts.drop_without_next_state || combine) {
            (Some(v), _) => v.clone(),
            (None, true) => {
                record_turn(
                    self.records,
                    &job.session_id,
                    job.turn_no,
                    &job.turn,
                    None,
                    None,
                );
                return OpdVerdict::Drop {
                    reason: "no_next_state",
                    detail: "the turn never got a next state".into(),
                    record: Box::new(OpdRecord::new(facts(Some(("no_next_state", ""))))),
                };
            }
            (None, false) => json!({"role": "user", "content": ""}),
        };
        // Pure OPD needs the teacher's values: an image turn with a teacher that cannot take
        // images is dropped before any hint vote is spent on it.
        if !combine && !job.turn.images.is_empty() && !parts.teacher.takes_images() {
            let detail = format!(
                "the turn's prompt holds {} image(s) and the teacher ({}) scores token ids only",
                job.turn.images.len(),
                parts.teacher.describe()
            );
            record_turn(
                self.records,
                &job.session_id,
                job.turn_no,
                &job.turn,
                job.next.as_ref(),
                None,
            );
            return OpdVerdict::Drop {
                reason: "teacher_without_images",
                record: Box::new(OpdRecord::new(facts(Some(("teacher_without_images", ""))))),
                detail,
            };
        }
        let input = judge_input(&job.turn, &next);
        let want_eval = combine || opts.eval_votes;
        let (hint, eval) = futures::join!(parts.hint.judge(&input), async {
            if want_eval { eval(next).await } else { None }
        });
        for v in hint.scores() {
            let outcome = match v {
                Some(1) => "1",
                Some(_) => "-1",
                None => "failed",
            };
            metrics::counter!(ps_core::metric_names::HINT_VOTES_TOTAL, "outcome" => outcome)
                .increment(1);
        }
        self.observer.tell(ps_core::TurnEvent::HintVotes {
            session: &job.session_id,
            turn: job.turn_no,
            votes: &hint.scores(),
            hint: hint.hint(),
        });
        record_turn(
            self.records,
            &job.session_id,
            job.turn_no,
            &job.turn,
            job.next.as_ref(),
            eval.as_ref(),
        );
        let eval_score = eval.as_ref().map_or(0.0, |e| e.score);
        let signal = match hint.hint() {
            Some(h) => {
                let encoded = EncodedSoFar {
                    session: &job.prompt,
                    shared: self.shared_prefixes,
                };
                Some(teacher_signal(parts, &job.turn, h, opts.top_k, encoded).await)
            }
            None => None,
        };
        let record = |signal: Option<&TeacherLogprobs>, dropped: Option<(&str, &str)>| {
            OpdRecord::new(OpdFacts {
                session_id: &job.session_id,
                turn: job.turn_no,
                mode: mode.as_str(),
                hint: Some(&hint),
                eval: eval.as_ref(),
                signal,
                dropped,
            })
        };
        match signal {
            Some(Ok(signal)) => {
                self.observer.tell(ps_core::TurnEvent::Teacher {
                    session: &job.session_id,
                    turn: job.turn_no,
                    outcome: ps_core::TeacherOutcome::Scored,
                });
                let reward = if combine { eval_score } else { 1.0 };
                if let Some(r) = self.records {
                    r.opd(record(Some(&signal), None));
                }
                OpdVerdict::Sample(Box::new(distill_sample(
                    &job.turn,
                    reward,
                    signal,
                    mode.as_str(),
                    &hint,
                    eval.as_ref(),
                )))
            }
            failed => {
                // No usable teacher signal: no hint, or the teacher failed / mismatched.
                let (reason, detail) = match &failed {
                    Some(Err(f)) => (f.reason, f.detail.clone()),
                    _ => (
                        "no_hint",
                        format!(
                            "no hint longer than the minimum among {} votes",
                            hint.votes.len()
                        ),
                    ),
                };
                match eval.as_ref().filter(|e| combine && e.score != 0.0) {
                    Some(e) => {
                        if let Some(r) = self.records {
                            r.opd(record(None, Some((reason, &detail))));
                        }
                        OpdVerdict::Sample(Box::new(combine_rl_sample(&job.turn, e, &hint)))
                    }
                    None => OpdVerdict::Drop {
                        record: Box::new(record(None, Some((reason, &detail)))),
                        reason,
                        detail,
                    },
                }
            }
        }
    }
}
