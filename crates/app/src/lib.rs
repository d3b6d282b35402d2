//! The composition root of policy-serving: validated settings in, a running server out.
//!
//! This crate owns the one place that names the concrete implementations: the SGLang client, the
//! PRM and hint judges, the teacher, the external provider client, the sample store (embedded or
//! Redis), the JSONL records, the session buffer and the capture workers ([`parts`]), the
//! inspection page's history and routes ([`inspect`]), and the
//! start-up sequence around them ([`build_app`], [`spawn`], [`run`], [`shutdown_signal`], the
//! start-up log lines), with the start-up tokenizer rule ([`policy_tokenizer`]). The binary
//! (`serve`), its `demo` and `check` subcommands and the full-app tests use it; `ps-server` itself
//! knows only the traits, so embedding the router does not pull in redb, Redis or the records.
//! Nothing depends on this crate but those.

pub mod error;
pub mod inspect;
pub mod parts;
pub mod policy_tokenizer;
mod run;

pub use error::StartupError;
pub use parts::{
    Records, ask_policy_server, judge_backend, judge_backend_with, judge_tokenizer, opd_parts,
    open_store, options, policy_client, policy_tokenizer, provider_client, redis_config,
    redis_risks, scorer, teacher,
};
pub use policy_tokenizer::{PolicyTokenizer, Reported, TokenizerSource};
pub use run::{
    App, CAPTURE_QUEUE_CAPACITY, MAX_CAPTURE_WORKERS, Running, bind, build_app, build_app_with,
    build_full, client_auth_line, local_addr, local_base_url, run, serve, shutdown_signal, spawn,
    spawn_with, trainer_side_line, turn_type_line,
};
