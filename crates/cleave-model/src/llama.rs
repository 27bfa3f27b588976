//! The Llama family (Llama, Mistral, Qwen2): pre-norm decoder blocks with
//! rotary grouped-query attention and a SiLU-gated MLP.
//!
//! Weights are looked up by their Hugging Face names, as published.

use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{
    add_assign, attention, copy_rows, rms_norm, rope, silu_mul, AttentionShape, Mask, RopeTable, Tensor,
};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::placement::{Placed, Placement};
use crate::weights::{Linear, Loader, Matrix};
use crate::{CausalLm, ModelDir};
use cleave_plan::Plan;

/// Most prompt tokens one forward pass takes; longer prompts go in pieces.
const MAX_BATCH_ROWS: usize = 512;

struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
}

struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
}

struct Block {
    input_layernorm: Tensor,
    self_attn: Attention,
    post_attention_layernorm: Tensor,
    mlp: Mlp,
}

/// A Llama-family model on a device group, split by layers as `plan` says:
/// the embeddings with the first block, the final norm and output head with
/// the last, every block (and its KV cache) on its own device.
pub struct Llama<R: Runtime> {
    placement: Placement<R>,
    config: ModelConfig,
    embed_tokens: Matrix,
    layers: Vec<Block>,
    norm: Tensor,
    lm_head: Linear,
}

/// The KV cache of one sequence, each layer's beside its layer, and the
/// rotary table of every device that runs blocks.
pub struct Context {
    kv: Vec<(Tensor, Tensor)>,
    rope: Vec<Option<RopeTable>>,
    capacity: usize,
    len: usize,
}

/// Which rows of logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    Last,
    All,
}

