//! config.json: the validated config the model runs on, read from a serde
//! mirror of what transformers writes (raw.rs) by validate.rs; what it says
//! of rope (rope.rs), of a block's tensors (tensors.rs: each declared
//! once), of the checkpoint (checkpoint.rs: fused parts, the shapes it
//! must hold) and of the planner's inventory (inventory.rs).

mod checkpoint;
mod gemma4;
mod inventory;
mod raw;
mod rope;
mod tensors;
mod validate;

use std::path::Path;

use cleave_hf::{read_json, ReadError, Result, Validator};
use cleave_shaders::{Activation, DeltaHeads};

use raw::RawConfig;
pub use tensors::{names, AttentionTensors, MatmulTensor, MlpTensors, NormTensor};
use validate::validate;

/// The decoder families cleave runs. They share one forward pass and differ
/// in switches of [`ModelConfig`]: which projections carry a bias, norms on
/// q and k, Gemma's norms and scalings, experts in place of the MLP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    /// Phi-3 and Phi-4-mini: fused q/k/v and gate/up weights, partial rotary.
    Phi3,
    /// Gemma 2: `(1 + w)` norms around attention and MLP, scaled
    /// embeddings, soft-capped scores and logits, alternating sliding and
    /// full attention.
    Gemma2,
    /// Gemma 3 (text): Gemma 2's block with q/k norms and no soft caps,
    /// sliding layers with a rope base of their own.
    Gemma3,
    /// Mixtral: Mistral with a mixture of SiLU experts per block.
    Mixtral,
    /// Qwen3-MoE: Qwen3 with a mixture of experts per block.
    Qwen3Moe,
    /// Qwen3.5 and 3.6: three Gated DeltaNet layers to each attention
    /// layer, whose output is gated; `(1 + w)` norms.
    Qwen3_5,
    /// Qwen3.5-MoE (Qwen3.6-35B-A3B): Qwen3.5 with a mixture of experts
    /// and a sigmoid-gated shared expert per block.
    Qwen3_5Moe,
    /// gpt-oss: attention sinks, alternating sliding and full layers, YaRN
    /// rope, biases on every projection, and a mixture of clamped-SwiGLU
    /// experts stored as one stack per block.
    GptOss,
    /// Gemma 4 (text): full layers with heads of their own size and a
    /// proportional rope, v normed, per-layer inputs, layers that read an
    /// earlier layer's KV cache, and experts beside the MLP.
    Gemma4,
}

impl Architecture {
    const ALL: [(&'static str, Architecture); 16] = [
        ("LlamaForCausalLM", Architecture::Llama),
        ("MistralForCausalLM", Architecture::Mistral),
        ("Qwen2ForCausalLM", Architecture::Qwen2),
        ("Qwen3ForCausalLM", Architecture::Qwen3),
        ("Phi3ForCausalLM", Architecture::Phi3),
        ("Gemma2ForCausalLM", Architecture::Gemma2),
        ("Gemma3ForCausalLM", Architecture::Gemma3),
        ("MixtralForCausalLM", Architecture::Mixtral),
        ("Qwen3MoeForCausalLM", Architecture::Qwen3Moe),
        ("Qwen3_5ForCausalLM", Architecture::Qwen3_5),
        // As published: with a vision tower, whose text path runs.
        ("Qwen3_5ForConditionalGeneration", Architecture::Qwen3_5),
        ("Qwen3_5MoeForCausalLM", Architecture::Qwen3_5Moe),
        ("Qwen3_5MoeForConditionalGeneration", Architecture::Qwen3_5Moe),
        ("GptOssForCausalLM", Architecture::GptOss),
        ("Gemma4ForCausalLM", Architecture::Gemma4),
        // As published: with vision and audio towers, whose text path runs.
        ("Gemma4ForConditionalGeneration", Architecture::Gemma4),
    ];

    fn is_gemma(self) -> bool {
        matches!(self, Architecture::Gemma2 | Architecture::Gemma3 | Architecture::Gemma4)
    }

    fn is_qwen(self) -> bool {
        matches!(self, Architecture::Qwen2 | Architecture::Qwen3 | Architecture::Qwen3Moe) || self.is_hybrid()
    }

    /// Linear-attention layers among the attention layers (Qwen3.5).
    fn is_hybrid(self) -> bool {
        matches!(self, Architecture::Qwen3_5 | Architecture::Qwen3_5Moe)
    }
}

/// The `architectures[0]` names this family runs.
pub const ARCHITECTURES: [&str; 16] = {
    let mut names = [""; 16];
    let mut i = 0;
    while i < names.len() {
        names[i] = Architecture::ALL[i].0;
        i += 1;
    }
    names
};

/// Which keys a layer's attention sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionType {
    /// Every earlier position.
    Full,
    /// The last `sliding_window` positions (the row's own included).
    Sliding,
    /// None: a Gated DeltaNet layer (linear attention), which keeps a
    /// recurrent state of every earlier position instead.
    Linear,
}

