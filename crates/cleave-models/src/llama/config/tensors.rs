//! Every tensor of a block, declared once: its name inside
//! `model.layers.N`, its shape, its role in the split modes and its bias.
//! The checkpoint check (checkpoint.rs), the planner's geometry and
//! inventory (inventory.rs) and the loader (load.rs) all read these; the
//! stored type of each is the checkpoint's.

use cleave_plan::Role;

use super::{Architecture, ModelConfig};

/// The stored names of the family's tensors, as transformers publishes
/// them, built here only (as llama.cpp builds every name with `tn()`).
pub mod names {
    /// The embedding table (and a tied output head).
    pub const EMBEDDINGS: &str = "model.embed_tokens";
    /// The norm after the last block.
    pub const FINAL_NORM: &str = "model.norm";
    /// An untied output head.
    pub const OUTPUT_HEAD: &str = "lm_head";
    /// What every block's tensors are under: `model.layers.N`.
    pub const BLOCKS: &str = "model.layers";

    /// Tensor `tensor` of block `layer` (a [`super::MatmulTensor`]'s or
    /// [`super::NormTensor`]'s name inside the block).
    pub fn block_tensor(layer: usize, tensor: &str) -> String {
        format!("{BLOCKS}.{layer}.{tensor}")
    }

    /// The weight of `tensor`.
    pub fn weight(tensor: &str) -> String {
        format!("{tensor}.weight")
    }

    /// The weight of tensor `tensor` of block `layer`.
    pub fn block_weight(layer: usize, tensor: &str) -> String {
        weight(&block_tensor(layer, tensor))
    }
}

/// A matmul weight `[rows (out), cols (in)]`, with its bias where `bias`.
#[derive(Clone, Debug)]
pub struct MatmulTensor {
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    pub bias: bool,
    /// What row and tensor split cut it as; `None` for a weight kept
    /// whole beside its block in every split (a router).
    pub role: Option<Role>,
}

/// A norm's weight: `len` values.
#[derive(Clone, Debug)]
pub struct NormTensor {
    pub name: &'static str,
    pub len: usize,
}

/// The three projections of a gated MLP: the block's, or one expert's.
#[derive(Clone, Debug)]
pub struct MlpTensors {
    pub gate: MatmulTensor,
    pub up: MatmulTensor,
    pub down: MatmulTensor,
}

impl MlpTensors {
    pub fn all(&self) -> [&MatmulTensor; 3] {
        [&self.gate, &self.up, &self.down]
    }
}

/// The tensors of attention: q, k, v and o, and the norms of each head's
/// q and k (Qwen3, Gemma 3).
#[derive(Clone, Debug)]
pub struct AttentionTensors {
    pub q: MatmulTensor,
    pub k: MatmulTensor,
    pub v: MatmulTensor,
    pub o: MatmulTensor,
    pub qk_norms: Option<[NormTensor; 2]>,
}

impl AttentionTensors {
    pub fn matmuls(&self) -> [&MatmulTensor; 4] {
        [&self.q, &self.k, &self.v, &self.o]
    }
}

/// A block's norms: before attention and before the MLP, and Gemma's
/// norms of each sublayer's output.
#[derive(Clone, Debug)]
pub struct BlockNorms {
    pub input: NormTensor,
    pub attention_out: Option<NormTensor>,
    pub mlp_in: NormTensor,
    pub mlp_out: Option<NormTensor>,
}

impl BlockNorms {
    pub fn all(&self) -> impl Iterator<Item = &NormTensor> {
        let optional = [&self.attention_out, &self.mlp_out].into_iter().flatten();
        [&self.input, &self.mlp_in].into_iter().chain(optional)
    }
}

impl ModelConfig {
    /// Attention's tensors.
    pub fn attention_tensors(&self) -> AttentionTensors {
        let (h, q, kv, _) = self.widths();
        let matmul = |name: &str, role, rows, cols, bias| MatmulTensor {
            name: name.into(),
            rows,
            cols,
            bias,
            role: Some(role),
        };
        let norm = |name| NormTensor {
            name,
            len: self.head_dim,
        };
        AttentionTensors {
            q: matmul("self_attn.q_proj", Role::Query, q, h, self.qkv_bias),
            k: matmul("self_attn.k_proj", Role::Key, kv, h, self.qkv_bias),
            v: matmul("self_attn.v_proj", Role::Value, kv, h, self.qkv_bias),
            o: matmul("self_attn.o_proj", Role::Output, h, q, self.o_bias),
            qk_norms: self
                .qk_norm
                .then(|| [norm("self_attn.q_norm"), norm("self_attn.k_norm")]),
        }
    }

    /// The block's norms.
    pub fn block_norms(&self) -> BlockNorms {
        let norm = |name| NormTensor {
            name,
            len: self.hidden_size,
        };
        let sandwich = |name| self.sandwich_norms.then(|| norm(name));
        BlockNorms {
            input: norm("input_layernorm"),
            attention_out: sandwich("post_attention_layernorm"),
            mlp_in: norm(if self.sandwich_norms {
                "pre_feedforward_layernorm"
            } else {
                "post_attention_layernorm"
            }),
            mlp_out: sandwich("post_feedforward_layernorm"),
        }
    }

    /// Expert `expert`'s projections (the MLP's, for 0 in a dense block).
    pub fn mlp_tensors(&self, expert: usize) -> MlpTensors {
        let (h, _, _, i) = self.widths();
        let (prefix, [gate, up, down]) = match (self.architecture, self.experts) {
            (Architecture::Mixtral, Some(_)) => (format!("block_sparse_moe.experts.{expert}"), ["w1", "w3", "w2"]),
            (_, Some(_)) => (format!("mlp.experts.{expert}"), ["gate_proj", "up_proj", "down_proj"]),
            (_, None) => ("mlp".to_string(), ["gate_proj", "up_proj", "down_proj"]),
        };
        let matmul = |name: &str, role, rows, cols| MatmulTensor {
            name: format!("{prefix}.{name}"),
            rows,
            cols,
            bias: self.mlp_bias,
            role: Some(role),
        };
        MlpTensors {
            gate: matmul(gate, Role::Gate, i, h),
            up: matmul(up, Role::Up, i, h),
            down: matmul(down, Role::Down, h, i),
        }
    }

    /// The projections of the block's MLP, or of each expert in turn.
    /// (Call after the checkpoint check, which bounds the expert count.)
    pub fn mlps(&self) -> Vec<MlpTensors> {
        (0..self.experts.map_or(1, |e| e.count))
            .map(|expert| self.mlp_tensors(expert))
            .collect()
    }

    /// The router of a mixture of experts, `[experts, hidden]`.
    pub fn router_tensor(&self) -> Option<MatmulTensor> {
        let experts = self.experts?;
        let name = match self.architecture {
            Architecture::Mixtral => "block_sparse_moe.gate",
            _ => "mlp.gate",
        };
        Some(MatmulTensor {
            name: name.into(),
            rows: experts.count,
            cols: self.hidden_size,
            bias: false,
            role: None,
        })
    }
}
