//! How a config meets its checkpoint: the output head's tie, the language
//! model of a multimodal checkpoint, fused projections loaded as their
//! parts, and the shapes the checkpoint must hold before anything is
//! planned.

use cleave_hf::{lora_factor_name, Checkpoint, Cut, LoraAdapter, Result, Rows};

use super::names::{
    block_tensor, block_weight, weight, EMBEDDINGS, LAYER_SCALAR, OUTPUT_HEAD, PER_LAYER_EMBEDDINGS, PER_LAYER_NORM,
    PER_LAYER_PROJECTION,
};
use std::ops::Range;

use super::{Architecture, MatmulTensor, MlpTensors, ModelConfig};

/// A part of a fused projection: its name, and the runs of the fused
/// tensor's rows it takes, in order.
type Part = (String, Vec<Range<usize>>);

impl ModelConfig {
    /// Whether the output head is the embedding table itself: not saved
    /// separately in the checkpoint, and not declared untied (an untied head
    /// that is missing is an error naming the tensor).
    pub fn ties_output_head(&self, checkpoint: &Checkpoint) -> bool {
        self.tie_word_embeddings != Some(false) && !checkpoint.contains(&weight(OUTPUT_HEAD))
    }

    /// Block `layer`'s fused projections, named as inside `model.layers.N`,
    /// with the runs of rows each of their parts takes: Phi-3's `qkv_proj`
    /// and `gate_up_proj` (the parts stacked in order), Qwen3.5's `q_proj`
    /// (each head's query rows, then its gate's); none for the other
    /// families.
    fn fused(&self, layer: usize) -> Vec<(&'static str, Vec<Part>)> {
        let stacked = |parts: &[&MatmulTensor]| {
            let mut start = 0;
            let rows = |m: &&MatmulTensor| {
                start += m.rows;
                (m.name.clone(), std::iter::once(start - m.rows..start).collect())
            };
            parts.iter().map(rows).collect()
        };
        let (attention, mlp) = (self.attention_tensors(layer), self.mlp_tensors(layer, 0));
        match (self.architecture, attention.gate.clone()) {
            (Architecture::Phi3, _) => vec![
                ("self_attn.qkv_proj", stacked(&attention.qkv())),
                ("mlp.gate_up_proj", stacked(&[&mlp.gate, &mlp.up])),
            ],
            (_, Some(gate)) if !self.is_linear(layer) => {
                let hd = self.head_dim;
                let runs = |offset: usize| (0..self.heads).map(move |h| 2 * h * hd + offset..2 * h * hd + offset + hd);
                let parts = vec![(attention.q.name, runs(0).collect()), (gate.name, runs(hd).collect())];
                vec![("self_attn.q_proj", parts)]
            }
            _ => Vec::new(),
        }
    }

    /// Whether some block has fused projections.
    fn has_fused(&self) -> bool {
        self.architecture == Architecture::Phi3 || self.attention_output_gate
    }

    /// Each fused projection of block `layer` as `name(projection)` names
    /// it, with its parts and their runs of rows.
    fn fused_names(&self, layer: usize, name: impl Fn(&str) -> String) -> Vec<(String, Vec<Part>)> {
        self.fused(layer)
            .into_iter()
            .map(|(fused, parts)| {
                let parts = parts.into_iter().map(|(part, rows)| (name(&part), rows)).collect();
                (name(fused), parts)
            })
            .collect()
    }

    /// Makes the checkpoint hold its tensors as the loader names them: a
    /// multimodal checkpoint's language model under `model.` (its vision
    /// tower is left unread), and each fused projection as its parts
    /// (Phi-3's `qkv_proj` as `q_proj`, `k_proj`, `v_proj` and
    /// `gate_up_proj` as `gate_proj`, `up_proj`: rows of the stored tensor,
    /// no copy; Qwen3.5's `q_proj` as `q_proj.query` and `q_proj.gate`), so
    /// that every split mode slices them as it slices the others.
    pub fn adapt(&self, checkpoint: &mut Checkpoint) {
        if let Some(prefix) = self.stored_prefix {
            checkpoint.rename_prefix(prefix, "model.");
        }
        match self.architecture {
            Architecture::GptOss => self.unstack_experts(checkpoint),
            Architecture::Gemma4 => self.unstack_gemma4_experts(checkpoint),
            _ => {}
        }
        if !self.has_fused() {
            return;
        }
        // Block by block while the checkpoint holds them: the layer count
        // is checked against the checkpoint only after this (by the parts'
        // names), and a damaged config may promise billions.
        for layer in 0..self.layers {
            let fused = self.fused_names(layer, |p| block_weight(layer, p));
            if !fused.iter().all(|(stored, _)| checkpoint.contains(stored)) {
                break;
            }
            for (stored, parts) in fused {
                checkpoint.split_rows(&stored, &parts);
            }
        }
    }

