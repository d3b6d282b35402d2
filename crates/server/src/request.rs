//! Reading a chat request: validation with clear errors, the session keys (headers or body), and the
//! body forwarded upstream.

use axum::http::HeaderMap;
use ps_core::session::{SessionHeaders, TurnType, is_truthy};
use serde_json::{Map, Value, json};

use crate::error::ApiError;

/// Body keys that are ours, not OpenAI's: read, then stripped before forwarding.
const SESSION_ID_KEY: &str = "session_id";
const SESSION_DONE_KEY: &str = "session_done";
const TURN_TYPE_KEY: &str = "turn_type";

/// Session id of a request that names none (as the reference).
pub const UNKNOWN_SESSION: &str = "unknown";
pub const SESSION_ID_HEADER: &str = "x-session-id";
pub const TURN_TYPE_HEADER: &str = "x-turn-type";
pub const SESSION_DONE_HEADER: &str = "x-session-done";

/// A validated chat request.
#[derive(Debug)]
pub struct ChatRequest {
    /// The client's body without our session keys; everything else untouched.
    pub body: Map<String, Value>,
    pub session: SessionHeaders,
    pub stream: bool,
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn wrong_type(field: &str, expected: &str, got: &Value) -> ApiError {
    ApiError::invalid(
        "invalid_type",
        format!("`{field}` must be {expected}, got {}", type_name(got)),
    )
}

/// Parses and validates the body, and reads the session keys (headers win over body keys).
#[cfg(test)]
pub fn parse(bytes: &[u8], headers: &HeaderMap) -> Result<ChatRequest, ApiError> {
    parse_limited(bytes, headers, usize::MAX)
}

/// As [`parse`], with at most `max_messages` messages (`server.max_messages`).
pub fn parse_limited(
    bytes: &[u8],
    headers: &HeaderMap,
    max_messages: usize,
) -> Result<ChatRequest, ApiError> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| ApiError::InvalidJson(e.to_string()))?;
    let Value::Object(mut body) = value else {
        return Err(wrong_type("body", "a JSON object", &value));
    };
    validate_messages(body.get("messages"))?;
    let count = body
        .get("messages")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    if count > max_messages {
        return Err(ApiError::invalid(
            "too_many_messages",
            format!(
                "the request has {count} messages; at most {max_messages} are accepted (`server.max_messages`)"
            ),
        ));
    }
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(wrong_type("stream", "a boolean", other)),
    };
    if let Some(tools) = body.get("tools")
        && !matches!(tools, Value::Array(_) | Value::Null)
    {
        return Err(wrong_type("tools", "an array", tools));
    }
    let session = session_keys(&mut body, headers)?;
    Ok(ChatRequest {
        body,
        session,
        stream,
    })
}

fn validate_messages(messages: Option<&Value>) -> Result<(), ApiError> {
    let messages = match messages {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid(
                "missing_messages",
                "`messages` is required",
            ));
        }
        Some(Value::Array(m)) => m,
        Some(other) => return Err(wrong_type("messages", "an array", other)),
    };
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "empty_messages",
            "`messages` must hold at least one message",
        ));
    }
    for (i, m) in messages.iter().enumerate() {
        let Value::Object(obj) = m else {
            return Err(wrong_type(&format!("messages[{i}]"), "an object", m));
        };
        match obj.get("role") {
            Some(Value::String(_)) => {}
            None => {
                return Err(ApiError::invalid(
                    "invalid_message",
                    format!("`messages[{i}].role` is required"),
                ));
            }
            Some(other) => {
                return Err(wrong_type(
                    &format!("messages[{i}].role"),
                    "a string",
                    other,
                ));
            }
        }
        if let Some(c) = obj.get("content")
            && !matches!(c, Value::String(_) | Value::Array(_) | Value::Null)
        {
            return Err(wrong_type(
                &format!("messages[{i}].content"),
                "a string, an array of parts or null",
                c,
            ));
        }
    }
    Ok(())
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

