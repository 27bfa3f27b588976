//! llama.cpp's tensor names and transformers' for each architecture cleave
//! reads from GGUF, and the row order llama.cpp's converter stores the
//! llama architecture's query and key projections in.

use crate::file::Architecture;

/// Tensors outside the blocks: (GGUF stem, transformers stem).
const TOP: [(&str, &str); 6] = [
    ("token_embd", "model.embed_tokens"),
    ("output_norm", "model.norm"),
    ("output", "lm_head"),
    // Gemma 4's per-layer inputs.
    ("per_layer_token_embd", "model.embed_tokens_per_layer"),
    ("per_layer_model_proj", "model.per_layer_model_projection"),
    ("per_layer_proj_norm", "model.per_layer_projection_norm"),
];

/// Block tensors, `blk.N.<GGUF part>` and `model.layers.N.<transformers
/// part>`, in groups that the architectures combine.
type Parts = &'static [(&'static str, &'static str)];

const ATTENTION: Parts = &[
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
];
const QK_NORMS: Parts = &[("attn_q_norm", "self_attn.q_norm"), ("attn_k_norm", "self_attn.k_norm")];
/// A norm before attention and one before the MLP.
const PRE_NORMS: Parts = &[
    ("attn_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"),
];
/// Gemma's norms before and after attention and the MLP.
const SANDWICH_NORMS: Parts = &[
    ("attn_norm", "input_layernorm"),
    ("post_attention_norm", "post_attention_layernorm"),
    ("ffn_norm", "pre_feedforward_layernorm"),
    ("post_ffw_norm", "post_feedforward_layernorm"),
];
const MLP: Parts = &[
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];
/// Phi-3 keeps q/k/v and gate/up fused, in transformers as in llama.cpp.
const PHI3_FUSED: Parts = &[
    ("attn_qkv", "self_attn.qkv_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("ffn_up", "mlp.gate_up_proj"),
    ("ffn_down", "mlp.down_proj"),
];
/// gpt-oss's norm before the MLP is llama.cpp's `post_attention_norm`.
const GPT_OSS_NORMS: Parts = &[
    ("attn_norm", "input_layernorm"),
    ("post_attention_norm", "post_attention_layernorm"),
];
/// Block tensors that transformers names without a `.weight`: (GGUF part
/// with its suffix, transformers part).
type BareParts = &'static [(&'static str, &'static str)];

const GPT_OSS_SINKS: BareParts = &[("attn_sinks.weight", "self_attn.sinks")];
/// Gemma 4's layer scalar, its router's scales and its experts, each stack
/// one transformers tensor (`experts.gate_up_proj`, `[experts, 2 · width,
/// hidden]`, as llama.cpp's `ffn_gate_up_exps`).
const GEMMA4_BARE: BareParts = &[
    ("layer_output_scale.weight", "layer_scalar"),
    ("ffn_gate_inp.scale", "router.scale"),
    ("ffn_down_exps.scale", "router.per_expert_scale"),
    ("ffn_gate_up_exps.weight", "experts.gate_up_proj"),
    ("ffn_down_exps.weight", "experts.down_proj"),
];
/// Gemma 4's per-layer input and the norms around the experts beside the
/// MLP.
const GEMMA4_PARTS: Parts = &[
    ("inp_gate", "per_layer_input_gate"),
    ("proj", "per_layer_projection"),
    ("post_norm", "post_per_layer_input_norm"),
    ("pre_ffw_norm_2", "pre_feedforward_layernorm_2"),
    ("post_ffw_norm_1", "post_feedforward_layernorm_1"),
    ("post_ffw_norm_2", "post_feedforward_layernorm_2"),
    ("ffn_gate_inp", "router.proj"),
];
const GPT_OSS_ROUTER: Parts = &[("ffn_gate_inp", "mlp.router")];
/// Qwen3.5's Gated DeltaNet layers (its `in_proj_qkv`'s value rows, and
/// every tensor of value heads, in llama.cpp's tiled order: see
/// `cleave_shaders::DeltaHeads`) and its norms.
const QWEN35_LINEAR: Parts = &[
    ("attn_qkv", "linear_attn.in_proj_qkv"),
    ("attn_gate", "linear_attn.in_proj_z"),
    ("ssm_alpha", "linear_attn.in_proj_a"),
    ("ssm_beta", "linear_attn.in_proj_b"),
    ("ssm_conv1d", "linear_attn.conv1d"),
    ("ssm_norm", "linear_attn.norm"),
    ("ssm_out", "linear_attn.out_proj"),
];
const QWEN35_NORMS: Parts = &[
    ("attn_norm", "input_layernorm"),
    ("post_attention_norm", "post_attention_layernorm"),
];
/// `ssm_a` is `-exp(A_log)` (see [`stored_as`]).
const QWEN35_BARE: BareParts = &[("ssm_a", "linear_attn.A_log"), ("ssm_dt.bias", "linear_attn.dt_bias")];
const QWEN35_SHARED_EXPERT: Parts = &[
    ("ffn_gate_shexp", "mlp.shared_expert.gate_proj"),
    ("ffn_up_shexp", "mlp.shared_expert.up_proj"),
    ("ffn_down_shexp", "mlp.shared_expert.down_proj"),
    ("ffn_gate_inp_shexp", "mlp.shared_expert_gate"),
];
const MIXTRAL_ROUTER: Parts = &[("ffn_gate_inp", "block_sparse_moe.gate")];
const QWEN3_MOE_ROUTER: Parts = &[("ffn_gate_inp", "mlp.gate")];

/// llama.cpp stacks a mixture's experts into one tensor per projection
/// (`[experts, rows, cols]`): (GGUF part, transformers part of expert E
/// with `{}` for E).
type ExpertParts = &'static [(&'static str, &'static str)];

const MIXTRAL_EXPERTS: ExpertParts = &[
    ("ffn_gate_exps", "block_sparse_moe.experts.{}.w1"),
    ("ffn_up_exps", "block_sparse_moe.experts.{}.w3"),
    ("ffn_down_exps", "block_sparse_moe.experts.{}.w2"),
];
const QWEN3_MOE_EXPERTS: ExpertParts = &[
    ("ffn_gate_exps", "mlp.experts.{}.gate_proj"),
    ("ffn_up_exps", "mlp.experts.{}.up_proj"),
    ("ffn_down_exps", "mlp.experts.{}.down_proj"),
];

impl Architecture {
    fn block_parts(self) -> &'static [Parts] {
        match self {
            Architecture::Llama | Architecture::Qwen2 => &[PRE_NORMS, ATTENTION, MLP],
            Architecture::Qwen3 => &[PRE_NORMS, ATTENTION, QK_NORMS, MLP],
            Architecture::Phi3 => &[PRE_NORMS, PHI3_FUSED],
            Architecture::Gemma2 => &[SANDWICH_NORMS, ATTENTION, MLP],
            Architecture::Gemma3 => &[SANDWICH_NORMS, ATTENTION, QK_NORMS, MLP],
            Architecture::Mixtral => &[PRE_NORMS, ATTENTION, MIXTRAL_ROUTER],
            Architecture::Qwen3Moe => &[PRE_NORMS, ATTENTION, QK_NORMS, QWEN3_MOE_ROUTER],
            Architecture::GptOss => &[GPT_OSS_NORMS, ATTENTION, GPT_OSS_ROUTER],
            Architecture::Gemma4 => &[SANDWICH_NORMS, ATTENTION, QK_NORMS, MLP, GEMMA4_PARTS],
            Architecture::Qwen35 => &[QWEN35_NORMS, ATTENTION, QK_NORMS, QWEN35_LINEAR, MLP],
            Architecture::Qwen35Moe => &[
                QWEN35_NORMS,
                ATTENTION,
                QK_NORMS,
                QWEN35_LINEAR,
                QWEN3_MOE_ROUTER,
                QWEN35_SHARED_EXPERT,
            ],
        }
    }

    fn bare_parts(self) -> BareParts {
        match self {
            Architecture::GptOss => GPT_OSS_SINKS,
            Architecture::Gemma4 => GEMMA4_BARE,
            Architecture::Qwen35 | Architecture::Qwen35Moe => QWEN35_BARE,
            _ => &[],
        }
    }

    fn expert_parts(self) -> ExpertParts {
        match self {
            Architecture::Mixtral => MIXTRAL_EXPERTS,
            Architecture::Qwen3Moe | Architecture::GptOss | Architecture::Qwen35Moe => QWEN3_MOE_EXPERTS,
            _ => &[],
        }
    }
}

