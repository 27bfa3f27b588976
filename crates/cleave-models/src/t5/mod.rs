//! T5's encoder (`T5EncoderModel`), FLUX.1's second text encoder: token
//! embeddings (tied to `shared`), then blocks of [RMS norm → unscaled
//! self-attention plus a relative position bias → residual → RMS norm →
//! gated-GELU FFN → residual], and a final RMS norm.
//!
//! The position bias `[heads, q, k]` comes from block 0's
//! `relative_attention_bias` table, indexed by the bucket of `k - q`; it is
//! computed on the host once per forward pass and shared by every block.

use std::path::Path;

use cleave_hf::{read_json, Checkpoint, Validator};
use cleave_nn::{check_ids, Bias, Linear, Loader, Matrix, ModelError, PerDevice, Placed, Placement, Result, Weights};
use cleave_plan::Plan;
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{add_assign, attention, gelu_tanh_mul, rms_norm, AttentionShape, KeyRanges, Tensor};
use serde::Deserialize;

#[derive(Deserialize)]
struct RawT5Config {
    d_model: Option<usize>,
    d_kv: Option<usize>,
    d_ff: Option<usize>,
    num_heads: Option<usize>,
    num_layers: Option<usize>,
    vocab_size: Option<usize>,
    relative_attention_num_buckets: Option<usize>,
    relative_attention_max_distance: Option<usize>,
    layer_norm_epsilon: Option<f64>,
    feed_forward_proj: Option<String>,
}

/// A validated T5 encoder config.
#[derive(Clone, Debug)]
pub struct T5Config {
    pub d_model: usize,
    pub d_kv: usize,
    pub d_ff: usize,
    pub heads: usize,
    pub layers: usize,
    pub vocab_size: usize,
    pub num_buckets: usize,
    pub max_distance: usize,
    pub layer_norm_eps: f32,
}

impl T5Config {
    pub fn from_file(path: &Path) -> cleave_hf::Result<Self> {
        let raw: RawT5Config = read_json(path)?;
        let check = Validator { path };
        let error = |field: &'static str, reason: String| check.error(field, reason);
        let positive = |value: Option<usize>, field: &'static str| check.positive(value, field);
        // transformers' T5Config defaults "relu" (T5 v1.0); FLUX's T5 v1.1
        // is "gated-gelu", whose activation transformers sets to gelu_new.
        let ffn = check.required(raw.feed_forward_proj.as_deref(), "feed_forward_proj")?;
        check.supported("feed_forward_proj", ffn, &["gated-gelu"])?;
        let num_buckets = positive(
            raw.relative_attention_num_buckets.or(Some(32)),
            "relative_attention_num_buckets",
        )?;
        if num_buckets < 4 {
            return Err(error(
                "relative_attention_num_buckets",
                format!("{num_buckets} is too few (at least 4: two directions of exact and log buckets)"),
            ));
        }
        Ok(T5Config {
            d_model: positive(raw.d_model, "d_model")?,
            d_kv: positive(raw.d_kv, "d_kv")?,
            d_ff: positive(raw.d_ff, "d_ff")?,
            heads: positive(raw.num_heads, "num_heads")?,
            layers: positive(raw.num_layers, "num_layers")?,
            vocab_size: positive(raw.vocab_size, "vocab_size")?,
            num_buckets,
            max_distance: positive(
                raw.relative_attention_max_distance.or(Some(128)),
                "relative_attention_max_distance",
            )?,
            layer_norm_eps: raw.layer_norm_epsilon.unwrap_or(1e-6) as f32,
        })
    }

    fn inner(&self) -> usize {
        self.heads * self.d_kv
    }

    /// What the planner needs to place the `te2` module for sequences of
    /// up to `tokens` tokens: the embeddings at the head, the final norm
    /// at the tail, split by layers; the checkpoint's own tensors as the
    /// loader puts them on a device (the position bias table stays on the
    /// host).
    pub fn inventory(&self, checkpoint: &Checkpoint, tokens: usize) -> cleave_plan::Inventory {
        let (d, inner, ff) = (self.d_model, self.inner(), self.d_ff);
        let embed = checkpoint.matrix_bytes(embed_name(checkpoint), self.vocab_size, d);
        let host = checkpoint.device_bytes(RELATIVE_ATTENTION_BIAS);
        let blocks = (0..self.layers)
            .map(|l| checkpoint.device_bytes(&format!("encoder.block.{l}")))
            .enumerate()
            .map(|(l, bytes)| if l == 0 { bytes.saturating_sub(host) } else { bytes })
            .collect();
        // Hidden, normed, q/k/v, context, the FFN's three and the position
        // bias (attention writes no scores).
        let compute = tokens * (3 * d + 4 * inner + 3 * ff) + self.heads * tokens * tokens;
        cleave_plan::Inventory {
            module: "te2".into(),
            head_bytes: embed,
            block_bytes: blocks,
            tail_bytes: checkpoint.device_bytes("encoder.final_layer_norm"),
            tail_shared_with_head: 0,
            cache_bytes: Vec::new(),
            compute_bytes: (compute * size_of::<f32>()) as u64,
            geometry: None,
        }
    }
}

