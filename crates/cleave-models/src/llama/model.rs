//! A Llama-family model's layers, as the decoder driver runs them
//! ([`cleave_nn::Decoder`]): the embedding, the blocks (see
//! [`super::block`]) with their KV caches, and the head.
//!
//! Weights are looked up by their Hugging Face names, as published. One
//! block type serves every split mode: a block runs on its home device,
//! its attention and its MLP each a [`cleave_nn::Sharded`] sublayer, which
//! carries the split. Layer split: one shard on the block's device. Row
//! split: one shard on the main device whose projections are sliced by
//! rows across the group. Tensor split: a shard of heads and one of MLP
//! columns per device, their partial sums all-reduced on the main device.

use std::ops::Range;

use cleave_nn::{
    BlockPass, CacheType, DecoderLayers, DecoderShape, Input, KvCache, LaterPart, LayerCache, Linear, Matrix,
    ModelError, Part, Placement, RecurrentState, Result, UploadCounters, UploadStats, WeightSource,
};
use cleave_plan::Plan;
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{add_assign, kv_cache, rms_norm, scale_shift, KernelError, Picked, RopeTable, Tensor};

use super::block::{Block, MixerPass};
use super::config::ModelConfig;
use super::load::{upload_while_running, BlockLoader};
use super::moe::{ExpertFetch, ExpertsElsewhere};

/// A Llama-family model on a device group: its layers under the decoder
/// driver.
pub type LlamaModel<R> = cleave_nn::Decoder<R, Llama>;

/// A Llama-family model's layers, as one part of the model holds them: the
/// whole model, or on a group spanning runtimes the blocks one runtime's
/// devices run.
pub struct Llama {
    pub(super) config: ModelConfig,
    /// In the part that holds the head.
    pub(super) embedding: Option<Embedding>,
    /// `None` for a block whose weights are streamed, or that another
    /// part runs.
    pub(super) layers: Vec<Option<Block>>,
    /// Where streamed blocks are read from.
    pub(super) source: WeightSource,
    /// The type the KV cache keeps keys and values in.
    pub(super) cache: CacheType,
    /// The last norm and the output head, in the part that holds the tail.
    pub(super) output: Option<(Tensor, Linear)>,
    /// The experts of every block that devices of other runtimes own
    /// (expert split across runtimes).
    pub(super) experts: Vec<Box<dyn ExpertsElsewhere>>,
    /// Streamed blocks' and fetched experts' bytes, the expert caches' hits.
    pub(super) uploads: UploadCounters,
}

/// The parts of a model on devices of other runtimes that the part on
/// the first runtime holds: the blocks after its own (layer split), or the
/// experts of every block that those devices own (expert split).
#[derive(Default)]
pub(crate) struct Elsewhere {
    pub next: Option<Box<dyn LaterPart>>,
    pub experts: Vec<Box<dyn ExpertsElsewhere>>,
}

pub(super) struct Embedding {
    pub table: Matrix,
    /// What the gathered embeddings are multiplied by (Gemma's √hidden,
    /// rounded to the table's type as transformers does).
    pub scale: Option<f32>,
    pub per_layer: Option<PerLayerEmbedding>,
}

/// Gemma 4's per-layer inputs of a token, every layer's side by side:
/// `(norm(projection(e) / √hidden) + table[id] · √width) / √2`, `e` the
/// token's embedding, the norm over each layer's `width` values.
pub(super) struct PerLayerEmbedding {
    /// `[vocab, layers · width]`.
    pub table: Matrix,
    /// √width, rounded to the table's type.
    pub scale: f32,
    /// `[layers · width, hidden]`, over the embeddings shaped as the pass
    /// shapes them (each row computed as alone in the decode form).
    pub projection: Linear,
    /// `[width]`, a plain `w`.
    pub norm: Tensor,
}

