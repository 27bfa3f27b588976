//! A sentence-embedding model directory: a BERT encoder, its tokenizer,
//! and sentence-transformers' pooling (modules.json, 1_Pooling/config.json).

use std::path::{Path, PathBuf};

use cleave_hf::{check_model_dir, sentence_max_seq_length, Checkpoint, Pooling, Tokenizer};
use cleave_nn::{Placed, Result};
use cleave_plan::Plan;
use cleave_shaders::cubecl::prelude::*;

use crate::bert::{Bert, BertConfig};
use crate::compiled::{self, Job};
use crate::registry::Family;

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
    /// Whether the directory at `path` holds an encoder this opens.
    pub fn recognizes(path: &Path) -> bool {
        Family::of_config(&path.join("config.json"), &[Family::Bert]).is_ok()
    }

    pub fn open(path: &Path) -> Result<Self> {
        check_model_dir(path)?;
        let config_path = path.join("config.json");
        Family::of_config(&config_path, &[Family::Bert])?;
        let config = BertConfig::from_file(&config_path)?;
        let mut tokenizer = Tokenizer::from_dir(path, &[])?;
        let max_len = sentence_max_seq_length(path)?;
        tokenizer.truncate_to(max_len.unwrap_or(config.max_positions).min(config.max_positions))?;
        Ok(EncoderDir {
            path: path.to_path_buf(),
            pooling: Pooling::from_dir(path)?,
            checkpoint: Checkpoint::open(path)?,
            config,
            tokenizer,
        })
    }

    /// Its shape in a few words, for `cleave plan`.
    pub fn describe(&self) -> String {
        let c = &self.config;
        format!("BERT encoder, {} blocks, hidden {}", c.layers, c.hidden_size)
    }

    /// Uploads the encoder to `devices` as `plan` places it; `progress` is
    /// told the checkpoint bytes read after each tensor.
    pub fn load<R: Runtime>(
        &self,
        devices: Vec<Placed<R>>,
        plan: Plan,
        progress: &mut dyn FnMut(u64),
    ) -> Result<SentenceEncoder<'_>> {
        let model = compiled::run(
            devices,
            Job::Encoder {
                dir: self,
                plan,
                progress,
            },
        )?;
        Ok(SentenceEncoder { model, dir: self })
    }

    /// What [`EncoderDir::load`] does, compiled in this crate (see
    /// [`compiled`]).
    pub(crate) fn load_here<R: Runtime>(
        &self,
        devices: Vec<Placed<R>>,
        plan: Plan,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Box<dyn Encoder>> {
        Ok(Box::new(Bert::load(
            devices,
            plan,
            &self.config,
            &self.checkpoint,
            progress,
        )?))
    }

    /// What the planner needs to place the `te` module.
    pub fn inventory(&self) -> cleave_plan::Inventory {
        let (embed, blocks, compute) = self.config.bytes(&self.checkpoint);
        cleave_plan::Inventory {
            module: "te".into(),
            head_bytes: embed,
            block_bytes: blocks,
            tail_bytes: 0,
            tail_shared_with_head: 0,
            cache_bytes: Vec::new(),
            compute_bytes: compute,
            // BERT runs split by layers only.
            geometry: None,
        }
    }
}

/// An encoder's pass over sequences of token ids, on the runtime it was
/// loaded on: each sequence's hidden states, `[tokens][hidden]` flattened.
pub(crate) trait Encoder {
    fn forward(&self, sequences: &[Vec<u32>]) -> Result<Vec<Vec<f32>>>;
}

impl<R: Runtime> Encoder for Bert<R> {
    fn forward(&self, sequences: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        Bert::forward(self, sequences)
    }
}

/// An encoder on its devices, with its directory's pooling.
pub struct SentenceEncoder<'d> {
    model: Box<dyn Encoder>,
    dir: &'d EncoderDir,
}

impl SentenceEncoder<'_> {
    /// One pooled embedding per sequence of token ids.
    pub fn embed(&self, sequences: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        let hidden = self.dir.config.hidden_size;
        let states = self.model.forward(sequences)?;
        Ok(states.iter().map(|s| self.dir.pooling.pool(s, hidden)).collect())
    }
}
