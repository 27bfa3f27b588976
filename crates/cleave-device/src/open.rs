use std::ops::Range;
use std::sync::Arc;

use cubecl::prelude::*;
use cubecl::wgpu::WgpuRuntime;

use crate::spec::MemberSpec;
use crate::wgpu_devices::Lease;
use crate::{list_devices, Backend, DeviceError, DeviceInfo};

/// Work that runs on whichever runtime a device group turns out to use.
///
/// Model code is generic over `cubecl::Runtime`; this is the one place that
/// picks the concrete runtime, so callers never match on backends.
pub trait RuntimeTask {
    type Output;
    /// `clients` holds one client per member of the group, in order.
    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Self::Output;
}

/// An opened (logical) device.
#[derive(Clone, Debug)]
pub struct Device {
    pub info: DeviceInfo,
    /// The user's cap, enforced on every allocation cleave makes.
    pub cap: Option<u64>,
    handle: Handle,
}

impl Device {
    /// The id cubecl knows this device's runtime client by: collective
    /// operations (NCCL's all-reduce on CUDA) name their devices with it.
    pub fn runtime_id(&self) -> cubecl::device::DeviceId {
        use cubecl::device::Device as _;
        match &self.handle {
            Handle::Wgpu(lease) => lease.device().to_id(),
            #[cfg(feature = "cuda")]
            Handle::Cuda(device) => device.to_id(),
        }
    }
}

#[derive(Clone, Debug)]
enum Handle {
    Wgpu(Arc<Lease>),
    #[cfg(feature = "cuda")]
    Cuda(cubecl::cuda::CudaDevice),
}

/// The devices one module runs on, in order.
#[derive(Clone, Debug)]
pub struct DeviceGroup {
    pub members: Vec<Device>,
    /// Each member in a runtime slot of its own (see
    /// [`DeviceGroup::slots`]), as if each were of another runtime.
    apart: bool,
}

/// A run of a group's members of one runtime: where one runtime's part of
/// a model lives, handing its activations to the next slot's through the
/// host.
#[derive(Clone, Debug)]
pub struct Slot {
    /// The members' places in the group.
    pub members: Range<usize>,
    /// The members, as a group of their own.
    pub group: DeviceGroup,
}

impl DeviceGroup {
    /// The group of `members`, each run of one runtime a slot.
    pub fn new(members: Vec<Device>) -> Self {
        DeviceGroup { members, apart: false }
    }

    /// This group with each member in a runtime slot of its own: the
    /// devices work together as devices of different runtimes do (each
    /// runs its own part of a model, the activations cross through the
    /// host), whatever their runtime. It lets that path run where only
    /// one runtime is at hand.
    pub fn apart(self) -> Self {
        DeviceGroup { apart: true, ..self }
    }

    /// The group's runtime slots in order: each run of consecutive
    /// members of one runtime (every member where the group is
    /// [`DeviceGroup::apart`]). A group of one runtime is one slot.
    pub fn slots(&self) -> Vec<Slot> {
        slot_ranges(&self.runtimes(), self.apart)
            .into_iter()
            .map(|members| Slot {
                group: DeviceGroup::new(self.members[members.clone()].to_vec()),
                members,
            })
            .collect()
    }

    /// The runtime each member is driven by ("cuda" or "wgpu"), in order.
    pub fn runtimes(&self) -> Vec<&'static str> {
        self.members.iter().map(|m| m.info.backend.runtime()).collect()
    }

    /// Fails, naming `what` and a member of each of two slots, where the
    /// group spans several runtime slots: for what cannot be cut into
    /// one part per runtime.
    pub fn one_runtime(&self, what: &str) -> Result<(), DeviceError> {
        let slots = self.slots();
        match slots.as_slice() {
            [first, second, ..] => Err(DeviceError::MixedRuntimes {
                what: what.to_string(),
                first: describe(&first.group.members[0]),
                other: describe(&second.group.members[0]),
            }),
            _ => Ok(()),
        }
    }

    /// Runs `task` with one client per member of the group's first
    /// runtime slot (every member, for a group of one runtime).
    pub fn run<T: RuntimeTask>(&self, task: T) -> T::Output {
        let slots = self.slots();
        if slots.len() > 1 {
            return slots[0].group.run(task);
        }
        match &self.members[0].handle {
            Handle::Wgpu(_) => task.run(self.clients(|h| match h {
                Handle::Wgpu(lease) => Some(WgpuRuntime::client(lease.device())),
                #[cfg(feature = "cuda")]
                _ => None,
            })),
            #[cfg(feature = "cuda")]
            Handle::Cuda(_) => task.run(self.clients(|h| match h {
                Handle::Cuda(d) => Some(cubecl::cuda::CudaRuntime::client(d)),
                _ => None,
            })),
        }
    }

    fn clients<R: Runtime>(&self, client: impl Fn(&Handle) -> Option<ComputeClient<R>>) -> Vec<ComputeClient<R>> {
        // `run` passes a group of one runtime only, so every member matches.
        self.members.iter().filter_map(|m| client(&m.handle)).collect()
    }

    /// Names as `cleave devices` shows them, in order.
    pub fn names(&self) -> Vec<String> {
        self.members.iter().map(|m| m.info.name.clone()).collect()
    }
}

