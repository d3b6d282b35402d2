//! Records a judged turn through the [`RecordSink`] port (the record types live with it in
//! `ps_core::ports`). A leaf module.

use ps_core::CapturedTurn;
use ps_core::ports::{ConversationRecord, PrmRecord, PrmScore, RecordSink};
use serde_json::Value;

/// Records a judged turn: its conversation record and, when it was scored, its PRM record.
pub(crate) fn record_turn(
    sink: Option<&dyn RecordSink>,
    session_id: &str,
    turn_no: u64,
    turn: &CapturedTurn,
    next: Option<&Value>,
    judged: Option<&PrmScore>,
) {
    let Some(r) = sink else {
        return;
    };
    r.conversation(ConversationRecord::new(session_id, turn_no, turn, next));
    if let Some(j) = judged {
        r.prm(PrmRecord::new(session_id, turn_no, j));
    }
}