impl AttentionType {
    /// As `layer_types` names it.
    pub fn name(self) -> &'static str {
        match self {
            AttentionType::Full => "full_attention",
            AttentionType::Sliding => "sliding_attention",
            AttentionType::Linear => "linear_attention",
        }
    }
}

/// The Gated DeltaNet layers of a hybrid model (Qwen3.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearAttention {
    pub heads: DeltaHeads,
    /// The causal convolution's width over q, k and v.
    pub conv_taps: usize,
}

/// Each layer's attention type, as config.json gives it: held as a rule
/// where it is one, so that no layer count from a file is allocated for
/// before the checkpoint has confirmed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LayerTypes {
    /// Every layer alike.
    All(AttentionType),
    /// Every n-th layer full, the others sliding (Gemma's patterns).
    EveryNthFull(usize),
    /// One per layer (`layer_types`).
    Listed(Vec<AttentionType>),
}

impl LayerTypes {
    /// Layer `layer`'s attention type.
    pub fn of(&self, layer: usize) -> AttentionType {
        match self {
            LayerTypes::All(kind) => *kind,
            LayerTypes::EveryNthFull(n) if (layer + 1).is_multiple_of(*n) => AttentionType::Full,
            LayerTypes::EveryNthFull(_) => AttentionType::Sliding,
            LayerTypes::Listed(kinds) => kinds.get(layer).copied().unwrap_or(AttentionType::Full),
        }
    }

    /// Whether some layer is a Gated DeltaNet layer.
    fn any_linear(&self) -> bool {
        match self {
            LayerTypes::All(kind) => *kind == AttentionType::Linear,
            LayerTypes::EveryNthFull(_) => false,
            LayerTypes::Listed(kinds) => kinds.contains(&AttentionType::Linear),
        }
    }

    /// Whether some layer attends through a sliding window.
    fn any_sliding(&self) -> bool {
        match self {
            LayerTypes::All(kind) => *kind == AttentionType::Sliding,
            LayerTypes::EveryNthFull(n) => *n > 1,
            LayerTypes::Listed(kinds) => kinds.contains(&AttentionType::Sliding),
        }
    }
}

/// A mixture of experts in place of each block's MLP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Experts {
    pub count: usize,
    /// Each expert's intermediate width.
    pub width: usize,
    /// Experts each token runs through.
    pub top_k: usize,
    /// Whether the top-k routing weights are divided by their sum
    /// (Mixtral always; Qwen3-MoE with `norm_topk_prob`).
    pub renormalize: bool,
}

/// Gemma 4's per-layer inputs: `width` values of each token for every
/// layer, from a table of `vocab` rows and from the token's embedding,
/// which each layer gates into its output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PerLayerInputs {
    pub width: usize,
    pub vocab: usize,
}

/// The heads of a layer's attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadShape {
    pub head_dim: usize,
    pub kv_heads: usize,
}

