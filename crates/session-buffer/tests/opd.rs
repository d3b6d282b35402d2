//! OPD and Combine through the session buffer, with mockall mocks and small fakes for the hint judge,
//! the teacher and the PRM.
//!
//! Long because each OPD/Combine outcome (sample, each drop reason, caps) has its own case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ps_chat_template::{ChatTokenizer, TurnInput};
use ps_core::ports::{
    CallError, ConversationRecord, HintOutcome, HintVote, JudgeInput, MockHintJudge,
    MockTeacherScorer, OpdRecord, PrmRecord, PrmScore, RecordSink, TeacherLogprobs, TeacherScorer,
    ToJson, TurnScorer,
};
use ps_core::sample::Sample;
use ps_core::{
    AlignPolicy, CapturedTurn, EnginePrompts, FinishReason, SampleSink, SampledToken, SinkError,
    TurnSink, align_logprobs,
};
use ps_session_buffer::{BufferConfig, BufferMode, OpdOptions, OpdParts, SessionBuffer};
use ps_teacher_client::TeacherError;
use serde_json::{Value, json};

#[derive(Default)]
struct CollectSink(Mutex<Vec<Sample>>);

#[async_trait::async_trait]
impl SampleSink for CollectSink {
    async fn submit(&self, sample: &Sample) -> Result<u64, SinkError> {
        let mut v = self.0.lock().unwrap();
        v.push(sample.clone());
        Ok(v.len() as u64)
    }
}

#[derive(Default)]
struct CollectRecords(Mutex<Vec<Value>>);

impl RecordSink for CollectRecords {
    fn conversation(&self, _: ConversationRecord) {}
    fn prm(&self, _: PrmRecord) {}
    fn opd(&self, r: OpdRecord) {
        self.0.lock().unwrap().push(r.to_json());
    }
}

/// PRM eval: the score is `eval:<n>` in the next state.
struct EvalByText;

#[async_trait::async_trait]
impl TurnScorer for EvalByText {
    async fn score(&self, input: &JudgeInput) -> PrmScore {
        let v = input
            .next_state_text
            .split("eval:")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse::<i8>().ok());
        PrmScore {
            votes: vec![v; 3],
            score: f64::from(v.unwrap_or(0)),
            representative: None,
            failures: vec![None; 3],
        }
    }
}

/// The hint outcome a judge would give: a hint when the next state says `hint:<text>|`.
fn outcome_for(input: &JudgeInput) -> HintOutcome {
    let hint = input
        .next_state_text
        .split("hint:")
        .nth(1)
        .and_then(|s| s.split('|').next())
        .map(str::to_owned);
    let votes = vec![
        HintVote {
            score: Some(if hint.is_some() { 1 } else { -1 }),
            hint: hint.clone().unwrap_or_default(),
        };
        3
    ];
    HintOutcome {
        votes,
        failures: vec![None; 3],
        best: hint.map(|h| (0, h)),
        representative: None,
    }
}

fn hint_judge() -> MockHintJudge {
    let mut m = MockHintJudge::new();
    m.expect_judge().returning(outcome_for);
    m
}

/// A teacher that echoes what it was sent and gives position-dependent values.
fn echo_teacher(top_k_seen: Arc<Mutex<Vec<usize>>>) -> MockTeacherScorer {
    let mut t = MockTeacherScorer::new();
    t.expect_score_at().returning(move |ids, n, k, _, _| {
        top_k_seen.lock().unwrap().push(k);
        let tail = &ids[ids.len() - n..];
        Ok(TeacherLogprobs {
            log_probs: (0..n).map(|i| -0.01 * (i + 1) as f64).collect(),
            topk_log_probs: (k > 0).then(|| vec![vec![-0.5; k]; n]),
            topk_indices: (k > 0).then(|| tail.iter().map(|&id| vec![id; k]).collect()),
            echoed_ids: tail.to_vec(),
            echo_verified: true,
            temperature: 0.0,
            temperature_assumed: false,
        })
    });
    t.expect_describe().return_const("echo teacher".to_owned());
    t
}

struct Rig {
    buffer: SessionBuffer,
    sink: Arc<CollectSink>,
    records: Arc<CollectRecords>,
    tok: Arc<ChatTokenizer>,
}

fn rig_with(mode: BufferMode, opd: OpdOptions, teacher: MockTeacherScorer) -> Rig {
    rig_prm(mode, opd, teacher, true)
}

fn rig_prm(
    mode: BufferMode,
    opd: OpdOptions,
    teacher: MockTeacherScorer,
    prm_enabled: bool,
) -> Rig {
    rig_parts(
        mode,
        opd,
        Arc::new(teacher),
        prm_enabled,
        Arc::new(tokio::sync::Semaphore::new(2)),
        EnginePrompts::default(),
    )
}

