//! From command-line flags to a model placed on a device group: the steps
//! every command that runs a model shares, by job.

mod open;
mod placement;
mod report;

pub use open::{adapters, load, load_bar, locate, open_model, open_model_dir};
pub use placement::{elsewhere, left_free, place, place_llm, plan, plan_llm, plan_pipeline};
pub use report::{announce, announce_precision, product_precisions, summary};
