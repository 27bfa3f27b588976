//! config.json's fields checked one by one (each error names its field)
//! and turned into a [`ModelConfig`].

use std::path::PathBuf;

use cleave_hf::{ReadError, Result, Validator};
use cleave_shaders::{Activation, SWIGLU_ALPHA, SWIGLU_LIMIT};

use super::raw::{Bidirectional, RawConfig, RawRope, RawRopeParameters};
use cleave_shaders::DeltaHeads;

use super::gemma4::gemma4_fields;
use super::{
    Architecture, AttentionType, Experts, HeadShape, LayerTypes, LinearAttention, ModelConfig, RopeScaling,
    ARCHITECTURES,
};

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

fn rope(
    check: &Validator,
    raw: &RawConfig,
    rotary_dim: usize,
    architecture: Architecture,
) -> Result<(f64, RopeScaling)> {
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
        Some("yarn") => yarn(check, &params, field, factor(&params)?)?,
        // Gemma 4's full layers: their frequencies come from the heads'
        // size (see `ModelConfig::rope_tables`), unscaled.
        Some("proportional") if architecture == Architecture::Gemma4 => match params.factor {
            None | Some(1.0) => RopeScaling::None,
            Some(f) => {
                return Err(check.error(
                    field,
                    format!("a proportional rope's factor {f} is not supported (1 only)"),
                ))
            }
        },
        Some(other) => {
            return Err(check.error(
                field,
                format!("rope_type '{other}' is not supported (supported: default, linear, llama3, longrope, yarn)"),
            ))
        }
    };
    Ok((theta, scaling))
}

