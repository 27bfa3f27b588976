//! Every tensor of a block, declared once: its name inside
//! `model.layers.N`, its shape, its role in the split modes and its bias.
//! The checkpoint check (checkpoint.rs), the planner's geometry and
//! inventory (inventory.rs) and the loader (load.rs) all read these; the
//! stored type of each is the checkpoint's.

use cleave_plan::Role;

use super::{Architecture, AttentionType, ModelConfig};

/// The stored names of the family's tensors, as transformers publishes
/// them, built here only (as llama.cpp builds every name with `tn()`).
pub mod names {
    /// The embedding table (and a tied output head).
    pub const EMBEDDINGS: &str = "model.embed_tokens";
    /// The norm after the last block.
    pub const FINAL_NORM: &str = "model.norm";
    /// An untied output head.
    pub const OUTPUT_HEAD: &str = "lm_head";
    /// Gemma 4's per-layer inputs: their table, the projection of the
    /// embeddings into them and its norm.
    pub const PER_LAYER_EMBEDDINGS: &str = "model.embed_tokens_per_layer";
    pub const PER_LAYER_PROJECTION: &str = "model.per_layer_model_projection";
    pub const PER_LAYER_NORM: &str = "model.per_layer_projection_norm";
    /// Gemma 4's factor of a block's output, inside the block.
    pub const LAYER_SCALAR: &str = "layer_scalar";
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

/// The tensors of attention: q, k, v and o, the norms of each head's q
/// and k (Qwen3, Gemma 3), and the output's gate (Qwen3.5).
#[derive(Clone, Debug)]
pub struct AttentionTensors {
    pub q: MatmulTensor,
    /// k and v; none in a layer that reads another layer's KV cache
    /// (Gemma 4). Where keys are values (`attention_k_eq_v`), v is k's
    /// projection, loaded by k's name.
    pub kv: Option<[MatmulTensor; 2]>,
    pub o: MatmulTensor,
    pub q_norm: Option<NormTensor>,
    /// k's norm, in a layer with k.
    pub k_norm: Option<NormTensor>,
    /// Its rows are those of `q_proj` after each head's query rows, which
    /// then stand for `q` (see [`ModelConfig::adapt`]).
    pub gate: Option<MatmulTensor>,
    /// gpt-oss's sinks, one logit per head.
    pub sinks: Option<&'static str>,
}

impl AttentionTensors {
    pub fn matmuls(&self) -> impl Iterator<Item = &MatmulTensor> {
        let kv = self.kv.iter().flatten();
        std::iter::once(&self.q).chain(kv).chain([&self.o]).chain(&self.gate)
    }

    /// The projections whose outputs, side by side, are q, k and v (q
    /// alone where k and v are another layer's).
    pub fn qkv(&self) -> Vec<&MatmulTensor> {
        std::iter::once(&self.q).chain(self.kv.iter().flatten()).collect()
    }

