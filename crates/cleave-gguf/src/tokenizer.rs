//! The tokenizer a GGUF file carries in its metadata (`tokenizer.ggml.*`),
//! rebuilt as the tokenizer.json Hugging Face's `tokenizers` would load:
//! byte-level BPE ("gpt2") with the pre-tokenizer `tokenizer.ggml.pre`
//! names, a SentencePiece vocabulary ("llama") as BPE with merges derived
//! from its scores, as transformers' GGUF converter builds it, or Gemma 4's
//! ("gemma4": SentencePiece's pieces with stored merges).

use std::cmp::Ordering;
use std::collections::HashMap;
use std::str::FromStr;

use serde_json::{json, Map, Value};

use crate::error::{GgufError, Result};
use crate::file::GgufFile;
use crate::metadata::Metadata;

/// `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
const TOKEN_UNKNOWN: i32 = 2;
const TOKEN_CONTROL: i32 = 3;
const TOKEN_USER_DEFINED: i32 = 4;

/// GPT-2's split (`tokenizers`' ByteLevel pre-tokenizer applies it itself).
const GPT2_NAMES: &[&str] = &["gpt-2"];
/// Llama 3's split, as its tokenizer.json writes it.
const LLAMA3_NAMES: &[&str] = &["llama-bpe", "llama3", "llama-v3"];
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's: Llama 3's with digits one at a time.
const QWEN2_NAMES: &[&str] = &["qwen2"];
const QWEN2_REGEX: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5's: Qwen2's with combining marks kept with their letters.
const QWEN35_NAMES: &[&str] = &["qwen35"];
const QWEN35_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

impl GgufFile {
    /// The tokenizer in this file's metadata, with its BOS and EOS ids,
    /// whether prompts start with BOS, and the chat template.
    pub fn tokenizer(&self) -> Result<cleave_hf::Tokenizer> {
        let m = self.metadata();
        let tokens = m.strings("tokenizer.ggml.tokens")?;
        let types = m.opt_i32s("tokenizer.ggml.token_type")?;
        if let Some(types) = types.filter(|t| t.len() != tokens.len()) {
            return Err(m.invalid(
                "tokenizer.ggml.token_type",
                format!("{} types for {} tokens", types.len(), tokens.len()),
            ));
        }
        let type_of = |id: usize| types.map_or(0, |t| t[id]);
        let id = |key: &str| -> Result<Option<u32>> {
            match m.opt_u64(key)? {
                Some(id) if id < tokens.len() as u64 => Ok(Some(id as u32)),
                Some(id) => Err(m.invalid(key, format!("{id} is not an id of the {} tokens", tokens.len()))),
                None => Ok(None),
            }
        };
        let model_key = "tokenizer.ggml.model";
        let model = m.str(model_key)?;
        let (json, add_bos_default) = match model {
            "gpt2" => (byte_level_bpe(m, tokens, &type_of)?, false),
            "llama" => (
                sentencepiece_bpe(m, tokens, &type_of, id("tokenizer.ggml.unknown_token_id")?)?,
                true,
            ),
            "gemma4" => (
                gemma4_bpe(m, tokens, &type_of, id("tokenizer.ggml.unknown_token_id")?)?,
                true,
            ),
            other => {
                return Err(m.invalid(
                    model_key,
                    format!("tokenizer model '{other}' is not supported (supported: gpt2, llama, gemma4)"),
                ))
            }
        };
        let failed = |reason: String| GgufError::Tokenizer {
            path: self.path().into(),
            reason,
        };
        let inner = tokenizers::Tokenizer::from_str(&json.to_string()).map_err(|e| failed(e.to_string()))?;
        // llama.cpp stops at end-of-turn and end-of-message tokens as at EOS.
        let eos = ["eos", "eot", "eom"]
            .iter()
            .map(|name| id(&format!("tokenizer.ggml.{name}_token_id")))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .flatten()
            .collect();
        // Gemma 4 is always prompted after BOS: llama.cpp overrides a file
        // that says otherwise.
        let add_bos = model == "gemma4" || m.opt_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(add_bos_default);
        let chat_template = m.opt_str("tokenizer.chat_template")?.map(str::to_string);
        cleave_hf::Tokenizer::from_parts(
            self.path(),
            inner,
            id("tokenizer.ggml.bos_token_id")?,
            add_bos,
            eos,
            chat_template,
        )
        .map_err(|e| failed(e.to_string()))
    }
}

