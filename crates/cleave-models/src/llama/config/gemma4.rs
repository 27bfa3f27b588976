//! Gemma 4's fields of config.json, checked one by one: the full layers'
//! own heads, the layers that read an earlier layer's KV cache, the
//! per-layer inputs, and the MoE block beside the MLP.

use cleave_hf::{Result, Validator};

use super::raw::RawConfig;
use super::{AttentionType, Experts, HeadShape, LayerTypes, PerLayerInputs};

/// What Gemma 4 adds to a config, checked.
pub(super) struct Gemma4Fields {
    pub full_heads: Option<HeadShape>,
    pub first_kv_shared: usize,
    pub k_eq_v: bool,
    pub double_wide_mlp: bool,
    pub per_layer_inputs: Option<PerLayerInputs>,
    pub experts: Option<Experts>,
}

/// transformers' default head size of the full layers where neither
/// `per_layer_config` nor `global_head_dim` gives one.
const GLOBAL_HEAD_DIM: usize = 512;

pub(super) fn gemma4_fields(
    check: &Validator,
    raw: &RawConfig,
    types: &LayerTypes,
    layers: usize,
    sliding: HeadShape,
) -> Result<Gemma4Fields> {
    let double_wide_mlp = raw.use_double_wide_mlp.unwrap_or(false);
    if double_wide_mlp && raw.intermediate_size.is_some_and(|i| i.checked_mul(2).is_none()) {
        return Err(check.error(
            "use_double_wide_mlp",
            "the KV-shared layers' MLPs of twice intermediate_size are too wide",
        ));
    }
    let k_eq_v = raw.attention_k_eq_v.unwrap_or(false);
    let full = full_heads(check, raw, types, layers, sliding, k_eq_v)?;
    let shared = raw.num_kv_shared_layers.unwrap_or(0);
    if shared >= layers {
        return Err(check.error(
            "num_kv_shared_layers",
            format!("{shared} of {layers} layers leaves none to compute the keys and values"),
        ));
    }
    let first_kv_shared = layers - shared;
    // Each shared layer reads the last earlier layer of its type.
    for layer in first_kv_shared..layers {
        let kind = types.of(layer);
        if !(0..first_kv_shared).any(|l| types.of(l) == kind) {
            return Err(check.error(
                "num_kv_shared_layers",
                format!(
                    "layer {layer} shares the KV cache of an earlier {} layer, and the first {first_kv_shared} layers \
                     have none",
                    kind.name()
                ),
            ));
        }
    }
    let per_layer_inputs = match raw.hidden_size_per_layer_input.unwrap_or(0) {
        0 => None,
        width => {
            let field = "vocab_size_per_layer_input";
            let vocab = check.positive(raw.vocab_size_per_layer_input, field)?;
            if raw.vocab_size.is_some_and(|tokens| vocab < tokens) {
                return Err(check.error(
                    field,
                    format!("{vocab} rows leave some of the vocabulary's tokens without per-layer inputs"),
                ));
            }
            Some(PerLayerInputs { width, vocab })
        }
    };
    let experts = match raw.enable_moe_block.unwrap_or(false) {
        false => None,
        true => {
            let count = check.positive(raw.num_experts, "num_experts")?;
            let top_k = check.positive(raw.top_k_experts, "top_k_experts")?;
            if top_k > count {
                return Err(check.error("top_k_experts", format!("{top_k} is more than the {count} experts")));
            }
            Some(Experts {
                count,
                width: check.positive(raw.moe_intermediate_size, "moe_intermediate_size")?,
                top_k,
                renormalize: true,
            })
        }
    };
    Ok(Gemma4Fields {
        full_heads: full,
        first_kv_shared,
        k_eq_v,
        double_wide_mlp,
        per_layer_inputs,
        experts,
    })
}

