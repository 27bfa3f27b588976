//! Tokenizers rebuilt from GGUF metadata: a SentencePiece vocabulary
//! against SentencePiece itself (tests/fixtures/sentencepiece.*, made by
//! make_sentencepiece.py there), a Gemma 4 vocabulary against Hugging Face
//! tokenizers (tests/fixtures/gemma4_vocab.*, made by make_gemma4_vocab.py
//! with llama.cpp's converter), and the byte-level pre-tokenizers
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

/// A Gemma 4 vocabulary (`tokenizer.ggml.model` = `gemma4`), written by
/// llama.cpp's converter from a tokenizer.json in transformers' Gemma
/// layout: every text's ids as Hugging Face tokenizers gives them (spaces
/// as "▁", runs of spaces and newlines, bytes no piece holds as `<0xNN>`,
/// the chat's special tokens whole), its text back from those ids, and
/// BOS before a prompt.
#[test]
fn a_gemma4_vocabulary_gives_hugging_face_ids_and_decodes_back() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let reference = read_json(&dir.join("gemma4_vocab.json"));
    let tokenizer = GgufFile::open(&dir.join("gemma4_vocab.gguf"))
        .unwrap()
        .tokenizer()
        .unwrap();
    let bos = tokenizer.bos_id().expect("a BOS id");
    let cases = reference["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 8);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let ids: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        let encoded = tokenizer.encode(text).unwrap();
        assert_eq!((encoded[0], &encoded[1..]), (bos, &ids[..]), "{text:?}");
        assert_eq!(
            tokenizer.decode_with_special(&ids).unwrap(),
            case["decoded"].as_str().unwrap()
        );
    }
}

/// llama.cpp prompts Gemma 4 after BOS even where the file says
/// `add_bos_token` is false, and so does cleave.
#[test]
fn a_gemma4_vocabulary_always_starts_a_prompt_with_bos() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let source = GgufFile::open(&dir.join("gemma4_vocab.gguf")).unwrap();
    let m = source.metadata();
    let strings = |key: &str| Meta::Strs(m.strings(key).unwrap().to_vec());
    let files = tempfile::tempdir().unwrap();
    let path = Gguf::default()
        .meta("tokenizer.ggml.model", s("gemma4"))
        .meta("tokenizer.ggml.tokens", strings("tokenizer.ggml.tokens"))
        .meta("tokenizer.ggml.merges", strings("tokenizer.ggml.merges"))
        .meta(
            "tokenizer.ggml.token_type",
            Meta::I32s(m.opt_i32s("tokenizer.ggml.token_type").unwrap().unwrap().to_vec()),
        )
        .meta("tokenizer.ggml.bos_token_id", Meta::U32(2))
        .meta("tokenizer.ggml.add_bos_token", Meta::Bool(false))
        .write(files.path(), "no-bos.gguf");
    let tokenizer = GgufFile::open(&path).unwrap().tokenizer().unwrap();
    assert_eq!(tokenizer.encode("The quick brown fox").unwrap()[0], 2);
}

/// The byte-level pre-tokenizers `tokenizer.ggml.pre` names give the ids
/// Hugging Face `tokenizers` gives with the pre-tokenizer and normalizer
/// each model publishes (tests/fixtures/pre_tokenizers.json, made by
/// make_pre_tokenizers.py there): contractions in any case, numbers split
/// whole, in threes or one digit at a time, letters of several scripts,
/// combining marks (NFC for qwen2) and runs of whitespace.
#[test]
fn byte_level_pre_tokenizers_split_as_hugging_face_tokenizers_does() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let reference = read_json(&dir.join("pre_tokenizers.json"));
    let strings = |key: &str| -> Vec<String> { serde_json::from_value(reference[key].clone()).unwrap() };
    let (tokens, merges, corpus) = (strings("tokens"), strings("merges"), strings("corpus"));
    let files = tempfile::tempdir().unwrap();
    let expected = reference["ids"].as_object().unwrap();
    assert_eq!(expected.len(), 4);
    for (pre, ids) in expected {
        let path = Gguf::default()
            .meta("tokenizer.ggml.model", s("gpt2"))
            .meta("tokenizer.ggml.pre", s(pre))
            .meta("tokenizer.ggml.tokens", Meta::Strs(tokens.clone()))
            .meta("tokenizer.ggml.merges", Meta::Strs(merges.clone()))
            .write(files.path(), &format!("{pre}.gguf"));
        let tokenizer = GgufFile::open(&path).unwrap().tokenizer().unwrap();
        let ids: Vec<Vec<u32>> = serde_json::from_value(ids.clone()).unwrap();
        for (text, ids) in corpus.iter().zip(ids) {
            assert_eq!(tokenizer.encode(text).unwrap(), ids, "{pre}: {text:?}");
        }
    }
}
