//! Where a chat request's session comes from: the client's keys, or its own history
//! (`server.session_inference`, the matching itself lives in `ps-session-infer`), and whether a
//! request naming no turn type is a side turn by its shape (`server.side_turn_rules`).

use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderMap;
use ps_core::{SessionOrigin, SessionSource, TurnType};
use ps_session_infer::SessionInference;
use ps_session_infer::{EphemeralRule, History, Limits, PendingReply, SessionMatcher, ShapeRule};
use serde_json::Value;

use crate::metrics as m;
use crate::request::{ChatRequest, SESSION_ID_HEADER};

/// Session inference and shape rules, as configured.
#[derive(Debug, Clone)]
pub struct InferenceOptions {
    /// `server.session_inference`.
    pub mode: SessionInference,
    /// Sessions idle for longer are forgotten (`server.session_timeout_sec`).
    pub idle: Duration,
    /// Most sessions held (`server.max_sessions`).
    pub max_sessions: usize,
    /// `server.side_turn_rules`.
    pub side_rules: Vec<ShapeRule>,
    /// `server.ephemeral_message_rules`.
    pub ephemeral_rules: Vec<EphemeralRule>,
    /// `server.agent_session_keys`: where agents carry their own conversation key.
    pub agent_keys: Vec<AgentKey>,
    /// `server.agent_keys_name_sessions`: that key is the session.
    pub agent_keys_name_sessions: bool,
}

/// Where an agent carries its own conversation key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentKey {
    /// A request header (its name, any case).
    Header(String),
    /// A top-level body key.
    Body(String),
}

impl AgentKey {
    /// `header:NAME` or `body:KEY` (validated by the settings).
    pub fn parse(s: &str) -> Option<Self> {
        if let Some(h) = s.strip_prefix("header:") {
            return Some(Self::Header(h.trim().to_ascii_lowercase()));
        }
        s.strip_prefix("body:")
            .map(|b| Self::Body(b.trim().to_owned()))
    }

    /// The defaults of `server.agent_session_keys`.
    pub fn defaults() -> Vec<Self> {
        vec![
            Self::Header("x-claude-code-session-id".into()),
            Self::Header("session-id".into()),
            Self::Body("prompt_cache_key".into()),
        ]
    }
}

/// The agent's own conversation key of a request: the first of `keys` it carries (a non-blank
/// string, at most 256 bytes).
pub(crate) fn agent_key(
    keys: &[AgentKey],
    headers: &HeaderMap,
    req: &ChatRequest,
) -> Option<String> {
    keys.iter().find_map(|k| {
        let v = match k {
            AgentKey::Header(name) => headers
                .get(name.as_str())
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            AgentKey::Body(key) => req
                .get(key)
                .and_then(ps_json::as_str)
                .map(|s| s.into_owned()),
        }?;
        let v = v.trim();
        (!v.is_empty() && v.len() <= 256).then(|| v.to_owned())
    })
}

impl Default for InferenceOptions {
    fn default() -> Self {
        Self {
            mode: SessionInference::WhenMissing,
            idle: Duration::from_secs(600),
            max_sessions: 10_000,
            side_rules: Vec::new(),
            ephemeral_rules: vec![EphemeralRule::openclaw()],
            agent_keys: AgentKey::defaults(),
            agent_keys_name_sessions: false,
        }
    }
}

impl InferenceOptions {
    /// The matcher these options call for (none when inference is off).
    pub(crate) fn matcher(&self) -> Option<Arc<SessionMatcher>> {
        (self.mode != SessionInference::Off).then(|| {
            Arc::new(SessionMatcher::new(Limits {
                idle: self.idle,
                max_sessions: self.max_sessions,
            }))
        })
    }

    /// Logs at start what is active.
    pub fn log_active(&self) {
        tracing::info!(
            session_inference = self.mode.as_str(),
            "requests without a session key: {}",
            match self.mode {
                SessionInference::Off => "all share the session \"unknown\"",
                SessionInference::WhenMissing =>
                    "their session is recognised from the history (a client's key wins)",
                SessionInference::Always =>
                    "their session is recognised from the history, and client keys are ignored",
            }
        );
        if self.side_rules.is_empty() {
            tracing::info!(
                "no side-turn rules: requests naming no turn type get server.default_turn_type"
            );
        }
        for r in &self.side_rules {
            tracing::info!(rule = %r.describe(), "side-turn rule active");
        }
        for r in &self.ephemeral_rules {
            tracing::info!(
                rule = %r.describe(),
                "messages sent once: left out of session recognition and of next states"
            );
        }
    }