/// YaRN's parameters as transformers reads them: the original context
/// given, `beta_fast` 32 and `beta_slow` 1 unless given, the ramp's ends
/// rounded unless `truncate` is false, and the attention factor given,
/// else from `mscale` and `mscale_all_dim`, else `0.1 · ln(factor) + 1`.
fn yarn(check: &Validator, params: &RawRope, field: &'static str, factor: f64) -> Result<RopeScaling> {
    let positive = |v: Option<f64>, name: &str, default: Option<f64>| {
        v.or(default)
            .filter(|v| v.is_finite() && *v > 0.0)
            .ok_or_else(|| check.error(field, format!("'{name}' is missing or not positive for rope_type yarn")))
    };
    let mscale = |scale: f64| match factor <= 1.0 {
        true => 1.0,
        false => 0.1 * scale * factor.ln() + 1.0,
    };
    let attention = match (params.attention_factor, params.mscale, params.mscale_all_dim) {
        (Some(given), ..) => positive(Some(given), "attention_factor", None)?,
        (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => mscale(m) / mscale(all),
        _ => mscale(1.0),
    };
    Ok(RopeScaling::Yarn {
        factor,
        beta_fast: positive(params.beta_fast, "beta_fast", Some(32.0))?,
        beta_slow: positive(params.beta_slow, "beta_slow", Some(1.0))?,
        original_context: positive(
            params.original_max_position_embeddings,
            "original_max_position_embeddings",
            None,
        )?,
        truncate: params.truncate.unwrap_or(true),
        attention,
    })
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
    if !matches!(architecture, Architecture::Gemma3 | Architecture::Gemma4) {
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
        .filter(|_| architecture.is_gemma() || architecture.is_qwen() || architecture == Architecture::GptOss)
    {
        if names.len() != layers {
            return Err(check.error("layer_types", format!("{} entries for {layers} layers", names.len())));
        }
        names
            .iter()
            .map(|name| match name.as_str() {
                "full_attention" => Ok(AttentionType::Full),
                "sliding_attention" => Ok(AttentionType::Sliding),
                "linear_attention" if architecture.is_hybrid() => Ok(AttentionType::Linear),
                other => Err(check.error(
                    "layer_types",
                    format!("'{other}' is not supported (supported: full_attention, sliding_attention)"),
                )),
            })
            .collect::<Result<Vec<_>>>()
            .map(|mut kinds| {
                // transformers makes Gemma 4's last layer full, whatever
                // the list says.
                if let (Architecture::Gemma4, Some(last)) = (architecture, kinds.last_mut()) {
                    *last = AttentionType::Full;
                }
                LayerTypes::Listed(kinds)
            })?
    } else {
        match architecture {
            Architecture::Gemma2 | Architecture::GptOss => LayerTypes::EveryNthFull(2),
            Architecture::Gemma3 | Architecture::Gemma4 => LayerTypes::EveryNthFull(
                check.positive(raw.sliding_window_pattern.or(Some(6)), "sliding_window_pattern")?,
            ),
            Architecture::Mistral | Architecture::Phi3 | Architecture::Mixtral if raw.sliding_window.is_some() => {
                LayerTypes::All(AttentionType::Sliding)
            }
            // transformers: every fourth layer full, the others linear.
            _ if architecture.is_hybrid() => LayerTypes::Listed(
                (0..layers.min(MAX_LISTED_LAYERS))
                    .map(|l| match (l + 1) % 4 {
                        0 => AttentionType::Full,
                        _ => AttentionType::Linear,
                    })
                    .collect(),
            ),
            _ => LayerTypes::All(AttentionType::Full),
        }
    };
    // An encoder's attention: EmbeddingGemma's Gemma 3, Gemma 4's "all"
    // ("vision" is the vision tower's, which is not loaded).
    let bidirectional = match &raw.use_bidirectional_attention {
        Some(Bidirectional::Switch(on)) => *on,
        Some(Bidirectional::Scope(scope)) => scope == "all",
        None => false,
    };
    if bidirectional {
        return Err(check.error(
            "use_bidirectional_attention",
            "attention over every position (an encoder's) is not supported: cleave runs causal decoders",
        ));
    }
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
/// Layers a default pattern is spelled out for: a config promising more
/// fails against its checkpoint (by the first missing block) before any
/// layer past this is asked for.
const MAX_LISTED_LAYERS: usize = 4096;

/// The Gated DeltaNet layers' heads and convolution, where some layers are
/// linear: every field given, positive, and the value heads a multiple of
/// the key heads (each key head serves as many value heads).
fn linear_attention(check: &Validator, raw: &RawConfig, types: &LayerTypes) -> Result<Option<LinearAttention>> {
    if !types.any_linear() {
        return Ok(None);
    }
    let key_heads = check.positive(raw.linear_num_key_heads, "linear_num_key_heads")?;
    let value_heads = check.positive(raw.linear_num_value_heads, "linear_num_value_heads")?;
    if !value_heads.is_multiple_of(key_heads) {
        return Err(check.error(
            "linear_num_value_heads",
            format!("{value_heads} is not a multiple of linear_num_key_heads ({key_heads})"),
        ));
    }
    let conv_taps = check.positive(raw.linear_conv_kernel_dim, "linear_conv_kernel_dim")?;
    if !(2..=MAX_CONV_TAPS).contains(&conv_taps) {
        return Err(check.error(
            "linear_conv_kernel_dim",
            format!("{conv_taps} is not a width in 2..={MAX_CONV_TAPS}"),
        ));
    }
    let key_dim = check.positive(raw.linear_key_head_dim, "linear_key_head_dim")?;
    if key_dim > MAX_KEY_DIM {
        return Err(check.error(
            "linear_key_head_dim",
            format!("{key_dim} is past the {MAX_KEY_DIM} dimensions a unit keeps in its registers"),
        ));
    }
    Ok(Some(LinearAttention {
        heads: DeltaHeads {
            key_heads,
            key_dim,
            value_heads,
            value_dim: check.positive(raw.linear_value_head_dim, "linear_value_head_dim")?,
            // transformers' order; a GGUF file's is set where it is opened.
            tiled_values: false,
        },
        conv_taps,
    }))
}

/// The widest causal convolution and key head a Gated DeltaNet kernel is
/// compiled for (Qwen3.5: 4 and 128).
const MAX_CONV_TAPS: usize = 16;
const MAX_KEY_DIM: usize = 256;

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
        Architecture::Mixtral | Architecture::GptOss => {
            ("num_local_experts", raw.intermediate_size, "intermediate_size")
        }
        Architecture::Qwen3Moe => {
            match raw.decoder_sparse_step.unwrap_or(1) {
                1 => {}
                0 => return Err(check.error("decoder_sparse_step", "0 must be at least 1")),
                step => {
                    return Err(check.error(
                        "decoder_sparse_step",
                        format!("{step}: dense layers between sparse ones are not supported"),
                    ))
                }
            }
            // transformers passes over layers past the model's.
            let layers = raw.num_hidden_layers.unwrap_or(0);
            let dense = raw.mlp_only_layers.iter().flatten().filter(|&&l| l < layers);
            if let Some(layer) = dense.min() {
                return Err(check.error(
                    "mlp_only_layers",
                    format!("layer {layer} is dense: dense layers between sparse ones are not supported"),
                ));
            }
            ("num_experts", raw.moe_intermediate_size, "moe_intermediate_size")
        }
        Architecture::Qwen3_5Moe => ("num_experts", raw.moe_intermediate_size, "moe_intermediate_size"),
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
    let width = check.positive(width, width_field)?;
    let experts = Experts {
        count,
        width,
        top_k,
        // Qwen3.5-MoE's router always renormalizes; gpt-oss's takes the
        // softmax of the top-k logits, which is the same.
        renormalize: matches!(
            architecture,
            Architecture::Mixtral | Architecture::Qwen3_5Moe | Architecture::GptOss
        ) || raw.norm_topk_prob == Some(true),
    };
    Ok(Some((experts, width)))
}

pub(super) fn validate(check: &Validator, mut raw: RawConfig) -> Result<ModelConfig> {
    let architecture = architecture(check, raw.architectures.clone())?;
    // A multimodal checkpoint describes its language model in `text_config`
    // and stores it under `model.language_model.`.
    let (raw, stored_prefix) = match raw.text_config.take() {
        Some(mut text) => {
            text.tie_word_embeddings = text.tie_word_embeddings.or(raw.tie_word_embeddings);
            text.eos_token_id = text.eos_token_id.or(raw.eos_token_id);
            (*text, Some("model.language_model."))
        }
        None => (raw, None),
    };
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
    let activation = match architecture {
        Architecture::GptOss => gpt_oss_swiglu(check, &raw)?,
        _ => activation,
    };
    let eps = raw.rms_norm_eps.unwrap_or(1e-6);
    if !(eps.is_finite() && eps > 0.0) {
        return Err(check.error("rms_norm_eps", format!("{eps} must be a positive number")));
    }
    let layers = check.positive(raw.num_hidden_layers, "num_hidden_layers")?;
    let layer_types = layer_types(check, &raw, architecture, layers)?;
    let sliding_heads = HeadShape { head_dim, kv_heads };
    let gemma4 = match architecture {
        Architecture::Gemma4 => Some(gemma4_fields(check, &raw, &layer_types, layers, sliding_heads)?),
        _ => None,
    };
    let full_heads = gemma4.as_ref().and_then(|g| g.full_heads);
    // Gemma 4's full layers turn a part of their own, larger heads.
    let rotary_dim = rotary_dim(check, &raw, full_heads.map_or(head_dim, |f| f.head_dim))?;
    let (rope_theta, rope_scaling) = rope(check, &raw, rotary_dim, architecture)?;
    let max_positions = max_positions(check, raw.max_position_embeddings)?;
    // A window at least as wide as every position the model takes keeps
    // every key, as full attention does; past that it would only overflow
    // the kernels' 32-bit key counts.
    let sliding_window = raw
        .sliding_window
        .filter(|_| layer_types.any_sliding())
        .map(|w| w.min(max_positions));
    // transformers: `query_pre_attn_scalar ** -0.5` or `head_dim ** -0.5`, in f64.
    let attention_scale = match raw.query_pre_attn_scalar.filter(|_| gemma) {
        // Gemma 4 norms q and k instead.
        _ if gemma4.is_some() => 1.0,
        Some(s) if s.is_finite() && s > 0.0 => s.powf(-0.5) as f32,
        Some(s) => return Err(check.error("query_pre_attn_scalar", format!("{s} must be a positive number"))),
        None => (head_dim as f64).powf(-0.5) as f32,
    };
    // Gemma 4's experts run beside the MLP, which keeps its width.
    let (experts, intermediate_size) = match experts(check, &raw, architecture)? {
        Some((experts, width)) => (Some(experts), width),
        None => (
            gemma4.as_ref().and_then(|g| g.experts),
            check.positive(raw.intermediate_size, "intermediate_size")?,
        ),
    };
    let attention_bias = raw.attention_bias.unwrap_or(false);
    let hybrid = architecture.is_hybrid();
    let linear_attention = linear_attention(check, &raw, &layer_types)?;
    let shared_expert = match architecture {
        Architecture::Qwen3_5Moe => {
            Some(check.positive(raw.shared_expert_intermediate_size, "shared_expert_intermediate_size")?)
        }
        _ => None,
    };
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
        norm_plus_one: (gemma && gemma4.is_none()) || hybrid,
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
        max_positions,
        tie_word_embeddings: raw.tie_word_embeddings,
        qkv_bias: architecture == Architecture::Qwen2 || attention_bias,
        o_bias: matches!(architecture, Architecture::Llama | Architecture::GptOss) && attention_bias,
        // gpt-oss's experts all have biases.
        mlp_bias: architecture == Architecture::GptOss
            || architecture == Architecture::Llama && raw.mlp_bias.unwrap_or(false),
        sliding_window,
        qk_norm: matches!(
            architecture,
            Architecture::Qwen3 | Architecture::Qwen3Moe | Architecture::Gemma3 | Architecture::Gemma4
        ) || hybrid,
        rotary_dim,
        attention_output_gate: hybrid,
        linear_attention,
        attention_sinks: architecture == Architecture::GptOss,
        shared_expert,
        full_heads,
        first_kv_shared: gemma4.as_ref().map_or(layers, |g| g.first_kv_shared),
        v_norm: gemma4.is_some(),
        k_eq_v: gemma4.as_ref().is_some_and(|g| g.k_eq_v),
        double_wide_mlp: gemma4.as_ref().is_some_and(|g| g.double_wide_mlp),
        per_layer_inputs: gemma4.as_ref().and_then(|g| g.per_layer_inputs),
        layer_scalar: gemma4.is_some(),
        experts_beside_mlp: gemma4.as_ref().is_some_and(|g| g.experts.is_some()),
        stored_prefix,
        eos_token_ids: raw.eos_token_id.map(|e| e.ids()).unwrap_or_default(),
    })
}

