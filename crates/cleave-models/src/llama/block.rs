//! The block every rotary decoder runs: pre-norm grouped-query attention
//! with its KV cache (or, in a hybrid model's linear layers, a Gated
//! DeltaNet with its recurrent state), then a gated MLP or a mixture of
//! experts, each a [`Sharded`] sublayer that carries the split (one shard
//! in layer split, projections sliced by rows in row split, heads and MLP
//! columns per device in tensor split).

use cleave_nn::{
    DeviceRows, Input, KvCache, ModelError, PassRows, Placement, Proj, RecurrentState, Result, Sharded, Store,
};
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{
    add_assign, attention_cached, columns_of, gated_mul, rms_norm, scale_shift, split_qkv, Activation, AttentionShape,
    CacheWrite, HeadNorms, RopeTable, Tensor, Weight,
};

use super::config::{AttentionType, ModelConfig};
use super::delta_net::GatedDeltaNet;
use super::moe::{ExpertFetch, Ffn};

/// Some heads of a block's attention, on one device: all of them, or in
/// tensor split a device's share.
pub(super) struct Attention {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// The device of the earlier layer's KV cache these heads read instead
    /// of writing their own (Gemma 4's shared layers): q is computed here,
    /// attends there, and its output comes back.
    pub reads_cache_on: Option<usize>,
    /// Projections whose outputs, side by side, are q, k and v: one over
    /// their weights stacked at load, two where v's type differs (q and k
    /// stacked), or the three where they cannot be stacked (sliced across
    /// devices, or adapted).
    pub qkv: Vec<Proj>,
    pub o: Proj,
    /// Qwen3's per-head norms of q and k, on this shard's device (q's
    /// twice where the layer has no k of its own).
    pub qk_norm: Option<(Tensor, Tensor)>,
    /// v's heads normed too, by no weight (Gemma 4).
    pub v_norm: bool,
    /// Qwen3.5's gate of the heads' output, `sigmoid(gate(x))`.
    pub gate: Option<Proj>,
    /// gpt-oss's sink logit of each of these heads.
    pub sinks: Option<Tensor>,
}

/// What mixes a block's rows across positions.
pub(super) enum Mixer {
    /// Its heads, each shard with its KV cache; summed where the residual
    /// stream and the norms live, and normed there (Gemma).
    Attention(Sharded<Attention>),
    /// A Gated DeltaNet with its recurrent state, whole at home.
    Linear(Sharded<GatedDeltaNet>),
}

/// What a block's mixer reads beside its weights: its layer's cache, the
/// rotary tables, and the pass's rows.
pub(super) struct MixerPass<'a> {
    /// Its layer's KV cache, or the earlier layer's that it reads.
    pub kv: Option<&'a KvCache>,
    pub state: Option<&'a RecurrentState>,
    pub rope: &'a [Option<RopeTable>],
    pub rows: &'a PassRows,
    /// The pass's per-layer inputs, at the block's home (Gemma 4).
    pub per_layer: Option<&'a Tensor>,
}

pub(super) struct Block {
    /// The block's index, which says its attention type.
    pub layer: usize,
    pub input_layernorm: Tensor,
    pub mixer: Mixer,
    /// The MLP's input norm: `post_attention_layernorm` (Llama), or
    /// `pre_feedforward_layernorm` (Gemma).
    pub mlp_in_norm: Tensor,
    /// Its MLP columns (or experts), summed at home likewise.
    pub mlp: Sharded<Ffn>,
    /// Gemma 4's per-layer input, gated into the block's output.
    pub per_layer: Option<PerLayerInput>,
    /// Gemma 4's factor of the block's output (`layer_scalar`).
    pub scalar: Option<f32>,
}

/// Gemma 4's per-layer input of a block, at its home:
/// `x += norm(projection(act(gate(x)) · input))`, `input` the block's
/// share of the pass's per-layer inputs.
pub(super) struct PerLayerInput {
    pub gate: Proj,
    pub projection: Proj,
    pub norm: Tensor,
}

impl PerLayerInput {
    fn add_into<R: Runtime>(
        &self,
        placement: &Placement<R>,
        (d, c): (usize, &ModelConfig),
        hidden: &Tensor,
        input: &Tensor,
    ) -> Result<()> {
        let client = placement.client(d);
        let gate = self.gate.forward(placement, d, hidden)?;
        let gated = gated_mul(client, &gate, &input.reshape(&gate.shape), c.activation)?;
        let projected = self.projection.forward(placement, d, &gated)?;
        add_assign(
            client,
            hidden,
            &rms_norm(client, &projected, &self.norm, c.rms_norm_eps)?,
        )?;
        Ok(())
    }
}

