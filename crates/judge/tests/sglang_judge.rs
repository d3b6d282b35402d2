//! [`SglangJudge`] and [`PrmScorer`] against the in-process fake SGLang `/generate`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{sync::Arc, time::Duration};

use ps_chat_template::ChatTokenizer;
use ps_core::ports::{JudgeBackend, JudgeInput, TurnScorer};
use ps_fake_sglang::{FakeHandle, FakeSglang, Fault};
use ps_judge::{
    JudgeError, PrmScorer, ROUTER_URL_KEY, SglangJudge, SglangJudgeConfig, TIMEOUT_KEY,
    judge_messages,
};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

async fn fake() -> FakeHandle {
    FakeSglang::builder().spawn().await.expect("spawn fake")
}

fn config(url: &str) -> SglangJudgeConfig {
    SglangJudgeConfig {
        router_url: url.to_owned(),
        timeout: Duration::from_secs(30),
        temperature: 0.6,
        max_new_tokens: 4096,
    }
}

fn judge(url: &str) -> SglangJudge {
    SglangJudge::new(config(url), Some(Arc::new(ChatTokenizer::mini()))).expect("judge")
}

fn input(next: &str) -> JudgeInput {
    JudgeInput {
        response_text: "<think>\nList the files.\n</think>\n\n<tool_call>\n{\"name\": \"ls\", \"arguments\": {}}\n</tool_call><|im_end|>\n".into(),
        next_state_text: next.into(),
        next_state_role: "tool".into(),
    }
}

/// One vote at a time, in vote order (the semaphore is fair), so scripted votes arrive in order.
fn sequential(backend: SglangJudge, m: usize) -> PrmScorer {
    PrmScorer::new(Arc::new(backend), m, Some(Arc::new(Semaphore::new(1))))
}

#[tokio::test]
async fn scripted_votes_give_the_majority() {
    let fake = fake().await;
    let scorer = sequential(judge(&fake.generate_url()), 3);
    let s = scorer
        .score(&input("file_a file_b FAKE_VOTES=1,-1,1 done"))
        .await;
    assert_eq!(s.votes, vec![Some(1), Some(-1), Some(1)]);
    assert_eq!(s.score, 1.0);
    assert_eq!(s.failures, vec![None, None, None]);
    let rep = s.representative.expect("representative");
    assert!(rep.ends_with("\\boxed{1}<|im_end|>"), "{rep}");
    assert_eq!(fake.requests().len(), 3);
}

#[tokio::test]
async fn parallel_votes_all_arrive() {
    let fake = fake().await;
    // The fake's gate stays shut until all three votes are in flight at once: votes sent one
    // after the other would never get there.
    fake.hold();
    let scorer = PrmScorer::new(Arc::new(judge(&fake.generate_url())), 3, None);
    let scoring = tokio::spawn(async move { scorer.score(&input("FAKE_VOTES=-1,x,-1")).await });
    // A generous bound: the three requests arrive in milliseconds; it only turns votes that
    // wait for one another into a failure instead of a hang.
    tokio::time::timeout(Duration::from_secs(30), fake.wait_for_in_flight(3))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the votes are not in flight together ({} at once)",
                fake.in_flight()
            )
        });
    fake.release();
    let s = scoring.await.unwrap();
    let mut votes = s.votes.clone();
    votes.sort();
    assert_eq!(votes, vec![None, Some(-1), Some(-1)]);
    assert_eq!(s.score, -1.0);
    assert_eq!(s.failed_votes(), 1);
    let reason = s.failures.iter().flatten().next().expect("one failure");
    assert!(reason.contains(&fake.generate_url()), "{reason}");
    assert_eq!(fake.requests().len(), 3);
}

#[tokio::test]
async fn the_request_body_has_the_contract_shape() {
    let fake = fake().await;
    let tok = Arc::new(ChatTokenizer::mini());
    let judge = SglangJudge::new(config(&fake.generate_url()), Some(tok.clone())).unwrap();
    let inp = input("FAKE_VOTES=0");
    let text = judge.complete(&judge_messages(&inp)).await.unwrap();
    assert!(text.contains("\\boxed{0}"), "{text}");
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].method, "POST");
    assert_eq!(reqs[0].path, "/generate");
    let prompt = tok.render(&judge_messages(&inp), None, true, None).unwrap();
    assert!(prompt.starts_with("<|im_start|>system\n"), "{prompt}");
    assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt}");
    assert_eq!(
        reqs[0].body,
        json!({
            "text": prompt,
            "sampling_params": {
                "temperature": 0.6,
                "top_p": 1.0,
                "top_k": -1,
                "max_new_tokens": 4096,
                "skip_special_tokens": false,
                "no_stop_trim": true,
                "spaces_between_special_tokens": false,
            },
            "return_logprob": false,
        })
    );
}

#[tokio::test]
async fn without_a_tokenizer_the_contents_are_joined() {
    let fake = fake().await;
    let judge = SglangJudge::new(config(&fake.generate_url()), None).unwrap();
    let msgs = judge_messages(&input("FAKE_VOTES=1"));
    judge.complete(&msgs).await.unwrap();
    let expected = format!(
        "{}\n{}",
        msgs[0]["content"].as_str().unwrap(),
        msgs[1]["content"].as_str().unwrap()
    );
    assert_eq!(fake.requests()[0].body["text"], Value::String(expected));
}

