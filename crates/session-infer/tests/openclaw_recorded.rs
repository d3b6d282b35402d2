//! The npm OpenClaw agent's real requests (`tests/fixtures/real/openclaw-2026.9.6.jsonl`: two
//! conversations of three turns, interleaved, recorded with `scripts/record_wire.py`), replayed
//! through the matcher with the replies OpenClaw got: every request ends with OpenClaw's context
//! message, which the next request does not carry. Both ways of following it (the default rule
//! naming the message, and the generic registration without a trailing tail) give two sessions,
//! each turn but the first continuing its own, and each next state the user's follow-up.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ps_session_infer::{EphemeralRule, History, Limits, Outcome, SessionMatcher, next_state};
use serde_json::Value;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/real");

/// The recorded exchanges: each request's messages (the system prompt read from its file) and
/// the reply as OpenClaw re-sends it (plain content, reasoning dropped).
fn recorded() -> Vec<(Vec<Value>, Value)> {
    let body = std::fs::read_to_string(format!("{DIR}/openclaw-2026.9.6.jsonl")).unwrap();
    body.lines()
        .map(|l| {
            let r: Value = serde_json::from_str(l).unwrap();
            let mut messages = r["request"]["body"]["messages"].as_array().unwrap().clone();
            for m in &mut messages {
                if let Some(file) = m["content"]["$file"].as_str() {
                    m["content"] =
                        Value::String(std::fs::read_to_string(format!("{DIR}/{file}")).unwrap());
                }
            }
            let reply = serde_json::json!({"role": "assistant",
                "content": r["response"]["assembled"]["content"]});
            (messages, reply)
        })
        .collect()
}

fn text(m: &Value) -> String {
    ps_core::message::flatten_content(&m["content"])
}

fn replay(rules: &[EphemeralRule]) {
    let m = Arc::new(SessionMatcher::new(Limits {
        idle: Duration::from_secs(600),
        max_sessions: 100,
    }));
    let t = Instant::now();
    let mut sessions: HashMap<String, String> = HashMap::new();
    let mut outcomes = Vec::new();
    for (messages, reply) in recorded() {
        // The conversation is the one of the first user message (OpenClaw's own session id is
        // in it): the matcher must find the same grouping without it.
        let first_user = messages
            .iter()
            .find(|x| x["role"] == "user")
            .map(text)
            .unwrap();
        let conversation = first_user
            .split("sessionId=")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .unwrap()
            .to_owned();
        let last = messages.last().unwrap();
        assert!(
            text(last).starts_with(ps_core::session::OPENCLAW_CONTEXT_PREFIX),
            "every recorded request ends with OpenClaw's context message"
        );
        let r = m.resolve(&History::of_with(&messages, rules), t);
        let ours = sessions
            .entry(conversation.clone())
            .or_insert(r.session_id.clone());
        assert_eq!(
            *ours, r.session_id,
            "{conversation}: one session per conversation"
        );
        if r.outcome == Outcome::Continued {
            // What the request adds after the reply it continues: the user's follow-up, then the
            // context message, which is not the next state.
            let from = messages
                .iter()
                .rposition(|x| x["role"] == "assistant")
                .unwrap()
                + 1;
            let next = next_state(&messages[from..], rules, r.ephemeral_tail).unwrap();
            assert_eq!(next["role"], "user");
            assert_eq!(&next, &messages[messages.len() - 2], "{conversation}");
            assert!(!text(&next).contains("OPENCLAW_INTERNAL"));
        }
        outcomes.push(r.outcome);
        r.reply.complete(&reply, t);
    }
    assert_eq!(sessions.len(), 2);
    assert_eq!(
        outcomes,
        [
            Outcome::New,
            Outcome::New,
            Outcome::Continued,
            Outcome::Continued,
            Outcome::Continued,
            Outcome::Continued
        ]
    );
    let st = m.stats();
    assert_eq!((st.continued, st.unmatched, st.forks), (4, 0, 0));
}

#[test]
fn openclaw_conversations_are_followed_with_the_default_rule() {
    replay(&[EphemeralRule::openclaw()]);
}

#[test]
fn openclaw_conversations_are_followed_without_any_rule() {
    replay(&[]);
}

/// Without a rule, every continuation goes through the history without the context message (the
/// reply registered without its one-message tail): the whole history never matches, as it did not
/// before this was fixed, and the tail shown is the one message.
#[test]
fn without_a_rule_every_continuation_goes_through_the_tail() {
    let m = Arc::new(SessionMatcher::new(Limits {
        idle: Duration::from_secs(600),
        max_sessions: 100,
    }));
    let t = Instant::now();
    let mut tails = Vec::new();
    for (messages, reply) in recorded() {
        let r = m.resolve(&History::of(&messages), t);
        if r.outcome == Outcome::Continued {
            tails.push(r.ephemeral_tail);
        }
        r.reply.complete(&reply, t);
    }
    assert_eq!(tails, [1, 1, 1, 1]);
}
