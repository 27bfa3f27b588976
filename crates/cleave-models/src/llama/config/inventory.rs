//! What the planner sees of a model: each block's geometry and bytes, the
//! KV cache per position, the modules' inventory.

use cleave_hf::Checkpoint;
use cleave_nn::CacheType;
use cleave_plan::{BlockGeometry, Inventory, Matmul};
use cleave_shaders::{attention_partials_bytes, ProductPath, WeightType};

use super::names::{block_weight, weight, EMBEDDINGS, OUTPUT_HEAD, PER_LAYER_EMBEDDINGS, PER_LAYER_PROJECTION};
use super::{MatmulTensor, MlpTensors, ModelConfig};

/// The bytes a device gives a small buffer at least: wgpu's (lavapipe's)
/// allocations are whole multiples of 32 bytes. A vector of a published
/// model is one already; a tiny model's router bias or sinks (4 floats)
/// takes twice its size.
const BUFFER_GRANULE: u64 = 32;

impl ModelConfig {
    /// A block's matmul weights that row and tensor split divide, named as
    /// inside `model.layers.N`, and its heads. `checkpoint` says how many
    /// bytes each weight's rows take in every block.
    pub fn block_geometry(&self, checkpoint: &Checkpoint) -> BlockGeometry {
        let first = self.attention_layer();
        let attention = self.attention_tensors(first);
        // Attention's tensors are in the attention layers only (a hybrid
        // model's Gated DeltaNet layers have their own, kept whole).
        let in_layer =
            |m: &MatmulTensor, layer: usize| !(self.is_linear(layer) && attention.matmuls().any(|t| t.name == m.name));
        let divided = |m: &MatmulTensor| {
            m.role.map(|role| Matmul {
                name: m.name.clone(),
                role,
                rows: m.rows,
                cols: m.cols,
                bias: m.bias,
                row_bytes_over_blocks: (0..self.layers)
                    .filter(|&layer| in_layer(m, layer))
                    .map(|layer| checkpoint.matrix_bytes(&block_weight(layer, &m.name), 1, m.cols))
                    .fold(0, u64::saturating_add),
                block_len: (0..self.layers)
                    .filter_map(|layer| checkpoint.dtype(&block_weight(layer, &m.name)))
                    .map(|dtype| dtype.block_len())
                    .max()
                    .unwrap_or(1),
            })
        };
        BlockGeometry {
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            intermediate: self.intermediate_size,
            // Row and tensor split divide attention layers' tensors only (a
            // Gated DeltaNet's are kept whole beside its block).
            matmuls: self
                .block_matmuls(self.attention_layer())
                .iter()
                .filter_map(divided)
                .collect(),
            per_head_shard_bytes: if self.qk_norm {
                (2 * self.head_dim * size_of::<f32>()) as u64
            } else {
                0
            },
            experts: self.experts.map_or(0, |e| e.count),
            expert_bytes_over_blocks: self.expert_bytes_over_blocks(checkpoint),
            linear_blocks: (0..self.layers).filter(|&l| self.is_linear(l)).count(),
            uneven_blocks: (0..self.layers)
                .filter(|&l| !self.is_linear(l))
                .filter(|&l| self.heads_of(l) != self.heads_of(first) || self.shares_kv(l))
                .count(),
        }
    }

    /// Every matmul weight of block `layer`: attention's (or its Gated
    /// DeltaNet's), the router's, then the MLP's or each expert's and the
    /// shared expert's, then the per-layer input's.
    fn block_matmuls(&self, layer: usize) -> Vec<MatmulTensor> {
        let per_layer = self.per_layer_input_tensors();
        let mixer = self.mixer_matmuls(layer);
        let (router, mlps, shared) = (self.router_tensor(), self.mlps(layer), self.shared_expert_tensors());
        let mlps = mlps.iter().flat_map(MlpTensors::all);
        let shared = shared.iter().flat_map(|s| s.mlp.all().into_iter().chain([&s.gate]));
        let per_layer = per_layer.iter().flat_map(|p| [&p.gate, &p.projection]);
        let matmuls = mixer.iter().chain(&router).chain(mlps).chain(shared);
        matmuls.chain(per_layer).cloned().collect()
    }

    /// An attention layer: the first (0 in a model without linear ones).
    fn attention_layer(&self) -> usize {
        (0..self.layers).find(|&l| !self.is_linear(l)).unwrap_or(0)
    }

