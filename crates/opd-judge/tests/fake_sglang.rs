//! [`HintScorer`] over [`SglangJudge`] against the in-process fake SGLang `/generate`, and the teacher
//! input built from the hint it accepts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{sync::Arc, time::Duration};

use ps_chat_template::ChatTokenizer;
use ps_core::ports::{HintJudge, HintVote, JudgeInput};
use ps_fake_sglang::{FakeHandle, FakeSglang};
use ps_judge::{ROUTER_URL_KEY, SglangJudge, SglangJudgeConfig};
use ps_opd_judge::{DEFAULT_MIN_HINT_CHARS, HintScorer, hint_messages, teacher_input_text};
use serde_json::json;
use tokio::sync::Semaphore;

async fn fake() -> FakeHandle {
    FakeSglang::builder().spawn().await.expect("spawn fake")
}

fn judge(url: &str, tok: Arc<ChatTokenizer>) -> SglangJudge {
    let config = SglangJudgeConfig {
        router_url: url.to_owned(),
        timeout: Duration::from_secs(30),
        temperature: 0.6,
        max_new_tokens: 4096,
    };
    SglangJudge::new(config, Some(tok)).expect("judge")
}

/// One vote at a time, in vote order (the semaphore is fair), so scripted votes arrive in order.
fn sequential(backend: SglangJudge, m: usize) -> HintScorer {
    HintScorer::new(
        Arc::new(backend),
        m,
        DEFAULT_MIN_HINT_CHARS,
        Some(Arc::new(Semaphore::new(1))),
    )
}

const RESPONSE: &str = "<think>\nThe user wants the file.\n</think>\n\nHere is a.txt.<|im_end|>\n";

fn input(next: &str) -> JudgeInput {
    JudgeInput {
        response_text: RESPONSE.into(),
        next_state_text: next.into(),
        next_state_role: "user".into(),
    }
}

#[tokio::test]
async fn one_turn_is_accepted_and_one_rejected() {
    let fake = fake().await;
    let tok = Arc::new(ChatTokenizer::mini());
    let scorer = sequential(judge(&fake.generate_url(), tok.clone()), 3);

    // Accepted: the first vote is 1 with a hint; the others are -1 and a failed vote.
    let accepted = scorer
        .judge(&input("No, I meant b.txt. FAKE_VOTES=1,-1,x"))
        .await;
    assert_eq!(accepted.scores(), vec![Some(1), Some(-1), None]);
    let (index, hint) = accepted.best.clone().expect("an accepted hint");
    assert_eq!(index, 0);
    assert_eq!(hint, accepted.votes[0].hint);
    assert!(hint.chars().count() > DEFAULT_MIN_HINT_CHARS, "{hint:?}");
    assert_eq!(
        accepted.votes[1],
        HintVote {
            score: Some(-1),
            hint: String::new()
        }
    );
    assert_eq!(accepted.failures[..2], [None, None]);
    let reason = accepted.failures[2].as_deref().expect("a failure reason");
    assert!(reason.contains("boxed"), "{reason}");
    let rep = accepted.representative.as_deref().expect("representative");
    assert!(
        rep.contains(&format!("[HINT_START]{hint}[HINT_END]")),
        "{rep}"
    );
    assert!(rep.ends_with("\\boxed{1}<|im_end|>"), "{rep}");

    // Rejected: no vote of 1, so no hint.
    let rejected = scorer.judge(&input("Thanks! FAKE_VOTES=-1,x,-1")).await;
    assert_eq!(rejected.scores(), vec![Some(-1), None, Some(-1)]);
    assert!(rejected.votes.iter().all(|v| v.hint.is_empty()));
    assert_eq!(rejected.best, None);
    assert!(!rejected.accepted());

    // Every vote was one /generate call with the rendered hint prompt.
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 6);
    let prompt = tok
        .render(
            &hint_messages(&input("Thanks! FAKE_VOTES=-1,x,-1")),
            None,
            true,
            None,
        )
        .unwrap();
    assert_eq!(reqs[5].path, "/generate");
    assert_eq!(reqs[5].body["text"], json!(prompt));
    assert!(prompt.contains("[HINT_START]"));

    // The accepted hint goes into the teacher's prompt, followed by the response.
    let messages = vec![json!({"role": "user", "content": "Open my file."})];
    let text = teacher_input_text(&tok, &messages, None, &hint, RESPONSE, None).unwrap();
    assert_eq!(
        text,
        format!(
            "<|im_start|>user\nOpen my file.\n\n[user's hint / instruction]\n{hint}<|im_end|>\n\
             <|im_start|>assistant\n{RESPONSE}"
        )
    );
    assert!(!tok.encode(&text).unwrap().is_empty());
}

#[tokio::test]
async fn parallel_votes_pick_the_longest_hint() {
    let fake = fake().await;
    let tok = Arc::new(ChatTokenizer::mini());
    let scorer = HintScorer::new(
        Arc::new(judge(&fake.generate_url(), tok)),
        4,
        DEFAULT_MIN_HINT_CHARS,
        None,
    );
    let o = scorer.judge(&input("Wrong file. FAKE_VOTES=1")).await;
    assert_eq!(o.scores(), vec![Some(1); 4]);
    let longest = o
        .votes
        .iter()
        .map(|v| v.hint.chars().count())
        .max()
        .unwrap();
    let (index, hint) = o.best.clone().expect("an accepted hint");
    assert_eq!(hint.chars().count(), longest);
    let first_longest = o
        .votes
        .iter()
        .position(|v| v.hint.chars().count() == longest)
        .unwrap();
    assert_eq!(index, first_longest);
    assert_eq!(fake.requests().len(), 4);
}

#[tokio::test]
async fn an_unreachable_judge_rejects_the_turn_without_panicking() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}/generate");
    let scorer = HintScorer::new(
        Arc::new(judge(&url, Arc::new(ChatTokenizer::mini()))),
        3,
        DEFAULT_MIN_HINT_CHARS,
        None,
    );
    let o = scorer.judge(&input("FAKE_VOTES=1")).await;
    assert_eq!(o.scores(), vec![None, None, None]);
    assert_eq!(o.best, None);
    assert_eq!(o.representative, None);
    for reason in o.failures.iter().map(|f| f.as_deref().unwrap()) {
        assert!(
            reason.contains(&url) && reason.contains(ROUTER_URL_KEY),
            "{reason}"
        );
    }
}
