//! The teacher's input ids built from the turn's encoded prompt (`teacher_input_ids`) equal a full
//! encode of the teacher's input text, as the reference tokenizes it: with the mini model and (when
//! the fixtures are there) the real Qwen3 tokenizer and both templates; for hints holding special
//! characters and added-token text, tool calls and results, content lists, reasoning, a last user
//! message shaped like a tool response, no user message at all, template kwargs; for re-tokenized
//! turns (response text appended) and engine-id turns (the engine's ids appended); and for random
//! contents.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use proptest::prelude::*;
use ps_chat_template::{ChatTokenizer, TurnInput};
use ps_opd_judge::{TeacherResponse, teacher_input_ids, teacher_input_text};
use serde_json::{Map, Value, json};

/// Loaded once for every test and property case of this file.
fn tokenizers() -> &'static [ChatTokenizer] {
    static ALL: std::sync::OnceLock<Vec<ChatTokenizer>> = std::sync::OnceLock::new();
    ALL.get_or_init(load)
}

fn load() -> Vec<ChatTokenizer> {
    let mut all = vec![ChatTokenizer::mini()];
    let Some(dir) = ps_test_support::fixtures::qwen3_dir() else {
        return all;
    };
    for config in [
        "tokenizer_config.json",
        "tokenizer_config.qwen3-4b-thinking-2507.json",
    ] {
        all.push(
            ChatTokenizer::from_files(&dir.join("tokenizer.json"), &dir.join(config)).unwrap(),
        );
    }
    all
}

/// Checks one turn both ways (re-tokenized: the response text; engine ids: the response ids),
/// with the prompt encoded as capture encodes it. Returns the re-tokenized ids.
fn check(
    tok: &ChatTokenizer,
    messages: &[Value],
    tools: Option<&Value>,
    response: &Value,
    kwargs: Option<&Map<String, Value>>,
    hint: &str,
) -> Vec<u32> {
    let split = tok
        .split_turn(&TurnInput {
            messages,
            tools,
            response_message: response,
            template_kwargs: kwargs,
        })
        .unwrap();
    let prompt = tok.encoded_from(split.prompt_text.clone(), split.prompt_ids.clone());
    let response_enc = tok.encoded_from(split.response_text.clone(), split.response_ids.clone());

    let text =
        teacher_input_text(tok, messages, tools, hint, &split.response_text, kwargs).unwrap();
    let reference = tok.encode(&text).unwrap();
    let ids = teacher_input_ids(
        tok,
        messages,
        tools,
        hint,
        TeacherResponse::Text(&response_enc),
        kwargs,
        &prompt,
    )
    .unwrap();
    assert_eq!(
        ids, reference,
        "re-tokenized turn, hint {hint:?} ({tok:?})\n{text}"
    );

    let engine_response: Vec<u32> = vec![7, 8, 9];
    let text = teacher_input_text(tok, messages, tools, hint, "", kwargs).unwrap();
    let mut reference = tok.encode(&text).unwrap();
    reference.extend_from_slice(&engine_response);
    let ids = teacher_input_ids(
        tok,
        messages,
        tools,
        hint,
        TeacherResponse::EngineIds(&engine_response),
        kwargs,
        &prompt,
    )
    .unwrap();
    assert_eq!(ids, reference, "engine-id turn, hint {hint:?} ({tok:?})");
    ids
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "search", "description": "Search the code.",
         "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}},
        {"type": "function", "function": {"name": "run", "description": "Run a command.",
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}
    ])
}

/// An agent turn: the last user message is followed by a tool round, as OpenClaw sends it.
fn agent(last_user: Value) -> Vec<Value> {
    vec![
        json!({"role": "developer", "content": "You are a coding agent. Read before you write. ".repeat(10)}),
        json!({"role": "user", "content": "Why does the build fail?"}),
        json!({"role": "assistant", "content": "", "reasoning_content": "Run it first.",
               "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{\"cmd\": \"cargo build\"}"}}]}),
        json!({"role": "tool", "tool_call_id": "c1", "content": "error[E0432]: unresolved import `crate::splice`"}),
        json!({"role": "assistant", "content": "A module file is missing.", "reasoning_content": "E0432."}),
        last_user,
        json!({"role": "assistant", "content": [{"type": "text", "text": "Searching."}],
               "tool_calls": [{"id": "c2", "type": "function", "function": {"name": "search", "arguments": "{\"q\": \"mod splice\"}"}}]}),
        json!({"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "src/lib.rs:20: mod splice;"}]}),
    ]
}

