//! [`ProviderJudge`] as the judges' backend: content, the reasoning fallback, and failed calls whose
//! reason names the provider and the key variable.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{sync::Arc, time::Duration};

use ps_core::ports::{JudgeBackend, JudgeInput, TurnScorer};
use ps_fake_sglang::{FakeProvider, FakeProviderHandle, ProviderFault};
use ps_judge::PrmScorer;
use ps_provider_client::{JUDGE_PROVIDER, ProviderClient, ProviderConfig, ProviderJudge};
use serde_json::json;

const KEY: &str = "sk-judge-key-0b7d";

async fn setup() -> (FakeProviderHandle, ProviderJudge) {
    let p = FakeProvider::builder().api_key(KEY).spawn().await.unwrap();
    let client = ProviderClient::new(ProviderConfig {
        name: "provider".into(),
        chat_url: p.chat_url(),
        api_key: Some(KEY.into()),
        key_var: Some("JUDGE_KEY".into()),
        max_concurrency: 2,
        timeout: Duration::from_secs(5),
        max_retries: 0,
        deadline: None,
    })
    .unwrap();
    let judge = ProviderJudge::new(Arc::new(client), "judge-m", Some(256), Some(0.6));
    (p, judge)
}

fn prompt(text: &str) -> Vec<serde_json::Value> {
    vec![
        json!({"role": "system", "content": "judge"}),
        json!({"role": "user", "content": text}),
    ]
}

#[tokio::test]
async fn the_answer_is_the_content() {
    let (p, judge) = setup().await;
    let text = judge.complete(&prompt("FAKE_VOTES=-1")).await.unwrap();
    assert!(text.ends_with("\\boxed{-1}"), "{text}");
    assert_eq!(
        judge.describe(),
        format!("provider provider model judge-m at {}", p.chat_url())
    );
    let body = &p.requests()[0].body;
    assert_eq!(
        (body["model"].as_str(), body["max_tokens"].as_u64()),
        (Some("judge-m"), Some(256))
    );
}

#[tokio::test]
async fn a_null_content_falls_back_to_the_reasoning() {
    let (p, judge) = setup().await;
    p.push_fault(ProviderFault::ReasoningOnly);
    let text = judge.complete(&prompt("FAKE_VOTES=1")).await.unwrap();
    assert!(text.ends_with("\\boxed{1}"), "{text}");
}

#[tokio::test]
async fn a_failed_call_is_a_provider_error_naming_provider_and_variable() {
    let (p, judge) = setup().await;
    p.push_fault(ProviderFault::Unauthorized);
    let err = judge.complete(&prompt("x")).await.unwrap_err();
    assert_eq!(err.reason(), JUDGE_PROVIDER);
    let message = err.to_string();
    assert!(message.contains("provider `provider`"), "{message}");
    assert!(message.contains("JUDGE_KEY"), "{message}");
    assert!(!message.contains(KEY), "{message}");
}

#[tokio::test]
async fn prm_votes_through_the_provider() {
    let (p, judge) = setup().await;
    let scorer = PrmScorer::new(Arc::new(judge), 3, None);
    let input = JudgeInput {
        response_text: "Paris is the capital.<|im_end|>\n".into(),
        next_state_text: "Thanks! FAKE_VOTES=1,-1,1".into(),
        next_state_role: "user".into(),
    };
    let score = scorer.score(&input).await;
    let mut votes = score.votes.clone();
    votes.sort_unstable();
    assert_eq!(votes, vec![Some(-1), Some(1), Some(1)]);
    assert_eq!(score.score, 1.0);
    assert_eq!(p.requests().len(), 3);

    // A provider that fails makes failed votes whose reasons say why.
    p.set_fault(Some(ProviderFault::status(401)));
    let score = scorer.score(&input).await;
    assert_eq!(score.failed_votes(), 3);
    assert_eq!(score.score, 0.0);
    let reason = score.failures[0].as_deref().unwrap();
    assert!(reason.contains("JUDGE_KEY"), "{reason}");
}
