//! Unit tests of the private steps (engine ids, re-tokenization, the drift check, the prefix
//! cache, the queue's byte bound), driven directly. One file over ~700 lines on purpose: the
//! tests of every module share the jobs, rollouts and tokenizers built at the top.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ps_chat_template::{ChatTokenizer, EncodedPrefix};
use ps_core::modes::TokenIdsMode;
use ps_core::{
    AlignPolicy, CapturedTurn, JsonText, RolloutResponse, TokenSource, TurnGuard, TurnSink,
};
use serde_json::Value;

use ps_core::FinishReason;
use serde_json::json;

use super::*;
use crate::drift::*;
use crate::job::*;
use crate::turn::*;

struct Discard;

impl TurnSink for Discard {
    fn accept(&self, _turn: CapturedTurn) {}
}

fn job(session: &str, turn: u64, messages: &[Value], session_done: bool) -> CaptureJob {
    CaptureJob {
        guard: TurnGuard::new(Arc::new(Discard), session.to_owned(), turn),
        arrival_seq: turn,
        messages: messages.to_vec(),
        tools: None,
        template_kwargs: None,
        rollout: RolloutResponse {
            message: json!({"role": "assistant", "content": format!("Answer {turn}.")}),
            tokens: Vec::new(),
            finish: FinishReason {
                reason: Some("stop".into()),
                matched_stop: Value::Null,
            },
            streamed: false,
            ..RolloutResponse::default()
        },
        session_done,
        token_ids: TokenIdsMode::Auto,
        asked_for_ids: false,
        trainer_weight_version: None,
        origin: Default::default(),
        sampling: Default::default(),
        texts: None,
    }
}

fn policy() -> AlignPolicy {
    AlignPolicy::default()
}

/// A re-tokenized image turn's prompt must come to the engine's own count of prompt tokens
/// when the answer states it: otherwise the engine resized the image otherwise than this
/// model's processor (`image_pad_mismatch`), never a sample with other pads than it used.
/// The engine's ids with another run of pads are refused the same way.
#[test]
fn an_image_turn_whose_pads_the_engine_did_not_use_is_refused() {
    use base64::Engine as _;
    let tok = ChatTokenizer::mini_vl();
    let png = [
        0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 13, b'I', b'H', b'D', b'R', 0, 0,
        0, 64, 0, 0, 0, 48, 8, 2, 0, 0, 0, 0, 0, 0, 0,
    ];
    let url = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(png)
    );
    let history = vec![json!({"role": "user", "content": [
        {"type": "text", "text": "What is it?"},
        {"type": "image_url", "image_url": {"url": url}}]})];
    let run = |prompt_tokens: Option<u64>| {
        let mut j = job("i", 1, &history, false);
        j.rollout.prompt_tokens = prompt_tokens;
        capture_turn_with(&tok, &j, policy(), None, &CaptureStats::default())
    };
    let ok = run(None).unwrap();
    let pad = tok.vision().unwrap().image_pad_id;
    assert_eq!(ok.images.len(), 1);
    assert_eq!(
        ok.prompt_ids.iter().filter(|&&t| t == pad).count(),
        ok.images[0].tokens
    );
    let n = ok.prompt_ids.len() as u64;
    assert!(run(Some(n)).is_ok(), "the engine's count agrees");
    for other in [n - 1, n + 12] {
        match run(Some(other)) {
            Err(CaptureError::Refused { reason, detail }) => {
                assert_eq!(reason, "image_pad_mismatch");
                assert!(detail.contains("preprocessor_config.json"), "{detail}");
            }
            r => panic!("{other}: {r:?}"),
        }
    }
    // The engine's own ids with a run of pads of another length.
    let mut prompt = ok.prompt_ids.clone();
    let at = prompt.iter().position(|&t| t == pad).unwrap();
    prompt.insert(at, pad);
    let eos = tok.eos_token_id().unwrap();
    let mut j = engine_job(&tok, Some((prompt, vec![eos])), 1);
    j.messages = history.clone();
    match capture_turn_with(&tok, &j, policy(), None, &CaptureStats::default()) {
        Err(CaptureError::Refused { reason, .. }) => assert_eq!(reason, "image_pad_mismatch"),
        r => panic!("{r:?}"),
    }
}

