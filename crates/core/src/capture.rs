//! A captured main turn: the exact prompt and response tokens with aligned log-probs, and the sink
//! that receives it.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::align::Alignment;
use crate::json_text::JsonText;

/// One main turn, rendered and tokenized as `transformers` would, with the rollout log-probs aligned to
/// its response tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapturedTurn {
    pub session_id: String,
    /// The turn's number in its session (1-based), as [`TurnSink::begin`] gave it; 0 when the sink
    /// does not number turns.
    #[serde(default)]
    pub turn: u64,
    /// Strictly increasing over the process, taken when the request arrived: orders the turns of a
    /// session even when their captures finish out of order.
    pub arrival_seq: u64,
    /// The request messages as the client sent them (before normalisation), held as JSON text
    /// until a consumer needs the tree (records, the teacher): serialized as the array.
    pub messages: JsonText<Vec<Value>>,
    pub tools: Option<JsonText<Value>>,
    /// The request's `chat_template_kwargs` (for example `enable_thinking`), rendered with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_kwargs: Option<JsonText<Map<String, Value>>>,
    /// The assistant message as returned (or assembled from the stream).
    pub response_message: Value,
    pub prompt_text: String,
    pub response_text: String,
    /// `false` when the full text did not start with the prompt text; the response is then the full text.
    pub prompt_is_prefix: bool,
    pub prompt_ids: Vec<u32>,
    pub response_ids: Vec<u32>,
    pub alignment: Alignment,
    pub finish_reason: Option<String>,
    pub streamed: bool,
    /// Where `prompt_ids` and `response_ids` came from.
    #[serde(default)]
    pub token_source: TokenSource,
    /// The policy version that produced the answer, and where it was learnt (`engine`: the
    /// upstream's answer; `trainer`: the version the trainer announced at its last resume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_version: Option<WeightVersion>,
    /// How the turn's session was found (header, body, inferred, fork) and its links.
    #[serde(default)]
    pub origin: crate::session::SessionOrigin,
    /// An engine-id turn captured while this process's drift check agreed
    /// ([`EnginePrompts::agree`]): its prompt ids may be built on (the OPD teacher does, while
    /// the check still agrees). Never stored: a turn resumed by a later run reads `false`, as its
    /// ids came from an engine this run has not compared.
    #[serde(skip)]
    pub engine_prompts_agreed: bool,
    /// The prompt's images in prompt order, each with its pad-token count (their bytes are read
    /// again from `messages` when a persisted turn is resumed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<crate::sample::SampleImage>,
    /// The sampling parameters sent upstream (after `capture.sampling`).
    #[serde(default)]
    pub sampling: crate::sampling::Sampling,
    /// A mixture-of-experts policy's routed experts for the turn's tokens (but the last),
    /// checked against them and narrowed ([`crate::ExpertRows`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routed_experts: Option<crate::ExpertRows>,
    /// Why a turn of an engine that returned routed experts for earlier turns has none
    /// (`routed_experts_missing`, `routed_experts_mismatch`; `capture.routed_experts = "auto"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routed_experts_missing: Option<String>,
}

/// Where a captured turn's token ids came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    /// The engine's own prompt and sampled ids (SGLang's or vLLM's `return_token_ids`, `sglext`):
    /// every response position carries its own log-prob, nothing was re-tokenized.
    Engine,
    /// Re-rendered with the chat template and re-tokenized, log-probs aligned to the tokens.
    #[default]
    Retokenized,
}

impl TokenSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Engine => "engine",
            Self::Retokenized => "retokenized",
        }
    }
}

/// What this process's drift check found when it compared an engine's prompt ids with our own
/// encoding of the same prompt text. Capture records each comparison; the OPD teacher path builds
/// a teacher's prompt on an engine-id turn's prompt ids (encoding only the hinted message) only
/// while [`EnginePrompts::agree`]: at least one prompt was compared and none differed. Otherwise it
/// encodes the prompt text itself. Clones share the counts.
#[derive(Debug, Clone, Default)]
pub struct EnginePrompts(std::sync::Arc<EnginePromptCounts>);

#[derive(Debug, Default)]
struct EnginePromptCounts {
    equal: std::sync::atomic::AtomicU64,
    differed: std::sync::atomic::AtomicU64,
}

impl EnginePrompts {
    /// One comparison: whether the engine's prompt ids were exactly our encoding of its text.
    /// Returns whether this was the first prompt that differed.
    pub fn record(&self, equal: bool) -> bool {
        let counter = if equal {
            &self.0.equal
        } else {
            &self.0.differed
        };
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 && !equal
    }

    /// Whether some prompt was compared and every compared prompt was equal.
    pub fn agree(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        self.0.equal.load(Relaxed) > 0 && self.0.differed.load(Relaxed) == 0
    }
}

/// A policy version and where it was learnt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeightVersion {
    pub version: String,
    /// `engine` (the answer carried it) or `trainer` (announced with `POST /v1/rollout/resume`).
    pub source: String,
}

/// Follows the main turns of every session. The server calls [`TurnSink::begin`] when a main request
/// arrives (synchronously, before forwarding it), then exactly one of [`TurnSink::accept`] (the turn
/// was captured) or [`TurnSink::abandon`] (the request failed, the client went away, or capture
/// failed) for that turn. Implementations must not block: they queue and return.
pub trait TurnSink: Send + Sync {
    /// A main request of `session_id` arrived; `next_state` (what it adds to the conversation,
    /// without the messages a client sends only once; `None` when that leaves nothing) is the next
    /// state of the session's previous main turn. `done` says the client ends the session with
    /// this turn. Returns the number of this turn in its session (the default numbers nothing and
    /// returns 0).
    fn begin(&self, _session_id: &str, _next_state: Option<&Value>, _done: bool) -> u64 {
        0
    }