/// tokenizer.json for a byte-level BPE vocabulary (GPT-2, Llama 3, Qwen2):
/// tokens are stored byte-level encoded, merges as "left right".
fn byte_level_bpe(m: &Metadata, tokens: &[String], type_of: &dyn Fn(usize) -> i32) -> Result<Value> {
    let merges = stored_merges(m)?;
    let pre_key = "tokenizer.ggml.pre";
    let pre = m.opt_str(pre_key)?.unwrap_or("gpt-2");
    let split = |regex: &str| {
        json!({
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
            ],
        })
    };
    // (pre-tokenizer, normalizer, whether a word in the vocabulary is taken
    // whole before merging, as llama.cpp does for Llama 3)
    let (pre_tokenizer, normalizer, ignore_merges) = if GPT2_NAMES.contains(&pre) {
        let byte_level =
            json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
        (byte_level, Value::Null, false)
    } else if LLAMA3_NAMES.contains(&pre) {
        (split(LLAMA3_REGEX), Value::Null, true)
    } else if QWEN2_NAMES.contains(&pre) {
        (split(QWEN2_REGEX), json!({"type": "NFC"}), false)
    } else if QWEN35_NAMES.contains(&pre) {
        (split(QWEN35_REGEX), json!({"type": "NFC"}), false)
    } else {
        let known: Vec<&str> = [GPT2_NAMES, LLAMA3_NAMES, QWEN2_NAMES, QWEN35_NAMES].concat();
        return Err(m.invalid(
            pre_key,
            format!(
                "pre-tokenizer '{pre}' is not supported (supported: {})",
                known.join(", ")
            ),
        ));
    };
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added_tokens(tokens, type_of),
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": ignore_merges,
            "vocab": vocab(tokens),
            "merges": merges,
        },
    }))
}

/// tokenizer.json for a SentencePiece vocabulary, as transformers'
/// `GGUFLlamaConverter` builds it: BPE over pieces with merges derived from
/// the scores, unknown bytes as `<0xNN>` pieces, spaces as "▁" and a "▁"
/// before the text unless `tokenizer.ggml.add_space_prefix` is false.
fn sentencepiece_bpe(
    m: &Metadata,
    tokens: &[String],
    type_of: &dyn Fn(usize) -> i32,
    unk: Option<u32>,
) -> Result<Value> {
    let scores_key = "tokenizer.ggml.scores";
    let scores = m.required(scores_key, m.opt_f32s(scores_key)?)?;
    if scores.len() != tokens.len() {
        return Err(m.invalid(
            scores_key,
            format!("{} scores for {} tokens", scores.len(), tokens.len()),
        ));
    }
    let prefix_space = m.opt_bool("tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
    let pieces = Pieces { tokens, type_of, unk };
    Ok(pieces.tokenizer_json(prefix_space, merges_from_scores(tokens, scores)))
}

/// tokenizer.json for Gemma 4's vocabulary, as transformers'
/// `GemmaTokenizer` builds it: SentencePiece pieces with the stored merges
/// over the whole text (no pre-splitting), no prefix space.
fn gemma4_bpe(m: &Metadata, tokens: &[String], type_of: &dyn Fn(usize) -> i32, unk: Option<u32>) -> Result<Value> {
    let pieces = Pieces { tokens, type_of, unk };
    Ok(pieces.tokenizer_json(false, stored_merges(m)?))
}

/// A vocabulary of SentencePiece pieces: spaces as "▁", unknown bytes as
/// `<0xNN>` pieces.
struct Pieces<'a> {
    tokens: &'a [String],
    type_of: &'a dyn Fn(usize) -> i32,
    unk: Option<u32>,
}

