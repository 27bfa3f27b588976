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
    attention_cached, gated_mul, split_qkv, Activation, AttentionShape, CacheWrite, HeadNorms, RopeTable, Tensor,
    Weight,
};

use super::config::{AttentionType, ModelConfig};
use super::delta_net::GatedDeltaNet;
use super::moe::{ExpertFetch, Ffn};

/// Some heads of a block's attention, on one device: all of them, or in
/// tensor split a device's share.
pub(super) struct Attention {
    pub heads: usize,
    pub kv_heads: usize,
    /// Projections whose outputs, side by side, are q, k and v: one over
    /// their weights stacked at load, two where v's type differs (q and k
    /// stacked), or the three where they cannot be stacked (sliced across
    /// devices, or adapted).
    pub qkv: Vec<Proj>,
    pub o: Proj,
    /// Qwen3's per-head norms of q and k, on this shard's device.
    pub qk_norm: Option<(Tensor, Tensor)>,
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
    pub kv: Option<&'a KvCache>,
    pub state: Option<&'a RecurrentState>,
    pub rope: &'a [Option<RopeTable>],
    pub rows: &'a PassRows,
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
                    let heads_pass =
                        HeadsPass::of(placement, (kv.as_slice(), pass.rope), pass.rows, attention, (i, d))?;
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
        Ok(hidden)
    }
}

/// What a shard of heads reads and writes in a pass beside its weights:
/// its KV cache, the rotary table and the pass's rows on its device, and
/// the layer's attention type.
struct HeadsPass<'a> {
    cache: &'a (Weight, Weight),
    rope: &'a RopeTable,
    rows: &'a DeviceRows,
    attention: AttentionType,
}

impl<'a> HeadsPass<'a> {
    /// The pass of shard `i` of a block's heads, on device `d`: its cache
    /// among the block's `caches`, the rotary table of `d`, and `d`'s rows.
    fn of<R: Runtime>(
        placement: &Placement<R>,
        (caches, rope_tables): (&'a [(Weight, Weight)], &'a [Option<RopeTable>]),
        rows: &'a PassRows,
        attention: AttentionType,
        (i, d): (usize, usize),
    ) -> Result<Self> {
        let no_cache = || ModelError::Device(format!("no KV cache for shard {i}"));
        let no_table = || ModelError::Device(format!("no rotary table on device {d}"));
        Ok(HeadsPass {
            cache: caches.get(i).ok_or_else(no_cache)?,
            rope: rope_tables.get(d).and_then(Option::as_ref).ok_or_else(no_table)?,
            rows: rows.get(placement, d)?,
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
        let width = (self.heads + 2 * self.kv_heads) * c.head_dim;
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
            cache,
        )?;
        let shape = AttentionShape {
            scale: c.attention_scale,
            softcap: c.attn_softcap,
            ..AttentionShape::new(self.heads, self.kv_heads, c.head_dim)
        }
        .rounding_like(self.o.weight_type());
        let keys = rows.keys(attention == AttentionType::Sliding)?;
        let out = attention_cached(client, &q, k_cache, v_cache, shape, keys, self.sinks.as_ref())?;
        let out = match gate {
            Some(gate) => gated_mul(client, &gate, &out.reshape(&gate.shape), Activation::Sigmoid)?,
            None => out,
        };
        store.project(&self.o, placement, d, &out)
    }
}
