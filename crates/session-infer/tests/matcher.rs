//! The matcher without HTTP: continuations, forks, retries, compaction, subagents, memory bounds,
//! and a property over random conversation trees.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use ps_core::SessionSource;
use ps_session_infer::{History, Limits, Outcome, SessionMatcher};
use serde_json::{Value, json};

fn matcher() -> Arc<SessionMatcher> {
    Arc::new(SessionMatcher::new(Limits {
        idle: Duration::from_secs(600),
        max_sessions: 10_000,
    }))
}

fn sys(t: &str) -> Value {
    json!({"role": "system", "content": t})
}
fn user(t: &str) -> Value {
    json!({"role": "user", "content": t})
}
fn reply(t: &str) -> Value {
    json!({"role": "assistant", "content": t, "reasoning_content": format!("thinking about {t}"),
        "tool_calls": [{"id": format!("call_{t}"), "type": "function",
            "function": {"name": "run", "arguments": format!("{{\"cmd\": \"{t}\", \"n\": 1}}")}}]})
}
/// How a client sends our reply back: reasoning dropped, content as a list, arguments re-serialised,
/// ids rewritten.
fn resent(r: &Value) -> Value {
    let flat = ps_core::message::flatten_content(&r["content"]);
    let text = flat.trim();
    let args: Value = serde_json::from_str(
        r["tool_calls"][0]["function"]["arguments"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let mut keys: Vec<_> = args.as_object().unwrap().iter().collect();
    keys.reverse();
    let reordered: serde_json::Map<String, Value> = keys
        .into_iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    json!({"role": "assistant", "content": [{"type": "text", "text": format!("{text}\n")}],
        "tool_calls": [{"id": "rewritten", "type": "function", "function": {"name": "run",
            "arguments": serde_json::to_string(&Value::Object(reordered)).unwrap()}}]})
}

/// Sends `messages`, answers with `answer` (or fails when `None`); returns (session, outcome).
fn turn(
    m: &Arc<SessionMatcher>,
    messages: &[Value],
    answer: Option<&Value>,
    now: Instant,
) -> (String, Outcome, ps_core::SessionOrigin) {
    let r = m.resolve(&History::of(messages), now);
    let out = (r.session_id.clone(), r.outcome, r.origin.clone());
    match answer {
        Some(a) => r.reply.complete(a, now),
        None => drop(r.reply),
    }
    out
}

#[test]
fn a_conversation_continues_through_what_clients_change() {
    let m = matcher();
    let t = Instant::now();
    let mut h = vec![sys("S"), user("task")];
    let (s1, o1, origin) = turn(&m, &h, Some(&reply("a1")), t);
    assert_eq!(o1, Outcome::New);
    assert_eq!(origin.source, SessionSource::Inferred);
    assert!(s1.starts_with("inferred-"), "{s1}");
    h.push(resent(&reply("a1")));
    h.push(json!({"role": "tool", "tool_call_id": "rewritten", "content": " ok "}));
    let (s2, o2, _) = turn(&m, &h, Some(&reply("a2")), t);
    assert_eq!((s2.as_str(), o2), (s1.as_str(), Outcome::Continued));
    h.push(reply("a2"));
    h.push(user("more"));
    let (s3, o3, _) = turn(&m, &h, None, t);
    assert_eq!((s3.as_str(), o3), (s1.as_str(), Outcome::Continued));
    assert_eq!(m.stats().live_sessions, 1);
}

#[test]
fn a_regenerate_forks_and_a_retry_after_a_failure_does_not() {
    let m = matcher();
    let t = Instant::now();
    let mut h = vec![sys("S"), user("task")];
    let (parent, _, _) = turn(&m, &h, Some(&reply("a1")), t);
    h.push(reply("a1"));
    h.push(user("next"));
    // The first continuation fails upstream: no reply registered, the claim is released.
    let (s, o, _) = turn(&m, &h, None, t);
    assert_eq!((s.as_str(), o), (parent.as_str(), Outcome::Continued));
    // The client's retry is the same session, not a fork.
    let (s, o, _) = turn(&m, &h, Some(&reply("a2")), t);
    assert_eq!((s.as_str(), o), (parent.as_str(), Outcome::Continued));
    // Regenerate: the same prefix continued a second time.
    let (fork, o, origin) = turn(&m, &h, Some(&reply("a2-bis")), t);
    assert_eq!(o, Outcome::Fork);
    assert_ne!(fork, parent);
    assert_eq!(origin.source, SessionSource::Fork);
    assert_eq!(origin.parent_session.as_deref(), Some(parent.as_str()));
    // Each branch then continues on its own.
    let mut a = h.clone();
    a.extend([reply("a2"), user("go on")]);
    let mut b = h.clone();
    b.extend([reply("a2-bis"), user("go on")]);
    assert_eq!(turn(&m, &b, Some(&reply("b3")), t).0, fork);
    assert_eq!(turn(&m, &a, Some(&reply("a3")), t).0, parent);
    // An edit of an earlier user message forks at the earlier answered prefix.
    let mut edit = vec![sys("S"), user("task"), reply("a1"), user("edited")];
    let (e, o, origin) = turn(&m, &edit, Some(&reply("e")), t);
    assert_eq!(o, Outcome::Fork);
    assert_eq!(origin.parent_session.as_deref(), Some(parent.as_str()));
    edit.extend([reply("e"), user("x")]);
    assert_eq!(turn(&m, &edit, None, t).0, e);
    let st = m.stats();
    assert_eq!((st.forks, st.live_sessions), (2, 3));
}

#[test]
fn two_requests_continuing_at_once_fork_the_second() {
    let m = matcher();
    let t = Instant::now();
    let h0 = vec![user("task")];
    let (parent, _, _) = turn(&m, &h0, Some(&reply("a")), t);
    let h = vec![user("task"), reply("a"), user("next")];
    let first = m.resolve(&History::of(&h), t);
    let second = m.resolve(&History::of(&h), t);
    assert_eq!(first.session_id, parent);
    assert_eq!(second.outcome, Outcome::Fork);
}

#[test]
fn compaction_starts_a_linked_session_and_subagents_are_their_own() {
    let m = matcher();
    let t = Instant::now();
    let h = vec![sys("S"), user("task")];
    let (s, _, _) = turn(&m, &h, Some(&reply("a1")), t);
    // The agent summarised its history: the old reply is gone, a summary stands in.
    let compacted = vec![
        sys("S"),
        user("task"),
        json!({"role": "assistant", "content": "Summary of the work so far."}),
        user("continue"),
    ];
    let (c, o, origin) = turn(&m, &compacted, Some(&reply("c1")), t);
    assert_eq!(o, Outcome::Unmatched);
    assert_ne!(c, s);
    assert_eq!(origin.source, SessionSource::Inferred);
    assert_eq!(origin.continued_from.as_deref(), Some(s.as_str()));
    // A subagent: another system prompt, its own session, no link.
    let sub = vec![sys("You are a search subagent."), user("task")];
    let (x, o, origin) = turn(&m, &sub, Some(&reply("x")), t);
    assert_eq!(o, Outcome::New);
    assert!(x != s && x != c && origin.continued_from.is_none());
    // A history that matches nothing and shares no opening: unmatched, not linked.
    let stray = vec![user("other"), reply("zz"), user("q")];
    let (_, o, origin) = turn(&m, &stray, None, t);
    assert_eq!(o, Outcome::Unmatched);
    assert!(origin.continued_from.is_none());
    let st = m.stats();
    assert_eq!((st.unmatched, st.linked), (2, 1));
}

#[test]
fn a_failed_first_request_leaves_nothing_behind() {
    let m = matcher();
    let t = Instant::now();
    let h = vec![sys("S"), user("task"), reply("old"), user("q")];
    let (a, o, _) = turn(&m, &h, None, t);
    assert_eq!(o, Outcome::Unmatched);
    assert_eq!(m.stats().live_sessions, 0);
    // The retry is not linked to the failed attempt.
    let (b, _, origin) = turn(&m, &h, Some(&reply("r")), t);
    assert_ne!(a, b);
    assert!(origin.continued_from.is_none());
}

#[test]
fn forgotten_sessions_cannot_be_continued() {
    let m = matcher();
    let t = Instant::now();
    let (s, _, _) = turn(&m, &[user("t")], Some(&reply("a")), t);
    m.forget(&s);
    let (s2, o, _) = turn(&m, &[user("t"), reply("a"), user("n")], None, t);
    assert_ne!(s, s2);
    assert_eq!(o, Outcome::Unmatched);
}

/// The session buffer closing a session (told as an observer) forgets its conversation; a close
/// of a session the matcher never made changes nothing.
#[test]
fn a_session_the_buffer_closes_is_forgotten() {
    use ps_core::{TurnEvent, TurnObserver};
    let m = matcher();
    let t = Instant::now();
    let (keep, _, _) = turn(&m, &[user("k")], Some(&reply("b")), t);
    let (s, _, _) = turn(&m, &[user("t")], Some(&reply("a")), t);
    m.observe(TurnEvent::SessionClosed {
        session: "header-session",
        reason: "timeout",
    });
    assert_eq!(m.stats().live_sessions, 2);
    m.observe(TurnEvent::SessionClosed {
        session: &s,
        reason: "timeout",
    });
    assert_eq!(m.stats().live_sessions, 1);
    let (s2, o, _) = turn(&m, &[user("t"), reply("a"), user("n")], None, t);
    assert_ne!(s, s2);
    assert_eq!(o, Outcome::Unmatched);
    let (k2, o, _) = turn(&m, &[user("k"), reply("b"), user("n")], None, t);
    assert_eq!((k2, o), (keep, Outcome::Continued));
}

/// 10,000 conversations go idle: after `idle` every fingerprint is gone, and the maps' memory with
/// it. The clock is passed in, so no time passes in the test.
#[test]
fn ten_thousand_idle_sessions_time_out() {
    let idle = Duration::from_secs(600);
    let m = Arc::new(SessionMatcher::new(Limits {
        idle,
        max_sessions: 20_000,
    }));
    let t0 = Instant::now();
    for i in 0..10_000 {
        let h = vec![sys("S"), user(&format!("task {i}"))];
        turn(&m, &h, Some(&reply(&format!("a{i}"))), t0);
    }
    let st = m.stats();
    assert_eq!((st.live_sessions, st.answered_ends), (10_000, 10_000));
    // One of them is used again halfway: it stays.
    let kept = vec![sys("S"), user("task 7"), reply("a7"), user("more")];
    let (k, o, _) = turn(&m, &kept, Some(&reply("b7")), t0 + idle / 2);
    assert_eq!(o, Outcome::Continued);
    assert_eq!(
        m.expire(t0 + idle),
        0,
        "not idle for longer than the timeout yet"
    );
    assert_eq!(m.expire(t0 + idle + Duration::from_secs(1)), 9_999);
    let st = m.stats();
    assert_eq!(
        (st.live_sessions, st.answered_ends, st.expired),
        (1, 2, 9_999)
    );
    // Expiry also runs on every request.
    let late = t0 + idle * 2;
    let (s, o, _) = turn(&m, &[user("new")], None, late);
    assert_eq!(o, Outcome::New);
    assert_ne!(s, k);
    assert_eq!(m.stats().live_sessions, 0);
}

#[test]
fn max_sessions_evicts_the_least_recently_used() {
    let m = Arc::new(SessionMatcher::new(Limits {
        idle: Duration::from_secs(600),
        max_sessions: 2,
    }));
    let t = Instant::now();
    let (a, _, _) = turn(&m, &[user("a")], Some(&reply("a")), t);
    let (_b, _, _) = turn(
        &m,
        &[user("b")],
        Some(&reply("b")),
        t + Duration::from_secs(1),
    );
    // a is used again, so b is the oldest when c arrives
    let (a2, _, _) = turn(
        &m,
        &[user("a"), reply("a"), user("a2")],
        Some(&reply("a2")),
        t + Duration::from_secs(2),
    );
    assert_eq!(a, a2);
    turn(
        &m,
        &[user("c")],
        Some(&reply("c")),
        t + Duration::from_secs(3),
    );
    let st = m.stats();
    assert_eq!((st.live_sessions, st.evicted), (2, 1));
    let (_, o, _) = turn(&m, &[user("b"), reply("b"), user("b2")], None, t);
    assert_eq!(o, Outcome::Unmatched, "b was evicted");
}

// ---- property: random conversation trees ----

/// One step of the simulated traffic.
#[derive(Debug, Clone)]
enum Step {
    /// Start a new conversation with system prompt `sys` (a few shared ones: subagents).
    Start { sys: u8 },
    /// Continue conversation `pick` (modulo the live ones) by one turn; the upstream fails first
    /// when `fail`; the history is re-sent in the variant `variant`.
    Continue {
        pick: usize,
        fail: bool,
        variant: u8,
    },
    /// Branch conversation `pick` at one of its answered turns (`at`, modulo), continuing it anew.
    Branch { pick: usize, at: usize },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => (0u8..3).prop_map(|sys| Step::Start { sys }),
        6 => (any::<usize>(), proptest::bool::weighted(0.15), 0u8..4)
            .prop_map(|(pick, fail, variant)| Step::Continue { pick, fail, variant }),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(pick, at)| Step::Branch { pick, at }),
    ]
}

