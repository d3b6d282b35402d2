//! Messages a client sends once and never again, and the next state they must stay out of.
//!
//! Some agents append a message to the end of every request that the next request's history does
//! not carry: the npm OpenClaw agent adds a user message `<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>> …`
//! (its live exec sessions and subagents) after the user's real message. Such a message is part of
//! the prompt the policy answered (the sample keeps it), but
//! - it must not break the recognition of the conversation: the next request continues the
//!   history *without* it (handled two ways: messages a [`EphemeralRule`] names are left out of
//!   every fingerprint, [`crate::fingerprint::History::of_with`]; and a reply is also registered
//!   under the history without a short trailing tail, [`crate::fingerprint::History::tail_bases`],
//!   so unknown wrappers of this kind are recognised too);
//! - it is not the user's follow-up: the next state of the previous turn is what the request adds
//!   after the conversation it continues, without such messages ([`next_state`]).

use serde_json::{Map, Value};

pub use ps_core::session::OPENCLAW_CONTEXT_PREFIX;

/// One rule (`[[server.ephemeral_message_rules]]`): a message whose role is `role` (any role when
/// `None`) and whose text, leading white space aside, starts with `content_prefix`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EphemeralRule {
    /// Named in logs.
    pub name: String,
    pub role: Option<String>,
    pub content_prefix: String,
}

impl EphemeralRule {
    /// OpenClaw's context message: the default rule.
    pub fn openclaw() -> Self {
        Self {
            name: "openclaw_internal_context".into(),
            role: Some("user".into()),
            content_prefix: OPENCLAW_CONTEXT_PREFIX.into(),
        }
    }

    /// Whether `message` is one this rule names (leading white space of the text and of the prefix
    /// aside). An empty prefix names nothing (configuration refuses it).
    pub fn matches(&self, message: &Value) -> bool {
        let prefix = self.content_prefix.trim_start();
        if prefix.is_empty() {
            return false;
        }
        if let Some(role) = &self.role
            && message.get("role").and_then(Value::as_str) != Some(role.as_str())
        {
            return false;
        }
        match message.get("content") {
            Some(Value::String(s)) => s.trim_start().starts_with(prefix),
            Some(c @ Value::Array(_)) => ps_core::message::flatten_content(c)
                .trim_start()
                .starts_with(prefix),
            _ => false,
        }
    }

    /// For the start-up log.
    pub fn describe(&self) -> String {
        format!(
            "{}: {} messages starting with {:?}",
            self.name,
            self.role.as_deref().unwrap_or("any"),
            self.content_prefix
        )
    }
}

/// The messages of `added` that make the next state ([`next_state`]).
fn kept<'a>(added: &'a [Value], rules: &[EphemeralRule], shown_tail: usize) -> Vec<&'a Value> {
    let mut kept: Vec<&Value> = added.iter().filter(|m| !is_ephemeral(rules, m)).collect();
    if shown_tail > 0 && kept.len() > shown_tail {
        kept.truncate(kept.len() - shown_tail);
    }
    kept
}

/// Why the messages [`next_state`] would be made of cannot be one: a content part that is not
/// text ([`ps_core::message::unsupported_part`]'s reason), which a judge, reading text, would
/// never see. The previous turn then has no next state rather than a judgement of what is left.
pub fn unusable_next_state(
    added: &[Value],
    rules: &[EphemeralRule],
    shown_tail: usize,
) -> Option<&'static str> {
    let kept: Vec<Value> = kept(added, rules, shown_tail)
        .into_iter()
        .cloned()
        .collect();
    ps_core::message::unsupported_part(&kept).map(|(reason, _)| reason)
}

/// Whether any rule names `message`.
pub fn is_ephemeral(rules: &[EphemeralRule], message: &Value) -> bool {
    rules.iter().any(|r| r.matches(message))
}

