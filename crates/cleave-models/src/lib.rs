//! cleave's model families, one folder each (`llama/`, `bert/`, `clip/`,
//! `t5/`, `flux/`, `vae/`: its config, its planner inventory, its model),
//! and the registry that maps a checkpoint's class to its family. The CLI,
//! the server, the tests and the benches open a model through the registry
//! ([`ModelDir`], [`EncoderDir`]) and drive a decoder through the traits
//! of cleave-nn, never naming its model type. The other families are
//! named where they run: `cleave embed` names [`Bert`], cleave-engine's
//! FLUX pipeline [`Clip`], [`T5Encoder`], [`FluxTransformer`] and
//! [`VaeDecoder`] (their tests and benches too).

mod bert;
mod clip;
mod encoder_dir;
mod flux;
mod llama;
mod registry;
mod t5;
mod vae;

pub use bert::{Bert, BertConfig};
pub use clip::{clip_pooled_index, Clip, ClipActivation, ClipConfig, ClipOutput};
pub use encoder_dir::{EncoderDir, ENCODER_MODULES};
pub use flux::{FluxConfig, FluxInput, FluxTransformer};
pub use llama::{Architecture, ModelConfig, RopeScaling};
pub use registry::{Family, ModelDir, LLM_MODULES};
pub use t5::{relative_position_bucket, T5Config, T5Encoder};
pub use vae::{VaeConfig, VaeDecoder};
