//! config.json: a serde mirror of what transformers writes (both the
//! transformers-4 and -5 layouts), and the validated config the model runs on.

use std::ops::Range;
use std::path::{Path, PathBuf};

use cleave_hf::{read_json, Checkpoint, LoraAdapter, OneOrMany, ReadError, Result, Validator};
use cleave_nn::CacheType;
use cleave_plan::{BlockGeometry, Inventory, Matmul, Role};
use cleave_shaders::{attention_partials_bytes, Activation};
use serde::Deserialize;

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
}

impl Architecture {
    const ALL: [(&'static str, Architecture); 9] = [
        ("LlamaForCausalLM", Architecture::Llama),
        ("MistralForCausalLM", Architecture::Mistral),
        ("Qwen2ForCausalLM", Architecture::Qwen2),
        ("Qwen3ForCausalLM", Architecture::Qwen3),
        ("Phi3ForCausalLM", Architecture::Phi3),
        ("Gemma2ForCausalLM", Architecture::Gemma2),
        ("Gemma3ForCausalLM", Architecture::Gemma3),
        ("MixtralForCausalLM", Architecture::Mixtral),
        ("Qwen3MoeForCausalLM", Architecture::Qwen3Moe),
    ];

    fn is_gemma(self) -> bool {
        matches!(self, Architecture::Gemma2 | Architecture::Gemma3)
    }

    fn is_qwen(self) -> bool {
        matches!(self, Architecture::Qwen2 | Architecture::Qwen3 | Architecture::Qwen3Moe)
    }
}

/// The `architectures[0]` names this family runs.
pub const ARCHITECTURES: [&str; 9] = {
    let mut names = [""; 9];
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
    /// Experts each token runs through.
    pub top_k: usize,
    /// Whether the top-k routing weights are divided by their sum
    /// (Mixtral always; Qwen3-MoE with `norm_topk_prob`).
    pub renormalize: bool,
}

/// transformers 5's `rope_parameters`: one set, or one per attention type
/// (Gemma 3).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum RawRopeParameters {
    PerType {
        full_attention: RawRope,
        sliding_attention: Option<Box<RawRope>>,
    },
    Same(RawRope),
}

impl RawRopeParameters {
    fn full(&self) -> &RawRope {
        match self {
            RawRopeParameters::PerType { full_attention, .. } => full_attention,
            RawRopeParameters::Same(rope) => rope,
        }
    }
}

/// `rope_scaling` (transformers 4) or `rope_parameters` (transformers 5).
#[derive(Clone, Debug, Default, Deserialize)]
struct RawRope {
    rope_type: Option<String>,
    /// The transformers-4 spelling of `rope_type`.
    #[serde(rename = "type")]
    legacy_type: Option<String>,
    rope_theta: Option<f64>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<f64>,
    partial_rotary_factor: Option<f64>,
    short_factor: Option<Vec<f64>>,
    long_factor: Option<Vec<f64>>,
    attention_factor: Option<f64>,
}

#[derive(Debug, Deserialize)]
struct RawConfig {
    architectures: Option<Vec<String>>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<RawRope>,
    rope_parameters: Option<RawRopeParameters>,
    /// Gemma 3's rope base for sliding layers (transformers-4 layout).
    rope_local_base_freq: Option<f64>,
    max_position_embeddings: Option<usize>,
    /// Phi-3's context before LongRoPE's extension (transformers-4 layout).
    original_max_position_embeddings: Option<f64>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    hidden_act: Option<String>,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
    partial_rotary_factor: Option<f64>,
    layer_types: Option<Vec<String>>,
    sliding_window_pattern: Option<usize>,
    query_pre_attn_scalar: Option<f64>,
    attn_logit_softcapping: Option<f64>,
    final_logit_softcapping: Option<f64>,
    /// Gemma's name for `hidden_act`.
    hidden_activation: Option<String>,
    num_local_experts: Option<usize>,
    num_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    moe_intermediate_size: Option<usize>,
    norm_topk_prob: Option<bool>,
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
    eos_token_id: Option<OneOrMany>,
}

