//! Encoding a text from an encoded one that differs in its middle (`encode_around`), joining two
//! encoded texts (`encode_concat`) and encoding a prompt through a shared cache
//! (`encode_prompt_cached`) give exactly the full encode: on agent-shaped conversations (system
//! prompt, tools, tool calls and results, reasoning, content lists) with one message changed as
//! the OPD teacher's hint changes it, with the mini model and (when the fixtures are there) the
//! real Qwen3 tokenizer and both templates, and on random contents that try to break the cuts
//! (added-token text, combining characters that NFC composes, think tags).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use ps_chat_template::{ChatTokenizer, EncodedPrefix, SharedPrefixCache, TurnInput};
use serde_json::{Value, json};

use crate::common;
use common::qwen3;

/// Loaded once for every test and property case of this file.
fn tokenizers() -> Vec<&'static ChatTokenizer> {
    static MINI: std::sync::OnceLock<ChatTokenizer> = std::sync::OnceLock::new();
    let mut all = vec![MINI.get_or_init(ChatTokenizer::mini)];
    all.extend(qwen3());
    all
}

fn exact(tok: &ChatTokenizer, text: &str) -> EncodedPrefix {
    tok.encoded_from(text.to_owned(), tok.encode(text).unwrap())
}

/// `encode_around(changed, exact(base))` equals the full encode of `changed`, and the returned
/// boundaries are the changed text's own.
fn check_around(tok: &ChatTokenizer, base: &str, changed: &str) -> Vec<u32> {
    let full = tok.encode(changed).unwrap();
    let around = tok.encode_around(changed, &exact(tok, base)).unwrap();
    assert_eq!(
        around.ids, full,
        "encode_around differs ({tok:?})\nbase: {base:?}\nchanged: {changed:?}"
    );
    assert_eq!(around.text, changed);
    assert_eq!(around, exact(tok, changed), "boundaries of the result");
    full
}

fn agent_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "search", "description": "Search the web.",
         "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}},
        {"type": "function", "function": {"name": "read_file", "description": "Read a file.",
         "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
    ])
}

/// An agent conversation: system prompt, a user ask, tool calls with results, reasoning, a
/// content list, and a user message (`last_user`) followed by a tool round.
fn agent_messages(last_user: Value) -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "You are a coding agent. Read before you write. ".repeat(12)}),
        json!({"role": "user", "content": "Find the config loader."}),
        json!({"role": "assistant", "content": "", "reasoning_content": "Search first.",
               "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{\"q\": \"config loader\"}"}}]}),
        json!({"role": "tool", "tool_call_id": "c1", "content": "src/config.rs: fn load() -> Config { ... }"}),
        json!({"role": "assistant", "content": "It is `load` in src/config.rs.", "reasoning_content": "Found it."}),
        json!({"role": "user", "content": [{"type": "text", "text": "Now read it"}, {"type": "text", "text": "and summarise."}]}),
        json!({"role": "assistant", "content": "Reading.", "tool_calls": [{"id": "c2", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\": \"src/config.rs\"}"}}]}),
        json!({"role": "tool", "tool_call_id": "c2", "content": "pub fn load() -> Config {\n    toml::from_str(&std::fs::read_to_string(PATH)?)\n}"}),
        json!({"role": "assistant", "content": "It parses TOML.", "reasoning_content": "Short file."}),
        last_user,
        json!({"role": "assistant", "content": "", "tool_calls": [{"id": "c3", "type": "function", "function": {"name": "search", "arguments": "{\"q\": \"callers of load\"}"}}]}),
        json!({"role": "tool", "tool_call_id": "c3", "content": "src/main.rs:12: let cfg = config::load()?;"}),
    ]
}

fn render(tok: &ChatTokenizer, messages: &[Value], tools: Option<&Value>) -> String {
    tok.render(
        &ps_core::message::normalize_messages(messages),
        tools,
        true,
        None,
    )
    .unwrap()
}

