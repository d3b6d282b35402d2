//! Failures the fake can be told to simulate.

use std::{fmt, str::FromStr, time::Duration};

/// A failure applied to `/v1/chat/completions` and `/generate` requests (and, for `Status(503, _)` set with
/// `set_fault`, to `/health*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Drop the connection without any HTTP answer (the client sees a connection error).
    Refuse,
    /// Wait this long, then answer normally.
    Delay(Duration),
    /// Answer with this status and this body (sent as JSON when it parses as JSON, else as text).
    Status(u16, String),
    /// Answer 200 with a body that is not JSON.
    Garbage,
    /// Streaming: send this many `data:` events, then drop the connection without `[DONE]`.
    /// Non-streaming: send part of the JSON body, then drop the connection.
    CutStream { after_chunks: usize },
    /// Streaming: send this many `data:` events, then SGLang's mid-stream error event and `[DONE]`.
    /// Non-streaming: answer 500 with the route's error body.
    StreamError { after_chunks: usize },
}

/// Why a `--fault` string could not be parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FaultParseError {
    #[error(
        "unknown fault kind {kind:?} in {input:?}; expected refuse, delay:MS, status:CODE[:BODY], garbage, cut:N or error:N"
    )]
    UnknownKind { input: String, kind: String },
    #[error("fault {input:?} needs a value after ':'")]
    MissingValue { input: String },
    #[error("fault {input:?}: {value:?} is not a valid {what}")]
    BadValue {
        input: String,
        value: String,
        what: &'static str,
    },
}

impl Fault {
    /// The default body of `status:CODE`: SGLang's flat OpenAI-route error.
    pub fn status_body(code: u16) -> String {
        let kind = if code >= 500 {
            "InternalServerError"
        } else {
            "BadRequestError"
        };
        serde_json::json!({
            "object": "error",
            "message": format!("fake-sglang fault: status {code}"),
            "type": kind,
            "param": null,
            "code": code,
        })
        .to_string()
    }
}

impl FromStr for Fault {
    type Err = FaultParseError;

    /// Parses `refuse`, `delay:MS`, `status:CODE` or `status:CODE:BODY`, `garbage`, `cut:N`, `error:N`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let input = s.trim();
        let (kind, value) = match input.split_once(':') {
            Some((k, v)) => (k.trim().to_ascii_lowercase(), Some(v)),
            None => (input.to_ascii_lowercase(), None),
        };
        let need = || {
            value
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .ok_or_else(|| FaultParseError::MissingValue {
                    input: input.to_owned(),
                })
        };
        let number = |v: &str, what: &'static str| {
            v.parse::<u64>().map_err(|_| FaultParseError::BadValue {
                input: input.to_owned(),
                value: v.to_owned(),
                what,
            })
        };
        match kind.as_str() {
            "refuse" => Ok(Fault::Refuse),
            "garbage" => Ok(Fault::Garbage),
            "delay" => Ok(Fault::Delay(Duration::from_millis(number(
                need()?,
                "delay in milliseconds",
            )?))),
            "cut" => Ok(Fault::CutStream {
                after_chunks: number(need()?, "chunk count")? as usize,
            }),
            "error" => Ok(Fault::StreamError {
                after_chunks: number(need()?, "chunk count")? as usize,
            }),
            "status" => {
                let v = need()?;
                let (code, body) = match v.split_once(':') {
                    Some((c, b)) => (c.trim(), Some(b.to_owned())),
                    None => (v, None),
                };
                let code = u16::try_from(number(code, "HTTP status")?)
                    .ok()
                    .filter(|c| (100..=999).contains(c))
                    .ok_or_else(|| FaultParseError::BadValue {
                        input: input.to_owned(),
                        value: code.to_owned(),
                        what: "HTTP status",
                    })?;
                Ok(Fault::Status(
                    code,
                    body.unwrap_or_else(|| Fault::status_body(code)),
                ))
            }
            _ => Err(FaultParseError::UnknownKind {
                input: input.to_owned(),
                kind,
            }),
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Refuse => write!(f, "refuse"),
            Fault::Delay(d) => write!(f, "delay:{}", d.as_millis()),
            Fault::Status(code, body) => write!(f, "status:{code}:{body}"),
            Fault::Garbage => write!(f, "garbage"),
            Fault::CutStream { after_chunks } => write!(f, "cut:{after_chunks}"),
            Fault::StreamError { after_chunks } => write!(f, "error:{after_chunks}"),
        }
    }
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_kind() {
        assert_eq!("refuse".parse(), Ok(Fault::Refuse));
        assert_eq!("garbage".parse(), Ok(Fault::Garbage));
        assert_eq!(
            "delay:2000".parse(),
            Ok(Fault::Delay(Duration::from_millis(2000)))
        );
        assert_eq!("cut:3".parse(), Ok(Fault::CutStream { after_chunks: 3 }));
        assert_eq!(
            "error:3".parse(),
            Ok(Fault::StreamError { after_chunks: 3 })
        );
        assert_eq!(
            "status:500".parse(),
            Ok(Fault::Status(500, Fault::status_body(500)))
        );
        assert_eq!(
            "status:503:{\"a\":1}".parse(),
            Ok(Fault::Status(503, "{\"a\":1}".into()))
        );
    }

    #[test]
    fn display_round_trips() {
        for f in [
            Fault::Refuse,
            Fault::Garbage,
            Fault::Delay(Duration::from_millis(5)),
            Fault::CutStream { after_chunks: 2 },
            Fault::StreamError { after_chunks: 0 },
            Fault::Status(429, "slow down".into()),
        ] {
            assert_eq!(f.to_string().parse::<Fault>(), Ok(f));
        }
    }

    #[test]
    fn rejects_bad_input() {
        assert!(matches!(
            "boom".parse::<Fault>(),
            Err(FaultParseError::UnknownKind { .. })
        ));
        assert!(matches!(
            "delay".parse::<Fault>(),
            Err(FaultParseError::MissingValue { .. })
        ));
        assert!(matches!(
            "cut:x".parse::<Fault>(),
            Err(FaultParseError::BadValue { .. })
        ));
        assert!(matches!(
            "status:70000".parse::<Fault>(),
            Err(FaultParseError::BadValue { .. })
        ));
    }
}
