//! What the planner sees of a model: each block's geometry and bytes, the
//! KV cache per position, the modules' inventory.

use cleave_hf::Checkpoint;
use cleave_nn::CacheType;
use cleave_plan::{BlockGeometry, Inventory, Matmul};
use cleave_shaders::{attention_partials_bytes, ProductPath, WeightType};

use super::names::{block_weight, weight, EMBEDDINGS, OUTPUT_HEAD};
use super::{MatmulTensor, MlpTensors, ModelConfig};

impl ModelConfig {
    /// A block's matmul weights that row and tensor split divide, named as
    /// inside `model.layers.N`, and its heads. `checkpoint` says how many
    /// bytes each weight's rows take in every block.
    pub fn block_geometry(&self, checkpoint: &Checkpoint) -> BlockGeometry {
        let divided = |m: &MatmulTensor| {
            m.role.map(|role| Matmul {
                name: m.name.clone(),
                role,
                rows: m.rows,
                cols: m.cols,
                bias: m.bias,
                row_bytes_over_blocks: (0..self.layers)
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
            matmuls: self.block_matmuls().iter().filter_map(divided).collect(),
            per_head_shard_bytes: if self.qk_norm {
                (2 * self.head_dim * size_of::<f32>()) as u64
            } else {
                0
            },
            experts: self.experts.map_or(0, |e| e.count),
            expert_bytes_over_blocks: self.expert_bytes_over_blocks(checkpoint),
        }
    }

    /// Every matmul weight of a block: attention's, the router's, then
    /// the MLP's or each expert's.
    fn block_matmuls(&self) -> Vec<MatmulTensor> {
        let (attention, router, mlps) = (self.attention_tensors(), self.router_tensor(), self.mlps());
        let mlps = mlps.iter().flat_map(MlpTensors::all);
        attention
            .matmuls()
            .into_iter()
            .chain(&router)
            .chain(mlps)
            .cloned()
            .collect()
    }

    /// Bytes of the largest expert summed over every block, as `checkpoint`
    /// stores its matrices (biases in f32); 0 for a dense model.
    fn expert_bytes_over_blocks(&self, checkpoint: &Checkpoint) -> u64 {
        let Some(experts) = self.experts else { return 0 };
        (0..experts.count)
            .map(|expert| {
                let mlp = self.mlp_tensors(expert);
                (0..self.layers)
                    .flat_map(|layer| {
                        mlp.all().map(|m| {
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
        let (h, q, kv, i) = self.widths();
        let geometry = self.block_geometry(checkpoint);
        let (hu, qu, kvu, iu) = (h as u128, q as u128, kv as u128, i as u128);
        let (context, sequences) = (context as u128, sequences as u128);
        let (vocab, head_dim) = (self.vocab_size as u128, self.head_dim as u128);
        // Norms and biases, in f32.
        let matmuls = self.block_matmuls();
        let qk_norms = self.attention_tensors().qk_norms;
        let norms = self.block_norms();
        let norm_values = norms.all().chain(qk_norms.iter().flatten()).map(|n| n.len as u128);
        let bias_values = matmuls.iter().filter(|m| m.bias).map(|m| m.rows as u128);
        let vectors: u128 = norm_values.chain(bias_values).sum();
        let block_bytes = (0..self.layers)
            .map(|layer| {
                matmuls
                    .iter()
                    .map(|m| checkpoint.matrix_bytes(&block_weight(layer, &m.name), m.rows, m.cols))
                    .fold(f32_bytes(vectors), u64::saturating_add)
            })
            .collect();
        let embed = checkpoint.matrix_bytes(&weight(EMBEDDINGS), self.vocab_size, h);
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
            let (heads, dim) = (self.heads, self.head_dim);
            attention_partials_bytes(narrow(rows), heads, dim, narrow(context), decode) as u64
        };
        let compute = batch * (2 * hu + qu + 2 * kvu + 3 * iu) + vocab + tables * context * head_dim;
        let partials = partials(batch, false).max(partials(sequences, true));
        let products = self.product_scratch_bytes(checkpoint, batch as usize);
        Inventory {
            module: "llm".into(),
            head_bytes: embed,
            block_bytes,
            tail_bytes: f32_bytes(hu).saturating_add(head),
            tail_shared_with_head: if tied { embed } else { 0 },
            kv_bytes_per_block: u64::try_from(sequences * context * self.kv_bytes_per_position(cache) as u128)
                .unwrap_or(u64::MAX),
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
        let (attention, mlp) = (self.attention_tensors(), self.mlp_tensors(0));
        let qkv_rows = attention.q.rows + attention.k.rows + attention.v.rows;
        let products = [
            (&attention.q, qkv_rows, false),
            (&attention.o, attention.o.rows, false),
            (&mlp.gate, mlp.gate.rows, true),
            (&mlp.down, mlp.down.rows, false),
        ];
        let paths = ProductPath::possible(cleave_shaders::chosen_precision());
        (0..self.layers)
            .flat_map(|layer| {
                products.iter().map(move |&(tensor, n, gated)| {
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

    /// Bytes of K and V cache per position and layer, in `cache`'s type.
    pub fn kv_bytes_per_position(&self, cache: CacheType) -> usize {
        2 * self.kv_heads * self.head_dim * cache.bytes()
    }
}