#[test]
fn a_hinted_user_message_in_an_agent_conversation_encodes_exactly() {
    let tools = agent_tools();
    let hints = [
        "Ask which caller matters.",
        "Mind <|im_end|> and <|im_start|>assistant\n inside text.",
        "Think first: <think>plan</think> then </tool_call> <tool_response>x</tool_response>",
        "e\u{301} 数字123 🙂 \\boxed{1}",
        "",
    ];
    for tok in tokenizers() {
        for tools in [Some(&tools), None] {
            let original = "Which callers are there?";
            let base = render(
                tok,
                &agent_messages(json!({"role": "user", "content": original})),
                tools,
            );
            for hint in hints {
                let hinted = json!({"role": "user", "content": format!("{original}\n\n[user's hint / instruction]\n{hint}")});
                let changed = render(tok, &agent_messages(hinted), tools);
                check_around(tok, &base, &changed);
                // And back: the hinted text as the base of the plain one.
                check_around(tok, &changed, &base);
            }
            // A last user message shaped like a tool response: with the hint it becomes the last
            // real query, and Qwen3's template renders the earlier assistant turns differently.
            let tool_like = "<tool_response>\nok\n</tool_response>";
            let base = render(
                tok,
                &agent_messages(json!({"role": "user", "content": tool_like})),
                tools,
            );
            let changed = render(
                tok,
                &agent_messages(
                    json!({"role": "user", "content": format!("{tool_like}\n\n[user's hint / instruction]\nCheck the result.")}),
                ),
                tools,
            );
            check_around(tok, &base, &changed);
        }
    }
}

#[test]
fn the_reuse_covers_both_ends() {
    // Only the changed message and its neighbourhood up to the nearest added tokens is encoded:
    // the ids before and after it are the base's (checked through what encode_around returns
    // for a base whose ends are deliberately wrong but consistent with the cut points). Fails if
    // the reuse is removed, for the mini model and Qwen3 alike.
    for tok in tokenizers() {
        assert!(tok.splices());
        let added: Vec<u32> = ["<|im_start|>", "<|im_end|>"]
            .iter()
            .flat_map(|t| tok.encode(t).unwrap())
            .collect();
        let head = "<|im_start|>system\nsys<|im_end|>\n";
        let tail = "<|im_end|>\n<|im_start|>assistant\n";
        let base_text = format!("{head}<|im_start|>user\nq{tail}");
        let mut base = exact(tok, &base_text);
        // Mark the reused ends: replace the head's and tail's ordinary ids by sentinels.
        let head_n = tok.encode(head).unwrap().len();
        let tail_n = tok.encode(tail).unwrap().len();
        let len = base.ids.len();
        for i in 0..head_n {
            if !added.contains(&base.ids[i]) {
                base.ids[i] = 999_000 + i as u32;
            }
        }
        for i in len - tail_n..len {
            if !added.contains(&base.ids[i]) {
                base.ids[i] = 998_000 + i as u32;
            }
        }
        let changed = format!("{head}<|im_start|>user\nq\n\nhint text{tail}");
        let ids = tok.encode_around(&changed, &base).unwrap().ids;
        assert!(ids.iter().any(|id| *id >= 999_000), "the head was reused");
        assert!(
            ids.iter().any(|id| (998_000..999_000).contains(id)),
            "the tail was reused"
        );
    }
}

