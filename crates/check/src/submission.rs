//! Check 8: the submission state of a running proxy, from its `GET /health`. A proxy that is not
//! running is a skip, not a failure (check runs before `serve` as well as beside it).

use std::time::Duration;

use ps_config::Settings;
use serde_json::Value;

use crate::report::Outcome;
use crate::util::{body_message, error_chain, secs};

/// Longest wait for the proxy's `/health`.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(5);

/// The host to reach a proxy listening on `host`: loopback for a wildcard address, IPv6 in brackets.
fn reach_host(host: &str) -> String {
    let h = host.trim().trim_start_matches('[').trim_end_matches(']');
    match h {
        "0.0.0.0" | "" => "127.0.0.1".to_owned(),
        "::" => "[::1]".to_owned(),
        h if h.contains(':') => format!("[{h}]"),
        h => h.to_owned(),
    }
}

pub(crate) fn health_url(s: &Settings) -> String {
    format!(
        "http://{}:{}/health",
        reach_host(&s.server.host),
        s.server.port
    )
}

pub(crate) async fn check(s: &Settings) -> Outcome {
    if s.server.port == 0 {
        return Outcome::skip(
            "server.port = 0 (a free port is picked at start), so there is no fixed address to ask",
        );
    }
    let url = health_url(s);
    let http = match ps_http::client(HEALTH_TIMEOUT) {
        Ok(h) => h,
        Err(e) => {
            return Outcome::fail(
                format!("cannot build an HTTP client: {}", error_chain(&e)),
                "check the machine's TLS set-up",
            );
        }
    };
    let exchange = async {
        let resp = http.get(&url).send().await?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await?;
        Ok::<_, reqwest::Error>((status, bytes))
    };
    let (status, bytes) = match tokio::time::timeout(HEALTH_TIMEOUT, exchange).await {
        Ok(Ok(parts)) => parts,
        Ok(Err(e)) if ps_http::classify(&e) == ps_http::Failure::Connect => {
            return Outcome::skip(format!(
                "the proxy is not running (nothing listens at {url})"
            ));
        }
        Err(_) => {
            return Outcome::fail(
                format!(
                    "something at {url} accepted the connection but did not answer within {}",
                    secs(HEALTH_TIMEOUT)
                ),
                "check what listens on server.host:server.port",
            );
        }
        Ok(Err(e)) => {
            return Outcome::fail(
                format!("the call to {url} failed: {}", error_chain(&e)),
                "check what listens on server.host:server.port",
            );
        }
    };
    let parsed: Option<Value> = serde_json::from_slice(&bytes).ok();
    let enabled = parsed
        .as_ref()
        .and_then(|v| v.get("submission_enabled"))
        .and_then(Value::as_bool);
    let Some(enabled) = enabled.filter(|_| status == 200) else {
        return Outcome::fail(
            format!(
                "{url} answered HTTP {status} without submission_enabled ({}): another service \
                 holds the port",
                body_message(&bytes)
            ),
            format!(
                "stop the other service, or move the proxy with server.port (now {})",
                s.server.port
            ),
        );
    };
    let resume = url.trim_end_matches("/health").to_owned() + "/v1/rollout/resume";
    if !enabled {
        return Outcome::fail(
            format!(
                "submission is paused at {url}: the proxy answers chats but no sample reaches the \
                 trainer (the trainer paused it, or server.submission_enabled = false)"
            ),
            format!(
                "POST {resume}{} (or let the trainer resume it)",
                if s.server.admin_key_env.is_some() {
                    " with the admin key (server.admin_key_env) as Bearer token"
                } else {
                    ""
                }
            ),
        );
    }
    let mut detail = format!("the proxy at {url} reports submission enabled");
    if let Some(up) = parsed.as_ref().and_then(|v| v.get("upstream"))
        && up.get("reachable").and_then(Value::as_bool) == Some(false)
    {
        detail.push_str("; it reports its SGLang upstream unreachable");
    }
    Outcome::ok(detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_hosts_are_reached_on_loopback() {
        assert_eq!(reach_host("0.0.0.0"), "127.0.0.1");
        assert_eq!(reach_host("::"), "[::1]");
        assert_eq!(reach_host("[::]"), "[::1]");
        assert_eq!(reach_host("::1"), "[::1]");
        assert_eq!(reach_host("10.0.0.2"), "10.0.0.2");
        let mut s = Settings::default();
        s.server.host = "0.0.0.0".into();
        s.server.port = 30000;
        assert_eq!(health_url(&s), "http://127.0.0.1:30000/health");
    }
}
