//! cleave's engine: sampling and the generation loop over any
//! [`cleave_model::CausalLm`].

mod generate;
mod sampler;

pub use generate::{generate, Limits, Output, StopReason, Timings};
pub use sampler::{argmax, Sampler, SamplerConfig};
