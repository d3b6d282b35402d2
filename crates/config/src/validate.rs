//! Checks that need more than types: URLs, ranges, and how sections fit together. Each error
//! names the key, the value and what is expected; all problems are reported at once.

use serde::Serialize;

use crate::error::ConfigError;
use crate::schema::{Mode, PrmBackend, Settings, TeacherBackend};
use crate::secret::{REDACTED_JSON, is_var_name, redact_url};

impl Settings {
    /// Validates the whole configuration. [`crate::load`] calls it; call it again after changing
    /// a `Settings` by hand. Returns one error, or [`ConfigError::Many`] listing every problem.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut v = Checks::default();
        self.check_server(&mut v);
        self.check_sglang(&mut v);
        self.check_prm(&mut v);
        self.check_provider(&mut v);
        self.check_teacher(&mut v);
        self.check_opd(&mut v);
        self.check_logging(&mut v);
        if self.store.path.as_os_str().is_empty() {
            v.fail(
                "store.path",
                &self.store.path,
                "a directory path, not empty",
            );
        }
        self.check_redis(&mut v);
        v.positive("capture.max_queued_mib", self.capture.max_queued_mib);
        v.positive(
            "capture.max_held_experts_mib",
            self.capture.max_held_experts_mib,
        );
        v.positive("capture.max_image_mib", self.capture.max_image_mib);
        v.positive(
            "capture.max_images_per_turn",
            self.capture.max_images_per_turn as u64,
        );
        v.positive("inspect.max_sessions", self.inspect.max_sessions as u64);
        v.positive(
            "inspect.max_turns_per_session",
            self.inspect.max_turns_per_session as u64,
        );
        ConfigError::from_list(v.errors)
    }

    fn check_redis(&self, v: &mut Checks) {
        let r = &self.store.redis;
        if self.store.kind == crate::schema::StoreKind::Redis {
            let scheme = url::Url::parse(&r.url).ok().map(|u| u.scheme().to_owned());
            if !matches!(scheme.as_deref(), Some("redis" | "rediss")) {
                v.fail(
                    "store.redis.url",
                    redact_url(&r.url),
                    "a redis:// or rediss:// URL, such as \"redis://127.0.0.1:6379\"",
                );
            }
        }
        let name_ok = |s: &str| {
            (1..=128).contains(&s.len())
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b':'))
        };
        for (key, value) in [
            ("store.redis.deployment", Some(&r.deployment)),
            ("store.redis.group", Some(&r.group)),
            ("store.redis.replica", r.replica.as_ref()),
        ] {
            if let Some(value) = value
                && !name_ok(value)
            {
                v.fail(key, value, "1 to 128 of A-Z a-z 0-9 _ . - :");
            }
        }
        v.positive("store.redis.claim_idle_sec", r.claim_idle_sec);
        v.positive("store.redis.timeout_sec", r.timeout_sec);
    }

    fn check_server(&self, v: &mut Checks) {
        let s = &self.server;
        if s.host.trim().is_empty() {
            v.fail(
                "server.host",
                &s.host,
                "an address to listen on, such as \"127.0.0.1\" or \"0.0.0.0\"",
            );
        }
        v.positive("server.session_timeout_sec", s.session_timeout_sec);
        v.positive("server.max_sessions", s.max_sessions as u64);
        v.positive("server.max_body_bytes", s.max_body_bytes);
        if s.served_model_name.trim().is_empty() {
            v.fail(
                "server.served_model_name",
                &s.served_model_name,
                "a non-empty model name",
            );
        }
        v.var_name("server.api_key_env", s.api_key_env.as_deref());
        v.var_name("server.admin_key_env", s.admin_key_env.as_deref());
        v.positive("server.max_messages", s.max_messages as u64);
        v.positive("server.max_turn_tokens", s.max_turn_tokens as u64);
        for (i, r) in s.ephemeral_message_rules.iter().enumerate() {
            let key = format!("server.ephemeral_message_rules[{i}]");
            if r.name.trim().is_empty() {
                v.fail(&format!("{key}.name"), &r.name, "a name for the logs");
            }
            if r.content_prefix.trim().is_empty() {
                v.fail(
                    &format!("{key}.content_prefix"),
                    &r.content_prefix,
                    "a non-empty prefix (a rule without one would name no message)",
                );
            }
            if r.role.as_deref().is_some_and(|role| role.trim().is_empty()) {
                v.fail(
                    &format!("{key}.role"),
                    &r.role,
                    "a role such as \"user\", or no role for any",
                );
            }
        }
        for (i, k) in s.agent_session_keys.iter().enumerate() {
            // A header name is an HTTP token (RFC 9110): a name with a space never matches.
            let token = |n: &str| {
                !n.is_empty()
                    && n.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
            };
            let named = match (k.strip_prefix("header:"), k.strip_prefix("body:")) {
                (Some(h), _) => token(h.trim()),
                (_, Some(b)) => !b.trim().is_empty(),
                _ => false,
            };
            if !named {
                v.fail(
                    &format!("server.agent_session_keys[{i}]"),
                    k,
                    "`header:NAME` or `body:KEY`, e.g. \"header:x-claude-code-session-id\"",
                );
            }
        }
        for (name, upstream) in &s.model_names {
            let key = format!("server.model_names.{name}");
            if name.trim().is_empty() {
                v.fail("server.model_names", name, "a model name a client asks for");
            } else if *name == s.served_model_name {
                v.fail(
                    &key,
                    name,
                    "another name than server.served_model_name, which is always served as it is",
                );
            } else if upstream.trim().is_empty() {
                v.fail(&key, upstream, "the model name the policy server serves");
            }
        }
        for (i, r) in s.side_turn_rules.iter().enumerate() {
            let key = format!("server.side_turn_rules[{i}]");
            if r.name.trim().is_empty() {
                v.fail(&format!("{key}.name"), &r.name, "a name for the logs");
            }
            for (field, value) in [
                ("system_prefix", &r.system_prefix),
                ("last_user_prefix", &r.last_user_prefix),
            ] {
                if value.as_deref().is_some_and(|p| p.trim().is_empty()) {
                    v.fail(&format!("{key}.{field}"), value, "a non-empty prefix");
                }
            }
            if r.model.as_deref().is_some_and(|m| m.trim().is_empty()) {
                v.fail(&format!("{key}.model"), &r.model, "a model name");
            }
            if r.system_prefix.is_none()
                && r.last_user_prefix.is_none()
                && !r.without_tools
                && r.max_tokens_at_most.is_none()
                && r.model.is_none()
            {
                v.fail(
                    &key,
                    &r.name,
                    "at least one condition (system_prefix, last_user_prefix, without_tools = true, max_tokens_at_most, model): a rule without one would make every request a side turn",
                );
            }
        }
    }

    fn check_sglang(&self, v: &mut Checks) {
        let s = &self.sglang;
        v.url(
            "sglang.chat_url",
            &s.chat_url,
            "the policy server's OpenAI-compatible chat URL, such as \
             \"http://127.0.0.1:30001/v1/chat/completions\"",
        );
        v.var_name("sglang.api_key_env", s.api_key_env.as_deref());
        v.positive("sglang.timeout_sec", s.timeout_sec);
        v.positive("sglang.connect_timeout_sec", s.connect_timeout_sec);
        v.positive("sglang.max_concurrency", s.max_concurrency as u64);
        v.positive("sglang.max_answer_mib", s.max_answer_mib);
    }

    fn check_prm(&self, v: &mut Checks) {
        let p = &self.prm;
        if p.num_votes < 1 {
            v.fail("prm.num_votes", p.num_votes, "at least 1 vote per turn");
        }
        v.positive("prm.timeout_sec", p.timeout_sec);
        v.positive("prm.max_backlog", p.max_backlog as u64);
        if !p.temperature.is_finite() || p.temperature < 0.0 {
            v.fail("prm.temperature", p.temperature, "a number ≥ 0");
        }
        if p.max_new_tokens < 1 {
            v.fail("prm.max_new_tokens", p.max_new_tokens, "at least 1 token");
        }
        if !p.enabled {
            return;
        }
        match p.backend {
            PrmBackend::Sglang => {
                v.url(
                    "prm.router_url",
                    &p.router_url,
                    "the judge's SGLang /generate URL, such as \"http://127.0.0.1:30002/generate\"",
                );
            }
            PrmBackend::Provider => {
                if self.prm_provider_model().is_none() {
                    v.missing(
                        "prm.model",
                        "a model name when prm.backend = \"provider\" (set prm.model or \
                         provider.prm_model)",
                    );
                }
                if self.provider.base_url.is_none() {
                    v.missing(
                        "provider.base_url",
                        "the provider root URL, required by prm.backend = \"provider\"",
                    );
                }
            }
        }
    }

    fn check_provider(&self, v: &mut Checks) {
        let p = &self.provider;
        if let Some(base) = &p.base_url
            && v.url(
                "provider.base_url",
                base,
                "the provider root URL, such as \"https://taotoken.net/api\"",
            )
        {
            // A root with or without a trailing /v1 reaches the same path; a full endpoint does not.
            let path = base.trim_end_matches('/');
            if path.ends_with("/completions") {
                let root = path
                    .trim_end_matches("/completions")
                    .trim_end_matches("/chat")
                    .trim_end_matches("/v1");
                v.fail(
                    "provider.base_url",
                    redact_url(base),
                    &format!(
                        "the provider root, without the endpoint path: write \"{}\" \
                         (/v1/chat/completions is appended to it)",
                        redact_url(root)
                    ),
                );
            }
        }
        v.var_name("provider.api_key_env", p.api_key_env.as_deref());
        v.positive("provider.max_concurrency", p.max_concurrency as u64);
        v.positive("provider.timeout_sec", p.timeout_sec);
        v.positive("provider.deadline_sec", p.deadline_sec);
        if self.opd_active() && self.opd.hint_backend == PrmBackend::Provider {
            if p.base_url.is_none() {
                v.missing(
                    "provider.base_url",
                    "the provider root URL, required when opd.hint_backend = \"provider\"",
                );
            }
            if p.hint_model.is_none() {
                v.missing(
                    "provider.hint_model",
                    "the hint judge's model name, required when opd.hint_backend = \"provider\"",
                );
            }
        }
    }

    fn check_teacher(&self, v: &mut Checks) {
        let t = &self.teacher;
        if t.backend == TeacherBackend::ProviderChat {
            v.fail(
                "teacher.backend",
                t.backend.as_str(),
                "\"sglang\" or \"openai_completions\": chat endpoints cannot return the log-probs \
                 of given tokens, which OPD needs. Point teacher.url at an SGLang /generate URL \
                 (backend \"sglang\") or a vLLM-style /v1/completions URL (backend \
                 \"openai_completions\")",
            );
        }
        let what = match t.backend {
            TeacherBackend::OpenaiCompletions => {
                "a vLLM-style completions URL, such as \"http://127.0.0.1:30003/v1/completions\""
            }
            _ => "an SGLang /generate URL, such as \"http://127.0.0.1:30003/generate\"",
        };
        match &t.url {
            Some(url) => {
                v.url("teacher.url", url, what);
            }
            None if self.opd_active() && self.teacher_url().is_none() => v.missing(
                "teacher.url",
                &format!(
                    "{what}; required when OPD is active (backend \"openai_completions\" also \
                     takes provider.base_url)"
                ),
            ),
            None => {}
        }
        if self.opd_active()
            && t.backend == TeacherBackend::OpenaiCompletions
            && self.teacher_model().is_none()
        {
            v.missing(
                "teacher.model",
                "the teacher's model name, required by backend \"openai_completions\" (or \
                 provider.teacher_model)",
            );
        }
        v.var_name("teacher.api_key_env", t.api_key_env.as_deref());
        v.positive("teacher.max_concurrency", t.max_concurrency as u64);
        v.positive("teacher.timeout_sec", t.timeout_sec);
    }

    fn check_opd(&self, v: &mut Checks) {
        let mode = self.server.mode;
        if let Some(enabled) = self.opd.enabled
            && enabled != mode.includes_opd()
        {
            v.fail(
                "opd.enabled",
                enabled,
                &format!(
                    "a value agreeing with server.mode = \"{mode}\": set server.mode to {} or \
                     remove opd.enabled",
                    if enabled {
                        "\"opd\" or \"combine\""
                    } else {
                        "\"rl\""
                    }
                ),
            );
        }
        if mode == Mode::Combine && self.opd.top_k > 0 {
            v.fail(
                "opd.top_k",
                self.opd.top_k,
                "0 in combine mode: its RL-only samples have no teacher top-K, and the trainer takes \
                 the fields of a batch from its first sample; use server.mode = \"opd\" for top-K",
            );
        }
        if mode == Mode::Combine && !self.prm.enabled {
            v.fail(
                "prm.enabled",
                false,
                "true in combine mode: every turn needs PRM eval votes",
            );
        }
        if self.opd_active() && self.opd.eval_votes_enabled() && !self.prm.enabled {
            v.fail(
                "opd.eval_mode",
                self.opd.eval_mode.original(),
                "a mode without PRM evaluation votes (such as \"none\"), since prm.enabled = \
                 false; or enable the PRM",
            );
        }
    }

    fn check_logging(&self, v: &mut Checks) {
        if self.logging.level_filter().is_none() {
            v.fail(
                "logging.level",
                &self.logging.level,
                "one of trace, debug, info, warn (or warning), error, in any case",
            );
        }
    }
}

