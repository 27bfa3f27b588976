pub mod devices;
pub mod logits;
pub mod run;
