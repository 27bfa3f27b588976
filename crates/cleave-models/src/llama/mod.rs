//! The Llama family (Llama, Mistral, Qwen2): pre-norm decoder blocks with
//! rotary grouped-query attention and a SiLU-gated MLP.

mod config;
mod model;

pub use config::{Architecture, ModelConfig, RopeScaling, ARCHITECTURES};
pub use model::Llama;