impl Pieces<'_> {
    /// tokenizer.json for BPE over the pieces with `merges`, a "▁" before
    /// the text where `prefix_space` says so (and dropped when decoding).
    fn tokenizer_json(&self, prefix_space: bool, merges: Vec<Value>) -> Value {
        let replace_space = json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"});
        let normalizers = match prefix_space {
            true => vec![json!({"type": "Prepend", "prepend": "▁"}), replace_space],
            false => vec![replace_space],
        };
        let mut decoders = vec![
            json!({"type": "Replace", "pattern": {"String": "▁"}, "content": " "}),
            json!({"type": "ByteFallback"}),
            json!({"type": "Fuse"}),
        ];
        if prefix_space {
            decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
        }
        json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added_tokens(self.tokens, self.type_of),
            "normalizer": {"type": "Sequence", "normalizers": normalizers},
            "pre_tokenizer": null,
            "post_processor": null,
            "decoder": {"type": "Sequence", "decoders": decoders},
            "model": {
                "type": "BPE",
                "dropout": null,
                "unk_token": self.unk.map(|id| self.tokens[id as usize].clone()),
                "continuing_subword_prefix": null,
                "end_of_word_suffix": null,
                "fuse_unk": true,
                "byte_fallback": true,
                "ignore_merges": false,
                "vocab": vocab(self.tokens),
                "merges": merges,
            },
        })
    }
}

/// `tokenizer.ggml.merges`, each "left right" split as llama.cpp splits
/// it: at the first space after the first character, so that a left part
/// may itself be a space.
fn stored_merges(m: &Metadata) -> Result<Vec<Value>> {
    let merges_key = "tokenizer.ggml.merges";
    m.strings(merges_key)?
        .iter()
        .map(|merge| {
            let split = merge.char_indices().skip(1).find(|&(_, c)| c == ' ').map(|(i, _)| i);
            match split {
                Some(i) => Ok(json!([&merge[..i], &merge[i + 1..]])),
                None => Err(m.invalid(merges_key, format!("merge '{merge}' is not two tokens"))),
            }
        })
        .collect()
}

/// Token → id. Where a token appears twice, the later id wins, as in a
/// Python dict built from the list.
fn vocab(tokens: &[String]) -> Map<String, Value> {
    tokens
        .iter()
        .enumerate()
        .map(|(id, token)| (token.clone(), id.into()))
        .collect()
}

/// Control and unknown tokens become special added tokens and user-defined
/// ones plain added tokens: each is matched whole in the text before the
/// rest is split.
fn added_tokens(tokens: &[String], type_of: &dyn Fn(usize) -> i32) -> Vec<Value> {
    tokens
        .iter()
        .enumerate()
        .filter_map(|(id, content)| {
            let special = match type_of(id) {
                TOKEN_CONTROL | TOKEN_UNKNOWN => true,
                TOKEN_USER_DEFINED => false,
                _ => return None,
            };
            Some(json!({
                "id": id,
                "content": content,
                "single_word": false,
                "lstrip": false,
                "rstrip": false,
                "normalized": false,
                "special": special,
            }))
        })
        .collect()
}

/// The merges of a SentencePiece vocabulary, as transformers'
/// `GGUFTokenizerSkeleton` derives them: every split of every piece into
/// two pieces of the vocabulary, ranked by the score of the merged piece,
/// ties by the scores of the two parts (both sorts stable, in id order).
fn merges_from_scores(tokens: &[String], scores: &[f32]) -> Vec<Value> {
    // The first id of each piece, with the last score given to it.
    let mut order: Vec<&str> = Vec::new();
    let mut score: HashMap<&str, f32> = HashMap::new();
    for (token, &s) in tokens.iter().zip(scores) {
        if score.insert(token, s).is_none() {
            order.push(token);
        }
    }
    // Every piece has a score; `get` only keeps the lookup total.
    let score_of = |piece: &str| score.get(piece).copied().unwrap_or(f32::NEG_INFINITY);
    // Python's order of floats: -0.0 equals 0.0.
    let descending = |a: f32, b: f32| b.partial_cmp(&a).unwrap_or(Ordering::Equal);
    let mut merges: Vec<(&str, &str, f32)> = Vec::new();
    for piece in order {
        let mut local: Vec<(&str, &str, f32)> = piece
            .char_indices()
            .skip(1)
            .map(|(i, _)| piece.split_at(i))
            .filter(|(l, r)| score.contains_key(l) && score.contains_key(r))
            .map(|(l, r)| (l, r, score_of(piece)))
            .collect();
        local.sort_by(|a, b| descending(score_of(a.0), score_of(b.0)).then(descending(score_of(a.1), score_of(b.1))));
        merges.extend(local);
    }
    merges.sort_by(|a, b| descending(a.2, b.2));
    merges.into_iter().map(|(l, r, _)| json!([l, r])).collect()
}