#[test]
fn a_session_closed_by_its_client_leaves_no_cached_prefix() {
    let tok = ChatTokenizer::mini();
    let cache = PrefixCache::default();
    let mut history = vec![json!({"role": "user", "content": "First question"})];
    capture_turn_with(
        &tok,
        &job("a", 1, &history, false),
        policy(),
        Some(&cache),
        &CaptureStats::default(),
    )
    .unwrap();
    capture_turn_with(
        &tok,
        &job("b", 1, &history, false),
        policy(),
        Some(&cache),
        &CaptureStats::default(),
    )
    .unwrap();
    assert_eq!(cache.len(), 2, "each open session keeps its last prompt");
    history.push(json!({"role": "assistant", "content": "Answer 1."}));
    history.push(json!({"role": "user", "content": "Second question"}));
    let done = capture_turn_with(
        &tok,
        &job("a", 2, &history, true),
        policy(),
        Some(&cache),
        &CaptureStats::default(),
    )
    .unwrap();
    assert!(!done.prompt_ids.is_empty());
    assert_eq!(cache.len(), 1, "the closed session's prefix is gone");
    assert!(cache.get("a").is_none() && cache.get("b").is_some());
}

#[test]
fn unused_prefixes_expire_after_the_idle_time() {
    let cache = PrefixCache::new(Duration::from_secs(60));
    let prefix = || EncodedPrefix {
        text: "x".into(),
        ids: vec![1],
        boundaries: Vec::new(),
    };
    cache.put("a", prefix());
    let now = Instant::now();
    assert_eq!(cache.expire(now), 0, "used just now");
    assert_eq!(
        cache.expire(now + Duration::from_secs(30)),
        0,
        "idle 30 s of 60"
    );
    assert_eq!(cache.len(), 1);
    assert_eq!(cache.expire(now + Duration::from_secs(61)), 1);
    assert!(cache.is_empty());
    cache.put("again", prefix());
    cache.forget("again");
    cache.forget("never-there");
    assert!(cache.is_empty());
}

/// A job whose engine returned `prompt` and `response` ids with one log-prob per response id
/// (`logprobs` of them).
fn engine_job(
    tok: &ChatTokenizer,
    ids: Option<(Vec<u32>, Vec<u32>)>,
    logprobs: usize,
) -> CaptureJob {
    let history = vec![json!({"role": "user", "content": "First question"})];
    let mut j = job("e", 1, &history, false);
    let response = ids.as_ref().map_or_else(Vec::new, |(_, r)| r.clone());
    j.rollout.tokens = (0..logprobs)
        .map(|i| ps_core::SampledToken {
            token: response
                .get(i)
                .map(|&id| tok.token_text(id))
                .unwrap_or_default(),
            id: response.get(i).copied(),
            logprob: -0.1 * (i + 1) as f64,
        })
        .collect();
    j.rollout.engine_ids = ids.map(|(prompt, response)| ps_core::EngineIds {
        prompt,
        response,
        field: "response_token_ids".into(),
    });
    j.asked_for_ids = true;
    j
}

/// The ids an engine with our very template and tokenizer would use for `engine_job`'s turn.
fn true_ids(tok: &ChatTokenizer) -> (Vec<u32>, Vec<u32>) {
    let j = job(
        "e",
        1,
        &[json!({"role": "user", "content": "First question"})],
        false,
    );
    let t = tok.split_turn(&j.turn_input()).unwrap();
    // The engine samples the answer and stops on the end-of-turn token; the template's newline
    // after it is never sampled.
    let eos = tok.eos_token_id().unwrap();
    let end = t.response_ids.iter().rposition(|&id| id == eos).unwrap();
    (t.prompt_ids, t.response_ids[..=end].to_vec())
}

