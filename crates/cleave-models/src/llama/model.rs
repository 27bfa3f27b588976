//! A Llama-family model on a device group.
//!
//! Weights are looked up by their Hugging Face names, as published. One
//! block type serves every split mode: a block runs on its home device,
//! its attention and its MLP each a [`Sharded`] sublayer, which carries the
//! split. Layer split: one shard on the block's device. Row split: one
//! shard on the main device whose projections are sliced by rows across
//! the group. Tensor split: a shard of heads and one of MLP columns per
//! device, their partial sums all-reduced on the main device.

use std::ops::Range;

use cleave_hf::LoraMode;
use cleave_nn::{
    read_logits, Bias, CacheType, CausalModel, Context, DeviceRows, Finish, Finished, HostRows, Input, LaterPart,
    Linear, Loader, Logits, Matrix, ModelError, Part, PassRows, PickRule, Placed, Placement, Proj, Result, Sharded,
    Store, UploadCounters, UploadStats, WeightSource, Weights, MAX_DRAFTS,
};
use cleave_plan::{Plan, SplitMode};
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{
    attention_cached, copy_rows, kv_cache, scale_shift, split_qkv, AttentionShape, CacheWrite, HeadNorms, KernelError,
    RopeTable, Tensor, Weight, WeightType,
};

use super::config::{AttentionTensors, AttentionType, MatmulTensor, MlpTensors, ModelConfig, NormTensor};
use super::moe::{ExpertCache, ExpertFetch, ExpertWeights, ExpertsElsewhere, Ffn, Mlp, Moe};

/// Most prompt tokens one forward pass takes; longer prompts go in pieces.
pub(super) const MAX_BATCH_ROWS: usize = 512;

/// Most rows of one sequence that a pass computes in the decode form (each
/// row as decoding it alone would: the decode products share each weight
/// read among a few rows): a speculative step's token and its drafts. A
/// longer pass is a prompt's, for the prefill products.
const DECODE_FORM_ROWS: usize = 1 + MAX_DRAFTS;

/// Some heads of a block's attention, on one device: all of them, or in
/// tensor split a device's share.
struct Attention {
    heads: usize,
    kv_heads: usize,
    /// Projections whose outputs, side by side, are q, k and v: one over
    /// their weights stacked at load, two where v's type differs (q and k
    /// stacked), or the three where they cannot be stacked (sliced across
    /// devices, or adapted).
    qkv: Vec<Proj>,
    o: Proj,
    /// Qwen3's per-head norms of q and k, on this shard's device.
    qk_norm: Option<(Tensor, Tensor)>,
}

struct Block {
    /// The block's index, which says its attention type.
    layer: usize,
    input_layernorm: Tensor,
    /// Its heads, each shard with its KV cache; summed where the residual
    /// stream and the norms live, and normed there (Gemma).
    attention: Sharded<Attention>,
    /// The MLP's input norm: `post_attention_layernorm` (Llama), or
    /// `pre_feedforward_layernorm` (Gemma).
    mlp_in_norm: Tensor,
    /// Its MLP columns (or experts), summed at home likewise.
    mlp: Sharded<Ffn>,
}

/// A Llama-family model on a device group, placed as `plan` says: the
/// whole model, or on a group spanning runtimes the part of it that one
/// runtime's devices hold, with the parts after it (see [`LaterPart`]).
pub struct Llama<R: Runtime> {
    placement: Placement<R>,
    config: ModelConfig,
    /// In the part that holds the head.
    embedding: Option<Embedding>,
    /// The blocks this part runs: every one, but for a model spanning
    /// runtimes.
    blocks: Range<usize>,
    /// `None` for a block whose weights are streamed, or that another
    /// part runs.
    layers: Vec<Option<Block>>,
    /// Where streamed blocks are read from.
    source: WeightSource,
    /// The type the KV cache keeps keys and values in.
    cache: CacheType,
    /// The last norm and the output head, in the part that holds the tail.
    output: Option<(Tensor, Linear)>,
    /// The parts of the model on devices of other runtimes that this one
    /// holds.
    elsewhere: Elsewhere,
    /// Streamed blocks' and fetched experts' bytes, the expert caches' hits.
    uploads: UploadCounters,
}