/// What a GGUF tensor is to transformers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum HfNames {
    One(String),
    /// A stack of `experts` matrices, one transformers tensor each: the
    /// name of expert E is the pattern with E in place of `{}`.
    Experts(String),
}

impl HfNames {
    /// Every transformers name, given the stack's expert count.
    pub(crate) fn expand(&self, experts: usize) -> Vec<(String, Option<usize>)> {
        match self {
            HfNames::One(name) => vec![(name.clone(), None)],
            HfNames::Experts(pattern) => (0..experts)
                .map(|e| (pattern.replace("{}", &e.to_string()), Some(e)))
                .collect(),
        }
    }
}

/// transformers' name(s) of the GGUF tensor `gguf` in a file of `arch`,
/// `None` for a tensor it has no counterpart for (llama.cpp's
/// `rope_freqs`, say).
pub(crate) fn hf_names(arch: Architecture, gguf: &str) -> Option<HfNames> {
    let Some(rest) = gguf.strip_prefix("blk.") else {
        let (stem, suffix) = gguf.rsplit_once('.')?;
        let (_, hf) = TOP.iter().find(|(g, _)| *g == stem)?;
        return matches!(suffix, "weight" | "bias").then(|| HfNames::One(format!("{hf}.{suffix}")));
    };
    let (layer, part) = rest.split_once('.')?;
    // Only the canonical spelling, so that two GGUF names ("blk.1",
    // "blk.01") never map to one transformers name.
    let index: usize = layer.parse().ok()?;
    if index.to_string() != layer {
        return None;
    }
    if let Some((_, hf)) = arch.bare_parts().iter().find(|(g, _)| *g == part) {
        return Some(HfNames::One(format!("model.layers.{index}.{hf}")));
    }
    let (part, suffix) = part.rsplit_once('.')?;
    if !matches!(suffix, "weight" | "bias") {
        return None;
    }
    let block = |hf: &str| format!("model.layers.{index}.{hf}.{suffix}");
    if let Some((_, hf)) = arch.expert_parts().iter().find(|(g, _)| *g == part) {
        return Some(HfNames::Experts(block(hf)));
    }
    let (_, hf) = arch
        .block_parts()
        .iter()
        .flat_map(|p| p.iter())
        .find(|(g, _)| *g == part)?;
    Some(HfNames::One(block(hf)))
}

