//! CLIP's text encoder (`CLIPTextModel`), FLUX.1's first text encoder:
//! token + position embeddings, pre-LayerNorm blocks of causal attention
//! and a quick-GELU (or GELU) MLP, a final LayerNorm; the pooled output is
//! the final state at the first end-of-text token.
//!
//! Weights are looked up by their Hugging Face names, with or without the
//! `text_model.` prefix that every published checkpoint carries.

use std::path::Path;

use cleave_hf::{read_json, Checkpoint, Validator};
use cleave_nn::{check_ids, Bias, LayerNorm, Linear, Loader, Matrix, PerDevice, Placed, Placement, Result, Weights};
use cleave_plan::Plan;
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{activate, add_assign, attention, Activation, AttentionShape, KeyRanges, Tensor};
use serde::Deserialize;

#[derive(Deserialize)]
struct RawClipConfig {
    hidden_size: Option<usize>,
    num_attention_heads: Option<usize>,
    num_hidden_layers: Option<usize>,
    intermediate_size: Option<usize>,
    vocab_size: Option<usize>,
    max_position_embeddings: Option<usize>,
    layer_norm_eps: Option<f64>,
    hidden_act: Option<String>,
    eos_token_id: Option<i64>,
}

/// The MLP's activation (`hidden_act`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClipActivation {
    /// `x · sigmoid(1.702 x)`
    QuickGelu,
    /// GELU with the exact erf.
    Gelu,
}

/// A validated CLIP text config.
#[derive(Clone, Debug)]
pub struct ClipConfig {
    pub hidden_size: usize,
    pub heads: usize,
    pub layers: usize,
    pub intermediate_size: usize,
    pub vocab_size: usize,
    pub max_positions: usize,
    pub layer_norm_eps: f32,
    pub activation: ClipActivation,
    /// Picks the pooled position ([`clip_pooled_index`]).
    pub eos_token_id: i64,
}

impl ClipConfig {
    pub fn from_file(path: &Path) -> cleave_hf::Result<Self> {
        let raw: RawClipConfig = read_json(path)?;
        let check = Validator { path };
        let positive = |value: Option<usize>, field: &'static str| check.positive(value, field);
        // transformers' CLIPTextConfig defaults: quick_gelu, 1e-5, 49407.
        let activation = match check.supported(
            "hidden_act",
            raw.hidden_act.as_deref().unwrap_or("quick_gelu"),
            &["quick_gelu", "gelu"],
        )? {
            "gelu" => ClipActivation::Gelu,
            _ => ClipActivation::QuickGelu,
        };
        let hidden_size = positive(raw.hidden_size, "hidden_size")?;
        let heads = positive(raw.num_attention_heads, "num_attention_heads")?;
        check.divides("num_attention_heads", heads, "hidden_size", hidden_size)?;
        Ok(ClipConfig {
            hidden_size,
            heads,
            layers: positive(raw.num_hidden_layers, "num_hidden_layers")?,
            intermediate_size: positive(raw.intermediate_size, "intermediate_size")?,
            vocab_size: positive(raw.vocab_size, "vocab_size")?,
            max_positions: positive(raw.max_position_embeddings, "max_position_embeddings")?,
            layer_norm_eps: raw.layer_norm_eps.unwrap_or(1e-5) as f32,
            activation,
            eos_token_id: raw.eos_token_id.unwrap_or(49407),
        })
    }

    /// What the planner needs to place the `te` module: the embeddings at
    /// the head, the final norm at the tail, split by layers; the
    /// checkpoint's own tensors as the loader puts them on a device.
    pub fn inventory(&self, checkpoint: &Checkpoint) -> cleave_plan::Inventory {
        let (h, i, n) = (self.hidden_size, self.intermediate_size, self.max_positions);
        let root = if checkpoint.contains("text_model.embeddings.token_embedding.weight") {
            "text_model."
        } else {
            ""
        };
        let bytes = |name: &str| checkpoint.device_bytes(&format!("{root}{name}"));
        // One sequence: hidden, residual, q/k/v, context and the MLP
        // (attention writes no scores).
        let compute = n * (6 * h + i);
        cleave_plan::Inventory {
            module: "te".into(),
            head_bytes: bytes("embeddings"),
            block_bytes: (0..self.layers)
                .map(|l| bytes(&format!("encoder.layers.{l}")))
                .collect(),
            tail_bytes: bytes("final_layer_norm"),
            tail_shared_with_head: 0,
            cache_bytes: Vec::new(),
            compute_bytes: (compute * size_of::<f32>()) as u64,
            geometry: None,
        }
    }
}