/// The parts of a model on devices of other runtimes that the part on
/// the first runtime holds: the blocks after its own (layer split), or the
/// experts of every block that those devices own (expert split).
#[derive(Default)]
pub(crate) struct Elsewhere {
    pub next: Option<Box<dyn LaterPart>>,
    pub experts: Vec<Box<dyn ExpertsElsewhere>>,
}

impl Elsewhere {
    fn parts(&self) -> impl Iterator<Item = &dyn Part> {
        let next = self.next.iter().map(|p| p.as_ref() as &dyn Part);
        next.chain(self.experts.iter().map(|p| p.as_ref() as &dyn Part))
    }

    /// `here` (one figure per device of the part holding these), then
    /// each part's figures as `of` gives them: one per device of the
    /// group, in its order.
    fn after(&self, mut here: Vec<u64>, of: impl Fn(&dyn Part) -> Result<Vec<u64>>) -> Result<Vec<u64>> {
        for part in self.parts() {
            here.extend(of(part)?);
        }
        Ok(here)
    }
}

struct Embedding {
    table: Matrix,
    /// What the gathered embeddings are multiplied by (Gemma's √hidden,
    /// rounded to the table's type as transformers does).
    scale: Option<f32>,
}

/// Loads block `i`'s weights as the plan divides them.
pub(super) struct BlockLoader<'l, 'a, R: Runtime> {
    pub loader: &'l Loader<'a, R>,
    pub config: &'l ModelConfig,
    pub plan: &'l Plan,
}

impl<R: Runtime> BlockLoader<'_, '_, R> {
    fn load(&self, i: usize) -> Result<Block> {
        let (c, plan) = (self.config, self.plan);
        let home = plan.home_of_block(i);
        let w = self.loader.weights(home).pp("model.layers").pp(i);
        let t = c.attention_tensors();
        let (attention, mlp) = match plan.mode {
            SplitMode::Layer | SplitMode::Row | SplitMode::Expert => {
                let (attention, mlp) = self.whole_shard(i, &w, &t)?;
                (
                    Sharded::new(home, vec![(home, attention)]),
                    Sharded::new(home, vec![(home, mlp)]),
                )
            }
            SplitMode::Tensor => {
                // Tensor split refuses mixtures: the MLP is the dense one.
                let dense = c.mlp_tensors(0);
                let (mut attention, mut mlp) = (Vec::new(), Vec::new());
                for d in 0..plan.devices.len() {
                    let (heads, columns) = self.tensor_shard(&w.on(d), &t, &dense)?;
                    attention.extend(heads.map(|shard| (d, shard)));
                    mlp.extend(columns.map(|shard| (d, shard)));
                }
                // Added once, at home, after the all-reduce.
                let bias = |m: &MatmulTensor| m.bias.then(|| w.pp(&m.name).vector("bias", m.rows)).transpose();
                (
                    Sharded::new(home, attention).with_bias(bias(&t.o)?),
                    Sharded::new(home, mlp).with_bias(bias(&dense.down)?),
                )
            }
        };
        let norms = c.block_norms();
        let norm = |n: &NormTensor| norm_weight(c, &w.pp(n.name), n.len);
        let out_norm = |n: &Option<NormTensor>| n.as_ref().map(norm).transpose();
        let eps = c.rms_norm_eps;
        Ok(Block {
            layer: i,
            input_layernorm: norm(&norms.input)?,
            attention: attention.with_out_norm(out_norm(&norms.attention_out)?, eps),
            mlp_in_norm: norm(&norms.mlp_in)?,
            mlp: mlp.with_out_norm(out_norm(&norms.mlp_out)?, eps),
        })
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
        let proj = |m: &MatmulTensor| {
            let parts = self.row_parts(&m.name, m.rows, home);
            w.proj(&m.name, m.rows, m.cols, Bias::when(m.bias), &parts)
        };
        let qkv = [&t.q, &t.k, &t.v].map(|m| (m, 0..m.rows));
        let sliced = qkv
            .iter()
            .any(|(m, _)| self.row_parts(&m.name, m.rows, home) != [(home, 0..m.rows)]);
        let attention = Attention {
            heads: c.heads,
            kv_heads: c.kv_heads,
            qkv: self.qkv(w, qkv, sliced, &|m, _| proj(m))?,
            o: proj(&t.o)?,
            qk_norm: self.qk_norm(w, t)?,
        };
        Ok((attention, self.ffn(layer, w, &proj)?))
    }

