//! Opening what a command runs: the model `-m` names made a local path,
//! its directory, its LoRA adapters, and its weights loaded with a bar.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cleave_device::DeviceGroup;
use cleave_hf::{LoraAdapter, LoraMode};
use cleave_models::ModelDir;
use cleave_nn::{CausalModel, Placed};
use cleave_plan::Plan;
use cleave_shaders::cubecl::prelude::*;
use indicatif::{ProgressBar, ProgressStyle};

use super::report::announce_precision;
use crate::{ModelArgs, ResidencyArg, SourceArgs};

/// Replaces `model` (a path, or a name as `-m` takes it) with the local
/// path it names, downloading a Hugging Face repo the cache lacks; where
/// the model was found.
pub fn locate(model: &mut PathBuf, source: &SourceArgs) -> Result<cleave_source::Origin> {
    let Some(spec) = model.to_str() else {
        return Ok(cleave_source::Origin::Path);
    };
    let options = cleave_source::Options {
        offline: source.offline,
        progress: true,
    };
    let resolved = cleave_source::resolve(spec, options)?;
    *model = resolved.path;
    Ok(resolved.origin)
}

/// The language model directory of `args`, opened (and read into memory
/// for `--residency host`).
pub fn open_model(args: &ModelArgs) -> Result<ModelDir> {
    let mut model = open_model_dir(args)?;
    if args.placement.residency == ResidencyArg::Host {
        if let Some(checkpoint) = std::sync::Arc::get_mut(&mut model.checkpoint) {
            checkpoint.read_into_memory();
        }
    }
    Ok(model)
}

/// The language model directory of `args`, opened with the flags that
/// change what it is planned as (`--precision`, `--cache-type`): what
/// `cleave plan` looks at, without reading the weights.
pub fn open_model_dir(args: &ModelArgs) -> Result<ModelDir> {
    cleave_shaders::set_precision(args.precision.map(Into::into));
    let mut model =
        ModelDir::open(&args.model).with_context(|| format!("cannot open model {}", args.model.display()))?;
    if let Some(cache) = args.cache_type {
        model.cache_type = cache.into();
    }
    Ok(model)
}

/// A progress bar for loading `bytes` of checkpoint, drawn on stderr when
/// it is a terminal.
pub fn load_bar(bytes: u64) -> ProgressBar {
    ProgressBar::new(bytes).with_style(
        ProgressStyle::with_template("loading {bar:30} {binary_bytes}/{binary_total_bytes} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    )
}

/// The LoRA adapters `--lora` names (`DIR` or `DIR:SCALE`), opened for
/// `model`.
pub fn adapters(args: &ModelArgs, model: &ModelDir) -> Result<Vec<LoraAdapter>> {
    args.lora
        .iter()
        .map(|spec| {
            let (dir, scale) = match spec.rsplit_once(':') {
                // A path that itself holds a colon is taken whole.
                _ if Path::new(spec).is_dir() => (spec.as_str(), 1.0),
                Some((dir, scale)) => {
                    let scale = scale.parse::<f32>().ok().filter(|s| s.is_finite()).with_context(|| {
                        format!("--lora {spec}: '{scale}' is not a finite scale (DIR:SCALE, e.g. DIR:0.5)")
                    })?;
                    (dir, scale)
                }
                None => (spec.as_str(), 1.0),
            };
            model
                .open_adapter(Path::new(dir), scale)
                .with_context(|| format!("cannot open LoRA adapter {dir}"))
        })
        .collect()
}

/// Uploads the weights to `clients` (one per group member) as `plan` says,
/// with `adapters` applied, drawing a progress bar on stderr when it is a
/// terminal.
pub fn load<R: Runtime>(
    clients: Vec<ComputeClient<R>>,
    group: &DeviceGroup,
    plan: Plan,
    model: &ModelDir,
    (adapters, mode): (&[LoraAdapter], LoraMode),
) -> Result<(Box<dyn CausalModel<R>>, Duration)> {
    let start = Instant::now();
    announce_precision(std::slice::from_ref(group));
    let bar = load_bar(model.checkpoint.total_bytes());
    // The clients are those of the group's first runtime slot (every
    // member, unless the group spans runtimes).
    let mut devices = Placed::group(clients, &group.slots()[0].group);
    Placed::arm_faults(&mut devices, "0")?;
    let loaded = model.load_on_group(devices, group, plan, (adapters, mode), &mut |bytes| bar.inc(bytes))?;
    bar.finish_and_clear();
    Ok((loaded, start.elapsed()))
}
