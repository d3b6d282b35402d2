//! Configuration of policy-serving: this crate owns loading, layering, validating and printing it.
//!
//! Layers, lowest first: the built-in defaults ([`defaults`]) < one settings file (JSON or TOML,
//! chosen by extension; the operators' `settings.json` loads unchanged, its `taotoken` section read
//! as `provider`; the operators' trainer-side `config.toml` loads too, its keys that concern this
//! server translated and its trainer-side keys kept aside, see [`TRAINER_FILE_KEYS`]) < the legacy operator variables of [`LEGACY_ENV`] < `POLICY_SERVING_*` variables
//! with `__` between section and key (`POLICY_SERVING_SERVER__PORT=8080`) < command-line
//! [`Overrides`]. [`load`] merges them with figment, extracts [`Settings`] (unknown keys are
//! errors) and runs [`Settings::validate`]; every error names the key, the value, where it came
//! from and what was expected.
//!
//! Secrets are never read from files (except the literal `sglang.api_key` for keyless local
//! servers): `*.api_key_env` keys name environment variables, resolved into [`Secret`]s through an
//! environment lookup closure the caller chooses ([`process_env`] for the real one).
//!
//! Modules point one way: `secret` (secret values and the redaction helpers), `dict`, `error` and
//! `defaults` are leaves; `schema` uses only those; `keys` (resolving the named secrets), `redact`
//! (printing), `validate` and `trainer_file` sit on them, and `load` on everything.
//!
//! Of this workspace it depends on `ps-core` alone, where the wire enums it parses live
//! (`ps_core::modes`: `PauseMode`, `TokenIdsMode`, `SessionInference`; `EngineSetting`,
//! `DefaultTurnType`), and re-exports them. It opens no connection and starts no runtime; the
//! composition crate (`ps-app`) turns the settings into running parts.

pub mod defaults;
mod dict;
mod error;
mod keys;
mod load;
mod redact;
mod schema;
mod secret;
mod trainer_file;
mod validate;

pub use error::ConfigError;
pub use load::{
    ENV_PREFIX, ENV_SEPARATOR, LEGACY_ENV, LEGACY_ENV_NOT_HONOURED, Overrides, ignored_legacy_env,
    load, load_with_env,
};
/// Re-exported: the type of `server.default_turn_type`, and of the turn types it chooses; the
/// type of `sglang.engine`.
pub use ps_core::{DefaultTurnType, EngineSetting, TurnType};
pub use schema::{
    CaptureSettings, EphemeralMessageRule, EvalMode, InspectSettings, LogFormat, LoggingSettings,
    Mode, OpdSettings, PauseMode, PrmBackend, PrmSettings, ProviderSettings, RedisStoreSettings,
    ServerSettings, SessionInference, Settings, SglangSettings, SideTurnRule, StoreKind,
    StoreSettings, TeacherBackend, TeacherSettings, TokenIdsMode,
};
pub use secret::{
    EnvLookup, LEGACY_CLIENT_KEY_ENV, REDACTED, Secret, process_env, resolve_optional_secret,
    resolve_secret,
};
pub use trainer_file::{Reader, TRAINER_FILE_KEYS, trainer_side_keys};