/// gpt-oss's clamped SwiGLU, whose limit and alpha the kernels hold as
/// the published models' (7 and 1.702): another value is refused by name.
fn gpt_oss_swiglu(check: &Validator, raw: &RawConfig) -> Result<Activation> {
    let fields = [
        ("swiglu_limit", raw.swiglu_limit, SWIGLU_LIMIT),
        ("swiglu_alpha", raw.swiglu_alpha, SWIGLU_ALPHA),
    ];
    for (field, value, runs) in fields {
        if let Some(value) = value.filter(|&v| v as f32 != runs) {
            return Err(check.error(field, format!("{value}: cleave runs gpt-oss's {runs} only")));
        }
    }
    Ok(Activation::ClampedSwiGlu)
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::ModelConfig;

    /// A Gemma 3 config of 4 layers, sliding and full in turn, with
    /// `sliding_window` as given.
    fn gemma3_with_window(window: u64) -> ModelConfig {
        let config = serde_json::json!({
            "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
            "hidden_size": 64, "intermediate_size": 128, "head_dim": 32,
            "num_attention_heads": 4, "num_key_value_heads": 1, "num_hidden_layers": 4,
            "vocab_size": 512, "max_position_embeddings": 256, "query_pre_attn_scalar": 32,
            "hidden_activation": "gelu_pytorch_tanh", "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0, "sliding_window_pattern": 2,
            "sliding_window": window,
        });
        ModelConfig::from_value(Path::new("config.json"), config).unwrap()
    }

    /// A Qwen3-MoE config of 2 layers, edited by `edit`.
    fn qwen3_moe(edit: impl FnOnce(&mut serde_json::Value)) -> Result<ModelConfig, String> {
        let mut config = serde_json::json!({
            "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 48, "head_dim": 16,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
            "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 512,
            "max_position_embeddings": 256, "rope_theta": 1000000.0,
        });
        edit(&mut config);
        ModelConfig::from_value(Path::new("config.json"), config).map_err(|e| e.to_string())
    }

    /// Dense layers among the sparse ones are refused naming the field;
    /// `mlp_only_layers` past the model's layers are passed over, as
    /// transformers does.
    #[test]
    fn qwen3_moe_dense_layers_are_refused_for_what_they_are() {
        assert!(qwen3_moe(|_| {}).is_ok());
        assert!(qwen3_moe(|c| c["mlp_only_layers"] = serde_json::json!([2, 99])).is_ok());
        let cases = [
            ("mlp_only_layers", serde_json::json!([99, 1]), "layer 1 is dense"),
            ("decoder_sparse_step", serde_json::json!(0), "0 must be at least 1"),
            (
                "decoder_sparse_step",
                serde_json::json!(2),
                "2: dense layers between sparse ones",
            ),
        ];
        for (field, value, reason) in cases {
            let err = qwen3_moe(|c| c[field] = value.clone()).unwrap_err();
            assert!(err.contains(field) && err.contains(reason), "{err}");
        }
    }

    /// A window past every position the model takes is full attention over
    /// its positions, whatever its size: none wraps around 32 bits into a
    /// narrower window (2^32 + 8 into 8) or an empty one.
    #[test]
    fn a_window_wider_than_the_positions_keeps_every_key() {
        assert_eq!(gemma3_with_window(8).window(0), 8);
        for window in [256, 257, 1 << 32, (1 << 32) + 8, u64::MAX] {
            let config = gemma3_with_window(window);
            assert_eq!(config.window(0), 256, "sliding_window {window}");
            assert_eq!(config.window(1), 0, "a full layer");
        }
    }
}
