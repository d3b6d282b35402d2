//! The JSONL records the session buffer writes, as typed structs: one resolved conversation turn
//! ([`ConversationRecord`]), one PRM decision ([`PrmRecord`]), one OPD decision ([`OpdRecord`]),
//! and the [`RecordSink`] that receives them (the app's writer).
//!
//! The field order of each struct is the order of the keys in a record line (serde writes fields
//! in declaration order, and `serde_json` keeps insertion order in this workspace), and absent
//! values are written as `null`, never left out: readers of the record files rely on both, so
//! reorder or skip nothing.

use serde::Serialize;
use serde_json::Value;

use super::{HintOutcome, PrmScore, TeacherLogprobs};
use crate::CapturedTurn;

/// Receives the records (written off the chat path by the implementation).
pub trait RecordSink: Send + Sync {
    /// One resolved conversation turn.
    fn conversation(&self, record: ConversationRecord);
    /// One PRM decision.
    fn prm(&self, record: PrmRecord);
    /// One OPD decision (accepted or not, with the reason).
    fn opd(&self, _record: OpdRecord) {}
}

/// A record as the JSON object of its line.
pub trait ToJson: Serialize {
    /// The record's JSON object, keys in field order.
    fn to_json(&self) -> Value {
        // Cannot fail: every field is a string, number, bool, list or JSON value, with string keys.
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

impl ToJson for ConversationRecord {}
impl ToJson for PrmRecord {}
impl ToJson for OpdRecord {}

/// One resolved conversation turn: what was asked, answered, and what came next.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConversationRecord {
    pub session_id: String,
    pub turn: u64,
    pub timestamp_ms: u64,
    pub messages: Vec<Value>,
    pub prompt_text: String,
    pub response_text: String,
    pub response_message: Value,
    /// The answer's `tool_calls`, `null` when it has none.
    pub tool_calls: Value,
    /// The next state (the session's next main message), `null` when there is none.
    pub next_state: Option<Value>,
}

impl ConversationRecord {
    /// The record of turn `turn_no` of `session_id`, with its next state if it has one.
    pub fn new(session_id: &str, turn_no: u64, turn: &CapturedTurn, next: Option<&Value>) -> Self {
        Self {
            session_id: session_id.to_owned(),
            turn: turn_no,
            timestamp_ms: unix_millis(),
            // The turn holds them as the JSON text of this very tree (`JsonText`), so the parse
            // cannot fail; if it ever did, the record says `[]` and the error is logged, not hidden.
            messages: turn.messages.parse().unwrap_or_else(|e| {
                tracing::error!(
                    session_id, turn = turn_no, error = %e,
                    "the turn's messages could not be read back for its conversation record: \
                     recorded as []"
                );
                Vec::new()
            }),
            prompt_text: turn.prompt_text.clone(),
            response_text: turn.response_text.clone(),
            response_message: turn.response_message.clone(),
            tool_calls: turn
                .response_message
                .get("tool_calls")
                .cloned()
                .unwrap_or(Value::Null),
            next_state: next.cloned(),
        }
    }
}

/// One PRM decision: the votes, their failures and the majority.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PrmRecord {
    pub session_id: String,
    pub turn: u64,
    pub timestamp_ms: u64,
    pub score: f64,
    pub votes: Vec<Option<i8>>,
    pub failures: Vec<Option<String>>,
    /// One judge answer agreeing with the score; `null` when the score is 0.
    pub representative: Option<String>,
}

impl PrmRecord {
    /// The record of the PRM votes on turn `turn_no` of `session_id`.
    pub fn new(session_id: &str, turn_no: u64, judged: &PrmScore) -> Self {
        Self {
            session_id: session_id.to_owned(),
            turn: turn_no,
            timestamp_ms: unix_millis(),
            score: judged.score,
            votes: judged.votes.clone(),
            failures: judged.failures.clone(),
            representative: if judged.score != 0.0 {
                judged.representative.clone()
            } else {
                None
            },
        }
    }
}

/// One OPD/Combine decision: the hint votes, the eval votes, the teacher's signal, or why the turn
/// yields no distilled sample.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpdRecord {
    pub session_id: String,
    pub turn: u64,
    /// `distilled`, `rl` (Combine's RL-only sample) or `dropped`.
    pub outcome: &'static str,
    pub timestamp_ms: u64,
    pub mode: &'static str,
    pub accepted: bool,
    pub hint: Option<String>,
    /// The hint's length in characters (0 without a hint).
    pub hint_len: usize,
    pub votes: Option<Vec<Option<i8>>>,
    pub vote_failures: Option<Vec<Option<String>>>,
    pub eval_score: Option<f64>,
    pub eval_votes: Option<Vec<Option<i8>>>,
    pub teacher_log_probs_len: Option<usize>,
    /// The operators' field name for the teacher log-probs themselves.
    pub teacher_lp: Option<Vec<f64>>,
    pub teacher_log_probs_sum: Option<f64>,
    /// The temperature the teacher was asked to score at (`opd.teacher_temperature`).
    pub teacher_temperature: Option<f64>,
    pub reason: Option<String>,
    pub detail: Option<String>,
}