/// The parts of a fused projection: each one's name and rows.
type Parts<Name> = Vec<(Name, Range<usize>)>;

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

    /// Whether the output head is the embedding table itself: not saved
    /// separately in the checkpoint, and not declared untied (an untied head
    /// that is missing is an error naming the tensor).
    pub fn ties_output_head(&self, checkpoint: &Checkpoint) -> bool {
        self.tie_word_embeddings != Some(false) && !checkpoint.contains("lm_head.weight")
    }

    /// Phi-3's fused projections, named as inside `model.layers.N`, with
    /// the rows of each of their parts; none for the other families.
    fn fused(&self) -> Vec<(&'static str, Parts<&'static str>)> {
        if self.architecture != Architecture::Phi3 {
            return Vec::new();
        }
        let (_, q, kv, i) = self.widths();
        vec![
            (
                "self_attn.qkv_proj",
                vec![
                    ("self_attn.q_proj", 0..q),
                    ("self_attn.k_proj", q..q + kv),
                    ("self_attn.v_proj", q + kv..q + 2 * kv),
                ],
            ),
            (
                "mlp.gate_up_proj",
                vec![("mlp.gate_proj", 0..i), ("mlp.up_proj", i..2 * i)],
            ),
        ]
    }

    /// Each fused projection of block `layer` as `name(projection)` names
    /// it, with its parts and their rows.
    fn fused_names(&self, name: impl Fn(&str) -> String) -> Vec<(String, Parts<String>)> {
        self.fused()
            .into_iter()
            .map(|(fused, parts)| {
                let parts = parts.into_iter().map(|(part, rows)| (name(part), rows)).collect();
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
            let fused = self.fused_names(|p| format!("model.layers.{layer}.{p}.weight"));
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
            let factor =
                |f: &str| self.fused_names(|p| format!("base_model.model.model.layers.{layer}.{p}.lora_{f}.weight"));
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
    /// embedding table `[vocab_size, hidden_size]`, the last block and its
    /// projections' shapes. Every size the planner multiplies is then
    /// bounded by the checkpoint's own bytes, and a config that promises
    /// more than the file holds fails here, by tensor name, before anything
    /// is planned or allocated.
    pub fn check_checkpoint(&self, checkpoint: &Checkpoint) -> Result<()> {
        let (h, q, kv, i) = self.widths();
        let last = format!("model.layers.{}", self.layers - 1);
        let mut shapes: Vec<(String, Vec<usize>)> = vec![
            ("model.embed_tokens.weight".into(), vec![self.vocab_size, h]),
            (format!("{last}.input_layernorm.weight"), vec![h]),
            (format!("{last}.self_attn.q_proj.weight"), vec![q, h]),
            (format!("{last}.self_attn.k_proj.weight"), vec![kv, h]),
        ];
        // The first and the last expert: a config that promises more
        // experts than the file holds fails by name.
        let last_expert = self.experts.map_or(0, |e| e.count - 1);
        for expert in [0, last_expert] {
            let [gate, _, _] = self.mlp_of(expert);
            shapes.push((format!("{last}.{gate}.weight"), vec![i, h]));
        }
        if let (Some(router), Some(experts)) = (self.router_name(), self.experts) {
            shapes.push((format!("{last}.{router}.weight"), vec![experts.count, h]));
        }
        for (name, shape) in &shapes {
            checkpoint.expect_shape(name, shape)?;
        }
        Ok(())
    }

    /// The gate, up and down projections of the block's MLP, or of each
    /// expert in turn, named as inside `model.layers.N`.
    pub fn mlp_names(&self) -> Vec<[String; 3]> {
        (0..self.experts.map_or(1, |e| e.count))
            .map(|expert| self.mlp_of(expert))
            .collect()
    }

    /// The gate, up and down projections of expert `expert` (of the MLP
    /// in a dense block).
    pub fn mlp_of(&self, expert: usize) -> [String; 3] {
        let (prefix, names) = match (self.architecture, self.experts) {
            (Architecture::Mixtral, Some(_)) => (format!("block_sparse_moe.experts.{expert}"), ["w1", "w3", "w2"]),
            (_, Some(_)) => (format!("mlp.experts.{expert}"), ["gate_proj", "up_proj", "down_proj"]),
            (_, None) => ("mlp".to_string(), ["gate_proj", "up_proj", "down_proj"]),
        };
        names.map(|name| format!("{prefix}.{name}"))
    }

    /// The router of a mixture of experts (`[experts, hidden]`), named as
    /// inside `model.layers.N`.
    pub fn router_name(&self) -> Option<&'static str> {
        match (self.architecture, self.experts) {
            (_, None) => None,
            (Architecture::Mixtral, Some(_)) => Some("block_sparse_moe.gate"),
            (_, Some(_)) => Some("mlp.gate"),
        }
    }

    /// Keys layer `layer` attends to before each row: all (0) or the
    /// sliding window.
    pub fn window(&self, layer: usize) -> usize {
        match self.layer_types.of(layer) {
            AttentionType::Full => 0,
            AttentionType::Sliding => self.sliding_window.unwrap_or(0),
        }
    }

    /// Which of [`ModelConfig::rope_tables`] layer `layer` uses in a pass
    /// whose positions end before `end`: the full layers' (every layer's,
    /// unless sliding layers have a base of their own or LongRoPE's long
    /// factors apply), the sliding layers', or LongRoPE's long ones.
    pub fn rope_table(&self, layer: usize, end: usize) -> usize {
        let local = self.local_rope_theta.is_some();
        match &self.rope_scaling {
            RopeScaling::LongRope { original_context, .. } if end > *original_context => 1 + usize::from(local),
            _ => usize::from(self.layer_types.of(layer) == AttentionType::Sliding && local),
        }
    }

    /// Each rotary table's frequencies (for each pair of dimensions of a
    /// head, as transformers computes them in f32) and the factor on its
    /// cos and sin: the full layers', then Gemma 3's sliding layers' (from
    /// their own base), then LongRoPE's long factors'.
    pub fn rope_tables(&self) -> Vec<(Vec<f32>, f32)> {
        let (dim, theta) = (self.rotary_dim, self.rope_theta);
        let mut tables = vec![(frequencies(dim, theta, &self.rope_scaling), 1.0)];
        tables.extend(
            self.local_rope_theta
                .map(|local| (frequencies(dim, local, &RopeScaling::None), 1.0)),
        );
        if let RopeScaling::LongRope { long, attention, .. } = &self.rope_scaling {
            tables[0].1 = *attention as f32;
            tables.push((per_frequency(dim, theta, long), *attention as f32));
        }
        tables
    }

    /// The rotation frequencies of the full layers (see
    /// [`ModelConfig::rope_tables`]).
    pub fn inv_freq(&self) -> Vec<f32> {
        frequencies(self.rotary_dim, self.rope_theta, &self.rope_scaling)
    }

    /// The widths a block's matmuls use: (hidden, all query heads, all KV
    /// heads, MLP intermediate).
    pub fn widths(&self) -> (usize, usize, usize, usize) {
        (
            self.hidden_size,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.intermediate_size,
        )
    }

    /// A block's matmul weights, named as inside `model.layers.N`, and its
    /// heads: what row and tensor split divide. `checkpoint` says how many
    /// bytes each weight's rows take in every block.
    pub fn block_geometry(&self, checkpoint: &Checkpoint) -> BlockGeometry {
        let (h, q, kv, i) = self.widths();
        let matmul = |name: &str, role, rows, cols, bias| Matmul {
            name: name.to_string(),
            role,
            rows,
            cols,
            bias,
            row_bytes_over_blocks: (0..self.layers)
                .map(|layer| checkpoint.matrix_bytes(&format!("model.layers.{layer}.{name}.weight"), 1, cols))
                .fold(0, u64::saturating_add),
            block_len: (0..self.layers)
                .filter_map(|layer| checkpoint.dtype(&format!("model.layers.{layer}.{name}.weight")))
                .map(|dtype| dtype.block_len())
                .max()
                .unwrap_or(1),
        };
        let mut matmuls = vec![
            matmul("self_attn.q_proj", Role::Query, q, h, self.qkv_bias),
            matmul("self_attn.k_proj", Role::Key, kv, h, self.qkv_bias),
            matmul("self_attn.v_proj", Role::Value, kv, h, self.qkv_bias),
            matmul("self_attn.o_proj", Role::Output, h, q, self.o_bias),
        ];
        for [gate, up, down] in self.mlp_names() {
            matmuls.push(matmul(&gate, Role::Gate, i, h, self.mlp_bias));
            matmuls.push(matmul(&up, Role::Up, i, h, self.mlp_bias));
            matmuls.push(matmul(&down, Role::Down, h, i, self.mlp_bias));
        }
        BlockGeometry {
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            intermediate: i,
            matmuls,
            per_head_shard_bytes: if self.qk_norm {
                (2 * self.head_dim * size_of::<f32>()) as u64
            } else {
                0
            },
            experts: self.experts.map_or(0, |e| e.count),
            expert_bytes_over_blocks: self.expert_bytes_over_blocks(checkpoint),
        }
    }

    /// Bytes of the largest expert summed over every block, as `checkpoint`
    /// stores its matrices (biases in f32); 0 for a dense model.
    fn expert_bytes_over_blocks(&self, checkpoint: &Checkpoint) -> u64 {
        let (h, _, _, i) = self.widths();
        let bias = if self.mlp_bias {
            (2 * i + h) * size_of::<f32>()
        } else {
            0
        };
        let Some(experts) = self.experts else { return 0 };
        (0..experts.count)
            .map(|expert| {
                let [gate, up, down] = self.mlp_of(expert);
                (0..self.layers)
                    .flat_map(|layer| {
                        let weight = |name: &str| format!("model.layers.{layer}.{name}.weight");
                        [
                            checkpoint.matrix_bytes(&weight(&gate), i, h),
                            checkpoint.matrix_bytes(&weight(&up), i, h),
                            checkpoint.matrix_bytes(&weight(&down), h, i),
                            bias as u64,
                        ]
                    })
                    .fold(0, u64::saturating_add)
            })
            .max()
            .unwrap_or(0)
    }

    /// What the planner needs to place the `llm` module with a KV cache for
    /// `sequences` sequences of `context` positions each: bytes on a device
    /// of each part, matrices as `checkpoint` stores them (f32, 16-bit or
    /// quantized) and vectors in f32. `tied`: the output head is the
    /// embedding table (counted once where head and tail share a device).
    pub fn inventory(
        &self,
        context: usize,
        sequences: usize,
        tied: bool,
        checkpoint: &Checkpoint,
        cache: CacheType,
    ) -> Inventory {
        // In u128, so that no context or vocabulary a flag or a file asks
        // for wraps around: a byte count past u64 saturates, and the plan
        // then says it does not fit.
        let f32_bytes = |elements: u128| u64::try_from(elements * 4).unwrap_or(u64::MAX);
        let (h, q, kv, i) = self.widths();
        let geometry = self.block_geometry(checkpoint);
        let (hu, qu, kvu, iu) = (h as u128, q as u128, kv as u128, i as u128);
        let (context, sequences) = (context as u128, sequences as u128);
        let (vocab, head_dim) = (self.vocab_size as u128, self.head_dim as u128);
        let bias = |on: bool, n: u128| if on { n } else { 0 };
        let vectors = 2 * hu
            + bias(self.sandwich_norms, 2 * hu)
            + bias(self.qk_norm, 2 * head_dim)
            + bias(self.qkv_bias, qu + 2 * kvu)
            + bias(self.o_bias, hu)
            + bias(self.mlp_bias, 2 * iu + hu);
        let block_bytes = (0..self.layers)
            .map(|layer| {
                let weight = |name: &str| format!("model.layers.{layer}.{name}.weight");
                // The router stays whole with its block in every split.
                let router = match (self.router_name(), self.experts) {
                    (Some(name), Some(e)) => checkpoint.matrix_bytes(&weight(name), e.count, h),
                    _ => 0,
                };
                geometry
                    .matmuls
                    .iter()
                    .map(|m| checkpoint.matrix_bytes(&weight(&m.name), m.rows, m.cols))
                    .fold(f32_bytes(vectors).saturating_add(router), u64::saturating_add)
            })
            .collect();
        let embed = checkpoint.matrix_bytes("model.embed_tokens.weight", self.vocab_size, h);
        let head = if tied {
            embed
        } else {
            checkpoint.matrix_bytes("lm_head.weight", self.vocab_size, h)
        };
        // One prefill batch: hidden states, q/k/v, the MLP's three
        // intermediates (attention writes no scores), one row of logits,
        // plus the rotary table; and attention's partial sums where it cuts
        // long ranges of keys into pieces, for a prefill batch or a decode
        // step of every sequence, whichever keeps more.
        let batch = context.min(super::model::MAX_BATCH_ROWS as u128);
        let tables = self.rope_tables().len() as u128;
        let partials = |rows: u128, decode: bool| {
            let narrow = |n: u128| usize::try_from(n).unwrap_or(usize::MAX);
            let (heads, dim) = (self.heads, self.head_dim);
            attention_partials_bytes(narrow(rows), heads, dim, narrow(context), decode) as u64
        };
        let compute = batch * (2 * hu + qu + 2 * kvu + 3 * iu) + vocab + tables * context * head_dim;
        let partials = partials(batch, false).max(partials(sequences, true));
        Inventory {
            module: "llm".into(),
            head_bytes: embed,
            block_bytes,
            tail_bytes: f32_bytes(hu).saturating_add(head),
            tail_shared_with_head: if tied { embed } else { 0 },
            kv_bytes_per_block: u64::try_from(sequences * context * self.kv_bytes_per_position(cache) as u128)
                .unwrap_or(u64::MAX),
            compute_bytes: f32_bytes(compute).saturating_add(partials),
            geometry: Some(geometry),
        }
    }

    /// Bytes of K and V cache per position and layer, in `cache`'s type.
    pub fn kv_bytes_per_position(&self, cache: CacheType) -> usize {
        2 * self.kv_heads * self.head_dim * cache.bytes()
    }
}

/// The rotation frequency of each pair of `dim` dimensions for base
/// `theta`, scaled as `scaling` says, in f32 as transformers computes them.
fn frequencies(dim: usize, theta: f64, scaling: &RopeScaling) -> Vec<f32> {
    let base = theta as f32;
    let plain = (0..dim / 2).map(|i| 1.0 / base.powf((2 * i) as f32 / dim as f32));
    match *scaling {
        RopeScaling::None => plain.collect(),
        RopeScaling::Linear { factor } => plain.map(|f| f / factor as f32).collect(),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_context,
        } => {
            let (factor, low, high) = (factor as f32, low_freq_factor as f32, high_freq_factor as f32);
            let context = original_context as f32;
            let (low_wavelen, high_wavelen) = (context / low, context / high);
            plain
                .map(|f| {
                    let wavelen = 2.0 * std::f32::consts::PI / f;
                    if wavelen < high_wavelen {
                        f
                    } else if wavelen > low_wavelen {
                        f / factor
                    } else {
                        let smooth = (context / wavelen - low) / (high - low);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
        RopeScaling::LongRope { ref short, .. } => per_frequency(dim, theta, short),
    }
}

/// LongRoPE's frequencies: `1 / (factors[i] · theta^(2i / dim))` in f32.
fn per_frequency(dim: usize, theta: f64, factors: &[f64]) -> Vec<f32> {
    let base = theta as f32;
    (0..dim / 2)
        .zip(factors)
        .map(|(i, &factor)| 1.0 / (factor as f32 * base.powf((2 * i) as f32 / dim as f32)))
        .collect()
}

/// The dimensions of a head that rope rotates: `partial_rotary_factor` of
/// them (top level, or inside the rope parameters), all by default.
fn rotary_dim(check: &Validator, raw: &RawConfig, head_dim: usize) -> Result<usize> {
    let params = raw
        .rope_parameters
        .as_ref()
        .map(RawRopeParameters::full)
        .or(raw.rope_scaling.as_ref());
    let Some(factor) = params
        .and_then(|p| p.partial_rotary_factor)
        .or(raw.partial_rotary_factor)
    else {
        return Ok(head_dim);
    };
    // transformers: int(head_dim * partial_rotary_factor).
    let dim = (head_dim as f64 * factor) as usize;
    if !(factor > 0.0 && factor <= 1.0) || dim == 0 || !dim.is_multiple_of(2) {
        return Err(check.error(
            "partial_rotary_factor",
            format!("{factor} of head_dim {head_dim} is not an even number of dimensions in 2..={head_dim}"),
        ));
    }
    Ok(dim)
}

fn architecture(check: &Validator, names: Option<Vec<String>>) -> Result<Architecture> {
    let names = check.required(names, "architectures")?;
    let name = names
        .first()
        .ok_or_else(|| check.error("architectures", "empty list"))?;
    Architecture::ALL
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, a)| *a)
        .ok_or_else(|| ReadError::Architecture {
            path: PathBuf::from(check.path),
            found: name.clone(),
            supported: ARCHITECTURES.join(", "),
        })
}

fn rope(check: &Validator, raw: &RawConfig, rotary_dim: usize) -> Result<(f64, RopeScaling)> {
    // transformers 5 keeps theta inside rope_parameters; 4 at top level.
    let params = raw
        .rope_parameters
        .as_ref()
        .map(|p| p.full().clone())
        .or_else(|| raw.rope_scaling.clone())
        .unwrap_or_default();
    let field = if raw.rope_parameters.is_some() {
        "rope_parameters"
    } else {
        "rope_scaling"
    };
    let theta = params.rope_theta.or(raw.rope_theta).unwrap_or(10_000.0);
    if !(theta.is_finite() && theta > 0.0) {
        return Err(check.error("rope_theta", "must be positive"));
    }
    let kind = params.rope_type.clone().or(params.legacy_type.clone());
    let factor = |p: &RawRope| {
        p.factor
            .filter(|f| f.is_finite() && *f > 0.0)
            .ok_or_else(|| check.error(field, "'factor' is missing or not positive"))
    };
    let scaling = match kind.as_deref() {
        None | Some("default") => RopeScaling::None,
        Some("linear") => RopeScaling::Linear {
            factor: factor(&params)?,
        },
        Some("llama3") => {
            // Each divides a wavelength or the context: positive and finite.
            let get = |v: Option<f64>, name: &str| {
                v.filter(|v| v.is_finite() && *v > 0.0).ok_or_else(|| {
                    check.error(
                        field,
                        format!("'{name}' is missing or not positive for rope_type llama3"),
                    )
                })
            };
            let (low, high) = (
                get(params.low_freq_factor, "low_freq_factor")?,
                get(params.high_freq_factor, "high_freq_factor")?,
            );
            if high <= low {
                return Err(check.error(field, "high_freq_factor must exceed low_freq_factor"));
            }
            RopeScaling::Llama3 {
                factor: factor(&params)?,
                low_freq_factor: low,
                high_freq_factor: high,
                original_context: get(
                    params.original_max_position_embeddings,
                    "original_max_position_embeddings",
                )?,
            }
        }
        Some("longrope") => longrope(check, raw, &params, field, rotary_dim)?,
        Some(other) => {
            return Err(check.error(
                field,
                format!("rope_type '{other}' is not supported (supported: default, linear, llama3, longrope)"),
            ))
        }
    };
    Ok((theta, scaling))
}

/// Phi-3's LongRoPE parameters as transformers reads them: a short and a
/// long factor per rotary frequency; the original context from the rope
/// parameters or the top level (else `max_position_embeddings`); the
/// scaling factor as the extended over the original context where the
/// top level gives the original (Phi-3's configs), else `factor`; and the
/// attention factor given, else `sqrt(1 + ln(factor) / ln(original))`
/// (1 for a factor of at most 1).
fn longrope(
    check: &Validator,
    raw: &RawConfig,
    params: &RawRope,
    field: &'static str,
    rotary_dim: usize,
) -> Result<RopeScaling> {
    let factors = |values: &Option<Vec<f64>>, name: &str| {
        let values = values
            .clone()
            .ok_or_else(|| check.error(field, format!("'{name}' is missing for rope_type longrope")))?;
        if values.len() != rotary_dim / 2 || values.iter().any(|v| !(v.is_finite() && *v > 0.0)) {
            return Err(check.error(
                field,
                format!(
                    "'{name}' must hold {} positive numbers, one per rotary frequency, got {} values",
                    rotary_dim / 2,
                    values.len()
                ),
            ));
        }
        Ok(values)
    };
    let max = check.required(raw.max_position_embeddings, "max_position_embeddings")? as f64;
    let original = params
        .original_max_position_embeddings
        .or(raw.original_max_position_embeddings)
        .unwrap_or(max);
    if !(original.is_finite() && original >= 1.0 && original.fract() == 0.0) {
        return Err(check.error(
            "original_max_position_embeddings",
            format!("{original} is not a whole number of positions"),
        ));
    }
    let factor = match (raw.original_max_position_embeddings, params.factor) {
        (None, Some(factor)) => factor,
        _ => max / original,
    };
    let attention = match params.attention_factor {
        Some(a) if a.is_finite() && a > 0.0 => a,
        Some(a) => return Err(check.error(field, format!("'attention_factor' {a} is not positive"))),
        None if factor <= 1.0 => 1.0,
        None => (1.0 + factor.ln() / original.ln()).sqrt(),
    };
    Ok(RopeScaling::LongRope {
        short: factors(&params.short_factor, "short_factor")?,
        long: factors(&params.long_factor, "long_factor")?,
        original_context: original as usize,
        attention,
    })
}

/// Gemma 3's rope base for sliding layers: `rope_parameters.sliding_attention`
/// (transformers 5, default rope only) or `rope_local_base_freq`
/// (transformers 4, 10 000 when absent).
fn local_rope_theta(check: &Validator, raw: &RawConfig, architecture: Architecture) -> Result<Option<f64>> {
    if architecture != Architecture::Gemma3 {
        return Ok(None);
    }
    let theta = match &raw.rope_parameters {
        Some(RawRopeParameters::PerType {
            sliding_attention: Some(local),
            ..
        }) => {
            let kind = local.rope_type.as_deref().or(local.legacy_type.as_deref());
            if !matches!(kind, None | Some("default")) {
                return Err(check.error(
                    "rope_parameters",
                    format!(
                        "sliding_attention's rope_type '{}' is not supported (supported: default)",
                        kind.unwrap_or_default()
                    ),
                ));
            }
            local.rope_theta.unwrap_or(10_000.0)
        }
        _ => raw.rope_local_base_freq.unwrap_or(10_000.0),
    };
    if !(theta.is_finite() && theta > 0.0) {
        return Err(check.error("rope_local_base_freq", "must be positive"));
    }
    Ok(Some(theta))
}

/// Each layer's attention type: `layer_types` where given; else Gemma 2's
/// alternation (sliding first), Gemma 3's `sliding_window_pattern` (every
/// n-th layer full, 6 by default); a sliding window on every layer of the
/// families that have one (Mistral, Phi-3, Mixtral); full attention
/// otherwise.
fn layer_types(check: &Validator, raw: &RawConfig, architecture: Architecture, layers: usize) -> Result<LayerTypes> {
    let types = if let Some(names) = raw
        .layer_types
        .as_ref()
        .filter(|_| architecture.is_gemma() || architecture.is_qwen())
    {
        if names.len() != layers {
            return Err(check.error("layer_types", format!("{} entries for {layers} layers", names.len())));
        }
        names
            .iter()
            .map(|name| match name.as_str() {
                "full_attention" => Ok(AttentionType::Full),
                "sliding_attention" => Ok(AttentionType::Sliding),
                other => Err(check.error(
                    "layer_types",
                    format!("'{other}' is not supported (supported: full_attention, sliding_attention)"),
                )),
            })
            .collect::<Result<Vec<_>>>()
            .map(LayerTypes::Listed)?
    } else {
        match architecture {
            Architecture::Gemma2 => LayerTypes::EveryNthFull(2),
            Architecture::Gemma3 => LayerTypes::EveryNthFull(
                check.positive(raw.sliding_window_pattern.or(Some(6)), "sliding_window_pattern")?,
            ),
            Architecture::Mistral | Architecture::Phi3 | Architecture::Mixtral if raw.sliding_window.is_some() => {
                LayerTypes::All(AttentionType::Sliding)
            }
            _ => LayerTypes::All(AttentionType::Full),
        }
    };
    let sliding = types.any_sliding();
    if architecture.is_qwen() && (sliding || raw.use_sliding_window == Some(true)) {
        return Err(check.error("use_sliding_window", "Qwen's per-layer sliding window is not supported"));
    }
    if sliding && raw.sliding_window.is_none_or(|w| w == 0) {
        return Err(check.error(
            "sliding_window",
            "missing or 0, but some layers attend through a sliding window",
        ));
    }
    Ok(types)
}

/// A soft cap (Gemma 2's): positive and finite where set.
fn softcap(check: &Validator, value: Option<f64>, field: &'static str) -> Result<Option<f32>> {
    match value {
        None => Ok(None),
        Some(cap) if cap.is_finite() && cap > 0.0 => Ok(Some(cap as f32)),
        Some(cap) => Err(check.error(field, format!("{cap} must be a positive number"))),
    }
}

/// The experts of Mixtral (`num_local_experts`) and Qwen3-MoE
/// (`num_experts`), with their width; `None` for dense families.
fn experts(check: &Validator, raw: &RawConfig, architecture: Architecture) -> Result<Option<(Experts, usize)>> {
    let (count_field, width, width_field) = match architecture {
        Architecture::Mixtral => ("num_local_experts", raw.intermediate_size, "intermediate_size"),
        Architecture::Qwen3Moe => {
            if raw.decoder_sparse_step.unwrap_or(1) != 1 {
                return Err(check.error(
                    "decoder_sparse_step",
                    "dense layers between sparse ones are not supported",
                ));
            }
            if raw.mlp_only_layers.as_ref().is_some_and(|l| !l.is_empty()) {
                return Err(check.error("mlp_only_layers", "dense layers between sparse ones are not supported"));
            }
            ("num_experts", raw.moe_intermediate_size, "moe_intermediate_size")
        }
        _ => return Ok(None),
    };
    let count = check.positive(raw.num_local_experts.or(raw.num_experts), count_field)?;
    let top_k = check.positive(raw.num_experts_per_tok, "num_experts_per_tok")?;
    if top_k > count {
        return Err(check.error(
            "num_experts_per_tok",
            format!("{top_k} is more than the {count} experts"),
        ));
    }
    let experts = Experts {
        count,
        top_k,
        renormalize: architecture == Architecture::Mixtral || raw.norm_topk_prob == Some(true),
    };
    Ok(Some((experts, check.positive(width, width_field)?)))
}

fn validate(check: &Validator, raw: RawConfig) -> Result<ModelConfig> {
    let architecture = architecture(check, raw.architectures.clone())?;
    let hidden_size = check.positive(raw.hidden_size, "hidden_size")?;
    let heads = check.positive(raw.num_attention_heads, "num_attention_heads")?;
    let kv_heads = raw.num_key_value_heads.unwrap_or(heads);
    if kv_heads == 0 || heads % kv_heads != 0 {
        return Err(check.error(
            "num_key_value_heads",
            format!("{kv_heads} does not divide num_attention_heads ({heads})"),
        ));
    }
    let head_dim = match raw.head_dim {
        Some(d) => d,
        None if hidden_size % heads == 0 => hidden_size / heads,
        None => {
            return Err(check.error(
                "head_dim",
                "missing, and hidden_size is not a multiple of num_attention_heads",
            ))
        }
    };
    if head_dim == 0 || head_dim % 2 != 0 {
        return Err(check.error("head_dim", format!("{head_dim} must be even and positive")));
    }
    let gemma = architecture.is_gemma();
    let activation = match raw.hidden_activation.as_deref().or(raw.hidden_act.as_deref()) {
        None => Activation::Silu,
        Some(name) => {
            let field = if raw.hidden_activation.is_some() {
                "hidden_activation"
            } else {
                "hidden_act"
            };
            match check.supported(field, name, &["silu", "gelu_pytorch_tanh", "gelu_new"])? {
                "silu" => Activation::Silu,
                _ => Activation::GeluTanh,
            }
        }
    };
    let rotary_dim = rotary_dim(check, &raw, head_dim)?;
    let (rope_theta, rope_scaling) = rope(check, &raw, rotary_dim)?;
    let eps = raw.rms_norm_eps.unwrap_or(1e-6);
    if !(eps.is_finite() && eps > 0.0) {
        return Err(check.error("rms_norm_eps", format!("{eps} must be a positive number")));
    }
    let layers = check.positive(raw.num_hidden_layers, "num_hidden_layers")?;
    let layer_types = layer_types(check, &raw, architecture, layers)?;
    let sliding_window = raw.sliding_window.filter(|_| layer_types.any_sliding());
    // transformers: `query_pre_attn_scalar ** -0.5` or `head_dim ** -0.5`, in f64.
    let attention_scale = match raw.query_pre_attn_scalar.filter(|_| gemma) {
        Some(s) if s.is_finite() && s > 0.0 => s.powf(-0.5) as f32,
        Some(s) => return Err(check.error("query_pre_attn_scalar", format!("{s} must be a positive number"))),
        None => (head_dim as f64).powf(-0.5) as f32,
    };
    let (experts, intermediate_size) = match experts(check, &raw, architecture)? {
        Some((experts, width)) => (Some(experts), width),
        None => (None, check.positive(raw.intermediate_size, "intermediate_size")?),
    };
    let attention_bias = raw.attention_bias.unwrap_or(false);
    Ok(ModelConfig {
        architecture,
        hidden_size,
        intermediate_size,
        layers,
        heads,
        kv_heads,
        head_dim,
        vocab_size: check.positive(raw.vocab_size, "vocab_size")?,
        rms_norm_eps: eps as f32,
        norm_plus_one: gemma,
        sandwich_norms: gemma,
        scale_embeddings: gemma,
        attention_scale,
        attn_softcap: softcap(
            check,
            raw.attn_logit_softcapping.filter(|_| gemma),
            "attn_logit_softcapping",
        )?,
        final_softcap: softcap(
            check,
            raw.final_logit_softcapping.filter(|_| gemma),
            "final_logit_softcapping",
        )?,
        activation,
        rope_theta,
        rope_scaling,
        local_rope_theta: local_rope_theta(check, &raw, architecture)?,
        layer_types,
        experts,
        max_positions: max_positions(check, raw.max_position_embeddings)?,
        tie_word_embeddings: raw.tie_word_embeddings,
        qkv_bias: architecture == Architecture::Qwen2 || attention_bias,
        o_bias: architecture == Architecture::Llama && attention_bias,
        mlp_bias: architecture == Architecture::Llama && raw.mlp_bias.unwrap_or(false),
        sliding_window,
        qk_norm: matches!(
            architecture,
            Architecture::Qwen3 | Architecture::Qwen3Moe | Architecture::Gemma3
        ),
        rotary_dim,
        eos_token_ids: raw.eos_token_id.map(|e| e.ids()).unwrap_or_default(),
    })
}

/// More positions than any published model is trained for (2^24, about 16.7
/// million): a config past it is damaged, and its context would overflow
/// the planner's byte counts.
const MAX_POSITIONS: usize = 1 << 24;

fn max_positions(check: &Validator, raw: Option<usize>) -> Result<usize> {
    match check.positive(raw.or(Some(2048)), "max_position_embeddings")? {
        n if n > MAX_POSITIONS => Err(check.error(
            "max_position_embeddings",
            format!("{n} is past the {MAX_POSITIONS} positions cleave accepts"),
        )),
        n => Ok(n),
    }
}