/// The full layers' heads: `per_layer_config`'s entries (every full
/// layer's alike, no sliding layer's other than the sliding heads), else
/// `global_head_dim` and, where keys are values, `num_global_key_value_heads`.
/// `None` where they are the sliding layers'.
fn full_heads(
    check: &Validator,
    raw: &RawConfig,
    types: &LayerTypes,
    layers: usize,
    sliding: HeadShape,
    k_eq_v: bool,
) -> Result<Option<HeadShape>> {
    let field = "per_layer_config";
    let full = match &raw.per_layer_config {
        Some(entries) => {
            let mut full: Option<HeadShape> = None;
            for (key, entry) in entries {
                let layer = key
                    .parse::<usize>()
                    .ok()
                    .filter(|&l| l < layers)
                    .ok_or_else(|| check.error(field, format!("'{key}' is not a layer of the {layers}")))?;
                let shape = HeadShape {
                    head_dim: entry.head_dim.unwrap_or(sliding.head_dim),
                    kv_heads: entry.num_key_value_heads.unwrap_or(sliding.kv_heads),
                };
                match types.of(layer) {
                    AttentionType::Full if full.is_none_or(|f| f == shape) => full = Some(shape),
                    AttentionType::Full => {
                        return Err(
                            check.error(field, format!("layer {layer}'s heads differ from another full layer's"))
                        )
                    }
                    _ if shape == sliding => {}
                    _ => {
                        return Err(check.error(
                            field,
                            format!("layer {layer} is a sliding layer with heads of its own: not supported"),
                        ))
                    }
                }
            }
            let full = full.unwrap_or(sliding);
            // A full layer left out keeps the model's heads.
            let unlisted =
                (0..layers).find(|l| types.of(*l) == AttentionType::Full && !entries.contains_key(&l.to_string()));
            if let Some(layer) = unlisted.filter(|_| full != sliding) {
                return Err(check.error(
                    field,
                    format!("full layer {layer} is not listed, and the listed ones have heads of another size: not supported"),
                ));
            }
            full
        }
        None => HeadShape {
            head_dim: raw.global_head_dim.unwrap_or(GLOBAL_HEAD_DIM),
            kv_heads: match k_eq_v {
                true => raw.num_global_key_value_heads.unwrap_or(sliding.kv_heads),
                false => sliding.kv_heads,
            },
        },
    };
    let heads = raw.num_attention_heads.unwrap_or(0);
    if full.head_dim == 0 || !full.head_dim.is_multiple_of(2) {
        return Err(check.error(
            field,
            format!("a full layer's head_dim {} must be even and positive", full.head_dim),
        ));
    }
    if full.kv_heads == 0 || !heads.is_multiple_of(full.kv_heads) {
        return Err(check.error(
            field,
            format!(
                "a full layer's {} KV heads do not divide the {heads} heads",
                full.kv_heads
            ),
        ));
    }
    Ok((full != sliding).then_some(full))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::{AttentionType, HeadShape, ModelConfig};

    /// gemma4-tiny's config: 8 layers, full layers 5 and 7 with heads of
    /// 512, the last 2 reading earlier layers' caches; edited by `edit`.
    fn gemma4(edit: impl FnOnce(&mut serde_json::Value)) -> Result<ModelConfig, String> {
        let mut config = serde_json::json!({
            "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text",
            "hidden_size": 64, "intermediate_size": 128, "head_dim": 32,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 8,
            "vocab_size": 512, "vocab_size_per_layer_input": 512, "hidden_size_per_layer_input": 16,
            "max_position_embeddings": 256, "sliding_window": 8, "num_kv_shared_layers": 2,
            "hidden_activation": "gelu_pytorch_tanh",
            "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
                            "sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            "per_layer_config": {"5": {"head_dim": 512}, "7": {"head_dim": 512}},
            "rope_parameters": {
                "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
                "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}
            },
        });
        edit(&mut config);
        ModelConfig::from_value(Path::new("config.json"), config).map_err(|e| e.to_string())
    }

    #[test]
    fn shared_layers_read_the_last_earlier_layer_of_their_type() {
        let c = gemma4(|_| {}).unwrap();
        assert_eq!(
            (c.first_kv_shared, c.kv_source(6), c.kv_source(7), c.kv_source(5)),
            (6, 4, 5, 5)
        );
        assert!(c.shares_kv(6) && !c.shares_kv(4));
        let full = HeadShape {
            head_dim: 512,
            kv_heads: 2,
        };
        assert_eq!((c.heads_of(5), c.heads_of(7), c.heads_of(4).head_dim), (full, full, 32));
        assert_eq!(c.layer_types.of(7), AttentionType::Full);
        // The full layers' table pairs dimensions across the whole head, a
        // quarter of them turning.
        let tables = c.rope_tables();
        let turning = tables[0].0.iter().filter(|&&f| f != 0.0).count();
        assert_eq!((tables[0].0.len(), turning, tables[1].0.len()), (256, 64, 16));
    }

    #[test]
    fn the_kv_shared_layers_mlps_are_double_wide_where_the_config_says_so() {
        let wide = gemma4(|c| c["use_double_wide_mlp"] = true.into()).unwrap();
        assert_eq!(
            (wide.mlp_width(5), wide.mlp_width(6), wide.mlp_width(7)),
            (128, 256, 256)
        );
        let down = wide.dense_mlp_tensors(7).down;
        assert_eq!((down.rows, down.cols), (64, 256));
        assert_eq!(gemma4(|_| {}).unwrap().mlp_width(7), 128);
    }

    #[test]
    fn kv_sharing_and_heads_are_checked_by_field_and_layer() {
        let cases = [
            (
                "num_kv_shared_layers",
                serde_json::json!(8),
                "8 of 8 layers leaves none",
            ),
            (
                "num_kv_shared_layers",
                serde_json::json!(3),
                "layer 5 shares the KV cache of an earlier full_attention layer",
            ),
            (
                "per_layer_config",
                serde_json::json!({"5": {"head_dim": 512}}),
                "full layer 7 is not listed",
            ),
            (
                "vocab_size_per_layer_input",
                serde_json::json!(100),
                "100 rows leave some",
            ),
        ];
        for (field, value, reason) in cases {
            let err = gemma4(|c| c[field] = value).unwrap_err();
            assert!(err.contains(field) && err.contains(reason), "{err}");
        }
    }
}