/// How llama.cpp's converter stored a tensor transformers keeps as `w`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StoredAs {
    Itself,
    /// `1 + w`: the norms of Gemma 2 and 3 and Qwen3.5 (but its Gated
    /// DeltaNet's), which scale by `1 + w`.
    PlusOne,
    /// `-exp(w)`: Qwen3.5's `A_log`, stored as the decay's rate.
    NegatedExp,
}

/// How the GGUF tensor `gguf` of a file of `arch` is stored.
pub(crate) fn stored_as(arch: Architecture, gguf: &str) -> StoredAs {
    use Architecture::*;
    let norm = gguf.ends_with("norm.weight");
    match arch {
        Gemma2 | Gemma3 if norm => StoredAs::PlusOne,
        Qwen35 | Qwen35Moe if norm && !gguf.ends_with("ssm_norm.weight") => StoredAs::PlusOne,
        Qwen35 | Qwen35Moe if gguf.ends_with(".ssm_a") => StoredAs::NegatedExp,
        _ => StoredAs::Itself,
    }
}

/// transformers' shape of a GGUF tensor whose reversed `ne` is `shape`:
/// the same, but for Qwen3.5's convolution, stored `[channels, taps]`
/// where transformers keeps `[channels, 1, taps]`.
pub(crate) fn hf_shape(arch: Architecture, gguf: &str, mut shape: Vec<usize>) -> Vec<usize> {
    let qwen35 = matches!(arch, Architecture::Qwen35 | Architecture::Qwen35Moe);
    if qwen35 && gguf.ends_with("ssm_conv1d.weight") && shape.len() == 2 {
        shape.insert(1, 1);
    }
    shape
}

