//! Printing the effective configuration without its secrets.

use serde_json::Value;

use crate::schema::Settings;
use crate::secret::{REDACTED, is_var_name, redact_url};

/// Keys holding URLs, whose passwords (`http://user:pass@host`) are redacted.
const URL_KEYS: &[(&str, &str)] = &[
    ("sglang", "chat_url"),
    ("prm", "router_url"),
    ("provider", "base_url"),
    ("teacher", "url"),
];

/// Keys naming environment variables: kept, unless the value cannot be a variable name (then it
/// may be a key pasted by mistake).
const VAR_NAME_KEYS: &[(&str, &str)] = &[
    ("server", "api_key_env"),
    ("sglang", "api_key_env"),
    ("provider", "api_key_env"),
    ("teacher", "api_key_env"),
];

impl Settings {
    /// The effective configuration as JSON, with literal secrets (`sglang.api_key`, URL passwords)
    /// replaced by `<redacted>`. Environment variable NAMES (`*.api_key_env`) are kept.
    pub fn redacted_json(&self) -> Value {
        let mut json = serde_json::to_value(self).unwrap_or(Value::Null);
        if let Some(key) = field(&mut json, "sglang", "api_key")
            && !key.is_null()
        {
            *key = Value::String(REDACTED.to_owned());
        }
        for (section, name) in URL_KEYS {
            if let Some(Value::String(url)) = field(&mut json, section, name) {
                *url = redact_url(url);
            }
        }
        if let Some(Value::String(url)) = json
            .get_mut("store")
            .and_then(|s| s.get_mut("redis"))
            .and_then(|r| r.get_mut("url"))
        {
            *url = redact_url(url);
        }
        for (section, name) in VAR_NAME_KEYS {
            if let Some(v) = field(&mut json, section, name)
                && v.as_str().is_some_and(|s| !is_var_name(s))
            {
                *v = Value::String(REDACTED.to_owned());
            }
        }
        json
    }

    /// [`Settings::redacted_json`], pretty-printed.
    pub fn redacted_json_pretty(&self) -> String {
        serde_json::to_string_pretty(&self.redacted_json()).unwrap_or_default()
    }
}

fn field<'a>(json: &'a mut Value, section: &str, name: &str) -> Option<&'a mut Value> {
    json.get_mut(section)?.get_mut(name)
}
