//! CPU-side pieces of a FLUX.1 text-to-image pipeline that must agree exactly with diffusers:
//! torch-compatible noise, the flow-matching schedule, latent packing, prompt tokenisation and
//! image output.

pub mod config;
pub mod image;
pub mod latents;
pub mod prompt;
pub mod rng;
pub mod scheduler;
