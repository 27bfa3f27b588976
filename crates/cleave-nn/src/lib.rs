//! Putting a model on devices: a module's placement on its group (the
//! block loop with its hand-over, values made once per device), the loader
//! and the [`Weights`] view model code loads from, the layers families
//! share (`Linear`, row-split projections, sublayers summed over shards,
//! norms, convolution), the layer caches (keys and values, recurrent
//! states), the decoder driver every family
//! runs under, the traits a causal language model implements, and the
//! counts of what a model uploads while it runs.

mod allowed;
mod causal;
mod decoder;
mod error;
mod fault;
mod layer_cache;
mod layers;
mod linear;
mod loader;
mod logprobs;
mod parts;
mod placement;
mod recurrent;
mod rows;
mod sharded;
mod uploads;

pub use allowed::{Allowed, AllowedIds};
pub use causal::{
    check_finite, check_ids, read_logits, CacheType, CausalLm, CausalModel, Context, Logits, PickRule, Session,
    MAX_DRAFTS,
};
pub use decoder::{BlockPass, Decoder, DecoderLayers, DecoderShape, MAX_BATCH_ROWS};
pub use error::{ModelError, Result};
pub use fault::{Fault, FaultKind, FAULT_VARIABLE};
pub use layer_cache::{KvCache, LayerCache};
pub use layers::{Conv2d, GroupNorm, LayerNorm};
pub use linear::{Input, Linear, LowRank, Matrix, Proj};
pub use loader::{Bias, Loader, WeightSource, Weights};
pub use logprobs::{TokenLogprobs, MAX_TOP_LOGPROBS};
pub use parts::{Finish, Finished, HostRows, LaterPart, Part};
pub use placement::{plan_members, plan_members_of, Activations, PerDevice, Placed, PlacedModel, Placement};
pub use recurrent::{RecurrentState, StatePass};
pub use rows::{DeviceRows, PassRows};
pub use sharded::{Sharded, Store};
pub use uploads::{UploadCounters, UploadStats};
