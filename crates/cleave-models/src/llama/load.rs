//! Loading a rotary decoder's weights as the plan divides them: each
//! block's attention and MLP as the shards of its split, the embeddings on
//! the head's device, the last norm and output head on the tail's.

use std::ops::Range;

use cleave_hf::LoraMode;
use cleave_nn::{
    Bias, CacheType, Decoder, Linear, Loader, ModelError, Placed, Placement, Proj, Result, Sharded, UploadCounters,
    WeightSource, Weights,
};
use cleave_plan::{BlockShard, HeadSlice, Plan};
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{scale_shift, Tensor, WeightType};

use super::block::{Attention, Block, Mixer, PerLayerInput};
use super::config::names::{
    weight, BLOCKS, EMBEDDINGS, FINAL_NORM, LAYER_SCALAR, OUTPUT_HEAD, PER_LAYER_EMBEDDINGS, PER_LAYER_NORM,
    PER_LAYER_PROJECTION,
};
use super::config::{AttentionTensors, MatmulTensor, MlpTensors, ModelConfig, NormTensor};
use super::delta_net::GatedDeltaNet;
use super::model::{Elsewhere, Embedding, Llama, LlamaModel, PerLayerEmbedding};
use super::moe::{BesideMlp, ExpertCache, ExpertWeights, Ffn, Mlp, Moe, SharedExpert};

/// Loads block `i`'s weights as the plan divides them.
pub(super) struct BlockLoader<'l, 'a, R: Runtime> {
    pub loader: &'l Loader<'a, R>,
    pub config: &'l ModelConfig,
    pub plan: &'l Plan,
}

impl<R: Runtime> BlockLoader<'_, '_, R> {
    pub fn load(&self, i: usize) -> Result<Block> {
        let (c, plan) = (self.config, self.plan);
        let home = plan.home_of_block(i);
        let w = self.loader.weights(home).pp(BLOCKS).pp(i);
        let t = c.attention_tensors(i);
        let shards = plan.block_shards(i);
        let (mixer, mlp) = match shards.as_slice() {
            [BlockShard { slice: None, .. }] if c.is_linear(i) => {
                let proj = |m: &MatmulTensor| w.proj(&m.name, m.rows, m.cols, Bias::No, &[(home, 0..m.rows)]);
                let linear = self.delta_net(&w, &proj)?;
                (
                    Mixer::Linear(Sharded::new(home, vec![(home, linear)])),
                    Sharded::new(home, vec![(home, self.ffn(i, &w, &|m| self.whole_proj(&w, m))?)]),
                )
            }
            [BlockShard { slice: None, .. }] => {
                let (attention, mlp) = self.whole_shard(i, &w, &t)?;
                (
                    Mixer::Attention(Sharded::new(home, vec![(home, attention)])),
                    Sharded::new(home, vec![(home, mlp)]),
                )
            }
            _ if c.is_linear(i) => {
                return Err(ModelError::Input(format!(
                    "tensor split cuts attention heads, and block {i} is a Gated DeltaNet layer, which it does \
                     not cut: use layer split (--split-mode layer) for this model"
                )))
            }
            _ => {
                // A block cut across devices has no mixture: the MLP is the
                // dense one.
                let dense = c.mlp_tensors(i, 0);
                let (mut attention, mut mlp) = (Vec::new(), Vec::new());
                for shard in &shards {
                    let d = shard.device;
                    let slice = shard.slice.as_ref().ok_or_else(|| {
                        ModelError::Device(format!("the plan cuts block {i} across devices but not on device {d}"))
                    })?;
                    let (heads, columns) = self.cut_shard(&w.on(d), slice, &t, &dense)?;
                    attention.extend(heads.map(|shard| (d, shard)));
                    mlp.extend(columns.map(|shard| (d, shard)));
                }
                // Added once, at home, after the all-reduce.
                let bias = |m: &MatmulTensor| m.bias.then(|| w.pp(&m.name).vector("bias", m.rows)).transpose();
                (
                    Mixer::Attention(Sharded::new(home, attention).with_bias(bias(&t.o)?)),
                    Sharded::new(home, mlp).with_bias(bias(&dense.down)?),
                )
            }
        };
        let norms = c.block_norms();
        let norm = |n: &NormTensor| norm_weight(c, &w.pp(n.name), n.len);
        let out_norm = |n: &Option<NormTensor>| n.as_ref().map(norm).transpose();
        let eps = c.rms_norm_eps;
        let attention_out = out_norm(&norms.attention_out)?;
        let per_layer = c.per_layer_input_tensors().map(|t| {
            Ok::<_, ModelError>(PerLayerInput {
                gate: self.whole_proj(&w, &t.gate)?,
                projection: self.whole_proj(&w, &t.projection)?,
                norm: norm(&t.norm)?,
            })
        });
        let scalar = match c.layer_scalar {
            true => Some(w.host_vector(LAYER_SCALAR, 1)?[0]),
            false => None,
        };
        Ok(Block {
            per_layer: per_layer.transpose()?,
            scalar,
            layer: i,
            input_layernorm: norm(&norms.input)?,
            mixer: match mixer {
                Mixer::Attention(heads) => Mixer::Attention(heads.with_out_norm(attention_out, eps)),
                Mixer::Linear(linear) => Mixer::Linear(linear.with_out_norm(attention_out, eps)),
            },
            mlp_in_norm: norm(&norms.mlp_in)?,
            mlp: mlp.with_out_norm(out_norm(&norms.mlp_out)?, eps),
        })
    }