/// What an OPD record is made from.
#[derive(Debug, Clone, Copy)]
pub struct OpdFacts<'a> {
    pub session_id: &'a str,
    pub turn: u64,
    /// `opd` or `combine`.
    pub mode: &'static str,
    pub hint: Option<&'a HintOutcome>,
    pub eval: Option<&'a PrmScore>,
    pub signal: Option<&'a TeacherLogprobs>,
    /// Why the turn yields no distilled sample: `(reason, detail)`.
    pub dropped: Option<(&'a str, &'a str)>,
}

impl OpdRecord {
    /// The record of one judged OPD/Combine turn.
    pub fn new(f: OpdFacts<'_>) -> Self {
        let h = f.hint.and_then(HintOutcome::hint);
        let outcome = match (f.signal, f.dropped) {
            (Some(_), _) => "distilled",
            // Combine keeps a turn without a usable teacher signal as an RL sample when its eval
            // is ±1.
            (None, Some(_)) if f.mode == "combine" && f.eval.is_some_and(|e| e.score != 0.0) => {
                "rl"
            }
            _ => "dropped",
        };
        Self {
            session_id: f.session_id.to_owned(),
            turn: f.turn,
            outcome,
            timestamp_ms: unix_millis(),
            mode: f.mode,
            accepted: f.hint.is_some_and(HintOutcome::accepted) && f.dropped.is_none(),
            hint: h.map(str::to_owned),
            hint_len: h.map_or(0, |h| h.chars().count()),
            votes: f.hint.map(HintOutcome::scores),
            vote_failures: f.hint.map(|o| o.failures.clone()),
            eval_score: f.eval.map(|e| e.score),
            eval_votes: f.eval.map(|e| e.votes.clone()),
            teacher_log_probs_len: f.signal.map(|s| s.log_probs.len()),
            teacher_lp: f.signal.map(|s| s.log_probs.clone()),
            teacher_log_probs_sum: f.signal.map(|s| s.log_probs.iter().sum::<f64>()),
            teacher_temperature: f.signal.map(|s| s.temperature),
            reason: f.dropped.map(|d| d.0.to_owned()),
            detail: f.dropped.map(|d| d.1.to_owned()),
        }
    }
}

