//! The template side: reading `tokenizer_config.json` and compiling its chat template(s) into a
//! minijinja environment configured like transformers' Jinja2 sandbox.

use minijinja::syntax::SyntaxConfig;
use minijinja::{AutoEscape, Environment, Error, ErrorKind, Value};
use serde_json::{Map, Value as Json};

use crate::error::ChatTemplateError;
use crate::{pyjson, strftime};

/// The attributes transformers puts into the template context from `special_tokens_map`, in its order.
const SPECIAL_TOKEN_KEYS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// Environment name of a single (unnamed) chat template.
const SINGLE_TEMPLATE: &str = "chat_template";

/// What we use from `tokenizer_config.json`.
#[derive(Debug)]
pub(crate) struct TokenizerConfig {
    /// `(name, source)`; one entry named [`SINGLE_TEMPLATE`] for a plain string template.
    templates: Vec<(String, String)>,
    named: bool,
    /// Context variables from the special tokens map (only the ones set, as transformers does).
    pub special_tokens: Vec<(&'static str, Value)>,
    pub eos_token: Option<String>,
    pub clean_up_tokenization_spaces: bool,
}

/// A token given either as a string or as a serialised `AddedToken` (`{"content": ..}`).
fn token_content(origin: &str, key: &str, v: &Json) -> Result<Option<String>, ChatTemplateError> {
    match v {
        Json::Null => Ok(None),
        Json::String(s) => Ok(Some(s.clone())),
        Json::Object(o) => match o.get("content") {
            Some(Json::String(s)) => Ok(Some(s.clone())),
            _ => Err(ChatTemplateError::ConfigKey {
                origin: origin.to_owned(),
                key: key.to_owned(),
                message: "an AddedToken object needs a string `content`".into(),
            }),
        },
        other => Err(ChatTemplateError::ConfigKey {
            origin: origin.to_owned(),
            key: key.to_owned(),
            message: format!("expected a string or an AddedToken object, got {other}"),
        }),
    }
}

impl TokenizerConfig {
    /// Parses the config. `template_override` (the contents of a `chat_template.jinja` file) wins
    /// over the config's own `chat_template`, as in transformers.
    pub(crate) fn parse(
        origin: &str,
        json: &str,
        template_override: Option<String>,
    ) -> Result<Self, ChatTemplateError> {
        let cfg: Map<String, Json> =
            serde_json::from_str(json).map_err(|e| ChatTemplateError::ConfigJson {
                origin: origin.to_owned(),
                message: e.to_string(),
            })?;

        let mut special_tokens = Vec::new();
        let mut eos_token = None;
        for key in SPECIAL_TOKEN_KEYS {
            let Some(v) = cfg.get(key) else { continue };
            let Some(content) = token_content(origin, key, v)? else {
                continue;
            };
            if key == "eos_token" {
                eos_token = Some(content.clone());
            }
            if !content.is_empty() {
                special_tokens.push((key, Value::from(content)));
            }
        }
        if let Some(v) = cfg.get("additional_special_tokens") {
            let key = "additional_special_tokens";
            let list = match v {
                Json::Null => Vec::new(),
                Json::Array(items) => items
                    .iter()
                    .map(|t| token_content(origin, key, t).map(Option::unwrap_or_default))
                    .collect::<Result<Vec<_>, _>>()?,
                other => {
                    return Err(ChatTemplateError::ConfigKey {
                        origin: origin.to_owned(),
                        key: key.to_owned(),
                        message: format!("expected a list, got {other}"),
                    });
                }
            };
            if !list.is_empty() {
                special_tokens.push((key, Value::from(list)));
            }
        }

        let clean_up_tokenization_spaces = cfg
            .get("clean_up_tokenization_spaces")
            .and_then(Json::as_bool)
            .unwrap_or(false);

        let (templates, named) = match (template_override, cfg.get("chat_template")) {
            (Some(src), _) => (vec![(SINGLE_TEMPLATE.to_owned(), src)], false),
            (None, Some(Json::String(src))) => {
                (vec![(SINGLE_TEMPLATE.to_owned(), src.clone())], false)
            }
            (None, Some(Json::Array(items))) => {
                let mut templates = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    let name = item.get("name").and_then(Json::as_str);
                    let src = item.get("template").and_then(Json::as_str);
                    let (Some(name), Some(src)) = (name, src) else {
                        return Err(ChatTemplateError::ConfigKey {
                            origin: origin.to_owned(),
                            key: format!("chat_template[{i}]"),
                            message: "each named template needs string `name` and `template`"
                                .into(),
                        });
                    };
                    templates.push((name.to_owned(), src.to_owned()));
                }
                (templates, true)
            }
            (None, None | Some(Json::Null)) => {
                return Err(ChatTemplateError::MissingChatTemplate {
                    origin: origin.to_owned(),
                });
            }
            (None, Some(other)) => {
                return Err(ChatTemplateError::ConfigKey {
                    origin: origin.to_owned(),
                    key: "chat_template".into(),
                    message: format!("expected a string or a list of named templates, got {other}"),
                });
            }
        };