    /// Whether a request's session is (to be) recognised from its history: no client key it may
    /// use, and inference on.
    pub(crate) fn infers(&self, req: &ChatRequest) -> bool {
        match self.mode {
            SessionInference::Off => false,
            SessionInference::Always => true,
            SessionInference::WhenMissing => req.session.session_id.is_none(),
        }
    }

    /// Whether a request comes from an unmodified agent (its turns train under `auto`): its
    /// session is recognised from the history, or named by the agent's own key.
    pub(crate) fn unmodified_agent(&self, req: &ChatRequest, agent_key: Option<&str>) -> bool {
        self.infers(req)
            || (self.agent_keys_name_sessions
                && agent_key.is_some()
                && req.session.session_id.is_none())
    }
}

/// The session a request belongs to.
#[derive(Debug)]
pub(crate) struct Found {
    pub session_id: String,
    pub origin: SessionOrigin,
    /// Registers our reply when the answer is complete (inferred sessions only).
    pub reply: Option<PendingReply>,
    /// How many trailing messages the previous request of the conversation showed it sends once
    /// (inferred continuations only; [`ps_session_infer::next_state`]).
    pub ephemeral_tail: usize,
}

/// The turn type of a request that names none: a side turn when a shape rule matches, otherwise
/// `default`.
pub(crate) fn turn_type_by_shape(
    rules: &[ShapeRule],
    ephemeral: &[EphemeralRule],
    req: &ChatRequest,
    default: TurnType,
) -> TurnType {
    if rules.is_empty() {
        return default;
    }
    let body = match req.shape_view(ephemeral) {
        Ok(body) => body,
        Err(e) => {
            // Validated as a tree parse would: not expected; the turn keeps its default type.
            tracing::error!(error = %e, "the request body could not be read for the shape rules");
            return default;
        }
    };
    match ps_session_infer::side_rule(rules, &body) {
        Some(rule) => {
            tracing::debug!(rule = %rule.name, "side turn by its shape");
            TurnType::Side
        }
        None => default,
    }
}

/// Finds the session of a request: its key when it has one (and inference is not `always`),
/// otherwise (main turns) from its history; a side turn without a key shares `unknown`.
pub(crate) fn find_session(
    matcher: Option<&Arc<SessionMatcher>>,
    opts: &InferenceOptions,
    headers: &HeaderMap,
    req: &ChatRequest,
    turn_type: TurnType,
    agent_key: Option<&str>,
) -> Found {
    let mut found = find(matcher, opts, headers, req, turn_type, agent_key);
    found.origin.agent_key = agent_key.map(str::to_owned);
    found
}