impl Block {
    /// Runs the block over `hidden` (on its home device), its keys and
    /// values cached in the pass's KV cache (one per shard of its heads),
    /// or its recurrent state carried on.
    pub fn forward<R: Runtime>(
        &self,
        placement: &Placement<R>,
        c: &ModelConfig,
        hidden: Tensor,
        pass: MixerPass,
        fetch: &ExpertFetch,
    ) -> Result<Tensor> {
        let attention = c.layer_types.of(self.layer);
        let input = Input::normed(&hidden, &self.input_layernorm, c.rms_norm_eps);
        let missing = |what: &str| ModelError::Device(format!("no {what} for layer {}", self.layer));
        match &self.mixer {
            Mixer::Attention(heads) => {
                let kv = &pass.kv.ok_or_else(|| missing("KV cache"))?.shards;
                heads.add_into(placement, &hidden, input, |i, heads, d, input, store| {
                    let at = (i, d, heads.reads_cache_on.unwrap_or(d));
                    let heads_pass = HeadsPass::of(placement, (kv.as_slice(), pass.rope), pass.rows, attention, at)?;
                    heads.forward(placement, d, c, input, heads_pass, store)
                })?
            }
            Mixer::Linear(linear) => {
                let state = pass.state.ok_or_else(|| missing("recurrent state"))?;
                linear.add_into(placement, &hidden, input, |_, linear, d, input, store| {
                    linear.forward(placement, d, input, (state, pass.rows), c.rms_norm_eps, store)
                })?
            }
        }
        let input = Input::normed(&hidden, &self.mlp_in_norm, c.rms_norm_eps);
        self.mlp
            .add_into(placement, &hidden, input, |_, mlp, d, input, store| {
                mlp.forward(placement, d, input, (c.activation, fetch), store)
            })?;
        let home = placement.plan().home_of_block(self.layer);
        if let Some(per_layer) = &self.per_layer {
            let inputs = pass.per_layer.ok_or_else(|| missing("per-layer inputs"))?;
            let width = inputs.cols() / c.layers;
            let share = columns_of(
                placement.client(home),
                inputs,
                self.layer * width..(self.layer + 1) * width,
            )?;
            per_layer.add_into(placement, (home, c), &hidden, &share)?;
        }
        if let Some(scalar) = self.scalar {
            scale_shift(placement.client(home), &hidden, scalar, 0.0)?;
        }
        Ok(hidden)
    }
}

/// What a shard of heads reads and writes in a pass beside its weights:
/// its KV cache, the rotary table and the pass's rows on its device (and
/// on its cache's, where that is another's), and the layer's attention
/// type.
struct HeadsPass<'a> {
    cache: &'a (Weight, Weight),
    rope: &'a RopeTable,
    rows: &'a DeviceRows,
    rows_at_cache: &'a DeviceRows,
    attention: AttentionType,
}

impl<'a> HeadsPass<'a> {
    /// The pass of shard `i` of a block's heads, on device `d`: its cache
    /// among the block's `caches` (on device `cache_at`), the rotary table
    /// of `d`, and the rows.
    fn of<R: Runtime>(
        placement: &Placement<R>,
        (caches, rope_tables): (&'a [(Weight, Weight)], &'a [Option<RopeTable>]),
        rows: &'a PassRows,
        attention: AttentionType,
        (i, d, cache_at): (usize, usize, usize),
    ) -> Result<Self> {
        let no_cache = || ModelError::Device(format!("no KV cache for shard {i}"));
        let no_table = || ModelError::Device(format!("no rotary table on device {d}"));
        Ok(HeadsPass {
            cache: caches.get(i).ok_or_else(no_cache)?,
            rope: rope_tables.get(d).and_then(Option::as_ref).ok_or_else(no_table)?,
            rows: rows.get(placement, d)?,
            rows_at_cache: rows.get(placement, cache_at)?,
            attention,
        })
    }
}

impl Attention {
    /// These heads' output for the rows `input` on device `d`, their keys
    /// and values written to the pass's cache, the output projection
    /// stored as `store` says.
    fn forward<R: Runtime>(
        &self,
        placement: &Placement<R>,
        d: usize,
        c: &ModelConfig,
        input: Input,
        pass: HeadsPass,
        store: Store,
    ) -> Result<Option<Tensor>> {
        let HeadsPass {
            cache: (k_cache, v_cache),
            rope: rope_table,
            rows,
            rows_at_cache,
            attention,
        } = pass;
        let client = placement.client(d);
        // Qwen3.5's gate, of the input normed as the projection reads it,
        // as q is.
        let gate = match &self.gate {
            Some(gate) => {
                let out = Tensor::empty(client, &input.x.shape_with_cols(gate.out()));
                gate.forward_into(placement, d, input, &out, 0)?;
                Some(out)
            }
            None => None,
        };
        let width = self.qkv.iter().map(Proj::out).sum();
        let qkv = Tensor::empty(client, &input.x.shape_with_cols(width));
        let mut column = 0;
        for proj in &self.qkv {
            proj.forward_into(placement, d, input, &qkv, column)?;
            column += proj.out();
        }
        let norms = self.qk_norm.as_ref().map(|(q, k)| HeadNorms {
            q,
            k,
            eps: c.rms_norm_eps,
            values: self.v_norm,
        });
        let cache = CacheWrite {
            k: k_cache,
            v: v_cache,
            rows: &rows.cache_rows,
        };
        let q = split_qkv(
            client,
            &qkv,
            (self.heads, self.kv_heads),
            (rope_table, &rows.positions),
            norms,
            self.reads_cache_on.is_none().then_some(cache),
        )?;
        let shape = AttentionShape {
            scale: c.attention_scale,
            softcap: c.attn_softcap,
            ..AttentionShape::new(self.heads, self.kv_heads, self.head_dim)
        }
        .rounding_like(self.o.weight_type());
        let sliding = attention == AttentionType::Sliding;
        let out = match self.reads_cache_on {
            Some(at) => {
                let q = placement.copy_to(&q, d, at);
                let keys = rows_at_cache.keys(sliding)?;
                let sinks = self.sinks.as_ref().map(|sinks| placement.copy_to(sinks, d, at));
                let out = attention_cached(placement.client(at), &q, k_cache, v_cache, shape, keys, sinks.as_ref())?;
                placement.copy_to(&out, at, d)
            }
            None => {
                let keys = rows.keys(sliding)?;
                attention_cached(client, &q, k_cache, v_cache, shape, keys, self.sinks.as_ref())?
            }
        };
        let out = match gate {
            Some(gate) => gated_mul(client, &gate, &out.reshape(&gate.shape), Activation::Sigmoid)?,
            None => out,
        };
        store.project(&self.o, placement, d, &out)
    }
}
