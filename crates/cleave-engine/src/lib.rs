//! cleave's engine: sampling and the generation loop over any
//! [`cleave_model::CausalLm`], and text-to-image with a FLUX pipeline.

mod decoder;
mod generate;
mod image;
mod sampler;

pub use decoder::{Decoder, Step};
pub use generate::{generate, Limits, Output, StopReason, Timings};
pub use image::{generate_image, FluxPlacement, ImageProgress, ImageSettings, ModulePlacement};
pub use sampler::{argmax, Sampler, SamplerConfig};
