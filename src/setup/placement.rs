//! Placing a model from the flags: each module's group and its members'
//! budgets (what the fit target and other groups leave), the plan
//! cleave-plan fits there, the context size, and the group opened.

use std::path::Path;

use anyhow::{bail, Result};
use cleave_device::{DeviceGroup, DeviceInfo, MemberSpec};
use cleave_models::{FluxDir, ModelDir, FLUX_MODULES, LLM_MODULES};
use cleave_plan::{format_bytes, FitRequest, Fitted, Inventory, Plan, PlanError, SplitMode, Streaming};

use super::report::announce;
use crate::{ModelArgs, PlacementArgs};

/// The group `--backend` gives `module` (the best device when no spec is
/// given), checked but not opened. `modules` are those the model has.
fn members_for(placement: &PlacementArgs, model: &Path, module: &str, modules: &[&str]) -> Result<Vec<MemberSpec>> {
    let Some(spec) = &placement.backend else {
        return Ok(cleave_device::auto_group()?);
    };
    let specs = cleave_device::parse_backend_spec(spec)?;
    // A group that names no module places every module of a pipeline.
    if !spec.contains('=') && !modules.contains(&cleave_device::DEFAULT_MODULE) {
        return Ok(specs.into_iter().flat_map(|m| m.members).collect());
    }
    if let Some(m) = specs.iter().find(|m| !modules.contains(&m.module.as_str())) {
        bail!(
            "--backend names module '{}', which {} does not have (it has: {})",
            m.module,
            model.display(),
            modules.join(", ")
        );
    }
    Ok(match specs.into_iter().find(|m| m.module == module) {
        Some(m) => m.members,
        // Modules the spec leaves out go to the best device.
        None => vec![MemberSpec {
            device: cleave_device::best_device()?.name,
            cap: None,
        }],
    })
}

/// The logical devices a group opens (`placement`'s spec for the modules
/// of the model at `model`), a name each: its modules run one after
/// another, so a device counts as often as the module that names it most.
pub fn logical_devices(placement: &PlacementArgs, model: &Path, modules: &[&str]) -> Result<Vec<String>> {
    let mut uses: Vec<(String, usize)> = Vec::new();
    for module in modules {
        let mut names: Vec<String> = members_for(placement, model, module, modules)?
            .into_iter()
            .map(|m| m.device)
            .collect();
        names.sort();
        for chunk in names.chunk_by(|a, b| a == b) {
            match uses.iter_mut().find(|(name, _)| *name == chunk[0]) {
                Some((_, count)) => *count = (*count).max(chunk.len()),
                None => uses.push((chunk[0].clone(), chunk.len())),
            }
        }
    }
    Ok(uses
        .into_iter()
        .flat_map(|(name, count)| std::iter::repeat_n(name, count))
        .collect())
}