/// The next state of a session's previous main turn, from `added`: the messages a request adds
/// after the conversation it continues (those after its last assistant message). Left out: the
/// messages a rule names, and the last `shown_tail` messages when the session's previous request
/// showed a trailing tail of that length to be sent once (its continuation did not re-send it), as
/// long as a message remains. One message is the next state as it is (the reference's shape); several
/// (tool results of parallel calls, a tool result and a user message) become one message whose
/// content is their texts, each under its role when roles differ, separated by blank lines, and
/// whose role is the last one's. `None` when nothing remains: the previous turn has no next state.
pub fn next_state(added: &[Value], rules: &[EphemeralRule], shown_tail: usize) -> Option<Value> {
    match kept(added, rules, shown_tail).as_slice() {
        [] => None,
        [one] => Some((*one).clone()),
        several => {
            let role = |m: &Value| {
                m.get("role")
                    .and_then(Value::as_str)
                    .unwrap_or("user")
                    .to_owned()
            };
            let last_role = role(several[several.len() - 1]);
            let mixed = several.iter().any(|m| role(m) != last_role);
            let text = several
                .iter()
                .map(|m| {
                    let t =
                        ps_core::message::flatten_content(m.get("content").unwrap_or(&Value::Null));
                    if mixed {
                        format!("[{}]\n{t}", role(m))
                    } else {
                        t
                    }
                })
                .collect::<Vec<_>>()
                .join("\n\n");
            let mut m = Map::new();
            m.insert("role".into(), Value::String(last_role));
            m.insert("content".into(), Value::String(text));
            Some(Value::Object(m))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn context() -> Value {
        json!({"role": "user", "content": [{"type": "text", "text":
            "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nConversation data (data, not instructions):\n\"Active exec sessions:\\nnone\"\n<<<END_OPENCLAW_INTERNAL_CONTEXT>>>"}]})
    }

    #[test]
    fn the_openclaw_rule_names_its_context_message_only() {
        let r = EphemeralRule::openclaw();
        assert!(r.matches(&context()));
        assert!(r.matches(
            &json!({"role": "user", "content": "  <<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>> x"})
        ));
        assert!(!r.matches(
            &json!({"role": "user", "content": "What is <<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>?"})
        ));
        assert!(!r.matches(
            &json!({"role": "system", "content": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"})
        ));
        let any_role = EphemeralRule {
            role: None,
            ..EphemeralRule::openclaw()
        };
        assert!(any_role.matches(
            &json!({"role": "system", "content": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"})
        ));
        let empty = EphemeralRule {
            content_prefix: "  ".into(),
            ..EphemeralRule::openclaw()
        };
        assert!(!empty.matches(&json!({"role": "user", "content": "anything"})));
        let indented = EphemeralRule {
            content_prefix: format!("\n {}", OPENCLAW_CONTEXT_PREFIX),
            ..EphemeralRule::openclaw()
        };
        assert!(indented.matches(&context()));
    }

    #[test]
    fn the_next_state_is_what_the_request_adds_without_ephemeral_messages() {
        let rules = [EphemeralRule::openclaw()];
        let follow_up = json!({"role": "user", "content": "No, the other file."});
        // OpenClaw: the follow-up, then the context message.
        assert_eq!(
            next_state(&[follow_up.clone(), context()], &rules, 0),
            Some(follow_up.clone())
        );
        // Without a rule, a tail the session showed to be sent once is left out.
        let unknown_tail = json!({"role": "user", "content": "[wrapper] state: idle"});
        assert_eq!(
            next_state(&[follow_up.clone(), unknown_tail.clone()], &[], 1),
            Some(follow_up.clone())
        );
        // ... but never the only message left.
        assert_eq!(
            next_state(std::slice::from_ref(&follow_up), &[], 1),
            Some(follow_up.clone())
        );
        // Nothing but ephemeral messages: no next state.
        assert_eq!(next_state(&[context()], &rules, 0), None);
        assert_eq!(next_state(&[], &rules, 0), None);
    }

    #[test]
    fn a_next_state_with_a_part_that_is_not_text_is_unusable() {
        let rules = [EphemeralRule::openclaw()];
        let image = json!({"role": "user", "content": [{"type": "text", "text": "This one:"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]});
        assert_eq!(
            unusable_next_state(&[image.clone(), context()], &rules, 0),
            Some("image_unsupported")
        );
        let text = json!({"role": "user", "content": "thanks"});
        assert_eq!(
            unusable_next_state(&[text.clone(), context()], &rules, 0),
            None
        );
        // A message left out (sent once) does not make the next state unusable.
        assert_eq!(unusable_next_state(&[text, image], &[], 1), None);
    }

    #[test]
    fn several_added_messages_become_one_next_state() {
        let t1 = json!({"role": "tool", "tool_call_id": "a", "content": "file_a"});
        let t2 = json!({"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "file_b"}]});
        assert_eq!(
            next_state(&[t1.clone(), t2], &[], 0),
            Some(json!({"role": "tool", "content": "file_a\n\nfile_b"}))
        );
        let u = json!({"role": "user", "content": "thanks"});
        assert_eq!(
            next_state(&[t1, u], &[], 0),
            Some(json!({"role": "user", "content": "[tool]\nfile_a\n\n[user]\nthanks"}))
        );
    }
}
