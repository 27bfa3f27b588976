//! Opening a model and loading it onto a device, with a progress bar.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cleave_device::Device;
use cleave_model::{Llama, ModelDir};
use cleave_shaders::cubecl::prelude::*;
use indicatif::{ProgressBar, ProgressStyle};

use crate::ModelArgs;

/// The model directory and the device it will run on.
pub fn open(args: &ModelArgs) -> Result<(ModelDir, Device)> {
    let model = ModelDir::open(&args.model)
        .with_context(|| format!("cannot open model {}", args.model.display()))?;
    let device = match &args.device {
        Some(name) => cleave_device::open(name)?,
        None => cleave_device::open_default()?,
    };
    Ok((model, device))
}

/// Uploads the weights, drawing a bar on stderr (when it is a terminal).
pub fn load<R: Runtime>(
    client: ComputeClient<R>,
    model: &ModelDir,
) -> Result<(Llama<R>, Duration)> {
    let start = Instant::now();
    let bar = ProgressBar::new(model.checkpoint.total_bytes()).with_style(
        ProgressStyle::with_template("loading {bar:30} {binary_bytes}/{binary_total_bytes} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let llama = Llama::load(client, model, &mut |bytes| bar.inc(bytes))?;
    bar.finish_and_clear();
    Ok((llama, start.elapsed()))
}

/// The context size: asked for, else the model's (at most 4096).
pub fn context_size(args: &ModelArgs, model: &ModelDir) -> usize {
    args.ctx_size
        .filter(|&c| c > 0)
        .unwrap_or_else(|| model.config.max_positions.min(4096))
}