#[test]
fn an_engine_id_turn_takes_the_engines_ids_and_every_log_prob() {
    let tok = ChatTokenizer::mini();
    let (prompt, response) = true_ids(&tok);
    let stats = CaptureStats::new(DriftCheck::new(10, 0));
    let engine_prompts = stats.drift.engine_prompts();
    assert!(!engine_prompts.agree(), "no prompt compared yet");
    let j = engine_job(
        &tok,
        Some((prompt.clone(), response.clone())),
        response.len(),
    );
    let t = capture_turn_with(&tok, &j, policy(), None, &stats).unwrap();
    assert_eq!(t.token_source, TokenSource::Engine);
    assert_eq!(
        (t.prompt_ids, t.response_ids.clone()),
        (prompt, response.clone())
    );
    assert_eq!(t.alignment.loss_mask, vec![1; response.len()]);
    assert_eq!(
        t.alignment.marked(),
        0,
        "every position has its own log-prob"
    );
    assert_eq!(t.alignment.logprobs[0], Some(-0.1));
    assert!(
        t.response_text.ends_with("<|im_end|>\n"),
        "the judges read the rendering"
    );
    let st = stats.to_json();
    assert_eq!(
        (st["engine"].as_u64(), st["drift_checked"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(st["drift"], 0, "same template and tokenizer: no drift");
    assert_eq!(st["engine_prompts_agree"], true);
    assert!(engine_prompts.agree(), "the OPD teacher's handle sees it");
    assert!(
        t.engine_prompts_agreed,
        "captured after its own prompt agreed"
    );
    // With the check off nothing is compared: no turn is captured as agreeing.
    let unchecked = CaptureStats::new(DriftCheck::new(0, 0));
    let t = capture_turn_with(&tok, &j, policy(), None, &unchecked).unwrap();
    assert_eq!(t.token_source, TokenSource::Engine);
    assert!(!t.engine_prompts_agreed);
    assert_eq!(unchecked.to_json()["engine_prompts_agree"], false);
}

#[test]
fn a_log_prob_count_that_differs_from_the_engine_ids_is_re_tokenized_or_refused() {
    let tok = ChatTokenizer::mini();
    let ids = true_ids(&tok);
    let n = ids.1.len();
    // `auto` re-tokenizes such a turn (the missing value becomes a marked position)…
    let j = engine_job(&tok, Some(ids.clone()), n - 1);
    let t = capture_turn_with(&tok, &j, policy(), None, &CaptureStats::default()).unwrap();
    assert_eq!(t.token_source, TokenSource::Retokenized);
    assert!(t.alignment.marked() > 0);
    // …`engine` refuses it.
    let mut j = engine_job(&tok, Some(ids), n - 1);
    j.token_ids = TokenIdsMode::Engine;
    match capture_turn_with(&tok, &j, policy(), None, &CaptureStats::default()) {
        Err(e @ CaptureError::Refused { .. }) => {
            assert_eq!(e.reason(), "engine_logprob_count_mismatch");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn re_tokenization_that_differs_from_the_engine_is_counted_with_its_first_position() {
    let tok = ChatTokenizer::mini();
    let (mut prompt, response) = true_ids(&tok);
    let stats = CaptureStats::new(DriftCheck::new(10, 0));
    let engine_prompts = stats.drift.engine_prompts();
    // A turn whose prompt ids are ours first: the prompts agree…
    let good = engine_job(
        &tok,
        Some((prompt.clone(), response.clone())),
        response.len(),
    );
    capture_turn_with(&tok, &good, policy(), None, &stats).unwrap();
    assert!(engine_prompts.agree());
    let changed = prompt.len() - 2;
    prompt[changed] = response[0];
    let j = engine_job(
        &tok,
        Some((prompt.clone(), response.clone())),
        response.len(),
    );
    let t = capture_turn_with(&tok, &j, policy(), None, &stats).unwrap();
    assert_eq!(t.prompt_ids, prompt, "the sample keeps the engine's ids");
    // …until one differs, for good: the OPD teacher encodes prompt texts itself from then on.
    assert!(!engine_prompts.agree());
    assert!(!t.engine_prompts_agreed);
    let later = capture_turn_with(&tok, &good, policy(), None, &stats).unwrap();
    assert!(!engine_prompts.agree());
    assert!(!later.engine_prompts_agreed);
    let st = stats.to_json();
    assert_eq!(st["engine_prompts_agree"], false);
    assert_eq!(st["drift"], 1);
    assert_eq!(st["last_drift"]["part"], "prompt");
    assert_eq!(st["last_drift"]["position"], changed);
    assert_eq!(
        st["last_drift"]["engine_token"],
        tok.token_text(response[0])
    );
}

#[test]
fn a_response_that_differs_is_drift_but_the_prompts_still_agree() {
    let tok = ChatTokenizer::mini();
    let (prompt, mut response) = true_ids(&tok);
    // A sampled token whose text is not in the answer our template renders.
    let other = tok.encode("zebra").unwrap()[0];
    assert_ne!(tok.token_text(other), tok.token_text(response[1]));
    response[1] = other;
    let stats = CaptureStats::new(DriftCheck::new(10, 0));
    let j = engine_job(
        &tok,
        Some((prompt.clone(), response.clone())),
        response.len(),
    );
    capture_turn_with(&tok, &j, policy(), None, &stats).unwrap();
    let st = stats.to_json();
    assert_eq!(st["drift"], 1);
    assert_eq!(st["last_drift"]["part"], "response");
    assert_eq!(st["engine_prompts_agree"], true);
    assert!(stats.drift.engine_prompts().agree());
}

/// The response is compared as text: an engine that sampled the answer in other pieces than
/// our tokenizer would cut it into (byte-level models do: a random model, a character's bytes
/// apart, merges the encoder would not make) agrees with the template all the same.
#[test]
fn a_response_sampled_in_other_pieces_is_not_drift() {
    let tok = ChatTokenizer::mini();
    let (prompt, response) = true_ids(&tok);
    let (at, long) = response
        .iter()
        .enumerate()
        .find(|(_, id)| tok.token_text(**id).chars().count() >= 2)
        .map(|(i, id)| (i, *id))
        .expect("a token of two characters or more");
    let pieces: Vec<u32> = tok
        .token_text(long)
        .chars()
        .flat_map(|c| tok.encode(&c.to_string()).unwrap())
        .collect();
    assert!(pieces.len() >= 2 && !pieces.contains(&long));
    let mut sampled = response[..at].to_vec();
    sampled.extend(&pieces);
    sampled.extend(&response[at + 1..]);
    assert_eq!(tok.decode(&sampled, true), tok.decode(&response, true));
    let stats = CaptureStats::new(DriftCheck::new(10, 0));
    let n = sampled.len();
    let j = engine_job(&tok, Some((prompt.clone(), sampled.clone())), n);
    let t = capture_turn_with(&tok, &j, policy(), None, &stats).unwrap();
    assert_eq!(t.response_ids, sampled, "the sample keeps the engine's ids");
    let st = stats.to_json();
    assert_eq!(
        (st["drift_checked"].clone(), st["drift"].clone()),
        (json!(1), json!(0))
    );
    // The same answer with a character the template does not render is drift.
    let mut wrong = sampled;
    wrong[at] = tok.encode("Q").unwrap()[0];
    let j = engine_job(&tok, Some((prompt, wrong.clone())), wrong.len());
    capture_turn_with(&tok, &j, policy(), None, &stats).unwrap();
    assert_eq!(stats.to_json()["drift"], 1);
}

/// A grammar-forced tool call may space its JSON otherwise than the template writes the parsed
/// arguments back: no render holds the sampled text, so the response is not compared (not
/// drift); the same call written as the template writes it is compared, and a changed
/// argument there is drift.
#[test]
fn tool_call_arguments_the_template_rewrites_are_not_drift() {
    let tok = ChatTokenizer::mini();
    let (prompt, _) = true_ids(&tok);
    let eos = tok.eos_token_id().unwrap();
    let run = |args: &str, sampled_args: &str| {
        let sampled = format!(
            "<tool_call>\n{{\"name\": \"get\", \"arguments\": {sampled_args}}}\n</tool_call>"
        );
        let mut ids = tok.encode(&sampled).unwrap();
        ids.push(eos);
        let stats = CaptureStats::new(DriftCheck::new(10, 0));
        let mut j = engine_job(&tok, Some((prompt.clone(), ids.clone())), ids.len());
        j.rollout.message = json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "get", "arguments": args}}]});
        let t = capture_turn_with(&tok, &j, policy(), None, &stats).unwrap();
        assert_eq!(t.response_ids, ids, "the sample keeps the engine's ids");
        stats.to_json()["drift"].clone()
    };
    let spaced = r#"{ "city" : "Rome" }"#;
    assert_eq!(
        run(spaced, spaced),
        json!(0),
        "rewritten by the template: not compared"
    );
    let canonical = r#"{"city": "Rome"}"#;
    assert_eq!(run(canonical, canonical), json!(0), "compared, and equal");
    assert_eq!(
        run(canonical, r#"{"city": "Paris"}"#),
        json!(1),
        "compared, and the sampled text is not the answer's"
    );
}

#[test]
fn the_drift_check_runs_on_the_first_turns_then_one_in_every() {
    let d = DriftCheck::new(2, 3);
    let due: Vec<bool> = (0..9).map(|_| d.due()).collect();
    assert_eq!(
        due,
        [true, true, true, false, false, true, false, false, true]
    );
    let never = DriftCheck::new(0, 0);
    assert!(!(0..5).any(|_| never.due()));
}

#[test]
fn an_engine_asked_for_ids_that_gave_none_falls_back_or_refuses_by_mode() {
    let tok = ChatTokenizer::mini();
    let stats = CaptureStats::default();
    let auto = engine_job(&tok, None, 0);
    let t = capture_turn_with(&tok, &auto, policy(), None, &stats).unwrap();
    assert_eq!(t.token_source, TokenSource::Retokenized);
    let mut engine_only = engine_job(&tok, None, 0);
    engine_only.token_ids = TokenIdsMode::Engine;
    let e = capture_turn_with(&tok, &engine_only, policy(), None, &stats).unwrap_err();
    assert_eq!(e.reason(), "no_engine_ids");
    assert_eq!(stats.to_json()["engine_ids_missing"], 2);
    // With `retokenize` the engine's ids are not used even when present.
    let mut retok = engine_job(&tok, Some(true_ids(&tok)), true_ids(&tok).1.len());
    retok.token_ids = TokenIdsMode::Retokenize;
    retok.asked_for_ids = false;
    let t = capture_turn_with(&tok, &retok, policy(), None, &stats).unwrap();
    assert_eq!(t.token_source, TokenSource::Retokenized);
}

#[test]
fn a_streamed_answer_whose_log_probs_cannot_explain_its_text_is_refused() {
    let tok = ChatTokenizer::mini();
    let mut j = job("s", 1, &[json!({"role": "user", "content": "q"})], false);
    j.rollout.streamed = true;
    j.rollout.message = json!({"role": "assistant", "content": "Answer.", "reasoning_content": "A long chain of thought that streamed without any log-probs."});
    j.rollout.tokens = vec![ps_core::SampledToken {
        token: "Answer.".into(),
        id: None,
        logprob: -0.1,
    }];
    j.rollout.unexplained_chars = 60;
    let e = capture_turn_with(&tok, &j, policy(), None, &CaptureStats::default()).unwrap_err();
    assert_eq!(e.reason(), "stream_logprobs_missing");
    assert!(e.to_string().contains("sglang.stream = false"), "{e}");
    // No log-probs at all for a non-empty answer: refused too.
    j.rollout.unexplained_chars = 0;
    j.rollout.tokens.clear();
    let e = capture_turn_with(&tok, &j, policy(), None, &CaptureStats::default()).unwrap_err();
    assert_eq!(e.reason(), "stream_logprobs_missing");
}

#[test]
fn the_weight_version_comes_from_the_answer_else_from_the_trainer() {
    let tok = ChatTokenizer::mini();
    let stats = CaptureStats::default();
    let mut j = job("w", 1, &[json!({"role": "user", "content": "q"})], false);
    j.trainer_weight_version = Some("step-7".into());
    let t = capture_turn_with(&tok, &j, policy(), None, &stats).unwrap();
    let v = t.weight_version.unwrap();
    assert_eq!(
        (v.version.as_str(), v.source.as_str()),
        ("step-7", "trainer")
    );
    j.rollout.weight_version = Some("v3".into());
    let t = capture_turn_with(&tok, &j, policy(), None, &stats).unwrap();
    let v = t.weight_version.unwrap();
    assert_eq!((v.version.as_str(), v.source.as_str()), ("v3", "engine"));
}

/// Records why turns were abandoned.
#[derive(Default)]
struct Reasons(std::sync::Mutex<Vec<String>>);

impl TurnSink for Reasons {
    fn accept(&self, _turn: CapturedTurn) {}
    fn abandon(&self, _session_id: &str, _turn: u64, reason: &str) {
        self.0.lock().unwrap().push(reason.to_owned());
    }
}

/// A queue of 8 jobs with one worker on the mini model, feeding `sink`.
fn one_worker_queue(sink: Arc<dyn TurnSink>) -> CaptureQueue {
    CaptureQueue::start(
        Arc::new(ChatTokenizer::mini()),
        sink,
        policy(),
        DriftCheck::default(),
        8,
        1,
    )
    .unwrap()
}

/// A request part that a tree parse refuses never becomes a sample rendered without it: the
/// turn is abandoned with a reason (counted like every other one).
#[test]
fn an_unreadable_request_abandons_the_turn_with_a_reason() {
    let raw = |s: &str| Bytes::from(s.to_owned());
    let sink = Arc::new(Reasons::default());
    let queue = one_worker_queue(sink.clone());
    let good = r#"[{"role":"user","content":"q"}]"#;
    let bad_parts = [
        (r#"[{"role":"user","content":"q","n":1e400}]"#, None, None),
        (good, Some(r#"[{"type":"function","x":1e400}]"#), None),
        (good, None, Some(r#"{"enable_thinking":true,"x":-1e400}"#)),
    ];
    for (i, (messages, tools, kwargs)) in bad_parts.into_iter().enumerate() {
        let mut j = job("u", i as u64 + 1, &[], false);
        j.guard = TurnGuard::new(sink.clone(), "u".into(), i as u64 + 1);
        let request = RequestJson {
            messages: raw(messages),
            tools: tools.map(raw),
            template_kwargs: kwargs.map(raw),
            answer: None,
        };
        assert!(queue.submit_json(j, request));
    }
    assert_eq!(queue.shutdown(), 0);
    assert_eq!(
        *sink.0.lock().unwrap(),
        ["request_unreadable"; 3].map(String::from)
    );
}

struct Accepted(std::sync::Mutex<Vec<CapturedTurn>>);

impl TurnSink for Accepted {
    fn accept(&self, turn: CapturedTurn) {
        self.0.lock().unwrap().push(turn);
    }
}

/// Captures one turn from `messages` and `tools` as JSON texts; the captured turn.
fn captured_from_texts(messages: &str, tools: &str) -> CapturedTurn {
    let sink = Arc::new(Accepted(std::sync::Mutex::new(Vec::new())));
    let queue = one_worker_queue(sink.clone());
    let mut j = job("t", 1, &[], false);
    j.guard = TurnGuard::new(sink.clone(), "t".into(), 1);
    let request = RequestJson {
        messages: Bytes::from(messages.to_owned()),
        tools: Some(Bytes::from(tools.to_owned())),
        template_kwargs: None,
        answer: None,
    };
    assert!(queue.submit_json(j, request));
    queue.shutdown();
    let mut turns = sink.0.lock().unwrap();
    assert_eq!(turns.len(), 1, "one turn captured");
    turns.pop().unwrap()
}

/// The captured turn holds the client's own `messages` and `tools` texts (not the trees
/// written out again), and they read as the very trees the turn was rendered from; a text
/// much larger than what `serde_json` writes (`\u` escapes, line breaks) is held as written
/// from its tree instead.
#[test]
fn a_turn_holds_the_clients_own_texts_which_read_as_its_trees() {
    let messages = "[ {\"role\": \"system\", \"content\": \"café\"}, {\"role\": \"user\", \"content\": \"q \\/ 1.50\", \"n\": 1.50} ]";
    let tools = "[{\"type\": \"function\", \"function\": {\"name\": \"ls\", \"parameters\": {\"min\": -0.0}}}]";
    let turn = captured_from_texts(messages, tools);
    assert_eq!(turn.messages.as_str(), messages);
    let tree: Vec<Value> = serde_json::from_str(messages).unwrap();
    assert_eq!(turn.messages.parse().unwrap(), tree);
    assert_eq!(turn.messages, JsonText::new(&tree));
    let held = turn.tools.as_ref().unwrap();
    assert_eq!(held.as_str(), tools);
    // What a consumer writes of the held tools keeps the zero's sign.
    let written = serde_json::to_string(held).unwrap();
    assert!(written.contains("-0.0"), "{written}");
    assert_eq!(
        rmp_serde::to_vec_named(held).unwrap(),
        rmp_serde::to_vec_named(&serde_json::from_str::<Value>(tools).unwrap()).unwrap()
    );
    // The prompt was rendered from these trees: the system text as parsed.
    assert!(turn.prompt_text.contains("café"), "{}", turn.prompt_text);

    let escaped = "[{\"role\": \"system\", \"content\": \"caf\\u00e9 \\u4e2d\"}, {\"role\": \"user\", \"content\": \"q\"}]";
    let pretty =
        "[\n  {\n    \"type\": \"function\",\n    \"function\": {\"name\": \"ls\"}\n  }\n]";
    let turn = captured_from_texts(escaped, pretty);
    let tree: Vec<Value> = serde_json::from_str(escaped).unwrap();
    assert_eq!(
        turn.messages.as_str(),
        serde_json::to_string(&tree).unwrap()
    );
    assert!(turn.messages.as_str().contains("café 中"));
    let tools_tree: Value = serde_json::from_str(pretty).unwrap();
    assert_eq!(
        turn.tools.unwrap().as_str(),
        serde_json::to_string(&tools_tree).unwrap()
    );
}

/// A sink that holds each captured turn's worker until the test lets it go.
struct Gated {
    reasons: std::sync::Mutex<Vec<String>>,
    accepted: std::sync::Mutex<Vec<u64>>,
    gate: std::sync::Mutex<Receiver<()>>,
}

impl TurnSink for Gated {
    fn accept(&self, turn: CapturedTurn) {
        let _ = self.gate.lock().unwrap().recv();
        self.accepted.lock().unwrap().push(turn.turn);
    }
    fn abandon(&self, _session_id: &str, _turn: u64, reason: &str) {
        self.reasons.lock().unwrap().push(reason.to_owned());
    }
}

/// A capture queue of one worker that a [`Gated`] sink holds after each turn.
struct GatedQueue {
    queue: CaptureQueue,
    sink: Arc<Gated>,
    open: std::sync::mpsc::Sender<()>,
}

impl GatedQueue {
    /// A queue of `capacity` turns and at most `max_bytes` bytes.
    fn start(capacity: usize, max_bytes: usize) -> Self {
        let (open, gate) = std::sync::mpsc::channel();
        let sink = Arc::new(Gated {
            reasons: Default::default(),
            accepted: Default::default(),
            gate: std::sync::Mutex::new(gate),
        });
        let queue = CaptureQueue::start(
            Arc::new(ChatTokenizer::mini()),
            sink.clone(),
            policy(),
            DriftCheck::default(),
            capacity,
            1,
        )
        .unwrap()
        .with_max_queued_bytes(max_bytes);
        Self { queue, sink, open }
    }

    /// Queues turn `turn` of session `g`, its request's `messages` as this JSON text.
    fn submit(&self, turn: u64, messages: &str) -> bool {
        let mut j = job("g", turn, &[], false);
        j.guard = TurnGuard::new(self.sink.clone(), "g".into(), turn);
        let request = RequestJson {
            messages: Bytes::from(messages.to_owned()),
            tools: None,
            template_kwargs: None,
            answer: None,
        };
        self.queue.submit_json(j, request)
    }

    /// Waits until the worker took every queued turn (counting it out); it then waits in
    /// the sink.
    fn wait_taken(&self) {
        let started = Instant::now();
        while (self.queued().turns(), self.queued().bytes()) != (0, 0) {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "no worker took the turn"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Lets `n` captured turns through the sink, then shuts the queue down; returns how many
    /// turns it captured.
    fn finish(&self, n: usize) -> usize {
        for _ in 0..n {
            self.open.send(()).unwrap();
        }
        self.queue.shutdown()
    }

    fn queued(&self) -> &QueueBytes {
        self.queue.queued()
    }
}

const SHORT: &str = r#"[{"role":"user","content":"q"}]"#;

/// While capture is behind, a turn that would take the queue past `capture.max_queued_mib`
/// is refused with a reason (answered, not trained on); every turn the queue took is still
/// captured, and its bytes are counted out again.
#[test]
fn a_queue_past_its_byte_bound_refuses_turns_with_a_reason_and_loses_none_it_took() {
    // ~10 kB of request text per turn; the queue may hold 25 kB.
    let messages = format!(r#"[{{"role":"user","content":"{}"}}]"#, "q".repeat(10_000));
    let q = GatedQueue::start(64, 25_000);
    assert_eq!(q.queued().max_bytes(), 25_000);
    assert!(q.submit(1, &messages));
    q.wait_taken();
    assert!(
        q.submit(2, &messages) && q.submit(3, &messages),
        "two turns fit in 25 kB"
    );
    let held = q.queued().bytes();
    assert_eq!(q.queued().turns(), 2);
    assert!((20_000..=25_000).contains(&held), "{held} bytes counted");
    assert!(
        !q.submit(4, &messages),
        "a third queued turn would pass the bound"
    );
    assert_eq!(*q.sink.reasons.lock().unwrap(), ["capture_queue_full"]);
    assert_eq!(q.queued().turns(), 2, "the refused turn is not counted");
    assert_eq!(q.finish(3), 3);
    assert_eq!(*q.sink.accepted.lock().unwrap(), [1, 2, 3]);
    assert_eq!((q.queued().turns(), q.queued().bytes()), (0, 0));
    assert_eq!(q.queued().peak_bytes(), held);
    let status = q.queued().to_json();
    assert_eq!(status["peak_bytes"], held);
    assert_eq!(status["max_bytes"], 25_000);
}

/// The count bound refuses too, and counts the refused turn's bytes out again.
#[test]
fn a_queue_with_all_its_turns_taken_refuses_and_counts_the_turn_out() {
    let q = GatedQueue::start(1, DEFAULT_MAX_QUEUED_BYTES);
    assert!(q.submit(1, SHORT));
    q.wait_taken();
    assert!(q.submit(2, SHORT), "the one place in the channel");
    let held = (q.queued().turns(), q.queued().bytes());
    assert_eq!(held.0, 1);
    assert!(!q.submit(3, SHORT), "the channel is full");
    assert_eq!(
        (q.queued().turns(), q.queued().bytes()),
        held,
        "the refused turn is counted out"
    );
    assert_eq!(*q.sink.reasons.lock().unwrap(), ["capture_queue_full"]);
    assert_eq!(q.finish(2), 2);
    assert_eq!((q.queued().turns(), q.queued().bytes()), (0, 0));
}

/// One turn larger than the whole bound still goes into an empty queue: the bound limits
/// what piles up, it does not refuse a long conversation outright.
#[test]
fn a_turn_larger_than_the_bound_is_taken_by_an_empty_queue() {
    let q = GatedQueue::start(8, 1);
    assert!(q.submit(1, SHORT));
    assert_eq!(q.finish(1), 1);
    assert!(q.sink.reasons.lock().unwrap().is_empty());
}

/// An answer whose rollout cannot be read on the capture thread (here a log-prob out of
/// range and a lone surrogate in the message, which the chat path's parse would have
/// refused) never becomes a sample: the turn is abandoned as `answer_unreadable`.
#[test]
fn an_unreadable_answer_abandons_the_turn_with_a_reason() {
    let sink = Arc::new(Reasons::default());
    let queue = one_worker_queue(sink.clone());
    let answers = [
        r#"{"choices":[{"message":{"role":"assistant","content":"Hi"},"logprobs":{"content":[{"token":"Hi","logprob":-1e400}]},"finish_reason":"stop"}]}"#,
        r#"{"choices":[{"message":{"role":"assistant","content":"\ud800"},"finish_reason":"stop"}]}"#,
        r#"{"choices":[{"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop","matched_stop":1e999}]}"#,
    ];
    for (i, text) in answers.into_iter().enumerate() {
        let bytes = bytes::Bytes::from_static(text.as_bytes());
        assert!(ps_sglang_client::Answer::parse("u", bytes.clone()).is_err());
        let answer = ps_sglang_client::Answer::parse_unchecked(bytes).unwrap();
        let turn = i as u64 + 1;
        let mut j = job("a", turn, &[], false);
        j.guard = TurnGuard::new(sink.clone(), "a".into(), turn);
        let request = RequestJson {
            messages: Bytes::from_static(br#"[{"role":"user","content":"q"}]"#),
            tools: None,
            template_kwargs: None,
            answer: Some(answer),
        };
        assert!(queue.submit_json(j, request));
    }
    assert_eq!(queue.shutdown(), 0);
    assert_eq!(
        *sink.0.lock().unwrap(),
        ["answer_unreadable"; 3].map(String::from)
    );
}

/// A readable answer handed over as bytes is captured as its rollout read on the chat path
/// would have been.
#[test]
fn an_answer_handed_over_as_bytes_is_captured() {
    let tok = ChatTokenizer::mini();
    let text = r#"{"choices":[{"message":{"role":"assistant","content":"Answer 1."},"finish_reason":"stop"}],"metadata":{"weight_version":"v9"}}"#;
    let answer =
        ps_sglang_client::Answer::parse("u", bytes::Bytes::from_static(text.as_bytes())).unwrap();
    let mut j = job("b", 1, &[], false);
    j.rollout = RolloutResponse::default();
    let request = RequestJson {
        messages: Bytes::from_static(br#"[{"role":"user","content":"q"}]"#),
        tools: None,
        template_kwargs: None,
        answer: Some(answer.clone()),
    };
    request.fill(&mut j).unwrap();
    assert_eq!(j.rollout, answer.rollout().unwrap());
    assert_eq!(j.rollout.weight_version.as_deref(), Some("v9"));
    let turn = capture_turn(&tok, &j, policy()).unwrap();
    assert_eq!(turn.response_message["content"], "Answer 1.");
}
