//! [`SglangTeacher`] and [`CompletionsTeacher`] against the in-process fake SGLang: its `/generate`
//! (SGLang's input log-prob layout, entry 0 always null) and its vLLM-shaped `/v1/completions`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{sync::Arc, time::Duration};

use ps_core::ports::{TeacherLogprobs, TeacherScorer, check_alignment};
use ps_fake_sglang::{FakeHandle, FakeSglang, Fault, teacher_logprob, teacher_top_logprobs};
use ps_teacher_client::{
    API_KEY_ENV_KEY, CompletionsTeacher, CompletionsTeacherConfig, SglangTeacher,
    SglangTeacherConfig, TIMEOUT_KEY, TeacherError, URL_KEY,
};
use serde_json::{Value, json};

const PROMPT: &str = "<|im_start|>user\nWhat is the capital of France?\n\n[user's hint / instruction]\nAnswer in one word.<|im_end|>\n<|im_start|>assistant\n";
const RESPONSE: &str = "Paris is the capital.<|im_end|>\n";

async fn fake() -> FakeHandle {
    FakeSglang::builder().spawn().await.expect("spawn fake")
}

/// The teacher input (hinted prompt, then the response) and `T`, tokenized by the fake's tokenizer.
fn input(fake: &FakeHandle) -> (Vec<u32>, usize) {
    let tok = fake.state().tokenizer();
    let mut ids = tok.encode(PROMPT).unwrap();
    let response = tok.encode(RESPONSE).unwrap();
    let t = response.len();
    assert!(t >= 3, "{response:?}");
    ids.extend(response);
    (ids, t)
}

fn sglang(url: &str, timeout: Duration, api_key: Option<&str>) -> SglangTeacher {
    SglangTeacher::new(SglangTeacherConfig {
        url: url.to_owned(),
        timeout,
        api_key: api_key.map(Into::into),
        images: false,
    })
    .expect("teacher")
}

fn completions(base: &str, api_key: Option<&str>) -> CompletionsTeacher {
    CompletionsTeacher::new(CompletionsTeacherConfig {
        base_url: base.to_owned(),
        model: "teacher".to_owned(),
        api_key: api_key.map(Into::into),
        timeout: Duration::from_secs(30),
    })
    .expect("teacher")
}

/// Every value equals the fake teacher's, for each of the last `T` positions including the first.
fn assert_fake_values(r: &TeacherLogprobs, ids: &[u32], t: usize, k: usize) {
    let l = ids.len();
    assert_eq!(r.log_probs.len(), t);
    assert_eq!(r.echoed_ids, ids[l - t..]);
    for (j, lp) in r.log_probs.iter().enumerate() {
        let pos = l - t + j;
        assert_eq!(
            *lp,
            teacher_logprob(ids[pos - 1], ids[pos], pos),
            "position {j}"
        );
    }
    if k == 0 {
        assert!(r.topk_log_probs.is_none() && r.topk_indices.is_none());
        return;
    }
    let (lps, idx) = (
        r.topk_log_probs.as_ref().unwrap(),
        r.topk_indices.as_ref().unwrap(),
    );
    assert_eq!((lps.len(), idx.len()), (t, t));
    for j in 0..t {
        let pos = l - t + j;
        let want = teacher_top_logprobs(ids[pos - 1], ids[pos], pos, k);
        let want_lps: Vec<f64> = want.iter().map(|w| w.0).collect();
        let want_ids: Vec<u32> = want.iter().map(|w| w.1).collect();
        assert_eq!(lps[j], want_lps, "top-K log-probs at position {j}");
        assert_eq!(idx[j], want_ids, "top-K ids at position {j}");
    }
}

#[tokio::test]
async fn sglang_scores_every_response_position_including_the_first() {
    let fake = fake().await;
    let (ids, t) = input(&fake);
    let teacher = sglang(&fake.generate_url(), Duration::from_secs(30), None);
    let r = teacher.score(&ids, t, 5).await.unwrap();
    assert_fake_values(&r, &ids, t, 5);
    assert!(r.echo_verified);
    assert_eq!(
        check_alignment(&ids[ids.len() - t..], &r.echoed_ids),
        Ok(())
    );

    // One request gives both the values and the top-K, with S = L - T - 1.
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].path, "/generate");
    assert_eq!(
        reqs[0].body,
        json!({"input_ids": ids,
               "sampling_params": {"temperature": 0.0, "max_new_tokens": 0, "skip_special_tokens": false},
               "return_logprob": true, "logprob_start_len": ids.len() - t - 1, "top_logprobs_num": 5})
    );
}

