//! cleave's models: a Hugging Face model directory (config.json,
//! safetensors, tokenizer) and the model families that run it.

mod checkpoint;
mod config;
mod error;
mod llama;
mod tokenizer;
mod weights;

use std::path::{Path, PathBuf};

pub use checkpoint::{Checkpoint, DType};
pub use config::{Architecture, ModelConfig, RopeScaling};
pub use error::{ModelError, Result};
pub use llama::{Context, Llama, Logits, Session};
pub use tokenizer::Tokenizer;

/// What the generation loop needs of a model with one sequence's state.
pub trait CausalLm {
    fn vocab_size(&self) -> usize;
    /// Positions this sequence's context holds.
    fn capacity(&self) -> usize;
    /// Positions the model was trained for.
    fn max_positions(&self) -> usize;
    /// Appends `ids` and returns the logits of the last or every new position.
    fn forward(&mut self, ids: &[u32], which: Logits) -> Result<Vec<f32>>;
}

/// A model directory, checked and opened, with nothing on a device yet.
pub struct ModelDir {
    pub path: PathBuf,
    pub config: ModelConfig,
    pub tokenizer: Tokenizer,
    pub checkpoint: Checkpoint,
}

impl ModelDir {
    pub fn open(path: &Path) -> Result<Self> {
        if !path.is_dir() {
            return Err(ModelError::Io {
                path: path.to_path_buf(),
                reason: "not a model directory (expected config.json, tokenizer.json and safetensors weights)".into(),
            });
        }
        let config = ModelConfig::from_file(&path.join("config.json"))?;
        let tokenizer = Tokenizer::from_dir(path, &config.eos_token_ids)?;
        let checkpoint = Checkpoint::open(path)?;
        Ok(ModelDir {
            path: path.to_path_buf(),
            config,
            tokenizer,
            checkpoint,
        })
    }
}
