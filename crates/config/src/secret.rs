//! Secrets: read from the environment (never from files, except the literal `sglang.api_key`),
//! through a lookup closure so callers and tests choose the environment; and the helpers that keep
//! them out of printed text (URL passwords, values that cannot be variable names).
//!
//! A leaf of this crate: it knows only [`ConfigError`], not the settings that name the variables
//! (their resolution is `keys.rs`, their printing `redact.rs`, their validation `validate.rs`).

use crate::error::ConfigError;

/// An environment lookup: the value of a variable, or `None` when it is not set.
pub type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Looks a variable up in the real process environment (non-UTF-8 values count as unset).
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The legacy variable whose value, in the reference server, is the Bearer key clients of the
/// proxy must send. Honoured only when `server.api_key_env` is unset.
pub const LEGACY_CLIENT_KEY_ENV: &str = "SGLANG_API_KEY";

/// What a secret is replaced with (the same text a [`Secret`] prints).
pub const REDACTED: &str = ps_core::secret::REDACTED;
/// [`REDACTED`] as a JSON string.
pub(crate) const REDACTED_JSON: &str = "\"<redacted>\"";

/// Re-exported: the type every API key travels in, from here to the header that sends it.
pub use ps_core::Secret;

/// Reads the secret held by the variable `var`, which the key `named_by` (e.g.
/// `provider.api_key_env`) names. Unset or empty variables are errors naming both.
pub fn resolve_secret(
    named_by: &str,
    var: &str,
    env: EnvLookup<'_>,
) -> Result<Secret, ConfigError> {
    match env(var) {
        None => Err(ConfigError::MissingSecret {
            key: named_by.to_owned(),
            var: var.to_owned(),
        }),
        Some(v) if v.trim().is_empty() => Err(ConfigError::EmptySecret {
            key: named_by.to_owned(),
            var: var.to_owned(),
        }),
        Some(v) => Ok(Secret::new(v, format!("environment variable {var}"))),
    }
}

/// As [`resolve_secret`] for an optional variable name: `Ok(None)` when `var` is `None`.
pub fn resolve_optional_secret(
    named_by: &str,
    var: Option<&str>,
    env: EnvLookup<'_>,
) -> Result<Option<Secret>, ConfigError> {
    var.map(|v| resolve_secret(named_by, v, env)).transpose()
}

/// The URL with any password replaced by `redacted` (`<` and `>` would be percent-encoded). Text
/// that is not an http(s) URL is returned unchanged unless it contains `@` (it may then hold
/// credentials), in which case it is redacted whole.
pub(crate) fn redact_url(text: &str) -> String {
    match url::Url::parse(text) {
        Ok(mut url) if url.password().is_some() => {
            if url.set_password(Some("redacted")).is_ok() {
                url.to_string()
            } else {
                REDACTED.to_owned()
            }
        }
        Ok(url) if matches!(url.scheme(), "http" | "https") => text.to_owned(),
        // Not an http(s) URL: it may still hold credentials before an `@`.
        _ if text.contains('@') => REDACTED.to_owned(),
        _ => text.to_owned(),
    }
}

/// Whether `s` can name an environment variable: `[A-Za-z_][A-Za-z0-9_]*`.
pub(crate) fn is_var_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(redact_url("http://h:1/x"), "http://h:1/x");
        assert_eq!(redact_url("http://u:p@h/x"), "http://u:redacted@h/x");
        assert_eq!(redact_url("http://u@h/x"), "http://u@h/x");
        assert_eq!(redact_url("not a url"), "not a url");
        assert_eq!(redact_url("u:p@h"), REDACTED);
    }

    #[test]
    fn var_names() {
        assert!(is_var_name("TAOTOKEN_API_KEY"));
        assert!(is_var_name("_x1"));
        assert!(!is_var_name(""));
        assert!(!is_var_name("1ABC"));
        assert!(!is_var_name("sk-abc"));
        assert!(!is_var_name("A B"));
    }

    #[test]
    fn redacted_json_is_redacted_quoted() {
        assert_eq!(REDACTED_JSON, format!("\"{REDACTED}\""));
    }
}