/// The buffer with its OPD parts, and what the drift check found about engines' prompt ids.
fn rig_parts(
    mode: BufferMode,
    opd: OpdOptions,
    teacher: Arc<dyn TeacherScorer>,
    prm_enabled: bool,
    teacher_permits: Arc<tokio::sync::Semaphore>,
    engine_prompts: EnginePrompts,
) -> Rig {
    let tok = Arc::new(ChatTokenizer::mini());
    let sink = Arc::new(CollectSink::default());
    let records = Arc::new(CollectRecords::default());
    let buffer = SessionBuffer::with_opd(
        BufferConfig {
            mode,
            opd,
            prm_enabled,
            session_timeout: Duration::from_secs(60),
            max_sessions: 100,
            max_judge_backlog: usize::MAX,
        },
        Some(Arc::new(EvalByText)),
        Some(OpdParts {
            hint: Arc::new(hint_judge()),
            teacher,
            tokenizer: tok.clone(),
            teacher_permits: Some(teacher_permits),
            engine_prompts,
            teacher_temperature: Default::default(),
        }),
        sink.clone(),
        Some(records.clone()),
    );
    Rig {
        buffer,
        sink,
        records,
        tok,
    }
}

fn rig(mode: BufferMode) -> Rig {
    rig_with(mode, OpdOptions::default(), echo_teacher(Arc::default()))
}

/// A real captured turn rendered with the mini model: the teacher input built from it ends with
/// exactly these response ids.
fn captured(tok: &ChatTokenizer, session: &str, turn: u64) -> CapturedTurn {
    captured_unreported(tok, session, turn, 1)
}

/// As [`captured`], with the upstream reporting no log-prob for the last `unreported` response
/// tokens (2: the end-of-turn token the model stopped on, and the template's newline after it).
fn captured_unreported(
    tok: &ChatTokenizer,
    session: &str,
    turn: u64,
    unreported: usize,
) -> CapturedTurn {
    let messages = vec![json!({"role": "user", "content": "How far is the moon?"})];
    let response = json!({"role": "assistant", "content": "About 384,400 km.", "reasoning_content": "Recall the mean distance."});
    let t = tok
        .split_turn(&TurnInput {
            messages: &messages,
            tools: None,
            response_message: &response,
            template_kwargs: None,
        })
        .unwrap();
    let sampled: Vec<SampledToken> = t.response_ids[..t.response_ids.len() - unreported]
        .iter()
        .map(|&id| SampledToken {
            token: tok.token_text(id),
            id: Some(id),
            logprob: -0.25,
        })
        .collect();
    let alignment = align_logprobs(
        &t.response_ids,
        |id| tok.token_text(id),
        &sampled,
        &FinishReason {
            reason: Some("stop".into()),
            matched_stop: Value::Null,
        },
        tok.eos_token_id(),
        AlignPolicy::default(),
    );
    CapturedTurn {
        images: Vec::new(),
        sampling: Default::default(),
        routed_experts: None,
        routed_experts_missing: None,
        session_id: session.into(),
        turn,
        arrival_seq: turn,
        messages: messages.into(),
        tools: None,
        template_kwargs: None,
        response_message: response,
        prompt_text: t.prompt_text,
        response_text: t.response_text,
        prompt_is_prefix: t.prompt_is_prefix,
        prompt_ids: t.prompt_ids,
        response_ids: t.response_ids,
        alignment,
        finish_reason: Some("stop".into()),
        streamed: false,
        token_source: ps_core::TokenSource::Retokenized,
        weight_version: None,
        origin: Default::default(),
        engine_prompts_agreed: false,
    }
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

async fn wait_for(mut cond: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out");
}

/// One turn of `session` whose next state is `next`; the session then ends.
async fn one_turn(r: &Rig, session: &str, next: &str) {
    let t1 = r.buffer.begin(session, Some(&user("q")), false);
    r.buffer.accept(captured(&r.tok, session, t1));
    let t2 = r.buffer.begin(session, Some(&user(next)), true);
    r.buffer.abandon(session, t2, "test");
    wait_for(|| {
        r.buffer.status().pending == Default::default() && r.buffer.status().live_sessions == 0
    })
    .await;
}

fn samples(r: &Rig) -> Vec<Sample> {
    r.sink.0.lock().unwrap().clone()
}

fn opd_records(r: &Rig) -> Vec<Value> {
    r.records.0.lock().unwrap().clone()
}

#[tokio::test]
async fn an_accepted_hint_gives_a_distillation_sample_with_the_teachers_signal() {
    let r = rig(BufferMode::Opd);
    one_turn(
        &r,
        "s",
        "Use miles please. hint:Answer in miles for a US user|",
    )
    .await;
    let s = samples(&r);
    assert_eq!(s.len(), 1);
    let s = &s[0];
    let t = s.response_length;
    assert_eq!(s.reward.score, 1.0);
    assert_eq!(s.loss_mask, vec![1; t], "all ones, as the reference");
    let teacher = s.teacher_log_probs.as_ref().unwrap();
    assert_eq!(teacher.len(), t);
    assert_eq!(
        teacher[0], -0.01,
        "the first response token has its real value"
    );
    assert!(s.teacher_topk_log_probs.is_none());
    assert_eq!(s.metadata["mode"], "opd");
    assert_eq!(s.metadata["hint"], "Answer in miles for a US user");
    // The student's tokens are the original prompt's, not the hinted one's.
    let prompt_len = s.tokens.len() - t;
    assert!(!r.tok.token_text(s.tokens[prompt_len - 1]).contains("hint"));
    let rec = opd_records(&r);
    assert_eq!(rec[0]["accepted"], true);
    assert_eq!(rec[0]["outcome"], "distilled");
    assert_eq!(rec[0]["hint_len"], 29);
    assert_eq!(rec[0]["teacher_log_probs_len"], t);
}

#[tokio::test]
async fn top_k_fields_have_t_rows_of_k() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let r = rig_with(
        BufferMode::Opd,
        OpdOptions {
            top_k: 5,
            ..OpdOptions::default()
        },
        echo_teacher(seen.clone()),
    );
    one_turn(&r, "s", "hint:Give the distance in miles too|").await;
    let s = &samples(&r)[0];
    let rows = s.teacher_topk_log_probs.as_ref().unwrap();
    assert_eq!(rows.len(), s.response_length);
    assert!(rows.iter().all(|r| r.len() == 5));
    assert_eq!(
        s.teacher_topk_indices.as_ref().unwrap().len(),
        s.response_length
    );
    assert_eq!(*seen.lock().unwrap(), vec![5]);
}