/// Block 0's relative position bias table, `[num_buckets, heads]`.
const RELATIVE_ATTENTION_BIAS: &str = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight";

/// The encoder's embeddings: tied to `shared`, often the only copy stored.
fn embed_name(checkpoint: &Checkpoint) -> &'static str {
    if checkpoint.contains("encoder.embed_tokens.weight") {
        "encoder.embed_tokens.weight"
    } else {
        "shared.weight"
    }
}

/// The bucket of a relative position `key - query`, exactly as
/// transformers' `T5Attention._relative_position_bucket` (bidirectional):
/// half the buckets per direction, the first half of those exact, the rest
/// logarithmic up to `max_distance`. The logarithm is taken in f32, as
/// torch does on float32 tensors, so boundary cases round the same way.
pub fn relative_position_bucket(relative_position: i64, num_buckets: usize, max_distance: usize) -> usize {
    let num_buckets = num_buckets / 2;
    let mut bucket = if relative_position > 0 { num_buckets } else { 0 };
    let distance = relative_position.unsigned_abs() as usize;
    let max_exact = num_buckets / 2;
    if distance < max_exact {
        bucket += distance;
    } else {
        let log_ratio = (distance as f32 / max_exact as f32).ln();
        let scale = (max_distance as f64 / max_exact as f64).ln() as f32;
        let large = max_exact + (log_ratio / scale * (num_buckets - max_exact) as f32) as usize;
        bucket += large.min(num_buckets - 1);
    }
    bucket
}

/// The position bias `[heads, len, len]` for a sequence of `len` tokens
/// from the table `[num_buckets, heads]`.
fn position_bias(table: &[f32], c: &T5Config, len: usize) -> Vec<f32> {
    let mut bias = vec![0.0; c.heads * len * len];
    for q in 0..len {
        for k in 0..len {
            let bucket = relative_position_bucket(k as i64 - q as i64, c.num_buckets, c.max_distance);
            for h in 0..c.heads {
                bias[(h * len + q) * len + k] = table[bucket * c.heads + h];
            }
        }
    }
    bias
}

struct T5Block {
    attention_norm: Tensor,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ffn_norm: Tensor,
    wi_0: Linear,
    wi_1: Linear,
    wo: Linear,
}

/// A T5 encoder on a device group, split by layers as its plan says.
pub struct T5Encoder<R: Runtime> {
    placement: Placement<R>,
    config: T5Config,
    embed_tokens: Matrix,
    /// Block 0's `relative_attention_bias`, `[num_buckets, heads]`, on the host.
    relative_attention_bias: Vec<f32>,
    blocks: Vec<T5Block>,
    final_layer_norm: Tensor,
}

cleave_nn::placed_model!(T5Encoder);

