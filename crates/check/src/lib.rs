//! `policy-serving check`: runs the operator checklist against the services a configuration names
//! and reports one line per check — `ok`, `FAIL` or `skip`, the measured latency — and, for each
//! failure, the likely cause and the fix, naming the configuration key or environment variable.
//!
//! The checks, in order ([`CheckId`]): key variables present; how clients must authenticate (with
//! a curl line that works; `SGLANG_API_KEY=EMPTY` means `Bearer EMPTY`, as in the reference);
//! provider reachable and key accepted (one one-token chat call); SGLang `/health`; a chat round
//! trip with log-probs (and token ids when `sglang.return_token_ids`); the policy tokenizer `serve`
//! would use and why (`server.model_dir`, or the directory the policy server reports); the PRM
//! judge's `/generate` answering a parseable `\boxed{}`; the
//! teacher's log-probs whose echoed ids match the policy tokenizer's (a tokenizer mismatch is found
//! before training starts); record and store directories writable; the submission state of a running
//! proxy. A check whose feature is off is skipped with the reason. Each check has its own time
//! limit, derived from the configured timeout ([`CHECK_TIMEOUT_CAP`], [`JUDGE_TIMEOUT_CAP`]).
//!
//! This crate owns the checks and their wording only. The policy client, judge, teacher and tokenizer
//! are built by `ps_app` (the composition root), exactly as `serve` builds them, so a check exercises the same
//! URL, key, template and tokenizer. The provider probe is one plain chat call without retries: a
//! check must show the first 401 or 429, not hide it behind back-off. Secrets are never printed:
//! variables are named, values are not, and error bodies are scrubbed of the key. Nothing but the
//! binary depends on this crate.

mod dirs;
mod judge;
mod keys;
mod provider;
mod report;
mod sglang;
mod submission;
mod teacher;
mod util;

use std::time::{Duration, Instant};

use ps_app::policy_tokenizer::{PolicyTokenizer, Reported};
use ps_config::{EnvLookup, Settings};

pub use report::{CheckId, CheckReport, CheckResult, Outcome};
pub use teacher::TEACHER_PROBE_TOKENS;

/// Upper bound of each check's time limit: a check waits `min(configured timeout, this)`.
pub const CHECK_TIMEOUT_CAP: Duration = Duration::from_secs(10);

/// Upper bound of the judge check's time limit: `min(prm.timeout_sec, this)`. Longer than
/// [`CHECK_TIMEOUT_CAP`] because a judge generates up to `prm.max_new_tokens` before its box.
pub const JUDGE_TIMEOUT_CAP: Duration = Duration::from_secs(60);

/// `min(configured, CHECK_TIMEOUT_CAP)`.
pub(crate) fn limit(configured: Duration) -> Duration {
    configured.min(CHECK_TIMEOUT_CAP)
}

/// Runs every check in order against the services `settings` names, resolving secrets with `env`
/// (use [`ps_config::process_env`] for the real environment). Never fails: every problem is a
/// [`Outcome::Fail`] line of the report.
pub async fn run_checks(settings: &Settings, env: EnvLookup<'_>) -> CheckReport {
    let mut checks = Vec::with_capacity(CheckId::ALL.len());
    let mut timed = |id: CheckId, start: Instant, outcome: Outcome| {
        let latency = (!matches!(outcome, Outcome::Skip { .. })).then(|| start.elapsed());
        checks.push(CheckResult {
            id,
            outcome,
            latency,
        });
    };

    let t = Instant::now();
    timed(CheckId::KeyVariables, t, keys::check(settings, env));

    let t = Instant::now();
    let base = ps_app::local_base_url(&settings.server.host, settings.server.port);
    let auth = Outcome::ok(ps_app::client_auth_line(settings, env, &base));
    timed(CheckId::ClientAuth, t, auth);

    let t = Instant::now();
    timed(
        CheckId::TurnTypes,
        t,
        Outcome::ok(ps_app::turn_type_line(settings)),
    );

    let t = Instant::now();
    let outcome = provider::check(settings, env).await;
    timed(CheckId::Provider, t, outcome);

    let policy = sglang::client(settings, env);
    let t = Instant::now();
    let outcome = sglang::health(settings, &policy).await;
    timed(CheckId::SglangHealth, t, outcome);

    let t = Instant::now();
    let outcome = sglang::chat(settings, env, &policy).await;
    timed(CheckId::ChatLogprobs, t, outcome);

    // Found as `serve` finds it; the judge and teacher checks reuse it.
    let t = Instant::now();
    let (outcome, tokenizer) = policy_tokenizer(settings, &policy).await;
    timed(CheckId::PolicyTokenizer, t, outcome);
    let tokenizer = Some(tokenizer);

    let t = Instant::now();
    let outcome = judge::check(settings, tokenizer.as_ref()).await;
    timed(CheckId::PrmGenerate, t, outcome);

    let t = Instant::now();
    let outcome = teacher::check(settings, env, tokenizer.as_ref()).await;
    timed(CheckId::Teacher, t, outcome);

    let t = Instant::now();
    let outcome = dirs::check(settings).await;
    timed(CheckId::Directories, t, outcome);

    let t = Instant::now();
    let outcome = submission::check(settings).await;
    timed(CheckId::Submission, t, outcome);

    CheckReport { checks }
}

/// The policy tokenizer as `serve` finds it ([`ps_app::policy_tokenizer`]), or the failure
/// every check that needs it reports.
pub(crate) type TokenizerResult = Result<PolicyTokenizer, Outcome>;

/// Asks the policy server what it serves and applies `serve`'s rule: the check's outcome (which
/// tokenizer and why), and the tokenizer for the judge and teacher checks.
async fn policy_tokenizer(
    settings: &Settings,
    policy: &sglang::Policy,
) -> (Outcome, TokenizerResult) {
    let reported = match policy.built() {
        Some(client) => ps_app::ask_policy_server(settings, client).await,
        None => Reported::Unreachable {
            url: util::shown_url(&settings.sglang.chat_url),
            error: "the SGLang client could not be built (see the sglang checks)".to_owned(),
        },
    };
    let dir = settings.server.model_dir.clone();
    let chosen = tokio::task::spawn_blocking(move || {
        ps_app::policy_tokenizer::choose(dir.as_deref(), &reported)
    })
    .await;
    let fix = "set server.model_dir (or --model-dir) to the tokenizer directory of the model the \
               policy server serves (tokenizer.json and tokenizer_config.json)";
    let fail = match chosen {
        Ok(Ok(t)) => {
            let outcome = Outcome::ok(format!("{} ({} ids)", t.source, t.tokenizer.vocab_size()));
            return (outcome, Ok(t));
        }
        Ok(Err(e)) => Outcome::fail(util::error_chain(&e), fix),
        Err(e) => Outcome::fail(format!("loading the policy tokenizer failed: {e}"), fix),
    };
    (fail.clone(), Err(fail))
}
