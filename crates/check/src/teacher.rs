//! Check 6: the teacher returns a log-prob for each of the last tokens of a probe tokenized with the
//! policy tokenizer, and the ids it echoes are ours — a teacher whose tokenizer differs from the
//! policy's is found here, before training starts.

use ps_app::StartupError;
use ps_config::{Settings, TeacherBackend};
use ps_core::ports::Mismatch;
use ps_teacher_client::TeacherError;
use serde_json::json;

use crate::TokenizerResult;
use crate::report::Outcome;
use crate::util::{error_chain, refused, secs, shown_url};

/// How many trailing tokens of the probe the teacher scores (fewer if the probe is shorter).
pub const TEACHER_PROBE_TOKENS: usize = 8;

/// The configuration key holding the teacher URL in use.
fn url_key(s: &Settings) -> &'static str {
    if s.teacher.url.is_none() && s.teacher_uses_provider() {
        "provider.base_url"
    } else {
        "teacher.url"
    }
}

/// The variable holding the teacher key and the key naming it, if any.
fn key_var(s: &Settings) -> Option<(&'static str, &str)> {
    match (&s.teacher.api_key_env, &s.provider.api_key_env) {
        (Some(v), _) => Some(("teacher.api_key_env", v)),
        (None, Some(v)) if s.teacher_uses_provider() => Some(("provider.api_key_env", v)),
        _ => None,
    }
}

/// The probe's token ids: a short chat rendered with the policy's chat template and encoded as the
/// server encodes captured turns.
fn probe_ids(tok: &ps_chat_template::ChatTokenizer) -> Result<Vec<u32>, String> {
    let messages = [
        json!({"role": "user", "content": "What is 2 + 3?"}),
        json!({"role": "assistant", "content": "2 + 3 = 5."}),
    ];
    let text = tok
        .render(&messages, None, false, None)
        .unwrap_or_else(|_| "What is 2 + 3? 2 + 3 = 5.".to_owned());
    tok.encode(&text).map_err(|e| error_chain(&e))
}

pub(crate) async fn check(
    s: &Settings,
    env: ps_config::EnvLookup<'_>,
    tokenizer: Option<&TokenizerResult>,
) -> Outcome {
    if !s.opd_active() {
        return Outcome::skip(format!("OPD is off (server.mode = {})", s.server.mode));
    }
    let (tok, source) = match tokenizer {
        Some(Ok(t)) => (t.tokenizer.clone(), t.source.to_string()),
        Some(Err(fail)) => return fail.clone(),
        None => {
            return Outcome::fail(
                "the policy tokenizer was not loaded",
                "check server.model_dir",
            );
        }
    };
    let teacher = match ps_app::teacher(s, env) {
        Ok(t) => t,
        Err(StartupError::Config(e)) => {
            return Outcome::fail(
                format!("cannot call the teacher: {e}"),
                "export the variable named by the teacher's key setting (see the key variables \
                 check)",
            );
        }
        Err(e) => {
            return Outcome::fail(
                format!("cannot set up the teacher: {}", error_chain(&e)),
                format!(
                    "set {} to the teacher's URL: an SGLang /generate URL (teacher.backend = \
                     \"sglang\") or a vLLM-style /v1/completions URL (\"openai_completions\")",
                    url_key(s)
                ),
            );
        }
    };
    let owned = tok.clone();
    let ids = match tokio::task::spawn_blocking(move || probe_ids(&owned)).await {
        Ok(Ok(ids)) if ids.len() >= 2 => ids,
        Ok(Ok(ids)) => {
            return Outcome::fail(
                format!("the probe text has only {} tokens", ids.len()),
                "check server.model_dir",
            );
        }
        Ok(Err(e)) => {
            return Outcome::fail(
                format!("cannot tokenize the probe with the policy tokenizer: {e}"),
                "check server.model_dir",
            );
        }
        Err(e) => {
            return Outcome::fail(
                format!("tokenizing the probe failed: {e}"),
                "check server.model_dir",
            );
        }
    };
    let t = TEACHER_PROBE_TOKENS.min(ids.len() - 1);
    let top_k = s.opd.top_k;
    let limit = crate::limit(s.teacher.timeout());
    let url = shown_url(s.teacher_url().unwrap_or_default());
    let scored = match tokio::time::timeout(limit, teacher.score(&ids, t, top_k)).await {
        Ok(Ok(r)) => r,
        // The teacher's own error through the port; a timeout of the call or of the check alike.
        Ok(Err(e)) => match e.downcast_ref::<TeacherError>() {
            Some(TeacherError::Timeout { .. }) => return timed_out(s, &url, t, limit),
            Some(te) => return failure(s, &url, te),
            None => {
                return Outcome::fail(
                    format!("the teacher at {url} failed: {}", error_chain(&e)),
                    format!("check {} and teacher.backend", url_key(s)),
                );
            }
        },
        Err(_) => return timed_out(s, &url, t, limit),
    };
    if scored.log_probs.len() != t {
        return Outcome::fail(
            format!(
                "the teacher at {url} returned {} log-probs for {t} tokens",
                scored.log_probs.len()
            ),
            format!(
                "check teacher.backend (now \"{}\")",
                s.teacher.backend.as_str()
            ),
        );
    }
    let topk_text = if top_k > 0 {
        format!(" and top-{top_k}")
    } else {
        String::new()
    };
    if !scored.echo_verified {
        return Outcome::ok(format!(
            "{t} log-probs{topk_text} from {url}; the teacher does not echo token ids, so the \
             tokenizer match is NOT verified"
        ));
    }
    let ours = &ids[ids.len() - t..];
    match scored.check_alignment(ours) {
        Ok(()) => Outcome::ok(format!(
            "{t} log-probs{topk_text} from {url}; echoed ids match the policy tokenizer, {source}"
        )),
        Err(m) => mismatch(&url, &m, &source),
    }
}