impl<R: Runtime> T5Encoder<R> {
    pub fn load(
        devices: Vec<Placed<R>>,
        plan: Plan,
        config: &T5Config,
        checkpoint: &Checkpoint,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Self> {
        let c = config;
        let d = c.d_model;
        let bias_name = RELATIVE_ATTENTION_BIAS;
        let relative_attention_bias = checkpoint
            .tensor(bias_name, &[c.num_buckets, c.heads])?
            .to_f32_vec()
            .ok_or_else(|| ModelError::Input(format!("{bias_name}: a quantized table, where floats were expected")))?;
        let loader = Loader::new(&devices, checkpoint, progress);
        let embed_tokens = loader
            .weights(plan.head_device())
            .matrix(embed_name(checkpoint), c.vocab_size, d)?;
        let encoder = loader.weights(plan.head_device()).pp("encoder");
        let blocks = (0..c.layers)
            .map(|l| T5Block::load(encoder.pp("block").pp(l).on(plan.device_of_block(l)), c))
            .collect::<Result<Vec<_>>>()?;
        let final_layer_norm = encoder.on(plan.tail_device()).vector("final_layer_norm.weight", d)?;
        Ok(T5Encoder {
            placement: Placement::new(devices, plan),
            config: c.clone(),
            embed_tokens,
            relative_attention_bias,
            blocks,
            final_layer_norm,
        })
    }

    /// The last hidden state `[len, d_model]` of one sequence, every row
    /// seeing every position, pads included: FLUX passes no attention mask.
    pub fn forward(&self, ids: &[u32]) -> Result<Vec<f32>> {
        let c = &self.config;
        let (placement, plan) = (&self.placement, self.placement.plan());
        // T5 has no position limit of its own: the bias buckets cover any length.
        check_ids(ids, c.vocab_size, usize::MAX)?;
        let len = ids.len();
        let everything = vec![(0, len as u32); len];
        let bias = position_bias(&self.relative_attention_bias, c, len);

        let hidden = self.embed_tokens.gather(placement.client(plan.head_device()), ids)?;
        let on_device = PerDevice::new(placement, |device| {
            let client = placement.client(device);
            Ok((
                KeyRanges::new(client, &everything),
                Tensor::from_f32(client, &bias, &[c.heads, len, len]),
            ))
        });
        let (hidden, mut here) = placement.run_blocks(hidden, self.blocks.len(), |l, device, hidden| {
            let (ranges, bias) = on_device.get(device)?;
            self.blocks[l].forward(placement.client(device), c, &hidden, ranges, bias)
        })?;
        let hidden = placement.hand_over(hidden, &mut here, plan.tail_device());
        let client = placement.client(here);
        Ok(rms_norm(client, &hidden, &self.final_layer_norm, c.layer_norm_eps)?.to_vec(client)?)
    }
}

impl T5Block {
    /// `encoder.block.N`'s weights: layer 0 attention, layer 1 the FFN.
    fn load<R: Runtime>(w: Weights<R>, c: &T5Config) -> Result<Self> {
        let (d, inner, ff) = (c.d_model, c.inner(), c.d_ff);
        let (attn, ffn) = (w.pp("layer.0"), w.pp("layer.1"));
        let (sa, dense) = (attn.pp("SelfAttention"), ffn.pp("DenseReluDense"));
        Ok(T5Block {
            attention_norm: attn.vector("layer_norm.weight", d)?,
            q: sa.linear("q", inner, d, Bias::No)?,
            k: sa.linear("k", inner, d, Bias::No)?,
            v: sa.linear("v", inner, d, Bias::No)?,
            o: sa.linear("o", d, inner, Bias::No)?,
            ffn_norm: ffn.vector("layer_norm.weight", d)?,
            wi_0: dense.linear("wi_0", ff, d, Bias::No)?,
            wi_1: dense.linear("wi_1", ff, d, Bias::No)?,
            wo: dense.linear("wo", d, ff, Bias::No)?,
        })
    }

    fn forward<R: Runtime>(
        &self,
        client: &ComputeClient<R>,
        c: &T5Config,
        x: &Tensor,
        ranges: &KeyRanges,
        bias: &Tensor,
    ) -> Result<Tensor> {
        let normed = rms_norm(client, x, &self.attention_norm, c.layer_norm_eps)?;
        let q = self.q.forward(client, &normed)?;
        let k = self.k.forward(client, &normed)?;
        let v = self.v.forward(client, &normed)?;
        // T5 folds the 1/sqrt(d) into its initialisation: scores are unscaled.
        let shape = AttentionShape {
            heads: c.heads,
            kv_heads: c.heads,
            head_dim: c.d_kv,
            scale: 1.0,
            softcap: None,
            half: None,
        };
        let context = attention(client, &q, &k, &v, shape, ranges, Some(bias))?;
        let attended = self.o.forward(client, &context)?;
        add_assign(client, &attended, x)?;
        let x = attended;
        let normed = rms_norm(client, &x, &self.ffn_norm, c.layer_norm_eps)?;
        let gated = gelu_tanh_mul(
            client,
            &self.wi_0.forward(client, &normed)?,
            &self.wi_1.forward(client, &normed)?,
        )?;
        let out = self.wo.forward(client, &gated)?;
        add_assign(client, &out, &x)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::relative_position_bucket;

    /// Buckets worked out by hand from transformers' formula with 32
    /// buckets and max distance 128: 16 per direction (keys after the
    /// query get +16), distances 0..8 exact, then 8 + floor(ln(n/8) /
    /// ln(16) · 8), at most 15.
    #[test]
    fn buckets_match_the_formula() {
        let bucket = |rp| relative_position_bucket(rp, 32, 128);
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(-1), 1);
        assert_eq!(bucket(1), 17);
        assert_eq!(bucket(-7), 7);
        assert_eq!(bucket(7), 23);
        // ln(1) = 0: the first log bucket.
        assert_eq!(bucket(-8), 8);
        // ln(11/8)/ln(16)·8 = 0.92 → 8; ln(12/8)/ln(16)·8 = 1.17 → 9.
        assert_eq!(bucket(-11), 8);
        assert_eq!(bucket(-12), 9);
        // ln(2)/ln(16)·8 = 2 exactly (in f32 as in reals): 10, not 9.
        assert_eq!(bucket(-16), 10);
        assert_eq!(bucket(16), 26);
        // ln(4)/ln(16)·8 = 4.
        assert_eq!(bucket(-32), 12);
        // ln(16)/ln(16)·8 = 8 → 16, capped at 15; farther stays there.
        assert_eq!(bucket(-128), 15);
        assert_eq!(bucket(-1000), 15);
        assert_eq!(bucket(1000), 31);
    }
}