fn find(
    matcher: Option<&Arc<SessionMatcher>>,
    opts: &InferenceOptions,
    headers: &HeaderMap,
    req: &ChatRequest,
    turn_type: TurnType,
    agent_key: Option<&str>,
) -> Found {
    let mode = opts.mode;
    let keyed = req
        .session
        .session_id
        .clone()
        .filter(|_| mode != SessionInference::Always);
    if let Some(id) = keyed {
        let from_header = headers
            .get(SESSION_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| !v.trim().is_empty());
        let source = if from_header {
            SessionSource::Header
        } else {
            SessionSource::Body
        };
        return Found {
            session_id: id,
            origin: SessionOrigin::of(source),
            reply: None,
            ephemeral_tail: 0,
        };
    }
    if let Some(key) =
        agent_key.filter(|_| opts.agent_keys_name_sessions && mode != SessionInference::Always)
    {
        return Found {
            session_id: key.to_owned(),
            origin: SessionOrigin::of(SessionSource::Agent),
            reply: None,
            ephemeral_tail: 0,
        };
    }
    let unknown = || Found {
        session_id: crate::request::UNKNOWN_SESSION.to_owned(),
        origin: SessionOrigin::of(SessionSource::Unknown),
        reply: None,
        ephemeral_tail: 0,
    };
    let Some(matcher) = matcher.filter(|_| turn_type == TurnType::Main) else {
        return unknown();
    };
    let messages = match req.messages() {
        Ok(messages) => messages,
        Err(e) => {
            // Validated as a tree parse would: not expected; counted, and the turn is unkeyed.
            metrics::counter!(m::SESSION_INFERENCE_TOTAL, "outcome" => "unreadable").increment(1);
            tracing::error!(error = %e, "the request's messages could not be read for session inference");
            return unknown();
        }
    };
    let history = History::of_with(&messages, &opts.ephemeral_rules);
    let r = matcher.resolve(&history, tokio::time::Instant::now().into_std());
    metrics::counter!(m::SESSION_INFERENCE_TOTAL, "outcome" => r.outcome.as_str()).increment(1);
    tracing::debug!(
        session_id = %r.session_id,
        outcome = r.outcome.as_str(),
        ephemeral_tail = r.ephemeral_tail,
        parent_session = r.origin.parent_session.as_deref(),
        continued_from = r.origin.continued_from.as_deref(),
        "session recognised from the history"
    );
    if req.session.done {
        // The client ends the conversation with this turn: nothing will continue it.
        matcher.forget(&r.session_id);
    }
    Found {
        session_id: r.session_id,
        origin: r.origin,
        reply: Some(r.reply),
        ephemeral_tail: r.ephemeral_tail,
    }
}

/// Registers the reply of a complete answer, so that the next request of the conversation is
/// recognised.
pub(crate) fn complete(reply: Option<PendingReply>, message: &Value) {
    if let Some(r) = reply {
        r.complete(message, tokio::time::Instant::now().into_std());
    }
}

