//! Reading llama.cpp's GGUF files (version 3) on the host, with nothing on
//! a device: the header and its metadata (memory-mapped, every count and
//! offset checked against the file), each tensor under its transformers
//! name with transformers' shape and row order, a plain-Rust twin of ggml's
//! dequantization for each block layout cleave reads, and the config.json
//! and tokenizer a model directory would have, from the metadata.

mod blocks;
mod config;
mod error;
mod file;
mod foreign;
mod header;
mod metadata;
mod names;
mod tokenizer;
mod types;

pub use blocks::dequantize;
pub use cleave_types::{WeightType, QK, QK_K};
pub use error::{GgufError, Result};
pub use file::{Architecture, GgufFile, HfTensor, ARCHITECTURES};
pub use header::TensorInfo;
pub use metadata::{Array, Metadata, PerLayer, Value};
