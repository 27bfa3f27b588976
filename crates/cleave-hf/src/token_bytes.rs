//! The bytes each token stands for in text: what a grammar engine needs to
//! walk a vocabulary. Byte-level BPE spells bytes as printable characters
//! (GPT-2's table); SentencePiece writes spaces as `▁` and unknown bytes as
//! `<0xNN>` tokens; added tokens are their own text, or special.
//!
//! Read from the tokenizer's decoder, never trusted: a token this form
//! cannot spell (a character outside GPT-2's table, a malformed `<0x..>`)
//! stands for no text, so that a grammar never allows it, rather than
//! aborting the load as a panic would.

use std::collections::HashMap;

use serde_json::Value;

use crate::error::{ReadError, Result};

/// What one token id stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenBytes {
    /// Bytes of text (not always whole UTF-8 characters).
    Text(Vec<u8>),
    /// A special token, by its name (`<|im_end|>`): it stands for no text.
    Special(String),
    /// An id the vocabulary leaves empty, or spells in a way the
    /// tokenizer's decoder cannot turn into bytes.
    Nothing,
}

/// How a tokenizer's decoder turns vocabulary entries into bytes.
#[derive(Debug, PartialEq)]
enum Spelling {
    /// GPT-2's byte-to-character table.
    ByteLevel,
    /// Text with `space` for spaces; `<0xNN>` entries are single bytes
    /// where the decoder falls back to bytes.
    Pieces { space: char, byte_fallback: bool },
}

impl Spelling {
    /// The spelling `decoder` (tokenizer.json's `decoder`, as JSON) undoes.
    fn of(decoder: &Value) -> Option<Spelling> {
        let mut steps = Vec::new();
        flatten(decoder, &mut steps);
        let kind = |v: &Value| v["type"].as_str().unwrap_or_default().to_string();
        if steps.iter().any(|d| kind(d) == "ByteLevel") {
            return Some(Spelling::ByteLevel);
        }
        let byte_fallback = steps.iter().any(|d| kind(d) == "ByteFallback");
        let metaspace = steps
            .iter()
            .find(|d| kind(d) == "Metaspace")
            .and_then(|d| single_char(&d["replacement"]));
        let replaced = steps
            .iter()
            .find(|d| kind(d) == "Replace" && d["content"] == " ")
            .and_then(|d| single_char(&d["pattern"]["String"]));
        match (metaspace.or(replaced), byte_fallback) {
            (Some(space), _) => Some(Spelling::Pieces { space, byte_fallback }),
            (None, true) => Some(Spelling::Pieces {
                space: ' ',
                byte_fallback,
            }),
            (None, false) => None,
        }
    }

    /// The bytes vocabulary entry `piece` stands for, `None` where this
    /// spelling cannot write it.
    fn bytes(&self, piece: &str, byte_chars: &HashMap<char, u8>) -> Option<Vec<u8>> {
        match self {
            Spelling::ByteLevel => piece.chars().map(|c| byte_chars.get(&c).copied()).collect(),
            Spelling::Pieces { space, byte_fallback } => {
                if *byte_fallback && piece.starts_with("<0x") && piece.ends_with('>') {
                    let hex = &piece[3..piece.len() - 1];
                    return (hex.len() == 2)
                        .then(|| u8::from_str_radix(hex, 16).ok())
                        .flatten()
                        .map(|b| vec![b]);
                }
                Some(piece.replace(*space, " ").into_bytes())
            }
        }
    }
}

/// A decoder and the decoders of every `Sequence` within it, in order.
fn flatten<'a>(decoder: &'a Value, steps: &mut Vec<&'a Value>) {
    match decoder["decoders"].as_array() {
        Some(inner) if decoder["type"] == "Sequence" => inner.iter().for_each(|d| flatten(d, steps)),
        _ => steps.push(decoder),
    }
}

fn single_char(value: &Value) -> Option<char> {
    let mut chars = value.as_str()?.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None) => Some(c),
        _ => None,
    }
}

/// GPT-2's table from the printable character byte-level BPE writes to
/// the byte it stands for: printable Latin-1 bytes are themselves, the
/// others are the characters from U+0100 on, in byte order.
fn byte_level_chars() -> HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut shifted = 0x100u32;
    (0..=255u8)
        .map(|b| {
            if printable(b) {
                (b as char, b)
            } else {
                let c = char::from_u32(shifted).unwrap_or(char::REPLACEMENT_CHARACTER);
                shifted += 1;
                (c, b)
            }
        })
        .collect()
}

/// What each id of `tokenizer` stands for, ids `0..vocab_size`.
pub(crate) fn token_bytes(tokenizer: &tokenizers::Tokenizer, source: &std::path::Path) -> Result<Vec<TokenBytes>> {
    let decoder = serde_json::to_value(tokenizer.get_decoder()).unwrap_or(Value::Null);
    let spelling = Spelling::of(&decoder).ok_or_else(|| ReadError::Tokenizer {
        path: source.to_path_buf(),
        reason: format!(
            "its decoder ({}) spells tokens in no byte form cleave reads (ByteLevel, or Metaspace/ByteFallback pieces), \
             so it cannot be constrained by a grammar",
            decoder["type"].as_str().unwrap_or("none")
        ),
    })?;
    let added = tokenizer.get_added_tokens_decoder();
    let byte_chars = byte_level_chars();
    let vocab_size = tokenizer.get_vocab_size(true) as u32;
    Ok((0..vocab_size)
        .map(|id| match (added.get(&id), tokenizer.id_to_token(id)) {
            (Some(token), _) if token.special => TokenBytes::Special(token.content.clone()),
            // An added token is its own text, not spelled in the vocabulary's form.
            (Some(token), _) => TokenBytes::Text(token.content.clone().into_bytes()),
            (None, Some(piece)) => spelling
                .bytes(&piece, &byte_chars)
                .map_or(TokenBytes::Nothing, TokenBytes::Text),
            (None, None) => TokenBytes::Nothing,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_byte_level_table_is_gpt2s() {
        let table = byte_level_chars();
        assert_eq!(table.len(), 256);
        assert_eq!(table[&'Ġ'], b' ');
        assert_eq!(table[&'Ċ'], b'\n');
        assert_eq!(table[&'a'], b'a');
        let bytes = Spelling::ByteLevel.bytes("ĠhelloĊ", &table).unwrap();
        assert_eq!(bytes, b" hello\n");
        assert_eq!(Spelling::ByteLevel.bytes("ĠЖ", &table), None);
    }

    #[test]
    fn sentencepiece_pieces_read_spaces_and_byte_tokens() {
        let decoder = json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]});
        let spelling = Spelling::of(&decoder).unwrap();
        assert_eq!(
            spelling,
            Spelling::Pieces {
                space: '▁',
                byte_fallback: true
            }
        );
        let none = HashMap::new();
        assert_eq!(spelling.bytes("▁the", &none).unwrap(), b" the");
        assert_eq!(spelling.bytes("<0x0A>", &none).unwrap(), b"\n");
        // Malformed byte tokens stand for nothing rather than abort.
        assert_eq!(spelling.bytes("<0xZZ>", &none), None);
        assert_eq!(spelling.bytes("<0x0A0>", &none), None);
        let metaspace = json!({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"});
        assert_eq!(
            Spelling::of(&metaspace),
            Some(Spelling::Pieces {
                space: '▁',
                byte_fallback: false
            })
        );
        assert_eq!(Spelling::of(&json!({"type": "WordPiece", "prefix": "##"})), None);
    }
}
