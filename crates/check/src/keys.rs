//! Check 1: every variable an active feature's `*_api_key_env` names is set and non-empty. Variables
//! are listed by name; values are never read into the report.

use ps_config::{
    ConfigError, EnvLookup, LEGACY_CLIENT_KEY_ENV, PrmBackend, Settings, resolve_secret,
};

use crate::report::Outcome;

/// One variable an active feature needs: the key naming it, the variable, what it is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyUse {
    pub key: &'static str,
    pub var: String,
    pub role: &'static str,
}

/// The variables the active features need, as [`Settings::check_secrets`] resolves them.
pub(crate) fn key_uses(s: &Settings) -> Vec<KeyUse> {
    let mut uses = Vec::new();
    let mut add = |key: &'static str, var: Option<&String>, role: &'static str| {
        if let Some(var) = var {
            uses.push(KeyUse {
                key,
                var: var.clone(),
                role,
            });
        }
    };
    add(
        "server.api_key_env",
        s.server.api_key_env.as_ref(),
        "the key clients must send",
    );
    add(
        "server.admin_key_env",
        s.server.admin_key_env.as_ref(),
        "the rollout admin key",
    );
    add(
        "sglang.api_key_env",
        s.sglang.api_key_env.as_ref(),
        "the SGLang key",
    );
    if s.provider_in_use() {
        let role = match (
            s.prm.enabled && s.prm.backend == PrmBackend::Provider,
            s.opd_active() && s.opd.hint_backend == PrmBackend::Provider,
        ) {
            (true, true) => "the provider key for the PRM and the hint judge",
            (true, false) => "the provider key for the PRM",
            _ => "the provider key for the hint judge",
        };
        add(
            "provider.api_key_env",
            s.provider.api_key_env.as_ref(),
            role,
        );
    }
    if s.opd_active() {
        if s.teacher.api_key_env.is_none() && s.teacher_uses_provider() {
            add(
                "provider.api_key_env",
                s.provider.api_key_env.as_ref(),
                "the provider key for the teacher",
            );
        } else {
            add(
                "teacher.api_key_env",
                s.teacher.api_key_env.as_ref(),
                "the teacher key",
            );
        }
    }
    uses
}

pub(crate) fn check(s: &Settings, env: EnvLookup<'_>) -> Outcome {
    let uses = key_uses(s);
    let mut present = Vec::new();
    let mut problems = Vec::new();
    let mut seen: Vec<(&str, &str)> = Vec::new();
    for u in &uses {
        if seen.contains(&(u.key, u.var.as_str())) {
            continue;
        }
        seen.push((u.key, u.var.as_str()));
        match resolve_secret(u.key, &u.var, env) {
            Ok(_) => present.push(format!("{} set ({}: {})", u.var, u.key, u.role)),
            Err(ConfigError::EmptySecret { .. }) => problems.push((
                u,
                format!(
                    "{} (named by {}: {}) is set but empty",
                    u.var, u.key, u.role
                ),
            )),
            Err(_) => problems.push((
                u,
                format!("{} (named by {}: {}) is not set", u.var, u.key, u.role),
            )),
        }
    }
    // Cross-check with the resolver `serve` runs at start-up, in case it needs more than listed here.
    let startup = s.check_secrets(env);
    if !problems.is_empty() {
        let cause = format!(
            "{} in this environment",
            problems
                .iter()
                .map(|(_, p)| p.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        );
        let fix = match problems.as_slice() {
            [(u, _)] => format!(
                "export {} (for example in env.sh) in the environment the server starts in, or \
                 point {} at the variable that holds the key",
                u.var, u.key
            ),
            _ => "export each variable (for example in env.sh) in the environment the server \
                  starts in, or point the *_api_key_env keys at the variables that hold the keys"
                .to_owned(),
        };
        return Outcome::fail(cause, fix);
    }
    if let Err(e) = startup {
        return Outcome::fail(
            e.to_string(),
            "export the variable it names, or correct the *_api_key_env key that names it",
        );
    }
    let legacy = s.server.api_key_env.is_none()
        && env(LEGACY_CLIENT_KEY_ENV).is_some_and(|v| !v.trim().is_empty());
    if legacy {
        present.push(format!(
            "{LEGACY_CLIENT_KEY_ENV} (legacy: the key clients must send) set"
        ));
    }
    if present.is_empty() {
        return Outcome::skip(
            "no active feature names a key variable (every *_api_key_env in use is unset)",
        );
    }
    Outcome::ok(present.join(", "))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use ps_config::Mode;

    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn nothing_named_is_a_skip() {
        let s = Settings::default();
        assert!(check(&s, &env_of(&[])).is_skip());
    }

    #[test]
    fn missing_and_empty_variables_are_named_never_valued() {
        let mut s = Settings::default();
        s.sglang.api_key_env = Some("MY_SGLANG_KEY".into());
        s.server.api_key_env = Some("MY_CLIENT_KEY".into());
        let env = env_of(&[("MY_CLIENT_KEY", "  ")]);
        let Outcome::Fail { cause, fix } = check(&s, &env) else {
            panic!("expected a failure")
        };
        assert!(
            cause.contains("MY_SGLANG_KEY (named by sglang.api_key_env"),
            "{cause}"
        );
        assert!(cause.contains("is not set"), "{cause}");
        assert!(
            cause.contains("MY_CLIENT_KEY") && cause.contains("empty"),
            "{cause}"
        );
        assert!(fix.contains("export"), "{fix}");
    }

    #[test]
    fn present_variables_are_listed_by_name() {
        let mut s = Settings::default();
        s.sglang.api_key_env = Some("MY_SGLANG_KEY".into());
        let env = env_of(&[("MY_SGLANG_KEY", "sk-secret-value")]);
        let Outcome::Ok { detail } = check(&s, &env) else {
            panic!("expected ok")
        };
        assert!(detail.contains("MY_SGLANG_KEY"), "{detail}");
        assert!(!detail.contains("sk-secret-value"), "{detail}");
    }

    #[test]
    fn the_provider_key_is_needed_only_when_the_provider_is_in_use() {
        let mut s = Settings::default();
        s.provider.api_key_env = Some("TAOTOKEN_API_KEY".into());
        assert!(key_uses(&s).is_empty());
        s.prm.backend = PrmBackend::Provider;
        assert_eq!(key_uses(&s)[0].var, "TAOTOKEN_API_KEY");
        // The teacher reached through the provider uses the provider's one key.
        s.prm.backend = PrmBackend::Sglang;
        s.server.mode = Mode::Opd;
        s.teacher.backend = ps_config::TeacherBackend::OpenaiCompletions;
        s.provider.base_url = Some("https://p/api".into());
        let uses = key_uses(&s);
        assert_eq!(uses.len(), 1);
        assert_eq!(uses[0].key, "provider.api_key_env");
        assert_eq!(uses[0].role, "the provider key for the teacher");
    }
}
