//! Manifests that say how a directory's parts fit together:
//! sentence-transformers' `modules.json` (pooling, normalization, the
//! sequence length) and diffusers' `model_index.json` (the pipeline class).

use std::path::Path;

use serde::Deserialize;

use crate::error::{read_json, ReadError, Result};

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
    pub fn from_dir(dir: &Path) -> Result<Self> {
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
                        return Err(ReadError::Config {
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

/// sentence-transformers' cap on a sequence's tokens
/// (`sentence_bert_config.json`'s `max_seq_length`), if the directory has one.
pub fn sentence_max_seq_length(dir: &Path) -> Result<Option<usize>> {
    let path = dir.join("sentence_bert_config.json");
    if !path.exists() {
        return Ok(None);
    }
    Ok(read_json::<SentenceBertConfig>(&path)?.max_seq_length)
}

#[derive(Deserialize)]
struct ModelIndex {
    #[serde(rename = "_class_name")]
    class_name: Option<String>,
}

/// The pipeline class (`_class_name`) of a diffusers directory's
/// `model_index.json`, checked to be one of `supported`.
pub fn pipeline_class(dir: &Path, supported: &[&str]) -> Result<String> {
    let index_path = dir.join("model_index.json");
    if !index_path.is_file() {
        return Err(ReadError::Io {
            path: dir.to_path_buf(),
            reason: "not a pipeline directory (expected model_index.json and a folder per component, \
                     as diffusers' save_pretrained writes them)"
                .into(),
        });
    }
    let index: ModelIndex = read_json(&index_path)?;
    let class = index.class_name.unwrap_or_default();
    if !supported.contains(&class.as_str()) {
        return Err(ReadError::Architecture {
            path: index_path,
            found: class,
            supported: supported.join(", "),
        });
    }
    Ok(class)
}