fn open_info(info: DeviceInfo, cap: Option<u64>) -> Result<Device, DeviceError> {
    let handle = match info.backend {
        #[cfg(feature = "cuda")]
        Backend::Cuda => Handle::Cuda(crate::cuda_devices::open(&info)),
        _ => Handle::Wgpu(crate::wgpu_devices::open(&info)?),
    };
    Ok(Device { cap, info, handle })
}

fn unknown(name: &str, devices: &[DeviceInfo]) -> DeviceError {
    if cfg!(not(feature = "cuda")) && name.starts_with(Backend::Cuda.prefix()) {
        return DeviceError::NotBuilt {
            name: name.to_string(),
            runtime: "CUDA",
            feature: "cuda",
        };
    }
    DeviceError::Unknown {
        name: name.to_string(),
        available: if devices.is_empty() {
            "none".into()
        } else {
            devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join(", ")
        },
    }
}

/// The devices a group spec names, checked (they exist, a CUDA device
/// once) but not opened, each with its cap; what `cleave plan` needs.
pub fn resolve_group(members: &[MemberSpec]) -> Result<Vec<(DeviceInfo, Option<u64>)>, DeviceError> {
    resolve_among(members, &list_devices())
}

/// [`resolve_group`] among `devices`, the machine's.
fn resolve_among(
    members: &[MemberSpec],
    devices: &[DeviceInfo],
) -> Result<Vec<(DeviceInfo, Option<u64>)>, DeviceError> {
    let infos = members
        .iter()
        .map(|m| {
            devices
                .iter()
                .find(|d| d.name == m.device)
                .cloned()
                .ok_or_else(|| unknown(&m.device, devices))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(twice) = cuda_named_twice(&infos) {
        return Err(DeviceError::CudaNamedTwice {
            name: twice.name.clone(),
        });
    }
    let kept = collapse_unified_memory(&infos);
    Ok(kept.into_iter().map(|i| (infos[i].clone(), members[i].cap)).collect())
}

/// A CUDA device that `infos` names more than once: cubecl keeps one
/// client per CUDA device, so two members of it would be one.
fn cuda_named_twice(infos: &[DeviceInfo]) -> Option<&DeviceInfo> {
    infos
        .iter()
        .enumerate()
        .find(|(i, info)| info.backend == Backend::Cuda && infos[..*i].iter().any(|o| o.name == info.name))
        .map(|(_, info)| info)
}

/// Opens the group a spec names. Each member is a logical device of its
/// own, so a device named twice is opened twice, with a queue and a cap of
/// its own (a logical device a dropped group gave back is reused).
pub fn open_group(members: &[MemberSpec]) -> Result<DeviceGroup, DeviceError> {
    let members = resolve_group(members)?
        .into_iter()
        .map(|(info, cap)| open_info(info, cap))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(DeviceGroup::new(members))
}

/// The best device this machine has: a CUDA GPU, else a discrete,
/// integrated or virtual GPU, else a software adapter.
pub fn best_device() -> Result<DeviceInfo, DeviceError> {
    list_devices()
        .into_iter()
        .min_by_key(DeviceInfo::preference)
        .ok_or(DeviceError::NoneFound)
}

/// The runs of consecutive members of one runtime, given each member's
/// runtime in order; every member a run of its own where `apart`.
fn slot_ranges(runtimes: &[&str], apart: bool) -> Vec<Range<usize>> {
    let mut runs: Vec<Range<usize>> = Vec::new();
    for (i, runtime) in runtimes.iter().enumerate() {
        match runs.last_mut() {
            Some(run) if !apart && runtimes[run.start] == *runtime => run.end = i + 1,
            _ => runs.push(i..i + 1),
        }
    }
    runs
}

/// A member as errors name it: its name and runtime.
fn describe(member: &Device) -> String {
    format!("{} ({})", member.info.name, member.info.backend.runtime())
}

/// The members worth opening. Splitting a model across logical devices of
/// one unified-memory Apple GPU gains nothing (they share memory and
/// cores), so such a group collapses to its first member.
pub(crate) fn collapse_unified_memory(infos: &[DeviceInfo]) -> Vec<usize> {
    let unified = |i: &DeviceInfo| i.backend == Backend::Metal && i.device_type == "integrated";
    if infos.len() > 1 && infos.iter().all(|i| unified(i) && i.name == infos[0].name) {
        vec![0]
    } else {
        (0..infos.len()).collect()
    }
}

/// The group cleave uses when none is given: every device of the best
/// device's backend and kind (all CUDA GPUs; all discrete Vulkan GPUs; ...),
/// so that a model spreads over all of them by their free memory.
pub fn auto_group() -> Result<Vec<MemberSpec>, DeviceError> {
    let best = best_device()?;
    Ok(list_devices()
        .into_iter()
        .filter(|d| d.backend == best.backend && d.device_type == best.device_type)
        .map(|d| MemberSpec {
            device: d.name,
            cap: None,
        })
        .collect())
}

/// Opens [`best_device`] as a group of one.
pub fn open_default() -> Result<DeviceGroup, DeviceError> {
    Ok(DeviceGroup::new(vec![open_info(best_device()?, None)?]))
}

/// Opens one device by name, as a group of one.
pub fn open(name: &str) -> Result<DeviceGroup, DeviceError> {
    open_group(&[MemberSpec {
        device: name.to_string(),
        cap: None,
    }])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, backend: Backend, device_type: &str) -> DeviceInfo {
        DeviceInfo {
            name: name.into(),
            backend,
            adapter: "test".into(),
            device_type: device_type.into(),
            total_bytes: None,
            free_bytes: None,
            memory_source: None,
            index: 0,
        }
    }

    #[test]
    fn unified_memory_apple_gpu_collapses_to_one_device() {
        let m = info("metal0", Backend::Metal, "integrated");
        assert_eq!(collapse_unified_memory(&[m.clone(), m.clone(), m]), vec![0]);
    }

    /// A group naming a CUDA device twice is refused before anything is
    /// opened; a Vulkan adapter named twice is two members, each with its
    /// cap; a name the machine lacks is refused listing what it has.
    #[test]
    fn groups_are_resolved_among_the_machines_devices() {
        let devices = [
            info("cuda0", Backend::Cuda, "discrete"),
            info("cuda1", Backend::Cuda, "discrete"),
            info("vulkan0", Backend::Vulkan, "cpu"),
        ];
        let member = |device: &str, cap| MemberSpec {
            device: device.into(),
            cap,
        };
        match resolve_among(
            &[member("cuda1", None), member("vulkan0", None), member("cuda1", None)],
            &devices,
        ) {
            Err(DeviceError::CudaNamedTwice { name }) => assert_eq!(name, "cuda1"),
            other => panic!("cuda1 named twice gave {other:?}"),
        }
        let twice = resolve_among(&[member("vulkan0", Some(1)), member("vulkan0", Some(2))], &devices).unwrap();
        let resolved: Vec<_> = twice.iter().map(|(info, cap)| (info.name.as_str(), *cap)).collect();
        assert_eq!(resolved, [("vulkan0", Some(1)), ("vulkan0", Some(2))]);
        let mixed = resolve_among(&[member("cuda0", None), member("vulkan0", None)], &devices).unwrap();
        assert_eq!(mixed[0].0.backend, Backend::Cuda);
        let error = resolve_among(&[member("vulkan3", None)], &devices)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("vulkan3") && error.contains("cuda0, cuda1, vulkan0"),
            "{error}"
        );
    }

    /// A group's runtime slots are its runs of one runtime, in order.
    #[test]
    fn slots_are_runs_of_one_runtime() {
        assert_eq!(
            slot_ranges(&["cuda", "cuda", "wgpu", "wgpu", "cuda"], false),
            [0..2, 2..4, 4..5]
        );
        let whole = slot_ranges(&["wgpu", "wgpu"], false);
        assert_eq!((whole.len(), whole[0].clone()), (1, 0..2));
        assert_eq!(slot_ranges(&["wgpu", "wgpu"], true), [0..1, 1..2]);
        assert!(slot_ranges(&[], false).is_empty());
    }

    #[test]
    fn other_groups_stay_whole() {
        let v = info("vulkan0", Backend::Vulkan, "cpu");
        assert_eq!(collapse_unified_memory(&[v.clone(), v]), vec![0, 1]);
        let discrete = info("metal0", Backend::Metal, "discrete");
        assert_eq!(collapse_unified_memory(&[discrete.clone(), discrete]), vec![0, 1]);
    }
}