/// Which head count the rows of GGUF tensor `gguf` were permuted by in a
/// llama-architecture file: the query projection's by the attention heads,
/// the key projection's by the KV heads (weights and biases alike).
pub(crate) fn permuted_projection(arch: Architecture, gguf: &str) -> Option<Projection> {
    if !matches!(arch, Architecture::Llama | Architecture::Mixtral) {
        return None;
    }
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

    fn one(arch: Architecture, gguf: &str) -> Option<String> {
        match hf_names(arch, gguf)? {
            HfNames::One(name) => Some(name),
            HfNames::Experts(_) => None,
        }
    }

    #[test]
    fn block_and_top_level_names_map_to_transformers_names() {
        use Architecture::Llama;
        assert_eq!(
            one(Llama, "token_embd.weight").as_deref(),
            Some("model.embed_tokens.weight")
        );
        assert_eq!(one(Llama, "output.weight").as_deref(), Some("lm_head.weight"));
        assert_eq!(
            one(Llama, "blk.12.attn_output.weight").as_deref(),
            Some("model.layers.12.self_attn.o_proj.weight")
        );
        assert_eq!(
            one(Llama, "blk.0.attn_q.bias").as_deref(),
            Some("model.layers.0.self_attn.q_proj.bias")
        );
        assert_eq!(hf_names(Llama, "blk.01.attn_q.weight"), None);
        assert_eq!(hf_names(Llama, "rope_freqs.weight"), None);
        assert_eq!(hf_names(Llama, "blk.0.attn_q.scale"), None);
        // Parts of other architectures are not llama's.
        assert_eq!(hf_names(Llama, "blk.0.attn_q_norm.weight"), None);
        assert_eq!(hf_names(Llama, "blk.0.ffn_gate_exps.weight"), None);
    }

    #[test]
    fn gpt_oss_names_its_sinks_without_a_suffix_and_stacks_its_biases() {
        use Architecture::GptOss;
        assert_eq!(
            one(GptOss, "blk.2.attn_sinks.weight").as_deref(),
            Some("model.layers.2.self_attn.sinks")
        );
        assert_eq!(hf_names(GptOss, "blk.2.attn_sinks.bias"), None);
        assert_eq!(
            one(GptOss, "blk.2.post_attention_norm.weight").as_deref(),
            Some("model.layers.2.post_attention_layernorm.weight")
        );
        assert_eq!(
            one(GptOss, "blk.2.ffn_gate_inp.bias").as_deref(),
            Some("model.layers.2.mlp.router.bias")
        );
        let biases = hf_names(GptOss, "blk.2.ffn_up_exps.bias").unwrap().expand(2);
        assert_eq!(biases[1].0, "model.layers.2.mlp.experts.1.up_proj.bias");
    }

    #[test]
    fn each_architecture_names_its_own_parts() {
        use Architecture::*;
        let block = |arch, part: &str| one(arch, &format!("blk.1.{part}.weight"));
        assert_eq!(
            block(Gemma3, "ffn_norm").as_deref(),
            Some("model.layers.1.pre_feedforward_layernorm.weight")
        );
        assert_eq!(
            block(Qwen3, "ffn_norm").as_deref(),
            Some("model.layers.1.post_attention_layernorm.weight")
        );
        assert_eq!(
            block(Qwen3, "attn_k_norm").as_deref(),
            Some("model.layers.1.self_attn.k_norm.weight")
        );
        assert_eq!(
            block(Phi3, "ffn_up").as_deref(),
            Some("model.layers.1.mlp.gate_up_proj.weight")
        );
        assert_eq!(block(Phi3, "attn_q"), None);
        assert_eq!(
            block(Mixtral, "ffn_gate_inp").as_deref(),
            Some("model.layers.1.block_sparse_moe.gate.weight")
        );
        assert_eq!(
            hf_names(Qwen3Moe, "blk.1.ffn_down_exps.weight").map(|n| n.expand(2)),
            Some(vec![
                ("model.layers.1.mlp.experts.0.down_proj.weight".into(), Some(0)),
                ("model.layers.1.mlp.experts.1.down_proj.weight".into(), Some(1)),
            ])
        );
    }

    #[test]
    fn gemma4_names_its_scalars_scales_and_stacks_without_a_suffix() {
        use Architecture::Gemma4;
        let cases = [
            ("blk.3.layer_output_scale.weight", "model.layers.3.layer_scalar"),
            ("blk.3.ffn_gate_inp.scale", "model.layers.3.router.scale"),
            ("blk.3.ffn_gate_inp.weight", "model.layers.3.router.proj.weight"),
            ("blk.3.ffn_down_exps.scale", "model.layers.3.router.per_expert_scale"),
            ("blk.3.ffn_gate_up_exps.weight", "model.layers.3.experts.gate_up_proj"),
            ("blk.3.ffn_down_exps.weight", "model.layers.3.experts.down_proj"),
            ("blk.3.inp_gate.weight", "model.layers.3.per_layer_input_gate.weight"),
            (
                "blk.3.post_ffw_norm_2.weight",
                "model.layers.3.post_feedforward_layernorm_2.weight",
            ),
            ("per_layer_token_embd.weight", "model.embed_tokens_per_layer.weight"),
        ];
        for (gguf, hf) in cases {
            assert_eq!(one(Gemma4, gguf).as_deref(), Some(hf), "{gguf}");
        }
        // The full layers' rope factors have no transformers tensor, and
        // another family's experts stay a stack of one name each.
        assert_eq!(hf_names(Gemma4, "rope_freqs.weight"), None);
        assert_eq!(hf_names(Gemma4, "blk.03.layer_output_scale.weight"), None);
        assert!(matches!(
            hf_names(Architecture::Qwen3Moe, "blk.3.ffn_down_exps.weight"),
            Some(HfNames::Experts(_))
        ));
    }

    #[test]
    fn gemma_and_qwen35_norms_are_stored_plus_one() {
        use Architecture::*;
        assert_eq!(stored_as(Gemma2, "blk.0.post_ffw_norm.weight"), StoredAs::PlusOne);
        assert_eq!(stored_as(Gemma3, "output_norm.weight"), StoredAs::PlusOne);
        assert_eq!(stored_as(Gemma3, "blk.0.attn_q.weight"), StoredAs::Itself);
        assert_eq!(stored_as(Qwen3, "blk.0.attn_q_norm.weight"), StoredAs::Itself);
        assert_eq!(stored_as(Gemma4, "blk.0.attn_q_norm.weight"), StoredAs::Itself);
        assert_eq!(stored_as(Qwen35, "blk.3.attn_q_norm.weight"), StoredAs::PlusOne);
        // The Gated DeltaNet's gated norm is kept as transformers has it.
        assert_eq!(stored_as(Qwen35Moe, "blk.0.ssm_norm.weight"), StoredAs::Itself);
        assert_eq!(stored_as(Qwen35, "blk.0.ssm_a"), StoredAs::NegatedExp);
        assert_eq!(
            one(Qwen35, "blk.0.ssm_a").as_deref(),
            Some("model.layers.0.linear_attn.A_log")
        );
        assert_eq!(hf_shape(Qwen35, "blk.0.ssm_conv1d.weight", vec![128, 4]), [128, 1, 4]);
    }

    #[test]
    fn stored_rows_interleave_the_halves_of_each_head() {
        // Two heads of 6 rows: each head's rows 0,1,2 | 3,4,5 are stored as 0,3,1,4,2,5.
        let order: Vec<usize> = (0..12).map(|r| stored_row(r, 12, 2)).collect();
        assert_eq!(order, [0, 2, 4, 1, 3, 5, 6, 8, 10, 7, 9, 11]);
    }
}