    pub fn norms(&self) -> impl Iterator<Item = &NormTensor> {
        self.q_norm.iter().chain(&self.k_norm)
    }
}

/// Gemma 4's per-layer input of a block: the gate of the block's output
/// (`[width, hidden]`), the projection back (`[hidden, width]`) and its
/// norm.
#[derive(Clone, Debug)]
pub struct PerLayerInputTensors {
    pub gate: MatmulTensor,
    pub projection: MatmulTensor,
    pub norm: NormTensor,
}

/// Gemma 4's MoE block beside the MLP: its router's scales and the
/// experts' norms.
#[derive(Clone, Debug)]
pub struct BesideMlpTensors {
    /// `router.scale` (`[hidden]`) and `router.per_expert_scale`
    /// (`[experts]`).
    pub router_scale: &'static str,
    pub expert_scales: &'static str,
    /// The experts' input norm, and the norms of the MLP's and the
    /// experts' outputs before their sum.
    pub experts_in: NormTensor,
    pub mlp_out: NormTensor,
    pub experts_out: NormTensor,
}

/// The tensors of a Gated DeltaNet layer (`linear_attn`), each kept whole
/// beside its block.
#[derive(Clone, Debug)]
pub struct LinearAttentionTensors {
    /// q, k and v side by side, before the convolution.
    pub qkv: MatmulTensor,
    /// The output norm's gate.
    pub z: MatmulTensor,
    /// The delta rule's rate (`sigmoid(b)`) and decay (from `a`).
    pub b: MatmulTensor,
    pub a: MatmulTensor,
    pub out: MatmulTensor,
    /// The convolution's weight, `[channels, 1, taps]`.
    pub conv: &'static str,
    /// `A_log` and `dt_bias`, one value per value head.
    pub a_log: &'static str,
    pub dt_bias: &'static str,
    /// The gated RMS norm of each value head's output (`[value_dim]`,
    /// plain `w`).
    pub norm: NormTensor,
}

impl LinearAttentionTensors {
    pub fn matmuls(&self) -> [&MatmulTensor; 5] {
        [&self.qkv, &self.z, &self.b, &self.a, &self.out]
    }
}

/// Qwen3.5-MoE's shared expert and its gate (`[1, hidden]`).
#[derive(Clone, Debug)]
pub struct SharedExpertTensors {
    pub mlp: MlpTensors,
    pub gate: MatmulTensor,
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
    /// Block `layer`'s attention's tensors.
    pub fn attention_tensors(&self, layer: usize) -> AttentionTensors {
        let (h, q, kv, _) = self.widths(layer);
        let matmul = |name: &str, role, rows, cols, bias| MatmulTensor {
            name: name.into(),
            rows,
            cols,
            bias,
            role: Some(role),
        };
        let norm = |name| NormTensor {
            name,
            len: self.heads_of(layer).head_dim,
        };
        let keys_are_values = self.k_eq_v && self.layer_types.of(layer) == AttentionType::Full;
        let (v_name, v_role) = match keys_are_values {
            true => ("self_attn.k_proj", Role::Key),
            false => ("self_attn.v_proj", Role::Value),
        };
        let own_kv = !self.shares_kv(layer);
        let (q_name, gate) = match self.attention_output_gate {
            true => (
                "self_attn.q_proj.query",
                Some(matmul("self_attn.q_proj.gate", Role::Query, q, h, false)),
            ),
            false => ("self_attn.q_proj", None),
        };
        AttentionTensors {
            q: matmul(q_name, Role::Query, q, h, self.qkv_bias),
            kv: own_kv.then(|| {
                [
                    matmul("self_attn.k_proj", Role::Key, kv, h, self.qkv_bias),
                    matmul(v_name, v_role, kv, h, self.qkv_bias),
                ]
            }),
            o: matmul("self_attn.o_proj", Role::Output, h, q, self.o_bias),
            q_norm: self.qk_norm.then(|| norm("self_attn.q_norm")),
            k_norm: (self.qk_norm && own_kv).then(|| norm("self_attn.k_norm")),
            gate,
            sinks: self.attention_sinks.then_some("self_attn.sinks"),
        }
    }

    /// A Gated DeltaNet layer's tensors, in a model that has them.
    pub fn linear_attention_tensors(&self) -> Option<LinearAttentionTensors> {
        let heads = self.linear_attention?.heads;
        let h = self.hidden_size;
        let values = heads.value_heads * heads.value_dim;
        let matmul = |name: &str, rows, cols| MatmulTensor {
            name: format!("linear_attn.{name}"),
            rows,
            cols,
            bias: false,
            role: None,
        };
        Some(LinearAttentionTensors {
            qkv: matmul("in_proj_qkv", heads.qkv_width(), h),
            z: matmul("in_proj_z", values, h),
            b: matmul("in_proj_b", heads.value_heads, h),
            a: matmul("in_proj_a", heads.value_heads, h),
            out: matmul("out_proj", h, values),
            conv: "linear_attn.conv1d",
            a_log: "linear_attn.A_log",
            dt_bias: "linear_attn.dt_bias",
            norm: NormTensor {
                name: "linear_attn.norm",
                len: heads.value_dim,
            },
        })
    }

    /// The matmul weights of block `layer`'s attention, or of its Gated
    /// DeltaNet.
    pub fn mixer_matmuls(&self, layer: usize) -> Vec<MatmulTensor> {
        match self.linear_attention_tensors().filter(|_| self.is_linear(layer)) {
            Some(linear) => linear.matmuls().into_iter().cloned().collect(),
            None => self.attention_tensors(layer).matmuls().cloned().collect(),
        }
    }

    /// The norms inside block `layer`'s attention or Gated DeltaNet.
    pub fn mixer_norms(&self, layer: usize) -> Vec<NormTensor> {
        match self.linear_attention_tensors().filter(|_| self.is_linear(layer)) {
            Some(linear) => vec![linear.norm],
            None => self.attention_tensors(layer).norms().cloned().collect(),
        }
    }