    /// A main request of `session_id` arrived that will not be captured (served while the trainer
    /// has paused submission, `server.pause_mode = "serve"`). Its `next_state` is still the next
    /// state of the session's previous main turn: a turn's next state is only ever what directly
    /// follows it, never what comes several turns later. `done` ends the session as in
    /// [`TurnSink::begin`].
    fn advance(&self, _session_id: &str, _next_state: Option<&Value>, _done: bool) {}

    /// A request that is not a main turn said the session is done.
    fn end_session(&self, _session_id: &str) {}

    /// The turn was captured.
    fn accept(&self, turn: CapturedTurn);

    /// The turn begun with `begin` will never be captured; `reason` is a short snake_case word.
    fn abandon(&self, _session_id: &str, _turn: u64, _reason: &str) {}
}

/// Guarantees that a begun turn ends in [`TurnSink::accept`] or [`TurnSink::abandon`]: dropping an
/// armed guard abandons the turn with the reason last set.
pub struct TurnGuard {
    sink: std::sync::Arc<dyn TurnSink>,
    session_id: String,
    turn: u64,
    reason: &'static str,
    armed: bool,
}

impl std::fmt::Debug for TurnGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TurnGuard")
            .field("session_id", &self.session_id)
            .field("turn", &self.turn)
            .finish_non_exhaustive()
    }
}

impl TurnGuard {
    pub fn new(sink: std::sync::Arc<dyn TurnSink>, session_id: String, turn: u64) -> Self {
        Self {
            sink,
            session_id,
            turn,
            reason: "not_completed",
            armed: true,
        }
    }

    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    pub fn turn(&self) -> u64 {
        self.turn
    }

    /// The reason given if the guard is dropped while armed.
    pub fn set_reason(&mut self, reason: &'static str) {
        self.reason = reason;
    }

    /// Hands the captured turn to the sink (numbered) and disarms the guard.
    pub fn accept(mut self, mut turn: CapturedTurn) {
        self.armed = false;
        turn.turn = self.turn;
        self.sink.accept(turn);
    }
}

impl Drop for TurnGuard {
    fn drop(&mut self) {
        if self.armed {
            self.sink.abandon(&self.session_id, self.turn, self.reason);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::align::{AlignPolicy, align_logprobs};
    use crate::rollout::FinishReason;

    #[test]
    fn a_turn_persisted_and_resumed_was_not_captured_under_the_new_runs_agreement() {
        let mut pending = crate::pending::testing::pending_turn("s", 1);
        pending.turn.token_source = TokenSource::Engine;
        pending.turn.engine_prompts_agreed = true;
        let bytes = crate::codec::encode_pending(&pending).unwrap();
        let back = crate::codec::decode_pending(&bytes).unwrap();
        assert!(!back.turn.engine_prompts_agreed);
        pending.turn.engine_prompts_agreed = false;
        assert_eq!(back.turn, pending.turn, "all else kept");
        assert!(
            !serde_json::to_string(&pending.turn)
                .unwrap()
                .contains("agreed")
        );
    }

    #[test]
    fn engine_prompts_agree_once_one_was_equal_and_none_differed() {
        let prompts = EnginePrompts::default();
        assert!(!prompts.agree(), "nothing compared yet");
        let shared = prompts.clone();
        shared.record(true);
        assert!(prompts.agree(), "clones share the counts");
        assert!(!prompts.record(true));
        assert!(prompts.record(false), "the first difference");
        assert!(!shared.agree(), "one difference is enough");
        assert!(!shared.record(false), "not the first any more");
        shared.record(true);
        assert!(!prompts.agree(), "and it is never forgotten");
    }

    #[test]
    fn a_turn_holding_its_request_as_text_serializes_as_the_trees() {
        let messages = vec![
            json!({"role": "system", "content": "caf\u{e9}", "z": 1, "a": 0.1}),
            json!({"role": "user", "content": "q", "n": 1e300}),
        ];
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
        let kwargs: Map<String, Value> =
            serde_json::from_value(json!({"enable_thinking": false})).unwrap();
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
        let turn = CapturedTurn {
            images: Vec::new(),
            sampling: Default::default(),
            routed_experts: None,
            routed_experts_missing: None,
            session_id: "s".into(),
            turn: 1,
            arrival_seq: 1,
            messages: JsonText::new(&messages),
            tools: Some(JsonText::new(&tools)),
            template_kwargs: Some(JsonText::new(&kwargs)),
            response_message: json!({"role": "assistant", "content": "a"}),
            prompt_text: "P".into(),
            response_text: "R".into(),
            prompt_is_prefix: true,
            prompt_ids: vec![1],
            response_ids: vec![],
            alignment,
            finish_reason: Some("stop".into()),
            streamed: false,
            token_source: TokenSource::Engine,
            weight_version: None,
            origin: crate::session::SessionOrigin::default(),
            engine_prompts_agreed: false,
        };
        let v = serde_json::to_value(&turn).unwrap();
        assert_eq!(v["messages"], json!(messages));
        assert_eq!(v["tools"], tools);
        assert_eq!(v["template_kwargs"], json!(kwargs));
        // The persisted form (MessagePack, as the stores keep pending turns) reads back equal,
        // and a turn written with tree fields reads into the text form.
        let bytes = rmp_serde::to_vec_named(&turn).unwrap();
        assert_eq!(rmp_serde::from_slice::<CapturedTurn>(&bytes).unwrap(), turn);
        let from_json: CapturedTurn = serde_json::from_value(v).unwrap();
        assert_eq!(from_json, turn);
    }
}