    /// Block `layer`'s MLP, or its router and experts, each projection
    /// loaded by `proj` (in expert split, experts go to the devices that
    /// own them).
    fn ffn(&self, layer: usize, w: &Weights<R>, proj: &dyn Fn(&MatmulTensor) -> Result<Proj>) -> Result<Ffn> {
        let c = self.config;
        let Some((router, routing)) = c.router_tensor().zip(c.experts) else {
            return Ok(Ffn::Dense(mlp(&c.mlp_tensors(0), proj)?));
        };
        let experts = match self.plan.mode {
            SplitMode::Expert => ExpertWeights::Placed(self.expert_caches(layer)?),
            _ => ExpertWeights::Beside(
                (0..routing.count)
                    .map(|e| mlp(&c.mlp_tensors(e), proj))
                    .collect::<Result<_>>()?,
            ),
        };
        Ok(Ffn::Experts(Moe {
            router: w.linear(&router.name, router.rows, router.cols, Bias::when(router.bias))?,
            experts,
            routing,
        }))
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
        let w = self.loader.weights(device).pp("model.layers").pp(layer);
        let proj = |m: &MatmulTensor| w.proj(&m.name, m.rows, m.cols, Bias::when(m.bias), &[(device, 0..m.rows)]);
        mlp(&self.config.mlp_tensors(expert), &proj)
    }

