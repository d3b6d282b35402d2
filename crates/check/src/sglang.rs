//! Checks 3 and 4: the SGLang policy server's `/health`, and a tiny chat round trip that must carry
//! per-token log-probs (and the sampled token ids when `sglang.return_token_ids` is set).

use ps_app::StartupError;
use ps_config::{EnvLookup, Settings, TokenIdsMode};
use ps_sglang_client::{PolicyClient, SglangClient, SglangClientConfig, SglangError};
use serde_json::{Value, json};

use crate::report::Outcome;
use crate::util::{body_message, error_chain, refused, secs, shown_url};

/// The policy client `serve` builds, or why it could not be built.
pub(crate) struct Policy {
    client: Result<SglangClient, Outcome>,
    /// Set when the SGLang key variable is missing, so no key is sent (check 1 names it).
    key_missing: Option<String>,
}

/// Builds the client as `serve` does; when only the key variable is missing, builds it without a
/// key so that the health check still runs.
pub(crate) fn client(s: &Settings, env: EnvLookup<'_>) -> Policy {
    match ps_app::policy_client(s, env) {
        Ok(c) => Policy {
            client: Ok(c),
            key_missing: None,
        },
        Err(StartupError::Config(e)) => Policy {
            client: SglangClient::new(SglangClientConfig {
                chat_url: s.sglang.chat_url.clone(),
                api_key: None,
                timeout: s.sglang.timeout(),
                connect_timeout: s.sglang.connect_timeout(),
            })
            .map_err(|e| invalid_url(s, &e)),
            key_missing: Some(e.to_string()),
        },
        Err(e) => Policy {
            client: Err(Outcome::fail(
                format!("cannot build the SGLang client: {}", error_chain(&e)),
                "check sglang.chat_url",
            )),
            key_missing: None,
        },
    }
}

impl Policy {
    /// The client, when it could be built.
    pub(crate) fn built(&self) -> Option<&SglangClient> {
        self.client.as_ref().ok()
    }
}

fn invalid_url(s: &Settings, e: &SglangError) -> Outcome {
    Outcome::fail(
        format!(
            "sglang.chat_url = {} cannot be used: {e}",
            shown_url(&s.sglang.chat_url)
        ),
        "set sglang.chat_url to the policy server's chat URL, such as \
         http://127.0.0.1:30001/v1/chat/completions",
    )
}

/// `scheme://host:port/health` of the chat URL, for messages.
fn health_url(chat_url: &str) -> String {
    match url::Url::parse(chat_url) {
        Ok(mut u) => {
            u.set_path("/health");
            u.set_query(None);
            shown_url(u.as_str())
        }
        Err(_) => chat_url.to_owned(),
    }
}

/// The outcome of a transport-level failure (refused, timed out, broken) shared by both checks.
fn transport(s: &Settings, e: &SglangError, at: &str) -> Outcome {
    let chain = error_chain(e);
    let fix_url = format!(
        "start the SGLang policy server, or set sglang.chat_url (now {})",
        shown_url(&s.sglang.chat_url)
    );
    match e {
        SglangError::Connect { .. } if refused(&chain) => Outcome::fail(
            format!("nothing listens at {at} (connection refused)"),
            fix_url,
        ),
        SglangError::Connect { .. } => {
            Outcome::fail(format!("cannot connect to {at}: {chain}"), fix_url)
        }
        other => Outcome::fail(
            format!("the call to {at} failed: {}", error_chain(other)),
            fix_url,
        ),
    }
}