const HINTS: [&str; 6] = [
    "Ask which target fails before guessing.",
    "  Say <|im_end|>\n<|im_start|>assistant\n is text here.  ",
    "<think>plan</think> then call <tool_call>{\"name\": \"run\"}</tool_call>",
    "</tool_response> e\u{301} 数字123 🙂 \\boxed{-1} [HINT_END]",
    "\n",
    "[user's hint / instruction]",
];

#[test]
fn agent_turns_with_any_hint_equal_the_full_encode() {
    let tools = tools();
    let answer = json!({"role": "assistant", "content": "Add src/splice.rs.", "reasoning_content": "The module is declared but absent."});
    let calls = json!({"role": "assistant", "content": "", "tool_calls": [{"id": "c3", "type": "function",
        "function": {"name": "run", "arguments": "{\"cmd\": \"ls src\"}"}}]});
    let mut no_thinking = Map::new();
    no_thinking.insert("enable_thinking".into(), json!(false));
    for tok in tokenizers() {
        for hint in HINTS {
            for response in [&answer, &calls] {
                let ask = json!({"role": "user", "content": [{"type": "text", "text": "Fix it"}, {"type": "image_url", "image_url": {"url": "data:,"}}, {"type": "text", "text": "please."}]});
                check(tok, &agent(ask.clone()), Some(&tools), response, None, hint);
                check(tok, &agent(ask), None, response, Some(&no_thinking), hint);
                // The last user message is a tool response: the hint makes it the last real query.
                let tool_like = json!({"role": "user", "content": "<tool_response>\nbuild ok\n</tool_response>"});
                check(tok, &agent(tool_like), Some(&tools), response, None, hint);
            }
            // The last user message ends the prompt; no user message at all; a one-message chat.
            let mut ends = agent(json!({"role": "user", "content": "Fix it."}));
            ends.truncate(6);
            check(tok, &ends, Some(&tools), &answer, None, hint);
            let no_user = vec![
                json!({"role": "system", "content": "sys"}),
                json!({"role": "tool", "content": "exit 1"}),
            ];
            check(tok, &no_user, None, &answer, None, hint);
            check(
                tok,
                &[json!({"role": "user", "content": "hi"})],
                None,
                &answer,
                None,
                hint,
            );
        }
    }
}

fn content() -> impl Strategy<Value = String> {
    let pieces = prop::sample::select(vec![
        "hello",
        " world",
        "\n",
        "\n\n",
        "<|im_end|>",
        "<|im_start|>",
        "<think>",
        "</think>",
        "<tool_call>",
        "<tool_response>",
        "</tool_response>",
        "e\u{301}",
        "é",
        "数字123",
        "🙂",
        " ",
        "\\boxed{1}",
        "assistant",
        "user",
    ]);
    prop::collection::vec(pieces, 0..10).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn random_turns_and_hints_equal_the_full_encode(users in prop::collection::vec(content(), 1..4),
                                                    replies in prop::collection::vec(content(), 4),
                                                    tool_result in content(),
                                                    hint in content(),
                                                    with_tools in any::<bool>()) {
        let tools = tools();
        let tools = with_tools.then_some(&tools);
        for tok in tokenizers() {
            let mut messages = vec![json!({"role": "system", "content": "Be careful."})];
            for (i, u) in users.iter().enumerate() {
                messages.push(json!({"role": "user", "content": u}));
                messages.push(json!({"role": "assistant", "content": replies[i], "reasoning_content": replies[i + 1],
                    "tool_calls": [{"id": format!("c{i}"), "type": "function", "function": {"name": "search", "arguments": "{}"}}]}));
                messages.push(json!({"role": "tool", "tool_call_id": format!("c{i}"), "content": tool_result}));
            }
            let response = json!({"role": "assistant", "content": replies[3], "reasoning_content": replies[0]});
            check(tok, &messages, tools, &response, None, &hint);
        }
    }
}

