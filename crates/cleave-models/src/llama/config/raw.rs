//! config.json as transformers writes it, field for field (both the
//! transformers-4 and -5 layouts), before any of it is checked.

use std::collections::BTreeMap;

use serde::Deserialize;

use cleave_hf::OneOrMany;

/// transformers 5's `rope_parameters`: one set, or one per attention type
/// (Gemma 3).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum RawRopeParameters {
    PerType {
        full_attention: RawRope,
        sliding_attention: Option<Box<RawRope>>,
    },
    Same(RawRope),
}

impl RawRopeParameters {
    pub(super) fn full(&self) -> &RawRope {
        match self {
            RawRopeParameters::PerType { full_attention, .. } => full_attention,
            RawRopeParameters::Same(rope) => rope,
        }
    }
}

/// `rope_scaling` (transformers 4) or `rope_parameters` (transformers 5).
#[derive(Clone, Debug, Default, Deserialize)]
pub(super) struct RawRope {
    pub(super) rope_type: Option<String>,
    /// The transformers-4 spelling of `rope_type`.
    #[serde(rename = "type")]
    pub(super) legacy_type: Option<String>,
    pub(super) rope_theta: Option<f64>,
    pub(super) factor: Option<f64>,
    pub(super) low_freq_factor: Option<f64>,
    pub(super) high_freq_factor: Option<f64>,
    pub(super) original_max_position_embeddings: Option<f64>,
    pub(super) partial_rotary_factor: Option<f64>,
    pub(super) short_factor: Option<Vec<f64>>,
    pub(super) long_factor: Option<Vec<f64>>,
    pub(super) attention_factor: Option<f64>,
    /// YaRN's.
    pub(super) beta_fast: Option<f64>,
    pub(super) beta_slow: Option<f64>,
    pub(super) mscale: Option<f64>,
    pub(super) mscale_all_dim: Option<f64>,
    pub(super) truncate: Option<bool>,
}

/// `use_bidirectional_attention`: Gemma 3's switch, or the attention
/// Gemma 4 makes bidirectional (`"all"`, `"vision"`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum Bidirectional {
    Switch(bool),
    Scope(String),
}

/// One layer's entry of Gemma 4's `per_layer_config`.
#[derive(Clone, Debug, Default, Deserialize)]
pub(super) struct RawLayerConfig {
    pub(super) head_dim: Option<usize>,
    pub(super) num_key_value_heads: Option<usize>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawConfig {
    pub(super) architectures: Option<Vec<String>>,
    pub(super) hidden_size: Option<usize>,
    pub(super) intermediate_size: Option<usize>,
    pub(super) num_hidden_layers: Option<usize>,
    pub(super) num_attention_heads: Option<usize>,
    pub(super) num_key_value_heads: Option<usize>,
    pub(super) head_dim: Option<usize>,
    pub(super) vocab_size: Option<usize>,
    pub(super) rms_norm_eps: Option<f64>,
    pub(super) rope_theta: Option<f64>,
    pub(super) rope_scaling: Option<RawRope>,
    pub(super) rope_parameters: Option<RawRopeParameters>,
    /// Gemma 3's rope base for sliding layers (transformers-4 layout).
    pub(super) rope_local_base_freq: Option<f64>,
    pub(super) max_position_embeddings: Option<usize>,
    /// Phi-3's context before LongRoPE's extension (transformers-4 layout).
    pub(super) original_max_position_embeddings: Option<f64>,
    pub(super) tie_word_embeddings: Option<bool>,
    pub(super) attention_bias: Option<bool>,
    pub(super) mlp_bias: Option<bool>,
    pub(super) hidden_act: Option<String>,
    pub(super) sliding_window: Option<usize>,
    pub(super) use_sliding_window: Option<bool>,
    pub(super) partial_rotary_factor: Option<f64>,
    pub(super) layer_types: Option<Vec<String>>,
    pub(super) sliding_window_pattern: Option<usize>,
    pub(super) query_pre_attn_scalar: Option<f64>,
    pub(super) attn_logit_softcapping: Option<f64>,
    pub(super) final_logit_softcapping: Option<f64>,
    /// Gemma's name for `hidden_act`.
    pub(super) hidden_activation: Option<String>,
    pub(super) num_local_experts: Option<usize>,
    pub(super) num_experts: Option<usize>,
    pub(super) num_experts_per_tok: Option<usize>,
    pub(super) moe_intermediate_size: Option<usize>,
    pub(super) norm_topk_prob: Option<bool>,
    pub(super) decoder_sparse_step: Option<usize>,
    pub(super) mlp_only_layers: Option<Vec<usize>>,
    pub(super) eos_token_id: Option<OneOrMany>,
    /// A multimodal checkpoint's language model (Qwen3.5 as published).
    pub(super) text_config: Option<Box<RawConfig>>,
    /// Qwen3.5's Gated DeltaNet layers.
    pub(super) linear_conv_kernel_dim: Option<usize>,
    pub(super) linear_num_key_heads: Option<usize>,
    pub(super) linear_key_head_dim: Option<usize>,
    pub(super) linear_num_value_heads: Option<usize>,
    pub(super) linear_value_head_dim: Option<usize>,
    /// Qwen3.5-MoE's sigmoid-gated shared expert.
    pub(super) shared_expert_intermediate_size: Option<usize>,
    /// Gemma 4's full layers' heads: per layer, or for every full layer.
    pub(super) per_layer_config: Option<BTreeMap<String, RawLayerConfig>>,
    pub(super) global_head_dim: Option<usize>,
    pub(super) num_global_key_value_heads: Option<usize>,
    pub(super) attention_k_eq_v: Option<bool>,
    pub(super) num_kv_shared_layers: Option<usize>,
    pub(super) hidden_size_per_layer_input: Option<usize>,
    pub(super) vocab_size_per_layer_input: Option<usize>,
    pub(super) enable_moe_block: Option<bool>,
    pub(super) top_k_experts: Option<usize>,
    pub(super) use_double_wide_mlp: Option<bool>,
    pub(super) use_bidirectional_attention: Option<Bidirectional>,
    /// gpt-oss's clamped SwiGLU.
    pub(super) swiglu_limit: Option<f64>,
    pub(super) swiglu_alpha: Option<f64>,
}
