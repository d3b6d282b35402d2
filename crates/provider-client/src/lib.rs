//! Calls to an external OpenAI-compatible chat provider for the judges (PRM votes and hint votes),
//! with one key from the environment, a shared concurrency cap, timeouts and retries.
//!
//! This crate owns the provider's side of `docs/upstream-protocols.md` section 4: the request
//! (`POST <base_url>/v1/chat/completions` with a Bearer key), the answer ([`ChatAnswer`]: content,
//! DeepSeek-style reasoning, finish reason, usage), the nested error body, and the retry policy of
//! openai-python (408, 409, 429 and 5xx, time-outs and connection errors are retried with an
//! exponential back-off of 0.5 s × 2^n capped at 8 s with jitter, or after the provider's
//! `retry-after-ms` / `Retry-After`; `x-should-retry` is obeyed; 400, 401, 403, 404 and
//! `insufficient_quota` are not retried). One [`ProviderClient`] serves every role and session and
//! its `max_concurrency` permits are held only while an attempt is in flight. [`ProviderJudge`]
//! plugs it into the judge transport port (`ps_core::ports::JudgeBackend`). Retries, 429s, give-ups and rejected keys are
//! counted under the names of `ps_core::metric_names`; the key is never logged nor put in a
//! message (errors name the variable that holds it).
//!
//! It depends on `ps-core` (and the shared HTTP helpers) only; not on the server, the configuration crate or
//! any web framework.

mod client;
mod error;
mod judge;
mod policy;

pub use client::{ChatAnswer, ProviderClient, ProviderConfig, Usage};
pub use error::{API_KEY_ENV_KEY, BASE_URL_KEY, ProviderError, TIMEOUT_KEY};
pub use judge::{JUDGE_PROVIDER, ProviderJudge};
pub use policy::{INITIAL_BACKOFF, JITTER, MAX_BACKOFF, MAX_RETRY_AFTER};
