//! The config.json transformers writes for a GGUF file's model, from the
//! hyperparameters in its metadata (`<arch>.block_count` and friends), in
//! transformers 5's layout (rope settings in `rope_parameters`).

mod gemma4;
mod qwen35;

use serde_json::{json, Map, Value};

use crate::error::{GgufError, Result};
use crate::file::{Architecture, GgufFile};
use crate::metadata::PerLayer;

/// llama.cpp stores Llama 3.1's frequency-dependent rope scaling as this
/// tensor of per-frequency factors, not as metadata.
const ROPE_FACTORS: &str = "rope_freqs.weight";
/// Phi-3's LongRoPE factors, per frequency, for passes within and past the
/// original context.
const LONG_FACTORS: &str = "rope_factors_long.weight";
const SHORT_FACTORS: &str = "rope_factors_short.weight";

impl Architecture {
    /// The class transformers names in `architectures`.
    fn transformers_class(self) -> &'static str {
        match self {
            Architecture::Llama => "LlamaForCausalLM",
            Architecture::Mixtral => "MixtralForCausalLM",
            Architecture::Qwen2 => "Qwen2ForCausalLM",
            Architecture::Qwen3 => "Qwen3ForCausalLM",
            Architecture::Qwen3Moe => "Qwen3MoeForCausalLM",
            Architecture::Phi3 => "Phi3ForCausalLM",
            Architecture::Gemma2 => "Gemma2ForCausalLM",
            Architecture::Gemma3 => "Gemma3ForCausalLM",
            Architecture::Gemma4 => "Gemma4ForCausalLM",
            Architecture::Qwen35 => "Qwen3_5ForCausalLM",
            Architecture::Qwen35Moe => "Qwen3_5MoeForCausalLM",
            Architecture::GptOss => "GptOssForCausalLM",
        }
    }

    fn transformers_model_type(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Mixtral => "mixtral",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Qwen3Moe => "qwen3_moe",
            Architecture::Phi3 => "phi3",
            Architecture::Gemma2 => "gemma2",
            Architecture::Gemma3 => "gemma3_text",
            Architecture::Gemma4 => "gemma4_text",
            Architecture::Qwen35 => "qwen3_5_text",
            Architecture::Qwen35Moe => "qwen3_5_moe_text",
            Architecture::GptOss => "gpt_oss",
        }
    }
}

/// Gemma's attention scale is `1/√query_pre_attn_scalar`, which GGUF does
/// not store: llama.cpp takes `hidden / heads` for the 27B models (46
/// layers of Gemma 2, 62 of Gemma 3) and the head size for the others, as
/// their checkpoints say.
fn gemma_query_scalar(arch: Architecture, layers: u64, hidden: u64, heads: u64, head_dim: u64) -> u64 {
    let is_27b = matches!((arch, layers), (Architecture::Gemma2, 46) | (Architecture::Gemma3, 62));
    if is_27b {
        hidden / heads
    } else {
        head_dim
    }
}