    /// A Gated DeltaNet layer's weights on `w`'s device, each projection
    /// loaded by `proj`.
    fn delta_net(&self, w: &Weights<R>, proj: &dyn Fn(&MatmulTensor) -> Result<Proj>) -> Result<GatedDeltaNet> {
        let c = self.config;
        let (Some(linear), Some(t)) = (c.linear_attention, c.linear_attention_tensors()) else {
            return Err(ModelError::Input(
                "a linear-attention layer in a model without their heads".into(),
            ));
        };
        let (channels, values) = (linear.heads.qkv_width(), linear.heads.value_heads);
        Ok(GatedDeltaNet {
            heads: linear.heads,
            qkv: proj(&t.qkv)?,
            z: proj(&t.z)?,
            b: proj(&t.b)?,
            a: proj(&t.a)?,
            out: proj(&t.out)?,
            conv: w.tensor_as(
                &weight(t.conv),
                &[channels, 1, linear.conv_taps],
                &[channels, linear.conv_taps],
            )?,
            a_log: w.vector(t.a_log, values)?,
            dt_bias: w.vector(t.dt_bias, values)?,
            // A plain `w`, unlike the block's norms.
            norm: w.pp(t.norm.name).vector("weight", t.norm.len)?,
        })
    }

    /// All of `m` on `w`'s device, sliced where row split says.
    fn whole_proj(&self, w: &Weights<R>, m: &MatmulTensor) -> Result<Proj> {
        let parts = self.row_parts(&m.name, m.rows, w.device());
        w.proj(&m.name, m.rows, m.cols, Bias::when(m.bias), &parts)
    }

    /// Where the rows of `tensor` go: row split's slices, else all on `home`.
    fn row_parts(&self, tensor: &str, rows: usize, home: usize) -> Vec<(usize, Range<usize>)> {
        let sliced: Vec<(usize, Range<usize>)> = self
            .plan
            .devices
            .iter()
            .enumerate()
            .filter_map(|(d, plan)| {
                plan.rows
                    .iter()
                    .find(|s| s.tensor == tensor)
                    .map(|s| (d, s.rows.clone()))
            })
            .collect();
        if sliced.is_empty() {
            vec![(home, 0..rows)]
        } else {
            sliced
        }
    }