#[tokio::test]
async fn garbage_is_a_failed_vote() {
    let fake = fake().await;
    fake.push_fault(Fault::Garbage);
    let s = sequential(judge(&fake.generate_url()), 3)
        .score(&input("FAKE_VOTES=1"))
        .await;
    assert_eq!(s.votes, vec![None, Some(1), Some(1)]);
    assert_eq!(s.score, 1.0);
    let reason = s.failures[0].as_deref().unwrap();
    assert!(reason.contains(&fake.generate_url()), "{reason}");
    assert!(reason.contains("not SGLang /generate JSON"), "{reason}");
}

#[tokio::test]
async fn an_http_error_is_a_failed_vote_with_the_message() {
    let fake = fake().await;
    let body = json!({"error": {"message": "engine crashed"}}).to_string();
    fake.push_fault(Fault::Status(500, body.clone()));
    let j = judge(&fake.generate_url());
    let err = j
        .complete(&judge_messages(&input("FAKE_VOTES=1")))
        .await
        .unwrap_err();
    match &err {
        JudgeError::Status {
            url, status, body, ..
        } => {
            assert_eq!(url, &fake.generate_url());
            assert_eq!(*status, 500);
            assert_eq!(body, "engine crashed");
        }
        other => panic!("expected Status, got {other:?}"),
    }
    fake.push_fault(Fault::Status(500, body));
    let s = sequential(j, 3).score(&input("FAKE_VOTES=-1")).await;
    assert_eq!(s.votes, vec![None, Some(-1), Some(-1)]);
    let reason = s.failures[0].as_deref().unwrap();
    for needle in [
        "HTTP 500",
        "engine crashed",
        ROUTER_URL_KEY,
        &fake.generate_url(),
    ] {
        assert!(reason.contains(needle), "{needle:?} missing in {reason}");
    }
}

#[tokio::test]
async fn a_refused_connection_fails_every_vote() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}/generate");
    let j = judge(&url);
    let err = j.complete(&judge_messages(&input("x"))).await.unwrap_err();
    assert!(matches!(err, JudgeError::Connect { .. }), "{err:?}");
    let s = PrmScorer::new(Arc::new(j), 3, None)
        .score(&input("x"))
        .await;
    assert_eq!(s.votes, vec![None, None, None]);
    assert_eq!(s.score, 0.0);
    assert_eq!(s.representative, None);
    for reason in s.failures.iter().map(|f| f.as_deref().unwrap()) {
        assert!(
            reason.contains(&url) && reason.contains(ROUTER_URL_KEY),
            "{reason}"
        );
        assert!(reason.to_lowercase().contains("refused"), "{reason}");
    }
}

#[tokio::test]
async fn a_dropped_connection_is_a_failed_vote() {
    let fake = fake().await;
    fake.push_fault(Fault::Refuse);
    let s = sequential(judge(&fake.generate_url()), 2)
        .score(&input("FAKE_VOTES=1"))
        .await;
    assert_eq!(s.votes, vec![None, Some(1)]);
    let reason = s.failures[0].as_deref().unwrap();
    assert!(reason.contains(&fake.generate_url()), "{reason}");
}

#[tokio::test]
async fn a_slow_judge_times_out() {
    let fake = fake().await;
    // The first vote would be answered after a minute (so a client without the timeout fails the
    // assertions below instead of hanging); the second at once.
    fake.push_fault(Fault::Delay(Duration::from_secs(60)));
    let mut cfg = config(&fake.generate_url());
    // The same timeout covers the healthy vote, which the fake answers in milliseconds even in a
    // debug build: 5 s is a generous bound for it, and still well short of the stalled vote.
    cfg.timeout = Duration::from_secs(5);
    let j = SglangJudge::new(cfg, Some(Arc::new(ChatTokenizer::mini()))).unwrap();
    let s = sequential(j, 2).score(&input("FAKE_VOTES=1")).await;
    assert_eq!(s.votes, vec![None, Some(1)]);
    let reason = s.failures[0].as_deref().unwrap();
    assert!(
        reason.contains(&fake.generate_url()) && reason.contains(TIMEOUT_KEY),
        "{reason}"
    );
}

#[tokio::test]
async fn the_votes_of_a_turn_send_one_rendered_body_each() {
    let fake = fake().await;
    let tok = Arc::new(ChatTokenizer::mini());
    let judge = SglangJudge::new(config(&fake.generate_url()), Some(tok.clone())).unwrap();
    let inp = input("FAKE_VOTES=1,0,-1");
    let answers = judge.complete_votes(&judge_messages(&inp), 3, None).await;
    assert_eq!(answers.len(), 3);
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 3, "one call per vote");
    let prompt = tok.render(&judge_messages(&inp), None, true, None).unwrap();
    for req in &reqs {
        assert_eq!(req.body, judge.request_body(&prompt));
    }
    assert!(
        judge
            .complete_votes(&judge_messages(&inp), 0, None)
            .await
            .is_empty()
    );
    assert_eq!(fake.requests().len(), 3, "no vote, no call");
}
