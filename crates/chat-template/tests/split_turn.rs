//! `split_turn`, loading errors, template behaviour and the `tokenize` JSONL tool.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{MINI_TOKENIZER_JSON, config_with, render_kwargs, with_template};
use ps_chat_template::{ChatTemplateError, ChatTokenizer, TurnInput, tokenize_jsonl};
use serde_json::{Value, json};

fn split(
    tok: &ChatTokenizer,
    messages: &Value,
    tools: Option<&Value>,
    response: &Value,
) -> ps_chat_template::TurnTokens {
    tok.split_turn(&TurnInput {
        messages: messages.as_array().unwrap(),
        tools,
        response_message: response,
        template_kwargs: None,
    })
    .unwrap()
}

#[test]
fn split_turn_normalises_developer_lists_and_null_content() {
    let tok = ChatTokenizer::mini();
    let messages = json!([
        {"role": "developer", "content": [{"type": "text", "text": "Be"}, {"type": "image_url"}, {"type": "text", "text": "kind."}]},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]},
        {"role": "assistant", "content": null},
        {"role": "user", "content": "next"}
    ]);
    let response = json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"x": 1.0}}}
    ]});
    let t = split(&tok, &messages, None, &response);
    assert_eq!(
        t.prompt_text,
        "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n\
         <|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n"
    );
    assert!(t.prompt_is_prefix);
    assert_eq!(
        t.response_text,
        "<think>\n\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1.0}}\n</tool_call><|im_end|>\n"
    );
    assert_eq!(t.full_text, format!("{}{}", t.prompt_text, t.response_text));
    assert_eq!(t.prompt_ids, tok.encode(&t.prompt_text).unwrap());
    assert_eq!(t.response_ids, tok.encode(&t.response_text).unwrap());
    assert_eq!(*t.response_ids.last().unwrap(), 198); // "\n" after <|im_end|>
}

#[test]
fn response_text_is_all_of_full_text_when_prompt_is_not_a_prefix() {
    let tok = ChatTokenizer::mini();
    let messages =
        json!([{"role": "user", "content": "go"}, {"role": "assistant", "content": "partial"}]);
    let t = split(
        &tok,
        &messages,
        None,
        &json!({"role": "assistant", "content": " more"}),
    );
    assert!(!t.prompt_is_prefix);
    assert_eq!(t.response_text, t.full_text);
    assert_eq!(t.response_ids, tok.encode(&t.full_text).unwrap());
    assert!(t.prompt_text.ends_with("<|im_start|>assistant\n"));
}

#[test]
fn raise_exception_message_surfaces() {
    let tok = with_template("{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with a user turn') }}{% endif %}ok").unwrap();
    let err = tok
        .render(
            &[json!({"role": "assistant", "content": "x"})],
            None,
            true,
            None,
        )
        .unwrap_err();
    assert!(matches!(err, ChatTemplateError::Render { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("Conversation must start with a user turn"),
        "{err}"
    );
    assert_eq!(
        tok.render(&[json!({"role": "user", "content": "x"})], None, true, None)
            .unwrap(),
        "ok"
    );
    // The same error through split_turn.
    let err = tok
        .split_turn(&TurnInput {
            messages: &[json!({"role": "system", "content": "s"})],
            tools: None,
            response_message: &json!({"role": "assistant", "content": "a"}),
            template_kwargs: None,
        })
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("Conversation must start with a user turn"),
        "{err}"
    );
}

#[test]
fn syntax_errors_are_reported_at_load_time() {
    let err = with_template("{% if %}").unwrap_err();
    assert!(
        matches!(err, ChatTemplateError::TemplateSyntax { .. }),
        "{err:?}"
    );
    let err = with_template("{% for m in messages %}").unwrap_err();
    assert!(err.to_string().contains("chat_template"), "{err}");
}

#[test]
fn missing_and_corrupt_files_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let err = ChatTokenizer::from_dir(dir.path()).unwrap_err();
    assert!(matches!(err, ChatTemplateError::ReadFile { .. }), "{err:?}");
    let tok_path = dir.path().join("tokenizer.json");
    assert!(
        err.to_string().contains(&tok_path.display().to_string()),
        "{err}"
    );

    std::fs::write(&tok_path, "{ not a tokenizer").unwrap();
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        config_with(json!("x")),
    )
    .unwrap();
    let err = ChatTokenizer::from_dir(dir.path()).unwrap_err();
    assert!(
        matches!(err, ChatTemplateError::TokenizerJson { .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&tok_path.display().to_string()),
        "{err}"
    );

    std::fs::write(&tok_path, MINI_TOKENIZER_JSON).unwrap();
    let cfg_path = dir.path().join("tokenizer_config.json");
    std::fs::write(&cfg_path, "[1, 2").unwrap();
    let err = ChatTokenizer::from_dir(dir.path()).unwrap_err();
    assert!(
        matches!(err, ChatTemplateError::ConfigJson { .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&cfg_path.display().to_string()),
        "{err}"
    );

    std::fs::write(&cfg_path, r#"{"eos_token": "<|im_end|>"}"#).unwrap();
    let err = ChatTokenizer::from_files(&tok_path, &cfg_path).unwrap_err();
    assert!(
        matches!(err, ChatTemplateError::MissingChatTemplate { .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&cfg_path.display().to_string()),
        "{err}"
    );

    std::fs::write(&cfg_path, r#"{"eos_token": 5, "chat_template": "x"}"#).unwrap();
    let err = ChatTokenizer::from_files(&tok_path, &cfg_path).unwrap_err();
    assert!(err.to_string().contains("eos_token"), "{err}");
}

#[test]
fn from_dir_loads_and_chat_template_jinja_overrides_the_config() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), MINI_TOKENIZER_JSON).unwrap();
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        config_with(json!("from config")),
    )
    .unwrap();
    let tok = ChatTokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tok.render(&[], None, false, None).unwrap(), "from config");
    assert_eq!(
        tok.eos_token_id(),
        tok.encode("<|im_end|>").unwrap().first().copied()
    );
    std::fs::write(dir.path().join("chat_template.jinja"), "from file\n").unwrap();
    let tok = ChatTokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tok.render(&[], None, false, None).unwrap(), "from file");
}