    /// All heads and columns, on `w`'s device, projections sliced where row
    /// split says; `t` declares attention's tensors.
    fn whole_shard(&self, layer: usize, w: &Weights<R>, t: &AttentionTensors) -> Result<(Attention, Ffn)> {
        let c = self.config;
        let home = w.device();
        let proj = |m: &MatmulTensor| self.whole_proj(w, m);
        let qkv: Vec<_> = t.qkv().into_iter().map(|m| (m, 0..m.rows)).collect();
        let sliced = qkv
            .iter()
            .any(|(m, _)| self.row_parts(&m.name, m.rows, home) != [(home, 0..m.rows)]);
        let heads = c.heads_of(layer);
        let attention = Attention {
            heads: c.heads,
            kv_heads: heads.kv_heads,
            head_dim: heads.head_dim,
            reads_cache_on: c.shares_kv(layer).then(|| self.plan.home_of_block(c.kv_source(layer))),
            qkv: self.qkv(w, qkv, sliced, &|m, _| proj(m))?,
            o: proj(&t.o)?,
            qk_norm: self.qk_norm(w, t)?,
            v_norm: c.v_norm,
            gate: t.gate.as_ref().map(proj).transpose()?,
            sinks: t.sinks.map(|name| w.vector(name, c.heads)).transpose()?,
        };
        Ok((attention, self.ffn(layer, w, &proj)?))
    }

    /// Block `layer`'s MLP, or its router and experts, each projection
    /// loaded by `proj` (in expert split, experts go to the devices that
    /// own them).
    fn ffn(&self, layer: usize, w: &Weights<R>, proj: &dyn Fn(&MatmulTensor) -> Result<Proj>) -> Result<Ffn> {
        let c = self.config;
        let Some((router, routing)) = c.router_tensor().zip(c.experts) else {
            return Ok(Ffn::Dense(mlp(&c.mlp_tensors(layer, 0), proj)?));
        };
        let beside = c.beside_mlp_tensors();
        let experts = match self.plan.places_experts() {
            true => ExpertWeights::Placed(self.expert_caches(layer)?),
            false => ExpertWeights::Beside(
                (0..routing.count)
                    .map(|e| mlp(&c.mlp_tensors(layer, e), proj))
                    .collect::<Result<_>>()?,
            ),
        };
        let shared = c.shared_expert_tensors().map(|t| {
            Ok::<_, ModelError>(SharedExpert {
                mlp: mlp(&t.mlp, proj)?,
                gate: w.linear(&t.gate.name, t.gate.rows, t.gate.cols, Bias::No)?,
            })
        });
        let expert_scales = beside.as_ref().map(|b| w.host_vector(b.expert_scales, routing.count));
        let moe = Moe {
            router: w.linear(&router.name, router.rows, router.cols, Bias::when(router.bias))?,
            experts,
            routing,
            shared: shared.transpose()?,
            expert_scales: expert_scales.transpose()?,
        };
        let Some(beside) = beside else {
            return Ok(Ffn::Experts(Box::new(moe)));
        };
        let norm = |n: &NormTensor| norm_weight(c, &w.pp(n.name), n.len);
        // rms_norm(x) · scale / √hidden, as one weight.
        let router_norm = w.vector(beside.router_scale, c.hidden_size)?;
        scale_shift(w.client(), &router_norm, (c.hidden_size as f64).powf(-0.5) as f32, 0.0)?;
        Ok(Ffn::Beside(Box::new(BesideMlp {
            mlp: mlp(&c.dense_mlp_tensors(layer), proj)?,
            moe,
            router_norm,
            experts_in: norm(&beside.experts_in)?,
            mlp_out: norm(&beside.mlp_out)?,
            experts_out: norm(&beside.experts_out)?,
            eps: c.rms_norm_eps,
        })))
    }

