//! Check 5: the PRM judge's SGLang `/generate` answers the real judge prompt for a tiny turn with a
//! parseable `\boxed{}` value, through the same [`SglangJudge`] `serve` builds.

use std::sync::Arc;

use ps_app::StartupError;
use ps_config::{PrmBackend, Settings};
use ps_core::ports::JudgeInput;
use ps_judge::{JudgeError, judge_messages, parse_boxed_score};

use crate::TokenizerResult;
use crate::report::Outcome;
use crate::util::{error_chain, refused, secs, shown_url, tail};

/// `Ok` when something scores through the judge's `/generate` (the PRM with backend `sglang`, or the
/// OPD hint judge with backend `sglang`, which share `prm.router_url`); else why the check is skipped.
pub(crate) fn active(s: &Settings) -> Result<(), String> {
    let prm = s.prm.enabled && s.prm.backend == PrmBackend::Sglang;
    let hint = s.opd_active() && s.opd.hint_backend == PrmBackend::Sglang;
    if prm || hint {
        return Ok(());
    }
    Err(if !s.prm.enabled {
        "prm.enabled = false and no hint judge uses /generate".to_owned()
    } else {
        "prm.backend = \"provider\" (see the provider check)".to_owned()
    })
}

/// A tiny turn the judge can only score as helpful.
fn probe_input() -> JudgeInput {
    JudgeInput {
        response_text: "2 + 3 = 5.".to_owned(),
        next_state_text: "Correct, thank you. Now, what is 4 + 4?".to_owned(),
        next_state_role: "user".to_owned(),
    }
}

pub(crate) async fn check(s: &Settings, tokenizer: Option<&TokenizerResult>) -> Outcome {
    if let Err(reason) = active(s) {
        return Outcome::skip(reason);
    }
    let url = shown_url(&s.prm.router_url);
    // The judge renders with `prm.model_dir`, else the policy tokenizer.
    let policy_tok = match tokenizer {
        Some(Ok(t)) => t.tokenizer.clone(),
        Some(Err(fail)) if s.prm.model_dir.is_none() => return fail.clone(),
        _ => Arc::new(ps_chat_template::ChatTokenizer::mini()),
    };
    let owned = s.clone();
    let built =
        tokio::task::spawn_blocking(move || ps_app::judge_backend(&owned, &policy_tok)).await;
    let judge = match built {
        Ok(Ok(j)) => j,
        Ok(Err(StartupError::Tokenizer { dir, source })) => {
            return Outcome::fail(
                format!(
                    "cannot load the judge tokenizer from {}: {}",
                    dir.display(),
                    error_chain(&source)
                ),
                "set prm.model_dir to the judge's tokenizer directory (or unset it to use \
                 server.model_dir)",
            );
        }
        Ok(Err(e)) => {
            return Outcome::fail(
                format!("cannot set up the judge: {}", error_chain(&e)),
                "set prm.router_url to the judge's /generate URL, such as \
                 http://127.0.0.1:30002/generate",
            );
        }
        Err(e) => {
            return Outcome::fail(
                format!("setting up the judge failed: {e}"),
                "check prm.model_dir and prm.router_url",
            );
        }
    };
    let limit = s.prm.timeout().min(crate::JUDGE_TIMEOUT_CAP);
    let messages = judge_messages(&probe_input());
    let answer = match tokio::time::timeout(limit, judge.complete(&messages)).await {
        Ok(Ok(a)) => a,
        Err(_) | Ok(Err(JudgeError::Timeout { .. })) => {
            return Outcome::fail(
                format!("the judge at {url} gave no answer within {}", secs(limit)),
                format!(
                    "the judge may be overloaded, or slow to write up to prm.max_new_tokens (now \
                     {}) tokens: check its log, raise prm.timeout_sec (now {}) or lower \
                     prm.max_new_tokens",
                    s.prm.max_new_tokens, s.prm.timeout_sec
                ),
            );
        }
        Ok(Err(e)) => return failure(s, &url, &e),
    };
    match parse_boxed_score(&answer) {
        Some(v) => Outcome::ok(format!(
            "{url} answered \\boxed{{{v}}} ({} chars)",
            answer.chars().count()
        )),
        None => Outcome::fail(
            format!(
                "the judge at {url} answered without a \\boxed{{1}}, \\boxed{{-1}} or \
                 \\boxed{{0}} value (answer ends: \"{}\")",
                tail(&answer)
            ),
            format!(
                "raise prm.max_new_tokens (now {}) if the answer was cut before its box, or serve a \
                 judge model that follows the judge prompt at prm.router_url",
                s.prm.max_new_tokens
            ),
        ),
    }
}

fn failure(s: &Settings, url: &str, e: &JudgeError) -> Outcome {
    let fix_url = "start the judge or set prm.router_url";
    match e {
        JudgeError::Connect { detail, .. } if refused(detail) => Outcome::fail(
            format!("nothing listens at {url} (connection refused)"),
            fix_url,
        ),
        JudgeError::Connect { detail, .. } => {
            Outcome::fail(format!("cannot connect to {url}: {detail}"), fix_url)
        }
        JudgeError::Transport { detail, .. } => Outcome::fail(
            format!("the connection to the judge at {url} broke: {detail}"),
            fix_url,
        ),
        JudgeError::Status {
            status: 404, body, ..
        } => Outcome::fail(
            format!("{url} answered HTTP 404 ({body})"),
            "set prm.router_url to the judge's SGLang /generate URL, such as \
             http://127.0.0.1:30002/generate",
        ),
        JudgeError::Status { status, body, .. } => Outcome::fail(
            format!("the judge at {url} answered HTTP {status}: {body}"),
            "check the judge server's log, and that prm.router_url points at its /generate",
        ),
        JudgeError::InvalidBody { detail, .. } => Outcome::fail(
            format!(
                "the judge at {url} sent an answer that is not SGLang /generate JSON: {detail}"
            ),
            "set prm.router_url to SGLang's native /generate URL (not an OpenAI /v1 route)",
        ),
        JudgeError::Render { detail, .. } => Outcome::fail(
            format!("cannot render the judge prompt with the judge's chat template: {detail}"),
            if s.prm.model_dir.is_some() {
                "set prm.model_dir to a tokenizer directory whose tokenizer_config.json has a \
                 chat template"
            } else {
                "set prm.model_dir to the judge's tokenizer directory (the policy's, \
                 server.model_dir, is used now)"
            },
        ),
        other => Outcome::fail(
            format!("the judge at {url} failed: {}", error_chain(other)),
            "check prm.router_url",
        ),
    }
}