#[tokio::test]
async fn the_reference_start_loses_the_first_response_token() {
    // What the reference sends (S = L - T): the first response token falls on the null entry 0.
    let fake = fake().await;
    let (ids, t) = input(&fake);
    let body: Value = reqwest::Client::new()
        .post(fake.generate_url())
        .json(
            &json!({"input_ids": ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": 0},
                      "return_logprob": true, "logprob_start_len": ids.len() - t}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let entries = body["meta_info"]["input_token_logprobs"]
        .as_array()
        .unwrap();
    assert_eq!(entries.len(), t);
    assert!(entries[0][0].is_null());
    // Ours has a real value there.
    let r = sglang(&fake.generate_url(), Duration::from_secs(30), None)
        .score(&ids, t, 0)
        .await
        .unwrap();
    let first = ids.len() - t;
    assert_eq!(
        r.log_probs[0],
        teacher_logprob(ids[first - 1], ids[first], first)
    );
}

#[tokio::test]
async fn sglang_without_top_k_sends_no_top_logprobs_num() {
    let fake = fake().await;
    let (ids, t) = input(&fake);
    let r = sglang(&(fake.base_url() + "/"), Duration::from_secs(30), None)
        .score(&ids, t, 0)
        .await
        .unwrap();
    assert_fake_values(&r, &ids, t, 0);
    let body = &fake.requests()[0].body;
    assert!(body.get("top_logprobs_num").is_none(), "{body}");
    assert_eq!(fake.requests()[0].path, "/generate");
}

#[tokio::test]
async fn a_one_token_prompt_is_enough_context() {
    let fake = fake().await;
    let ids = [11u32, 12, 13];
    let teacher = sglang(&fake.generate_url(), Duration::from_secs(30), None);
    let r = teacher.score(&ids, 2, 2).await.unwrap();
    assert_fake_values(&r, &ids, 2, 2);
    assert_eq!(fake.requests()[0].body["logprob_start_len"], 0);
}

#[tokio::test]
async fn a_response_without_a_prompt_is_no_context_and_sends_nothing() {
    let fake = fake().await;
    let ids = [11u32, 12, 13];
    for teacher in [
        Arc::new(sglang(&fake.generate_url(), Duration::from_secs(30), None))
            as Arc<dyn TeacherScorer>,
        Arc::new(completions(&fake.base_url(), None)),
    ] {
        for t in [3, 4] {
            let e = teacher.score(&ids, t, 0).await.unwrap_err();
            // Through the port: the client's own error inside, with its stable reason.
            assert_eq!(e.reason(), "teacher_no_context");
            assert!(
                matches!(
                    e.downcast_ref::<TeacherError>(),
                    Some(TeacherError::NoContext { .. })
                ),
                "{e}"
            );
        }
        let empty = teacher.score(&ids, 0, 3).await.unwrap();
        assert!(empty.log_probs.is_empty() && empty.topk_indices == Some(vec![]));
    }
    assert!(fake.requests().is_empty());
}

#[tokio::test]
async fn a_teacher_with_another_tokenization_is_caught() {
    // The teacher input was tokenized as one text, and the boundary merged differently: the teacher
    // scores (and echoes) ids that are not our response ids. Nothing is padded; the first differing
    // position is reported.
    let fake = fake().await;
    let (ids, t) = input(&fake);
    let ours = ids[ids.len() - t..].to_vec();
    let mut theirs_input = ids.clone();
    let l = theirs_input.len();
    theirs_input[l - t + 1] = ours[1] + 1;
    let r = sglang(&fake.generate_url(), Duration::from_secs(30), None)
        .score(&theirs_input, t, 0)
        .await
        .unwrap();
    let m = check_alignment(&ours, &r.echoed_ids).unwrap_err();
    assert_eq!(m.first_position, 1);
    assert_eq!((m.ours, m.theirs), (Some(ours[1]), Some(ours[1] + 1)));
    assert_eq!((m.len_ours, m.len_theirs), (t, t));
    assert_eq!(m.reason(), "teacher_token_mismatch");
    // A teacher that scored one token fewer is a mismatch too.
    let shorter = check_alignment(&ours, &r.echoed_ids[1..]).unwrap_err();
    assert_eq!(shorter.first_position, 0);
}

#[tokio::test]
async fn a_slow_teacher_times_out_naming_the_timeout_key() {
    let fake = fake().await;
    let (ids, t) = input(&fake);
    fake.push_fault(Fault::Delay(Duration::from_secs(60)));
    let teacher = sglang(&fake.generate_url(), Duration::from_millis(300), None);
    let e = teacher.score(&ids, t, 0).await.unwrap_err();
    assert!(matches!(e, TeacherError::Timeout { .. }), "{e}");
    let text = e.to_string();
    assert!(
        text.contains(TIMEOUT_KEY) && text.contains(&fake.generate_url()),
        "{text}"
    );
    assert_eq!(e.reason(), "teacher_timeout");
}

#[tokio::test]
async fn http_errors_and_garbage_are_errors() {
    let fake = fake().await;
    let (ids, t) = input(&fake);
    let teacher = sglang(&fake.generate_url(), Duration::from_secs(30), None);

    fake.push_fault(Fault::Status(
        500,
        json!({"error": {"message": "scheduler died"}}).to_string(),
    ));
    let e = teacher.score(&ids, t, 0).await.unwrap_err();
    assert!(
        matches!(e, TeacherError::Status { status: 500, ref body, .. } if body == "scheduler died"),
        "{e}"
    );
    assert!(e.to_string().contains(URL_KEY), "{e}");

    fake.push_fault(Fault::Garbage);
    let e = teacher.score(&ids, t, 0).await.unwrap_err();
    assert!(matches!(e, TeacherError::InvalidBody { .. }), "{e}");
    assert!(e.to_string().contains("not SGLang /generate JSON"), "{e}");

    fake.push_fault(Fault::CutStream { after_chunks: 0 });
    let e = teacher.score(&ids, t, 0).await.unwrap_err();
    assert!(
        matches!(
            e,
            TeacherError::Transport { .. } | TeacherError::InvalidBody { .. }
        ),
        "{e}"
    );

    // The server rejects a logprob_start_len >= L with 400: not reachable with our layout, but an
    // HTTP 400 from a misbehaving server is reported with its message.
    fake.push_fault(Fault::Status(
        400,
        json!({"error": {"message": "bad input"}}).to_string(),
    ));
    let e = teacher.score(&ids, t, 0).await.unwrap_err();
    assert!(e.to_string().contains("bad input"), "{e}");
}

#[tokio::test]
async fn a_refused_connection_names_the_url() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/generate", listener.local_addr().unwrap());
    drop(listener);
    let e = sglang(&url, Duration::from_secs(5), None)
        .score(&[1, 2, 3], 1, 0)
        .await
        .unwrap_err();
    assert!(matches!(e, TeacherError::Connect { .. }), "{e}");
    assert!(e.to_string().contains(&url) && e.to_string().contains(URL_KEY));
}

#[tokio::test]
async fn a_rejected_key_is_unauthorized_without_the_key() {
    let fake = FakeSglang::builder()
        .api_key(Some("right-key".into()))
        .spawn()
        .await
        .unwrap();
    let (ids, t) = input(&fake);
    let secret = "sk-wrong-but-secret-123";
    for teacher in [
        Arc::new(sglang(
            &fake.generate_url(),
            Duration::from_secs(30),
            Some(secret),
        )) as Arc<dyn TeacherScorer>,
        Arc::new(completions(&fake.base_url(), Some(secret))),
    ] {
        let e = teacher.score(&ids, t, 0).await.unwrap_err();
        assert!(
            matches!(
                e.downcast_ref::<TeacherError>(),
                Some(TeacherError::Unauthorized {
                    status: 401,
                    key_sent: true,
                    ..
                })
            ),
            "{e}"
        );
        let text = format!("{e} {e:?} {}", teacher.describe());
        assert!(!text.contains(secret), "{text}");
        assert!(
            text.contains(API_KEY_ENV_KEY) && text.contains("refused"),
            "{text}"
        );
    }
    let e = sglang(&fake.generate_url(), Duration::from_secs(30), None)
        .score(&ids, t, 0)
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            TeacherError::Unauthorized {
                key_sent: false,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("none is configured"), "{e}");
    // The right key works, sent as a Bearer token.
    sglang(
        &fake.generate_url(),
        Duration::from_secs(30),
        Some("right-key"),
    )
    .score(&ids, t, 0)
    .await
    .unwrap();
    completions(&fake.base_url(), Some("right-key"))
        .score(&ids, t, 1)
        .await
        .unwrap();
}

#[tokio::test]
async fn completions_teacher_matches_the_fake_teacher() {
    let fake = fake().await;
    let (ids, t) = input(&fake);
    for base in [
        fake.base_url(),
        fake.base_url() + "/",
        fake.base_url() + "/v1",
        fake.base_url() + "/v1/",
        fake.completions_url(),
    ] {
        let teacher = completions(&base, None);
        assert_eq!(teacher.url(), fake.completions_url());
        let r = teacher.score(&ids, t, 5).await.unwrap();
        assert_fake_values(&r, &ids, t, 5);
        assert!(r.echo_verified);
        let r = teacher.score(&ids, t, 0).await.unwrap();
        assert_fake_values(&r, &ids, t, 0);
    }
    let reqs = fake.requests();
    assert!(reqs.iter().all(|r| r.path == "/v1/completions"));
    assert_eq!(
        reqs[0].body,
        json!({"model": "teacher", "prompt": ids, "max_tokens": 1, "temperature": 0.0,
               "prompt_logprobs": 5, "return_token_ids": true})
    );
    assert_eq!(reqs[1].body["prompt_logprobs"], 1);
}

#[tokio::test]
async fn completions_errors() {
    let fake = fake().await;
    let (ids, t) = input(&fake);
    let teacher = completions(&fake.base_url(), None);
    fake.push_fault(Fault::Status(500, Fault::status_body(500)));
    let e = teacher.score(&ids, t, 0).await.unwrap_err();
    assert!(matches!(e, TeacherError::Status { status: 500, .. }), "{e}");
    fake.push_fault(Fault::Garbage);
    let e = teacher.score(&ids, t, 0).await.unwrap_err();
    assert!(matches!(e, TeacherError::InvalidBody { .. }), "{e}");
    fake.push_fault(Fault::Delay(Duration::from_secs(60)));
    let slow = CompletionsTeacher::new(CompletionsTeacherConfig {
        base_url: fake.base_url(),
        model: "teacher".into(),
        api_key: None,
        timeout: Duration::from_millis(300),
    })
    .unwrap();
    let e = slow.score(&ids, t, 0).await.unwrap_err();
    assert!(e.to_string().contains(TIMEOUT_KEY), "{e}");
    // A chat URL is refused at construction, saying what would work.
    let e = CompletionsTeacher::new(CompletionsTeacherConfig {
        base_url: fake.chat_url(),
        model: "teacher".into(),
        api_key: None,
        timeout: Duration::from_secs(1),
    })
    .unwrap_err();
    assert!(matches!(e, TeacherError::ChatEndpoint { .. }), "{e}");
    let e = SglangTeacher::new(SglangTeacherConfig {
        url: fake.chat_url(),
        timeout: Duration::from_secs(1),
        api_key: None,
        images: false,
    })
    .unwrap_err();
    assert!(matches!(e, TeacherError::ChatEndpoint { .. }), "{e}");
}

#[test]
fn chat_endpoint_error_names_what_works() {
    let e = ps_teacher_client::chat_endpoint_error("https://api.openai.com/v1/chat/completions");
    let text = e.to_string();
    for needle in [
        "https://api.openai.com/v1/chat/completions",
        "cannot return the log-probs of given tokens",
        "/generate",
        "/v1/completions",
        URL_KEY,
    ] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
}

/// `opd.teacher_temperature` reaches each backend's request as the temperature it is asked at;
/// the answer records it, and the values are the same (neither engine applies a temperature to
/// prompt log-probs; the fake follows them).
#[tokio::test]
async fn the_teacher_temperature_reaches_both_backends() {
    let fake = fake().await;
    let (ids, t) = input(&fake);
    let by_sglang: Arc<dyn TeacherScorer> =
        Arc::new(sglang(&fake.generate_url(), Duration::from_secs(30), None));
    let by_completions: Arc<dyn TeacherScorer> = Arc::new(completions(&fake.base_url(), None));
    for (teacher, path) in [
        (by_sglang, "/generate"),
        (by_completions, "/v1/completions"),
    ] {
        for temperature in [0.0, 0.7, 1.0] {
            let r = teacher
                .score_at(&ids, t, 2, &[], temperature)
                .await
                .unwrap();
            assert_eq!(r.temperature, temperature);
            assert!(!r.temperature_assumed);
            assert_fake_values(&r, &ids, t, 2);
            let sent = fake.requests().pop().unwrap();
            assert_eq!(sent.path, path);
            let asked = if path == "/generate" {
                &sent.body["sampling_params"]["temperature"]
            } else {
                &sent.body["temperature"]
            };
            assert_eq!(asked.as_f64(), Some(temperature), "{path}: {}", sent.body);
        }
    }
}

/// A teacher that does not say how it takes a temperature refuses any but 0 rather than ignore
/// it; 0 is its plain score.
#[tokio::test]
async fn a_teacher_without_temperatures_refuses_one() {
    struct Plain;
    #[async_trait::async_trait]
    impl TeacherScorer for Plain {
        async fn score(
            &self,
            _: &[u32],
            t: usize,
            k: usize,
        ) -> Result<TeacherLogprobs, ps_core::ports::CallError> {
            let mut r = TeacherLogprobs::empty(k);
            r.log_probs = vec![-1.0; t];
            Ok(r)
        }
        fn describe(&self) -> String {
            "plain".into()
        }
    }
    let r = Plain.score_at(&[1, 2, 3], 2, 0, &[], 0.0).await.unwrap();
    assert_eq!(r.log_probs, [-1.0, -1.0]);
    let e = Plain
        .score_at(&[1, 2, 3], 2, 0, &[], 0.5)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("opd.teacher_temperature"), "{e}");
}
