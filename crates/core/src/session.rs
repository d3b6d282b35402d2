//! Session identity and turn type, as carried by headers or body keys of a chat request.

use serde::{Deserialize, Serialize};

/// Whether a turn trains the policy (`main`) or is only forwarded (`side`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TurnType {
    Main,
    Side,
}

impl TurnType {
    /// Parses `main` or `side`, case-insensitively and ignoring surrounding white space.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "main" => Some(Self::Main),
            "side" => Some(Self::Side),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Main => "main",
            Self::Side => "side",
        }
    }
}

/// The start of the message the npm OpenClaw agent appends to every request after the user's own
/// and never sends again (recorded from `openclaw` 2026.9.6): the default
/// `server.ephemeral_message_rules` entry.
pub const OPENCLAW_CONTEXT_PREFIX: &str = "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>";

/// `server.default_turn_type`: the turn type of a request that names none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DefaultTurnType {
    /// `main` for a request whose session is recognised from its history (no session key: an
    /// unmodified agent trains with the defaults), `side` for one with a session key (as in the
    /// reference, whose clients name their main turns).
    #[default]
    Auto,
    Main,
    Side,
}

impl DefaultTurnType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Main => "main",
            Self::Side => "side",
        }
    }

    /// The turn type of a request naming none, `inferred` when its session is (to be) recognised
    /// from its history.
    pub fn for_request(self, inferred: bool) -> TurnType {
        match self {
            Self::Auto if inferred => TurnType::Main,
            Self::Auto | Self::Side => TurnType::Side,
            Self::Main => TurnType::Main,
        }
    }
}

/// `1`, `true`, `yes` and `on` (any case) are truthy, as in the reference server.
pub fn is_truthy(s: &str) -> bool {
    matches!(
        s.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on"
    )
}

/// The session keys of one request, before defaults are applied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionHeaders {
    pub session_id: Option<String>,
    pub turn_type: Option<TurnType>,
    pub done: bool,
}

/// How a request's session was found: from the client's keys, or recognised from the conversation
/// itself (`server.session_inference`). Written to every sample as `metadata.session_source`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionSource {
    /// The `X-Session-Id` header.
    Header,
    /// The body key `session_id`.
    Body,
    /// An agent's own conversation key (`server.agent_session_keys`, such as Claude Code's
    /// `X-Claude-Code-Session-Id`), used as the session when
    /// `server.agent_keys_name_sessions` is on.
    Agent,
    /// Recognised from the history (a continuation of a conversation we answered, or a new one).
    Inferred,
    /// Recognised as a second continuation of a prefix another request already continued.
    Fork,
    /// No key and inference off: the shared session `unknown` (also turns recorded before this
    /// field existed).
    #[default]
    Unknown,
}

impl SessionSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Header => "header",
            Self::Body => "body",
            Self::Agent => "agent",
            Self::Inferred => "inferred",
            Self::Fork => "fork",
            Self::Unknown => "unknown",
        }
    }
}

/// Which API a turn came through. Every door becomes the same chat-completions turn: the door is
/// recorded so that a sample can be traced to the client that sent it. Written to every sample as
/// `metadata.door`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Door {
    /// `POST /v1/chat/completions` (also turns recorded before this field existed).
    #[default]
    ChatCompletions,
    /// `POST /v1/messages`, the Anthropic Messages API.
    Messages,
    /// `POST /v1/responses`, the OpenAI Responses API.
    Responses,
}

impl Door {
    fn is_chat(&self) -> bool {
        *self == Self::ChatCompletions
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::ChatCompletions => "chat_completions",
            Self::Messages => "messages",
            Self::Responses => "responses",
        }
    }
}

/// Where a turn came from: the API it came through, how its session was found, and how that
/// session relates to other sessions.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SessionOrigin {
    pub source: SessionSource,
    /// The API the turn came through.
    #[serde(default, skip_serializing_if = "Door::is_chat")]
    pub door: Door,
    /// The agent's own conversation key the request carried (`server.agent_session_keys`), when
    /// any: written as `metadata.agent_session_key`, to group a conversation's sessions by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_key: Option<String>,
    /// A fork: the session whose prefix this one continued a second time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_session: Option<String>,
    /// A history that matched no answered conversation, but whose system prompt and first user
    /// message are those of this live session (the agent compacted or summarised its history).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continued_from: Option<String>,
}

impl SessionOrigin {
    pub fn of(source: SessionSource) -> Self {
        Self {
            source,
            ..Self::default()
        }
    }

    /// Writes `session_source` and `door`, and `parent_session` / `continued_from` /
    /// `agent_session_key` when set, into a sample's metadata.
    pub fn write_metadata(&self, metadata: &mut serde_json::Map<String, serde_json::Value>) {
        use serde_json::Value;
        metadata.insert("door".into(), Value::String(self.door.as_str().into()));
        metadata.insert(
            "session_source".into(),
            Value::String(self.source.as_str().into()),
        );
        if let Some(p) = &self.parent_session {
            metadata.insert("parent_session".into(), Value::String(p.clone()));
        }
        if let Some(c) = &self.continued_from {
            metadata.insert("continued_from".into(), Value::String(c.clone()));
        }
        if let Some(k) = &self.agent_key {
            metadata.insert("agent_session_key".into(), Value::String(k.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_trains_inferred_sessions_and_keeps_keyed_ones_side() {
        use DefaultTurnType as D;
        assert_eq!(D::default(), D::Auto);
        assert_eq!(D::Auto.for_request(true), TurnType::Main);
        assert_eq!(D::Auto.for_request(false), TurnType::Side);
        for inferred in [true, false] {
            assert_eq!(D::Main.for_request(inferred), TurnType::Main);
            assert_eq!(D::Side.for_request(inferred), TurnType::Side);
        }
        let parsed: Vec<D> = serde_json::from_str(r#"["auto","main","side"]"#).unwrap_or_default();
        assert_eq!(parsed, [D::Auto, D::Main, D::Side]);
    }

    #[test]
    fn truthy_values() {
        for v in ["1", "true", "TRUE", " yes ", "On"] {
            assert!(is_truthy(v), "{v}");
        }
        for v in ["0", "false", "", "no", "off", "2"] {
            assert!(!is_truthy(v), "{v}");
        }
    }

    #[test]
    fn turn_type_parse() {
        assert_eq!(TurnType::parse(" MAIN "), Some(TurnType::Main));
        assert_eq!(TurnType::parse("side"), Some(TurnType::Side));
        assert_eq!(TurnType::parse("other"), None);
    }
}
