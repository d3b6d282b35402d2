//! `ChatTokenizer::decode_verbatim` (a table of each id's bytes for byte-level tokenizers) gives
//! what `tokenizers`' own decoding gives, for the real Qwen3 tokenizer and the mini one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use ps_chat_template::ChatTokenizer;

use crate::common;

fn tokenizers() -> Vec<&'static ChatTokenizer> {
    static MINI: std::sync::OnceLock<ChatTokenizer> = std::sync::OnceLock::new();
    let mut all: Vec<&ChatTokenizer> = common::qwen3().iter().collect();
    all.push(MINI.get_or_init(ChatTokenizer::mini));
    all
}

#[test]
fn every_id_alone_decodes_as_tokenizers_does() {
    for tok in tokenizers() {
        assert!(tok.decodes_from_table(), "both are byte-level tokenizers");
        // Past the vocabulary too: unknown ids are left out by both.
        for id in 0..tok.vocab_size() as u32 + 3 {
            for skip in [false, true] {
                assert_eq!(
                    tok.decode_verbatim(&[id], skip),
                    tok.decode_slow(&[id], skip),
                    "id {id}, skip_special_tokens {skip}"
                );
            }
        }
    }
}

#[test]
fn a_real_prompt_decodes_as_tokenizers_does_and_encodes_back() {
    let Some(tok) = common::qwen3().first() else {
        return;
    };
    let text =
        "<|im_start|>user\nCafé ☕, 日本語 and 🤖 emoji\tTabs<|im_end|>\n<|im_start|>assistant\n";
    let ids = tok.encode(text).unwrap();
    assert!(
        tok.decodes_from_table(),
        "Qwen3's is a byte-level tokenizer"
    );
    assert_eq!(tok.decode(&ids, false), text);
    assert_eq!(
        tok.decode_verbatim(&ids, false),
        tok.decode_slow(&ids, false)
    );
    assert_eq!(
        tok.decode(&ids, true),
        "user\nCafé ☕, 日本語 and 🤖 emoji\tTabs\nassistant\n"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any sequence, bytes of one character split across ids and special tokens included.
    #[test]
    fn any_ids_decode_as_tokenizers_does(
        which in 0usize..3,
        ids in proptest::collection::vec(any::<u32>(), 0..64),
        skip in any::<bool>(),
    ) {
        let all = tokenizers();
        let tok = all[which % all.len()];
        // Mostly ids the tokenizer has (the added tokens at its end included), a few past it.
        let n = tok.vocab_size() as u32;
        let ids: Vec<u32> = ids.iter().map(|&x| if x % 16 == 0 { x } else { x % (n + 2) }).collect();
        prop_assert_eq!(tok.decode_verbatim(&ids, skip), tok.decode_slow(&ids, skip));
    }
}