pub(crate) async fn health(s: &Settings, policy: &Policy) -> Outcome {
    let client = match &policy.client {
        Ok(c) => c,
        Err(fail) => return fail.clone(),
    };
    let url = health_url(&s.sglang.chat_url);
    let limit = crate::limit(s.sglang.timeout());
    match tokio::time::timeout(limit, client.health()).await {
        Ok(Ok(())) => Outcome::ok(format!("{url} answered 200")),
        Err(_) | Ok(Err(SglangError::Timeout { .. })) => Outcome::fail(
            format!("{url} did not answer within {}", secs(limit)),
            "check that SGLang is up and reachable at sglang.chat_url (a server still loading the \
             model may not answer yet)",
        ),
        Ok(Err(SglangError::Status { status: 503, .. })) => Outcome::fail(
            format!(
                "SGLang at {url} answered HTTP 503: it is still loading the model, or unhealthy"
            ),
            "wait until SGLang has loaded the model (see its log), then run check again",
        ),
        Ok(Err(SglangError::Status { status: 404, .. })) => Outcome::fail(
            format!("{url} answered HTTP 404: the server at sglang.chat_url has no /health"),
            "point sglang.chat_url at the SGLang policy server, such as \
             http://127.0.0.1:30001/v1/chat/completions",
        ),
        Ok(Err(SglangError::Status { status, .. })) => Outcome::fail(
            format!("SGLang at {url} answered HTTP {status}"),
            "check the SGLang server's log, and that sglang.chat_url points at it",
        ),
        Ok(Err(e)) => transport(s, &e, &url),
    }
}

