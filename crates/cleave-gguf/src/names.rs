//! llama.cpp's tensor names and transformers' for the llama family
//! (Llama, Mistral, Qwen2), and the row order llama.cpp's converter stores
//! the query and key projections in.

/// Tensors outside the blocks: (GGUF stem, transformers stem).
const TOP: [(&str, &str); 3] = [
    ("token_embd", "model.embed_tokens"),
    ("output_norm", "model.norm"),
    ("output", "lm_head"),
];

/// Tensors of block N, `blk.N.*` and `model.layers.N.*`.
const BLOCK: [(&str, &str); 9] = [
    ("attn_norm", "input_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("ffn_norm", "post_attention_layernorm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

/// transformers' name of the GGUF tensor `gguf`, `None` for a tensor it has
/// no counterpart for (llama.cpp's `rope_freqs`, say).
pub fn hf_name(gguf: &str) -> Option<String> {
    let (stem, suffix) = gguf.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    if let Some(rest) = stem.strip_prefix("blk.") {
        let (layer, part) = rest.split_once('.')?;
        // Only the canonical spelling, so that two GGUF names ("blk.1",
        // "blk.01") never map to one transformers name.
        let index: usize = layer.parse().ok()?;
        if index.to_string() != layer {
            return None;
        }
        let (_, hf) = BLOCK.iter().find(|(g, _)| *g == part)?;
        return Some(format!("model.layers.{index}.{hf}.{suffix}"));
    }
    let (_, hf) = TOP.iter().find(|(g, _)| *g == stem)?;
    Some(format!("{hf}.{suffix}"))
}

/// Which head count the rows of GGUF tensor `gguf` were permuted by in a
/// llama-architecture file: the query projection's by the attention heads,
/// the key projection's by the KV heads (weights and biases alike).
pub(crate) fn permuted_projection(gguf: &str) -> Option<Projection> {
    let stem = gguf.strip_suffix(".weight").or_else(|| gguf.strip_suffix(".bias"))?;
    let part = stem.strip_prefix("blk.")?.split_once('.')?.1;
    match part {
        "attn_q" => Some(Projection::Query),
        "attn_k" => Some(Projection::Key),
        _ => None,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Projection {
    Query,
    Key,
}

/// The stored row of transformers' row `row` in a projection of `rows`
/// rows and `heads` heads, as llama.cpp's converter permutes them for its
/// rope (`LlamaModel.permute`: `reshape(heads, 2, rows / heads / 2, ..)
/// .swapaxes(1, 2)`). Within a head of `d` rows, transformers' row
/// `t·d/2 + j` (first half t = 0, second half t = 1) is stored at `2j + t`,
/// the pairs llama.cpp rotates together side by side.
///
/// `heads` must be positive and `rows` a multiple of `2·heads`.
pub(crate) fn stored_row(row: usize, rows: usize, heads: usize) -> usize {
    let head_rows = rows / heads;
    let half = head_rows / 2;
    let (head, within) = (row / head_rows, row % head_rows);
    let (t, j) = (within / half, within % half);
    head * head_rows + 2 * j + t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_and_top_level_names_map_to_transformers_names() {
        assert_eq!(
            hf_name("token_embd.weight").as_deref(),
            Some("model.embed_tokens.weight")
        );
        assert_eq!(hf_name("output.weight").as_deref(), Some("lm_head.weight"));
        assert_eq!(
            hf_name("blk.12.attn_output.weight").as_deref(),
            Some("model.layers.12.self_attn.o_proj.weight")
        );
        assert_eq!(
            hf_name("blk.0.attn_q.bias").as_deref(),
            Some("model.layers.0.self_attn.q_proj.bias")
        );
        assert_eq!(hf_name("blk.01.attn_q.weight"), None);
        assert_eq!(hf_name("rope_freqs.weight"), None);
        assert_eq!(hf_name("blk.0.attn_q.scale"), None);
    }

    #[test]
    fn stored_rows_interleave_the_halves_of_each_head() {
        // Two heads of 6 rows: each head's rows 0,1,2 | 3,4,5 are stored as 0,3,1,4,2,5.
        let order: Vec<usize> = (0..12).map(|r| stored_row(r, 12, 2)).collect();
        assert_eq!(order, [0, 2, 4, 1, 3, 5, 6, 8, 10, 7, 9, 11]);
    }
}
