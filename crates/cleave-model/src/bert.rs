//! BERT encoders (`BertModel`): word + position + token-type embeddings,
//! then post-LayerNorm blocks of bidirectional attention and a GELU MLP.
//!
//! Weights are looked up by their Hugging Face names, with or without the
//! `bert.` prefix that task heads add.

use std::path::Path;

use cleave_plan::Plan;
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{activate, add_assign, attention, layer_norm, Activation, AttentionShape, KeyRanges, Tensor};
use serde::Deserialize;

use crate::config::Validator;
use crate::error::{read_json, ModelError, Result};
use crate::placement::{Placed, Placement};
use crate::weights::{Linear, Loader, Matrix};
use crate::Checkpoint;

#[derive(Deserialize)]
struct RawBertConfig {
    architectures: Option<Vec<String>>,
    model_type: Option<String>,
    hidden_size: Option<usize>,
    num_attention_heads: Option<usize>,
    num_hidden_layers: Option<usize>,
    intermediate_size: Option<usize>,
    vocab_size: Option<usize>,
    max_position_embeddings: Option<usize>,
    type_vocab_size: Option<usize>,
    layer_norm_eps: Option<f64>,
    hidden_act: Option<String>,
    position_embedding_type: Option<String>,
}

/// A validated BERT config.
#[derive(Clone, Debug)]
pub struct BertConfig {
    pub hidden_size: usize,
    pub heads: usize,
    pub layers: usize,
    pub intermediate_size: usize,
    pub vocab_size: usize,
    pub max_positions: usize,
    pub type_vocab_size: usize,
    pub layer_norm_eps: f32,
}

impl BertConfig {
    /// Whether config.json describes a BERT encoder.
    pub fn is_bert(path: &Path) -> Result<bool> {
        let raw: RawBertConfig = read_json(path)?;
        let named = raw.architectures.iter().flatten().any(|a| a == "BertModel");
        Ok(named || raw.model_type.as_deref() == Some("bert"))
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        let raw: RawBertConfig = read_json(path)?;
        let check = Validator { path };
        let error = |field: &'static str, reason: String| check.error(field, reason);
        let positive = |value: Option<usize>, field: &'static str| check.positive(value, field);
        if let Some(act) = raw.hidden_act.as_deref().filter(|a| *a != "gelu") {
            return Err(error(
                "hidden_act",
                format!("'{act}' is not supported (supported: gelu)"),
            ));
        }
        if let Some(kind) = raw.position_embedding_type.as_deref().filter(|k| *k != "absolute") {
            return Err(error(
                "position_embedding_type",
                format!("'{kind}' is not supported (supported: absolute)"),
            ));
        }
        let hidden_size = positive(raw.hidden_size, "hidden_size")?;
        let heads = positive(raw.num_attention_heads, "num_attention_heads")?;
        if hidden_size % heads != 0 {
            return Err(error(
                "num_attention_heads",
                format!("{heads} does not divide hidden_size ({hidden_size})"),
            ));
        }
        Ok(BertConfig {
            hidden_size,
            heads,
            layers: positive(raw.num_hidden_layers, "num_hidden_layers")?,
            intermediate_size: positive(raw.intermediate_size, "intermediate_size")?,
            vocab_size: positive(raw.vocab_size, "vocab_size")?,
            max_positions: positive(raw.max_position_embeddings, "max_position_embeddings")?,
            type_vocab_size: raw.type_vocab_size.unwrap_or(2).max(1),
            layer_norm_eps: raw.layer_norm_eps.unwrap_or(1e-12) as f32,
        })
    }

    /// Bytes (f32) of the embeddings, of one block, and the compute
    /// estimate for a batch of `tokens` packed tokens.
    pub(crate) fn bytes(&self) -> (u64, u64, u64) {
        let (h, i) = (self.hidden_size, self.intermediate_size);
        let embed = (self.vocab_size + self.max_positions + self.type_vocab_size) * h + 2 * h;
        let block = 4 * h * h + 4 * h + 2 * h * i + i + h + 4 * h;
        let tokens = MAX_BATCH_TOKENS;
        let compute = tokens * (6 * h + i) + self.heads * tokens * tokens;
        let f32s = |n: usize| (n * size_of::<f32>()) as u64;
        (f32s(embed), f32s(block), f32s(compute))
    }
}

