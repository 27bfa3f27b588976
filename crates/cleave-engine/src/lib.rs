//! cleave's engine: sampling and the generation loop over any
//! [`cleave_model::CausalLm`].

mod decoder;
mod generate;
mod sampler;

pub use decoder::{Decoder, Step};
pub use generate::{generate, Limits, Output, StopReason, Timings};
pub use sampler::{argmax, Sampler, SamplerConfig};
