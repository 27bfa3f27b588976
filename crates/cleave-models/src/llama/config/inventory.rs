//! What the planner sees of a model: each block's geometry and bytes, the
//! KV cache per position, the modules' inventory.

use cleave_hf::Checkpoint;
use cleave_nn::CacheType;
use cleave_plan::{BlockGeometry, Inventory, Matmul, Role};
use cleave_shaders::attention_partials_bytes;

use super::ModelConfig;

impl ModelConfig {
    /// A block's matmul weights, named as inside `model.layers.N`, and its
    /// heads: what row and tensor split divide. `checkpoint` says how many
    /// bytes each weight's rows take in every block.
    pub fn block_geometry(&self, checkpoint: &Checkpoint) -> BlockGeometry {
        let (h, q, kv, i) = self.widths();
        let matmul = |name: &str, role, rows, cols, bias| Matmul {
            name: name.to_string(),
            role,
            rows,
            cols,
            bias,
            row_bytes_over_blocks: (0..self.layers)
                .map(|layer| checkpoint.matrix_bytes(&format!("model.layers.{layer}.{name}.weight"), 1, cols))
                .fold(0, u64::saturating_add),
            block_len: (0..self.layers)
                .filter_map(|layer| checkpoint.dtype(&format!("model.layers.{layer}.{name}.weight")))
                .map(|dtype| dtype.block_len())
                .max()
                .unwrap_or(1),
        };
        let mut matmuls = vec![
            matmul("self_attn.q_proj", Role::Query, q, h, self.qkv_bias),
            matmul("self_attn.k_proj", Role::Key, kv, h, self.qkv_bias),
            matmul("self_attn.v_proj", Role::Value, kv, h, self.qkv_bias),
            matmul("self_attn.o_proj", Role::Output, h, q, self.o_bias),
        ];
        for [gate, up, down] in self.mlp_names() {
            matmuls.push(matmul(&gate, Role::Gate, i, h, self.mlp_bias));
            matmuls.push(matmul(&up, Role::Up, i, h, self.mlp_bias));
            matmuls.push(matmul(&down, Role::Down, h, i, self.mlp_bias));
        }
        BlockGeometry {
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            intermediate: i,
            matmuls,
            per_head_shard_bytes: if self.qk_norm {
                (2 * self.head_dim * size_of::<f32>()) as u64
            } else {
                0
            },
            experts: self.experts.map_or(0, |e| e.count),
            expert_bytes_over_blocks: self.expert_bytes_over_blocks(checkpoint),
        }
    }

    /// Bytes of the largest expert summed over every block, as `checkpoint`
    /// stores its matrices (biases in f32); 0 for a dense model.
    fn expert_bytes_over_blocks(&self, checkpoint: &Checkpoint) -> u64 {
        let (h, _, _, i) = self.widths();
        let bias = if self.mlp_bias {
            (2 * i + h) * size_of::<f32>()
        } else {
            0
        };
        let Some(experts) = self.experts else { return 0 };
        (0..experts.count)
            .map(|expert| {
                let [gate, up, down] = self.mlp_of(expert);
                (0..self.layers)
                    .flat_map(|layer| {
                        let weight = |name: &str| format!("model.layers.{layer}.{name}.weight");
                        [
                            checkpoint.matrix_bytes(&weight(&gate), i, h),
                            checkpoint.matrix_bytes(&weight(&up), i, h),
                            checkpoint.matrix_bytes(&weight(&down), h, i),
                            bias as u64,
                        ]
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
        let bias = |on: bool, n: u128| if on { n } else { 0 };
        let vectors = 2 * hu
            + bias(self.sandwich_norms, 2 * hu)
            + bias(self.qk_norm, 2 * head_dim)
            + bias(self.qkv_bias, qu + 2 * kvu)
            + bias(self.o_bias, hu)
            + bias(self.mlp_bias, 2 * iu + hu);
        let block_bytes = (0..self.layers)
            .map(|layer| {
                let weight = |name: &str| format!("model.layers.{layer}.{name}.weight");
                // The router stays whole with its block in every split.
                let router = match (self.router_name(), self.experts) {
                    (Some(name), Some(e)) => checkpoint.matrix_bytes(&weight(name), e.count, h),
                    _ => 0,
                };
                geometry
                    .matmuls
                    .iter()
                    .map(|m| checkpoint.matrix_bytes(&weight(&m.name), m.rows, m.cols))
                    .fold(f32_bytes(vectors).saturating_add(router), u64::saturating_add)
            })
            .collect();
        let embed = checkpoint.matrix_bytes("model.embed_tokens.weight", self.vocab_size, h);
        let head = if tied {
            embed
        } else {
            checkpoint.matrix_bytes("lm_head.weight", self.vocab_size, h)
        };
        // One prefill batch: hidden states, q/k/v, the MLP's three
        // intermediates (attention writes no scores), one row of logits,
        // plus the rotary table; and attention's partial sums where it cuts
        // long ranges of keys into pieces, for a prefill batch or a decode
        // step of every sequence, whichever keeps more.
        let batch = context.min(crate::llama::model::MAX_BATCH_ROWS as u128);
        let tables = self.rope_tables().len() as u128;
        let partials = |rows: u128, decode: bool| {
            let narrow = |n: u128| usize::try_from(n).unwrap_or(usize::MAX);
            let (heads, dim) = (self.heads, self.head_dim);
            attention_partials_bytes(narrow(rows), heads, dim, narrow(context), decode) as u64
        };
        let compute = batch * (2 * hu + qu + 2 * kvu + 3 * iu) + vocab + tables * context * head_dim;
        let partials = partials(batch, false).max(partials(sequences, true));
        Inventory {
            module: "llm".into(),
            head_bytes: embed,
            block_bytes,
            tail_bytes: f32_bytes(hu).saturating_add(head),
            tail_shared_with_head: if tied { embed } else { 0 },
            kv_bytes_per_block: u64::try_from(sequences * context * self.kv_bytes_per_position(cache) as u128)
                .unwrap_or(u64::MAX),
            compute_bytes: f32_bytes(compute).saturating_add(partials),
            geometry: Some(geometry),
        }
    }

    /// Bytes of K and V cache per position and layer, in `cache`'s type.
    pub fn kv_bytes_per_position(&self, cache: CacheType) -> usize {
        2 * self.kv_heads * self.head_dim * cache.bytes()
    }
}
