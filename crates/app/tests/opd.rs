//! OPD and Combine through the real server: hint votes and teacher log-probs from the fake SGLang.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::{Server, user};
use ps_config::{Mode, Settings};
use ps_fake_sglang::{
    FakeHandle, FakeSglang, Fault, IdField, Quirks, StreamLogprobs, teacher_logprob,
};
use serde_json::{Value, json};

fn settings(fake: &FakeHandle, mode: Mode, store: &Path) -> Settings {
    let mut s = common::settings(fake, &store.join("store"));
    // These tests keep the judge's default bound.
    s.prm.timeout_sec = Settings::default().prm.timeout_sec;
    s.server.mode = mode;
    s.teacher.url = Some(fake.generate_url());
    s.teacher.timeout_sec = 5;
    s.logging.opd_record_dir = Some(store.join("opd"));
    s
}

async fn start(settings: &Settings) -> Server {
    Server::start(settings, &common::no_env).await
}

impl Server {
    /// A turn of `session` (`done` ends it) with `body` (`messages`, maybe `stream`).
    fn turn(&self, session: &str, body: Value, done: bool) -> reqwest::RequestBuilder {
        common::http()
            .post(format!("{}/v1/chat/completions", self.url))
            .header("x-session-id", session)
            .header("x-session-done", if done { "1" } else { "0" })
            .json(&body)
    }

    /// The assistant message of a turn asked for streamed (`stream`) or not.
    async fn reply(&self, session: &str, messages: Value, done: bool, stream: bool) -> Value {
        if !stream {
            return self.chat(session, messages, done).await["choices"][0]["message"].clone();
        }
        let body = json!({"messages": messages, "stream": true});
        let r = self.turn(session, body, done).send().await.unwrap();
        common::assemble_sse(&r.text().await.unwrap())
    }
}

/// Turn 1, then turn 2 carrying `next` as turn 1's next state; turn 2 ends the session.
async fn two_turns(s: &Server, session: &str, next: &str) {
    let a = s
        .chat(session, json!([user("Plan a weekend in Rome.")]), false)
        .await;
    let history = json!([
        user("Plan a weekend in Rome."),
        a["choices"][0]["message"],
        user(next)
    ]);
    s.chat(session, history, true).await;
}

#[tokio::test]
async fn opd_turns_get_exact_teacher_log_probs_for_every_response_token() {
    // With the engine's ids (the default) and with re-tokenized ones: the teacher scores exactly
    // the sample's response ids either way.
    for mode in [
        ps_config::TokenIdsMode::Auto,
        ps_config::TokenIdsMode::Retokenize,
    ] {
        opd_exact_teacher_values(mode).await;
    }
}