    /// Bytes of block `layer`'s norms, biases and small tensors, in f32,
    /// each in whole [`BUFFER_GRANULE`]s as the device allocates it.
    fn block_vector_bytes(&self, layer: usize, matmuls: &[MatmulTensor]) -> u64 {
        let norms = self.block_norm_tensors();
        let mixer_norms = self.mixer_norms(layer);
        let norm_values = norms.iter().chain(&mixer_norms).map(|n| n.len);
        // Gemma 4's router's input norm (its experts' scales and its layer
        // scalar are read to the host).
        let beside = self.beside_mlp_tensors().map(|_| self.hidden_size);
        let bias_values = matmuls.iter().filter(|m| m.bias).map(|m| m.rows);
        // A Gated DeltaNet's convolution, `A_log` and `dt_bias`.
        let linear = self.linear_attention.filter(|_| self.is_linear(layer)).map(|l| {
            let values = l.heads.value_heads;
            [l.heads.qkv_width() * l.conv_taps, values, values]
        });
        let sinks = (self.attention_sinks && !self.is_linear(layer)).then_some(self.heads);
        norm_values
            .chain(bias_values)
            .chain(linear.into_iter().flatten())
            .chain(beside)
            .chain(sinks)
            .map(|values| (values as u64).saturating_mul(4).next_multiple_of(BUFFER_GRANULE))
            .fold(0, u64::saturating_add)
    }

    /// Bytes of Gemma 4's per-layer input table, projection and norm,
    /// which make every layer's inputs at once beside the embeddings (0
    /// in a model without them).
    pub fn per_layer_input_bytes(&self, checkpoint: &Checkpoint) -> u64 {
        self.per_layer_inputs.map_or(0, |p| {
            let all = self.layers.saturating_mul(p.width);
            let table = checkpoint.matrix_bytes(&weight(PER_LAYER_EMBEDDINGS), p.vocab, all);
            let projection = checkpoint.matrix_bytes(&weight(PER_LAYER_PROJECTION), all, self.hidden_size);
            let norm = (p.width as u64 * 4).next_multiple_of(BUFFER_GRANULE);
            table.saturating_add(projection).saturating_add(norm)
        })
    }

    /// Bytes of one sequence's recurrent state in a Gated DeltaNet layer
    /// (its convolution's window and its delta rule's state, in f32); 0 in
    /// a model without such layers.
    pub fn recurrent_state_bytes(&self) -> usize {
        self.linear_attention.map_or(0, |l| {
            let window = (l.conv_taps - 1) * l.heads.qkv_width();
            (window + l.heads.state_len()) * size_of::<f32>()
        })
    }

    /// Bytes of the largest expert summed over every block, as `checkpoint`
    /// stores its matrices (biases in f32); 0 for a dense model.
    fn expert_bytes_over_blocks(&self, checkpoint: &Checkpoint) -> u64 {
        let Some(experts) = self.experts else { return 0 };
        (0..experts.count)
            .map(|expert| {
                (0..self.layers)
                    .flat_map(|layer| {
                        self.mlp_tensors(layer, expert).all().map(|m| {
                            let name = block_weight(layer, &m.name);
                            let bias = if m.bias { m.rows * size_of::<f32>() } else { 0 };
                            checkpoint
                                .matrix_bytes(&name, m.rows, m.cols)
                                .saturating_add(bias as u64)
                        })
                    })
                    .fold(0, u64::saturating_add)
            })
            .max()
            .unwrap_or(0)
    }