/// The encoder's outputs for one sequence.
#[derive(Clone, Debug)]
pub struct ClipOutput {
    /// `[len, hidden]`, after the final LayerNorm.
    pub last_hidden_state: Vec<f32>,
    /// `[hidden]`: the row of `last_hidden_state` at the pooled position.
    pub pooled: Vec<f32>,
}

struct ClipLayer {
    layer_norm1: LayerNorm,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    out_proj: Linear,
    layer_norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

/// A CLIP text encoder on a device group, split by layers as its plan says.
pub struct Clip<R: Runtime> {
    placement: Placement<R>,
    config: ClipConfig,
    token_embedding: Matrix,
    position_embedding: Matrix,
    layers: Vec<ClipLayer>,
    final_layer_norm: LayerNorm,
}

cleave_nn::placed_model!(Clip);

impl<R: Runtime> Clip<R> {
    pub fn load(
        devices: Vec<Placed<R>>,
        plan: Plan,
        config: &ClipConfig,
        checkpoint: &Checkpoint,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Self> {
        let c = config;
        let h = c.hidden_size;
        let loader = Loader::new(&devices, checkpoint, progress);
        let root = loader
            .weights(plan.head_device())
            .pp_if_stored("text_model", "embeddings.token_embedding.weight");
        let e = root.pp("embeddings");
        let token_embedding = e.matrix("token_embedding.weight", c.vocab_size, h)?;
        let position_embedding = e.matrix("position_embedding.weight", c.max_positions, h)?;
        let layers = (0..c.layers)
            .map(|l| ClipLayer::load(root.pp("encoder.layers").pp(l).on(plan.device_of_block(l)), c))
            .collect::<Result<Vec<_>>>()?;
        let final_layer_norm =
            LayerNorm::load(root.pp("final_layer_norm").on(plan.tail_device()), h, c.layer_norm_eps)?;
        Ok(Clip {
            placement: Placement::new(devices, plan),
            config: c.clone(),
            token_embedding,
            position_embedding,
            layers,
            final_layer_norm,
        })
    }

    /// One sequence of ids (FLUX pads them to `max_positions`): the last
    /// hidden state and the pooled vector, as `CLIPTextModel` returns them
    /// without an attention mask (the pipeline passes none).
    pub fn forward(&self, ids: &[u32]) -> Result<ClipOutput> {
        let c = &self.config;
        let (placement, plan) = (&self.placement, self.placement.plan());
        check_ids(ids, c.vocab_size, c.max_positions)?;
        let positions: Vec<u32> = (0..ids.len() as u32).collect();
        // Causal: row s sees rows 0..=s.
        let causal: Vec<(u32, u32)> = (0..ids.len()).map(|s| KeyRanges::causal(s, 0)).collect();

        let client = placement.client(plan.head_device());
        let hidden = self.token_embedding.gather(client, ids)?;
        add_assign(client, &hidden, &self.position_embedding.gather(client, &positions)?)?;
        let ranges = PerDevice::new(placement, |device| {
            Ok(KeyRanges::new(placement.client(device), &causal))
        });
        let (hidden, mut here) = placement.run_blocks(hidden, self.layers.len(), |l, device, hidden| {
            self.layers[l].forward(placement.client(device), c, &hidden, ranges.get(device)?)
        })?;
        let hidden = placement.hand_over(hidden, &mut here, plan.tail_device());
        let client = placement.client(here);
        let last_hidden_state = self.final_layer_norm.forward(client, &hidden)?.to_vec(client)?;
        let wide: Vec<i64> = ids.iter().map(|&id| i64::from(id)).collect();
        let at = clip_pooled_index(&wide, c.eos_token_id);
        let pooled = last_hidden_state[at * c.hidden_size..][..c.hidden_size].to_vec();
        Ok(ClipOutput {
            last_hidden_state,
            pooled,
        })
    }
}

impl ClipLayer {
    fn load<R: Runtime>(w: Weights<R>, c: &ClipConfig) -> Result<Self> {
        let (h, i, eps) = (c.hidden_size, c.intermediate_size, c.layer_norm_eps);
        let attn = w.pp("self_attn");
        Ok(ClipLayer {
            layer_norm1: LayerNorm::load(w.pp("layer_norm1"), h, eps)?,
            q_proj: attn.linear("q_proj", h, h, Bias::Yes)?,
            k_proj: attn.linear("k_proj", h, h, Bias::Yes)?,
            v_proj: attn.linear("v_proj", h, h, Bias::Yes)?,
            out_proj: attn.linear("out_proj", h, h, Bias::Yes)?,
            layer_norm2: LayerNorm::load(w.pp("layer_norm2"), h, eps)?,
            fc1: w.linear("mlp.fc1", i, h, Bias::Yes)?,
            fc2: w.linear("mlp.fc2", h, i, Bias::Yes)?,
        })
    }