/// How positions turn into rotation frequencies.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f64,
    },
    /// Llama 3's frequency-dependent scaling.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_context: f64,
    },
    /// Phi-3's LongRoPE: each frequency divided by its own factor, `short`
    /// in a pass whose positions stay within `original_context`, `long` in
    /// one that reaches past it (transformers decides per forward call);
    /// cos and sin multiplied by `attention`.
    LongRope {
        short: Vec<f64>,
        long: Vec<f64>,
        original_context: usize,
        attention: f64,
    },
    /// YaRN (gpt-oss): the frequencies between the `beta_fast` and
    /// `beta_slow` rotations over `original_context` ramp from unscaled
    /// to divided by `factor`; cos and sin multiplied by `attention`.
    Yarn {
        factor: f64,
        beta_fast: f64,
        beta_slow: f64,
        original_context: f64,
        /// Whether the ramp's ends are rounded to whole dimensions.
        truncate: bool,
        attention: f64,
    },
}

/// A validated decoder config.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f32,
    /// Gemma's RMS norms scale by `1 + w` (their weights are stored as `w`).
    pub norm_plus_one: bool,
    /// Norms after attention and after the MLP too, before each residual
    /// add (Gemma: `post_attention_layernorm` is then the first of these,
    /// and `pre_feedforward_layernorm` the MLP's input norm).
    pub sandwich_norms: bool,
    /// Input embeddings multiplied by √hidden_size (Gemma).
    pub scale_embeddings: bool,
    /// The attention scores' scale: `1/√head_dim`, or Gemma's
    /// `1/√query_pre_attn_scalar`.
    pub attention_scale: f32,
    /// `cap · tanh(x / cap)` of the attention scores (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// `cap · tanh(x / cap)` of the logits (Gemma 2).
    pub final_softcap: Option<f32>,
    /// The gated MLP's activation: SiLU, or GELU-tanh (Gemma).
    pub activation: Activation,
    /// Rope of full-attention layers (and of sliding ones without a base
    /// of their own).
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    /// Gemma 3's rope base for sliding layers (unscaled).
    pub local_rope_theta: Option<f64>,
    /// Each layer's attention: every earlier key, or `sliding_window` of
    /// them.
    pub layer_types: LayerTypes,
    /// A mixture of experts in place of every block's MLP (whose width is
    /// then `intermediate_size`).
    pub experts: Option<Experts>,
    pub max_positions: usize,
    /// `None` when config.json does not say (then the checkpoint does: a
    /// missing `lm_head.weight` means the head is the embedding table).
    pub tie_word_embeddings: Option<bool>,
    /// Bias on the q, k and v projections.
    pub qkv_bias: bool,
    /// Bias on the output projection of attention.
    pub o_bias: bool,
    pub mlp_bias: bool,
    /// How many keys a sliding layer sees (Mistral, Gemma).
    pub sliding_window: Option<usize>,
    /// An RMS norm over each head of q and of k before rope (Qwen3's
    /// `q_norm`/`k_norm`, `[head_dim]` each).
    pub qk_norm: bool,
    /// The leading dimensions of each head that rope rotates: all of them,
    /// or a part (Phi-3's `partial_rotary_factor`).
    pub rotary_dim: usize,
    /// Qwen3.5's gate on attention's output: `q_proj` gives each head's
    /// query and then its gate, and the heads' output is multiplied by
    /// `sigmoid(gate)` before `o_proj`.
    pub attention_output_gate: bool,
    /// The Gated DeltaNet layers' heads, where some layers are linear.
    pub linear_attention: Option<LinearAttention>,
    /// A learned logit per head that joins each row's softmax and weighs
    /// no value (gpt-oss's `sinks`).
    pub attention_sinks: bool,
    /// The width of a shared expert beside the routed ones, its output
    /// gated by `sigmoid(shared_expert_gate(x))` (Qwen3.5-MoE).
    pub shared_expert: Option<usize>,
    /// Gemma 4's full layers' own heads (`per_layer_config`, or
    /// `global_head_dim`), rotated by a proportional rope: `rotary_dim`
    /// of their dimensions turn, paired across the whole head.
    pub full_heads: Option<HeadShape>,
    /// The first layer that reads the KV cache of the last earlier layer
    /// of its type instead of its own (Gemma 4's `num_kv_shared_layers`);
    /// `layers` where none does.
    pub first_kv_shared: usize,
    /// v's heads RMS-normed without a weight (Gemma 4's `v_norm`).
    pub v_norm: bool,
    /// Full layers' values are their keys' projection (Gemma 4's
    /// `attention_k_eq_v`): `v_proj` is not stored.
    pub k_eq_v: bool,
    /// Gemma 4's KV-shared layers' MLPs are twice as wide
    /// (`use_double_wide_mlp`; the width checked to double).
    pub double_wide_mlp: bool,
    pub per_layer_inputs: Option<PerLayerInputs>,
    /// Each block's output multiplied by its `layer_scalar` (Gemma 4).
    pub layer_scalar: bool,
    /// The experts run beside the dense MLP instead of in its place, each
    /// with norms of its own, their router reading the residual stream
    /// (Gemma 4's MoE block).
    pub experts_beside_mlp: bool,
    /// Where the language model's tensors are stored instead of `model.`
    /// (a multimodal checkpoint's `model.language_model.`).
    pub stored_prefix: Option<&'static str>,
    pub eos_token_ids: Vec<u32>,
}

