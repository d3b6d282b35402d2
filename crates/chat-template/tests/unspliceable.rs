//! Tokenizers whose encodings cannot be spliced at added tokens (the self-made ones of
//! `tests/fixtures`, see `make_unspliceable.py`: a Metaspace pre-tokenizer prepending only at the
//! start of the text, an unknown-token id that is an added token, a normalized added token behind
//! a Prepend normalizer) are recognised at load: `splices()` is false and every encoding function
//! gives exactly the full encode. The mini model and the real Qwen3 tokenizer do splice.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use ps_chat_template::{ChatTokenizer, EncodedPrefix, SharedPrefixCache, TurnInput};

use serde_json::{Value, json};

use crate::common;

const CONFIG: &str = include_str!("../../../config/mini-model/tokenizer_config.json");

fn fixture(name: &str) -> ChatTokenizer {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    ChatTokenizer::from_json_strs(&std::fs::read_to_string(path).unwrap(), CONFIG).unwrap()
}

const FIXTURES: [&str; 3] = [
    "metaspace_first.json",
    "unk_added.json",
    "normalized_added.json",
];

fn exact(tok: &ChatTokenizer, text: &str) -> EncodedPrefix {
    tok.encoded_from(text.to_owned(), tok.encode(text).unwrap())
}

fn messages(last_user: &str) -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "You are a helpful agent. Be brief."}),
        json!({"role": "user", "content": "hi there, which callers use load?"}),
        json!({"role": "assistant", "content": "user hi: main and the tests <unk>."}),
        json!({"role": "user", "content": last_user}),
    ]
}

fn render(tok: &ChatTokenizer, messages: &[Value]) -> String {
    tok.render(messages, None, true, None).unwrap()
}

#[test]
fn each_fixture_really_breaks_a_splice() {
    // Without this the fixtures would prove nothing: a piecewise encode differs from the whole.
    let text = "hi é<|im_start|>user hi é<unk>";
    for name in FIXTURES {
        let tok = fixture(name);
        let whole = tok.encode(text).unwrap();
        let cut = text.find("<|im_start|>").unwrap() + "<|im_start|>".len();
        let pieces = [
            tok.encode(&text[..cut]).unwrap(),
            tok.encode(&text[cut..]).unwrap(),
        ]
        .concat();
        let ids_of_unk_text = tok.encode("<unk>").unwrap();
        let unk_breaks = ids_of_unk_text.len() == 1 && tok.encode("é").unwrap() == ids_of_unk_text;
        assert!(
            whole != pieces || unk_breaks,
            "{name}: the fixture encodes piecewise, it shows nothing"
        );
    }
}

#[test]
fn unspliceable_tokenizers_are_found_at_load() {
    for name in FIXTURES {
        assert!(!fixture(name).splices(), "{name} splices");
    }
}

#[test]
fn every_encoding_function_equals_the_full_encode_without_splicing() {
    let shared = SharedPrefixCache::new(1 << 20);
    for name in FIXTURES {
        let tok = fixture(name);
        let first = messages("hi");
        let second = {
            let mut m = first.clone();
            m.push(json!({"role": "assistant", "content": "user é <unk> hi"}));
            m.push(json!({"role": "user", "content": "<unk> hi é user"}));
            m
        };
        let (p1, p2) = (render(&tok, &first), render(&tok, &second));

        // encode_reusing, through encode_cached and encode_prompt_cached.
        let (ids1, prev) = tok.encode_cached(&p1, None, Some(&shared)).unwrap();
        assert_eq!(ids1, tok.encode(&p1).unwrap(), "{name}: encode_cached");
        let (ids2, _) = tok
            .encode_cached(&p2, prev.as_ref(), Some(&shared))
            .unwrap();
        assert_eq!(
            ids2,
            tok.encode(&p2).unwrap(),
            "{name}: encode_cached, reusing"
        );
        let reused = exact(&tok, &p1);
        let null = Value::Null;
        let input = TurnInput {
            messages: &second,
            tools: None,
            response_message: &null,
            template_kwargs: None,
        };
        let prompt = tok
            .encode_prompt_cached(&input, &p2, Some(&reused), Some(&shared))
            .unwrap();
        assert_eq!(
            prompt.ids,
            tok.encode(&p2).unwrap(),
            "{name}: encode_prompt_cached"
        );

        // split_turn_cached, with a previous prompt and the shared cache.
        let response = json!({"role": "assistant", "content": "é user <unk>"});
        let turn = TurnInput {
            messages: &second,
            tools: None,
            response_message: &response,
            template_kwargs: None,
        };
        let (tokens, _) = tok
            .split_turn_cached(&turn, Some(&reused), Some(&shared))
            .unwrap();
        assert_eq!(
            tokens,
            tok.split_turn(&turn).unwrap(),
            "{name}: split_turn_cached"
        );
        assert_eq!(tokens.prompt_ids, tok.encode(&p2).unwrap());

        // encode_around: the last user message changed as a hint changes it.
        let hinted = render(
            &tok,
            &messages("hi\n\n[user's hint / instruction]\né user <unk>"),
        );
        let around = tok.encode_around(&hinted, &exact(&tok, &p1)).unwrap();
        assert_eq!(
            around.ids,
            tok.encode(&hinted).unwrap(),
            "{name}: encode_around"
        );

        // encode_concat: a prompt and a response.
        let resp = "<think>\nhi é\n</think>\n\nuser hi<|im_end|>\n";
        let joined = tok
            .encode_concat(&exact(&tok, &hinted), &exact(&tok, resp))
            .unwrap();
        assert_eq!(
            joined,
            tok.encode(&format!("{hinted}{resp}")).unwrap(),
            "{name}: encode_concat"
        );
    }
}

#[test]
fn the_mini_model_and_qwen3_splice() {
    assert!(ChatTokenizer::mini().splices());
    // Both Qwen3 configurations, when the fixtures are there (required in CI).
    for tok in common::qwen3() {
        assert!(tok.splices(), "Qwen3 does not splice");
    }
}