#[tokio::test]
async fn turns_without_a_hint_or_a_next_state_give_no_sample_and_are_recorded() {
    let r = rig(BufferMode::Opd);
    one_turn(&r, "a", "ok thanks").await; // no hint
    let t = r.buffer.begin("b", Some(&user("q")), true); // no next state
    r.buffer.accept(captured(&r.tok, "b", t));
    wait_for(|| r.buffer.status().turns_dropped == 2).await;
    assert!(samples(&r).is_empty());
    let reasons: Vec<Value> = opd_records(&r)
        .iter()
        .map(|x| x["reason"].clone())
        .collect();
    assert!(reasons.contains(&json!("no_hint")) && reasons.contains(&json!("no_next_state")));
    assert!(opd_records(&r).iter().all(|x| x["accepted"] == false));
}

#[tokio::test]
async fn a_teacher_that_scored_other_tokens_drops_the_sample_and_never_pads() {
    let mut t = MockTeacherScorer::new();
    t.expect_score_at().returning(|ids, n, _, _, _| {
        let mut echoed = ids[ids.len() - n..].to_vec();
        echoed[3] += 1; // a different tokenizer split
        Ok(TeacherLogprobs {
            log_probs: vec![-0.1; n],
            topk_log_probs: None,
            topk_indices: None,
            echoed_ids: echoed,
            echo_verified: true,
            temperature: 0.0,
            temperature_assumed: false,
        })
    });
    t.expect_describe()
        .return_const("mismatching teacher".to_owned());
    let r = rig_with(BufferMode::Opd, OpdOptions::default(), t);
    one_turn(&r, "s", "hint:Answer in miles for a US user|").await;
    assert!(samples(&r).is_empty());
    let st = r.buffer.status();
    assert_eq!((st.teacher_mismatches, st.turns_dropped), (1, 1));
    let rec = &opd_records(&r)[0];
    assert_eq!(rec["reason"], "teacher_token_mismatch");
    assert!(
        rec["detail"]
            .as_str()
            .unwrap()
            .contains("first differing position 3"),
        "{rec}"
    );
}

#[tokio::test]
async fn a_failing_teacher_drops_the_turn_with_its_reason() {
    let mut t = MockTeacherScorer::new();
    t.expect_score_at().returning(|_, _, _, _, _| {
        Err(TeacherError::Timeout {
            url: "http://t/generate".into(),
            after: Duration::from_secs(1),
            config_key: "teacher.timeout_sec",
        }
        .into())
    });
    t.expect_describe().return_const("slow teacher".to_owned());
    let r = rig_with(BufferMode::Opd, OpdOptions::default(), t);
    one_turn(&r, "s", "hint:Answer in miles for a US user|").await;
    assert!(samples(&r).is_empty());
    let rec = &opd_records(&r)[0];
    assert_eq!(rec["reason"], "teacher_error");
    assert!(
        rec["detail"]
            .as_str()
            .unwrap()
            .contains("teacher.timeout_sec")
    );
}