/// For each of several groups of one process (`placement` with each of
/// `specs` as its `--backend`), the logical devices the other groups open.
pub fn elsewhere(
    placement: &PlacementArgs,
    specs: &[Option<String>],
    model: &Path,
    modules: &[&str],
) -> Result<Vec<Vec<String>>> {
    let groups = specs
        .iter()
        .map(|spec| {
            let placement = PlacementArgs {
                backend: spec.clone(),
                ..placement.clone()
            };
            logical_devices(&placement, model, modules)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((0..groups.len())
        .map(|i| {
            let others = groups.iter().enumerate().filter(|(j, _)| *j != i);
            others.flat_map(|(_, names)| names.iter().cloned()).collect()
        })
        .collect())
}

/// The plan placing `inventory` on the group `--backend` gives its module.
pub fn plan(
    placement: &PlacementArgs,
    model: &Path,
    modules: &[&str],
    inventory: &Inventory,
) -> Result<(Plan, Vec<MemberSpec>)> {
    let mut specs = members_for(placement, model, &inventory.module, modules)?;
    let request = FitRequest {
        mode: placement.split_mode.map(SplitMode::from),
        row_split_min: placement.row_split_min,
        streaming: Streaming {
            residency: placement.residency.into(),
            stream_blocks: placement.stream_layers,
            expert_cache: placement.expert_cache,
        },
    };
    let mode = request.first_mode();
    if placement.main_gpu >= specs.len() {
        bail!(
            "--main-gpu {} is not a member of a group of {}",
            placement.main_gpu,
            specs.len()
        );
    }
    if mode == SplitMode::Layer && placement.main_gpu > 0 {
        bail!(
            "--main-gpu is for --split-mode row, tensor and expert: layer split puts the embeddings on the \
             group's first member, so list that device first in --backend"
        );
    }
    if placement.main_gpu > 0 {
        let main = specs.remove(placement.main_gpu);
        specs.insert(0, main);
    }
    let resolved = cleave_device::resolve_group(&specs)?;
    check_spanning_runtimes(&resolved, &inventory.module, mode)?;
    // Room is left free on devices whose memory the backend reports (a cap
    // is already the user's word, and counts cleave's buffers only), once a
    // device however many logical devices share it; what another model
    // holds there is not this one's.
    let mut members = cleave_nn::plan_members_of(
        resolved.iter().map(|(info, cap)| (info, *cap)),
        &placement.elsewhere,
        |info| left_free(placement, info),
    );
    let mut unplanned = Vec::new();
    for (member, (info, cap)) in members.iter_mut().zip(&resolved) {
        if cap.is_none() && member.budget.is_some() {
            let library = cleave_shaders::library_bytes(info.backend.runtime());
            unplanned.push((member.name.clone(), (fit_target_bytes(placement, info), library)));
        }
        let taken: u64 = placement
            .taken
            .iter()
            .filter(|(name, _)| *name == member.name)
            .map(|(_, bytes)| bytes)
            .sum();
        member.budget = member.budget.map(|b| b.saturating_sub(taken));
    }
    // Said with the plan, so that the default `--fit-target` is never a
    // surprise.
    let left_free_notes = unplanned_notes(&unplanned);
    let ratios = placement.tensor_split.as_deref();
    let Fitted { plan, chosen } = cleave_plan::fit(inventory, &members, ratios, &request, &left_free_notes)?;
    for choice in chosen {
        eprintln!("{choice}");
    }
    Ok((plan, specs))
}

/// What a plan leaves free beside the budgets of `unplanned`'s devices
/// (`--fit-target`'s bytes and the library's, by name), once for the
/// devices that leave alike: "left free on cuda0, cuda1: ...".
fn unplanned_notes(unplanned: &[(String, (u64, u64))]) -> Vec<String> {
    let mut alike: Vec<((u64, u64), Vec<&str>)> = Vec::new();
    for (name, bytes) in unplanned.iter().filter(|(_, (fit, library))| *fit > 0 || *library > 0) {
        match alike.iter_mut().find(|(b, _)| b == bytes) {
            Some((_, names)) if names.contains(&name.as_str()) => {}
            Some((_, names)) => names.push(name),
            None => alike.push((*bytes, vec![name])),
        }
    }
    alike
        .into_iter()
        .map(|((fit, library), names)| {
            let mut parts = vec![format!("{} (--fit-target)", format_bytes(fit))];
            if library > 0 {
                parts.push(format!("{} (cuBLAS's workspace)", format_bytes(library)));
            }
            format!("left free on {}: {}", names.join(", "), parts.join(" and "))
        })
        .collect()
}

/// MiB a plan leaves free by default on a device whose free memory is
/// measured (the CUDA driver's figure, Vulkan's memory budget), as
/// llama.cpp does: that figure is taken before the device is opened, and
/// what grows there afterwards is not cleave's buffers (the context as
/// kernels load, the unused rest of cubecl's pooled pages, other
/// processes). A device that reports only its heap's size leaves nothing
/// unless asked: the heap is already a ceiling, not a measurement.
const DEFAULT_FIT_TARGET_MIB: u64 = 1024;

/// Bytes a plan leaves free on `device`, whose memory its backend reports:
/// `--fit-target` (by default [`DEFAULT_FIT_TARGET_MIB`] where free memory
/// is measured), and what the library forming its products keeps there
/// beside cleave's buffers (cuBLAS's workspace).
pub fn left_free(placement: &PlacementArgs, device: &DeviceInfo) -> u64 {
    fit_target_bytes(placement, device).saturating_add(cleave_shaders::library_bytes(device.backend.runtime()))
}

/// `--fit-target` in bytes on `device` (its default there when not given).
fn fit_target_bytes(placement: &PlacementArgs, device: &DeviceInfo) -> u64 {
    let default = match device.free_bytes {
        Some(_) => DEFAULT_FIT_TARGET_MIB,
        None => 0,
    };
    placement.fit_target.unwrap_or(default).saturating_mul(1 << 20)
}

/// Fails where the members `resolved` are of several runtimes, unless the
/// group can run `module` split as `mode` all the same: a language model
/// in layer split (each runtime's devices running a run of its blocks) or
/// expert split (each runtime's devices running the experts they own).
fn check_spanning_runtimes(resolved: &[(DeviceInfo, Option<u64>)], module: &str, mode: SplitMode) -> Result<()> {
    let spans_runtimes = resolved
        .windows(2)
        .any(|pair| pair[0].0.backend.runtime() != pair[1].0.backend.runtime());
    if !spans_runtimes {
        return Ok(());
    }
    let members: Vec<String> = resolved
        .iter()
        .map(|(info, _)| format!("{} ({})", info.name, info.backend.runtime()))
        .collect();
    let members = members.join(", ");
    if !LLM_MODULES.contains(&module) {
        bail!(
            "the {module} module's group spans runtimes ({members}): only a language model's layer or expert \
             split can; give {module} devices of one runtime"
        );
    }
    if !mode.may_span_runtimes() {
        bail!(
            "--split-mode {mode} cannot span runtimes ({members}): each block would sum partial results across \
             them; use --split-mode layer, which hands the activations from one runtime's blocks to the next \
             through the host (or expert, for a mixture of experts)"
        );
    }
    Ok(())
}

/// The plan of each of a FLUX pipeline's modules (in `FLUX_MODULES`
/// order) for images of up to `size` (height, width) and prompts of
/// `text_tokens` T5 tokens, each on the group `placement` gives it, told
/// to stderr; with the groups' specs.
pub fn plan_pipeline(
    placement: &PlacementArgs,
    dir: &FluxDir,
    size: (usize, usize),
    text_tokens: usize,
) -> Result<Vec<(Plan, Vec<MemberSpec>)>> {
    FLUX_MODULES
        .iter()
        .map(|module| {
            let inventory = dir.inventory(module, size, text_tokens)?;
            let planned = plan(placement, &dir.path, &FLUX_MODULES, &inventory)?;
            announce(&planned.0);
            Ok(planned)
        })
        .collect()
}

/// Plans, then opens the group's devices, telling stderr the placement.
pub fn place(
    placement: &PlacementArgs,
    model: &Path,
    modules: &[&str],
    inventory: &Inventory,
) -> Result<(Plan, DeviceGroup)> {
    let (plan, specs) = plan(placement, model, modules, inventory)?;
    let group = cleave_device::open_group(&specs)?;
    announce(&plan);
    Ok((plan, group))
}

/// The context size of `model`, a language model, and its placement for
/// one sequence, told to stderr, with the group's devices opened.
pub fn place_llm(args: &ModelArgs, model: &ModelDir) -> Result<(usize, Plan, DeviceGroup)> {
    let (context, plan, specs) = plan_llm(args, model, 1)?;
    let group = cleave_device::open_group(&specs)?;
    announce(&plan);
    Ok((context, plan, group))
}

/// The context size and the plan for a language model holding `sequences`
/// sequences at once. When no context size is given and the model's own
/// does not fit the group, the context is halved until it does, and stderr
/// says so.
pub fn plan_llm(args: &ModelArgs, model: &ModelDir, sequences: usize) -> Result<(usize, Plan, Vec<MemberSpec>)> {
    let wanted = context_size(args, model)?;
    let mut context = wanted;
    let (plan, specs) = loop {
        let inventory = model.inventory_for(context, sequences);
        match plan(&args.placement, &args.model, &LLM_MODULES, &inventory) {
            Err(e) if args.ctx_size.is_none() && context > MIN_AUTO_CONTEXT && is_does_not_fit(&e) => context /= 2,
            result => break result?,
        }
    };
    if context < wanted {
        eprintln!(
            "the context is {context} tokens, not the model's {wanted}: a larger one does not fit (set -c to choose)"
        );
    }
    Ok((context, plan, specs))
}

/// The smallest context auto-fit shrinks to before it gives up.
const MIN_AUTO_CONTEXT: usize = 256;

fn is_does_not_fit(e: &anyhow::Error) -> bool {
    matches!(e.downcast_ref::<PlanError>(), Some(PlanError::DoesNotFit { .. }))
}

/// The context size: asked for (0: the model's), else the model's (at most
/// 4096); never past the positions the model was trained for.
pub fn context_size(args: &ModelArgs, model: &ModelDir) -> Result<usize> {
    let max = model.max_positions();
    match args.ctx_size.filter(|&c| c > 0) {
        None => Ok(max.min(4096)),
        Some(c) if c > max => bail!(
            "-c/--ctx-size {c} is past the {max} positions {} was trained for \
             (max_position_embeddings in its config.json)",
            args.model.display()
        ),
        Some(c) => Ok(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ResidencyArg;

    fn placement() -> PlacementArgs {
        PlacementArgs {
            backend: None,
            tensor_split: None,
            split_mode: None,
            row_split_min: 256,
            main_gpu: 0,
            residency: ResidencyArg::Auto,
            stream_layers: None,
            expert_cache: None,
            fit_target: None,
            elsewhere: Vec::new(),
            taken: Vec::new(),
        }
    }

    fn sorted(mut groups: Vec<Vec<String>>) -> Vec<Vec<String>> {
        groups.iter_mut().for_each(|g| g.sort());
        groups
    }

    /// Each server group plans with the logical devices the other groups
    /// open on its devices: a language model's as its spec lists them, a
    /// pipeline's as often as the module that names a device most.
    #[test]
    fn groups_see_the_logical_devices_of_the_others() {
        let specs = ["vulkan0&vulkan0", "vulkan0", "vulkan1"].map(|s| Some(s.to_string()));
        let got = elsewhere(&placement(), &specs, Path::new("model"), &LLM_MODULES).unwrap();
        let names = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            sorted(got),
            [
                names(&["vulkan0", "vulkan1"]),
                names(&["vulkan0", "vulkan0", "vulkan1"]),
                names(&["vulkan0", "vulkan0", "vulkan0"]),
            ]
        );

        let specs = ["diffusion=cuda0&cuda1,te=cuda0&cuda0,te2=cuda0,vae=cuda0", "cuda0"].map(|s| Some(s.to_string()));
        let got = elsewhere(&placement(), &specs, Path::new("pipeline"), &FLUX_MODULES).unwrap();
        assert_eq!(sorted(got), [names(&["cuda0"]), names(&["cuda0", "cuda0", "cuda1"])]);
    }

    /// A device of `backend` as `cleave devices` lists it, its free memory
    /// measured or not.
    fn device(name: &str, backend: cleave_device::Backend, free: Option<u64>) -> DeviceInfo {
        DeviceInfo {
            name: name.into(),
            backend,
            adapter: "test".into(),
            device_type: "discrete".into(),
            total_bytes: free.map(|f| f * 2),
            free_bytes: free,
            memory_source: None,
            index: 0,
        }
    }

    /// A plan leaves `--fit-target` free, however large (a budget then
    /// reaches nothing rather than wrapping around), and nothing else on a
    /// device whose runtime's products need no library; by default 1 GiB
    /// where free memory is measured, nothing where only a heap is known.
    #[test]
    fn a_plan_leaves_the_fit_target_free() {
        let measured = device("vulkan0", cleave_device::Backend::Vulkan, Some(8 << 30));
        let heap_only = device("vulkan1", cleave_device::Backend::Vulkan, None);
        let mut args = placement();
        assert_eq!(left_free(&args, &measured), 1 << 30);
        assert_eq!(left_free(&args, &heap_only), 0);
        args.fit_target = Some(0);
        assert_eq!(left_free(&args, &measured), 0);
        args.fit_target = Some(512);
        assert_eq!(left_free(&args, &measured), 512 << 20);
        assert_eq!(left_free(&args, &heap_only), 512 << 20);
        args.fit_target = Some(u64::MAX >> 10);
        assert_eq!(left_free(&args, &measured), u64::MAX);
    }

    /// The plan says what it leaves free, once for the devices that leave
    /// alike (a logical device named once), nothing for those that leave
    /// nothing.
    #[test]
    fn a_plan_notes_what_it_leaves_free() {
        let cuda = (1 << 30, 32 << 20);
        let unplanned = [
            ("cuda0".to_string(), cuda),
            ("cuda0".to_string(), cuda),
            ("vulkan0".to_string(), (0, 0)),
            ("vulkan1".to_string(), (512 << 20, 0)),
            ("cuda1".to_string(), cuda),
        ];
        assert_eq!(
            unplanned_notes(&unplanned),
            [
                "left free on cuda0, cuda1: 1.0 GiB (--fit-target) and 32.0 MiB (cuBLAS's workspace)",
                "left free on vulkan1: 512.0 MiB (--fit-target)",
            ]
        );
    }

    /// Across runtimes, a language model runs in layer or expert split;
    /// row and tensor split, and other modules, are refused naming each
    /// member's runtime. Within one runtime every split is let through.
    #[test]
    fn what_may_span_runtimes() {
        let member = |name, backend| (device(name, backend, None), None);
        let one_runtime = [
            member("cuda0", cleave_device::Backend::Cuda),
            member("cuda1", cleave_device::Backend::Cuda),
        ];
        check_spanning_runtimes(&one_runtime, "vae", SplitMode::Row).unwrap();
        let group = [
            member("cuda0", cleave_device::Backend::Cuda),
            member("vulkan1", cleave_device::Backend::Vulkan),
        ];
        for mode in [SplitMode::Layer, SplitMode::Expert] {
            check_spanning_runtimes(&group, "llm", mode).unwrap();
        }
        for mode in [SplitMode::Row, SplitMode::Tensor] {
            let error = check_spanning_runtimes(&group, "llm", mode).unwrap_err().to_string();
            for needle in [
                &format!("--split-mode {mode}"),
                "cuda0 (cuda)",
                "vulkan1 (wgpu)",
                "layer",
            ] {
                assert!(error.contains(needle), "{error}: lacks {needle}");
            }
        }
        let error = check_spanning_runtimes(&group, "te", SplitMode::Layer)
            .unwrap_err()
            .to_string();
        assert!(error.contains("the te module's group spans runtimes"), "{error}");
    }
}