#[test]
fn named_templates_pick_tool_use_with_tools_else_default() {
    let cfg = config_with(json!([
        {"name": "default", "template": "default:{{ tools | length if tools is not none else 'none' }}"},
        {"name": "tool_use", "template": "tool_use:{{ tools | length }}"}
    ]));
    let tok = ChatTokenizer::from_json_strs(MINI_TOKENIZER_JSON, &cfg).unwrap();
    assert_eq!(tok.render(&[], None, false, None).unwrap(), "default:none");
    assert_eq!(
        tok.render(&[], Some(&json!([{"a": 1}])), false, None)
            .unwrap(),
        "tool_use:1"
    );

    let cfg = config_with(json!([{"name": "tool_use", "template": "t"}]));
    let tok = ChatTokenizer::from_json_strs(MINI_TOKENIZER_JSON, &cfg).unwrap();
    assert!(matches!(
        tok.render(&[], None, false, None),
        Err(ChatTemplateError::NoDefaultTemplate { .. })
    ));
}

#[test]
fn context_matches_transformers() {
    // tools=None is passed as none (defined); bos_token=None is left out (undefined).
    let got = render_kwargs(
        "{{ tools is defined }} {{ tools is none }} {{ bos_token is defined }} {{ eos_token }} {{ pad_token }} {{ documents is none }}",
        json!({}),
    )
    .unwrap();
    assert_eq!(got, "True True False <|im_end|> <|endoftext|> True");
    // AddedToken objects and additional special tokens.
    let cfg = json!({
        "eos_token": {"content": "<|im_end|>", "lstrip": false, "special": true, "__type": "AddedToken"},
        "additional_special_tokens": ["<|im_start|>", {"content": "<|im_end|>"}],
        "chat_template": "{{ eos_token }}|{{ additional_special_tokens | join(',') }}|{{ enable_thinking }}"
    });
    let tok = ChatTokenizer::from_json_strs(MINI_TOKENIZER_JSON, &cfg.to_string()).unwrap();
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    let kwargs = json!({"enable_thinking": false});
    assert_eq!(
        tok.render(&[], None, false, kwargs.as_object()).unwrap(),
        "<|im_end|>|<|im_start|>,<|im_end|>|False"
    );
}

