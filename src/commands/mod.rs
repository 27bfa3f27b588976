pub mod bench;
pub mod devices;
pub mod embed;
pub mod image;
pub mod logits;
pub mod plan;
mod profile;
pub mod run;
pub mod serve;