async fn opd_exact_teacher_values(token_ids: ps_config::TokenIdsMode) {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let mut set = settings(&fake, Mode::Opd, dir.path());
    set.opd.top_k = 4;
    set.sglang.token_ids = token_ids;
    let s = start(&set).await;
    two_turns(&s, "o", "I wanted museums, not food. FAKE_VOTES=1,1,1").await;
    let samples = s.settle(2).await;
    assert_eq!(samples.len(), 1, "turn 2 had no next state and is dropped");
    let sample = &samples[0];
    let t = sample["response_length"].as_u64().unwrap() as usize;
    let tokens: Vec<u32> = sample["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let teacher: Vec<f64> = sample["teacher_log_probs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(teacher.len(), t);
    assert_eq!(sample["loss_mask"], json!(vec![1; t]));
    assert_eq!(sample["reward"]["score"], 1.0);
    let source = if token_ids == ps_config::TokenIdsMode::Retokenize {
        "retokenized"
    } else {
        "engine"
    };
    assert_eq!(sample["metadata"]["token_source"], source);
    // The teacher scored the hinted prompt + our response: find the request to recompute exactly.
    let req = fake
        .requests()
        .into_iter()
        .find(|r| r.path == "/generate" && r.body.get("input_ids").is_some())
        .unwrap();
    let ids: Vec<u32> = req.body["input_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let l = ids.len();
    assert_eq!(
        &ids[l - t..],
        &tokens[tokens.len() - t..],
        "the teacher saw our very response ids"
    );
    for (j, value) in teacher.iter().enumerate() {
        let pos = l - t + j;
        assert_eq!(
            *value,
            teacher_logprob(ids[pos - 1], ids[pos], pos),
            "position {j}"
        );
    }
    let topk = sample["teacher_topk_log_probs"].as_array().unwrap();
    assert_eq!(topk.len(), t);
    assert!(topk.iter().all(|row| row.as_array().unwrap().len() == 4));
    assert_eq!(
        req.body["top_logprobs_num"], 4,
        "one request carries the top-K too"
    );
    // The hint went into the last user message of the teacher's prompt.
    let records = opd_records(dir.path());
    let accepted: Vec<&Value> = records.iter().filter(|r| r["accepted"] == true).collect();
    assert_eq!(accepted.len(), 1);
    assert_eq!(accepted[0]["teacher_log_probs_len"], t);
    assert!(accepted[0]["hint_len"].as_u64().unwrap() > 10);
    // The fake's prompt ids are our encoding: the drift check agrees, and the teacher's prompt,
    // built on the engine's prompt ids, is exactly a full encode of the hinted text.
    let engine = token_ids != ps_config::TokenIdsMode::Retokenize;
    assert_eq!(
        s.status().await["token_ids"]["engine_prompts_agree"],
        engine
    );
    if engine {
        let tok = ps_chat_template::ChatTokenizer::mini();
        let hinted = ps_opd_judge::teacher_input_text(
            &tok,
            &[user("Plan a weekend in Rome.")],
            None,
            accepted[0]["hint"].as_str().unwrap(),
            "",
            None,
        )
        .unwrap();
        assert_eq!(ids[..l - t], tok.encode(&hinted).unwrap());
    }
    s.stop().await;
}

/// Turn 1 `first`, then turn 2 carrying `next` as its next state; turn 2 ends the session. Returns
/// turn 1's messages.
async fn two_turns_from(
    s: &Server,
    session: &str,
    first: &str,
    next: &str,
    stream_first: bool,
) -> Vec<Value> {
    let a = s
        .reply(session, json!([user(first)]), false, stream_first)
        .await;
    s.chat(session, json!([user(first), a, user(next)]), true)
        .await;
    vec![user(first)]
}

/// Every OPD record written under `dir` (`logging.opd_record_dir` is `dir/opd`).
fn opd_records(dir: &Path) -> Vec<Value> {
    std::fs::read_dir(dir.join("opd"))
        .unwrap()
        .flat_map(|f| {
            let text = std::fs::read_to_string(f.unwrap().path()).unwrap();
            text.lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

/// Through the real server's wiring: the drift check compares the first engine-id turn's prompt
/// (equal); a later turn's engine reports other prompt ids than our encoding (the fake's
/// `FAKE_PROMPT_DRIFT`: its last prompt id is off by one). Not checked, that turn's teacher
/// prompt is built on the engine's ids and keeps the engine's last id; checked (the drift check
/// on every turn), the drift is found, `engine_prompts_agree` turns false and the teacher's prompt
/// is our full encode of the hinted text. Across the builds that report prompt ids: each field a
/// non-streamed answer puts them in, and `sglext` on a streamed turn with a step's log-probs on its
/// chunks (one and several tokens to a chunk). A stream that drops empty deltas' log-probs has
/// fewer log-probs than ids: the turn is re-tokenized, and its teacher input is our full encode
/// whatever the drift check says. (A stream with `logprobs: null` on parsed chunks makes no sample
/// at all, `stream_logprobs_missing`: server tests/engine_ids.rs.)
#[tokio::test]
async fn the_teacher_builds_on_the_engines_prompt_ids_only_while_the_drift_check_agrees() {
    // (the build, the first turn streamed, its engine ids used)
    let mut cases: Vec<(Quirks, bool, bool)> = [
        IdField::ResponseTokenIds,
        IdField::TokenIds,
        IdField::Vllm,
        IdField::Sglext,
    ]
    .into_iter()
    .map(|id_field| {
        let quirks = Quirks {
            id_field,
            ..Quirks::default()
        };
        (quirks, false, true)
    })
    .collect();
    for (stream_logprobs, tokens_per_chunk, used) in [
        (StreamLogprobs::StepChunks, 1, true),
        (StreamLogprobs::StepChunks, 3, true),
        (StreamLogprobs::DropEmptyDeltas, 1, false),
    ] {
        let quirks = Quirks {
            id_field: IdField::Sglext,
            stream_logprobs,
            tokens_per_chunk,
            ..Quirks::default()
        };
        cases.push((quirks, true, used));
    }
    for (quirks, stream_first, used) in cases {
        for check_every_turn in [false, true] {
            teacher_on_engine_prompt_ids(&quirks, stream_first, used, check_every_turn).await;
        }
    }
}

async fn teacher_on_engine_prompt_ids(
    quirks: &Quirks,
    stream_first: bool,
    engine_ids_used: bool,
    check_every_turn: bool,
) {
    let tok = ps_chat_template::ChatTokenizer::mini();
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder()
        .quirks(quirks.clone())
        .spawn()
        .await
        .unwrap();
    let case = format!(
        "{quirks:?}, first turn streamed: {stream_first}, checked every turn: {check_every_turn}"
    );
    let mut set = settings(&fake, Mode::Opd, dir.path());
    set.capture.drift_check_first = if check_every_turn { 100 } else { 1 };
    set.capture.drift_check_every = 0;
    let s = start(&set).await;
    two_turns(
        &s,
        "agreeing",
        "I wanted museums, not food. FAKE_VOTES=1,1,1",
    )
    .await;
    // Both of its turns captured (the first one checked) before the next session starts.
    let mut captured = false;
    for _ in 0..400 {
        captured = s.status().await["token_ids"]["engine"] == 2;
        if captured {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        captured,
        "the agreeing session's two turns captured: {case}"
    );
    let checked = if check_every_turn { 2 } else { 1 };
    assert_eq!(
        s.status().await["token_ids"]["drift_checked"],
        checked,
        "{case}"
    );
    assert_eq!(
        s.status().await["token_ids"]["engine_prompts_agree"],
        true,
        "{case}"
    );
    let first = format!("Plan a weekend in Rome. {}", ps_fake_sglang::PROMPT_DRIFT);
    let messages = two_turns_from(
        &s,
        "drifted",
        &first,
        "I wanted museums, not food. FAKE_VOTES=1,1,1",
        stream_first,
    )
    .await;
    let samples = s.settle(4).await;
    let sample = samples
        .iter()
        .find(|x| x["session_id"] == "drifted")
        .unwrap_or_else(|| panic!("the drifted session's first turn is a sample: {case}"));
    let t = sample["response_length"].as_u64().unwrap() as usize;
    let tokens = u32s(&sample["tokens"]);
    let (engine_prompt, response) = tokens.split_at(tokens.len() - t);
    let teacher_input = fake
        .requests()
        .into_iter()
        .filter(|r| r.path == "/generate" && r.body.get("input_ids").is_some())
        .map(|r| u32s(&r.body["input_ids"]))
        .find(|ids| ids.ends_with(response))
        .unwrap_or_else(|| panic!("the teacher scored the drifted turn's response: {case}"));
    let prompt = &teacher_input[..teacher_input.len() - t];
    let hint = opd_records(dir.path())
        .into_iter()
        .find(|r| r["session_id"] == "drifted" && r["accepted"] == true)
        .unwrap_or_else(|| panic!("the drifted turn's hint was accepted: {case}"))["hint"]
        .as_str()
        .unwrap()
        .to_owned();
    let hinted = ps_opd_judge::teacher_input_text(&tok, &messages, None, &hint, "", None).unwrap();
    let mut full = tok.encode(&hinted).unwrap();
    let ours = tok
        .encode(&tok.render(&messages, None, true, None).unwrap())
        .unwrap();
    let status = s.status().await;
    if !engine_ids_used {
        assert_eq!(
            status["token_ids"]["engine"], 3,
            "all but the streamed turn on the engine's ids: {case}"
        );
        assert_eq!(
            status["token_ids"]["retokenized"], 1,
            "the streamed turn re-tokenized: {case}"
        );
        assert_eq!(
            prompt,
            full.as_slice(),
            "our full encode of the hinted text: {case}"
        );
        s.stop().await;
        return;
    }
    assert_eq!(
        status["token_ids"]["engine"], 4,
        "every turn on the engine's ids: {case}"
    );
    if check_every_turn {
        assert_eq!(
            status["token_ids"]["drift"], 2,
            "both turns of the session: {case}"
        );
        assert_eq!(status["token_ids"]["engine_prompts_agree"], false, "{case}");
        assert_eq!(
            prompt,
            full.as_slice(),
            "our full encode of the hinted text: {case}"
        );
    } else {
        assert_eq!(
            status["token_ids"]["drift"], 0,
            "the drifted turn was not checked: {case}"
        );
        assert_eq!(status["token_ids"]["engine_prompts_agree"], true, "{case}");
        // The engine's prompt is ours but for its last id, and so is the teacher's.
        assert_ne!(engine_prompt, ours.as_slice(), "{case}");
        ps_fake_sglang::drift_prompt(&mut full);
        assert_eq!(
            prompt,
            full.as_slice(),
            "the engine's last prompt id kept: {case}"
        );
    }
    s.stop().await;
}

#[tokio::test]
async fn opd_turns_without_a_hint_are_dropped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let s = start(&settings(&fake, Mode::Opd, dir.path())).await;
    two_turns(&s, "n", "fine. FAKE_VOTES=-1,-1,x").await;
    let samples = s.settle(2).await;
    assert!(samples.is_empty());
    assert_eq!(s.status().await["turns_dropped"], 2);
    s.stop().await;
}

#[tokio::test]
async fn a_teacher_that_times_out_drops_the_turn() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let teacher = FakeSglang::builder().spawn().await.unwrap();
    // Far longer than the timeout, so the drop can only be the timeout's.
    teacher.set_fault(Some(Fault::Delay(Duration::from_secs(300))));
    let mut set = settings(&fake, Mode::Opd, dir.path());
    set.teacher.url = Some(teacher.generate_url());
    set.teacher.timeout_sec = 1;
    let s = start(&set).await;
    two_turns(&s, "t", "FAKE_VOTES=1,1,1").await;
    assert!(s.settle(2).await.is_empty());
    assert_eq!(s.status().await["turns_dropped"], 2);
    // Turn 1 had its hint and was dropped because the teacher timed out; turn 2 had no next state.
    let records = wait_records(&dir.path().join("opd"), 2).await;
    let turn1: Vec<&Value> = records.iter().filter(|r| r["turn"] == 1).collect();
    assert_eq!(turn1.len(), 1, "{records:?}");
    let r = turn1[0];
    assert_eq!(r["outcome"], "dropped", "{r}");
    assert_eq!(r["reason"], "teacher_error", "{r}");
    let detail = r["detail"].as_str().unwrap();
    assert!(
        detail.contains(&teacher.generate_url())
            && detail.contains("did not answer within")
            && detail.contains("teacher.timeout_sec"),
        "not a teacher timeout: {detail}"
    );
    assert_eq!(r["votes"], json!([1, 1, 1]), "the hint was accepted: {r}");
    let turn2: Vec<&Value> = records.iter().filter(|r| r["turn"] == 2).collect();
    assert_eq!(turn2.len(), 1, "{records:?}");
    assert_ne!(turn2[0]["reason"], "teacher_error", "{records:?}");
    s.stop().await;
}

/// Waits until the OPD record files under `dir` hold `n` lines (they are written in the background);
/// fails when they never do.
async fn wait_records(dir: &Path, n: usize) -> Vec<Value> {
    // A generous bound, only so that a missing record fails instead of hanging.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let records: Vec<Value> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flat_map(|f| {
                let text = std::fs::read_to_string(f.unwrap().path()).unwrap();
                text.lines()
                    .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                    .collect::<Vec<_>>()
            })
            .collect();
        if records.len() >= n {
            return records;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{n} OPD records were not written: {records:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A teacher that tokenizes differently: it reports log-probs for other ids than the ones sent.
async fn mismatching_teacher() -> String {
    use axum::{Json, Router, routing::post};
    async fn generate(Json(body): Json<Value>) -> Json<Value> {
        let ids: Vec<u64> = body["input_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        let start = body["logprob_start_len"].as_u64().unwrap() as usize;
        let entries: Vec<Value> = (start..ids.len())
            .map(|p| {
                let lp = if p == start { Value::Null } else { json!(-0.5) };
                json!([lp, ids[p] + 1, null])
            })
            .collect();
        Json(
            json!({"text": "", "output_ids": [], "meta_info": {"input_token_logprobs": entries, "finish_reason": {"type": "length", "length": 0}}}),
        )
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, Router::new().route("/generate", post(generate)))
            .await
            .unwrap();
    });
    format!("http://{addr}/generate")
}

#[tokio::test]
async fn a_teacher_with_another_tokenizer_is_caught_not_padded() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let mut set = settings(&fake, Mode::Opd, dir.path());
    set.teacher.url = Some(mismatching_teacher().await);
    let s = start(&set).await;
    two_turns(&s, "m", "FAKE_VOTES=1,1,1").await;
    assert!(s.settle(2).await.is_empty());
    let st = s.status().await;
    assert_eq!(st["teacher_mismatches"], 1);
    s.stop().await;
}

#[tokio::test]
async fn combine_gives_rl_samples_with_teacher_fields_when_no_hint_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let s = start(&settings(&fake, Mode::Combine, dir.path())).await;
    // The same scripted text answers both judges: hint votes all -1 (no hint), eval votes -1.
    two_turns(&s, "c", "That was wrong. FAKE_VOTES=-1,-1,-1,-1,-1,-1").await;
    let samples = s.settle(2).await;
    assert_eq!(samples.len(), 1);
    let sample = &samples[0];
    assert_eq!(sample["reward"]["score"], -1.0);
    assert_eq!(sample["metadata"]["teacher"], "rollout");
    assert_eq!(sample["teacher_log_probs"], sample["rollout_log_probs"]);
    s.stop().await;
}

/// A content part that is not text (an image, audio, a video, a file, any other kind) is never
/// captured: in every mode, streamed or not, each turn whose prompt holds one gives no sample and
/// is counted under its reason, and the engine got the request as the client sent it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_with_parts_that_are_not_text_give_no_sample_in_any_mode() {
    let parts = [
        (
            json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}),
            "image_unsupported",
        ),
        (
            json!({"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}),
            "audio_unsupported",
        ),
        (
            json!({"type": "video_url", "video_url": {"url": "https://example.invalid/v.mp4"}}),
            "video_unsupported",
        ),
        (
            json!({"type": "file", "file": {"file_id": "file-1"}}),
            "file_unsupported",
        ),
        (
            json!({"type": "hologram", "hologram": {}}),
            "content_part_unsupported",
        ),
    ];
    for mode in [Mode::Rl, Mode::Opd, Mode::Combine] {
        let fake = FakeSglang::builder().spawn().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let server = start(&settings(&fake, mode, dir.path())).await;
        let mut turns = 0;
        for (i, (part, _)) in parts.iter().enumerate() {
            for stream in [false, true] {
                let session = format!("{mode:?}-{i}-{stream}");
                let mut messages = vec![
                    json!({"role": "system", "content": "You are terse."}),
                    json!({"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]}),
                ];
                let r = server
                    .turn(
                        &session,
                        json!({"messages": messages, "stream": stream}),
                        false,
                    )
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200, "{session}: answered as usual");
                let text = r.text().await.unwrap();
                let reply = if stream {
                    common::assemble_sse(&text)
                } else {
                    let v: Value = serde_json::from_str(&text).unwrap();
                    json!({"role": "assistant", "content": v["choices"][0]["message"]["content"]})
                };
                // The engine got the part as the client sent it.
                let sent = fake
                    .requests()
                    .into_iter()
                    .rev()
                    .find(|r| r.path == "/v1/chat/completions")
                    .unwrap();
                assert_eq!(&sent.body["messages"][1]["content"][1], part, "{session}");
                // The follow-up still carries the part in its history: no sample either.
                messages.push(reply);
                messages.push(user("And now?"));
                let r = server
                    .turn(
                        &session,
                        json!({"messages": messages, "stream": stream}),
                        true,
                    )
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200, "{session}");
                r.text().await.unwrap();
                turns += 2;
            }
        }
        // Bounded: capture is local and immediate.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let st = loop {
            let st = server.status().await;
            if st["turns_abandoned"] == turns {
                break st;
            }
            assert!(tokio::time::Instant::now() < deadline, "{mode:?}: {st}");
            tokio::time::sleep(Duration::from_millis(25)).await;
        };
        for (_, reason) in &parts {
            assert_eq!(
                st["turns_abandoned_by_reason"][reason], 4,
                "{mode:?} {reason}: {st}"
            );
        }
        assert_eq!(st["samples"]["submitted"], 0, "{mode:?}: {st}");
        assert_eq!(st["stored"], 0, "{mode:?}: no sample at all: {st}");
        // Refused on the chat path: none of them waited in the capture queue.
        assert_eq!(st["capture_queue"]["peak_bytes"], 0, "{mode:?}: {st}");
        server.stop().await;
    }
}