#[test]
fn jinja_features_used_by_chat_templates() {
    let template = "{%- for m in messages[::-1] %}{{ m.role }}{% if loop.index == 2 %}{% break %}{% endif %},{% endfor %}\
        |{{ 'a<think>b'.split('<think>')[-1] }}|{{ '\\n x \\n'.strip('\\n') }}|{{ 'abc'.startswith('ab') }}\
        {% generation %}|gen{% endgeneration %}|{{ strftime_now('%Y') | length }}";
    let tok = with_template(template).unwrap();
    let messages = [
        json!({"role": "user"}),
        json!({"role": "assistant"}),
        json!({"role": "tool"}),
    ];
    assert_eq!(
        tok.render(&messages, None, false, None).unwrap(),
        "tool,assistant|b| x |True|gen|4"
    );
}

#[test]
fn tokenize_jsonl_reports_bad_lines_and_continues() {
    let tok = ChatTokenizer::mini();
    let good = json!({
        "messages": [{"role": "user", "content": "hi"}],
        "response_message": {"role": "assistant", "content": "hello", "reasoning_content": null},
        "chat_template_kwargs": {"enable_thinking": false}
    });
    let input = format!(
        "{good}\n{{not json\n\n{}\n{}\n",
        json!({"messages": []}),
        json!({"messages": [{"role": "user", "content": "x"}], "tools": [], "response_message": {"role": "assistant", "content": "y"}})
    );
    let mut out = Vec::new();
    let stats = tokenize_jsonl(&tok, input.as_bytes(), &mut out).unwrap();
    assert_eq!((stats.lines, stats.ok, stats.errors), (4, 2, 2));
    let lines: Vec<Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4);

    let first = &lines[0];
    let keys: Vec<&str> = first
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "prompt_text",
            "full_text",
            "response_text",
            "prompt_is_prefix",
            "prompt_ids",
            "response_ids"
        ]
    );
    assert_eq!(
        first["prompt_text"],
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
    assert_eq!(first["response_text"], "hello<|im_end|>\n");

    assert_eq!(lines[1]["line"], 2);
    assert!(
        lines[1]["error"].as_str().unwrap().contains("invalid JSON"),
        "{}",
        lines[1]
    );
    assert_eq!(lines[2]["line"], 4);
    assert!(
        lines[2]["error"]
            .as_str()
            .unwrap()
            .contains("response_message"),
        "{}",
        lines[2]
    );
    assert_eq!(lines[3]["prompt_is_prefix"], true);
}

#[test]
fn tokenize_jsonl_template_errors_become_error_lines() {
    let tok = with_template("{{ raise_exception('nope: ' ~ messages | length) }}").unwrap();
    let input = json!({"messages": [], "response_message": {"role": "assistant", "content": ""}})
        .to_string();
    let mut out = Vec::new();
    let stats = tokenize_jsonl(&tok, input.as_bytes(), &mut out).unwrap();
    assert_eq!((stats.ok, stats.errors), (0, 1));
    let line: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(line["line"], 1);
    assert!(
        line["error"].as_str().unwrap().contains("nope: 0"),
        "{line}"
    );
}

#[test]
fn render_turn_after_a_known_prompt_renders_once_where_it_can_and_as_render_turn_otherwise() {
    let tok = ChatTokenizer::mini();
    let messages = json!([{"role": "user", "content": "hi"}]);
    let response = json!({"role": "assistant", "content": "Hello"});
    let input = TurnInput {
        messages: messages.as_array().unwrap(),
        tools: None,
        response_message: &response,
        template_kwargs: None,
    };
    let rendered = tok.render_turn(&input).unwrap();
    assert!(rendered.prompt_is_prefix);
    // The engine's prompt is ours: the same texts.
    let same = tok
        .render_turn_after(&input, Some(rendered.prompt_text.clone()))
        .unwrap();
    assert_eq!(same, rendered);
    // A prompt the whole render does not start with (another template's, a changed character):
    // the prompt is rendered, and the texts are render_turn's.
    let other = tok
        .render_turn_after(&input, Some("<|im_start|>system\nx<|im_end|>\n".into()))
        .unwrap();
    assert_eq!(other, rendered);
    // An engine whose prompt stops short of ours (a generation prompt without what ours adds):
    // the prompt is the engine's, and the response is the rest of the same whole render.
    let short = rendered
        .prompt_text
        .strip_suffix("assistant\n")
        .unwrap()
        .to_owned();
    let after_short = tok.render_turn_after(&input, Some(short.clone())).unwrap();
    assert_eq!(after_short.prompt_text, short);
    assert_eq!(after_short.full_text, rendered.full_text);
    assert_eq!(
        after_short.response_text,
        format!("assistant\n{}", rendered.response_text)
    );
}
