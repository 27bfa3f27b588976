//! Gemma 4's fields of config.json, from what llama.cpp's converter writes:
//! the full layers' heads (`key_length` beside the sliding layers'
//! `key_length_swa`, and per-layer KV head counts), their proportional
//! rope (as a tensor of frequency factors), the layers that share an
//! earlier layer's KV cache, the per-layer inputs and the experts beside
//! the MLP.

use serde_json::{json, Map, Value};

use super::{Fields, Shapes};
use crate::error::Result;
use crate::file::{Architecture, GgufFile};

/// The full layers' rope: each frequency of the head's first
/// `partial_rotary_factor` turns with factor 1, the others are held still
/// by a factor this large (llama.cpp's converter writes 1e30).
const FREQUENCIES: &str = "rope_freqs.weight";
const HELD_STILL: f64 = 1e29;

impl GgufFile {
    pub(super) fn gemma4_fields(&self, shapes: &Shapes) -> Result<Fields> {
        let m = self.metadata();
        let key = |name: &str| format!("gemma4.{name}");
        let layers = shapes.layers;
        let window = m.opt_u64(&key("attention.sliding_window"))?.filter(|&w| w > 0);
        let types = self.layer_types(Architecture::Gemma4, layers, window.is_some())?;
        let full = |layer: usize| types[layer] == "full_attention";
        let shared_key = key("attention.shared_kv_layers");
        let shared = m.opt_u64(&shared_key)?.unwrap_or(0);
        let first_shared = layers
            .checked_sub(shared)
            .ok_or_else(|| m.invalid(&shared_key, format!("{shared} of {layers} layers")))?
            as usize;

        // Every full layer's heads and any sliding layer's that differ from
        // the first sliding layer's; the config check refuses what differs
        // within a type.
        let full_head_dim = m.u64(&key("attention.key_length"))?;
        let sliding_kv = shapes
            .kv_heads
            .at((0..layers as usize).find(|&l| !full(l)).unwrap_or(0));
        let mut per_layer = Map::new();
        for layer in 0..layers as usize {
            let kv_heads = shapes.kv_heads.at(layer);
            if full(layer) {
                per_layer.insert(
                    layer.to_string(),
                    json!({"head_dim": full_head_dim, "num_key_value_heads": kv_heads}),
                );
            } else if kv_heads != sliding_kv {
                per_layer.insert(layer.to_string(), json!({"num_key_value_heads": kv_heads}));
            }
        }

        // Keys are values in a full layer that computes keys without
        // values.
        let k_eq_v = (0..first_shared).find(|&l| full(l)).is_some_and(|l| {
            self.tensor(&format!("blk.{l}.attn_k.weight")).is_some()
                && self.tensor(&format!("blk.{l}.attn_v.weight")).is_none()
        });

        // The shared layers' MLPs twice as wide, as the converter writes
        // `use_double_wide_mlp`.
        let width = shapes.widths.at(0);
        let double_wide = shapes.widths.uniform().is_none();
        let doubled = |l: usize| match l < first_shared {
            true => Some(width),
            false => width.checked_mul(2),
        };
        if double_wide && !(0..layers as usize).all(|l| Some(shapes.widths.at(l)) == doubled(l)) {
            return Err(m.invalid(
                &key("feed_forward_length"),
                "layers of other widths than the KV-shared layers' double width are not supported",
            ));
        }

        let per_layer_width = m.opt_u64(&key("embedding_length_per_layer_input"))?.unwrap_or(0);
        let per_layer_vocab = self
            .tensor("per_layer_token_embd.weight")
            .and_then(|t| t.dims.get(1).copied())
            .map(|rows| rows as u64);
        let experts = m.opt_u64(&key("expert_count"))?.unwrap_or(0);
        let moe = |name: &str| -> Result<Option<Value>> {
            Ok(match experts {
                0 => None,
                _ => Some(m.u64(&key(name))?.into()),
            })
        };
        let softcap = m.opt_positive_f64(&key("final_logit_softcapping"))?;
        Ok(vec![
            ("hidden_activation", Some("gelu_pytorch_tanh".into())),
            ("sliding_window", window.map(Value::from)),
            ("layer_types", Some(types)),
            ("num_key_value_heads", Some(sliding_kv.into())),
            ("per_layer_config", Some(Value::Object(per_layer))),
            ("attention_k_eq_v", Some(k_eq_v.into())),
            ("num_kv_shared_layers", Some(shared.into())),
            ("use_double_wide_mlp", Some(double_wide.into())),
            ("hidden_size_per_layer_input", Some(per_layer_width.into())),
            ("vocab_size_per_layer_input", per_layer_vocab.map(Value::from)),
            ("enable_moe_block", Some((experts > 0).into())),
            ("num_experts", (experts > 0).then(|| experts.into())),
            ("top_k_experts", moe("expert_used_count")?),
            ("moe_intermediate_size", moe("expert_feed_forward_length")?),
            ("final_logit_softcapping", softcap.map(Value::from)),
        ])
    }

    /// `rope_parameters` per layer type: the sliding layers' default rope
    /// (`rope.freq_base_swa`), the full layers' proportional one
    /// (`rope.freq_base`), whose rotated share `rope_freqs` gives: its
    /// leading factors of 1, the rest held still.
    pub(super) fn gemma4_rope_parameters(&self) -> Result<Value> {
        let m = self.metadata();
        let key = |name: &str| format!("gemma4.{name}");
        let full_key = key("attention.key_length");
        let full_head_dim = m.u64(&full_key)?;
        if full_head_dim == 0 || full_head_dim % 2 != 0 {
            return Err(m.invalid(&full_key, format!("{full_head_dim} is not a positive even head size")));
        }
        let sliding_head_dim = m.u64(&key("attention.key_length_swa"))?;
        let sliding_rotary = m.opt_u64(&key("rope.dimension_count_swa"))?.unwrap_or(sliding_head_dim);
        if sliding_rotary != sliding_head_dim {
            return Err(m.invalid(
                &key("rope.dimension_count_swa"),
                format!("{sliding_rotary} of the sliding layers' {sliding_head_dim} dimensions rotated: not supported"),
            ));
        }
        let rotated = match self.rope_factors(FREQUENCIES)? {
            Some(factors) => {
                let turning = factors.iter().take_while(|&&f| f == 1.0).count();
                let shape_ok = factors.len() as u64 * 2 == full_head_dim;
                if !shape_ok || !factors[turning..].iter().all(|&f| f >= HELD_STILL) {
                    return Err(crate::GgufError::Tensor {
                        path: self.path().into(),
                        name: FREQUENCIES.into(),
                        reason: format!(
                            "the full layers' {} factors for heads of {full_head_dim} are not 1s then 1e30s \
                             (a proportional rope)",
                            factors.len()
                        ),
                    });
                }
                turning as u64 * 2
            }
            None => m.opt_u64(&key("rope.dimension_count"))?.unwrap_or(full_head_dim),
        };
        let theta = |name| -> Result<f64> { Ok(m.opt_positive_f64(&key(name))?.unwrap_or(10_000.0)) };
        Ok(json!({
            "full_attention": {
                "rope_type": "proportional",
                "rope_theta": theta("rope.freq_base")?,
                "partial_rotary_factor": rotated as f64 / full_head_dim as f64,
            },
            "sliding_attention": {"rope_type": "default", "rope_theta": theta("rope.freq_base_swa")?},
        }))
    }
}