impl PerLayerEmbedding {
    fn inputs<R: Runtime>(
        &self,
        client: &ComputeClient<R>,
        c: &ModelConfig,
        ids: &[u32],
        hidden: &Tensor,
    ) -> Result<Tensor> {
        let rows = ids.len();
        let width = self.norm.len();
        let projected = self.projection.forward(client, hidden)?;
        let tokens = self.table.gather(client, ids)?.reshape(&projected.shape);
        scale_shift(client, &tokens, self.scale, 0.0)?;
        scale_shift(client, &projected, (c.hidden_size as f64).powf(-0.5) as f32, 0.0)?;
        let each_layer = projected.reshape(&[rows * c.layers, width]);
        let inputs = rms_norm(client, &each_layer, &self.norm, c.rms_norm_eps)?.reshape(&tokens.shape);
        add_assign(client, &inputs, &tokens)?;
        scale_shift(client, &inputs, std::f32::consts::FRAC_1_SQRT_2, 0.0)?;
        Ok(inputs)
    }
}

impl Llama {
    /// Runs `load` with a loader of weights uploaded while running onto
    /// `placement` (a streamed block, an expert a cache lacks), counting
    /// their bytes.
    fn upload<R: Runtime, T>(
        &self,
        placement: &Placement<R>,
        load: impl FnOnce(&BlockLoader<R>) -> Result<T>,
    ) -> Result<T> {
        upload_while_running(&self.source, placement, &self.config, &self.uploads, load)
    }

    /// `(device, kv heads)` of each shard of block `i` that attends: where
    /// its KV cache goes, whether its weights are resident or streamed (none
    /// for a Gated DeltaNet layer).
    fn block_shards(&self, plan: &Plan, i: usize) -> Vec<(usize, usize)> {
        if self.config.is_linear(i) {
            return Vec::new();
        }
        let all = self.config.heads_of(i).kv_heads;
        plan.block_shards(i)
            .into_iter()
            .filter_map(|shard| match shard.slice {
                None => Some((shard.device, all)),
                Some(slice) => (!slice.heads.is_empty()).then(|| (shard.device, slice.kv_heads.len())),
            })
            .collect()
    }
}

impl<R: Runtime> DecoderLayers<R> for Llama {
    fn shape(&self) -> DecoderShape {
        let c = &self.config;
        DecoderShape {
            layers: c.layers,
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            max_positions: c.max_positions,
            sliding_window: c.sliding_window.unwrap_or(0),
            final_softcap: c.final_softcap,
        }
    }

    fn embed(&self, client: &ComputeClient<R>, ids: &[u32], picked: Option<&Picked>) -> Result<Tensor> {
        let embedding = self
            .embedding
            .as_ref()
            .ok_or_else(|| ModelError::Device("a part without the embeddings was given ids".into()))?;
        let hidden = match picked {
            Some(picked) => embedding.table.gather_picked(client, picked)?,
            None => embedding.table.gather(client, ids)?,
        };
        if let Some(scale) = embedding.scale {
            scale_shift(client, &hidden, scale, 0.0)?;
        }
        Ok(hidden)
    }

    fn per_layer_inputs(&self, client: &ComputeClient<R>, ids: &[u32], hidden: &Tensor) -> Result<Option<Tensor>> {
        let per_layer = self.embedding.as_ref().and_then(|e| e.per_layer.as_ref());
        per_layer
            .map(|p| p.inputs(client, &self.config, ids, hidden))
            .transpose()
    }

    fn block(&self, placement: &Placement<R>, i: usize, hidden: Tensor, pass: BlockPass) -> Result<Tensor> {
        let c = &self.config;
        let streamed;
        let block = match &self.layers[i] {
            Some(block) => block,
            // Uploaded now into memory the previous streamed block gave
            // back, dropped once it has run.
            None => {
                streamed = self.upload(placement, |blocks| blocks.load(i))?;
                &streamed
            }
        };
        let load = |expert, device| self.upload(placement, |blocks| blocks.expert(i, expert, device));
        let fetch = ExpertFetch {
            layer: i,
            load: &load,
            counters: &self.uploads,
            elsewhere: &self.experts,
        };
        let (kv, state) = match c.is_linear(i) {
            true => (None, Some(pass.ctx.layer::<RecurrentState>(i)?)),
            false => (Some(pass.ctx.layer::<KvCache>(c.kv_source(i))?), None),
        };
        let mixer = MixerPass {
            kv,
            state,
            rope: pass.ctx.rope_tables(c.rope_table(i, pass.end)),
            rows: pass.rows,
            per_layer: pass.per_layer,
        };
        block.forward(placement, c, hidden, mixer, &fetch)
    }

