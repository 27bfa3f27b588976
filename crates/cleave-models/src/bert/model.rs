//! A BERT encoder on a device group. Weights are looked up by their
//! Hugging Face names, with or without the `bert.` prefix that task heads
//! add.

use std::path::Path;

use cleave_hf::{read_json, Checkpoint, Validator};
use cleave_nn::{check_ids, Bias, LayerNorm, Linear, Loader, Matrix, PerDevice, Placed, Placement, Result, Weights};
use cleave_plan::Plan;
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{activate, add_assign, attention, Activation, AttentionShape, KeyRanges, Tensor};
use serde::Deserialize;

#[derive(Deserialize)]
struct RawBertConfig {
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
    pub fn from_file(path: &Path) -> cleave_hf::Result<Self> {
        let raw: RawBertConfig = read_json(path)?;
        let check = Validator { path };
        let positive = |value: Option<usize>, field: &'static str| check.positive(value, field);
        check.supported("hidden_act", raw.hidden_act.as_deref().unwrap_or("gelu"), &["gelu"])?;
        check.supported(
            "position_embedding_type",
            raw.position_embedding_type.as_deref().unwrap_or("absolute"),
            &["absolute"],
        )?;
        let hidden_size = positive(raw.hidden_size, "hidden_size")?;
        let heads = positive(raw.num_attention_heads, "num_attention_heads")?;
        check.divides("num_attention_heads", heads, "hidden_size", hidden_size)?;
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

    /// Bytes of the embeddings and of each block as the loader puts the
    /// checkpoint's tensors on a device, and the compute estimate for a
    /// batch of packed tokens.
    pub(crate) fn bytes(&self, checkpoint: &Checkpoint) -> (u64, Vec<u64>, u64) {
        let (h, i) = (self.hidden_size, self.intermediate_size);
        let root = if checkpoint.contains("bert.embeddings.word_embeddings.weight") {
            "bert."
        } else {
            ""
        };
        let bytes = |name: &str| checkpoint.device_bytes(&format!("{root}{name}"));
        let blocks = (0..self.layers).map(|l| bytes(&format!("encoder.layer.{l}"))).collect();
        let tokens = MAX_BATCH_TOKENS;
        let compute = tokens * (6 * h + i);
        (bytes("embeddings"), blocks, (compute * size_of::<f32>()) as u64)
    }
}

/// Most tokens one forward pass packs together.
pub(crate) const MAX_BATCH_TOKENS: usize = 512;

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

cleave_nn::placed_model!(Bert);

impl<R: Runtime> Bert<R> {
    pub fn load(
        devices: Vec<Placed<R>>,
        plan: Plan,
        config: &BertConfig,
        checkpoint: &Checkpoint,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Self> {
        let c = config;
        let h = c.hidden_size;
        let loader = Loader::new(&devices, checkpoint, progress);
        let root = loader
            .weights(plan.head_device())
            .pp_if_stored("bert", "embeddings.word_embeddings.weight");
        let e = root.pp("embeddings");
        let word_embeddings = e.matrix("word_embeddings.weight", c.vocab_size, h)?;
        let position_embeddings = e.matrix("position_embeddings.weight", c.max_positions, h)?;
        let token_type_embeddings = e.matrix("token_type_embeddings.weight", c.type_vocab_size, h)?;
        let embeddings_norm = LayerNorm::load(e.pp("LayerNorm"), h, c.layer_norm_eps)?;
        let layers = (0..c.layers)
            .map(|l| BertLayer::load(root.pp("encoder.layer").pp(l).on(plan.device_of_block(l)), c))
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
            check_ids(seq, c.vocab_size, c.max_positions)?;
            let start = ids.len() as u32;
            ids.extend(seq);
            positions.extend(0..seq.len() as u32);
            segments.extend(std::iter::repeat_n((start, start + seq.len() as u32), seq.len()));
        }
        let client = placement.client(plan.head_device());
        let hidden = self.word_embeddings.gather(client, &ids)?;
        add_assign(client, &hidden, &self.position_embeddings.gather(client, &positions)?)?;
        // Single-sentence inputs: every token is of type 0.
        add_assign(
            client,
            &hidden,
            &self.token_type_embeddings.gather(client, &vec![0; ids.len()])?,
        )?;
        let hidden = self.embeddings_norm.forward(client, &hidden)?;
        // Each row attends within its own sequence.
        let ranges = PerDevice::new(placement, |device| {
            Ok(KeyRanges::new(placement.client(device), &segments))
        });
        let (hidden, here) = placement.run_blocks(hidden, self.layers.len(), |l, device, hidden| {
            self.layers[l].forward(placement.client(device), c, &hidden, ranges.get(device)?)
        })?;
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
    fn load<R: Runtime>(w: Weights<R>, c: &BertConfig) -> Result<Self> {
        let (h, i, eps) = (c.hidden_size, c.intermediate_size, c.layer_norm_eps);
        let attention = w.pp("attention");
        Ok(BertLayer {
            query: attention.linear("self.query", h, h, Bias::Yes)?,
            key: attention.linear("self.key", h, h, Bias::Yes)?,
            value: attention.linear("self.value", h, h, Bias::Yes)?,
            attention_output: attention.linear("output.dense", h, h, Bias::Yes)?,
            attention_norm: LayerNorm::load(attention.pp("output.LayerNorm"), h, eps)?,
            intermediate: w.linear("intermediate.dense", i, h, Bias::Yes)?,
            output: w.linear("output.dense", h, i, Bias::Yes)?,
            output_norm: LayerNorm::load(w.pp("output.LayerNorm"), h, eps)?,
        })
    }

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
        let shape = AttentionShape::new(c.heads, c.heads, c.hidden_size / c.heads);
        let context = attention(client, &q, &k, &v, shape, ranges, None)?;
        let attended = self.attention_output.forward(client, &context)?;
        add_assign(client, &attended, x)?;
        let x = self.attention_norm.forward(client, &attended)?;
        let inner = self.intermediate.forward(client, &x)?;
        activate(client, &inner, Activation::Gelu)?;
        let out = self.output.forward(client, &inner)?;
        add_assign(client, &out, &x)?;
        self.output_norm.forward(client, &out)
    }
}
