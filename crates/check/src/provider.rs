//! Check 2: the external provider is reachable and accepts the key — one chat call with
//! `max_tokens: 1` per model in use, sent once (no retries: the check reports the first 401 or 429).

use std::time::Duration;

use ps_config::{ConfigError, EnvLookup, PrmBackend, Secret, Settings};
use serde_json::{Value, json};

use crate::report::Outcome;
use crate::util::{body_message, error_chain, refused, scrub, secs, shown_url};

/// The models the active features call on the provider, with the key that sets each.
fn models(s: &Settings) -> Vec<(&'static str, String)> {
    let mut out: Vec<(&'static str, String)> = Vec::new();
    if s.prm.enabled
        && s.prm.backend == PrmBackend::Provider
        && let Some(m) = s.prm_provider_model()
    {
        let key = if s.prm.model.is_some() {
            "prm.model"
        } else {
            "provider.prm_model"
        };
        out.push((key, m.to_owned()));
    }
    if s.opd_active()
        && s.opd.hint_backend == PrmBackend::Provider
        && let Some(m) = &s.provider.hint_model
        && !out.iter().any(|(_, seen)| seen == m)
    {
        out.push(("provider.hint_model", m.clone()));
    }
    out
}

/// How the key was resolved, for messages (never the value).
#[derive(Debug)]
enum Key {
    /// The value, and the variable it came from.
    Sent { value: Secret, var: String },
    /// `provider.api_key_env` is unset: no key is sent.
    NotConfigured,
    /// The variable is unset or empty: no key is sent.
    Missing { var: String, empty: bool },
}

impl Key {
    /// The key, for the header that sends it.
    fn secret(&self) -> Option<&Secret> {
        match self {
            Self::Sent { value, .. } => Some(value),
            _ => None,
        }
    }

    /// The key's text, for scrubbing echoes of it from messages.
    fn value(&self) -> Option<&str> {
        self.secret().map(Secret::expose)
    }
}

pub(crate) async fn check(s: &Settings, env: EnvLookup<'_>) -> Outcome {
    if !s.provider_in_use() {
        return Outcome::skip(
            "no active feature calls the provider (prm.backend and opd.hint_backend are not \
             \"provider\")",
        );
    }
    let (Some(url), Some(base)) = (
        s.provider.chat_completions_url(),
        s.provider.base_url.as_deref(),
    ) else {
        return Outcome::fail(
            "provider.base_url is unset but the provider is in use",
            "set provider.base_url to the provider root, such as https://taotoken.net/api",
        );
    };
    let models = models(s);
    if models.is_empty() {
        return Outcome::fail(
            "no model is configured for the provider",
            "set prm.model (or provider.prm_model) and provider.hint_model",
        );
    }
    let key = match s.provider_api_key(env) {
        Ok(Some(secret)) => Key::Sent {
            value: secret,
            var: s.provider.api_key_env.clone().unwrap_or_default(),
        },
        Ok(None) => Key::NotConfigured,
        Err(e) => Key::Missing {
            var: s.provider.api_key_env.clone().unwrap_or_default(),
            empty: matches!(e, ConfigError::EmptySecret { .. }),
        },
    };
    let limit = crate::limit(s.provider.timeout());
    let http = match ps_http::client(limit) {
        Ok(h) => h,
        Err(e) => {
            return Outcome::fail(
                format!("cannot build an HTTP client: {}", error_chain(&e)),
                "check the machine's TLS set-up",
            );
        }
    };
    let probe = Probe {
        s,
        http: &http,
        url: &url,
        base,
        key: &key,
        limit,
    };
    let mut passed = Vec::new();
    for (model_key, model) in &models {
        match probe.call(model_key, model).await {
            Ok(()) => passed.push(model.clone()),
            Err(fail) => return fail,
        }
    }
    let key_text = match &key {
        Key::Sent { var, .. } => format!("key from {var} accepted"),
        _ => "no key sent".to_owned(),
    };
    Outcome::ok(format!(
        "{} answered model {}; {key_text}",
        shown_url(&url),
        passed.join(", ")
    ))
}

/// Whether a 429 body is OpenAI's `insufficient_quota` (billing, not rate: waiting does not help).
fn is_quota(bytes: &[u8]) -> bool {
    serde_json::from_slice::<Value>(bytes).is_ok_and(|v| {
        ["/error/code", "/error/type"]
            .iter()
            .any(|p| v.pointer(p).and_then(Value::as_str) == Some("insufficient_quota"))
    })
}

/// Whether an error body is about the model (`error.code` such as `model_not_found`, or a message
/// naming the model sent) rather than the URL.
fn is_model_error(bytes: &[u8], model: &str) -> bool {
    let Ok(v) = serde_json::from_slice::<Value>(bytes) else {
        return false;
    };
    let code = v
        .pointer("/error/code")
        .and_then(Value::as_str)
        .unwrap_or_default();
    code.contains("model") || (!model.is_empty() && body_message(bytes).contains(model))
}

struct Probe<'a> {
    s: &'a Settings,
    http: &'a reqwest::Client,
    url: &'a str,
    base: &'a str,
    key: &'a Key,
    limit: Duration,
}