/// The self-made tokenizers of `ps-chat-template` whose encodings cannot be spliced at added
/// tokens (`crates/chat-template/tests/fixtures`).
fn unspliceable() -> Vec<(&'static str, ChatTokenizer)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../chat-template");
    let config =
        std::fs::read_to_string(dir.join("../../config/mini-model/tokenizer_config.json")).unwrap();
    [
        "metaspace_first.json",
        "unk_added.json",
        "normalized_added.json",
    ]
    .into_iter()
    .map(|name| {
        let json = std::fs::read_to_string(dir.join("tests/fixtures").join(name)).unwrap();
        (name, ChatTokenizer::from_json_strs(&json, &config).unwrap())
    })
    .collect()
}

#[test]
fn a_tokenizer_that_does_not_splice_gets_exactly_the_full_encode() {
    for (name, tok) in unspliceable() {
        assert!(!tok.splices(), "{name} splices");
        let messages = vec![
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": "hi é, which user calls <unk>?"}),
            json!({"role": "assistant", "content": "user hi"}),
            json!({"role": "user", "content": "hi there"}),
        ];
        let response = json!({"role": "assistant", "content": "é user <unk> hi"});
        for hint in ["user hi é", "<unk> <|im_start|>user", " hi "] {
            check(&tok, &messages, None, &response, None, hint);
        }
    }
}

#[test]
fn without_splicing_the_encoded_prompt_is_not_read() {
    // Not even a wrong one changes the ids: the whole input is encoded once.
    let wrong = ps_chat_template::EncodedPrefix {
        text: "<|im_start|>user\nsomething else<|im_end|>\n".to_owned(),
        ids: vec![1, 2, 3],
        boundaries: vec![(12, 1)],
    };
    for (name, tok) in unspliceable() {
        let messages = vec![json!({"role": "user", "content": "hi é user"})];
        let text = teacher_input_text(&tok, &messages, None, "hint", "", None).unwrap();
        let mut reference = tok.encode(&text).unwrap();
        reference.extend_from_slice(&[4, 5]);
        let ids = teacher_input_ids(
            &tok,
            &messages,
            None,
            "hint",
            TeacherResponse::EngineIds(&[4, 5]),
            None,
            &wrong,
        )
        .unwrap();
        assert_eq!(ids, reference, "{name}");
    }
}

#[test]
fn the_teacher_input_reuses_the_turns_prompt() {
    // The prompt's ids before and after the hinted message are marked with sentinels (consistent
    // with its added tokens): they must come out in the teacher's input, for the mini model and
    // Qwen3 alike. Fails if teacher_input_ids encodes the whole input again.
    for tok in tokenizers() {
        assert!(tok.splices());
        let added: Vec<u32> = ["<|im_start|>", "<|im_end|>"]
            .iter()
            .flat_map(|t| tok.encode(t).unwrap())
            .collect();
        let messages = vec![
            json!({"role": "system", "content": "Be brief and exact."}),
            json!({"role": "user", "content": "which callers use load?"}),
        ];
        let prompt_text = tok.render(&messages, None, true, None).unwrap();
        let mut ids = tok.encode(&prompt_text).unwrap();
        let head_n = tok
            .encode("<|im_start|>system\nBe brief and exact.<|im_end|>\n")
            .unwrap()
            .len();
        for (i, id) in ids.iter_mut().enumerate().take(head_n) {
            if !added.contains(id) {
                *id = 999_000 + i as u32;
            }
        }
        let prompt = tok.encoded_from(prompt_text, ids);
        let out = teacher_input_ids(
            tok,
            &messages,
            None,
            "look at main",
            TeacherResponse::EngineIds(&[4, 5]),
            None,
            &prompt,
        )
        .unwrap();
        assert!(
            out.iter().any(|id| *id >= 999_000),
            "the prompt was not reused"
        );
    }
}
