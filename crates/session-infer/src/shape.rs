//! Side turns recognised by their shape, for requests that name no turn type.
//!
//! Agents send, besides the conversation itself, short helper requests (a chat title, a summary of
//! the history before compaction, a classifier) that should not be trained on as the agent's turn.
//! A [`ShapeRule`] describes such a request; every condition it sets must hold, and a request that
//! matches any rule is a side turn. A turn type sent by the client always wins.

use serde_json::{Map, Value};

/// One rule (`[[server.side_turn_rules]]`). Conditions left `None` are not checked.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShapeRule {
    /// Named in logs.
    pub name: String,
    /// The first message is a system (or developer) message whose text starts with this.
    pub system_prefix: Option<String>,
    /// The last user message's text starts with this.
    pub last_user_prefix: Option<String>,
    /// `Some(true)`: the request offers no tools (`tools` absent, null or empty).
    pub without_tools: Option<bool>,
    /// `max_tokens` or `max_completion_tokens` is set and at most this.
    pub max_tokens_at_most: Option<u64>,
    /// The request's `model` is exactly this (an agent's "small fast model" name for its helper
    /// requests, such as Claude Code's title requests).
    pub model: Option<String>,
}

impl ShapeRule {
    /// Whether the rule checks anything at all (a rule without conditions would match every
    /// request; configuration refuses it).
    pub fn has_conditions(&self) -> bool {
        self.system_prefix.is_some()
            || self.last_user_prefix.is_some()
            || self.without_tools == Some(true)
            || self.max_tokens_at_most.is_some()
            || self.model.is_some()
    }

    /// Whether `body` (a chat request) has this shape.
    pub fn matches(&self, body: &Map<String, Value>) -> bool {
        if !self.has_conditions() {
            return false;
        }
        let messages = body
            .get("messages")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice);
        let text =
            |m: &Value| ps_core::message::flatten_content(m.get("content").unwrap_or(&Value::Null));
        if let Some(prefix) = &self.system_prefix {
            let first = messages.first();
            let is_system = first
                .and_then(|m| m.get("role"))
                .and_then(Value::as_str)
                .is_some_and(|r| r == "system" || r == "developer");
            if !is_system
                || !first.is_some_and(|m| text(m).trim_start().starts_with(prefix.as_str()))
            {
                return false;
            }
        }
        if let Some(prefix) = &self.last_user_prefix {
            let last_user = messages
                .iter()
                .rev()
                .find(|m| m.get("role").and_then(Value::as_str) == Some("user"));
            if !last_user.is_some_and(|m| text(m).trim_start().starts_with(prefix.as_str())) {
                return false;
            }
        }
        if self.without_tools == Some(true) {
            let has_tools = match body.get("tools") {
                None | Some(Value::Null) => false,
                Some(Value::Array(t)) => !t.is_empty(),
                Some(_) => true,
            };
            if has_tools {
                return false;
            }
        }
        if let Some(model) = &self.model
            && body.get("model").and_then(Value::as_str) != Some(model.as_str())
        {
            return false;
        }
        if let Some(cap) = self.max_tokens_at_most {
            let asked = ["max_tokens", "max_completion_tokens"]
                .iter()
                .filter_map(|k| body.get(*k).and_then(Value::as_u64))
                .min();
            if asked.is_none_or(|n| n > cap) {
                return false;
            }
        }
        true
    }

    /// The conditions, for the start-up log.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(p) = &self.system_prefix {
            parts.push(format!("system prompt starts with {p:?}"));
        }
        if let Some(p) = &self.last_user_prefix {
            parts.push(format!("last user message starts with {p:?}"));
        }
        if self.without_tools == Some(true) {
            parts.push("no tools".to_owned());
        }
        if let Some(n) = self.max_tokens_at_most {
            parts.push(format!("max_tokens <= {n}"));
        }
        if let Some(m) = &self.model {
            parts.push(format!("model is {m:?}"));
        }
        format!("{}: {}", self.name, parts.join(" and "))
    }
}

/// The first rule that `body` matches.
pub fn side_rule<'a>(rules: &'a [ShapeRule], body: &Map<String, Value>) -> Option<&'a ShapeRule> {
    rules.iter().find(|r| r.matches(body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn every_condition_must_hold() {
        let title = ShapeRule {
            name: "title".into(),
            last_user_prefix: Some("### Task:".into()),
            without_tools: Some(true),
            ..ShapeRule::default()
        };
        let req = body(json!({"messages": [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": [{"type": "text", "text": "### Task:\nGenerate a title"}]}]}));
        assert!(title.matches(&req));
        let mut with_tools = req.clone();
        with_tools.insert("tools".into(), json!([{"type": "function"}]));
        assert!(!title.matches(&with_tools));
        let other = body(json!({"messages": [{"role": "user", "content": "Fix the bug"}]}));
        assert!(!title.matches(&other));
    }

    #[test]
    fn system_prefix_and_token_cap() {
        let r = ShapeRule {
            name: "summary".into(),
            system_prefix: Some("Summarize".into()),
            max_tokens_at_most: Some(512),
            ..ShapeRule::default()
        };
        let ok = body(json!({"max_completion_tokens": 300, "messages": [
            {"role": "developer", "content": "Summarize the conversation"}, {"role": "user", "content": "x"}]}));
        assert!(r.matches(&ok));
        let big = body(json!({"max_tokens": 4096, "messages": [
            {"role": "system", "content": "Summarize the conversation"}]}));
        assert!(!r.matches(&big), "over the cap");
        let unset = body(json!({"messages": [{"role": "system", "content": "Summarize"}]}));
        assert!(!r.matches(&unset), "no cap asked for: not small");
        let not_first = body(json!({"max_tokens": 10, "messages": [
            {"role": "user", "content": "a"}, {"role": "system", "content": "Summarize"}]}));
        assert!(!r.matches(&not_first));
    }

    /// An agent's helper requests to its "small fast model" (Claude Code's title requests): the
    /// model named exactly, nothing else about the request checked.
    #[test]
    fn the_model_is_matched_exactly() {
        let r = ShapeRule {
            name: "small_fast_model".into(),
            model: Some("claude-haiku-4-5".into()),
            ..ShapeRule::default()
        };
        assert!(r.has_conditions());
        let msgs = json!([{"role": "user", "content": "Write a title"}]);
        let ask = |model: Value| body(json!({"model": model, "messages": msgs}));
        assert!(r.matches(&ask(json!("claude-haiku-4-5"))));
        for other in [
            json!("claude-haiku-4-5-20251001"),
            json!("Claude-Haiku-4-5"),
            json!("qwen3-4b"),
            Value::Null,
        ] {
            assert!(!r.matches(&ask(other.clone())), "{other}");
        }
        assert!(!r.matches(&body(json!({"messages": msgs}))), "no model");
        assert_eq!(
            r.describe(),
            "small_fast_model: model is \"claude-haiku-4-5\""
        );
    }

    #[test]
    fn a_rule_without_conditions_matches_nothing() {
        let r = ShapeRule {
            name: "empty".into(),
            without_tools: Some(false),
            ..ShapeRule::default()
        };
        assert!(!r.has_conditions());
        assert!(!r.matches(&body(
            json!({"messages": [{"role": "user", "content": "a"}]})
        )));
        assert_eq!(side_rule(&[r], &Map::new()), None);
    }
}