    /// What the planner needs to place the `llm` module with a KV cache for
    /// `sequences` sequences of `context` positions each: bytes on a device
    /// of each part, matrices as `checkpoint` stores them (f32, 16-bit or
    /// quantized) and vectors in f32. `tied`: the output head is the
    /// embedding table (counted once where head and tail share a device).
    pub fn inventory(
        &self,
        context: usize,
        sequences: usize,
        tied: bool,
        checkpoint: &Checkpoint,
        cache: CacheType,
    ) -> Inventory {
        // In u128, so that no context or vocabulary a flag or a file asks
        // for wraps around: a byte count past u64 saturates, and the plan
        // then says it does not fit.
        let f32_bytes = |elements: u128| u64::try_from(elements * 4).unwrap_or(u64::MAX);
        let (h, q, kv, i) = self.widest();
        let geometry = self.block_geometry(checkpoint);
        let (hu, qu, kvu, iu) = (h as u128, q as u128, kv as u128, i as u128);
        let (context, sequences) = (context as u128, sequences as u128);
        let head_dim = self.full_heads.map_or(self.head_dim, |f| f.head_dim.max(self.head_dim));
        let vocab = self.vocab_size as u128;
        // Matrices as stored; norms, biases and small tensors in f32.
        let block_bytes = (0..self.layers)
            .map(|layer| {
                let matmuls = self.block_matmuls(layer);
                matmuls
                    .iter()
                    .map(|m| checkpoint.matrix_bytes(&block_weight(layer, &m.name), m.rows, m.cols))
                    .fold(self.block_vector_bytes(layer, &matmuls), u64::saturating_add)
            })
            .collect();
        let embed = checkpoint.matrix_bytes(&weight(EMBEDDINGS), self.vocab_size, h);
        let per_layer = self.per_layer_input_bytes(checkpoint);
        let per_layer_rows = self
            .per_layer_inputs
            .map_or(0, |p| 3 * (self.layers as u128) * p.width as u128);
        let head = if tied {
            embed
        } else {
            checkpoint.matrix_bytes(&weight(OUTPUT_HEAD), self.vocab_size, h)
        };
        // One prefill batch: hidden states, q/k/v, the MLP's three
        // intermediates (attention writes no scores), one row of logits,
        // plus the rotary table; and attention's partial sums where it cuts
        // long ranges of keys into pieces, for a prefill batch or a decode
        // step of every sequence, whichever keeps more.
        let batch = context.min(cleave_nn::MAX_BATCH_ROWS as u128);
        let tables = self.rope_tables().len() as u128;
        let partials = |rows: u128, decode: bool| {
            let narrow = |n: u128| usize::try_from(n).unwrap_or(usize::MAX);
            let (heads, dim) = (self.heads, head_dim);
            attention_partials_bytes(narrow(rows), heads, dim, narrow(context), decode) as u64
        };
        // A Gated DeltaNet's q, k and v before and after the convolution,
        // its gates and its output (none in other models).
        let linear = self.linear_attention.map_or(0, |l| {
            let values = (l.heads.value_heads * l.heads.value_dim) as u128;
            2 * l.heads.qkv_width() as u128 + 3 * values + 2 * l.heads.value_heads as u128
        });
        let compute = batch * (2 * hu + qu + 2 * kvu + 3 * iu + linear + per_layer_rows)
            + vocab
            + tables * context * head_dim as u128;
        let partials = partials(batch, false).max(partials(sequences, true));
        let products = self.product_scratch_bytes(checkpoint, batch as usize);
        Inventory {
            module: "llm".into(),
            head_bytes: embed.saturating_add(per_layer),
            block_bytes,
            tail_bytes: f32_bytes(hu).saturating_add(head),
            tail_shared_with_head: if tied { embed } else { 0 },
            // An attention layer's KV cache, a Gated DeltaNet's state; none
            // for a layer that reads another's cache.
            cache_bytes: (0..self.layers)
                .map(|layer| {
                    let per_sequence = match self.is_linear(layer) {
                        true => self.recurrent_state_bytes() as u128,
                        false if self.shares_kv(layer) => 0,
                        false => context * self.kv_bytes_per_position(layer, cache) as u128,
                    };
                    u64::try_from(sequences * per_sequence).unwrap_or(u64::MAX)
                })
                .collect(),
            compute_bytes: f32_bytes(compute).saturating_add(partials).saturating_add(products),
            geometry: Some(geometry),
        }
    }

    /// Device bytes a block's prefill pass of `rows` rows takes beyond its
    /// activations, on whichever path the chosen precision lets a device
    /// take: its largest product's (see [`ProductPath`]; q, k and v are one
    /// product, as are gate and up, and an expert's products are those of
    /// the first). Attention takes none at either precision.
    fn product_scratch_bytes(&self, checkpoint: &Checkpoint, rows: usize) -> u64 {
        let paths = ProductPath::possible(cleave_shaders::chosen_precision());
        (0..self.layers)
            .flat_map(|layer| {
                let (attention, mlp) = (self.attention_tensors(layer), self.mlp_tensors(layer, 0));
                let qkv_rows = attention.qkv().iter().map(|m| m.rows).sum();
                let products = [
                    (attention.q.clone(), qkv_rows, false),
                    (attention.o.clone(), attention.o.rows, false),
                    (mlp.gate.clone(), mlp.gate.rows, true),
                    (mlp.down.clone(), mlp.down.rows, false),
                ];
                products.into_iter().map(move |(tensor, n, gated)| {
                    let name = block_weight(layer, &tensor.name);
                    (
                        checkpoint.dtype(&name).unwrap_or(WeightType::F32),
                        n,
                        tensor.cols,
                        gated,
                    )
                })
            })
            .flat_map(|(ty, n, k, gated)| {
                paths
                    .iter()
                    .map(move |path| path.scratch_bytes(ty, (rows, n, k), gated))
            })
            .max()
            .unwrap_or(0)
    }

    /// Bytes of layer `layer`'s K and V cache per position, in `cache`'s
    /// type.
    pub fn kv_bytes_per_position(&self, layer: usize, cache: CacheType) -> usize {
        let heads = self.heads_of(layer);
        2 * heads.kv_heads * heads.head_dim * cache.bytes()
    }

    /// The widest of every block's widths (see [`ModelConfig::widths`]).
    fn widest(&self) -> (usize, usize, usize, usize) {
        let (h, q, kv, _) = self.widths(self.attention_layer());
        let full = (0..self.layers).find(|&l| self.heads_of(l) != self.heads_of(self.attention_layer()));
        let (_, full_q, full_kv, _) = full.map_or((h, q, kv, 0), |l| self.widths(l));
        let i = (0..self.layers).map(|l| self.mlp_width(l)).max().unwrap_or(0);
        let experts = self.experts.map_or(0, |e| e.width);
        (h, q.max(full_q), kv.max(full_kv), i.max(experts))
    }
}