/// Most tokens one forward pass packs together.
pub(crate) const MAX_BATCH_TOKENS: usize = 512;

/// `nn.LayerNorm` with weight and bias (BERT, CLIP).
pub(crate) struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
}

impl LayerNorm {
    pub(crate) fn load<R: Runtime>(loader: &mut Loader<R>, device: usize, prefix: &str, size: usize) -> Result<Self> {
        Ok(LayerNorm {
            weight: loader.vector(device, &format!("{prefix}.weight"), size)?,
            bias: loader.vector(device, &format!("{prefix}.bias"), size)?,
        })
    }

    pub(crate) fn forward<R: Runtime>(&self, client: &ComputeClient<R>, x: &Tensor, eps: f32) -> Result<Tensor> {
        Ok(layer_norm(client, x, &self.weight, &self.bias, eps)?)
    }
}

struct BertLayer {
    query: Linear,
    key: Linear,
    value: Linear,
    attention_output: Linear,
    attention_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_norm: LayerNorm,
}

/// A BERT encoder on a device group, split by layers as its plan says.
pub struct Bert<R: Runtime> {
    placement: Placement<R>,
    config: BertConfig,
    word_embeddings: Matrix,
    position_embeddings: Matrix,
    token_type_embeddings: Matrix,
    embeddings_norm: LayerNorm,
    layers: Vec<BertLayer>,
}