/// What `/v1/rollout/status` reports under `session_inference`.
pub(crate) fn status(mode: SessionInference, matcher: Option<&Arc<SessionMatcher>>) -> Value {
    let st = matcher.map(|m| m.stats()).unwrap_or_default();
    serde_json::json!({
        "mode": mode.as_str(),
        "live_sessions": st.live_sessions,
        "answered_ends": st.answered_ends,
        "continued": st.continued,
        "inferred_sessions": st.new_sessions + st.unmatched,
        "forks": st.forks,
        "unmatched_continuations": st.unmatched,
        "continued_from_links": st.linked,
        "expired": st.expired,
        "evicted": st.evicted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request;
    use serde_json::json;

    /// A request of one user message; its body is leaked (tests only) so that the request can
    /// borrow it.
    fn request(text: &str) -> ChatRequest<'static> {
        let body = json!({"messages": [{"role": "user", "content": text}]}).to_string();
        request::parse(body.leak().as_bytes(), &HeaderMap::new()).expect("valid")
    }

    /// The server's matcher runs on tokio's clock: with the clock paused, 10,000 conversations that
    /// go idle are gone once `server.session_timeout_sec` has passed, swept by the next request.
    #[tokio::test(start_paused = true)]
    async fn ten_thousand_idle_sessions_go_with_the_session_timeout() {
        let opts = InferenceOptions {
            idle: Duration::from_secs(600),
            max_sessions: 20_000,
            ..InferenceOptions::default()
        };
        let matcher = opts.matcher().expect("inference is on");
        let headers = HeaderMap::new();
        for i in 0..10_000 {
            let req = request(&format!("task {i}"));
            let found = find_session(Some(&matcher), &opts, &headers, &req, TurnType::Main, None);
            assert_eq!(found.origin.source, SessionSource::Inferred);
            complete(
                found.reply,
                &json!({"role": "assistant", "content": format!("answer {i}")}),
            );
        }
        assert_eq!(matcher.stats().live_sessions, 10_000);
        assert_eq!(matcher.stats().answered_ends, 10_000);
        tokio::time::advance(Duration::from_secs(600)).await;
        let a = find_session(
            Some(&matcher),
            &opts,
            &headers,
            &request("a"),
            TurnType::Main,
            None,
        );
        complete(
            a.reply,
            &json!({"role": "assistant", "content": "answer a"}),
        );
        assert_eq!(
            matcher.stats().live_sessions,
            10_001,
            "not idle longer than the timeout yet"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        let found = find_session(
            Some(&matcher),
            &opts,
            &headers,
            &request("b"),
            TurnType::Main,
            None,
        );
        drop(found);
        let st = matcher.stats();
        assert_eq!(st.expired, 10_000);
        // Only the session of "a" is left ("b" failed: dropped without a reply).
        assert_eq!((st.live_sessions, st.answered_ends), (1, 1));
    }

    /// A side-turn rule on the last user message reads the user's, not a context block the client
    /// appends after it and sends once (OpenClaw's memory flush, should it carry the block).
    #[test]
    fn shape_rules_look_past_messages_sent_once() {
        let flush = ShapeRule {
            name: "openclaw_memory_flush".into(),
            last_user_prefix: Some("Pre-compaction memory flush.".into()),
            ..ShapeRule::default()
        };
        let body = json!({"messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "Pre-compaction memory flush. Store durable memories."},
            {"role": "user", "content": [{"type": "text",
                "text": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nnone\n<<<END_OPENCLAW_INTERNAL_CONTEXT>>>"}]}
        ]})
        .to_string();
        let req = request::parse(body.as_bytes(), &HeaderMap::new()).expect("valid");
        let rules = std::slice::from_ref(&flush);
        let openclaw = [EphemeralRule::openclaw()];
        assert_eq!(
            turn_type_by_shape(rules, &openclaw, &req, TurnType::Main),
            TurnType::Side
        );
        assert_eq!(
            turn_type_by_shape(rules, &[], &req, TurnType::Main),
            TurnType::Main,
            "without the rule the context block is the last user message"
        );
    }

    #[test]
    fn keys_side_turns_and_modes() {
        let opts = InferenceOptions::default();
        let matcher = opts.matcher();
        let mut headers = HeaderMap::new();
        let keyed = request::parse(
            br#"{"messages":[{"role":"user","content":"x"}],"session_id":"b"}"#,
            &headers,
        )
        .expect("valid");
        let f = find_session(
            matcher.as_ref(),
            &InferenceOptions {
                mode: SessionInference::WhenMissing,
                ..InferenceOptions::default()
            },
            &headers,
            &keyed,
            TurnType::Main,
            None,
        );
        assert_eq!(
            (f.session_id.as_str(), f.origin.source),
            ("b", SessionSource::Body)
        );
        headers.insert(SESSION_ID_HEADER, "h".parse().expect("header value"));
        let req = request("x");
        let req_h = request::parse(br#"{"messages":[{"role":"user","content":"x"}]}"#, &headers)
            .expect("valid");
        let f = find_session(
            matcher.as_ref(),
            &InferenceOptions {
                mode: SessionInference::WhenMissing,
                ..InferenceOptions::default()
            },
            &headers,
            &req_h,
            TurnType::Main,
            None,
        );
        assert_eq!(
            (f.session_id.as_str(), f.origin.source),
            ("h", SessionSource::Header)
        );
        let f = find_session(
            matcher.as_ref(),
            &InferenceOptions {
                mode: SessionInference::Always,
                ..InferenceOptions::default()
            },
            &headers,
            &req_h,
            TurnType::Main,
            None,
        );
        assert!(f.session_id.starts_with("inferred-"));
        // A side turn without a key is not matched.
        let f = find_session(
            matcher.as_ref(),
            &InferenceOptions {
                mode: SessionInference::WhenMissing,
                ..InferenceOptions::default()
            },
            &HeaderMap::new(),
            &req,
            TurnType::Side,
            None,
        );
        assert_eq!(f.origin.source, SessionSource::Unknown);
        assert!(f.reply.is_none());
        // Whose session is recognised from the history: no key (or keys ignored), inference on.
        let when_missing = InferenceOptions::default();
        assert!(when_missing.infers(&request("x")) && !when_missing.infers(&keyed));
        let always = InferenceOptions {
            mode: SessionInference::Always,
            ..InferenceOptions::default()
        };
        assert!(always.infers(&keyed));
        let off = InferenceOptions {
            mode: SessionInference::Off,
            ..InferenceOptions::default()
        };
        assert!(!off.infers(&request("x")));
        assert!(
            InferenceOptions {
                mode: SessionInference::Off,
                ..InferenceOptions::default()
            }
            .matcher()
            .is_none()
        );
    }
}