#[tokio::test]
async fn eval_mode_collects_prm_scores_beside_the_hints() {
    let r = rig_with(
        BufferMode::Opd,
        OpdOptions {
            eval_votes: true,
            ..OpdOptions::default()
        },
        echo_teacher(Arc::default()),
    );
    one_turn(&r, "s", "eval:-1 hint:Answer in miles for a US user|").await;
    assert_eq!(r.buffer.drain_eval_scores(), vec![-1.0]);
    assert_eq!(samples(&r)[0].reward.score, 1.0, "OPD reward stays 1.0");
}

#[tokio::test]
async fn combine_hint_and_nonzero_eval_gives_the_teacher_signal_with_the_eval_reward() {
    let r = rig(BufferMode::Combine);
    one_turn(&r, "s", "eval:-1 hint:Answer in miles for a US user|").await;
    let s = &samples(&r)[0];
    assert_eq!(s.reward.score, -1.0);
    assert_eq!(s.metadata["teacher"], "hinted");
    assert_eq!(s.teacher_log_probs.as_ref().unwrap()[0], -0.01);
}

#[tokio::test]
async fn combine_hint_and_zero_eval_gives_the_teacher_signal_with_reward_zero() {
    let r = rig(BufferMode::Combine);
    one_turn(&r, "s", "eval:0 hint:Answer in miles for a US user|").await;
    let s = &samples(&r)[0];
    assert_eq!(s.reward.score, 0.0);
    assert_eq!(s.metadata["teacher"], "hinted");
    assert_eq!(s.loss_mask, vec![1; s.response_length]);
}

#[tokio::test]
async fn combine_without_hint_and_nonzero_eval_gives_an_rl_sample_with_rollout_teacher_values() {
    let r = rig(BufferMode::Combine);
    one_turn(&r, "s", "eval:1 no hint here").await;
    let s = &samples(&r)[0];
    assert_eq!(s.reward.score, 1.0);
    assert_eq!(s.metadata["teacher"], "rollout");
    assert_eq!(s.teacher_log_probs.as_ref(), Some(&s.rollout_log_probs));
    let rec = &opd_records(&r)[0];
    assert_eq!(
        (rec["outcome"].as_str(), rec["reason"].as_str()),
        (Some("rl"), Some("no_hint"))
    );
    // The RL mask: the template's trailing newline is not trained.
    assert_eq!(*s.loss_mask.last().unwrap(), 0);
}

#[tokio::test]
async fn combine_with_neither_gives_nothing() {
    let r = rig(BufferMode::Combine);
    one_turn(&r, "s", "eval:0 nothing").await;
    assert!(samples(&r).is_empty());
    assert_eq!(r.buffer.status().turns_dropped, 1);
}

#[tokio::test]
async fn dropped_turns_do_not_block_later_samples_of_the_session() {
    let r = rig(BufferMode::Opd);
    let t1 = r.buffer.begin("s", Some(&user("q")), false);
    let t2 = r.buffer.begin("s", Some(&user("no hint")), false);
    let t3 = r.buffer.begin(
        "s",
        Some(&user("hint:Answer in miles for a US user|")),
        true,
    );
    r.buffer.accept(captured(&r.tok, "s", t1));
    r.buffer.accept(captured(&r.tok, "s", t2));
    r.buffer.accept(captured(&r.tok, "s", t3));
    wait_for(|| r.buffer.status().live_sessions == 0 && samples(&r).len() == 1).await;
    assert_eq!(samples(&r)[0].turn, 2);
}

/// OPD needs the real next state whatever `prm.enabled` says: with the PRM off a turn waits for
/// the next main request like any other, instead of being dropped as `no_next_state` (or
/// hint-judged against an empty message) the moment it is captured.
#[tokio::test]
async fn opd_with_the_prm_off_waits_for_the_real_next_state() {
    for drop_without_next_state in [true, false] {
        let opd = OpdOptions {
            drop_without_next_state,
            ..OpdOptions::default()
        };
        let r = rig_prm(BufferMode::Opd, opd, echo_teacher(Arc::default()), false);
        let t1 = r.buffer.begin("s", Some(&user("q")), false);
        r.buffer.accept(captured(&r.tok, "s", t1));
        tokio::task::yield_now().await;
        assert_eq!(
            r.buffer.status().pending.waiting_next_state,
            1,
            "drop_without_next_state = {drop_without_next_state}"
        );
        let t2 = r.buffer.begin(
            "s",
            Some(&user("hint:Answer in miles for a US user|")),
            true,
        );
        r.buffer.abandon("s", t2, "test");
        wait_for(|| r.buffer.status().live_sessions == 0 && samples(&r).len() == 1).await;
        let s = &samples(&r)[0];
        assert_eq!(s.metadata["hint"], "Answer in miles for a US user");
        assert_eq!(r.buffer.status().turns_dropped, 0);
    }
}

