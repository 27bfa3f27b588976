//! Prompt tokenisation exactly as `FluxPipeline` feeds its two text encoders: CLIP ids padded and
//! truncated to the tokenizer's `model_max_length` (77), T5 ids padded and truncated to the call's
//! `max_sequence_length`, both with the special tokens their post-processors add.
//!
//! The tokenizers are loaded from their `tokenizer.json`, but padding and truncation are set here
//! from the pipeline's parameters, because `tokenizer.json` files in the wild carry whatever
//! settings were active when they were saved (often none, sometimes another length). The pad token
//! is the one named by `tokenizer_config.json`, as transformers resolves it.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use tokenizers::{
    PaddingDirection, PaddingParams, PaddingStrategy, Tokenizer, TruncationDirection, TruncationParams,
    TruncationStrategy,
};

use crate::config::{read_json, ConfigFileError};

#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    #[error(transparent)]
    Config(#[from] ConfigFileError),
    #[error("cannot read tokenizer {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot load tokenizer {path}: {source}")]
    Load { path: PathBuf, source: tokenizers::Error },
    #[error("tokenizer config {path} has no `{field}`")]
    MissingField { path: PathBuf, field: &'static str },
    #[error("pad token {token:?} is not in the vocabulary of {path}")]
    UnknownPadToken { path: PathBuf, token: String },
    #[error("cannot set truncation to {max_length} tokens: {source}")]
    Truncation {
        max_length: usize,
        source: tokenizers::Error,
    },
    #[error("cannot tokenize prompt: {source}")]
    Encode { source: tokenizers::Error },
}

const CONFIG_FILE: &str = "tokenizer_config.json";

fn missing(dir: &Path, field: &'static str) -> PromptError {
    PromptError::MissingField {
        path: dir.join(CONFIG_FILE),
        field,
    }
}

/// The parts of `tokenizer_config.json` that transformers uses to pad.
#[derive(Debug, Deserialize)]
struct RawTokenizerConfig {
    pad_token: Option<TokenName>,
    model_max_length: Option<usize>,
}

/// A special token as `tokenizer_config.json` names it: a bare string, or a serialized
/// `AddedToken` object (older transformers) whose `content` is the string.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum TokenName {
    Plain(String),
    Added { content: String },
}

impl TokenName {
    fn into_string(self) -> String {
        match self {
            Self::Plain(name) | Self::Added { content: name } => name,
        }
    }
}

/// A tokenizer that always yields exactly `max_length` ids, as the pipeline's
/// `padding="max_length", truncation=True` calls do.
pub struct PromptTokenizer {
    inner: Tokenizer,
    max_length: usize,
}

impl PromptTokenizer {
    /// The CLIP tokenizer of `dir` (FluxPipeline's `tokenizer/`), at its `model_max_length`.
    pub fn clip(dir: &Path) -> Result<Self, PromptError> {
        let config: RawTokenizerConfig = read_json(&dir.join(CONFIG_FILE))?;
        let max_length = config
            .model_max_length
            .ok_or_else(|| missing(dir, "model_max_length"))?;
        Self::load(dir, config, max_length)
    }

    /// The T5 tokenizer of `dir` (FluxPipeline's `tokenizer_2/`), at the call's
    /// `max_sequence_length` (512 for FLUX.1-dev by default, 256 for schnell).
    pub fn t5(dir: &Path, max_sequence_length: usize) -> Result<Self, PromptError> {
        Self::load(dir, read_json(&dir.join(CONFIG_FILE))?, max_sequence_length)
    }

    fn load(dir: &Path, config: RawTokenizerConfig, max_length: usize) -> Result<Self, PromptError> {
        let pad_token = config.pad_token.ok_or_else(|| missing(dir, "pad_token"))?.into_string();
        let path = dir.join("tokenizer.json");
        let bytes = cleave_hf::read_regular(&path).map_err(|source| PromptError::Read {
            path: path.clone(),
            source,
        })?;
        let mut inner = Tokenizer::from_bytes(bytes).map_err(|source| PromptError::Load {
            path: path.clone(),
            source,
        })?;
        let pad_id = inner
            .token_to_id(&pad_token)
            .ok_or_else(|| PromptError::UnknownPadToken {
                path,
                token: pad_token.clone(),
            })?;
        // Truncation leaves room for the special tokens the post-processor adds, so the last id is
        // still EOS on a truncated prompt.
        inner
            .with_truncation(Some(TruncationParams {
                direction: TruncationDirection::Right,
                max_length,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            }))
            .map_err(|source| PromptError::Truncation { max_length, source })?;
        inner.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::Fixed(max_length),
            direction: PaddingDirection::Right,
            pad_to_multiple_of: None,
            pad_id,
            pad_type_id: 0,
            pad_token,
        }));
        Ok(Self { inner, max_length })
    }

    /// Number of ids [`encode`](Self::encode) returns.
    pub fn max_length(&self) -> usize {
        self.max_length
    }

    /// The `input_ids` row the pipeline passes to the text encoder (int64, as torch gives them).
    pub fn encode(&self, prompt: &str) -> Result<Vec<i64>, PromptError> {
        let encoding = self
            .inner
            .encode(prompt, true)
            .map_err(|source| PromptError::Encode { source })?;
        Ok(encoding.get_ids().iter().map(|&id| i64::from(id)).collect())
    }
}