    /// gpt-oss's experts, stored as one stack a block: `gate_up_proj`
    /// (`[experts, hidden, 2 · width]`, each expert's matrix transposed,
    /// the gate's and the up projection's columns interleaved) with its
    /// bias `[experts, 2 · width]`, and `down_proj` (`[experts, width,
    /// hidden]`) with its bias; or, as the published checkpoints hold
    /// them, each matrix in MXFP4 (`_blocks` and `_scales`, `[out, in]`
    /// and not transposed: the gate's and the up projection's rows
    /// interleaved). Each expert's projections then load by the names
    /// every other mixture's do (`mlp.experts.E.gate_proj`), copied out of
    /// the stack, MXFP4 staying MXFP4. Experts are cut up to one past those
    /// the stack holds, so that a config promising more fails by that
    /// expert's name, and a damaged one is never counted out in full.
    fn unstack_experts(&self, checkpoint: &mut Checkpoint) {
        let count = self.experts.map_or(0, |e| e.count);
        for layer in 0..self.layers {
            let stack = |part: &str| block_tensor(layer, &format!("mlp.experts.{part}"));
            let mxfp4 = checkpoint.contains(&stack("gate_up_proj_blocks"));
            let counted = if mxfp4 { "gate_up_proj_scales" } else { "gate_up_proj" };
            let Some(stored) = checkpoint.shape(&stack(counted)) else {
                break;
            };
            let stored = stored.first().copied().unwrap_or(0);
            for expert in 0..count.min(stored.saturating_add(1)) {
                let mlp = self.mlp_tensors(layer, expert);
                let cut = |transposed, rows| Cut {
                    entry: Some(expert),
                    transposed,
                    rows,
                };
                // A matrix of the stack `matrix` as the part `name`.
                let matrix = |checkpoint: &mut Checkpoint, matrix: &str, name: &str, rows| match mxfp4 {
                    true => {
                        let (blocks, scales) = (stack(&format!("{matrix}_blocks")), stack(&format!("{matrix}_scales")));
                        checkpoint.cut_mxfp4((&blocks, &scales), name, cut(false, rows));
                    }
                    false => checkpoint.cut(&stack(matrix), name, cut(true, rows)),
                };
                let halves = [(&mlp.gate, 0), (&mlp.up, 1)];
                for (part, first) in halves {
                    let name = block_tensor(layer, &part.name);
                    matrix(
                        checkpoint,
                        "gate_up_proj",
                        &weight(&name),
                        Rows::Every { first, step: 2 },
                    );
                    let bias = (stack("gate_up_proj_bias"), format!("{name}.bias"));
                    checkpoint.cut(&bias.0, &bias.1, cut(false, Rows::Every { first, step: 2 }));
                }
                let down = block_tensor(layer, &mlp.down.name);
                let all = || Rows::Runs(std::iter::once(0..mlp.down.rows).collect());
                matrix(checkpoint, "down_proj", &weight(&down), all());
                checkpoint.cut(&stack("down_proj_bias"), &format!("{down}.bias"), cut(false, all()));
            }
        }
    }

    /// Gemma 4's experts, stored as one stack a block: `experts.gate_up_proj`
    /// (`[experts, 2 · width, hidden]`, the gate's rows then the up
    /// projection's) and `experts.down_proj` (`[experts, hidden, width]`),
    /// cut into each expert's projections (`experts.E.gate_proj`) as
    /// gpt-oss's are.
    fn unstack_gemma4_experts(&self, checkpoint: &mut Checkpoint) {
        let Some(experts) = self.experts else { return };
        for layer in 0..self.layers {
            let stack = |part: &str| block_tensor(layer, &format!("experts.{part}"));
            let Some(stored) = checkpoint.shape(&stack("gate_up_proj")) else {
                break;
            };
            let stored = stored.first().copied().unwrap_or(0);
            for expert in 0..experts.count.min(stored.saturating_add(1)) {
                let mlp = self.mlp_tensors(layer, expert);
                let rows = |run: Range<usize>| Cut {
                    entry: Some(expert),
                    transposed: false,
                    rows: Rows::Runs(std::iter::once(run).collect()),
                };
                let width = experts.width;
                let parts = [
                    ("gate_up_proj", &mlp.gate, 0..width),
                    ("gate_up_proj", &mlp.up, width..2 * width),
                    ("down_proj", &mlp.down, 0..mlp.down.rows),
                ];
                for (stacked, part, run) in parts {
                    checkpoint.cut(&stack(stacked), &block_weight(layer, &part.name), rows(run));
                }
            }
        }
    }