impl<R: Runtime> Llama<R> {
    /// Uploads the weights of `model` to `devices` as `plan` places them;
    /// `progress` is told the checkpoint bytes read after each tensor.
    pub fn load(devices: Vec<Placed<R>>, plan: Plan, model: &ModelDir, progress: &mut dyn FnMut(u64)) -> Result<Self> {
        let c = &model.config;
        let mut loader = Loader::new(&devices, &model.checkpoint, progress);
        let (h, q, kv) = (c.hidden_size, c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let (head, tail) = (plan.head_device(), plan.tail_device());
        let embed_tokens = loader.matrix(head, "model.embed_tokens.weight", c.vocab_size, h)?;
        let layers = (0..c.layers)
            .map(|i| {
                let d = plan.device_of_block(i);
                let p = format!("model.layers.{i}");
                Ok(Block {
                    input_layernorm: loader.vector(d, &format!("{p}.input_layernorm.weight"), h)?,
                    self_attn: Attention {
                        q: loader.linear(d, &format!("{p}.self_attn.q_proj"), q, h, c.qkv_bias)?,
                        k: loader.linear(d, &format!("{p}.self_attn.k_proj"), kv, h, c.qkv_bias)?,
                        v: loader.linear(d, &format!("{p}.self_attn.v_proj"), kv, h, c.qkv_bias)?,
                        o: loader.linear(d, &format!("{p}.self_attn.o_proj"), h, q, c.o_bias)?,
                    },
                    post_attention_layernorm: loader.vector(d, &format!("{p}.post_attention_layernorm.weight"), h)?,
                    mlp: Mlp {
                        gate: loader.linear(d, &format!("{p}.mlp.gate_proj"), c.intermediate_size, h, c.mlp_bias)?,
                        up: loader.linear(d, &format!("{p}.mlp.up_proj"), c.intermediate_size, h, c.mlp_bias)?,
                        down: loader.linear(d, &format!("{p}.mlp.down_proj"), h, c.intermediate_size, c.mlp_bias)?,
                    },
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = loader.vector(tail, "model.norm.weight", h)?;
        let lm_head = if model.ties_output_head() {
            if head == tail {
                Linear {
                    weight: embed_tokens.clone(),
                    bias: None,
                }
            } else {
                // The tied head lives with the embeddings; the tail's device
                // gets its own copy of the same tensor.
                loader.linear(tail, "model.embed_tokens", c.vocab_size, h, false)?
            }
        } else {
            loader.linear(tail, "lm_head", c.vocab_size, h, false)?
        };
        Ok(Llama {
            placement: Placement::new(devices, plan),
            config: c.clone(),
            embed_tokens,
            layers,
            norm,
            lm_head,
        })
    }

    pub fn placement(&self) -> &Placement<R> {
        &self.placement
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// An empty KV cache for `capacity` positions, each layer's on the
    /// device of its layer.
    pub fn new_context(&self, capacity: usize) -> Result<Context> {
        let c = &self.config;
        let shape = [capacity, c.kv_heads * c.head_dim];
        let kv_bytes = (2 * capacity * c.kv_heads * c.head_dim * size_of::<f32>()) as u64;
        let kv = (0..c.layers)
            .map(|i| {
                let device = &self.placement.devices()[self.placement.plan().device_of_block(i)];
                device.reserve(kv_bytes, &format!("the KV cache of layer {i}"))?;
                let client = &device.client;
                Ok((Tensor::empty(client, &shape), Tensor::empty(client, &shape)))
            })
            .collect::<Result<Vec<_>>>()?;
        let inv_freq = c.inv_freq();
        let rope = self
            .placement
            .plan()
            .devices
            .iter()
            .zip(self.placement.devices())
            .map(|(planned, device)| {
                (!planned.blocks.is_empty()).then(|| RopeTable::new(&device.client, &inv_freq, capacity))
            })
            .collect();
        Ok(Context {
            kv,
            rope,
            capacity,
            len: 0,
        })
    }

    /// Runs `ids` through the model after what `ctx` holds, appends them to
    /// its cache, and returns the logits of the last or of every position
    /// (`[rows][vocab]`, flattened).
    pub fn forward(&self, ctx: &mut Context, ids: &[u32], which: Logits) -> Result<Vec<f32>> {
        if ids.is_empty() {
            return Err(ModelError::EmptyPrompt);
        }
        if ctx.len + ids.len() > ctx.capacity {
            return Err(ModelError::PromptTooLong {
                tokens: ctx.len + ids.len(),
                context: ctx.capacity,
                max: self.config.max_positions,
            });
        }
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.config.vocab_size) {
            return Err(ModelError::TokenId {
                id,
                vocab: self.config.vocab_size,
            });
        }
        let mut logits = Vec::new();
        let mut rest = ids;
        while !rest.is_empty() {
            let rows = self.batch_rows(ctx.len, rest.len());
            let (batch, tail) = rest.split_at(rows);
            let which = if tail.is_empty() { which } else { Logits::All };
            let batch_logits = self.forward_batch(ctx, batch, which)?;
            if which == Logits::All {
                logits.extend(batch_logits);
            } else {
                logits = batch_logits;
            }
            rest = tail;
        }
        if which == Logits::Last {
            let vocab = self.config.vocab_size;
            logits.drain(..logits.len() - vocab);
        }
        Ok(logits)
    }

    /// How many of `remaining` tokens the next pass takes: the attention
    /// scores of a pass (`heads × rows × keys` floats) must fit one buffer.
    fn batch_rows(&self, pos0: usize, remaining: usize) -> usize {
        let mut rows = remaining.min(MAX_BATCH_ROWS);
        let score_bytes = |rows: usize| self.config.heads * rows * (pos0 + rows) * size_of::<f32>();
        while rows > 1 && score_bytes(rows) > self.placement.max_buffer() {
            rows /= 2;
        }
        rows
    }

    fn forward_batch(&self, ctx: &mut Context, ids: &[u32], which: Logits) -> Result<Vec<f32>> {
        let c = &self.config;
        let (placement, plan) = (&self.placement, self.placement.plan());
        let pos0 = ctx.len;
        let mut here = plan.head_device();
        let mut hidden = self.embed_tokens.gather(placement.client(here), ids)?;
        for (i, (block, (k_cache, v_cache))) in self.layers.iter().zip(&ctx.kv).enumerate() {
            let device = plan.device_of_block(i);
            hidden = placement.hand_over(hidden, &mut here, device);
            let rope = ctx.rope[device]
                .as_ref()
                .ok_or_else(|| ModelError::Device(format!("no rotary table on device {device}")))?;
            hidden = block.forward(placement.client(device), c, hidden, k_cache, v_cache, rope, pos0)?;
        }
        ctx.len += ids.len();
        hidden = placement.hand_over(hidden, &mut here, plan.tail_device());
        let client = placement.client(here);
        let mut x = rms_norm(client, &hidden, &self.norm, c.rms_norm_eps)?;
        if which == Logits::Last && ids.len() > 1 {
            let last = Tensor::empty(client, &[1, c.hidden_size]);
            copy_rows(client, &x, ids.len() - 1, &last, 0, 1)?;
            x = last;
        }
        Ok(self.lm_head.forward(client, &x)?.to_vec(client)?)
    }
}

impl Block {
    #[allow(clippy::too_many_arguments)]
    fn forward<R: Runtime>(
        &self,
        client: &ComputeClient<R>,
        c: &ModelConfig,
        hidden: Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        rope_table: &RopeTable,
        pos0: usize,
    ) -> Result<Tensor> {
        let x = rms_norm(client, &hidden, &self.input_layernorm, c.rms_norm_eps)?;
        let attn = self
            .self_attn
            .forward(client, c, &x, k_cache, v_cache, rope_table, pos0)?;
        add_assign(client, &hidden, &attn)?;
        let x = rms_norm(client, &hidden, &self.post_attention_layernorm, c.rms_norm_eps)?;
        let mlp = self.mlp.forward(client, &x)?;
        add_assign(client, &hidden, &mlp)?;
        Ok(hidden)
    }
}

impl Attention {
    #[allow(clippy::too_many_arguments)]
    fn forward<R: Runtime>(
        &self,
        client: &ComputeClient<R>,
        c: &ModelConfig,
        x: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        rope_table: &RopeTable,
        pos0: usize,
    ) -> Result<Tensor> {
        let rows = x.rows();
        let q = self.q.forward(client, x)?;
        let k = self.k.forward(client, x)?;
        let v = self.v.forward(client, x)?;
        rope(client, &q, rope_table, c.heads, pos0)?;
        rope(client, &k, rope_table, c.kv_heads, pos0)?;
        copy_rows(client, &k, 0, k_cache, pos0, rows)?;
        copy_rows(client, &v, 0, v_cache, pos0, rows)?;
        let shape = AttentionShape {
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
        };
        let mask = Mask::Causal {
            pos0,
            window: c.sliding_window.unwrap_or(0),
        };
        let out = attention(client, &q, k_cache, v_cache, shape, mask)?;
        self.o.forward(client, &out)
    }
}

impl Mlp {
    fn forward<R: Runtime>(&self, client: &ComputeClient<R>, x: &Tensor) -> Result<Tensor> {
        let gate = self.gate.forward(client, x)?;
        let up = self.up.forward(client, x)?;
        self.down.forward(client, &silu_mul(client, &gate, &up)?)
    }
}

/// A model and one sequence's context: what the generation loop drives.
pub struct Session<'m, R: Runtime> {
    model: &'m Llama<R>,
    context: Context,
}

impl<'m, R: Runtime> Session<'m, R> {
    pub fn new(model: &'m Llama<R>, capacity: usize) -> Result<Self> {
        Ok(Session {
            context: model.new_context(capacity)?,
            model,
        })
    }
}

impl<R: Runtime> CausalLm for Session<'_, R> {
    fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }

    fn capacity(&self) -> usize {
        self.context.capacity
    }

    fn max_positions(&self) -> usize {
        self.model.config.max_positions
    }

    fn forward(&mut self, ids: &[u32], which: Logits) -> Result<Vec<f32>> {
        self.model.forward(&mut self.context, ids, which)
    }
}
