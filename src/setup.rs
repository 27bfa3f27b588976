//! From command-line flags to a model placed on a device group: the steps
//! every command that runs a model shares.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use cleave_device::{DeviceGroup, MemberSpec};
use cleave_model::{Llama, ModelDir, Placed, MODULES};
use cleave_plan::{plan_layers, Member, Plan};
use cleave_shaders::cubecl::prelude::*;
use indicatif::{ProgressBar, ProgressStyle};

use crate::ModelArgs;

/// The llm module's group as the spec gives it (the best device when no
/// spec is given), checked but not opened.
fn llm_members(args: &ModelArgs) -> Result<Vec<MemberSpec>> {
    let Some(spec) = &args.backend else {
        return Ok(vec![MemberSpec {
            device: cleave_device::best_device()?.name,
            cap: None,
        }]);
    };
    let modules = cleave_device::parse_backend_spec(spec)?;
    if let Some(m) = modules.iter().find(|m| !MODULES.contains(&m.module.as_str())) {
        bail!(
            "--backend names module '{}', which {} does not have (it has: {})",
            m.module,
            args.model.display(),
            MODULES.join(", ")
        );
    }
    Ok(modules.into_iter().next().map(|m| m.members).unwrap_or_default())
}

/// The model, the context size and the plan placing it on the group.
pub fn plan(args: &ModelArgs) -> Result<(ModelDir, usize, Plan, Vec<MemberSpec>)> {
    let model = ModelDir::open(&args.model).with_context(|| format!("cannot open model {}", args.model.display()))?;
    let context = args
        .ctx_size
        .filter(|&c| c > 0)
        .unwrap_or_else(|| model.config.max_positions.min(4096));
    let specs = llm_members(args)?;
    let members: Vec<Member> = cleave_device::resolve_group(&specs)?
        .iter()
        .map(|(info, cap)| cleave_device::plan_member(info, *cap))
        .collect();
    let plan = plan_layers(&model.inventory(context), &members, args.tensor_split.as_deref())?;
    Ok((model, context, plan, specs))
}

/// Plans, then opens the group's devices.
pub fn open(args: &ModelArgs) -> Result<(ModelDir, usize, Plan, DeviceGroup)> {
    let (model, context, plan, specs) = plan(args)?;
    let group = cleave_device::open_group(&specs)?;
    eprintln!("{}", summary(&plan));
    Ok((model, context, plan, group))
}

/// One line: which device runs what.
pub fn summary(plan: &Plan) -> String {
    let parts: Vec<String> = plan
        .devices
        .iter()
        .filter(|d| d.is_used())
        .map(|d| {
            let mut part = format!("{} blocks {}..{}", d.name, d.blocks.start, d.blocks.end);
            for (on, what) in [(d.head, "head"), (d.tail, "tail")] {
                if on {
                    part.push_str(&format!(" +{what}"));
                }
            }
            part
        })
        .collect();
    format!("{}: {}", plan.module, parts.join(" | "))
}

/// Uploads the weights to `clients` (one per group member) as `plan` says,
/// drawing a progress bar on stderr when it is a terminal.
pub fn load<R: Runtime>(
    clients: Vec<ComputeClient<R>>,
    group: &DeviceGroup,
    plan: Plan,
    model: &ModelDir,
) -> Result<(Llama<R>, Duration)> {
    let start = Instant::now();
    let bar = ProgressBar::new(model.checkpoint.total_bytes()).with_style(
        ProgressStyle::with_template("loading {bar:30} {binary_bytes}/{binary_total_bytes} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let llama = Llama::load(Placed::group(clients, group), plan, model, &mut |bytes| bar.inc(bytes))?;
    bar.finish_and_clear();
    Ok((llama, start.elapsed()))
}