/// The probe: a tiny non-streamed chat asking for log-probs (and token ids when configured).
fn probe_body(s: &Settings) -> Value {
    let mut body = json!({
        "model": s.server.served_model_name,
        "messages": [{"role": "user", "content": "Say OK."}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": false,
        "logprobs": true,
        "top_logprobs": 1,
    });
    if s.sglang.token_ids_mode() != TokenIdsMode::Retokenize
        && let Some(o) = body.as_object_mut()
    {
        o.insert("return_token_ids".into(), json!(true));
    }
    body
}

const TOKEN_IDS_FIX: &str = "SGLang from July 2026 on returns them (return_token_ids); or set \
     sglang.token_ids = \"auto\" to re-tokenize exactly when they are missing";

pub(crate) async fn chat(s: &Settings, env: EnvLookup<'_>, policy: &Policy) -> Outcome {
    let client = match &policy.client {
        Ok(c) => c,
        Err(fail) => return fail.clone(),
    };
    let url = shown_url(&s.sglang.chat_url);
    let limit = crate::limit(s.sglang.timeout());
    let answer = match tokio::time::timeout(limit, client.chat_json(&probe_body(s))).await {
        Err(_) | Ok(Err(SglangError::Timeout { .. })) => {
            return Outcome::fail(
                format!(
                    "{url} did not answer an 8-token chat within {}",
                    secs(limit)
                ),
                format!(
                    "SGLang may be overloaded or still loading; check its log, or raise \
                     sglang.timeout_sec (now {})",
                    s.sglang.timeout_sec
                ),
            );
        }
        Ok(Err(SglangError::Status { status, body, .. })) => {
            return status_failure(s, env, policy, &url, status, &body);
        }
        Ok(Err(SglangError::InvalidBody { detail, .. })) => {
            return Outcome::fail(
                format!("{url} answered with something that is not chat-completion JSON: {detail}"),
                "set sglang.chat_url to SGLang's OpenAI-compatible chat URL, such as \
                 http://127.0.0.1:30001/v1/chat/completions",
            );
        }
        Ok(Err(e)) => return transport(s, &e, &url),
        Ok(Ok(v)) => v,
    };
    let Some(choice) = answer.pointer("/choices/0") else {
        return Outcome::fail(
            format!("{url} answered without choices[0]"),
            "set sglang.chat_url to SGLang's OpenAI-compatible chat URL",
        );
    };
    let content = choice
        .pointer("/logprobs/content")
        .and_then(Value::as_array)
        .filter(|c| !c.is_empty() && c.iter().all(|e| e.get("logprob").is_some()));
    let Some(content) = content else {
        return Outcome::fail(
            format!(
                "{url} answered without per-token log-probs (choices[0].logprobs.content is \
                 missing or empty although the request asked for logprobs)"
            ),
            "point sglang.chat_url at an SGLang server (training samples need the log-prob of \
             every sampled token; this server ignores `logprobs: true`)",
        );
    };
    let mut detail = format!("{} tokens with log-probs", content.len());
    // Which id source this deployment will use (docs/internals.md, "Where a turn's ids come from").
    let mode = s.sglang.token_ids_mode();
    match (mode, ps_sglang_client::engine_ids(&answer)) {
        (TokenIdsMode::Retokenize, _) => detail.push_str(
            "; token ids: re-tokenized (sglang.token_ids = \"retokenize\": the engine is not asked)",
        ),
        (_, Some(ids)) => detail.push_str(&format!(
            "; token ids: from the engine ({}, {} ids): non-streamed turns are trained on the \
             engine's own ids, streamed ones re-tokenized",
            ids.field,
            ids.response.len()
        )),
        (TokenIdsMode::Engine, None) => {
            return Outcome::fail(
                format!(
                    "{url} answered without token ids (no response_token_ids, token_ids or sglext \
                     ids) although sglang.token_ids = \"engine\" needs them"
                ),
                TOKEN_IDS_FIX,
            );
        }
        (TokenIdsMode::Auto, None) => detail.push_str(
            "; token ids: re-tokenized (the engine answered without its ids: an SGLang build \
             before July 2026 or a router that strips them; samples stay exact)",
        ),
    }
    Outcome::ok(format!("{detail} from {url}"))
}

fn status_failure(
    s: &Settings,
    env: EnvLookup<'_>,
    policy: &Policy,
    url: &str,
    status: u16,
    body: &[u8],
) -> Outcome {
    let message = body_message(body);
    match status {
        401 | 403 => {
            let cause = match (&policy.key_missing, &s.sglang.api_key_env) {
                (Some(missing), _) => {
                    format!(
                        "SGLang at {url} refused the call (HTTP {status}): no key was sent, {missing}"
                    )
                }
                (None, Some(var)) => format!(
                    "SGLang at {url} refused the key from {var} (HTTP {status}, named by \
                     sglang.api_key_env)"
                ),
                (None, None) if s.sglang_api_key(env).ok().flatten().is_some() => {
                    format!("SGLang at {url} refused the literal sglang.api_key (HTTP {status})")
                }
                (None, None) => {
                    format!("SGLang at {url} needs a key (HTTP {status}) and none is configured")
                }
            };
            Outcome::fail(
                cause,
                "put the key SGLang was started with (--api-key) in the variable named by \
                 sglang.api_key_env (or in sglang.api_key for a keyless local set-up)",
            )
        }
        404 => Outcome::fail(
            format!("no chat endpoint at {url} (HTTP 404: {message})"),
            "set sglang.chat_url to the full chat URL, such as \
             http://127.0.0.1:30001/v1/chat/completions",
        ),
        400 | 422
            if s.sglang.token_ids_mode() != TokenIdsMode::Retokenize
                && message.contains("token_ids") =>
        {
            Outcome::fail(
                format!("SGLang at {url} rejected return_token_ids (HTTP {status}: {message})"),
                TOKEN_IDS_FIX,
            )
        }
        400..=499 => Outcome::fail(
            format!("SGLang at {url} rejected the probe chat (HTTP {status}: {message})"),
            format!(
                "check server.served_model_name (sent as the model, now \"{}\") and \
                 sglang.chat_url",
                s.server.served_model_name
            ),
        ),
        _ => Outcome::fail(
            format!("SGLang at {url} failed the probe chat (HTTP {status}: {message})"),
            "check the SGLang server's log",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_asks_for_what_is_checked() {
        let mut s = Settings::default();
        let b = probe_body(&s);
        assert_eq!(b["max_tokens"], 8);
        assert_eq!(b["logprobs"], true);
        assert_eq!(b["top_logprobs"], 1);
        assert_eq!(
            b["return_token_ids"], true,
            "auto asks the engine for its ids"
        );
        s.sglang.token_ids = TokenIdsMode::Retokenize;
        assert!(probe_body(&s).get("return_token_ids").is_none());
        assert_eq!(
            health_url("http://127.0.0.1:30001/v1/chat/completions?x=1"),
            "http://127.0.0.1:30001/health"
        );
    }
}
