//! A sentence-embedding model directory: a BERT encoder, its tokenizer,
//! and sentence-transformers' pooling (modules.json, 1_Pooling/config.json).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::bert::BertConfig;
use crate::error::{read_json, ModelError, Result};
use crate::{Checkpoint, Tokenizer};

/// How token states become one sentence embedding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolingMode {
    Mean,
    Cls,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pooling {
    pub mode: PoolingMode,
    /// L2-normalize the pooled vector (a `Normalize` module follows).
    pub normalize: bool,
}

#[derive(Deserialize)]
struct ModuleEntry {
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct PoolingConfig {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
}

#[derive(Deserialize)]
struct SentenceBertConfig {
    max_seq_length: Option<usize>,
}

impl Pooling {
    /// Reads sentence-transformers' modules.json; a plain BERT directory
    /// without one is mean-pooled and not normalized.
    fn from_dir(dir: &Path) -> Result<Self> {
        let modules_path = dir.join("modules.json");
        if !modules_path.exists() {
            return Ok(Pooling {
                mode: PoolingMode::Mean,
                normalize: false,
            });
        }
        let modules: Vec<ModuleEntry> = read_json(&modules_path)?;
        let normalize = modules.iter().any(|m| m.kind.ends_with(".Normalize"));
        let mode = match modules.iter().find(|m| m.kind.ends_with(".Pooling")) {
            None => PoolingMode::Mean,
            Some(m) => {
                let path = dir.join(&m.path).join("config.json");
                let config: PoolingConfig = read_json(&path)?;
                match (config.pooling_mode_cls_token, config.pooling_mode_mean_tokens) {
                    (true, false) => PoolingMode::Cls,
                    (false, true) => PoolingMode::Mean,
                    _ => {
                        return Err(ModelError::Config {
                            path,
                            field: "pooling_mode_*",
                            reason: "cleave pools by exactly one of mean_tokens or cls_token".into(),
                        })
                    }
                }
            }
        };
        Ok(Pooling { mode, normalize })
    }

    /// One embedding from a sequence's token states (`[len, hidden]`).
    pub fn pool(&self, states: &[f32], hidden: usize) -> Vec<f32> {
        let tokens = states.len() / hidden;
        let mut pooled = match self.mode {
            PoolingMode::Cls => states[..hidden].to_vec(),
            PoolingMode::Mean => (0..hidden)
                .map(|d| (0..tokens).map(|t| states[t * hidden + d]).sum::<f32>() / tokens as f32)
                .collect(),
        };
        if self.normalize {
            // sentence-transformers divides by max(norm, 1e-12).
            let norm = pooled.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
            pooled.iter_mut().for_each(|v| *v /= norm);
        }
        pooled
    }
}

/// Module names an encoder directory holds.
pub const ENCODER_MODULES: [&str; 1] = ["te"];

/// An encoder directory, checked and opened, with nothing on a device yet.
pub struct EncoderDir {
    pub path: PathBuf,
    pub config: BertConfig,
    pub tokenizer: Tokenizer,
    pub checkpoint: Checkpoint,
    pub pooling: Pooling,
}

impl EncoderDir {
    pub fn open(path: &Path) -> Result<Self> {
        crate::check_model_dir(path)?;
        let config_path = path.join("config.json");
        if !BertConfig::is_bert(&config_path)? {
            return Err(ModelError::Architecture {
                path: config_path,
                found: "a non-BERT model".into(),
                supported: "BertModel".into(),
            });
        }
        let config = BertConfig::from_file(&config_path)?;
        let mut tokenizer = Tokenizer::from_dir(path, &[])?;
        let sbert = path.join("sentence_bert_config.json");
        let max_len = if sbert.exists() {
            read_json::<SentenceBertConfig>(&sbert)?.max_seq_length
        } else {
            None
        };
        tokenizer.truncate_to(max_len.unwrap_or(config.max_positions).min(config.max_positions))?;
        Ok(EncoderDir {
            path: path.to_path_buf(),
            pooling: Pooling::from_dir(path)?,
            checkpoint: Checkpoint::open(path)?,
            config,
            tokenizer,
        })
    }

    /// What the planner needs to place the `te` module.
    pub fn inventory(&self) -> cleave_plan::Inventory {
        let (embed, block, compute) = self.config.bytes();
        cleave_plan::Inventory {
            module: "te".into(),
            head_bytes: embed,
            block_bytes: vec![block; self.config.layers],
            tail_bytes: 0,
            tail_shared_with_head: 0,
            kv_bytes_per_block: 0,
            compute_bytes: compute,
            // BERT runs split by layers only.
            geometry: None,
        }
    }
}