/// A true conversation: its messages as we answered them, how many turns it has, and which true
/// conversation first answered each of its prefixes.
#[derive(Debug, Clone)]
struct Truth {
    messages: Vec<Value>,
    /// `answered[k]` = length of the history after turn k's reply, with the true conversation that
    /// answered it.
    answered: Vec<(usize, usize)>,
}

fn variant_of(m: &Value, variant: u8) -> Value {
    if m["role"] != "assistant" {
        return m.clone();
    }
    match variant {
        1 => resent(m),
        2 => {
            let mut m = m.clone();
            m.as_object_mut().unwrap().remove("reasoning_content");
            m
        }
        3 => {
            let mut m = resent(m);
            m["content"] = json!(format!("  {}  ", m["content"][0]["text"].as_str().unwrap()));
            m
        }
        _ => m.clone(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// For random interleavings of conversations, branches (regenerates and edits of earlier
    /// turns), failed requests and retries, and re-sent histories in every variant: requests of one
    /// true conversation all land in one inferred session, different conversations in different
    /// sessions, and a branch is a fork whose parent is the session that answered its prefix.
    #[test]
    fn inferred_sessions_equal_the_true_ones(steps in proptest::collection::vec(step(), 1..80)) {
        let m = matcher();
        let t = Instant::now();
        let mut truths: Vec<Truth> = Vec::new();
        // true conversation → inferred session
        let mut session_of: HashMap<usize, String> = HashMap::new();
        let mut owner_of_session: HashMap<String, usize> = HashMap::new();
        let mut n = 0u64;
        let mut answer = |conv: usize| {
            n += 1;
            reply(&format!("c{conv}-{n}"))
        };
        for s in steps {
            match s {
                Step::Start { sys: k } => {
                    let id = truths.len();
                    let messages = vec![sys(&format!("system {k}")), user(&format!("task {id}"))];
                    let a = answer(id);
                    let (sid, o, origin) = turn(&m, &messages, Some(&a), t);
                    prop_assert_eq!(o, Outcome::New);
                    prop_assert_eq!(origin.source, SessionSource::Inferred);
                    prop_assert!(owner_of_session.insert(sid.clone(), id).is_none(), "session reused");
                    session_of.insert(id, sid);
                    let mut messages = messages;
                    messages.push(a);
                    truths.push(Truth { answered: vec![(messages.len(), id)], messages });
                }
                Step::Continue { pick, fail, variant } => {
                    if truths.is_empty() { continue; }
                    let id = pick % truths.len();
                    let mut req: Vec<Value> =
                        truths[id].messages.iter().map(|x| variant_of(x, variant)).collect();
                    req.push(user(&format!("next {id} {}", truths[id].answered.len())));
                    if fail {
                        let (sid, o, _) = turn(&m, &req, None, t);
                        prop_assert_eq!(o, Outcome::Continued);
                        prop_assert_eq!(&sid, &session_of[&id]);
                    }
                    let a = answer(id);
                    let (sid, o, _) = turn(&m, &req, Some(&a), t);
                    prop_assert_eq!(o, Outcome::Continued);
                    prop_assert_eq!(&sid, &session_of[&id]);
                    let tr = &mut truths[id];
                    tr.messages = req;
                    tr.messages.push(a);
                    tr.answered.push((tr.messages.len(), id));
                }
                Step::Branch { pick, at } => {
                    if truths.is_empty() { continue; }
                    let from = pick % truths.len();
                    let (len, answered_by) = truths[from].answered[at % truths[from].answered.len()];
                    let prefix = History::of(&truths[from].messages[..len]).key();
                    let continued = len < truths[from].messages.len()
                        || truths.iter().enumerate().any(|(j, t2)| j != from
                            && t2.messages.len() > len
                            && History::of(&t2.messages[..len]).key() == prefix);
                    let id = truths.len();
                    let mut req = truths[from].messages[..len].to_vec();
                    req.push(user(&format!("branch {id}")));
                    let a = answer(id);
                    let (sid, o, origin) = turn(&m, &req, Some(&a), t);
                    if continued {
                        prop_assert_eq!(o, Outcome::Fork);
                        prop_assert_eq!(origin.parent_session.as_ref(), Some(&session_of[&answered_by]));
                        prop_assert!(owner_of_session.insert(sid.clone(), id).is_none());
                        session_of.insert(id, sid);
                        let mut answered: Vec<(usize, usize)> = truths[from]
                            .answered.iter().copied().filter(|(l, _)| *l <= len).collect();
                        req.push(a);
                        answered.push((req.len(), id));
                        truths.push(Truth { messages: req, answered });
                    } else {
                        // The last answered turn, not continued yet: this is its continuation.
                        prop_assert_eq!(o, Outcome::Continued);
                        prop_assert_eq!(&sid, &session_of[&from]);
                        req.push(a);
                        let tr = &mut truths[from];
                        tr.messages = req;
                        tr.answered.push((tr.messages.len(), from));
                    }
                }
            }
        }
        prop_assert_eq!(m.stats().live_sessions, truths.len());
    }
}

/// OpenClaw's context message: appended to every request after the user's message, never sent
/// again. The next request continues the history without it.
fn context(n: usize) -> Value {
    json!({"role": "user", "content": [{"type": "text", "text": format!(
        "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nActive exec sessions: {n}\n<<<END_OPENCLAW_INTERNAL_CONTEXT>>>")}]})
}

/// Sends `messages` keyed with `rules`, answers `answer`; returns the session, the outcome and
/// the ephemeral tail the continuation showed.
fn turn_with(
    m: &Arc<SessionMatcher>,
    messages: &[Value],
    rules: &[ps_session_infer::EphemeralRule],
    answer: &Value,
    now: Instant,
) -> (String, Outcome, usize) {
    let r = m.resolve(&History::of_with(messages, rules), now);
    let out = (r.session_id.clone(), r.outcome, r.ephemeral_tail);
    r.reply.complete(answer, now);
    out
}

#[test]
fn a_trailing_message_sent_once_does_not_break_the_conversation() {
    // Without a rule: the reply is also registered under the history without its tail.
    let m = matcher();
    let t = Instant::now();
    let mut h = vec![sys("S"), user("task")];
    let mut sent = h.clone();
    sent.push(context(0));
    let (s1, o1, tail) = turn_with(&m, &sent, &[], &reply("a1"), t);
    assert_eq!((o1, tail), (Outcome::New, 0));
    for i in 1..5 {
        h.push(reply(&format!("a{i}")));
        h.push(user(&format!("next {i}")));
        let mut sent = h.clone();
        sent.push(context(i));
        let (s, o, tail) = turn_with(&m, &sent, &[], &reply(&format!("a{}", i + 1)), t);
        assert_eq!(
            (s.as_str(), o, tail),
            (s1.as_str(), Outcome::Continued, 1),
            "turn {i}"
        );
    }
    let st = m.stats();
    assert_eq!((st.continued, st.unmatched, st.live_sessions), (4, 0, 1));
    // One end for the whole history and one without its tail, per answered turn.
    assert_eq!(st.answered_ends, 10);

    // With OpenClaw's rule the context message is not part of any key: continued, no tail shown.
    let m = matcher();
    let rules = [ps_session_infer::EphemeralRule::openclaw()];
    let mut h = vec![sys("S"), user("task")];
    let mut sent = h.clone();
    sent.push(context(0));
    let (s1, _, _) = turn_with(&m, &sent, &rules, &reply("a1"), t);
    h.extend([reply("a1"), user("next")]);
    let mut sent = h.clone();
    sent.push(context(1));
    let (s, o, tail) = turn_with(&m, &sent, &rules, &reply("a2"), t);
    assert_eq!((s, o, tail), (s1, Outcome::Continued, 0));
}

#[test]
fn the_ends_of_one_reply_are_claimed_together() {
    let m = matcher();
    let t = Instant::now();
    let first = vec![sys("S"), user("task"), context(0)];
    let (parent, _, _) = turn_with(&m, &first, &[], &reply("a1"), t);
    // One continuation through the tail, one that re-sends the tail: the second is a fork.
    let without = vec![sys("S"), user("task"), reply("a1"), user("next")];
    let with = vec![
        sys("S"),
        user("task"),
        context(0),
        reply("a1"),
        user("next"),
    ];
    let a = m.resolve(&History::of(&without), t);
    let b = m.resolve(&History::of(&with), t);
    assert_eq!(
        (a.session_id.as_str(), a.outcome),
        (parent.as_str(), Outcome::Continued)
    );
    assert_eq!(b.outcome, Outcome::Fork);
    assert_eq!(b.origin.parent_session.as_deref(), Some(parent.as_str()));
    // A failed continuation frees every end of the reply: the retry, either way, continues.
    drop(a);
    drop(b);
    let r = m.resolve(&History::of(&with), t);
    assert_eq!(
        (r.session_id.as_str(), r.outcome),
        (parent.as_str(), Outcome::Continued)
    );
    assert_eq!(r.ephemeral_tail, 0);
}

#[test]
fn a_tail_is_only_dropped_down_to_a_prompt_end() {
    // The kept part must end as a prompt does (a user or tool message) and keep a new message.
    let h = History::of(&[sys("S"), user("u"), context(0), context(1)]);
    let tails: Vec<usize> = h.tail_bases().iter().map(|&(_, j)| j).collect();
    assert_eq!(tails, [1, 2]);
    assert_eq!(
        h.tail_bases()[1].0,
        History::of(&[sys("S"), user("u")]).key()
    );
    assert!(History::of(&[sys("S"), user("u")]).tail_bases().is_empty());
    assert!(History::of(&[user("u")]).tail_bases().is_empty());
    let after_reply = History::of(&[
        user("u"),
        reply("a"),
        json!({"role": "tool", "content": "x"}),
        context(0),
    ]);
    assert_eq!(after_reply.tail_bases().len(), 1);
    assert!(
        History::of(&[user("u"), reply("a"), user("v")])
            .tail_bases()
            .is_empty()
    );
}

/// Another session's guess that a tail was sent once never takes a whole history's place: two
/// conversations, one of whose requests carried one message more, answered alike, each continue
/// their own session.
#[test]
fn a_whole_history_wins_over_another_sessions_tail() {
    let m = matcher();
    let t = Instant::now();
    let longer = vec![sys("S"), user("task"), user("more")];
    let shorter = vec![sys("S"), user("task")];
    // X: [S, task, more] registers its reply under [S, task] too; Y: [S, task] gets the same reply.
    let (x, _, _) = turn(&m, &longer, Some(&reply("same")), t);
    let y_request = m.resolve(&History::of(&shorter), t);
    // Y is its own conversation (a first request): a new session, not X's.
    assert_eq!(y_request.outcome, Outcome::New);
    let y = y_request.session_id.clone();
    assert_ne!(x, y);
    y_request.reply.complete(&reply("same"), t);
    // Y's next request continues Y, through its whole history, not X through a guessed tail.
    let r = m.resolve(
        &History::of(&[sys("S"), user("task"), reply("same"), user("next")]),
        t,
    );
    assert_eq!(
        (r.session_id.as_str(), r.outcome, r.ephemeral_tail),
        (y.as_str(), Outcome::Continued, 0)
    );
    drop(r);
    // X's own continuation still continues X.
    let r = m.resolve(
        &History::of(&[
            sys("S"),
            user("task"),
            user("more"),
            reply("same"),
            user("next"),
        ]),
        t,
    );
    assert_eq!(
        (r.session_id.as_str(), r.outcome),
        (x.as_str(), Outcome::Continued)
    );
}