        Ok(Self {
            templates,
            named,
            special_tokens,
            eos_token,
            clean_up_tokenization_spaces,
        })
    }
}

/// Compiled chat template(s) and the choice between them.
#[derive(Debug)]
pub(crate) struct Templates {
    pub env: Environment<'static>,
    /// A template loops over a message's `content` ([`iterates_content`]): engines hand it content
    /// lists as they are ("openai" content format), not flattened.
    pub iterates_content: bool,
    /// Environment name of the template used when no better one applies.
    default: Option<String>,
    /// Environment name of the `tool_use` template, used when the request has tools.
    tool_use: Option<String>,
    names: Vec<String>,
}

impl Templates {
    pub(crate) fn compile(cfg: &TokenizerConfig) -> Result<Self, ChatTemplateError> {
        let mut env = new_env().map_err(|e| ChatTemplateError::TemplateSyntax {
            name: SINGLE_TEMPLATE.to_owned(),
            message: e.to_string(),
        })?;
        let mut default = None;
        let mut tool_use = None;
        let mut names = Vec::with_capacity(cfg.templates.len());
        for (name, src) in &cfg.templates {
            let env_name = if cfg.named {
                format!("{SINGLE_TEMPLATE}[{name}]")
            } else {
                name.clone()
            };
            env.add_template_owned(env_name.clone(), rewrite_generation_tags(src))
                .map_err(|e| ChatTemplateError::TemplateSyntax {
                    name: env_name.clone(),
                    message: e.to_string(),
                })?;
            if !cfg.named || name == "default" {
                default = Some(env_name.clone());
            } else if name == "tool_use" {
                tool_use = Some(env_name.clone());
            }
            names.push(name.clone());
        }
        Ok(Self {
            env,
            iterates_content: cfg.templates.iter().any(|(_, src)| iterates_content(src)),
            default,
            tool_use,
            names,
        })
    }

    /// The template transformers would pick: `tool_use` when the request has tools and the config
    /// has one, else `default`.
    pub(crate) fn select(&self, has_tools: bool) -> Result<&str, ChatTemplateError> {
        match (&self.tool_use, &self.default) {
            (Some(t), _) if has_tools => Ok(t),
            (_, Some(d)) => Ok(d),
            _ => Err(ChatTemplateError::NoDefaultTemplate {
                available: self.names.clone(),
            }),
        }
    }

    pub(crate) fn render(&self, name: &str, ctx: Value) -> Result<String, ChatTemplateError> {
        let render_err = |e: Error| ChatTemplateError::Render {
            name: name.to_owned(),
            message: error_message(&e),
        };
        let tmpl = self.env.get_template(name).map_err(render_err)?;
        tmpl.render(ctx).map_err(render_err)
    }
}

/// The error text plus its causes (minijinja wraps errors from filters and functions).
fn error_message(e: &Error) -> String {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}

/// An environment configured like transformers' `ImmutableSandboxedEnvironment(trim_blocks=True,
/// lstrip_blocks=True, extensions=[loopcontrols, generation])` with its `raise_exception`,
/// `strftime_now` and `tojson`.
fn new_env() -> Result<Environment<'static>, Error> {
    let mut env = Environment::new();
    let mut syntax = SyntaxConfig::builder();
    syntax.trim_blocks(true).lstrip_blocks(true);
    env.set_syntax(syntax.build()?);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(pyjson::python_formatter);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", |fmt: &str| {
        strftime::strftime(fmt, &strftime::Tm::now())
    });
    env.add_filter("tojson", pyjson::tojson_filter);
    Ok(env)
}

