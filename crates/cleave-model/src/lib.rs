//! cleave's models: a Hugging Face model directory (config.json,
//! safetensors, tokenizer) and the model families that run it.

mod bert;
mod checkpoint;
mod clip;
mod config;
mod encoder;
mod error;
mod flux;
mod flux_dir;
mod llama;
mod lora;
mod placement;
mod t5;
mod tokenizer;
mod vae;
mod weights;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use bert::{Bert, BertConfig};
pub use checkpoint::{Checkpoint, DType};
pub use clip::{Clip, ClipActivation, ClipConfig, ClipOutput};
pub use config::{Architecture, ModelConfig, RopeScaling};
pub use encoder::{EncoderDir, Pooling, PoolingMode, ENCODER_MODULES};
pub use error::{ModelError, Result};
pub use flux::{FluxConfig, FluxInput, FluxTransformer};
pub use flux_dir::{Component, FluxDir, FLUX_MODULES};
pub use llama::{Context, Llama, Logits, Session};
pub use lora::{LoraAdapter, LoraMode};
pub use placement::{Placed, Placement};
pub use t5::{relative_position_bucket, T5Config, T5Encoder};
pub use tokenizer::Tokenizer;
pub use vae::{VaeConfig, VaeDecoder};

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
/// Fails unless `path` is a directory.
pub(crate) fn check_model_dir(path: &Path) -> Result<()> {
    if path.is_dir() {
        Ok(())
    } else {
        Err(ModelError::Io {
            path: path.to_path_buf(),
            reason: "not a model directory (expected config.json, tokenizer.json and safetensors weights)".into(),
        })
    }
}

/// Module names a model directory of this crate holds.
pub const LLM_MODULES: [&str; 1] = ["llm"];

pub struct ModelDir {
    pub path: PathBuf,
    pub config: ModelConfig,
    pub tokenizer: Tokenizer,
    pub checkpoint: Arc<Checkpoint>,
}

impl ModelDir {
    pub fn open(path: &Path) -> Result<Self> {
        check_model_dir(path)?;
        let config = ModelConfig::from_file(&path.join("config.json"))?;
        let tokenizer = Tokenizer::from_dir(path, &config.eos_token_ids)?;
        let checkpoint = Arc::new(Checkpoint::open(path)?);
        Ok(ModelDir {
            path: path.to_path_buf(),
            config,
            tokenizer,
            checkpoint,
        })
    }

    /// Whether the output head is the embedding table itself: not saved
    /// separately in the checkpoint, and not declared untied in the config
    /// (an untied head that is missing is an error naming the tensor).
    pub fn ties_output_head(&self) -> bool {
        self.config.tie_word_embeddings != Some(false) && !self.checkpoint.contains("lm_head.weight")
    }

    /// What the planner needs to place the `llm` module for one sequence
    /// of `context` positions: bytes on a device (all f32) of each part.
    pub fn inventory(&self, context: usize) -> cleave_plan::Inventory {
        self.inventory_for(context, 1)
    }

    /// [`ModelDir::inventory`] with a KV cache for `sequences` sequences
    /// of `context` positions each (a server's parallel slots).
    pub fn inventory_for(&self, context: usize, sequences: usize) -> cleave_plan::Inventory {
        let c = &self.config;
        let f32_bytes = |elements: usize| (elements * size_of::<f32>()) as u64;
        let (h, q, kv, i) = c.widths();
        let bias = |on: bool, n: usize| if on { n } else { 0 };
        let block = h * (q + 2 * kv)
            + q * h
            + 3 * h * i
            + 2 * h
            + bias(c.qkv_bias, q + 2 * kv)
            + bias(c.o_bias, h)
            + bias(c.mlp_bias, 2 * i + h);
        let embed = c.vocab_size * h;
        // One prefill batch: hidden states, q/k/v, attention scores over the
        // whole context, the MLP's three intermediates, one row of logits,
        // plus the rotary table.
        let batch = context.min(512);
        let compute =
            batch * (2 * h + q + 2 * kv + 3 * i) + c.heads * batch * context + c.vocab_size + context * c.head_dim;
        cleave_plan::Inventory {
            module: "llm".into(),
            head_bytes: f32_bytes(embed),
            block_bytes: vec![f32_bytes(block); c.layers],
            tail_bytes: f32_bytes(h + embed),
            tail_shared_with_head: if self.ties_output_head() { f32_bytes(embed) } else { 0 },
            kv_bytes_per_block: (sequences * context * c.kv_bytes_per_position()) as u64,
            compute_bytes: f32_bytes(compute),
            geometry: Some(c.block_geometry()),
        }
    }
}
