//! The config.json transformers writes for a GGUF file's model, from the
//! hyperparameters in its metadata (`<arch>.block_count` and friends), in
//! transformers 5's layout (rope settings in `rope_parameters`).

use serde_json::{json, Map, Value};

use crate::error::{GgufError, Result};
use crate::file::{Architecture, GgufFile};

/// llama.cpp stores Llama 3.1's frequency-dependent rope scaling as this
/// tensor of per-frequency factors, not as metadata.
const ROPE_FACTORS: &str = "rope_freqs.weight";

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
        let head_dim = m.opt_u64(&key("attention.key_length"))?.unwrap_or(hidden / heads);
        let vocab_size = match m.opt_u64(&key("vocab_size"))? {
            Some(n) => n,
            None => m.strings("tokenizer.ggml.tokens")?.len() as u64,
        };
        let rms_key = key("attention.layer_norm_rms_epsilon");
        let rms_norm_eps = m.required(&rms_key, m.opt_positive_f64(&rms_key)?)?;

        let architecture = match arch {
            Architecture::Llama => "LlamaForCausalLM",
            Architecture::Qwen2 => "Qwen2ForCausalLM",
        };
        let required = [
            ("architectures", json!([architecture])),
            ("model_type", prefix.into()),
            ("vocab_size", vocab_size.into()),
            ("hidden_size", hidden.into()),
            ("intermediate_size", m.u64(&key("feed_forward_length"))?.into()),
            ("num_hidden_layers", m.u64(&key("block_count"))?.into()),
            ("num_attention_heads", heads.into()),
            (
                "num_key_value_heads",
                m.opt_u64(&key("attention.head_count_kv"))?.unwrap_or(heads).into(),
            ),
            ("head_dim", head_dim.into()),
            ("hidden_act", "silu".into()),
            ("rms_norm_eps", rms_norm_eps.into()),
            ("max_position_embeddings", m.u64(&key("context_length"))?.into()),
            ("rope_parameters", self.rope_parameters(arch)?),
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
            (
                "sliding_window",
                m.opt_u64(&key("attention.sliding_window"))?.map(Value::from),
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
            .filter_map(|(name, value)| Some((name.to_string(), value?)))
            .collect();
        Ok(Value::Object(fields))
    }

    /// `rope_parameters`: theta from `rope.freq_base`, scaling from
    /// `rope.scaling.type` and `rope.scaling.factor` (or the older
    /// `rope.scale_linear`).
    fn rope_parameters(&self, arch: Architecture) -> Result<Value> {
        let m = self.metadata();
        let key = |name: &str| format!("{}.{name}", arch.key_prefix());
        let mut rope = Map::new();
        let theta = m.opt_positive_f64(&key("rope.freq_base"))?.unwrap_or(10_000.0);
        rope.insert("rope_theta".into(), theta.into());
        if self.tensor(ROPE_FACTORS).is_some() {
            return Err(GgufError::Tensor {
                path: self.path().into(),
                name: ROPE_FACTORS.into(),
                reason: "per-frequency rope factors (Llama 3.1's scaling) are not supported".into(),
            });
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
            Some(other) => {
                return Err(m.invalid(
                    &type_key,
                    format!("rope scaling '{other}' is not supported (supported: none, linear)"),
                ))
            }
        };
        rope.insert("rope_type".into(), kind.into());
        if let Some(f) = factor {
            rope.insert("factor".into(), f.into());
        }
        Ok(Value::Object(rope))
    }
}