/// config.json's fields, each `None` where the file leaves it out.
pub(crate) type Fields = Vec<(&'static str, Option<Value>)>;

/// The model's sizes, as every family's fields read them.
pub(crate) struct Shapes {
    pub hidden: u64,
    pub heads: u64,
    /// Of the sliding layers, in Gemma 4.
    pub head_dim: u64,
    pub layers: u64,
    pub kv_heads: PerLayer,
    pub widths: PerLayer,
}

impl GgufFile {
    /// config.json as transformers would write it for this file's model.
    pub fn hf_config(&self) -> Result<Value> {
        let arch = self.architecture()?;
        let m = self.metadata();
        let prefix = arch.key_prefix();
        let key = |name: &str| format!("{prefix}.{name}");

        let hidden = m.u64(&key("embedding_length"))?;
        let heads_key = key("attention.head_count");
        let heads = m.u64(&heads_key)?;
        if heads == 0 {
            return Err(m.invalid(&heads_key, "must be positive"));
        }
        // Gemma 4's `key_length` is its full layers'; transformers'
        // `head_dim` is the sliding layers'.
        let head_key = match arch {
            Architecture::Gemma4 => key("attention.key_length_swa"),
            _ => key("attention.key_length"),
        };
        let head_dim = m.opt_u64(&head_key)?.unwrap_or(hidden / heads);
        let blocks = m.u64(&key("block_count"))?;
        // The blocks past the model's are its multi-token prediction heads
        // (Qwen3.5's), which are not run.
        let nextn_key = key("nextn_predict_layers");
        let nextn = m.opt_u64(&nextn_key)?.unwrap_or(0);
        let layers = blocks
            .checked_sub(nextn)
            .filter(|&l| l > 0)
            .ok_or_else(|| m.invalid(&nextn_key, format!("{nextn} of the {blocks} blocks leaves no layers")))?;
        let kv_heads_key = key("attention.head_count_kv");
        let kv_heads = m.opt_per_layer(&kv_heads_key, blocks)?.unwrap_or(PerLayer::All(heads));
        // Qwen3.5's mixture has no dense width but its experts'.
        let widths_key = match arch {
            Architecture::Qwen35Moe => key("expert_feed_forward_length"),
            _ => key("feed_forward_length"),
        };
        let widths = m.required(&widths_key, m.opt_per_layer(&widths_key, blocks)?)?;
        // Only Gemma 4's layers differ, which its fields say one by one.
        if arch != Architecture::Gemma4 {
            for (key, values) in [(&kv_heads_key, &kv_heads), (&widths_key, &widths)] {
                if values.uniform().is_none() {
                    return Err(m.invalid(key, "layers that differ are not supported"));
                }
            }
        }
        let vocab_size = match m.opt_u64(&key("vocab_size"))? {
            Some(n) => n,
            None => m.strings("tokenizer.ggml.tokens")?.len() as u64,
        };
        let rms_key = key("attention.layer_norm_rms_epsilon");
        let rms_norm_eps = m.required(&rms_key, m.opt_positive_f64(&rms_key)?)?;

        let shapes = Shapes {
            hidden,
            heads,
            head_dim,
            layers,
            kv_heads,
            widths,
        };
        let required = [
            ("architectures", json!([arch.transformers_class()])),
            ("model_type", arch.transformers_model_type().into()),
            ("vocab_size", vocab_size.into()),
            ("hidden_size", hidden.into()),
            ("intermediate_size", shapes.widths.at(0).into()),
            ("num_hidden_layers", layers.into()),
            ("num_attention_heads", heads.into()),
            ("num_key_value_heads", shapes.kv_heads.at(0).into()),
            ("head_dim", head_dim.into()),
            ("hidden_act", "silu".into()),
            ("rms_norm_eps", rms_norm_eps.into()),
            ("max_position_embeddings", m.u64(&key("context_length"))?.into()),
            (
                "rope_parameters",
                match arch {
                    Architecture::Gemma4 => self.gemma4_rope_parameters()?,
                    _ => self.rope_parameters(arch)?,
                },
            ),
            ("tie_word_embeddings", (!self.contains_hf("lm_head.weight")).into()),
        ];
        let optional = [
            (
                "bos_token_id",
                m.opt_u64("tokenizer.ggml.bos_token_id")?.map(Value::from),
            ),
            (
                "eos_token_id",
                m.opt_u64("tokenizer.ggml.eos_token_id")?.map(Value::from),
            ),
            (
                "pad_token_id",
                m.opt_u64("tokenizer.ggml.padding_token_id")?.map(Value::from),
            ),
            // llama.cpp writes 0 for "none" (Phi-3).
            (
                "sliding_window",
                m.opt_u64(&key("attention.sliding_window"))?
                    .filter(|&w| w > 0)
                    .map(Value::from),
            ),
            // Llama checkpoints with q/k/v biases say so; Qwen2 always has them.
            (
                "attention_bias",
                (arch == Architecture::Llama).then(|| self.contains_hf("model.layers.0.self_attn.q_proj.bias").into()),
            ),
        ];
        let fields: Map<String, Value> = required
            .into_iter()
            .map(|(name, value)| (name, Some(value)))
            .chain(optional)
            .chain(self.family_fields(arch, &shapes)?)
            .filter_map(|(name, value)| Some((name.to_string(), value?)))
            .collect();
        Ok(Value::Object(fields))
    }

    /// The fields only some families have: experts, Gemma's norms, caps
    /// and attention pattern, Phi-3's partial rotary.
    fn family_fields(&self, arch: Architecture, shapes: &Shapes) -> Result<Fields> {
        let &Shapes {
            hidden,
            heads,
            head_dim,
            layers,
            ..
        } = shapes;
        let m = self.metadata();
        let key = |name: &str| format!("{}.{name}", arch.key_prefix());
        // llama.cpp renormalizes the chosen experts' weights of both
        // mixtures, whatever the file says.
        let experts = || -> Result<Fields> {
            Ok(vec![
                ("num_experts_per_tok", Some(m.u64(&key("expert_used_count"))?.into())),
                ("norm_topk_prob", Some(true.into())),
            ])
        };
        let gemma = || -> Result<Fields> {
            // llama.cpp's defaults: Gemma 2 always slides (4,096 keys);
            // Gemma 3 only with a window.
            let window = m
                .opt_u64(&key("attention.sliding_window"))?
                .or((arch == Architecture::Gemma2).then_some(4096))
                .filter(|&w| w > 0);
            let mut fields = vec![
                ("hidden_activation", Some("gelu_pytorch_tanh".into())),
                (
                    "query_pre_attn_scalar",
                    Some(gemma_query_scalar(arch, layers, hidden, heads, head_dim).into()),
                ),
                ("sliding_window", window.map(Value::from)),
                ("layer_types", Some(self.layer_types(arch, layers, window.is_some())?)),
            ];
            for cap in ["attn_logit_softcapping", "final_logit_softcapping"] {
                fields.push((cap, m.opt_positive_f64(&key(cap))?.map(Value::from)));
            }
            Ok(fields)
        };
        let mut fields = match arch {
            Architecture::Llama | Architecture::Qwen2 | Architecture::Qwen3 => vec![],
            Architecture::Mixtral => {
                let mut fields = experts()?;
                fields.push(("num_local_experts", Some(m.u64(&key("expert_count"))?.into())));
                fields
            }
            Architecture::Qwen3Moe => {
                let mut fields = experts()?;
                fields.push(("num_experts", Some(m.u64(&key("expert_count"))?.into())));
                fields.push((
                    "moe_intermediate_size",
                    Some(m.u64(&key("expert_feed_forward_length"))?.into()),
                ));
                fields
            }
            Architecture::Phi3 => {
                let rotary = m.opt_u64(&key("rope.dimension_count"))?.unwrap_or(head_dim);
                vec![("partial_rotary_factor", Some((rotary as f64 / head_dim as f64).into()))]
            }
            Architecture::Gemma2 => gemma()?,
            Architecture::GptOss => {
                let mut fields = experts()?;
                fields.push(("num_local_experts", Some(m.u64(&key("expert_count"))?.into())));
                fields.push(("attention_bias", Some(true.into())));
                let slides = m.opt_u64(&key("attention.sliding_window"))?.is_some_and(|w| w > 0);
                fields.push(("layer_types", Some(self.layer_types(arch, layers, slides)?)));
                fields
            }
            Architecture::Gemma4 => self.gemma4_fields(shapes)?,
            Architecture::Qwen35 => self.qwen35_fields(shapes)?,
            Architecture::Qwen35Moe => {
                let mut fields = experts()?;
                fields.extend(self.qwen35_fields(shapes)?);
                let width = |name: &str| -> Result<Option<Value>> { Ok(Some(m.u64(&key(name))?.into())) };
                fields.extend([
                    ("num_experts", Some(m.u64(&key("expert_count"))?.into())),
                    ("moe_intermediate_size", width("expert_feed_forward_length")?),
                    (
                        "shared_expert_intermediate_size",
                        width("expert_shared_feed_forward_length")?,
                    ),
                ]);
                fields
            }
            Architecture::Gemma3 => {
                let mut fields = gemma()?;
                fields.push((
                    "rope_local_base_freq",
                    Some(
                        m.opt_positive_f64(&key("rope.freq_base_swa"))?
                            .unwrap_or(10_000.0)
                            .into(),
                    ),
                ));
                fields
            }
        };
        fields.retain(|(_, value)| value.is_some());
        Ok(fields)
    }

    /// Each layer's attention in a Gemma or gpt-oss file, as llama.cpp
    /// decides it: none slides without a window; else
    /// `attention.sliding_window_pattern` where the file has it (a flag per
    /// layer, true for sliding, or a period n: every n-th layer full, every
    /// layer sliding for 0), else Gemma 2's and gpt-oss's period of 2 and
    /// Gemma 3's of 6.
    pub(crate) fn layer_types(&self, arch: Architecture, layers: u64, slides: bool) -> Result<Value> {
        let m = self.metadata();
        self.check_layer_count(arch, layers)?;
        let pattern_key = format!("{}.attention.sliding_window_pattern", arch.key_prefix());
        let period = |period: u64| (0..layers).map(move |l| period == 0 || (l + 1) % period != 0).collect();
        let sliding: Vec<bool> = match m.get(&pattern_key) {
            _ if !slides => vec![false; layers as usize],
            Some(crate::Value::Array(crate::Array::Bool(flags))) => {
                if flags.len() as u64 != layers {
                    return Err(m.invalid(&pattern_key, format!("{} flags for {layers} layers", flags.len())));
                }
                flags.clone()
            }
            Some(_) => period(m.u64(&pattern_key)?),
            None if matches!(arch, Architecture::Gemma2 | Architecture::GptOss) => period(2),
            None => period(6),
        };
        let names = sliding
            .iter()
            .map(|&s| if s { "sliding_attention" } else { "full_attention" });
        Ok(Value::from(names.collect::<Vec<_>>()))
    }

    /// Refuses `layers` past the file's tensors (each block holds tensors
    /// of its own), so that a list of that many layers is never made from
    /// a damaged count.
    pub(crate) fn check_layer_count(&self, arch: Architecture, layers: u64) -> Result<()> {
        if layers > self.tensors().len() as u64 {
            return Err(self.metadata().invalid(
                &format!("{}.block_count", arch.key_prefix()),
                format!("{layers} blocks, but the file holds {} tensors", self.tensors().len()),
            ));
        }
        Ok(())
    }

    /// `rope_parameters`: theta from `rope.freq_base`; scaling from
    /// `rope.scaling.type` and `rope.scaling.factor` (or the older
    /// `rope.scale_linear`), or from tensors of per-frequency factors:
    /// Llama 3's `rope_freqs` (one set, whatever the position) and Phi-3's
    /// LongRoPE pair. transformers' `longrope` divides each frequency by
    /// its factor as llama.cpp does, so both are written as that.
    fn rope_parameters(&self, arch: Architecture) -> Result<Value> {
        let m = self.metadata();
        let key = |name: &str| format!("{}.{name}", arch.key_prefix());
        let mut rope = Map::new();
        let theta = m.opt_positive_f64(&key("rope.freq_base"))?.unwrap_or(10_000.0);
        rope.insert("rope_theta".into(), theta.into());
        if let Some(factors) = self.rope_factors(ROPE_FACTORS)? {
            let context = m.u64(&key("context_length"))?;
            rope.extend([
                ("rope_type".to_string(), "longrope".into()),
                ("short_factor".to_string(), factors.clone().into()),
                ("long_factor".to_string(), factors.into()),
                ("original_max_position_embeddings".to_string(), context.into()),
                ("attention_factor".to_string(), 1.0.into()),
            ]);
            return Ok(Value::Object(rope));
        }
        if let (Some(long), Some(short)) = (self.rope_factors(LONG_FACTORS)?, self.rope_factors(SHORT_FACTORS)?) {
            let original_key = key("rope.scaling.original_context_length");
            let original = m.required(&original_key, m.opt_u64(&original_key)?)?;
            rope.extend([
                ("rope_type".to_string(), "longrope".into()),
                ("short_factor".to_string(), short.into()),
                ("long_factor".to_string(), long.into()),
                ("original_max_position_embeddings".to_string(), original.into()),
            ]);
            if let Some(attention) = m.opt_positive_f64(&key("rope.scaling.attn_factor"))? {
                rope.insert("attention_factor".into(), attention.into());
            }
            return Ok(Value::Object(rope));
        }
        let type_key = key("rope.scaling.type");
        let factor_key = key("rope.scaling.factor");
        let legacy_key = key("rope.scale_linear");
        let (kind, factor) = match m.opt_str(&type_key)? {
            None | Some("none") => match m.opt_positive_f64(&legacy_key)? {
                Some(f) if f != 1.0 => ("linear", Some(f)),
                _ => ("default", None),
            },
            Some("linear") => {
                let f = m.required(&factor_key, m.opt_positive_f64(&factor_key)?)?;
                ("linear", Some(f))
            }
            Some("yarn") => {
                let f = m.required(&factor_key, m.opt_positive_f64(&factor_key)?)?;
                let original_key = key("rope.scaling.original_context_length");
                let original = m.required(&original_key, m.opt_u64(&original_key)?)?;
                rope.insert("original_max_position_embeddings".into(), original.into());
                let yarn = [
                    ("beta_fast", "rope.scaling.yarn_beta_fast"),
                    ("beta_slow", "rope.scaling.yarn_beta_slow"),
                    ("attention_factor", "rope.scaling.yarn_attn_factor"),
                ];
                for (field, name) in yarn {
                    if let Some(value) = m.opt_positive_f64(&key(name))? {
                        rope.insert(field.into(), value.into());
                    }
                }
                // gpt-oss's published config keeps the ramp's ends as
                // computed, which the file does not record.
                rope.insert("truncate".into(), (arch != Architecture::GptOss).into());
                ("yarn", Some(f))
            }
            Some(other) => {
                return Err(m.invalid(
                    &type_key,
                    format!("rope scaling '{other}' is not supported (supported: none, linear, yarn, and llama.cpp's rope factor tensors)"),
                ))
            }
        };
        rope.insert("rope_type".into(), kind.into());
        if let Some(f) = factor {
            rope.insert("factor".into(), f.into());
        }
        Ok(Value::Object(rope))
    }

    /// The per-frequency rope factors in the tensor `name`, if the file has
    /// it: a vector, each factor checked where the config reader checks
    /// rope parameters.
    pub(crate) fn rope_factors(&self, name: &str) -> Result<Option<Vec<f64>>> {
        let (Some(info), Some(data)) = (self.tensor(name), self.tensor_data(name)) else {
            return Ok(None);
        };
        if info.dims.len() != 1 {
            return Err(GgufError::Tensor {
                path: self.path().into(),
                name: name.into(),
                reason: format!("rope factors are a vector, not {:?}", info.dims),
            });
        }
        let mut values = vec![0.0; info.elements()];
        crate::dequantize(info.ty, data, &mut values)?;
        Ok(Some(values.into_iter().map(f64::from).collect()))
    }
}
