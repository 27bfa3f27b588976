//! cleave's compute kernels, written once in cubecl and generic over
//! `cubecl::Runtime`: the same source compiles to CUDA and to wgpu.
//!
//! Every op takes and returns [`Tensor`]s (a device buffer plus its row-major
//! shape), checks shapes before launching, and has a plain-Rust twin in
//! `reference` that the tests compare against; the twins are compiled only
//! with the `cpu-reference` feature, which the crate's own tests turn on.

mod activation;
mod attention;
mod cast;
mod choice;
mod decode;
mod delta;
mod elementwise;
mod error;
mod fast_attention;
mod grid;
mod image;
mod kv;
mod logprobs;
mod matmul;
mod modulation;
mod norm;
mod penalty;
mod pick;
mod precision;
pub mod profile;
mod qkv;
mod reduce;
#[cfg(feature = "cpu-reference")]
pub mod reference;
mod rope;
mod rows;
mod sample;
mod tensor;
mod weight;
mod workspace;
pub use workspace::release_idle_workspace;

pub use activation::{activate, gated_mul, gelu_tanh_mul, silu_mul, Activation, SWIGLU_ALPHA, SWIGLU_LIMIT};
pub use attention::{attention, attention_cached, attention_partials_bytes, AttentionShape};
pub use cast::{bf16_to_f32, f16_to_f32};
#[cfg(feature = "cpu-reference")]
pub use choice::with_kernels;
pub use choice::{kernels_for, Kernels};
pub use decode::{dequantize_rows, embedding_weight, embedding_weight_picked};
pub use delta::{causal_conv, gated_delta_rule, DeltaHeads, StateRing, StateRoute, StateRoutes};
pub use elementwise::{
    add_assign, add_bias, add_rows_scaled, add_scaled, columns_of, copy_columns, copy_rows, embedding, scale_shift,
};
pub use error::KernelError;
pub use image::{conv2d, transpose, upsample_nearest2x};
pub use kv::kv_cache;
pub use logprobs::{logprob_reports, LogprobReport, LogprobReports};
pub use matmul::{
    library_bytes, matmul, matmul_into, matmul_weight, matmul_weight_into, matrix_unit_library, Epilogue, Output,
    ProductPath,
};
pub use modulation::{add_gated, modulate};
pub use norm::{group_norm, layer_norm, rms_norm};
pub use penalty::{append_picks_to, penalize, History, Penalties, MAX_DEVICE_PENALTY_WINDOW};
pub use pick::{argmax, pick_tokens, Banned, Picked, NON_FINITE};
pub use precision::{chosen_precision, default_precision, fast_possible, precision_for, set_precision, Precision};
#[cfg(feature = "cpu-reference")]
pub use precision::{narrow, rounded, with_precision};
pub use qkv::{split_qkv, CacheWrite, HeadNorms};
pub use rope::{rope_pairs, rope_table, RopeTable};
pub use rows::{advance_decode_rows, KeyRanges, RowIndex};
pub use sample::{
    argmax_on_host, sample, sample_on_host, samples_on_device, SampleRules, SamplerConfig, MAX_DEVICE_TOP_K,
};
pub use tensor::Tensor;
pub use weight::{Weight, WeightType};

pub use cubecl;