/// Milliseconds since the Unix epoch (0 for a clock before it).
fn unix_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    //! The record lines must stay byte for byte what the `json!` shapes they replaced wrote: the
    //! expected values below are those shapes, kept verbatim.

    use crate::ports::HintVote;
    use crate::{AlignPolicy, FinishReason, align_logprobs};
    use serde_json::json;

    use super::*;

    fn turn() -> CapturedTurn {
        let alignment = align_logprobs(
            &[],
            |id| format!("t{id}"),
            &[],
            &FinishReason {
                reason: Some("stop".into()),
                matched_stop: Value::Null,
            },
            None,
            AlignPolicy::default(),
        );
        CapturedTurn {
            images: Vec::new(),
            sampling: Default::default(),
            routed_experts: None,
            routed_experts_missing: None,
            session_id: "s".into(),
            turn: 3,
            arrival_seq: 3,
            messages: vec![json!({"role": "user", "content": "q"})].into(),
            tools: None,
            template_kwargs: None,
            response_message: json!({"role": "assistant", "content": "a",
                "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}]}),
            prompt_text: "P".into(),
            response_text: "R".into(),
            prompt_is_prefix: true,
            prompt_ids: vec![1],
            response_ids: vec![],
            alignment,
            finish_reason: Some("stop".into()),
            streamed: false,
            token_source: crate::TokenSource::Retokenized,
            weight_version: None,
            origin: Default::default(),
            engine_prompts_agreed: false,
        }
    }

    /// The line the writer prints, with the timestamp set to 1 for comparison.
    fn line(r: &impl ToJson) -> String {
        let mut v = r.to_json();
        v["timestamp_ms"] = json!(1);
        v.to_string()
    }

    #[test]
    fn conversation_records_keep_their_shape() {
        let turn = turn();
        let next = json!({"role": "user", "content": "next"});
        for next in [Some(&next), None] {
            let expected = json!({
                "session_id": "s",
                "turn": 3,
                "timestamp_ms": 1,
                "messages": turn.messages,
                "prompt_text": turn.prompt_text,
                "response_text": turn.response_text,
                "response_message": turn.response_message,
                "tool_calls": turn.response_message.get("tool_calls").cloned().unwrap_or(Value::Null),
                "next_state": next,
            });
            let record = ConversationRecord::new("s", 3, &turn, next);
            assert_eq!(line(&record), expected.to_string());
        }
    }

    #[test]
    fn a_record_from_the_turns_held_text_is_what_the_tree_wrote() {
        // Escapes, non-ASCII, key order, floats at the edges, the largest u64, null: the turn
        // holds `messages` as JSON text (`JsonText`); the record parses it back into the very
        // tree the capture had, so the line is the one the tree field wrote.
        let tree: Vec<Value> = serde_json::from_str(
            r#"[{"role":"system","content":"caf\u00e9 \"q\"\n\t\u2028","z":1,"a":0.1},
                {"role":"user","content":[{"type":"text","text":"x"}],"n":1e300,"m":5e-324,
                 "big":18446744073709551615,"neg":-0.0,"nul":null,"e":[]}]"#,
        )
        .unwrap();
        let mut turn = turn();
        turn.messages = crate::JsonText::new(&tree);
        let next = json!({"role": "tool", "content": "out"});
        let expected = json!({
            "session_id": "s",
            "turn": 3,
            "timestamp_ms": 1,
            "messages": tree,
            "prompt_text": turn.prompt_text,
            "response_text": turn.response_text,
            "response_message": turn.response_message,
            "tool_calls": turn.response_message["tool_calls"],
            "next_state": next,
        });
        let record = ConversationRecord::new("s", 3, &turn, Some(&next));
        assert_eq!(record.messages, tree);
        assert_eq!(line(&record), expected.to_string());
    }

    #[test]
    fn prm_records_keep_their_shape() {
        for (score, votes) in [(1.0, vec![Some(1), None, Some(1)]), (0.0, vec![Some(0)])] {
            let j = PrmScore {
                votes,
                score,
                representative: Some("judge said \\boxed{1}".into()),
                failures: vec![None, Some("timeout at http://judge".into()), None],
            };
            let expected = json!({
                "session_id": "s",
                "turn": 3,
                "timestamp_ms": 1,
                "score": j.score,
                "votes": j.votes,
                "failures": j.failures,
                "representative": if j.score != 0.0 { j.representative.clone() } else { None },
            });
            assert_eq!(line(&PrmRecord::new("s", 3, &j)), expected.to_string());
        }
    }

    #[test]
    fn opd_records_keep_their_shape() {
        let hint = HintOutcome {
            votes: vec![
                HintVote {
                    score: Some(1),
                    hint: "use the tool".into(),
                },
                HintVote::failed(),
            ],
            failures: vec![None, Some("judge down".into())],
            best: Some((0, "use the tool".into())),
            representative: None,
        };
        let eval = PrmScore {
            votes: vec![Some(-1)],
            score: -1.0,
            representative: None,
            failures: vec![None],
        };
        let signal = TeacherLogprobs {
            log_probs: vec![-0.5, -0.25],
            topk_log_probs: None,
            topk_indices: None,
            echoed_ids: vec![1, 2],
            echo_verified: true,
            temperature: 0.0,
            temperature_assumed: false,
        };
        let facts = |mode, hint, eval, signal, dropped| OpdFacts {
            session_id: "s",
            turn: 3,
            mode,
            hint,
            eval,
            signal,
            dropped,
        };
        let cases = [
            facts("opd", Some(&hint), None, Some(&signal), None),
            facts(
                "combine",
                Some(&hint),
                Some(&eval),
                None,
                Some(("teacher_error", "timed out")),
            ),
            facts("opd", Some(&hint), None, None, Some(("no_hint", "none"))),
            facts("opd", None, None, None, Some(("opd_not_configured", ""))),
        ];
        for f in cases {
            let OpdFacts {
                mode,
                hint,
                eval,
                signal,
                dropped,
                ..
            } = f;
            // The former `opd_record`, verbatim.
            let h = hint.and_then(HintOutcome::hint);
            let outcome = match (signal, dropped) {
                (Some(_), _) => "distilled",
                (None, Some(_)) if mode == "combine" && eval.is_some_and(|e| e.score != 0.0) => {
                    "rl"
                }
                _ => "dropped",
            };
            let expected = json!({
                "session_id": "s",
                "turn": 3,
                "outcome": outcome,
                "timestamp_ms": 1,
                "mode": mode,
                "accepted": hint.is_some_and(HintOutcome::accepted) && dropped.is_none(),
                "hint": h,
                "hint_len": h.map_or(0, |h| h.chars().count()),
                "votes": hint.map(HintOutcome::scores),
                "vote_failures": hint.map(|o| &o.failures),
                "eval_score": eval.map(|e| e.score),
                "eval_votes": eval.map(|e| &e.votes),
                "teacher_log_probs_len": signal.map(|s| s.log_probs.len()),
                "teacher_lp": signal.map(|s| &s.log_probs),
                "teacher_log_probs_sum": signal.map(|s| s.log_probs.iter().sum::<f64>()),
                "teacher_temperature": signal.map(|s| s.temperature),
                "reason": dropped.map(|d| d.0),
                "detail": dropped.map(|d| d.1),
            });
            let record = OpdRecord::new(f);
            assert_eq!(line(&record), expected.to_string(), "{mode} {dropped:?}");
        }
    }
}