fn body_str(v: &Value) -> Option<String> {
    match v {
        Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_owned()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn session_keys(
    body: &mut Map<String, Value>,
    headers: &HeaderMap,
) -> Result<SessionHeaders, ApiError> {
    let body_id = body.remove(SESSION_ID_KEY).as_ref().and_then(body_str);
    let body_done = body.remove(SESSION_DONE_KEY).as_ref().and_then(body_str);
    let body_turn = body.remove(TURN_TYPE_KEY).as_ref().and_then(body_str);

    let session_id = header_str(headers, SESSION_ID_HEADER)
        .map(str::to_owned)
        .or(body_id);
    // Either key ends the session, as in the reference (`header or body`): a header `0` does not
    // cancel a body `true`.
    let done = header_str(headers, SESSION_DONE_HEADER).is_some_and(is_truthy)
        || body_done.as_deref().is_some_and(is_truthy);
    let turn_type = match header_str(headers, TURN_TYPE_HEADER)
        .map(str::to_owned)
        .or(body_turn)
    {
        None => None,
        Some(t) => Some(TurnType::parse(&t).ok_or_else(|| {
            ApiError::invalid(
                "invalid_turn_type",
                format!("turn type {t:?} is not `main` or `side` (header `X-Turn-Type` or body `turn_type`)"),
            )
        })?),
    };
    Ok(SessionHeaders {
        session_id,
        turn_type,
        done,
    })
}

/// Options that shape the forwarded body.
#[derive(Debug, Clone)]
pub struct ForwardOptions<'a> {
    pub served_model_name: &'a str,
    pub stream: bool,
    pub return_token_ids: bool,
}

/// The body sent upstream: log-probs forced on (`top_logprobs` at least 1), `model` filled when absent,
/// `stream` set as decided, every other field untouched.
pub fn forward_body(body: &Map<String, Value>, opts: &ForwardOptions<'_>) -> Value {
    let mut out = body.clone();
    out.insert("logprobs".into(), json!(true));
    let top = out
        .get("top_logprobs")
        .and_then(Value::as_u64)
        .unwrap_or(0)
        .max(1);
    out.insert("top_logprobs".into(), json!(top));
    match out.get("model") {
        Some(Value::String(s)) if !s.is_empty() => {}
        _ => {
            out.insert("model".into(), json!(opts.served_model_name));
        }
    }
    out.insert("stream".into(), json!(opts.stream));
    if !opts.stream {
        out.remove("stream_options");
        if opts.return_token_ids && !out.contains_key("return_token_ids") {
            out.insert("return_token_ids".into(), json!(true));
        }
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn headers_win_and_body_keys_are_stripped() {
        let body = br#"{"messages":[{"role":"user","content":"hi"}],"session_id":"b","turn_type":"side","session_done":"yes","x_extra":1}"#;
        let r = parse(
            body,
            &headers(&[("x-session-id", "h"), ("x-turn-type", "main")]),
        )
        .expect("valid");
        assert_eq!(r.session.session_id.as_deref(), Some("h"));
        assert_eq!(r.session.turn_type, Some(TurnType::Main));
        assert!(r.session.done);
        assert!(!r.body.contains_key("session_id"));
        assert!(!r.body.contains_key("turn_type"));
        assert!(!r.body.contains_key("session_done"));
        assert_eq!(r.body["x_extra"], 1);
    }

    #[test]
    fn session_done_is_the_or_of_header_and_body() {
        let with_body = |done: &str| {
            format!(r#"{{"messages":[{{"role":"user","content":"hi"}}],"session_done":{done}}}"#)
        };
        let cases: &[(&str, Option<&'static str>, bool)] = &[
            // a header `0` does not cancel a body `true` (the reference ORs them)
            ("true", Some("0"), true),
            ("false", Some("1"), true),
            ("\"yes\"", None, true),
            ("false", Some("no"), false),
            ("0", None, false),
        ];
        for (body, header, want) in cases {
            let h = match header {
                Some(v) => headers(&[("x-session-done", v)]),
                None => HeaderMap::new(),
            };
            let r = parse(with_body(body).as_bytes(), &h).expect("valid");
            assert_eq!(r.session.done, *want, "body {body}, header {header:?}");
        }
    }

    #[test]
    fn body_keys_used_without_headers() {
        let body =
            br#"{"messages":[{"role":"user","content":"hi"}],"session_id":"b","turn_type":"MAIN"}"#;
        let r = parse(body, &HeaderMap::new()).expect("valid");
        assert_eq!(r.session.session_id.as_deref(), Some("b"));
        assert_eq!(r.session.turn_type, Some(TurnType::Main));
        assert!(!r.session.done);
    }

    #[test]
    fn bad_inputs_have_clear_codes() {
        let cases: &[(&[u8], &str)] = &[
            (b"{not json", "invalid_json"),
            (b"[1]", "invalid_type"),
            (b"{}", "missing_messages"),
            (br#"{"messages":"hi"}"#, "invalid_type"),
            (br#"{"messages":[]}"#, "empty_messages"),
            (br#"{"messages":[1]}"#, "invalid_type"),
            (br#"{"messages":[{"content":"x"}]}"#, "invalid_message"),
            (
                br#"{"messages":[{"role":"user","content":5}]}"#,
                "invalid_type",
            ),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"stream":"yes"}"#,
                "invalid_type",
            ),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"tools":{}}"#,
                "invalid_type",
            ),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"turn_type":"other"}"#,
                "invalid_turn_type",
            ),
        ];
        for (body, code) in cases {
            let e = parse(body, &HeaderMap::new()).expect_err("must fail");
            assert_eq!(e.code(), *code, "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn forward_body_forces_logprobs_and_keeps_unknown_fields() {
        let r = parse(
            br#"{"messages":[{"role":"user","content":"hi"}],"top_logprobs":5,"foo":{"bar":1},"stream_options":{"include_usage":true}}"#,
            &HeaderMap::new(),
        )
        .expect("valid");
        let opts = ForwardOptions {
            served_model_name: "qwen3-4b",
            stream: false,
            return_token_ids: true,
        };
        let f = forward_body(&r.body, &opts);
        assert_eq!(f["logprobs"], true);
        assert_eq!(f["top_logprobs"], 5);
        assert_eq!(f["model"], "qwen3-4b");
        assert_eq!(f["foo"], json!({"bar": 1}));
        assert_eq!(f["return_token_ids"], true);
        assert!(f.get("stream_options").is_none());
        let streamed = forward_body(
            &r.body,
            &ForwardOptions {
                stream: true,
                ..opts
            },
        );
        assert_eq!(streamed["stream"], true);
        assert_eq!(streamed["top_logprobs"], 5);
        assert!(
            streamed.get("return_token_ids").is_none(),
            "SGLang refuses ids with streams"
        );
        assert_eq!(streamed["stream_options"], json!({"include_usage": true}));
    }

    #[test]
    fn model_kept_when_given() {
        let r = parse(
            br#"{"model":"mine","messages":[{"role":"user","content":"hi"}]}"#,
            &HeaderMap::new(),
        )
        .expect("valid");
        let f = forward_body(
            &r.body,
            &ForwardOptions {
                served_model_name: "x",
                stream: false,
                return_token_ids: false,
            },
        );
        assert_eq!(f["model"], "mine");
        assert_eq!(f["top_logprobs"], 1);
    }
}

#[cfg(test)]
mod limit_tests {
    use super::*;

    #[test]
    fn too_many_messages_names_the_setting() {
        let body = br#"{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"user","content":"c"}]}"#;
        let e = parse_limited(body, &HeaderMap::new(), 2).expect_err("over the limit");
        assert_eq!(e.code(), "too_many_messages");
        assert!(e.to_string().contains("server.max_messages"));
        assert!(parse_limited(body, &HeaderMap::new(), 3).is_ok());
    }
}