impl ModelConfig {
    /// Reads and validates `config.json`; errors name the file and field.
    pub fn from_file(path: &Path) -> Result<Self> {
        let raw: RawConfig = read_json(path)?;
        validate(&Validator { path }, raw)
    }

    /// Validates a config.json made from another file's metadata (a GGUF
    /// file's); errors name `path`, that file.
    pub fn from_value(path: &Path, value: serde_json::Value) -> Result<Self> {
        let raw: RawConfig = serde_json::from_value(value).map_err(|e| ReadError::Json {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        validate(&Validator { path }, raw)
    }

    /// Keys layer `layer` attends to before each row: all (0) or the
    /// sliding window.
    pub fn window(&self, layer: usize) -> usize {
        match self.layer_types.of(layer) {
            AttentionType::Full | AttentionType::Linear => 0,
            AttentionType::Sliding => self.sliding_window.unwrap_or(0),
        }
    }

    /// Whether layer `layer` is a Gated DeltaNet layer.
    pub fn is_linear(&self, layer: usize) -> bool {
        self.layer_types.of(layer) == AttentionType::Linear
    }

    /// The heads of layer `layer`'s attention.
    pub fn heads_of(&self, layer: usize) -> HeadShape {
        match self.full_heads {
            Some(full) if self.layer_types.of(layer) == AttentionType::Full => full,
            _ => HeadShape {
                head_dim: self.head_dim,
                kv_heads: self.kv_heads,
            },
        }
    }

    /// The layer whose KV cache layer `layer` reads: its own, or in
    /// Gemma 4's shared layers the last earlier layer of its type (the
    /// config check makes sure there is one).
    pub fn kv_source(&self, layer: usize) -> usize {
        if layer < self.first_kv_shared {
            return layer;
        }
        let kind = self.layer_types.of(layer);
        (0..self.first_kv_shared)
            .rev()
            .find(|&l| self.layer_types.of(l) == kind)
            .unwrap_or(layer)
    }

    /// Whether layer `layer` reads another layer's KV cache.
    pub fn shares_kv(&self, layer: usize) -> bool {
        self.kv_source(layer) != layer
    }

    /// The widths block `layer`'s matmuls use: (hidden, all query heads,
    /// all KV heads, MLP intermediate).
    pub fn widths(&self, layer: usize) -> (usize, usize, usize, usize) {
        let heads = self.heads_of(layer);
        (
            self.hidden_size,
            self.heads * heads.head_dim,
            heads.kv_heads * heads.head_dim,
            self.mlp_width(layer),
        )
    }

    /// Block `layer`'s dense MLP width: twice the others' in Gemma 4's
    /// KV-shared layers where `use_double_wide_mlp` says so.
    pub fn mlp_width(&self, layer: usize) -> usize {
        match self.double_wide_mlp && layer >= self.first_kv_shared {
            true => 2 * self.intermediate_size,
            false => self.intermediate_size,
        }
    }
}