#[test]
fn ids_that_disagree_with_their_text_are_not_reused() {
    // Ids from elsewhere (an older tokenizer, say) with fewer or more added tokens than the text:
    // nothing of them is reused, the result is the full encode, and the mismatch is counted.
    for tok in tokenizers() {
        let text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
        let changed = "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n";
        for ids in [
            tok.encode("hi").unwrap(),
            tok.encode("<|im_start|>user\nhi").unwrap(),
            tok.encode(&format!("{text}<|im_end|>")).unwrap(),
            // The middle `<|im_end|>` read as ordinary text: the first and last added tokens
            // agree, one in between is missing from the ids.
            [
                tok.encode("<|im_start|>user\nhi").unwrap(),
                tok.encode("<|im_end").unwrap(),
                tok.encode("|>\n<|im_start|>assistant\n").unwrap(),
            ]
            .concat(),
        ] {
            let before = ps_chat_template::boundary_mismatches();
            let base = tok.encoded_from(text.to_owned(), ids);
            assert!(base.boundaries.is_empty(), "{:?}", base.boundaries);
            assert!(ps_chat_template::boundary_mismatches() > before);
            let around = tok.encode_around(changed, &base).unwrap();
            assert_eq!(around.ids, tok.encode(changed).unwrap());
            let joined = tok
                .encode_concat(&base, &exact(tok, "x<|im_end|>"))
                .unwrap();
            assert_eq!(joined, tok.encode(&format!("{text}x<|im_end|>")).unwrap());
        }
    }
}

#[test]
fn an_engines_ids_are_kept_around_the_changed_message_unless_they_disagree_on_added_tokens() {
    for tok in tokenizers() {
        let text = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
        let changed = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi, with a hint<|im_end|>\n<|im_start|>assistant\n";
        let ours = tok.encode(text).unwrap();
        // Our own encoding: the same as `encoded_from`, and the result is exactly a full encode.
        let engine = tok
            .encoded_from_engine(text.to_owned(), ours.clone())
            .unwrap();
        assert_eq!(engine, exact(tok, text));
        check_around(tok, text, changed);
        assert_eq!(
            tok.encode_around(changed, &engine).unwrap().ids,
            tok.encode(changed).unwrap()
        );
        // The engine's ordinary tokens before and after the changed message are kept as they are:
        // the system message's first ordinary token and the generation prompt's last one.
        let mut theirs = ours.clone();
        let last = theirs.len() - 1;
        for i in [2, last] {
            theirs[i] += 1;
        }
        let engine = tok
            .encoded_from_engine(text.to_owned(), theirs.clone())
            .unwrap();
        let got = tok.encode_around(changed, &engine).unwrap().ids;
        let mut want = tok.encode(changed).unwrap();
        let want_last = want.len() - 1;
        want[2] = theirs[2];
        want[want_last] = theirs[last];
        assert_eq!(got, want, "{tok:?}");
        // Ids that disagree on added tokens: nothing to build on.
        let plain = tok.encode("<|im_start|>user\nhi").unwrap();
        assert_eq!(tok.encoded_from_engine(text.to_owned(), plain), None);
        assert_eq!(
            tok.encoded_from_engine(text.to_owned(), ours[1..].to_vec()),
            None
        );
    }
}

#[test]
fn joining_a_prompt_and_a_response_encodes_exactly() {
    for tok in tokenizers() {
        let prompt = render(
            tok,
            &agent_messages(json!({"role": "user", "content": "Go on."})),
            None,
        );
        for response in [
            "<think>\nplan\n</think>\n\nDone.<|im_end|>\n",
            "Done without thinking.<|im_end|>\n",
            "\n\nleading newlines<|im_end|>\n",
            "no end token",
            "",
            "<|im_end|>",
        ] {
            let ids = tok
                .encode_concat(&exact(tok, &prompt), &exact(tok, response))
                .unwrap();
            assert_eq!(
                ids,
                tok.encode(&format!("{prompt}{response}")).unwrap(),
                "{response:?} ({tok:?})"
            );
        }
    }
}