    /// Block `layer`'s experts in expert split: each device's cache, filled
    /// with the first of its experts that the plan keeps resident.
    pub(super) fn expert_caches(&self, layer: usize) -> Result<Vec<ExpertCache>> {
        self.plan
            .devices
            .iter()
            .enumerate()
            .filter_map(|(d, plan)| plan.experts.as_ref().map(|slice| (d, slice)))
            .filter(|(_, slice)| !slice.experts.is_empty())
            .map(|(d, slice)| {
                let resident = slice
                    .experts
                    .clone()
                    .take(slice.cached)
                    .map(|expert| Ok((expert, self.expert(layer, expert, d)?)))
                    .collect::<Result<Vec<_>>>()?;
                Ok(ExpertCache::new(d, slice.experts.clone(), resident))
            })
            .collect()
    }

    /// Expert `expert` of block `layer`, whole on device `device`.
    pub(super) fn expert(&self, layer: usize, expert: usize, device: usize) -> Result<Mlp> {
        let w = self.loader.weights(device).pp(BLOCKS).pp(layer);
        let proj = |m: &MatmulTensor| w.proj(&m.name, m.rows, m.cols, Bias::when(m.bias), &[(device, 0..m.rows)]);
        mlp(&self.config.mlp_tensors(layer, expert), &proj)
    }

    /// The rows `part` of each of q, k and v on `w`'s device: stacked into
    /// as few projections as their stored types allow unless `sliced`
    /// across devices or adapted, else each loaded by `separate`.
    fn qkv(
        &self,
        w: &Weights<R>,
        parts: Vec<(&MatmulTensor, Range<usize>)>,
        sliced: bool,
        separate: &dyn Fn(&MatmulTensor, Range<usize>) -> Result<Proj>,
    ) -> Result<Vec<Proj>> {
        if !sliced {
            let stacked: Vec<_> = parts
                .iter()
                .map(|(m, rows)| (m.name.as_str(), m.rows, rows.clone()))
                .collect();
            // q, k and v share one bias switch.
            let bias = Bias::when(parts[0].0.bias);
            if let Some(stacked) = w.linear_stacked(&stacked, self.config.hidden_size, bias)? {
                return Ok(stacked
                    .into_iter()
                    .map(|(linear, rows)| Proj::whole(w.device(), linear, rows))
                    .collect());
            }
        }
        parts.into_iter().map(|(m, rows)| separate(m, rows)).collect()
    }

    /// The norms of q and k (Qwen3, Gemma 3), on `w`'s device, where the
    /// model has them (q's twice in a layer without k).
    fn qk_norm(&self, w: &Weights<R>, t: &AttentionTensors) -> Result<Option<(Tensor, Tensor)>> {
        let norm = |n: &NormTensor| norm_weight(self.config, &w.pp(n.name), n.len);
        let Some(q) = t.q_norm.as_ref().map(norm).transpose()? else {
            return Ok(None);
        };
        let k = t.k_norm.as_ref().map(norm).transpose()?;
        Ok(Some((q.clone(), k.unwrap_or(q))))
    }