fn mismatch(url: &str, m: &Mismatch, source: &str) -> Outcome {
    let id = |v: Option<u32>| v.map_or_else(|| "none".to_owned(), |v| v.to_string());
    let ours_note = format!("; our ids come from {source}");
    Outcome::fail(
        format!(
            "the teacher's tokenizer differs from the policy's (first differing position {}: ours \
             {}, the teacher's {}; {} tokens probed, {} echoed by {url}){ours_note}",
            m.first_position,
            id(m.ours),
            id(m.theirs),
            m.len_ours,
            m.len_theirs
        ),
        format!(
            "serve the teacher with the policy's tokenizer (same vocabulary and special tokens), \
             or set server.model_dir to the policy's tokenizer directory; until then every OPD \
             sample is dropped as {}",
            m.reason()
        ),
    )
}

/// The teacher did not score the probe within `limit`.
fn timed_out(s: &Settings, url: &str, t: usize, limit: std::time::Duration) -> Outcome {
    Outcome::fail(
        format!(
            "the teacher at {url} did not score {t} tokens within {}",
            secs(limit)
        ),
        format!(
            "check that the teacher is up at {}, or raise teacher.timeout_sec (now {})",
            url_key(s),
            s.teacher.timeout_sec
        ),
    )
}

fn failure(s: &Settings, url: &str, e: &TeacherError) -> Outcome {
    let key = url_key(s);
    match e {
        TeacherError::Connect { detail, .. } if refused(detail) => Outcome::fail(
            format!("nothing listens at {url} (connection refused)"),
            format!("start the teacher or set {key}"),
        ),
        TeacherError::Connect { detail, .. } | TeacherError::Transport { detail, .. } => {
            Outcome::fail(
                format!("cannot reach the teacher at {url}: {detail}"),
                format!("start the teacher or set {key}"),
            )
        }
        TeacherError::Unauthorized {
            status, key_sent, ..
        } => {
            let (cause, fix) = match (key_var(s), key_sent) {
                (Some((k, var)), true) => (
                    format!(
                        "the teacher at {url} refused the key from {var} (HTTP {status}, named by {k})"
                    ),
                    format!("put a valid key in {var}, or point {k} at the variable that holds it"),
                ),
                (Some((k, var)), false) => (
                    format!(
                        "the teacher at {url} needs a key (HTTP {status}) and none was sent ({var}, named by {k}, is not set)"
                    ),
                    format!("export {var} before starting"),
                ),
                (None, _) => (
                    format!(
                        "the teacher at {url} needs a key (HTTP {status}) and none is configured"
                    ),
                    "set teacher.api_key_env to the NAME of the variable holding the key"
                        .to_owned(),
                ),
            };
            Outcome::fail(cause, fix)
        }
        TeacherError::Status { status, body, .. } => Outcome::fail(
            format!("the teacher at {url} answered HTTP {status}: {body}"),
            format!(
                "check {key} and teacher.backend (now \"{}\"): an SGLang /generate URL needs \
                 \"sglang\", a vLLM-style /v1/completions URL \"openai_completions\"",
                s.teacher.backend.as_str()
            ),
        ),
        TeacherError::InvalidBody { detail, .. } => Outcome::fail(
            format!("the teacher at {url} sent an answer we cannot use: {detail}"),
            format!(
                "set teacher.backend to match the server at {key} (now \"{}\"): SGLang /generate \
                 is \"sglang\", vLLM /v1/completions is \"openai_completions\"",
                s.teacher.backend.as_str()
            ),
        ),
        TeacherError::MissingValue {
            field, position, ..
        } => Outcome::fail(
            format!("the teacher at {url} gave no {field} value for probe position {position}"),
            if s.teacher.backend == TeacherBackend::OpenaiCompletions {
                "serve the teacher with vLLM's prompt_logprobs support (every position needs a value)"
            } else {
                "use an SGLang build that returns input_token_logprobs for every position"
            },
        ),
        TeacherError::ShortTopK { got, k, .. } => Outcome::fail(
            format!("the teacher at {url} returned {got} top log-probs instead of {k}"),
            format!(
                "lower opd.top_k (now {k}) to what the teacher returns, or raise the teacher \
                 server's top-logprobs limit"
            ),
        ),
        other => Outcome::fail(
            format!("the teacher at {url} failed: {}", error_chain(other)),
            format!("check {key} and teacher.backend"),
        ),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_is_long_enough() {
        let tok = ps_chat_template::ChatTokenizer::mini();
        let ids = probe_ids(&tok).unwrap();
        assert!(ids.len() > TEACHER_PROBE_TOKENS, "{}", ids.len());
    }
}
