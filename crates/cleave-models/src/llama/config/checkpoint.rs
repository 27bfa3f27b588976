//! How a config meets its checkpoint: the output head's tie, Phi-3's fused
//! projections loaded as their parts, and the shapes the checkpoint must
//! hold before anything is planned.

use cleave_hf::{lora_factor_name, Checkpoint, LoraAdapter, Result};

use super::names::{block_tensor, block_weight, weight, EMBEDDINGS, OUTPUT_HEAD};
use super::{Architecture, MatmulTensor, MlpTensors, ModelConfig, Parts};

impl ModelConfig {
    /// Whether the output head is the embedding table itself: not saved
    /// separately in the checkpoint, and not declared untied (an untied head
    /// that is missing is an error naming the tensor).
    pub fn ties_output_head(&self, checkpoint: &Checkpoint) -> bool {
        self.tie_word_embeddings != Some(false) && !checkpoint.contains(&weight(OUTPUT_HEAD))
    }

    /// Phi-3's fused projections, named as inside `model.layers.N`, with
    /// the rows of each of their parts (stacked in order); none for the
    /// other families.
    fn fused(&self) -> Vec<(&'static str, Parts<String>)> {
        if self.architecture != Architecture::Phi3 {
            return Vec::new();
        }
        let stacked = |parts: &[&MatmulTensor]| {
            let mut start = 0;
            let rows = |m: &&MatmulTensor| {
                start += m.rows;
                (m.name.clone(), start - m.rows..start)
            };
            parts.iter().map(rows).collect()
        };
        let (attention, mlp) = (self.attention_tensors(), self.mlp_tensors(0));
        vec![
            (
                "self_attn.qkv_proj",
                stacked(&[&attention.q, &attention.k, &attention.v]),
            ),
            ("mlp.gate_up_proj", stacked(&[&mlp.gate, &mlp.up])),
        ]
    }

    /// Each fused projection of block `layer` as `name(projection)` names
    /// it, with its parts and their rows.
    fn fused_names(&self, name: impl Fn(&str) -> String) -> Vec<(String, Parts<String>)> {
        self.fused()
            .into_iter()
            .map(|(fused, parts)| {
                let parts = parts.into_iter().map(|(part, rows)| (name(&part), rows)).collect();
                (name(fused), parts)
            })
            .collect()
    }

    /// Makes Phi-3's fused weights load as their parts: `qkv_proj` as
    /// `q_proj`, `k_proj`, `v_proj` and `gate_up_proj` as `gate_proj`,
    /// `up_proj` (rows of the stored tensor, no copy), so that every split
    /// mode slices them as it slices the others.
    pub fn unfuse(&self, checkpoint: &mut Checkpoint) {
        // Block by block while the checkpoint holds them: the layer count
        // is checked against the checkpoint only after this (by the parts'
        // names), and a damaged config may promise billions.
        for layer in 0..self.layers {
            let fused = self.fused_names(|p| block_weight(layer, p));
            if fused.is_empty() || !fused.iter().all(|(stored, _)| checkpoint.contains(stored)) {
                break;
            }
            for (stored, parts) in fused {
                checkpoint.split_rows(&stored, &parts);
            }
        }
    }

    /// The same for a LoRA adapter of Phi-3's fused projections (PEFT
    /// targets `qkv_proj` and `gate_up_proj`): each part's B is its rows of
    /// the fused B, its A the fused A whole, so that the loader finds each
    /// part's update as it finds its weight. The layer count is the
    /// checked one of an opened model.
    pub fn unfuse_adapter(&self, adapter: &mut LoraAdapter) -> Result<()> {
        if self.fused().is_empty() {
            return Ok(());
        }
        let rank = adapter.rank();
        for layer in 0..self.layers {
            let factor = |f: &str| self.fused_names(|p| lora_factor_name(&block_tensor(layer, p), f));
            for (fused, parts) in factor("B") {
                adapter.split_rows(&fused, &parts)?;
            }
            for (fused, parts) in factor("A") {
                let whole: Parts<String> = parts.into_iter().map(|(part, _)| (part, 0..rank)).collect();
                adapter.split_rows(&fused, &whole)?;
            }
        }
        Ok(())
    }

    /// Fails unless the checkpoint holds what this config describes: the
    /// embedding table `[vocab_size, hidden_size]` and the shape of every
    /// tensor of the last block. Every size the planner multiplies is then
    /// bounded by the checkpoint's own bytes, and a config that promises
    /// more than the file holds fails here, by tensor name, before anything
    /// is planned or allocated.
    pub fn check_checkpoint(&self, checkpoint: &Checkpoint) -> Result<()> {
        checkpoint.expect_shape(&weight(EMBEDDINGS), &[self.vocab_size, self.hidden_size])?;
        let last = |name: &str| block_weight(self.layers - 1, name);
        let (attention, norms) = (self.attention_tensors(), self.block_norms());
        for norm in norms.all().chain(attention.qk_norms.iter().flatten()) {
            checkpoint.expect_shape(&last(norm.name), &[norm.len])?;
        }
        // The first and the last expert only: a config that promises more
        // experts than the file holds fails by the missing one's name,
        // before any list of them is made.
        let last_expert = self.experts.map_or(0, |e| e.count - 1);
        let mlps = [0, last_expert].map(|expert| self.mlp_tensors(expert));
        let router = self.router_tensor();
        let matmuls = attention
            .matmuls()
            .into_iter()
            .chain(mlps.iter().flat_map(MlpTensors::all));
        for matmul in matmuls.chain(&router) {
            checkpoint.expect_shape(&last(&matmul.name), &[matmul.rows, matmul.cols])?;
        }
        Ok(())
    }
}