impl Probe<'_> {
    async fn call(&self, model_key: &str, model: &str) -> Result<(), Outcome> {
        let body = json!({
            "model": model,
            "messages": [{"role": "user", "content": "Reply with OK."}],
            "max_tokens": 1,
            "temperature": 0,
            "stream": false,
        });
        let req = ps_http::with_bearer(self.http.post(self.url).json(&body), self.key.secret());
        let exchange = async {
            let resp = req.send().await?;
            let status = resp.status();
            let retry_after = resp
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let bytes = resp.bytes().await?;
            Ok::<_, reqwest::Error>((status, retry_after, bytes))
        };
        let url = shown_url(self.url);
        let (status, retry_after, bytes) = match tokio::time::timeout(self.limit, exchange).await {
            Err(_) => return Err(self.timeout(&url)),
            Ok(Err(e)) if ps_http::classify(&e) == ps_http::Failure::Timeout => {
                return Err(self.timeout(&url));
            }
            Ok(Err(e)) => {
                let chain = scrub(&error_chain(&e), self.key.value());
                let connect = ps_http::classify(&e) == ps_http::Failure::Connect;
                let cause = if connect && refused(&chain) {
                    format!("nothing listens at {url} (connection refused)")
                } else if connect {
                    format!("cannot connect to the provider at {url}: {chain}")
                } else {
                    format!("the call to the provider at {url} failed: {chain}")
                };
                return Err(Outcome::fail(
                    cause,
                    format!(
                        "check provider.base_url (now {}; the root, /v1/chat/completions is \
                         appended) and the network path to it",
                        shown_url(self.base)
                    ),
                ));
            }
            Ok(Ok(parts)) => parts,
        };
        let message = scrub(&body_message(&bytes), self.key.value());
        let code = status.as_u16();
        match code {
            200..=299 => self.answer(&url, &bytes),
            401 | 403 => Err(self.refused_key(&url, code)),
            429 if is_quota(&bytes) => Err(Outcome::fail(
                format!(
                    "the provider at {url} says the account's quota is exhausted (HTTP 429 \
                     insufficient_quota): {message}"
                ),
                "add credit to the provider account, or put another account's key in the variable \
                 named by provider.api_key_env",
            )),
            429 => {
                let wait = retry_after.map_or_else(
                    || "no Retry-After given".to_owned(),
                    |v| match v.trim().parse::<u64>() {
                        Ok(n) => format!("Retry-After {n} s"),
                        Err(_) => format!("Retry-After {}", v.trim()),
                    },
                );
                Err(Outcome::fail(
                    format!(
                        "the provider at {url} rate-limited the call (HTTP 429, {wait}): {message}"
                    ),
                    format!(
                        "wait and run check again; if it persists, lower provider.max_concurrency \
                         (now {}) or raise the account's rate limit",
                        self.s.provider.max_concurrency
                    ),
                ))
            }
            404 if !is_model_error(&bytes, model) => Err(Outcome::fail(
                format!("no chat endpoint at {url} (HTTP 404: {message})"),
                format!(
                    "set provider.base_url to the provider root (now {}): /v1/chat/completions is \
                     appended, so do not end it with /v1/chat/completions",
                    shown_url(self.base)
                ),
            )),
            400..=499 => Err(Outcome::fail(
                format!(
                    "the provider at {url} rejected the call for model \"{model}\" (HTTP {code}: \
                     {message})"
                ),
                format!("check the model name in {model_key} (now \"{model}\")"),
            )),
            500..=599 => Err(Outcome::fail(
                format!("the provider at {url} failed (HTTP {code}: {message})"),
                format!(
                    "a provider-side error: run check again later (serve retries these up to \
                     provider.max_retries = {} times); if it persists, check provider.base_url",
                    self.s.provider.max_retries
                ),
            )),
            _ => Err(Outcome::fail(
                format!("the provider at {url} answered HTTP {code}: {message}"),
                "check provider.base_url",
            )),
        }
    }

    fn timeout(&self, url: &str) -> Outcome {
        Outcome::fail(
            format!(
                "the provider at {url} did not answer a one-token call within {}",
                secs(self.limit)
            ),
            format!(
                "check the network path to provider.base_url, or raise provider.timeout_sec (now \
                 {}) if the provider is just slow",
                self.s.provider.timeout_sec
            ),
        )
    }

    fn refused_key(&self, url: &str, code: u16) -> Outcome {
        match self.key {
            Key::Sent { var, .. } => Outcome::fail(
                format!(
                    "the provider at {url} refused the key from {var} (HTTP {code}, named by \
                     provider.api_key_env)"
                ),
                format!(
                    "put a valid key for this provider in {var}, or point provider.api_key_env at \
                     the variable that holds it"
                ),
            ),
            Key::Missing { var, empty } => Outcome::fail(
                format!(
                    "the provider at {url} needs a key (HTTP {code}) and none was sent: {var} \
                     (named by provider.api_key_env) is {}",
                    if *empty { "empty" } else { "not set" }
                ),
                format!("export {var} with the provider key before starting"),
            ),
            Key::NotConfigured => Outcome::fail(
                format!(
                    "the provider at {url} needs a key (HTTP {code}) and none was sent: \
                     provider.api_key_env is unset"
                ),
                "set provider.api_key_env to the NAME of the variable holding the key (such as \
                 TAOTOKEN_API_KEY) and export that variable",
            ),
        }
    }

    /// A 2xx answer must be an OpenAI chat completion.
    fn answer(&self, url: &str, bytes: &[u8]) -> Result<(), Outcome> {
        let parsed: Option<Value> = serde_json::from_slice(bytes).ok();
        let has_choices = parsed
            .as_ref()
            .and_then(|v| v.get("choices"))
            .and_then(Value::as_array)
            .is_some_and(|c| !c.is_empty());
        if has_choices {
            return Ok(());
        }
        Err(Outcome::fail(
            format!(
                "{url} answered, but not with an OpenAI chat completion (body: {})",
                scrub(&body_message(bytes), self.key.value())
            ),
            format!(
                "set provider.base_url to the OpenAI-compatible provider root (now {}; \
                 /v1/chat/completions is appended)",
                shown_url(self.base)
            ),
        ))
    }
}