    /// The rows `part` of each of q, k and v on `w`'s device: stacked into
    /// as few projections as their stored types allow unless `sliced`
    /// across devices or adapted, else each loaded by `separate`.
    fn qkv(
        &self,
        w: &Weights<R>,
        parts: [(&MatmulTensor, Range<usize>); 3],
        sliced: bool,
        separate: &dyn Fn(&MatmulTensor, Range<usize>) -> Result<Proj>,
    ) -> Result<Vec<Proj>> {
        if !sliced {
            let stacked = parts.clone().map(|(m, rows)| (m.name.as_str(), m.rows, rows));
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
    /// model has them.
    fn qk_norm(&self, w: &Weights<R>, t: &AttentionTensors) -> Result<Option<(Tensor, Tensor)>> {
        let norm = |n: &NormTensor| norm_weight(self.config, &w.pp(n.name), n.len);
        t.qk_norms.as_ref().map(|[q, k]| Ok((norm(q)?, norm(k)?))).transpose()
    }

    /// The heads and MLP columns of `w`'s device in tensor split (none
    /// where it has none): q/k/v and gate/up sliced by output rows, o/down
    /// by input columns, of the tensors `t` and `dense` declare.
    fn tensor_shard(
        &self,
        w: &Weights<R>,
        t: &AttentionTensors,
        dense: &MlpTensors,
    ) -> Result<(Option<Attention>, Option<Ffn>)> {
        let c = self.config;
        let d = w.device();
        let slice = self.plan.devices[d]
            .heads
            .clone()
            .ok_or_else(|| ModelError::Device(format!("the tensor-split plan gives device {d} no heads entry")))?;
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
            let qkv = [(&t.q, q_rows.clone()), (&t.k, kv_rows.clone()), (&t.v, kv_rows)];
            Some(Attention {
                heads: slice.heads.len(),
                kv_heads: slice.kv_heads.len(),
                qkv: self.qkv(w, qkv, false, &rows)?,
                o: cols(&t.o, q_rows)?,
                qk_norm: self.qk_norm(w, t)?,
            })
        };
        let mlp = if slice.intermediate.is_empty() {
            None
        } else {
            Some(Ffn::Dense(Mlp {
                gate: rows(&dense.gate, slice.intermediate.clone())?,
                up: rows(&dense.up, slice.intermediate.clone())?,
                down: cols(&dense.down, slice.intermediate)?,
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
    config.scale_embeddings.then(|| match table {
        WeightType::BF16 => half::bf16::from_f32(scale).to_f32(),
        WeightType::F16 => half::f16::from_f32(scale).to_f32(),
        _ => scale,
    })
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

impl<R: Runtime> Llama<R> {
    /// Uploads the weights of `source` to `devices` as `plan` places them,
    /// its KV caches to be kept in `cache`; `progress` is told the
    /// checkpoint bytes read after each tensor. On a group spanning
    /// runtimes, `plan` is one runtime's part of the model's plan and
    /// `elsewhere` the parts on the other runtimes: in layer split the
    /// parts after this one, which the tail is in unless it is here; in
    /// expert split the experts the other runtimes' devices own.
    pub(crate) fn load(
        devices: Vec<Placed<R>>,
        plan: Plan,
        config: &ModelConfig,
        (source, cache): (WeightSource, CacheType),
        elsewhere: Elsewhere,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Self> {
        let c = config;
        // A part that runs blocks hands them on to the tail's part; parts
        // after that one hold nothing (their members got no block).
        if !plan.has_tail() && !plan.blocks().is_empty() && elsewhere.next.is_none() {
            return Err(ModelError::Device(format!(
                "a part of {} running blocks {:?} has neither the tail nor a part after it",
                plan.module,
                plan.blocks()
            )));
        }
        let loader = source.loader(&devices, source.lora_mode, progress);
        let (h, vocab) = (c.hidden_size, c.vocab_size);
        let (head, tail) = (plan.head_device(), plan.tail_device());
        let embedding = match plan.has_head() {
            true => {
                let table = loader.weights(head).matrix("model.embed_tokens.weight", vocab, h)?;
                let scale = embed_scale(c, table.weight_type());
                Some(Embedding { table, scale })
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
                let norm = norm_weight(c, &w.pp("model.norm"), h)?;
                let lm_head = match &embedding {
                    _ if !c.ties_output_head(&source.checkpoint) => w.linear("lm_head", vocab, h, Bias::No)?,
                    Some(embedding) if head == tail => Linear::new(embedding.table.clone()),
                    // The tied head lives with the embeddings; the tail's
                    // device gets its own copy of the same tensor.
                    _ => w.linear("model.embed_tokens", vocab, h, Bias::No)?,
                };
                Some((norm, lm_head))
            }
            false => None,
        };
        let placement = Placement::new(devices, plan);
        placement.release_freed();
        Ok(Llama {
            placement,
            config: c.clone(),
            embedding,
            blocks,
            layers,
            source,
            cache,
            output,
            elsewhere,
            uploads: UploadCounters::default(),
        })
    }

    /// Runs `load` with a loader of weights uploaded while running
    /// (a streamed block, an expert a cache lacks), counting their bytes.
    fn upload<T>(&self, load: impl FnOnce(&BlockLoader<R>) -> Result<T>) -> Result<T> {
        upload_while_running(&self.source, &self.placement, &self.config, &self.uploads, load)
    }

    /// `(device, kv heads)` of each shard of block `i` that attends: where
    /// its KV cache goes, whether its weights are resident or streamed.
    fn block_shards(&self, i: usize) -> Vec<(usize, usize)> {
        let plan = self.placement.plan();
        let c = &self.config;
        match plan.mode {
            SplitMode::Layer => vec![(plan.device_of_block(i), c.kv_heads)],
            SplitMode::Row | SplitMode::Expert => vec![(0, c.kv_heads)],
            SplitMode::Tensor => plan
                .devices
                .iter()
                .enumerate()
                .filter_map(|(d, p)| {
                    p.heads
                        .as_ref()
                        .filter(|h| !h.heads.is_empty())
                        .map(|h| (d, h.kv_heads.len()))
                })
                .collect(),
        }
    }

    /// Fails unless `ids` fit after what `slot` of `ctx` holds and are all
    /// in the vocabulary.
    fn check(&self, ctx: &Context, slot: usize, ids: &[u32]) -> Result<()> {
        if ctx.len(slot) + ids.len() > ctx.capacity() {
            return Err(ModelError::PromptTooLong {
                tokens: ctx.len(slot) + ids.len(),
                context: ctx.capacity(),
                max: self.config.max_positions,
            });
        }
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.config.vocab_size) {
            return Err(ModelError::TokenId {
                id,
                vocab: self.config.vocab_size,
            });
        }
        Ok(())
    }

    /// How many of `remaining` tokens the next pass takes: at most
    /// MAX_BATCH_ROWS, and when every row's logits are wanted, few enough
    /// that they (`rows × vocab`) fit one buffer. (Attention writes no
    /// scores, so it sets no bound of its own.)
    fn batch_rows(&self, remaining: usize, which: Logits) -> usize {
        let mut rows = remaining.min(MAX_BATCH_ROWS);
        if which == Logits::All {
            let row_bytes = self.config.vocab_size * size_of::<f32>();
            while rows > 1 && rows * row_bytes > self.placement.max_buffer() {
                rows /= 2;
            }
        }
        rows
    }

    /// One pass over the rows of one or more sequences, `(slot, ids)`
    /// each, finished as `finish` says: each row's logits (`All`) or each
    /// sequence's last, read back or picked from.
    fn forward_pass(
        &self,
        ctx: &mut Context,
        seqs: &[(usize, &[u32])],
        which: Logits,
        finish: Finish,
    ) -> Result<Finished> {
        let plan = self.placement.plan();
        let (head, tail) = (plan.head_device(), plan.tail_device());
        let embedding = self
            .embedding
            .as_ref()
            .ok_or_else(|| ModelError::Device(format!("a part of {} without its head was given ids", plan.module)))?;
        let client = self.placement.client(head);
        let ids: Vec<u32> = seqs.iter().flat_map(|(_, ids)| ids.iter().copied()).collect();
        // A decode step's ids where the last step picked them on this very
        // device are read there; the others are written to the device.
        let mut hidden = match ctx.picked(&ids) {
            Some(picked) if self.output.is_some() && head == tail => embedding.table.gather_picked(client, picked)?,
            _ => embedding.table.gather(client, &ids)?,
        };
        if let Some(scale) = embedding.scale {
            scale_shift(client, &hidden, scale, 0.0)?;
        }
        if ids.len() > 1 && (ids.len() == seqs.len() || ids.len() <= DECODE_FORM_ROWS) {
            // One row of each of several sequences, or a few of one:
            // shaped so that every matmul computes each row exactly as it
            // would alone.
            hidden = hidden.reshape(&[ids.len(), 1, self.config.hidden_size]);
        }
        self.run_part(ctx, seqs, (hidden, head), which, finish)
    }

    /// Runs a pass's `hidden` rows (on device `here`) through this part's
    /// blocks, then hands them to the next part through the host, or
    /// finishes the pass here.
    fn run_part(
        &self,
        ctx: &mut Context,
        seqs: &[(usize, &[u32])],
        (hidden, here): (Tensor, usize),
        which: Logits,
        finish: Finish,
    ) -> Result<Finished> {
        let c = &self.config;
        let placement = &self.placement;
        let rows = PassRows::for_pass(placement, ctx, seqs, c.sliding_window.unwrap_or(0));
        // Where the pass's positions end: LongRoPE picks its factors by it.
        let end = seqs
            .iter()
            .map(|&(slot, ids)| ctx.len(slot) + ids.len())
            .max()
            .unwrap_or(0);
        let (hidden, here) = placement.run_blocks_from(hidden, here, self.blocks.clone(), |i, _, hidden| {
            let streamed;
            let block = match &self.layers[i] {
                Some(block) => block,
                // Uploaded now into memory the previous streamed block
                // gave back, dropped once it has run.
                None => {
                    streamed = self.upload(|blocks| blocks.load(i))?;
                    &streamed
                }
            };
            let load = |expert, device| self.upload(|blocks| blocks.expert(i, expert, device));
            let fetch = ExpertFetch {
                layer: i,
                load: &load,
                counters: &self.uploads,
                elsewhere: &self.elsewhere.experts,
            };
            block.forward(
                placement,
                c,
                hidden,
                (ctx.layer(i), ctx.rope_tables(c.rope_table(i, end))),
                &rows,
                &fetch,
            )
        })?;
        for (slot, ids) in seqs {
            ctx.advance(*slot, ids.len());
        }
        ctx.keep_rows(rows);
        match &self.elsewhere.next {
            Some(next) if self.output.is_none() => {
                let hidden = HostRows::read(placement.client(here), &hidden)?;
                next.pass(ctx.next_mut()?, seqs, hidden, which, finish)
            }
            _ => self.finish_pass(ctx, seqs, (hidden, here), which, finish),
        }
    }

    /// Finishes a pass whose last block left `hidden` on device `here`:
    /// the norm and output head over each row (`All`) or each sequence's
    /// last, the logits read back or picked from as `finish` says.
    fn finish_pass(
        &self,
        ctx: &mut Context,
        seqs: &[(usize, &[u32])],
        (hidden, mut here): (Tensor, usize),
        which: Logits,
        finish: Finish,
    ) -> Result<Finished> {
        let (c, placement) = (&self.config, &self.placement);
        let Some((norm, lm_head)) = &self.output else {
            let module = &placement.plan().module;
            return Err(ModelError::Device(format!("a part of {module} ends without its tail")));
        };
        let rules = match finish {
            Finish::Nothing => return Ok(Finished::Nothing),
            Finish::Logits => None,
            Finish::Pick(rules) => Some(rules),
        };
        let hidden = placement.hand_over(hidden, &mut here, placement.plan().tail_device());
        let client = placement.client(here);
        // Each row is normed on its own, so the last rows are taken first.
        let mut x = hidden;
        let rows: usize = seqs.iter().map(|(_, ids)| ids.len()).sum();
        if which == Logits::Last && rows > seqs.len() {
            let last = Tensor::empty(client, &[seqs.len(), c.hidden_size]);
            let mut end = 0;
            for (i, (_, seq)) in seqs.iter().enumerate() {
                end += seq.len();
                copy_rows(client, &x, end - 1, &last, i, 1)?;
            }
            x = last;
        }
        let logits = lm_head.forward_input(client, Input::normed(&x, norm, c.rms_norm_eps))?;
        Ok(match rules {
            None => Finished::Logits(read_logits(client, &logits, c.final_softcap)?),
            Some(rules) => Finished::Picks(ctx.pick(client, &logits, c.final_softcap, rules)?),
        })
    }

    /// Runs `ids` through the model after what `slot` holds, in passes of
    /// at most [`Llama::batch_rows`] rows; `finish(rows, last)` says how
    /// to finish each pass of `rows` rows (and whether it is the last).
    /// Returns what each pass gave.
    fn prefill<'r>(
        &self,
        ctx: &mut Context,
        slot: usize,
        ids: &[u32],
        which: Logits,
        mut finish: impl FnMut(usize, bool) -> Finish<'r>,
    ) -> Result<Vec<Finished>> {
        if ids.is_empty() {
            return Err(ModelError::EmptyPrompt);
        }
        self.check(ctx, slot, ids)?;
        let mut rest = ids;
        let mut passes = Vec::new();
        while !rest.is_empty() {
            let rows = self.batch_rows(rest.len(), which);
            let (batch, tail) = rest.split_at(rows);
            passes.push(self.forward_pass(ctx, &[(slot, batch)], which, finish(rows, tail.is_empty()))?);
            rest = tail;
        }
        Ok(passes)
    }

    /// Checks a decode step's `(slot, id)`s: each slot once and in range,
    /// each id fitting its sequence; returns them as a pass's sequences.
    fn decode_rows<'s>(&self, ctx: &Context, steps: &'s [(usize, u32)]) -> Result<Vec<(usize, &'s [u32])>> {
        for (i, &(slot, id)) in steps.iter().enumerate() {
            if slot >= ctx.slots() || steps[..i].iter().any(|&(other, _)| other == slot) {
                return Err(ModelError::Device(format!(
                    "decode step {i} names slot {slot}, which is out of range or taken twice"
                )));
            }
            self.check(ctx, slot, &[id])?;
        }
        Ok(steps
            .iter()
            .map(|(slot, id)| (*slot, std::slice::from_ref(id)))
            .collect())
    }
}

cleave_nn::placed_model!(Llama);

impl<R: Runtime> CausalModel<R> for Llama<R> {
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn max_positions(&self) -> usize {
        self.config.max_positions
    }

    fn new_context_slots(&self, capacity: usize, slots: usize) -> Result<Context> {
        let c = &self.config;
        let mut attends = vec![false; self.placement.devices().len()];
        let kv = (0..c.layers)
            .map(|i| {
                // Another part caches the blocks it runs.
                let shards = match self.blocks.contains(&i) {
                    true => self.block_shards(i),
                    false => Vec::new(),
                };
                shards
                    .into_iter()
                    .map(|(device, kv_heads)| {
                        attends[device] = true;
                        let device = &self.placement.devices()[device];
                        let (rows, cols) = (slots * capacity, kv_heads * c.head_dim);
                        let bytes = (2 * rows * cols * self.cache.bytes()) as u64;
                        device.reserve(bytes, &format!("the KV cache of layer {i}"))?;
                        let ty = self.cache.weight_type();
                        let cache = || kv_cache(&device.client, ty, rows, cols);
                        Ok(device.lasting(|| Ok::<_, KernelError>((cache()?, cache()?)))??)
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        // One table per set of frequencies (Gemma 3's sliding layers and
        // LongRoPE's long factors have their own), on each device that
        // attends.
        let rope = c
            .rope_tables()
            .into_iter()
            .map(|(inv_freq, scale)| {
                let devices = self.placement.devices().iter().zip(&attends);
                devices
                    .map(|(device, &attends)| {
                        let table = || RopeTable::scaled(&device.client, &inv_freq, capacity, scale);
                        attends.then(|| device.lasting(table)).transpose()
                    })
                    .collect()
            })
            .collect::<Result<_>>()?;
        let context = Context::new(kv, rope, capacity, slots);
        match &self.elsewhere.next {
            Some(next) => Ok(context.with_next(next.new_context_slots(capacity, slots)?)),
            None => Ok(context),
        }
    }

    fn forward_slot(&self, ctx: &mut Context, slot: usize, ids: &[u32], which: Logits) -> Result<Vec<f32>> {
        // Only the very last row counts where only the last is asked for.
        let passes = self.prefill(ctx, slot, ids, which, |_, last| match which {
            Logits::All => Finish::Logits,
            Logits::Last if last => Finish::Logits,
            _ => Finish::Nothing,
        })?;
        Ok(passes.into_iter().flat_map(Finished::logits).collect())
    }

    fn forward_pick(&self, ctx: &mut Context, slot: usize, ids: &[u32], rules: &[PickRule]) -> Result<Vec<u32>> {
        let each = match rules.len() {
            1 => false,
            n if n == ids.len() => true,
            n => {
                return Err(ModelError::Device(format!(
                    "a pass over {} ids given {n} pick rules (one, or one per id)",
                    ids.len()
                )))
            }
        };
        let which = if each { Logits::All } else { Logits::Last };
        let mut rest = rules;
        let passes = self.prefill(ctx, slot, ids, which, |rows, last| {
            if each {
                let (now, later) = rest.split_at(rows);
                rest = later;
                Finish::Pick(now)
            } else if last {
                Finish::Pick(rules)
            } else {
                Finish::Nothing
            }
        })?;
        Ok(passes.into_iter().flat_map(Finished::picks).collect())
    }

    fn decode(&self, ctx: &mut Context, steps: &[(usize, u32)]) -> Result<Vec<Vec<f32>>> {
        let rows = self.decode_rows(ctx, steps)?;
        let logits = self.forward_pass(ctx, &rows, Logits::Last, Finish::Logits)?.logits();
        Ok(logits.chunks(self.config.vocab_size).map(<[f32]>::to_vec).collect())
    }

    fn decode_pick(&self, ctx: &mut Context, steps: &[(usize, u32)], rules: &[PickRule]) -> Result<Vec<u32>> {
        if rules.len() != steps.len() {
            return Err(ModelError::Device(format!(
                "a decode step of {} sequences given pick rules for {}",
                steps.len(),
                rules.len()
            )));
        }
        let rows = self.decode_rows(ctx, steps)?;
        Ok(self
            .forward_pass(ctx, &rows, Logits::Last, Finish::Pick(rules))?
            .picks())
    }

    fn bytes_in_use(&self) -> Result<Vec<u64>> {
        Part::bytes_in_use(self)
    }

    fn model_bytes_in_use(&self) -> Result<Vec<u64>> {
        Part::model_bytes_in_use(self)
    }

    fn upload_stats(&self) -> UploadStats {
        Part::upload_stats(self)
    }
}

impl<R: Runtime> LaterPart for Llama<R> {
    fn new_context_slots(&self, capacity: usize, slots: usize) -> Result<Context> {
        CausalModel::new_context_slots(self, capacity, slots)
    }

    fn pass(
        &self,
        ctx: &mut Context,
        seqs: &[(usize, &[u32])],
        hidden: HostRows,
        which: Logits,
        finish: Finish,
    ) -> Result<Finished> {
        let plan = self.placement.plan();
        let here = match (self.blocks.is_empty(), &self.elsewhere.next) {
            (false, _) => plan.device_of_block(self.blocks.start),
            // A part its plan gives no block passes the rows on as they are.
            (true, Some(next)) if self.output.is_none() => {
                for (slot, ids) in seqs {
                    ctx.advance(*slot, ids.len());
                }
                return next.pass(ctx.next_mut()?, seqs, hidden, which, finish);
            }
            (true, _) => plan.tail_device(),
        };
        let hidden = hidden.upload(self.placement.client(here));
        self.run_part(ctx, seqs, (hidden, here), which, finish)
    }
}

impl<R: Runtime> Part for Llama<R> {
    fn upload_stats(&self) -> UploadStats {
        let here = self.uploads.stats();
        self.elsewhere
            .parts()
            .fold(here, |sum, part| sum.plus(&part.upload_stats()))
    }

    fn bytes_in_use(&self) -> Result<Vec<u64>> {
        self.elsewhere
            .after(self.placement.bytes_in_use()?, |part| part.bytes_in_use())
    }

    fn model_bytes_in_use(&self) -> Result<Vec<u64>> {
        self.elsewhere
            .after(self.placement.model_bytes_in_use()?, |part| part.model_bytes_in_use())
    }
}

impl Block {
    fn forward<R: Runtime>(
        &self,
        placement: &Placement<R>,
        c: &ModelConfig,
        hidden: Tensor,
        kv: (&[(Weight, Weight)], &[Option<RopeTable>]),
        rows: &PassRows,
        fetch: &ExpertFetch,
    ) -> Result<Tensor> {
        let attention = c.layer_types.of(self.layer);
        let input = Input::normed(&hidden, &self.input_layernorm, c.rms_norm_eps);
        self.attention
            .add_into(placement, &hidden, input, |i, heads, d, input, store| {
                let pass = HeadsPass::of(placement, kv, rows, attention, (i, d))?;
                heads.forward(placement, d, c, input, pass, store)
            })?;
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
        let out = attention_cached(
            client,
            &q,
            k_cache,
            v_cache,
            shape,
            rows.keys(attention == AttentionType::Sliding)?,
        )?;
        store.project(&self.o, placement, d, &out)
    }
}