    /// The heads and MLP columns `slice` gives `w`'s device in a block cut
    /// across devices (none where it has none): q/k/v and gate/up sliced
    /// by output rows, o/down by input columns, of the tensors `t` and
    /// `dense` declare.
    fn cut_shard(
        &self,
        w: &Weights<R>,
        slice: &HeadSlice,
        t: &AttentionTensors,
        dense: &MlpTensors,
    ) -> Result<(Option<Attention>, Option<Ffn>)> {
        let c = self.config;
        let d = w.device();
        let hd = c.head_dim;
        let q_rows = slice.heads.start * hd..slice.heads.end * hd;
        let kv_rows = slice.kv_heads.start * hd..slice.kv_heads.end * hd;
        // A shard computes only its own rows of a row-sliced projection.
        let rows = |m: &MatmulTensor, part: Range<usize>| {
            let len = part.len();
            let linear = w.linear_rows(&m.name, m.rows, m.cols, Bias::when(m.bias), part)?;
            Ok(Proj::whole(d, linear, len))
        };
        let cols = |m: &MatmulTensor, part: Range<usize>| {
            let linear = w.linear_cols(&m.name, m.rows, m.cols, part)?;
            Ok::<_, ModelError>(Proj::whole(d, linear, m.rows))
        };
        let attention = if slice.heads.is_empty() {
            None
        } else {
            // Only blocks alike are cut (see the planner): every one has
            // its own k and v, of the model's head size.
            let [k, v] = t.kv.as_ref().ok_or_else(|| {
                ModelError::Device("the plan cuts a block that reads another's KV cache across devices".into())
            })?;
            let qkv = vec![(&t.q, q_rows.clone()), (k, kv_rows.clone()), (v, kv_rows)];
            Some(Attention {
                heads: slice.heads.len(),
                kv_heads: slice.kv_heads.len(),
                head_dim: hd,
                reads_cache_on: None,
                qkv: self.qkv(w, qkv, false, &rows)?,
                o: cols(&t.o, q_rows.clone())?,
                qk_norm: self.qk_norm(w, t)?,
                v_norm: c.v_norm,
                gate: t.gate.as_ref().map(|g| rows(g, q_rows)).transpose()?,
                sinks: t
                    .sinks
                    .map(|name| w.vector_part(name, c.heads, slice.heads.clone()))
                    .transpose()?,
            })
        };
        let mlp = if slice.intermediate.is_empty() {
            None
        } else {
            Some(Ffn::Dense(Mlp {
                gate: rows(&dense.gate, slice.intermediate.clone())?,
                up: rows(&dense.up, slice.intermediate.clone())?,
                down: cols(&dense.down, slice.intermediate.clone())?,
            }))
        };
        Ok((attention, mlp))
    }
}

/// The MLP whose projections `t` declares, each loaded by `proj`.
fn mlp(t: &MlpTensors, proj: &dyn Fn(&MatmulTensor) -> Result<Proj>) -> Result<Mlp> {
    Ok(Mlp {
        gate: proj(&t.gate)?,
        up: proj(&t.up)?,
        down: proj(&t.down)?,
    })
}

/// An RMS norm's weight (`w.weight`, `len` values), held as `1 + w` where
/// `config` scales by that (Gemma: computed in f32, as transformers does).
fn norm_weight<R: Runtime>(config: &ModelConfig, w: &Weights<R>, len: usize) -> Result<Tensor> {
    let weight = w.vector("weight", len)?;
    if config.norm_plus_one {
        scale_shift(w.client(), &weight, 1.0, 1.0)?;
    }
    Ok(weight)
}

/// √hidden rounded to the embedding table's type, as transformers scales
/// Gemma's embeddings.
fn embed_scale(config: &ModelConfig, table: WeightType) -> Option<f32> {
    let scale = (config.hidden_size as f64).sqrt() as f32;
    config.scale_embeddings.then(|| rounded_like(scale, table))
}

/// `scale` rounded to a table's type, as transformers rounds the factor
/// of a scaled embedding.
fn rounded_like(scale: f32, table: WeightType) -> f32 {
    match table {
        WeightType::BF16 => half::bf16::from_f32(scale).to_f32(),
        WeightType::F16 => half::f16::from_f32(scale).to_f32(),
        _ => scale,
    }
}

/// Runs `load` with a loader of weights uploaded while running onto
/// `placement`'s devices (a streamed block, an expert a cache lacks),
/// counting their bytes in `uploads`.
pub(super) fn upload_while_running<R: Runtime, T>(
    source: &WeightSource,
    placement: &Placement<R>,
    config: &ModelConfig,
    uploads: &UploadCounters,
    load: impl FnOnce(&BlockLoader<R>) -> Result<T>,
) -> Result<T> {
    let mut count = |bytes| uploads.uploaded(bytes);
    // Uploaded again for later passes: merging LoRA updates each time
    // would cost more than applying them.
    let mode = match source.lora_mode {
        LoraMode::Auto => LoraMode::Runtime,
        mode => mode,
    };
    let loader = source.loader(placement.devices(), mode, &mut count);
    load(&BlockLoader {
        loader: &loader,
        config,
        plan: placement.plan(),
    })
}