fn raise_exception(message: Value) -> Result<Value, Error> {
    let message = match message.as_str() {
        Some(s) => s.to_owned(),
        None => message.to_string(),
    };
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// transformers' `{% generation %}…{% endgeneration %}` extension only marks assistant spans and
/// renders its body unchanged; minijinja has no such tag, so it becomes `{% if true %}…{% endif %}`,
/// which keeps the whitespace-control markers and therefore the exact output.
fn rewrite_generation_tags(src: &str) -> String {
    if !src.contains("generation") {
        return src.to_owned();
    }
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(pos) = rest.find("{%") {
        let (before, tag) = rest.split_at(pos);
        out.push_str(before);
        let body_start = if tag[2..].starts_with(['-', '+']) {
            3
        } else {
            2
        };
        let after_ws = tag[body_start..].trim_start();
        let lead = &tag[..tag.len() - after_ws.len()];
        let word_len = after_ws
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after_ws.len());
        let word = &after_ws[..word_len];
        let replacement = match word {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        let tail = after_ws[word_len..].trim_start();
        let closes = tail.starts_with("%}") || tail.starts_with("-%}") || tail.starts_with("+%}");
        match replacement {
            Some(r) if closes => {
                out.push_str(lead);
                out.push_str(r);
                out.push(' ');
                rest = tail;
            }
            _ => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_become_if_true() {
        let src = "a{% generation %}b{%- endgeneration -%}c{% if x %}{% endif %}{{ generation }}";
        assert_eq!(
            rewrite_generation_tags(src),
            "a{% if true %}b{%- endif -%}c{% if x %}{% endif %}{{ generation }}"
        );
        assert_eq!(
            rewrite_generation_tags("{% generations %}"),
            "{% generations %}"
        );
    }
}

/// Whether a chat template loops over a message's content (`{% for part in message.content %}`,
/// `message['content']`, or a variable named `content`), vLLM's and SGLang's rule for the
/// "openai" content format, in which the engine hands the template each content list as it is
/// (text parts joined by the template, images where they stand) rather than flattened to a
/// string. vLLM walks the template's syntax tree for loops over the content of a name bound by a
/// loop over `messages`; this reads the same from the source (`tests/vl_prompt_parity.rs`
/// compares the two on the templates it renders).
pub(crate) fn iterates_content(source: &str) -> bool {
    // Names bound to the messages by a loop: `for message in messages`, `messages[::-1]`, ….
    let Ok(over_messages) = regex::Regex::new(r"\{%-?\s*for\s+(\w+)\s+in\s+messages\b") else {
        return false;
    };
    let names: Vec<&str> = over_messages
        .captures_iter(source)
        .filter_map(|c| c.get(1).map(|m| m.as_str()))
        .collect();
    let alternatives = names
        .iter()
        .map(|n| regex::escape(n))
        .chain(std::iter::once(String::new()))
        .collect::<Vec<_>>();
    alternatives.iter().any(|name| {
        let pattern = if name.is_empty() {
            // A loop over a variable named `content`.
            r"\{%-?\s*for\s+\w+\s+in\s+content\s*-?%\}".to_owned()
        } else {
            format!(r#"\{{%-?\s*for\s+\w+\s+in\s+{name}(\.content\b|\[\s*['"]content['"]\s*\])"#)
        };
        regex::Regex::new(&pattern).is_ok_and(|re| re.is_match(source))
    })
}

#[cfg(test)]
mod content_loop_tests {
    use super::iterates_content;

    #[test]
    fn loops_over_a_messages_content_are_found() {
        for yes in [
            "{% for message in messages %}{% for c in message.content %}{{ c.text }}{% endfor %}{% endfor %}",
            "{%- for m in messages -%}{%- for c in m['content'] -%}x{%- endfor -%}{%- endfor -%}",
            "{% for m in messages %}{% set content = m.content %}{% for p in content %}x{% endfor %}{% endfor %}",
        ] {
            assert!(iterates_content(yes), "{yes}");
        }
        for no in [
            "{% for message in messages %}{{ message.content }}{% endfor %}",
            "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% endif %}{% endfor %}",
            "{% for tool in tools %}{% for c in tool.content %}{% endfor %}{% endfor %}",
        ] {
            assert!(!iterates_content(no), "{no}");
        }
    }
}