/// Collects validation errors.
#[derive(Default)]
struct Checks {
    errors: Vec<ConfigError>,
}

impl Checks {
    fn fail(&mut self, key: &str, value: impl Serialize, expected: &str) {
        let value = serde_json::to_string(&value).unwrap_or_else(|_| "?".to_owned());
        self.push(key, value, expected);
    }

    fn push(&mut self, key: &str, value: String, expected: &str) {
        self.errors.push(ConfigError::Invalid {
            key: key.to_owned(),
            value,
            expected: expected.to_owned(),
            origin: None,
        });
    }

    /// A required key that is unset.
    fn missing(&mut self, key: &str, expected: &str) {
        self.push(key, "(unset)".to_owned(), expected);
    }

    fn positive(&mut self, key: &str, value: u64) {
        if value == 0 {
            self.fail(key, value, "a value greater than 0");
        }
    }

    /// Checks an http(s) URL with a host; returns whether it is one.
    fn url(&mut self, key: &str, value: &str, what: &str) -> bool {
        match url::Url::parse(value) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => true,
            Ok(u) => {
                self.fail(
                    key,
                    redact_url(value),
                    &format!(
                        "an http:// or https:// URL (scheme is {}): {what}",
                        u.scheme()
                    ),
                );
                false
            }
            Err(e) => {
                self.fail(
                    key,
                    redact_url(value),
                    &format!("an http:// or https:// URL ({e}): {what}"),
                );
                false
            }
        }
    }

    /// `*.api_key_env` must be a variable NAME. The value is not echoed: it may be the key itself.
    fn var_name(&mut self, key: &str, value: Option<&str>) {
        if let Some(name) = value
            && !is_var_name(name)
        {
            self.push(
                key,
                REDACTED_JSON.to_owned(),
                "the NAME of an environment variable (letters, digits and _, such as \
                 \"TAOTOKEN_API_KEY\"), not the secret itself",
            );
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        Settings::default().validate().unwrap();
    }

    #[test]
    fn disabled_prm_skips_its_url() {
        let mut s = Settings::default();
        s.prm.router_url = String::new();
        assert!(s.validate().is_err());
        s.prm.enabled = false;
        s.validate().unwrap();
    }

    #[test]
    fn non_http_urls_are_rejected() {
        let mut s = Settings::default();
        s.sglang.chat_url = "ftp://host/x".into();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("scheme is ftp"), "{e}");
    }

    #[test]
    fn provider_prm_needs_model_and_base_url() {
        let mut s = Settings::default();
        s.prm.backend = PrmBackend::Provider;
        let e = s.validate().unwrap_err();
        assert_eq!(e.errors().len(), 2, "{e}");
        s.provider.prm_model = Some("m".into());
        s.provider.base_url = Some("https://p.example/api".into());
        s.validate().unwrap();
    }

    #[test]
    fn eval_votes_need_the_prm_in_opd() {
        let mut s = Settings::default();
        s.server.mode = crate::schema::Mode::Opd;
        s.teacher.url = Some("http://t/generate".into());
        s.provider.base_url = Some("https://p/api".into());
        s.provider.hint_model = Some("h".into());
        s.validate().unwrap();
        s.opd.eval_mode = crate::schema::EvalMode::from_bool(true);
        s.prm.enabled = false;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("opd.eval_mode = true"), "{e}");
    }
}
