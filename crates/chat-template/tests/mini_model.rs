//! The embedded mini model (`config/mini-model`): its golden cases, produced by Jinja2 and the
//! Python `tokenizers` package (`make_mini_golden.py`), must be reproduced exactly. Needs nothing
//! outside the repository.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use ps_chat_template::{ChatTokenizer, TurnInput, TurnTokens};
use serde_json::{Value, json};

const GOLDEN_MINI: &str = include_str!("../../../config/mini-model/golden_mini.jsonl");

#[test]
fn mini_golden_cases_match_python_exactly() {
    let tok = ChatTokenizer::mini();
    let mut total = 0;
    for line in GOLDEN_MINI.lines().filter(|l| !l.trim().is_empty()) {
        total += 1;
        let case: Value = serde_json::from_str(line).unwrap();
        let id = case["id"].as_str().unwrap();
        let input = TurnInput {
            messages: case["messages"].as_array().unwrap(),
            tools: case.get("tools"),
            response_message: &case["response_message"],
            template_kwargs: case.get("chat_template_kwargs").and_then(Value::as_object),
        };
        let got = tok
            .split_turn(&input)
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        let want: TurnTokens = serde_json::from_value(case.clone()).unwrap();
        assert_eq!(got, want, "{id}");
    }
    assert_eq!(total, 10);
}

#[test]
fn mini_special_tokens() {
    let tok = ChatTokenizer::mini();
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    let eos = tok.eos_token_id().unwrap();
    assert_eq!(tok.encode("<|im_end|>").unwrap(), vec![eos]);
    assert_eq!(tok.token_text(eos), "<|im_end|>");
    for t in [
        "<|endoftext|>",
        "<|im_start|>",
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
    ] {
        let ids = tok.encode(t).unwrap();
        assert_eq!(ids.len(), 1, "{t} is one token");
        assert_eq!(tok.token_text(ids[0]), t);
    }
    // Unknown ids decode to nothing rather than failing.
    assert_eq!(tok.token_text(u32::MAX), "");
}

#[test]
fn mini_token_texts_concatenate_back_to_ascii_text() {
    let tok = ChatTokenizer::mini();
    let text = "Hello! The weather in Paris is 21 degrees, isn't it?";
    let ids = tok.encode(text).unwrap();
    let joined: String = ids.iter().map(|&id| tok.token_text(id)).collect();
    assert_eq!(joined, text);
}

#[test]
fn mini_enable_thinking_false_adds_empty_think_block() {
    let tok = ChatTokenizer::mini();
    let messages = [json!({"role": "user", "content": "hi"})];
    let kwargs = json!({"enable_thinking": false});
    let prompt = tok
        .render(&messages, None, true, kwargs.as_object())
        .unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
    let prompt = tok.render(&messages, None, true, None).unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn mini_is_cheap_to_share() {
    let tok = std::sync::Arc::new(ChatTokenizer::mini());
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let tok = tok.clone();
            std::thread::spawn(move || {
                let messages = [json!({"role": "user", "content": format!("question {i}")})];
                tok.render(&messages, None, true, None).unwrap()
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        assert!(h.join().unwrap().contains(&format!("question {i}")));
    }
}

/// A directory with a `preprocessor_config.json` is a vision-language model only when it is a
/// Qwen-VL processor beside an `<|image_pad|>` token; any other stays a text model (it loads, and
/// its image turns are refused), never a start-up failure.
#[test]
fn only_a_qwen_vl_processor_with_its_pad_token_makes_a_vision_model() {
    let mini_vl =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/mini-vl-model");
    let mini = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/mini-model");
    assert!(
        ChatTokenizer::from_dir(&mini_vl)
            .unwrap()
            .vision()
            .is_some()
    );
    assert!(ChatTokenizer::from_dir(&mini).unwrap().vision().is_none());
    let with = |from: &std::path::Path, processor: &str| {
        let dir = tempfile::tempdir().unwrap();
        for f in ["tokenizer.json", "tokenizer_config.json"] {
            std::fs::copy(from.join(f), dir.path().join(f)).unwrap();
        }
        std::fs::write(dir.path().join("preprocessor_config.json"), processor).unwrap();
        let tok = ChatTokenizer::from_dir(dir.path()).unwrap();
        (tok.vision().copied(), dir)
    };
    let qwen = r#"{"image_processor_type": "Qwen2VLImageProcessorFast", "patch_size": 16}"#;
    assert_eq!(with(&mini_vl, qwen).0.unwrap().processor.patch_size, 16);
    for (dir, processor) in [
        (
            &mini_vl,
            r#"{"image_processor_type": "Gemma3ImageProcessor"}"#,
        ),
        (&mini_vl, r#"{"do_resize": false}"#),
        (&mini, qwen),
    ] {
        assert_eq!(with(dir, processor).0, None, "{processor}");
    }
}