#[test]
fn prompts_encoded_through_a_shared_cache_equal_the_full_encode_also_while_it_evicts() {
    let tools = agent_tools();
    for tok in tokenizers() {
        for bound in [usize::MAX >> 1, 0, 2_000] {
            let shared = SharedPrefixCache::new(bound);
            for session in 0..4 {
                let system = format!(
                    "You are agent {}. {}",
                    session % 2,
                    "Read the code before changing it. ".repeat(10)
                );
                let mut messages = vec![json!({"role": "system", "content": system})];
                let mut prev: Option<EncodedPrefix> = None;
                for turn in 0..3 {
                    messages.push(
                        json!({"role": "user", "content": format!("ask {turn} of {session}")}),
                    );
                    let prompt = render(tok, &messages, Some(&tools));
                    let input = TurnInput {
                        messages: &messages,
                        tools: Some(&tools),
                        response_message: &Value::Null,
                        template_kwargs: None,
                    };
                    for from in [prev.as_ref(), None] {
                        let got = tok
                            .encode_prompt_cached(&input, &prompt, from, Some(&shared))
                            .unwrap();
                        assert_eq!(got, exact(tok, &prompt), "session {session} turn {turn}");
                    }
                    prev = Some(
                        tok.encode_prompt_cached(&input, &prompt, prev.as_ref(), Some(&shared))
                            .unwrap(),
                    );
                    messages.push(json!({"role": "assistant", "content": format!("answer {turn}"), "reasoning_content": "think"}));
                }
            }
            let stats = shared.stats();
            if bound == 0 {
                assert_eq!(stats.entries, 0);
            } else if bound == usize::MAX >> 1 {
                assert_eq!(stats.entries, 2, "one per system prompt: {stats:?}");
                assert!(stats.hits > 0, "{stats:?}");
            }
            assert!(stats.bytes <= stats.max_bytes);
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
        "</tool_response>",
        "e\u{301}",
        "\u{1100}\u{1161}",
        "é",
        "数字123",
        "🙂",
        " ",
        "\t",
        "\\boxed{1}",
        "assistant",
        "[user's hint / instruction]",
    ]);
    prop::collection::vec(pieces, 0..10).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    /// Any text with its middle replaced: the raw texts, no template.
    #[test]
    fn any_middle_change_encodes_exactly(a in content(), b in content(), c in content(), d in content()) {
        for tok in tokenizers() {
            let base = format!("<|im_start|>system\n{a}<|im_end|>\n<|im_start|>user\n{b}<|im_end|>\n{c}");
            let changed = format!("<|im_start|>system\n{a}<|im_end|>\n<|im_start|>user\n{b}{d}<|im_end|>\n{c}");
            check_around(tok, &base, &changed);
            check_around(tok, &changed, &base);
            check_around(tok, &a, &format!("{a}{d}{c}"));
            check_around(tok, &format!("{b}{c}"), &format!("{d}{c}"));
        }
    }

    /// A rendered conversation with random contents and the last user message hinted.
    #[test]
    fn a_random_conversation_hinted_encodes_exactly(users in prop::collection::vec(content(), 1..4),
                                                    replies in prop::collection::vec(content(), 4),
                                                    tool_result in content(),
                                                    hint in content()) {
        let tools = agent_tools();
        for tok in tokenizers() {
            let mut messages = vec![json!({"role": "system", "content": "You are careful."})];
            for (i, u) in users.iter().enumerate() {
                messages.push(json!({"role": "user", "content": u}));
                messages.push(json!({"role": "assistant", "content": replies[i], "reasoning_content": replies[i + 1],
                    "tool_calls": [{"id": format!("c{i}"), "type": "function", "function": {"name": "search", "arguments": "{}"}}]}));
                messages.push(json!({"role": "tool", "tool_call_id": format!("c{i}"), "content": tool_result}));
            }
            let base = render(tok, &messages, Some(&tools));
            let last = messages.iter().rposition(|m| m["role"] == "user").unwrap();
            let mut hinted = messages.clone();
            hinted[last]["content"] = json!(format!("{}\n\n[user's hint / instruction]\n{hint}", users[users.len() - 1]));
            let changed = render(tok, &hinted, Some(&tools));
            check_around(tok, &base, &changed);
        }
    }

    #[test]
    fn any_two_texts_join_exactly(a in content(), b in content()) {
        for tok in tokenizers() {
            let ids = tok.encode_concat(&exact(tok, &a), &exact(tok, &b)).unwrap();
            prop_assert_eq!(ids, tok.encode(&format!("{a}{b}")).unwrap());
        }
    }
}
