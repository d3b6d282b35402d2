//! What a judge sees of a turn: its response and the next state's text and role. A leaf module
//! shared by RL and OPD judging.

use ps_core::CapturedTurn;
use ps_core::message::flatten_content;
use ps_core::ports::JudgeInput;
use serde_json::Value;

/// The judges' input for `turn` followed by `state` (a message; a missing role counts as `user`).
pub(crate) fn judge_input(turn: &CapturedTurn, state: &Value) -> JudgeInput {
    JudgeInput {
        response_text: turn.response_text.clone(),
        next_state_text: flatten_content(state.get("content").unwrap_or(&Value::Null)),
        next_state_role: state
            .get("role")
            .and_then(Value::as_str)
            .unwrap_or("user")
            .to_owned(),
    }
}