    /// The same for a LoRA adapter of the fused projections (PEFT targets
    /// them as stored): each part's B is its rows of the fused B, its A
    /// the fused A whole, so that the loader finds each part's update as
    /// it finds its weight. The layer count is the checked one of an
    /// opened model.
    pub fn adapt_adapter(&self, adapter: &mut LoraAdapter) -> Result<()> {
        if !self.has_fused() {
            return Ok(());
        }
        let rank = adapter.rank();
        for layer in 0..self.layers {
            let factor = |f: &str| self.fused_names(layer, |p| lora_factor_name(&block_tensor(layer, p), f));
            for (fused, parts) in factor("B") {
                adapter.split_rows(&fused, &parts)?;
            }
            for (fused, parts) in factor("A") {
                let whole: Vec<Part> = parts
                    .into_iter()
                    .map(|(part, _)| (part, std::iter::once(0..rank).collect()))
                    .collect();
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
        if let Some(p) = self.per_layer_inputs {
            let all = self.layers.saturating_mul(p.width);
            checkpoint.expect_shape(&weight(PER_LAYER_EMBEDDINGS), &[p.vocab, all])?;
            checkpoint.expect_shape(&weight(PER_LAYER_PROJECTION), &[all, self.hidden_size])?;
            checkpoint.expect_shape(&weight(PER_LAYER_NORM), &[p.width])?;
        }
        let last = self.layers - 1;
        // The last block, and the last of the other kind in a hybrid model
        // (or of the other size of heads, or with a KV cache of its own).
        let other = |differs: &dyn Fn(usize) -> bool| (0..self.layers).rev().find(|&l| differs(l));
        let last_linear = other(&|l| self.is_linear(l) != self.is_linear(last));
        let last_other_heads = other(&|l| self.heads_of(l) != self.heads_of(last));
        let last_own_kv = other(&|l| !self.shares_kv(l));
        for layer in [Some(last), last_linear, last_other_heads, last_own_kv]
            .into_iter()
            .flatten()
        {
            self.check_block(checkpoint, layer)?;
        }
        Ok(())
    }

    /// Fails unless the checkpoint holds every tensor of block `layer`.
    fn check_block(&self, checkpoint: &Checkpoint, layer: usize) -> Result<()> {
        let name = |tensor: &str| block_weight(layer, tensor);
        for norm in self.block_norm_tensors().iter().chain(&self.mixer_norms(layer)) {
            checkpoint.expect_shape(&name(norm.name), &[norm.len])?;
        }
        if let Some(sinks) = self.attention_tensors(layer).sinks.filter(|_| !self.is_linear(layer)) {
            checkpoint.expect_shape(&block_tensor(layer, sinks), &[self.heads])?;
        }
        if self.layer_scalar {
            checkpoint.expect_shape(&block_tensor(layer, LAYER_SCALAR), &[1])?;
        }
        if let Some((beside, experts)) = self.beside_mlp_tensors().zip(self.experts) {
            checkpoint.expect_shape(&block_tensor(layer, beside.router_scale), &[self.hidden_size])?;
            checkpoint.expect_shape(&block_tensor(layer, beside.expert_scales), &[experts.count])?;
        }
        if let Some(t) = self.linear_attention_tensors().filter(|_| self.is_linear(layer)) {
            let channels = t.qkv.rows;
            let (values, taps) = (t.b.rows, self.linear_attention.map_or(0, |l| l.conv_taps));
            checkpoint.expect_shape(&name(t.conv), &[channels, 1, taps])?;
            for vector in [t.a_log, t.dt_bias] {
                checkpoint.expect_shape(&block_tensor(layer, vector), &[values])?;
            }
        }
        // The first and the last expert only: a config that promises more
        // experts than the file holds fails by the missing one's name,
        // before any list of them is made.
        let last_expert = self.experts.map_or(0, |e| e.count - 1);
        let per_layer = self.per_layer_input_tensors();
        let (mixer, router) = (self.mixer_matmuls(layer), self.router_tensor());
        let beside = self.experts_beside_mlp.then(|| self.dense_mlp_tensors(layer));
        let mlps = [0, last_expert].map(|expert| self.mlp_tensors(layer, expert));
        let shared = self.shared_expert_tensors();
        let shared = shared.iter().flat_map(|s| s.mlp.all().into_iter().chain([&s.gate]));
        let per_layer = per_layer.iter().flat_map(|p| [&p.gate, &p.projection]);
        let mlps = beside.iter().chain(&mlps).flat_map(MlpTensors::all);
        let matmuls = mixer.iter().chain(mlps).chain(per_layer).chain(&router);
        for matmul in matmuls.chain(shared) {
            checkpoint.expect_shape(&name(&matmul.name), &[matmul.rows, matmul.cols])?;
        }
        Ok(())
    }
}
