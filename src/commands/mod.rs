pub mod devices;
pub mod logits;
pub mod plan;
pub mod run;