/// A text turn followed by a request that adds an image: the text turn gets no next state (a
/// judge reading text would see the user's message without its image) and is excluded as such;
/// the image turn is refused with its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_next_state_with_an_image_leaves_the_turn_without_one() {
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = start(&settings(&fake, Mode::Rl, dir.path())).await;
    let mut messages = vec![user("Describe a cat.")];
    let v: Value = server
        .turn("img", json!({"messages": messages}), false)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    messages.push(json!({"role": "assistant", "content": v["choices"][0]["message"]["content"]}));
    messages.push(
        json!({"role": "user", "content": [{"type": "text", "text": "No, this one: FAKE_VOTES=1"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}),
    );
    let r = server
        .turn("img", json!({"messages": messages}), true)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let samples = server.settle(1).await;
    assert_eq!(samples.len(), 1);
    assert_eq!(samples[0]["turn"], 1);
    assert_eq!(
        samples[0]["metadata"]["excluded"], "no_next_state",
        "{}",
        samples[0]["metadata"]
    );
    let st = server.status().await;
    assert_eq!(
        st["turns_abandoned_by_reason"]["image_unsupported"], 1,
        "{st}"
    );
    server.stop().await;
}

/// `opd.teacher_temperature` through the server: the default asks both teachers at 0 (as the
/// reference), a number at that number, `"rollout"` at the turn's own temperature (1.0, marked
/// assumed, when the client left it to the engine); the sample and the OPD record say which.
#[tokio::test]
async fn the_teacher_is_asked_at_the_configured_temperature() {
    use ps_core::ports::TeacherTemperature;
    for (backend, setting, client, want, assumed) in [
        (
            "sglang",
            TeacherTemperature::default(),
            Some(0.7),
            0.0,
            false,
        ),
        (
            "completions",
            TeacherTemperature::default(),
            None,
            0.0,
            false,
        ),
        (
            "sglang",
            TeacherTemperature::Fixed(0.5),
            Some(0.7),
            0.5,
            false,
        ),
        (
            "completions",
            TeacherTemperature::Rollout,
            Some(0.7),
            0.7,
            false,
        ),
        ("sglang", TeacherTemperature::Rollout, Some(0.7), 0.7, false),
        ("sglang", TeacherTemperature::Rollout, None, 1.0, true),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeSglang::builder().spawn().await.unwrap();
        let mut set = settings(&fake, Mode::Opd, dir.path());
        set.opd.teacher_temperature = setting;
        if backend == "completions" {
            set.teacher.backend = ps_config::TeacherBackend::OpenaiCompletions;
            set.teacher.url = Some(fake.base_url());
            set.teacher.model = Some("teacher".into());
        }
        let s = start(&set).await;
        let first = json!([user("Plan a weekend in Rome.")]);
        let mut body = json!({"messages": first});
        if let Some(t) = client {
            body["temperature"] = json!(t);
        }
        let r: Value = s
            .turn("t", body.clone(), false)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        body["messages"] = json!([
            user("Plan a weekend in Rome."),
            r["choices"][0]["message"],
            user("I wanted museums, not food. FAKE_VOTES=1,1,1")
        ]);
        assert_eq!(s.turn("t", body, true).send().await.unwrap().status(), 200);
        let samples = s.settle(2).await;
        let case = format!("{backend} {setting:?} client {client:?}");
        assert_eq!(samples.len(), 1, "{case}");
        let m = &samples[0]["metadata"];
        assert_eq!(m["teacher_temperature"].as_f64(), Some(want), "{case}: {m}");
        assert_eq!(
            m.get("teacher_temperature_assumed").is_some(),
            assumed,
            "{case}"
        );
        let asked: Vec<f64> = fake
            .requests()
            .into_iter()
            .filter_map(|r| match r.path.as_str() {
                "/generate" if r.body.get("input_ids").is_some() => {
                    r.body["sampling_params"]["temperature"].as_f64()
                }
                "/v1/completions" => r.body["temperature"].as_f64(),
                _ => None,
            })
            .collect();
        assert_eq!(asked, [want], "{case}");
        let records = wait_records(&dir.path().join("opd"), 1).await;
        let distilled: Vec<&Value> = records
            .iter()
            .filter(|r| r["outcome"] == "distilled")
            .collect();
        assert_eq!(
            distilled[0]["teacher_temperature"].as_f64(),
            Some(want),
            "{case}"
        );
        s.stop().await;
    }
}