    fn forward<R: Runtime>(
        &self,
        client: &ComputeClient<R>,
        c: &ClipConfig,
        x: &Tensor,
        ranges: &KeyRanges,
    ) -> Result<Tensor> {
        let normed = self.layer_norm1.forward(client, x)?;
        let q = self.q_proj.forward(client, &normed)?;
        let k = self.k_proj.forward(client, &normed)?;
        let v = self.v_proj.forward(client, &normed)?;
        let shape = AttentionShape::new(c.heads, c.heads, c.hidden_size / c.heads);
        let context = attention(client, &q, &k, &v, shape, ranges, None)?;
        let attended = self.out_proj.forward(client, &context)?;
        add_assign(client, &attended, x)?;
        let x = attended;
        let inner = self.fc1.forward(client, &self.layer_norm2.forward(client, &x)?)?;
        match c.activation {
            ClipActivation::QuickGelu => activate(client, &inner, Activation::QuickGelu)?,
            ClipActivation::Gelu => activate(client, &inner, Activation::Gelu)?,
        }
        let out = self.fc2.forward(client, &inner)?;
        add_assign(client, &out, &x)?;
        Ok(out)
    }
}

/// Position whose hidden state `CLIPTextModel` returns as `pooler_output` (FLUX's pooled prompt
/// embedding). transformers keeps two rules: configs with the original `eos_token_id == 2` take the
/// position of the largest id (`argmax`; EOS has the highest id in OpenAI's vocabulary), others the
/// first position holding `eos_token_id`. Both pick the first match; with no EOS at all the second
/// rule's `argmax` over a zero mask yields 0, which is reproduced.
pub fn clip_pooled_index(ids: &[i64], eos_token_id: i64) -> usize {
    const LEGACY_EOS_TOKEN_ID: i64 = 2;
    if eos_token_id == LEGACY_EOS_TOKEN_ID {
        let max = ids.iter().copied().max();
        ids.iter().position(|&id| Some(id) == max).unwrap_or(0)
    } else {
        ids.iter().position(|&id| id == eos_token_id).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::clip_pooled_index;

    #[test]
    fn legacy_rule_takes_first_largest_id() {
        assert_eq!(clip_pooled_index(&[49406, 320, 49407, 49407], 2), 2);
        assert_eq!(clip_pooled_index(&[], 2), 0);
    }

    #[test]
    fn eos_rule_takes_first_eos_or_zero() {
        assert_eq!(clip_pooled_index(&[1022, 5, 1023, 1023], 1023), 2);
        assert_eq!(clip_pooled_index(&[1022, 5, 6], 1023), 0);
    }
}
