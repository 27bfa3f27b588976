//! config.json: a serde mirror of what transformers writes (both the
//! transformers-4 and -5 layouts), and the validated config the model runs on.

use std::ops::Range;
use std::path::{Path, PathBuf};

use cleave_hf::{read_json, Checkpoint, OneOrMany, ReadError, Result, Validator};
use cleave_nn::CacheType;
use cleave_plan::{BlockGeometry, Inventory, Matmul, Role};
use serde::Deserialize;

/// The decoder families cleave runs. They share one forward pass and differ
/// in which projections carry a bias, and in Qwen3's norms on q and k.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    /// Phi-3 and Phi-4-mini: fused q/k/v and gate/up weights, partial rotary.
    Phi3,
}

/// The `architectures[0]` names this family runs.
pub const ARCHITECTURES: [&str; 5] = [
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Phi3ForCausalLM",
];

impl Architecture {
    const ALL: [(&'static str, Architecture); 5] = [
        ("LlamaForCausalLM", Architecture::Llama),
        ("MistralForCausalLM", Architecture::Mistral),
        ("Qwen2ForCausalLM", Architecture::Qwen2),
        ("Qwen3ForCausalLM", Architecture::Qwen3),
        ("Phi3ForCausalLM", Architecture::Phi3),
    ];
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
    rope_parameters: Option<RawRope>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    hidden_act: Option<String>,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
    partial_rotary_factor: Option<f64>,
    eos_token_id: Option<OneOrMany>,
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
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub max_positions: usize,
    /// `None` when config.json does not say (then the checkpoint does: a
    /// missing `lm_head.weight` means the head is the embedding table).
    pub tie_word_embeddings: Option<bool>,
    /// Bias on the q, k and v projections.
    pub qkv_bias: bool,
    /// Bias on the output projection of attention.
    pub o_bias: bool,
    pub mlp_bias: bool,
    /// Keys further back than this are not attended to (Mistral).
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

    /// Makes Phi-3's fused weights load as their parts: `qkv_proj` as
    /// `q_proj`, `k_proj`, `v_proj` and `gate_up_proj` as `gate_proj`,
    /// `up_proj` (rows of the stored tensor, no copy), so that every split
    /// mode slices them as it slices the others.
    pub fn unfuse(&self, checkpoint: &mut Checkpoint) {
        if self.architecture != Architecture::Phi3 {
            return;
        }
        let (_, q, kv, i) = self.widths();
        for layer in 0..self.layers {
            let name = |part: &str| format!("model.layers.{layer}.{part}.weight");
            let parts = |names: &[(&str, Range<usize>)]| -> Vec<(String, Range<usize>)> {
                names.iter().map(|(n, rows)| (name(n), rows.clone())).collect()
            };
            checkpoint.split_rows(
                &name("self_attn.qkv_proj"),
                &parts(&[
                    ("self_attn.q_proj", 0..q),
                    ("self_attn.k_proj", q..q + kv),
                    ("self_attn.v_proj", q + kv..q + 2 * kv),
                ]),
            );
            checkpoint.split_rows(
                &name("mlp.gate_up_proj"),
                &parts(&[("mlp.gate_proj", 0..i), ("mlp.up_proj", i..2 * i)]),
            );
        }
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
        let shapes: [(String, Vec<usize>); 5] = [
            ("model.embed_tokens.weight".into(), vec![self.vocab_size, h]),
            (format!("{last}.input_layernorm.weight"), vec![h]),
            (format!("{last}.self_attn.q_proj.weight"), vec![q, h]),
            (format!("{last}.self_attn.k_proj.weight"), vec![kv, h]),
            (format!("{last}.mlp.gate_proj.weight"), vec![i, h]),
        ];
        for (name, shape) in &shapes {
            checkpoint.expect_shape(name, shape)?;
        }
        Ok(())
    }

    /// The rotation frequency of each pair of dimensions of a head, as
    /// transformers computes them in f32.
    pub fn inv_freq(&self) -> Vec<f32> {
        let dim = self.rotary_dim;
        let base = self.rope_theta as f32;
        let plain = (0..dim / 2).map(|i| 1.0 / base.powf((2 * i) as f32 / dim as f32));
        match self.rope_scaling {
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
        }
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
        };
        BlockGeometry {
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            intermediate: i,
            matmuls: vec![
                matmul("self_attn.q_proj", Role::Query, q, h, self.qkv_bias),
                matmul("self_attn.k_proj", Role::Key, kv, h, self.qkv_bias),
                matmul("self_attn.v_proj", Role::Value, kv, h, self.qkv_bias),
                matmul("self_attn.o_proj", Role::Output, h, q, self.o_bias),
                matmul("mlp.gate_proj", Role::Gate, i, h, self.mlp_bias),
                matmul("mlp.up_proj", Role::Up, i, h, self.mlp_bias),
                matmul("mlp.down_proj", Role::Down, h, i, self.mlp_bias),
            ],
            per_head_shard_bytes: if self.qk_norm {
                (2 * self.head_dim * size_of::<f32>()) as u64
            } else {
                0
            },
        }
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
        let (vocab, heads, head_dim) = (self.vocab_size as u128, self.heads as u128, self.head_dim as u128);
        let bias = |on: bool, n: u128| if on { n } else { 0 };
        let vectors = 2 * hu
            + bias(self.qk_norm, 2 * head_dim)
            + bias(self.qkv_bias, qu + 2 * kvu)
            + bias(self.o_bias, hu)
            + bias(self.mlp_bias, 2 * iu + hu);
        let block_bytes = (0..self.layers)
            .map(|layer| {
                geometry
                    .matmuls
                    .iter()
                    .map(|m| {
                        checkpoint.matrix_bytes(&format!("model.layers.{layer}.{}.weight", m.name), m.rows, m.cols)
                    })
                    .fold(f32_bytes(vectors), u64::saturating_add)
            })
            .collect();
        let embed = checkpoint.matrix_bytes("model.embed_tokens.weight", self.vocab_size, h);
        let head = if tied {
            embed
        } else {
            checkpoint.matrix_bytes("lm_head.weight", self.vocab_size, h)
        };
        // One prefill batch: hidden states, q/k/v, attention scores over the
        // whole context, the MLP's three intermediates, one row of logits,
        // plus the rotary table.
        let batch = context.min(512);
        let compute = batch * (2 * hu + qu + 2 * kvu + 3 * iu) + heads * batch * context + vocab + context * head_dim;
        Inventory {
            module: "llm".into(),
            head_bytes: embed,
            block_bytes,
            tail_bytes: f32_bytes(hu).saturating_add(head),
            tail_shared_with_head: if tied { embed } else { 0 },
            kv_bytes_per_block: u64::try_from(sequences * context * self.kv_bytes_per_position(cache) as u128)
                .unwrap_or(u64::MAX),
            compute_bytes: f32_bytes(compute),
            geometry: Some(geometry),
        }
    }

