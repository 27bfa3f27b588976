//! cleave's engine: sampling and the generation loop over any
//! [`cleave_nn::CausalLm`], and text-to-image with a FLUX pipeline.

mod decoder;
mod generate;
mod image;
mod profile;
mod sampler;
mod speculate;

pub use decoder::{Decoder, Step};
pub use generate::{generate, Limits, Output, PrefillChunk, StopReason, Timings};
pub use image::{generate_image, FluxPipeline, FluxPlacement, ImageProgress, ImageSettings, ModuleResidency};
pub use profile::DecodeProfile;
pub use sampler::{Penalties, Sampler, SamplerConfig};
pub use speculate::{DraftModel, Drafter, PromptLookup, Speculation, SpeculationStats};
