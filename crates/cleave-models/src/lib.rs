//! cleave's model families, one folder each (`llama/`, `bert/`, `clip/`,
//! `t5/`, `flux/`, `vae/`: its config, its planner inventory, its model),
//! and the registry that maps a checkpoint's class to its family. The CLI,
//! the engine and the server open a model through its directory
//! ([`ModelDir`], [`EncoderDir`], [`FluxDir`]), ask it for its vocabulary,
//! context and modules, and drive it through traits (cleave-nn's
//! `CausalModel`; [`SentenceEncoder`]; the pipeline's [`Encode`],
//! [`Denoise`], [`Decode`]), never naming a family's types. The tests and
//! benches of a family name its types where they test them.

mod bert;
mod clip;
mod compiled;
mod encoder_dir;
mod flux;
mod flux_dir;
mod llama;
mod registry;
mod t5;
mod vae;

pub use bert::{Bert, BertConfig};
pub use clip::{clip_pooled_index, Clip, ClipActivation, ClipConfig, ClipOutput};
pub use encoder_dir::{EncoderDir, SentenceEncoder, ENCODER_MODULES};
pub use flux::{FluxConfig, FluxInput, FluxTransformer};
pub use flux_dir::{Decode, Denoise, Encode, FluxDir, FLUX_MODULES};
pub use llama::{Architecture, ModelConfig, RopeScaling};
pub use registry::{Family, ModelDir, LLM_MODULES};
pub use t5::{relative_position_bucket, T5Config, T5Encoder};
pub use vae::{VaeConfig, VaeDecoder};