    /// Bytes of K and V cache per position and layer, in `cache`'s type.
    pub fn kv_bytes_per_position(&self, cache: CacheType) -> usize {
        2 * self.kv_heads * self.head_dim * cache.bytes()
    }
}

/// The dimensions of a head that rope rotates: `partial_rotary_factor` of
/// them (top level, or inside the rope parameters), all by default.
fn rotary_dim(check: &Validator, raw: &RawConfig, head_dim: usize) -> Result<usize> {
    let params = raw.rope_parameters.as_ref().or(raw.rope_scaling.as_ref());
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

fn rope(check: &Validator, raw: &RawConfig) -> Result<(f64, RopeScaling)> {
    // transformers 5 keeps theta inside rope_parameters; 4 at top level.
    let params = raw
        .rope_parameters
        .clone()
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
        Some(other) => {
            return Err(check.error(
                field,
                format!("rope_type '{other}' is not supported (supported: default, linear, llama3)"),
            ))
        }
    };
    Ok((theta, scaling))
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
    check.supported("hidden_act", raw.hidden_act.as_deref().unwrap_or("silu"), &["silu"])?;
    let (rope_theta, rope_scaling) = rope(check, &raw)?;
    let eps = raw.rms_norm_eps.unwrap_or(1e-6);
    if !(eps.is_finite() && eps > 0.0) {
        return Err(check.error("rms_norm_eps", format!("{eps} must be a positive number")));
    }
    let sliding_window = match architecture {
        Architecture::Mistral | Architecture::Phi3 => raw.sliding_window,
        Architecture::Qwen2 | Architecture::Qwen3 if raw.use_sliding_window == Some(true) => {
            return Err(check.error("use_sliding_window", "Qwen's per-layer sliding window is not supported"))
        }
        _ => None,
    };
    let attention_bias = raw.attention_bias.unwrap_or(false);
    Ok(ModelConfig {
        architecture,
        hidden_size,
        intermediate_size: check.positive(raw.intermediate_size, "intermediate_size")?,
        layers: check.positive(raw.num_hidden_layers, "num_hidden_layers")?,
        heads,
        kv_heads,
        head_dim,
        vocab_size: check.positive(raw.vocab_size, "vocab_size")?,
        rms_norm_eps: eps as f32,
        rope_theta,
        rope_scaling,
        max_positions: max_positions(check, raw.max_position_embeddings)?,
        tie_word_embeddings: raw.tie_word_embeddings,
        qkv_bias: architecture == Architecture::Qwen2 || attention_bias,
        o_bias: architecture == Architecture::Llama && attention_bias,
        mlp_bias: architecture == Architecture::Llama && raw.mlp_bias.unwrap_or(false),
        sliding_window,
        qk_norm: architecture == Architecture::Qwen3,
        rotary_dim: rotary_dim(check, &raw, head_dim)?,
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
