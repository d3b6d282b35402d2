//! What a main turn carries into capture: the request's parts as the client sent them
//! ([`RequestJson`], parsed on the capture thread) and the job itself ([`CaptureJob`]).

use bytes::Bytes;
use ps_chat_template::TurnInput;
use ps_core::modes::TokenIdsMode;
use ps_core::{JsonText, RolloutResponse, TurnGuard};
use serde_json::{Map, Value};

use crate::CaptureError;

/// The parts of a request that capture needs, as the client sent them: parsed into a job's
/// `messages`, `tools` and `template_kwargs` on the capture thread that takes the job, so that the
/// chat path builds no tree of them. With a non-streamed answer, the answer too: its rollout
/// (message, sampled tokens, log-probs, the engine's ids, finish, weight version) is read into
/// the job's `rollout` there, not on the chat path.
#[derive(Debug)]
pub struct RequestJson {
    /// `messages` (an array): its JSON text, a slice of the client's body.
    pub messages: Bytes,
    /// `tools`, unless absent or null.
    pub tools: Option<Bytes>,
    /// `chat_template_kwargs`, when an object.
    pub template_kwargs: Option<Bytes>,
    /// The upstream's whole answer (its bytes, shared), when the job's `rollout` is still to be
    /// read from it.
    pub answer: Option<ps_sglang_client::Answer>,
}

impl RequestJson {
    /// Parses the parts into `job`. The request was validated on the chat path, so this fails
    /// only if that validation let through what a tree parse refuses; the turn is then
    /// abandoned as `request_unreadable`, never rendered without its tools or messages.
    pub(crate) fn fill(self, job: &mut CaptureJob) -> Result<(), CaptureError> {
        let unreadable = |part: &str, e: serde_json::Error| CaptureError::Refused {
            reason: "request_unreadable",
            detail: format!("the request's `{part}` could not be read: {e}"),
        };
        job.messages =
            serde_json::from_slice(&self.messages).map_err(|e| unreadable("messages", e))?;
        job.tools = self
            .tools
            .as_ref()
            .map(|t| serde_json::from_slice::<Value>(t))
            .transpose()
            .map_err(|e| unreadable("tools", e))?;
        // The turn keeps these texts instead of writing the trees out again (`captured_turn`).
        job.texts = Some(RequestTexts {
            messages: self.messages,
            tools: self.tools,
        });
        job.template_kwargs = self
            .template_kwargs
            .map(|k| serde_json::from_slice::<Map<String, Value>>(&k))
            .transpose()
            .map_err(|e| unreadable("chat_template_kwargs", e))?;
        if let Some(answer) = self.answer {
            // The chat path refused what a tree parse refuses, so this is not expected either; a
            // part that cannot be read abandons the turn rather than leave it out of the sample.
            job.rollout = answer.rollout().map_err(|e| CaptureError::Refused {
                reason: "answer_unreadable",
                detail: format!("the upstream's answer could not be read: {e}"),
            })?;
        }
        Ok(())
    }
}

/// Everything needed to capture one main turn, taken from the request and the upstream's answer.
#[derive(Debug)]
pub struct CaptureJob {
    /// Ends the turn in the sink: accepted when captured, abandoned otherwise (also when dropped).
    pub guard: TurnGuard,
    pub arrival_seq: u64,
    pub messages: Vec<Value>,
    pub tools: Option<Value>,
    pub template_kwargs: Option<Map<String, Value>>,
    pub rollout: RolloutResponse,
    /// The client closed the session with this turn (`X-Session-Done`): no later turn will extend
    /// its prompt, so the session's cached prefix is dropped rather than kept.
    pub session_done: bool,
    /// `sglang.token_ids`, and whether the engine was asked for its ids (non-streamed calls).
    pub token_ids: TokenIdsMode,
    pub asked_for_ids: bool,
    /// The version the trainer announced at its last resume, for answers that carry none.
    pub trainer_weight_version: Option<String>,
    /// How the session was found (header, body, inferred, fork), for the sample's metadata.
    pub origin: ps_core::SessionOrigin,
    /// The sampling parameters sent upstream, for the sample's metadata.
    pub sampling: ps_core::Sampling,
    /// The JSON texts `messages` and `tools` were parsed from, when they were (set by the capture
    /// thread); `None`: the trees are written out as text for the captured turn.
    pub texts: Option<RequestTexts>,
}

/// The client's own JSON texts of a job's `messages` and `tools`. They must parse to the job's
/// trees (`serde_json::from_slice`): the captured turn holds them in the trees' place, and every
/// reader parses them back (only the capture thread's `RequestJson::fill` sets them in the
/// product).
#[derive(Debug, Clone)]
pub struct RequestTexts {
    pub messages: Bytes,
    pub tools: Option<Bytes>,
}

/// `text` (which parses to `tree`) as the turn's `JsonText`, else `tree` written out: also when
/// the text is much larger than what `serde_json` writes, i.e. it escapes characters as `\uXXXX`
/// (Python's `json.dumps` default: 6 bytes for a CJK character instead of 3) or is pretty-printed
/// (line breaks between values), since the turn holds it until it becomes a sample.
pub(crate) fn held_text<T>(text: Option<&Bytes>, tree: &T) -> JsonText<T>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    match text.map(|t| std::str::from_utf8(t)) {
        Some(Ok(t)) if !t.contains("\\u") && !t.contains('\n') => JsonText::from_parsed_text(t),
        _ => JsonText::new(tree),
    }
}

impl CaptureJob {
    /// What the chat template renders of this turn: its messages, tools, answer and kwargs.
    pub fn turn_input(&self) -> TurnInput<'_> {
        TurnInput {
            messages: &self.messages,
            tools: self.tools.as_ref(),
            response_message: &self.rollout.message,
            template_kwargs: self.template_kwargs.as_ref(),
        }
    }
}
