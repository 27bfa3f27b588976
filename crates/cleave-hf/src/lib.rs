//! Reading what Hugging Face and diffusers publish, with nothing on a
//! device: config.json checks, safetensors checkpoints (memory-mapped,
//! sharded), tokenizers, PEFT LoRA adapters, model directories and their
//! manifests. Each model family's own config struct lives with the family;
//! what every reader shares lives here.

mod checkpoint;
mod config;
mod dir;
mod error;
mod file;
mod lora;
mod manifest;
mod part;
mod token_bytes;
mod tokenizer;

pub use checkpoint::{Checkpoint, ForeignTensors, TensorData, WeightType};
pub use config::{OneOrMany, Validator};
pub use dir::{check_model_dir, ConfigClass};
pub use error::{read_json, read_to_string, ReadError, Result};
pub use file::{open_regular, read_regular, read_regular_to_string};
pub use lora::{lora_factor_name, LoraAdapter, LoraMode};
pub use manifest::{pipeline_class, sentence_max_seq_length, Pooling, PoolingMode};
pub use part::{Cut, Rows};
pub use token_bytes::TokenBytes;
pub use tokenizer::Tokenizer;
