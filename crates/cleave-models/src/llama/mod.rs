//! The rotary decoders: Llama, Mistral, Qwen2/Qwen3, Phi-3, Gemma 2/3,
//! Mixtral, Qwen3-MoE and the hybrid Qwen3.5/3.5-MoE. One block serves
//! them all: pre-norm rotary grouped-query attention (or, in a hybrid
//! model's linear layers, a Gated DeltaNet) and a gated MLP (or a mixture
//! of experts), with the switches of [`ModelConfig`] for what each family
//! adds.

mod block;
mod config;
mod delta_net;
mod expert_part;
mod load;
mod model;
mod moe;

pub use config::{Architecture, ModelConfig, RopeScaling, ARCHITECTURES};
pub(crate) use expert_part::ExpertPart;
pub(crate) use model::Elsewhere;
pub use model::{Llama, LlamaModel};
pub(crate) use moe::ExpertsElsewhere;