impl Llama {
    /// Uploads the weights of `source` to `devices` as `plan` places them,
    /// its KV caches to be kept in `cache`; `progress` is told the
    /// checkpoint bytes read after each tensor. On a group spanning
    /// runtimes, `plan` is one runtime's part of the model's plan and
    /// `elsewhere` the parts on the other runtimes: in layer split the
    /// parts after this one, which the tail is in unless it is here; in
    /// expert split the experts the other runtimes' devices own.
    pub(crate) fn load<R: Runtime>(
        devices: Vec<Placed<R>>,
        plan: Plan,
        config: &ModelConfig,
        (source, cache): (WeightSource, CacheType),
        elsewhere: Elsewhere,
        progress: &mut dyn FnMut(u64),
    ) -> Result<LlamaModel<R>> {
        let c = config;
        let loader = source.loader(&devices, source.lora_mode, progress);
        let (h, vocab) = (c.hidden_size, c.vocab_size);
        let (head, tail) = (plan.head_device(), plan.tail_device());
        let embedding = match plan.has_head() {
            true => {
                let w = loader.weights(head);
                let table = w.matrix(&weight(EMBEDDINGS), vocab, h)?;
                let scale = embed_scale(c, table.weight_type());
                let per_layer = c.per_layer_inputs.map(|p| {
                    let all = c.layers * p.width;
                    let table = w.matrix(&weight(PER_LAYER_EMBEDDINGS), p.vocab, all)?;
                    Ok::<_, ModelError>(PerLayerEmbedding {
                        scale: rounded_like(((p.width as f64).sqrt()) as f32, table.weight_type()),
                        table,
                        projection: w.linear(PER_LAYER_PROJECTION, all, h, Bias::No)?,
                        norm: w.pp(PER_LAYER_NORM).vector("weight", p.width)?,
                    })
                });
                Some(Embedding {
                    table,
                    scale,
                    per_layer: per_layer.transpose()?,
                })
            }
            false => None,
        };
        let block_loader = BlockLoader {
            loader: &loader,
            config: c,
            plan: &plan,
        };
        // Every block, but in a layer split's part of a model spanning
        // runtimes (the other modes give the main device every block).
        let blocks = plan.blocks();
        let layers = (0..c.layers)
            .map(|i| {
                (blocks.contains(&i) && !plan.is_streamed(i))
                    .then(|| block_loader.load(i))
                    .transpose()
            })
            .collect::<Result<Vec<_>>>()?;
        let output = match plan.has_tail() {
            true => {
                let w = loader.weights(tail);
                let norm = norm_weight(c, &w.pp(FINAL_NORM), h)?;
                let lm_head = match &embedding {
                    _ if !c.ties_output_head(&source.checkpoint) => w.linear(OUTPUT_HEAD, vocab, h, Bias::No)?,
                    Some(embedding) if head == tail => Linear::new(embedding.table.clone()),
                    // The tied head lives with the embeddings; the tail's
                    // device gets its own copy of the same tensor.
                    _ => w.linear(EMBEDDINGS, vocab, h, Bias::No)?,
                };
                Some((norm, lm_head))
            }
            false => None,
        };
        let placement = Placement::new(devices, plan);
        placement.release_freed();
        let layers = Llama {
            config: c.clone(),
            embedding,
            layers,
            source,
            cache,
            output,
            experts: elsewhere.experts,
            uploads: UploadCounters::default(),
        };
        Decoder::new(placement, layers, elsewhere.next)
    }
}