    /// The shared expert beside the routed ones, in a model that has one.
    pub fn shared_expert_tensors(&self) -> Option<SharedExpertTensors> {
        let width = self.shared_expert?;
        let h = self.hidden_size;
        // Kept whole beside the block, as the experts are.
        let matmul = |name: &str, rows, cols| MatmulTensor {
            name: format!("mlp.{name}"),
            rows,
            cols,
            bias: false,
            role: None,
        };
        Some(SharedExpertTensors {
            mlp: MlpTensors {
                gate: matmul("shared_expert.gate_proj", width, h),
                up: matmul("shared_expert.up_proj", width, h),
                down: matmul("shared_expert.down_proj", h, width),
            },
            gate: matmul("shared_expert_gate", 1, h),
        })
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

    /// A block's per-layer input (Gemma 4), in a model that has them.
    pub fn per_layer_input_tensors(&self) -> Option<PerLayerInputTensors> {
        let width = self.per_layer_inputs?.width;
        let h = self.hidden_size;
        // Kept whole at the block's home, where the residual stream is.
        let matmul = |name: &str, rows, cols| MatmulTensor {
            name: name.into(),
            rows,
            cols,
            bias: false,
            role: None,
        };
        Some(PerLayerInputTensors {
            gate: matmul("per_layer_input_gate", width, h),
            projection: matmul("per_layer_projection", h, width),
            norm: NormTensor {
                name: "post_per_layer_input_norm",
                len: h,
            },
        })
    }

    /// Gemma 4's MoE block's scales and norms, where its experts run
    /// beside the MLP.
    pub fn beside_mlp_tensors(&self) -> Option<BesideMlpTensors> {
        let norm = |name| NormTensor {
            name,
            len: self.hidden_size,
        };
        self.experts_beside_mlp.then(|| BesideMlpTensors {
            router_scale: "router.scale",
            expert_scales: "router.per_expert_scale",
            experts_in: norm("pre_feedforward_layernorm_2"),
            mlp_out: norm("post_feedforward_layernorm_1"),
            experts_out: norm("post_feedforward_layernorm_2"),
        })
    }

    /// Every norm of block `layer` outside its mixer, each `[hidden]` but
    /// the per-layer input's.
    pub fn block_norm_tensors(&self) -> Vec<NormTensor> {
        let (block, per_layer) = (self.block_norms(), self.per_layer_input_tensors());
        let beside = self.beside_mlp_tensors();
        let beside = beside.iter().flat_map(|b| [&b.experts_in, &b.mlp_out, &b.experts_out]);
        let norms = block.all().chain(beside).chain(per_layer.as_ref().map(|p| &p.norm));
        norms.cloned().collect()
    }

    /// Block `layer`'s dense MLP's projections, beside its experts or
    /// alone.
    pub fn dense_mlp_tensors(&self, layer: usize) -> MlpTensors {
        self.projections(
            "mlp".into(),
            ["gate_proj", "up_proj", "down_proj"],
            self.mlp_width(layer),
        )
    }

    /// Expert `expert`'s projections in block `layer` (the block's MLP,
    /// for 0 in a dense block).
    pub fn mlp_tensors(&self, layer: usize, expert: usize) -> MlpTensors {
        let Some(experts) = self.experts else {
            return self.dense_mlp_tensors(layer);
        };
        let (prefix, names) = match self.architecture {
            Architecture::Mixtral => (format!("block_sparse_moe.experts.{expert}"), ["w1", "w3", "w2"]),
            Architecture::Gemma4 => (format!("experts.{expert}"), ["gate_proj", "up_proj", "down_proj"]),
            _ => (format!("mlp.experts.{expert}"), ["gate_proj", "up_proj", "down_proj"]),
        };
        self.projections(prefix, names, experts.width)
    }

    /// A gated MLP of width `i` under `prefix`, its projections named
    /// `[gate, up, down]`.
    fn projections(&self, prefix: String, [gate, up, down]: [&str; 3], i: usize) -> MlpTensors {
        let h = self.hidden_size;
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

    /// The projections of block `layer`'s MLP, or of each expert in turn
    /// (after the MLP beside them in Gemma 4). (Call after the checkpoint
    /// check, which bounds the expert count.)
    pub fn mlps(&self, layer: usize) -> Vec<MlpTensors> {
        let beside = self.experts_beside_mlp.then(|| self.dense_mlp_tensors(layer));
        let routed = (0..self.experts.map_or(1, |e| e.count)).map(|expert| self.mlp_tensors(layer, expert));
        beside.into_iter().chain(routed).collect()
    }

    /// The router of a mixture of experts, `[experts, hidden]` (with a
    /// bias in gpt-oss).
    pub fn router_tensor(&self) -> Option<MatmulTensor> {
        let experts = self.experts?;
        let (name, bias) = match self.architecture {
            Architecture::Mixtral => ("block_sparse_moe.gate", false),
            Architecture::GptOss => ("mlp.router", true),
            Architecture::Gemma4 => ("router.proj", false),
            _ => ("mlp.gate", false),
        };
        Some(MatmulTensor {
            name: name.into(),
            rows: experts.count,
            cols: self.hidden_size,
            bias,
            role: None,
        })
    }
}
