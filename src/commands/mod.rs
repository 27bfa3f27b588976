pub mod bench;
pub mod devices;
pub mod embed;
pub mod image;
pub mod logits;
pub mod plan;
pub mod run;
pub mod serve;
