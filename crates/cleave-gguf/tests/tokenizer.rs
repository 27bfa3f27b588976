//! Tokenizers rebuilt from GGUF metadata: a SentencePiece vocabulary
//! against SentencePiece itself (tests/fixtures/sentencepiece.*, made by
//! make_sentencepiece.py there), and the byte-level pre-tokenizers
//! `tokenizer.ggml.pre` chooses.

mod common;

use std::path::Path;

use cleave_gguf::GgufFile;
use common::{read_json, s, Gguf, Meta};

#[test]
fn a_sentencepiece_vocabulary_gives_sentencepiece_ids_and_decodes_back() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let reference = read_json(&dir.join("sentencepiece.json"));
    let tokenizer = GgufFile::open(&dir.join("sentencepiece.gguf"))
        .unwrap()
        .tokenizer()
        .unwrap();
    for case in reference["cases"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        let ids: Vec<u32> = serde_json::from_value(case["input_ids"].clone()).unwrap();
        assert_eq!(tokenizer.encode(prompt).unwrap(), ids, "{prompt:?}");
        assert_eq!(tokenizer.decode(&ids).unwrap(), prompt);
    }
}

/// A byte-level vocabulary of every byte plus "12", "34" and "123", merged
/// "3 4" first, with the pre-tokenizer `pre`.
fn digits_tokenizer(pre: &str) -> cleave_hf::Tokenizer {
    // GPT-2's byte-to-character map: printable bytes stand for themselves,
    // which is all the digits need.
    let mut tokens: Vec<String> = (b'!'..=b'~').map(|b| char::from(b).to_string()).collect();
    tokens.extend(["34", "12", "123"].map(String::from));
    let merges = ["3 4", "1 2", "12 3"].map(String::from).to_vec();
    let dir = tempfile::tempdir().unwrap();
    let path = Gguf::default()
        .meta("tokenizer.ggml.model", s("gpt2"))
        .meta("tokenizer.ggml.pre", s(pre))
        .meta("tokenizer.ggml.tokens", Meta::Strs(tokens))
        .meta("tokenizer.ggml.merges", Meta::Strs(merges))
        .write(dir.path(), "digits.gguf");
    GgufFile::open(&path).unwrap().tokenizer().unwrap()
}

#[test]
fn the_pre_tokenizer_decides_how_digits_are_split_before_merging() {
    let text = |tokenizer: &cleave_hf::Tokenizer, ids: Vec<u32>| -> Vec<String> {
        ids.iter().map(|&id| tokenizer.token_text(id).unwrap()).collect()
    };
    let cases: [(&str, &[&str]); 3] = [
        // GPT-2 keeps a run of digits whole: merged by rank, "34" first.
        ("gpt-2", &["12", "34"]),
        // Llama 3 splits digits in threes.
        ("llama-bpe", &["123", "4"]),
        // Qwen2 one at a time.
        ("qwen2", &["1", "2", "3", "4"]),
    ];
    for (pre, expected) in cases {
        let tokenizer = digits_tokenizer(pre);
        let ids = tokenizer.encode("1234").unwrap();
        assert_eq!(text(&tokenizer, ids), expected, "{pre}");
    }
}