fn eos_position(tok: &ChatTokenizer, s: &Sample) -> usize {
    let eos = tok.eos_token_id().unwrap();
    let response = &s.tokens[s.tokens.len() - s.response_length..];
    response.iter().rposition(|&id| id == eos).unwrap()
}

/// Combine's RL-only sample copies the rollout log-probs into `teacher_log_probs`; the end-of-turn
/// token (trained by `capture.train_eos_without_logprob`) has no reported log-prob, so its copy
/// would be a 0.0 placeholder and a spurious positive advantage. It is taken out of the loss.
#[tokio::test]
async fn combine_rl_samples_never_train_a_placeholder_teacher_value() {
    let r = rig(BufferMode::Combine);
    let t1 = r.buffer.begin("s", Some(&user("q")), false);
    r.buffer.accept(captured_unreported(&r.tok, "s", t1, 2));
    let t2 = r
        .buffer
        .begin("s", Some(&user("eval:1 no hint here")), true);
    r.buffer.abandon("s", t2, "test");
    wait_for(|| r.buffer.status().live_sessions == 0 && samples(&r).len() == 1).await;
    let s = &samples(&r)[0];
    assert_eq!(s.metadata["teacher"], "rollout");
    let missing: Vec<usize> =
        serde_json::from_value(s.metadata["logprob_missing_positions"].clone()).unwrap();
    let eos = eos_position(&r.tok, s);
    assert!(missing.contains(&eos), "the EOS had no reported log-prob");
    for &i in &missing {
        assert_eq!(
            s.loss_mask[i], 0,
            "position {i} is a placeholder and must not be trained"
        );
    }
    assert!(
        s.loss_mask.contains(&1),
        "the sampled tokens are still trained"
    );
    assert_eq!(s.metadata["masked_without_logprob"], json!([eos]));
    assert_eq!(s.metadata["trained_without_rollout_logprob"], json!([]));
    let st = r.buffer.status();
    assert_eq!(
        (
            st.positions_masked_without_logprob,
            st.positions_trained_without_logprob
        ),
        (1, 0)
    );
}

/// Every trained position whose rollout log-prob is a placeholder is listed per sample (OPD trains
/// every position) and counted in the status.
#[tokio::test]
async fn trained_positions_without_a_rollout_logprob_are_listed_and_counted() {
    let r = rig(BufferMode::Opd);
    let t1 = r.buffer.begin("s", Some(&user("q")), false);
    r.buffer.accept(captured_unreported(&r.tok, "s", t1, 2));
    let t2 = r.buffer.begin(
        "s",
        Some(&user("hint:Answer in miles for a US user|")),
        true,
    );
    r.buffer.abandon("s", t2, "test");
    wait_for(|| r.buffer.status().live_sessions == 0 && samples(&r).len() == 1).await;
    let s = &samples(&r)[0];
    let t = s.response_length;
    assert_eq!(s.loss_mask, vec![1; t]);
    assert_eq!(
        s.metadata["trained_without_rollout_logprob"],
        json!([t - 2, t - 1]),
        "the EOS and the template newline after it"
    );
    assert_eq!(s.rollout_log_probs[t - 2], 0.0);
    assert_eq!(r.buffer.status().positions_trained_without_logprob, 2);
}

/// OPD records carry the teacher log-probs themselves under the operators' name `teacher_lp`.
#[tokio::test]
async fn opd_records_carry_the_teacher_log_probs_as_teacher_lp() {
    let r = rig(BufferMode::Opd);
    one_turn(&r, "s", "hint:Answer in miles for a US user|").await;
    let s = &samples(&r)[0];
    let rec = &opd_records(&r)[0];
    assert_eq!(
        rec["teacher_lp"],
        json!(s.teacher_log_probs.as_ref().unwrap())
    );
    assert_eq!(rec["teacher_log_probs_len"], s.response_length);
}

