//! Resolving the keys the settings name: each `*_api_key_env` variable, looked up through an
//! [`EnvLookup`], into a [`Secret`].

use crate::error::ConfigError;
use crate::schema::Settings;
use crate::secret::{
    EnvLookup, LEGACY_CLIENT_KEY_ENV, Secret, resolve_optional_secret, resolve_secret,
};

impl Settings {
    /// The Bearer key clients of the proxy must send: the variable named by `server.api_key_env`
    /// (an error if it is unset), else the legacy `SGLANG_API_KEY` when set and non-empty, else none.
    pub fn client_api_key(&self, env: EnvLookup<'_>) -> Result<Option<Secret>, ConfigError> {
        if let Some(var) = &self.server.api_key_env {
            return resolve_secret("server.api_key_env", var, env).map(Some);
        }
        Ok(env(LEGACY_CLIENT_KEY_ENV)
            .filter(|v| !v.trim().is_empty())
            .map(|v| {
                Secret::new(
                    v,
                    format!("environment variable {LEGACY_CLIENT_KEY_ENV} (legacy)"),
                )
            }))
    }

    /// The key of the `/v1/rollout/*` endpoints: the variable named by `server.admin_key_env` (an
    /// error if it is unset), else none.
    pub fn admin_api_key(&self, env: EnvLookup<'_>) -> Result<Option<Secret>, ConfigError> {
        resolve_optional_secret(
            "server.admin_key_env",
            self.server.admin_key_env.as_deref(),
            env,
        )
    }

    /// The key sent to the SGLang policy server: the variable named by `sglang.api_key_env` (an
    /// error if it is unset), else the literal `sglang.api_key` unless empty, else none.
    pub fn sglang_api_key(&self, env: EnvLookup<'_>) -> Result<Option<Secret>, ConfigError> {
        if let Some(var) = &self.sglang.api_key_env {
            return resolve_secret("sglang.api_key_env", var, env).map(Some);
        }
        Ok(self
            .sglang
            .api_key
            .as_deref()
            .filter(|k| !k.is_empty())
            .map(|k| Secret::new(k, "sglang.api_key")))
    }

    /// The provider key: the variable named by `provider.api_key_env` (an error if it is unset),
    /// or none when no variable is named.
    pub fn provider_api_key(&self, env: EnvLookup<'_>) -> Result<Option<Secret>, ConfigError> {
        resolve_optional_secret(
            "provider.api_key_env",
            self.provider.api_key_env.as_deref(),
            env,
        )
    }

    /// The teacher key: the variable named by `teacher.api_key_env` (an error if it is unset), or
    /// none when no variable is named.
    pub fn teacher_api_key(&self, env: EnvLookup<'_>) -> Result<Option<Secret>, ConfigError> {
        if self.teacher.api_key_env.is_none() && self.teacher_uses_provider() {
            // The provider's one key serves every call made through it, the teacher's too.
            return resolve_optional_secret(
                "provider.api_key_env",
                self.provider.api_key_env.as_deref(),
                env,
            );
        }
        resolve_optional_secret(
            "teacher.api_key_env",
            self.teacher.api_key_env.as_deref(),
            env,
        )
    }

    /// Resolves every secret the active features need, reporting all missing variables at once.
    /// Call it at start-up so a missing key is named before the first 401.
    pub fn check_secrets(&self, env: EnvLookup<'_>) -> Result<(), ConfigError> {
        let mut errors = Vec::new();
        let mut keep = |r: Result<Option<Secret>, ConfigError>| {
            if let Err(e) = r {
                errors.push(e);
            }
        };
        keep(self.client_api_key(env));
        keep(self.admin_api_key(env));
        keep(self.sglang_api_key(env));
        if self.provider_in_use() {
            keep(self.provider_api_key(env));
        }
        if self.opd_active() {
            keep(self.teacher_api_key(env));
        }
        ConfigError::from_list(errors)
    }
}