impl<R: Runtime> Bert<R> {
    pub fn load(
        devices: Vec<Placed<R>>,
        plan: Plan,
        config: &BertConfig,
        checkpoint: &Checkpoint,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Self> {
        let c = config;
        let (h, i) = (c.hidden_size, c.intermediate_size);
        let mut loader = Loader::new(&devices, checkpoint, progress);
        let prefix = if checkpoint.contains("bert.embeddings.word_embeddings.weight") {
            "bert."
        } else {
            ""
        };
        let head = plan.head_device();
        let e = format!("{prefix}embeddings");
        let word_embeddings = loader.matrix(head, &format!("{e}.word_embeddings.weight"), c.vocab_size, h)?;
        let position_embeddings =
            loader.matrix(head, &format!("{e}.position_embeddings.weight"), c.max_positions, h)?;
        let token_type_embeddings =
            loader.matrix(head, &format!("{e}.token_type_embeddings.weight"), c.type_vocab_size, h)?;
        let embeddings_norm = LayerNorm::load(&mut loader, head, &format!("{e}.LayerNorm"), h)?;
        let layers = (0..c.layers)
            .map(|l| {
                let d = plan.device_of_block(l);
                let p = format!("{prefix}encoder.layer.{l}");
                Ok(BertLayer {
                    query: loader.linear(d, &format!("{p}.attention.self.query"), h, h, true)?,
                    key: loader.linear(d, &format!("{p}.attention.self.key"), h, h, true)?,
                    value: loader.linear(d, &format!("{p}.attention.self.value"), h, h, true)?,
                    attention_output: loader.linear(d, &format!("{p}.attention.output.dense"), h, h, true)?,
                    attention_norm: LayerNorm::load(&mut loader, d, &format!("{p}.attention.output.LayerNorm"), h)?,
                    intermediate: loader.linear(d, &format!("{p}.intermediate.dense"), i, h, true)?,
                    output: loader.linear(d, &format!("{p}.output.dense"), h, i, true)?,
                    output_norm: LayerNorm::load(&mut loader, d, &format!("{p}.output.LayerNorm"), h)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Bert {
            placement: Placement::new(devices, plan),
            config: c.clone(),
            word_embeddings,
            position_embeddings,
            token_type_embeddings,
            embeddings_norm,
            layers,
        })
    }

    pub fn placement(&self) -> &Placement<R> {
        &self.placement
    }

    /// The last hidden state of each sequence (`[len, hidden]`, flattened).
    /// Sequences are packed into batches without padding; each attends only
    /// to itself, so the result is the same whatever they are batched with.
    pub fn forward(&self, sequences: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        let mut out = Vec::with_capacity(sequences.len());
        let mut start = 0;
        while start < sequences.len() {
            let mut end = start + 1;
            let mut tokens = sequences[start].len();
            while end < sequences.len() && tokens + sequences[end].len() <= MAX_BATCH_TOKENS {
                tokens += sequences[end].len();
                end += 1;
            }
            out.extend(self.forward_packed(&sequences[start..end])?);
            start = end;
        }
        Ok(out)
    }

    fn forward_packed(&self, sequences: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        let c = &self.config;
        let (placement, plan) = (&self.placement, self.placement.plan());
        let mut ids = Vec::new();
        let mut positions = Vec::new();
        let mut segments = Vec::new();
        for seq in sequences {
            if seq.is_empty() {
                return Err(ModelError::EmptyPrompt);
            }
            if seq.len() > c.max_positions {
                return Err(ModelError::PromptTooLong {
                    tokens: seq.len(),
                    context: c.max_positions,
                    max: c.max_positions,
                });
            }
            if let Some(&id) = seq.iter().find(|&&id| id as usize >= c.vocab_size) {
                return Err(ModelError::TokenId {
                    id,
                    vocab: c.vocab_size,
                });
            }
            let start = ids.len() as u32;
            ids.extend(seq);
            positions.extend(0..seq.len() as u32);
            segments.extend(std::iter::repeat_n((start, start + seq.len() as u32), seq.len()));
        }
        let mut here = plan.head_device();
        let client = placement.client(here);
        let hidden = self.word_embeddings.gather(client, &ids)?;
        add_assign(client, &hidden, &self.position_embeddings.gather(client, &positions)?)?;
        // Single-sentence inputs: every token is of type 0.
        add_assign(
            client,
            &hidden,
            &self.token_type_embeddings.gather(client, &vec![0; ids.len()])?,
        )?;
        let mut hidden = self.embeddings_norm.forward(client, &hidden, c.layer_norm_eps)?;
        // Each row attends within its own sequence: the ranges go to each
        // device the blocks run on, once.
        let mut ranges = KeyRanges::new(client, &segments);
        for (l, layer) in self.layers.iter().enumerate() {
            let device = plan.device_of_block(l);
            if device != here {
                ranges = KeyRanges::new(placement.client(device), &segments);
            }
            hidden = placement.hand_over(hidden, &mut here, device);
            hidden = layer.forward(placement.client(device), c, &hidden, &ranges)?;
        }
        let values = hidden.to_vec(placement.client(here))?;
        let mut rest = values.as_slice();
        Ok(sequences
            .iter()
            .map(|seq| {
                let (mine, tail) = rest.split_at(seq.len() * c.hidden_size);
                rest = tail;
                mine.to_vec()
            })
            .collect())
    }
}

impl BertLayer {
    fn forward<R: Runtime>(
        &self,
        client: &ComputeClient<R>,
        c: &BertConfig,
        x: &Tensor,
        ranges: &KeyRanges,
    ) -> Result<Tensor> {
        let q = self.query.forward(client, x)?;
        let k = self.key.forward(client, x)?;
        let v = self.value.forward(client, x)?;
        let head_dim = c.hidden_size / c.heads;
        let shape = AttentionShape {
            heads: c.heads,
            kv_heads: c.heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
        };
        let context = attention(client, &q, &k, &v, shape, ranges, None)?;
        let attended = self.attention_output.forward(client, &context)?;
        add_assign(client, &attended, x)?;
        let x = self.attention_norm.forward(client, &attended, c.layer_norm_eps)?;
        let inner = self.intermediate.forward(client, &x)?;
        activate(client, &inner, Activation::Gelu)?;
        let out = self.output.forward(client, &inner)?;
        add_assign(client, &out, &x)?;
        self.output_norm.forward(client, &out, c.layer_norm_eps)
    }
}