/// A teacher that echoes its input and holds every call until the test opens its gate, counting
/// the calls in flight.
struct GatedTeacher {
    gate: tokio::sync::Semaphore,
    in_flight: std::sync::atomic::AtomicUsize,
    max_in_flight: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl TeacherScorer for GatedTeacher {
    async fn score(&self, ids: &[u32], n: usize, _k: usize) -> Result<TeacherLogprobs, CallError> {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.in_flight.fetch_add(1, SeqCst) + 1;
        self.max_in_flight.fetch_max(now, SeqCst);
        self.gate.acquire().await.unwrap().forget();
        self.in_flight.fetch_sub(1, SeqCst);
        Ok(TeacherLogprobs {
            log_probs: vec![-0.1; n],
            topk_log_probs: None,
            topk_indices: None,
            echoed_ids: ids[ids.len() - n..].to_vec(),
            echo_verified: true,
            temperature: 0.0,
            temperature_assumed: false,
        })
    }

    fn describe(&self) -> String {
        "gated teacher".into()
    }
}

/// `teacher.max_concurrency`: the teacher permits cap the calls in flight across sessions (the
/// one cap of teacher calls; the teacher client has none of its own).
#[tokio::test]
async fn the_teacher_permits_cap_calls_in_flight() {
    use std::sync::atomic::Ordering::SeqCst;
    let teacher = Arc::new(GatedTeacher {
        gate: tokio::sync::Semaphore::new(0),
        in_flight: Default::default(),
        max_in_flight: Default::default(),
    });
    let permits = Arc::new(tokio::sync::Semaphore::new(2));
    let r = rig_parts(
        BufferMode::Opd,
        OpdOptions::default(),
        teacher.clone(),
        true,
        permits.clone(),
        EnginePrompts::default(),
    );
    for session in ["a", "b", "c"] {
        let t1 = r.buffer.begin(session, Some(&user("q")), false);
        r.buffer.accept(captured(&r.tok, session, t1));
        let t2 = r
            .buffer
            .begin(session, Some(&user("hint:use the table|")), true);
        r.buffer.abandon(session, t2, "test");
    }
    wait_for(|| teacher.in_flight.load(SeqCst) == 2).await;
    assert_eq!(permits.available_permits(), 0);
    teacher.gate.add_permits(3);
    wait_for(|| samples(&r).len() == 3).await;
    assert_eq!(teacher.max_in_flight.load(SeqCst), 2);
    assert_eq!(permits.available_permits(), 2);
}

/// A turn of `session` captured from `messages` and `response` (with `tools`): re-tokenized
/// (`engine` `None`), or with engine ids whose prompt part is `engine` applied to our encoding of
/// the prompt text, captured while the drift check agreed or not (`agreed`).
fn captured_from(
    tok: &ChatTokenizer,
    session: &str,
    turn: u64,
    (messages, tools, response): (&[Value], Option<&Value>, &Value),
    engine: Option<&dyn Fn(Vec<u32>) -> Vec<u32>>,
    agreed: bool,
) -> CapturedTurn {
    let t = tok
        .split_turn(&TurnInput {
            messages,
            tools,
            response_message: response,
            template_kwargs: None,
        })
        .unwrap();
    let sampled: Vec<SampledToken> = t
        .response_ids
        .iter()
        .map(|&id| SampledToken {
            token: tok.token_text(id),
            id: Some(id),
            logprob: -0.25,
        })
        .collect();
    let alignment = align_logprobs(
        &t.response_ids,
        |id| tok.token_text(id),
        &sampled,
        &FinishReason {
            reason: Some("stop".into()),
            matched_stop: Value::Null,
        },
        tok.eos_token_id(),
        AlignPolicy::default(),
    );
    let prompt_ids = match engine {
        Some(engine) => engine(t.prompt_ids),
        None => t.prompt_ids,
    };
    CapturedTurn {
        images: Vec::new(),
        sampling: Default::default(),
        routed_experts: None,
        routed_experts_missing: None,
        session_id: session.into(),
        turn,
        arrival_seq: turn,
        messages: messages.to_vec().into(),
        tools: tools.cloned().map(Into::into),
        template_kwargs: None,
        response_message: response.clone(),
        prompt_text: t.prompt_text,
        response_text: t.response_text,
        prompt_is_prefix: t.prompt_is_prefix,
        prompt_ids,
        response_ids: t.response_ids,
        alignment,
        finish_reason: Some("stop".into()),
        streamed: false,
        token_source: if engine.is_some() {
            ps_core::TokenSource::Engine
        } else {
            ps_core::TokenSource::Retokenized
        },
        weight_version: None,
        origin: Default::default(),
        engine_prompts_agreed: engine.is_some() && agreed,
    }
}

/// One judged turn of [`teach_agent_session`]: its prompt's messages, the prompt ids it carried
/// when it came from the engine (`None`: re-tokenized), its response ids and text, and the hint
/// its next state carried.
struct Taught {
    messages: Vec<Value>,
    engine_prompt: Option<Vec<u32>>,
    response_ids: Vec<u32>,
    response_text: String,
    hint: &'static str,
}

/// An agent session (tools, tool calls and results, content lists, hints with added-token text),
/// engine-id and re-tokenized turns mixed, taught in OPD mode with `engine_prompts`; an engine-id
/// turn's prompt ids are `engine` applied to our encoding, and it was captured while the drift
/// check agreed when `agreed`. Returns what the teacher was sent (sorted) and each judged turn.
async fn teach_agent_session(
    engine_prompts: EnginePrompts,
    agreed: bool,
    engine: &dyn Fn(Vec<u32>) -> Vec<u32>,
) -> (Rig, Vec<Vec<u32>>, Vec<Taught>) {
    let sent: Arc<Mutex<Vec<Vec<u32>>>> = Arc::default();
    let mut teacher = MockTeacherScorer::new();
    let seen = sent.clone();
    teacher.expect_score_at().returning(move |ids, n, _, _, _| {
        seen.lock().unwrap().push(ids.to_vec());
        Ok(TeacherLogprobs {
            log_probs: vec![-0.1; n],
            topk_log_probs: None,
            topk_indices: None,
            echoed_ids: ids[ids.len() - n..].to_vec(),
            echo_verified: true,
            temperature: 0.0,
            temperature_assumed: false,
        })
    });
    teacher
        .expect_describe()
        .return_const("recording".to_owned());
    let r = rig_parts(
        BufferMode::Opd,
        OpdOptions::default(),
        Arc::new(teacher),
        true,
        Arc::new(tokio::sync::Semaphore::new(2)),
        engine_prompts,
    );
    let tools = agent_tools();
    let hints = [
        // No `|` in these: the mock judge ends a hint there.
        "Mention <tool_response>x</tool_response> is literal text here",
        "List the files first, then answer",
        "<think>plan</think> before the <tool_call> please",
        "Use the tool output, not memory",
        "Answer in one sentence, e\u{301}té style",
        "Check the second file too",
        "Say which tool you used",
    ];
    let mut history = vec![
        json!({"role": "system", "content": "You are an agent. ".repeat(30)}),
        json!({"role": "user", "content": [{"type": "text", "text": "What is in the folder?"}]}),
    ];
    let mut taught = Vec::new();
    for i in 0..hints.len() {
        // The request's last message is the previous turn's next state, carrying its hint.
        let n = r
            .buffer
            .begin("s", Some(history.last().unwrap()), i + 1 == hints.len());
        let response = if i % 2 == 0 {
            json!({"role": "assistant", "content": "", "reasoning_content": "Look first.",
                   "tool_calls": [{"id": format!("c{i}"), "type": "function", "function": {"name": "ls", "arguments": "{}"}}]})
        } else {
            json!({"role": "assistant", "content": format!("Found {i} files."), "reasoning_content": "Count."})
        };
        let from_engine = i % 3 != 1;
        let turn = captured_from(
            &r.tok,
            "s",
            n,
            (&history, Some(&tools), &response),
            from_engine.then_some(engine),
            agreed,
        );
        let next_hint = hints.get(i + 1).copied().unwrap_or_default();
        taught.push(Taught {
            messages: history.clone(),
            engine_prompt: from_engine.then(|| turn.prompt_ids.clone()),
            response_ids: turn.response_ids.clone(),
            response_text: turn.response_text.clone(),
            hint: next_hint,
        });
        r.buffer.accept(turn);
        history.push(response);
        // Tool results after the hinted user message, or a new user message (then hinted).
        history.push(if i % 4 != 3 {
            json!({"role": "tool", "tool_call_id": format!("c{i}"), "content": format!("a.txt\nb.txt hint:{next_hint}|")})
        } else {
            json!({"role": "user", "content": format!("go on hint:{next_hint}|")})
        });
    }
    wait_for(|| {
        r.buffer.status().pending == Default::default() && r.buffer.status().live_sessions == 0
    })
    .await;
    // Every turn but the last had a next state carrying the next begin's hint.
    taught.pop();
    let mut got = sent.lock().unwrap().clone();
    got.sort();
    assert_eq!(got.len(), taught.len());
    assert_eq!(samples(&r).len(), taught.len());
    (r, got, taught)
}

/// The one tool of [`teach_agent_session`].
fn agent_tools() -> Value {
    json!([{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}])
}

/// A full encode of the turn's hinted text followed by its response (an engine-id turn: the
/// hinted prompt's encode, then the engine's response ids).
fn full_encode(tok: &ChatTokenizer, t: &Taught) -> Vec<u32> {
    let tools = agent_tools();
    let response = if t.engine_prompt.is_some() {
        ""
    } else {
        &t.response_text
    };
    let text =
        ps_opd_judge::teacher_input_text(tok, &t.messages, Some(&tools), t.hint, response, None)
            .unwrap();
    let mut ids = tok.encode(&text).unwrap();
    if t.engine_prompt.is_some() {
        ids.extend_from_slice(&t.response_ids);
    }
    ids
}

fn sorted(mut v: Vec<Vec<u32>>) -> Vec<Vec<u32>> {
    v.sort();
    v
}

/// Engine prompt ids that are NOT our encoding of the prompt text (another split of the same
/// text, as an engine with another template gives), not even on its added tokens.
fn another_split(ids: Vec<u32>) -> Vec<u32> {
    ids.iter().map(|id| id % 500).collect()
}

/// Where [`one_token_off`] changes a prompt: an ordinary token of the system message's header
/// (`<|im_start|>system`), by position…
const SYSTEM_TOKEN: usize = 3;

fn ordinary(tok: &ChatTokenizer, id: u32) -> bool {
    !tok.token_text(id).is_empty() && id < 500
}

/// …and the last ordinary token of the prompt's last message (before its `<|im_end|>`), by its
/// distance from the prompt's end.
fn last_message_token_from_end(tok: &ChatTokenizer, ids: &[u32]) -> usize {
    let end_id = tok.encode("<|im_end|>").unwrap()[0];
    let end = ids.iter().rposition(|&id| id == end_id).unwrap();
    ids.len()
        - ids[..end]
            .iter()
            .rposition(|&id| ordinary(tok, id))
            .unwrap()
}

/// Engine prompt ids that differ from our encoding in two ordinary tokens (see [`SYSTEM_TOKEN`]),
/// the added tokens all in their places: reusing them would show.
fn one_token_off(tok: &ChatTokenizer, mut ids: Vec<u32>) -> Vec<u32> {
    let last = ids.len() - last_message_token_from_end(tok, &ids);
    for i in [SYSTEM_TOKEN, last] {
        assert!(
            ordinary(tok, ids[i]),
            "position {i} is an ordinary token: {:?}",
            ids.iter().map(|&id| tok.token_text(id)).collect::<Vec<_>>()
        );
        ids[i] = if ids[i] > 0 { ids[i] - 1 } else { 1 };
    }
    ids
}

/// Without the drift check's agreement, the teacher's input of every turn equals a full encode of
/// the hinted text: an engine's prompt ids are not reused (not even those with every added token
/// in its place) when nothing was compared, when a compared prompt differed, or when the turn was
/// not captured while the check agreed (captured before, or resumed from a previous run).
#[tokio::test]
async fn the_teacher_input_is_a_full_encode_of_the_hinted_text_on_every_turn() {
    let tok = ChatTokenizer::mini();
    let nothing_compared = EnginePrompts::default();
    let one_differed = EnginePrompts::default();
    one_differed.record(true);
    one_differed.record(false);
    let agreeing = EnginePrompts::default();
    agreeing.record(true);
    for (case, prompts, turn_agreed) in [
        ("nothing compared", nothing_compared, true),
        ("a prompt differed", one_differed, true),
        ("turns captured before the agreement", agreeing, false),
    ] {
        let (r, got, taught) =
            teach_agent_session(prompts, turn_agreed, &|ids| one_token_off(&tok, ids)).await;
        let want = sorted(taught.iter().map(|t| full_encode(&r.tok, t)).collect());
        assert_eq!(got, want, "{case}");
    }
}

/// With the drift check agreeing, ids that disagree with the prompt text on its added tokens
/// are not built on (the whole hinted text is encoded), and they count as a prompt that differs:
/// the agreement ends.
#[tokio::test]
async fn engine_prompt_ids_that_disagree_on_added_tokens_are_not_built_on() {
    let agree = EnginePrompts::default();
    agree.record(true);
    let (r, got, taught) = teach_agent_session(agree.clone(), true, &another_split).await;
    let want = sorted(taught.iter().map(|t| full_encode(&r.tok, t)).collect());
    assert_eq!(got, want);
    assert!(!agree.agree());
}

/// With the drift check agreeing, an engine-id turn's teacher input is built on the engine's
/// prompt ids: here they differ from our encoding in one ordinary token of the system prompt and
/// one of the prompt's last message, and the teacher sees the engine's token there wherever that
/// part is not the hinted message; everything else equals a full encode of the hinted text.
#[tokio::test]
async fn with_agreeing_prompts_the_teacher_builds_on_the_engines_prompt_ids() {
    let tok = ChatTokenizer::mini();
    let agree = EnginePrompts::default();
    agree.record(true);
    let (r, got, taught) = teach_agent_session(agree, true, &|ids| one_token_off(&tok, ids)).await;
    let mut changed_after = 0;
    let want = sorted(
        taught
            .iter()
            .map(|t| {
                let mut want = full_encode(&r.tok, t);
                let Some(engine_prompt) = &t.engine_prompt else {
                    return want;
                };
                assert_ne!(want[SYSTEM_TOKEN], engine_prompt[SYSTEM_TOKEN]);
                want[SYSTEM_TOKEN] = engine_prompt[SYSTEM_TOKEN];
                // The prompt's last message is after the hinted one unless it is a user message.
                if t.messages.last().unwrap()["role"] != "user" {
                    let back = last_message_token_from_end(&tok, engine_prompt);
                    let at = want.len() - t.response_ids.len() - back;
                    assert_ne!(want[at], engine_prompt[engine_prompt.len() - back]);
                    want[at] = engine_prompt[engine_prompt.len() - back];
                    changed_after += 1;
                }
                want
            })
            .collect(),
    );
    assert!(
        changed_after >= 2,
        "turns with a message after the hinted one"
    );
    assert_eq!(got, want);
}