    fn head(&self, client: &ComputeClient<R>, x: &Tensor) -> Result<Tensor> {
        let (norm, lm_head) = self
            .output
            .as_ref()
            .ok_or_else(|| ModelError::Device("a part without the output head was asked for logits".into()))?;
        lm_head.forward_input(client, Input::normed(x, norm, self.config.rms_norm_eps))
    }

    fn layer_cache(
        &self,
        placement: &Placement<R>,
        i: usize,
        capacity: usize,
        slots: usize,
    ) -> Result<Box<dyn LayerCache>> {
        let c = &self.config;
        if let Some(linear) = c.linear_attention.filter(|_| c.is_linear(i)) {
            let device = &placement.devices()[placement.plan().home_of_block(i)];
            let channels = linear.heads.qkv_width();
            let shapes = [
                [slots, linear.conv_taps - 1, channels],
                [
                    slots,
                    linear.heads.value_heads,
                    linear.heads.key_dim * linear.heads.value_dim,
                ],
            ];
            let bytes = shapes
                .iter()
                .map(|s| s.iter().product::<usize>() * size_of::<f32>())
                .sum::<usize>();
            device.reserve(bytes as u64, &format!("the recurrent state of layer {i}"))?;
            let [windows, states] = shapes.map(|shape| device.lasting(|| Tensor::allocate(&device.client, &shape)));
            let (heads, key, value) = (linear.heads.value_heads, linear.heads.key_dim, linear.heads.value_dim);
            let states = states?.reshape(&[slots, heads, key, value]);
            return Ok(Box::new(RecurrentState::new(windows?, states, slots)));
        }
        if c.shares_kv(i) {
            // Its heads read the earlier layer's cache.
            return Ok(Box::new(KvCache { shards: Vec::new() }));
        }
        let head_dim = c.heads_of(i).head_dim;
        let shards = self
            .block_shards(placement.plan(), i)
            .into_iter()
            .map(|(device, kv_heads)| {
                let device = &placement.devices()[device];
                let (rows, cols) = (slots * capacity, kv_heads * head_dim);
                let bytes = (2 * rows * cols * self.cache.bytes()) as u64;
                device.reserve(bytes, &format!("the KV cache of layer {i}"))?;
                let ty = self.cache.weight_type();
                let cache = || kv_cache(&device.client, ty, rows, cols);
                Ok(device.lasting(|| Ok::<_, KernelError>((cache()?, cache()?)))??)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Box::new(KvCache { shards }))
    }

    fn rope_tables(
        &self,
        placement: &Placement<R>,
        blocks: Range<usize>,
        capacity: usize,
    ) -> Result<Vec<Vec<Option<RopeTable>>>> {
        let mut attends = vec![false; placement.devices().len()];
        for i in blocks {
            for (device, _) in self.block_shards(placement.plan(), i) {
                attends[device] = true;
            }
        }
        // One table per set of frequencies (Gemma 3's sliding layers and
        // LongRoPE's long factors have their own), on each device that
        // attends.
        self.config
            .rope_tables()
            .into_iter()
            .map(|(inv_freq, scale)| {
                let devices = placement.devices().iter().zip(&attends);
                devices
                    .map(|(device, &attends)| {
                        let table = || RopeTable::scaled(&device.client, &inv_freq, capacity, scale);
                        attends.then(|| device.lasting(table)).transpose()
                    })
                    .collect()
            })
            .collect()
    }

    fn upload_stats(&self) -> UploadStats {
        let experts = self.experts.iter().map(|part| part.upload_stats());
        experts.fold(self.uploads.stats(), |sum, part| sum.plus(&part))
    }

    fn parts(&self) -> Vec<&dyn Part> {
        self.experts.iter().map(|part| part.as_ref() as &dyn Part).collect()
    }
}
