//! A module's devices and where its plan puts each part: what every model
//! family needs to run split across a group. Model code touches placement
//! at block boundaries only: [`Placement::run_blocks`] moves activations
//! where one device's range of blocks ends, and [`PerDevice`] makes a
//! value (a rotary table, a pass's key ranges) once on each device that
//! asks for it.

use std::cell::OnceCell;
use std::ops::Range;
use std::sync::Arc;

use cleave_device::{DeviceGroup, DeviceInfo};
use cleave_plan::{Member, Plan, SplitMode};
use cleave_shaders::cubecl::device::DeviceId;
use cleave_shaders::cubecl::ir::{ElemType, FloatKind};
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::cubecl::server::{ReduceOperation, ServerCommunication};
use cleave_shaders::{add_assign, profile, Tensor};

use crate::error::{ModelError, Result};
use crate::fault::{Fault, FaultKind};

/// Devices, with their caps, as the planner sees them. Each may use its
/// cap, else its share of the memory its backend reports free, less what
/// is to stay free on the device (`left_free`), else an unknown amount.
/// Logical devices opened on one adapter share its memory equally, with
/// those of other groups on it (`elsewhere`: a name for each logical
/// device other groups of the same process open); where the backend
/// reports only the heap size (Vulkan without the budget extension), the
/// heap stands for free memory, as llama.cpp takes it.
pub fn plan_members_of<'a>(
    devices: impl IntoIterator<Item = (&'a DeviceInfo, Option<u64>)>,
    elsewhere: &[String],
    left_free: impl Fn(&DeviceInfo) -> u64,
) -> Vec<Member> {
    let devices: Vec<(&DeviceInfo, Option<u64>)> = devices.into_iter().collect();
    let sharing = |info: &DeviceInfo| {
        let here = devices.iter().filter(|(other, _)| other.name == info.name).count();
        (here + elsewhere.iter().filter(|name| **name == info.name).count()) as u64
    };
    devices
        .iter()
        .map(|&(info, cap)| Member {
            name: info.name.clone(),
            runtime: Some(info.backend.runtime().to_string()),
            budget: cap.or_else(|| {
                let free = info.free_bytes.or(info.total_bytes)?;
                Some(free.saturating_sub(left_free(info)) / sharing(info))
            }),
        })
        .collect()
}

/// The members of an opened `group` as the planner sees them.
pub fn plan_members(group: &DeviceGroup) -> Vec<Member> {
    plan_members_of(group.members.iter().map(|m| (&m.info, m.cap)), &[], |_| 0)
}

/// A device of the group as the loader and the model see it.
#[derive(Clone)]
pub struct Placed<R: Runtime> {
    pub name: String,
    pub client: ComputeClient<R>,
    /// The id of `client`'s device, for collective operations.
    pub id: DeviceId,
    /// Bytes cleave may allocate on it, if capped.
    pub cap: Option<u64>,
    /// A failure the tests arm (see [`Fault`]).
    pub fault: Option<Arc<Fault>>,
}

impl<R: Runtime> Placed<R> {
    /// The members of `group` with their clients (one per member, in order).
    pub fn group(clients: Vec<ComputeClient<R>>, group: &DeviceGroup) -> Vec<Self> {
        clients
            .into_iter()
            .zip(&group.members)
            .map(|(client, member)| Placed {
                name: member.info.name.clone(),
                client,
                id: member.runtime_id(),
                cap: member.cap,
                fault: None,
            })
            .collect()
    }

    /// Arms the fault `CLEAVE_INJECT_FAULT` names for a member of the
    /// group named `group`, if it names one.
    pub fn arm_faults(devices: &mut [Self], group: &str) -> Result<()> {
        for (i, device) in devices.iter_mut().enumerate() {
            device.fault = Fault::from_env(group, i)?;
        }
        Ok(())
    }

    /// Counts an event against an armed fault.
    fn fault_check(&self, kind: FaultKind) -> Result<()> {
        self.fault.as_ref().map_or(Ok(()), |f| f.check(kind, &self.name))
    }

    /// The largest buffer one binding may address, in bytes.
    pub fn max_buffer(&self) -> usize {
        self.client.properties().memory.max_page_size as usize
    }

    /// Bytes cleave's buffers occupy on the device now.
    pub fn bytes_in_use(&self) -> Result<u64> {
        self.memory().map(|(in_use, _)| in_use)
    }

    /// Bytes cleave's buffers occupy on the device now, and bytes cubecl
    /// holds on it for them (its pools' whole pages).
    pub fn memory(&self) -> Result<(u64, u64)> {
        self.client
            .memory_usage()
            .map(|u| (u.bytes_in_use, u.bytes_reserved))
            .map_err(|e| ModelError::Device(format!("{}: {e:?}", self.name)))
    }

    /// Runs `upload`, which allocates what lasts as long as the model or
    /// a context (its weights, its KV caches), with every buffer it makes
    /// on this device a buffer of its own size (cubecl's persistent
    /// memory, where a freed buffer is reused by one of the same size).
    /// cubecl's pools would slice each out of a page of up to a quarter of
    /// the device's memory (CUDA) or its largest binding (wgpu), whose
    /// unused rest the device then holds beyond what the plan counts.
    pub fn lasting<T: Send>(&self, upload: impl FnOnce() -> T + Send) -> Result<T> {
        self.client
            .memory_persistent_allocation((), |()| upload())
            .map_err(|e| ModelError::Device(format!("{}: {e:?}", self.name)))
    }

    /// Fails like an out-of-memory error if `bytes` more would pass the cap.
    pub fn reserve(&self, bytes: u64, what: &str) -> Result<()> {
        self.fault_check(FaultKind::Alloc)?;
        let Some(cap) = self.cap else { return Ok(()) };
        let mut in_use = self.bytes_in_use()?;
        if in_use + bytes > cap {
            cleave_shaders::release_idle_workspace(&self.client);
            in_use = self.bytes_in_use()?;
        }
        if in_use + bytes > cap {
            return Err(ModelError::OutOfMemory {
                device: self.name.clone(),
                what: what.to_string(),
                needed: bytes,
                in_use,
                cap,
            });
        }
        Ok(())
    }
}

/// The devices of a module's group and the plan that places it on them.
pub struct Placement<R: Runtime> {
    devices: Vec<Placed<R>>,
    plan: Plan,
}

impl<R: Runtime> Placement<R> {
    pub fn new(devices: Vec<Placed<R>>, plan: Plan) -> Self {
        Placement { devices, plan }
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub fn devices(&self) -> &[Placed<R>] {
        &self.devices
    }

    pub fn client(&self, device: usize) -> &ComputeClient<R> {
        &self.devices[device].client
    }

    /// The largest buffer every device's bindings can address.
    pub fn max_buffer(&self) -> usize {
        self.devices.iter().map(Placed::max_buffer).min().unwrap_or(usize::MAX)
    }

    /// Bytes cleave's buffers occupy on each device now.
    pub fn bytes_in_use(&self) -> Result<Vec<u64>> {
        self.devices.iter().map(Placed::bytes_in_use).collect()
    }

    /// Bytes the model's weights and caches occupy on each device now: what
    /// is in use once this thread's workspace has let go of the buffers no
    /// tensor holds (the activations of past passes, which the plan counts
    /// as compute, not as weights).
    pub fn model_bytes_in_use(&self) -> Result<Vec<u64>> {
        for device in &self.devices {
            cleave_shaders::release_idle_workspace(&device.client);
        }
        self.bytes_in_use()
    }

    /// Lets each device go of the buffers no tensor holds any more (this
    /// thread's idle workspace, cubecl's free pages and buffers), such as
    /// what loading made and dropped (an adapter's update merged into a
    /// weight): cubecl keeps a freed buffer of persistent memory (see
    /// [`Placed::lasting`]) for another of its exact size, which may never
    /// be asked for.
    pub fn release_freed(&self) {
        for device in &self.devices {
            cleave_shaders::release_idle_workspace(&device.client);
            device.client.memory_cleanup();
        }
    }

    /// Moves `x` from device `*here` to device `to` (a no-op when they are
    /// the same). Layer split calls it only where one range of blocks ends.
    pub fn hand_over<A: Activations>(&self, x: A, here: &mut usize, to: usize) -> A {
        let moved = x.moved(self, *here, to);
        *here = to;
        moved
    }

    /// Runs blocks `0..count` in order over `x` (on the head device), each
    /// on its home device: `x` moves only where one device's range ends.
    /// `block(i, device, x)` runs block `i`. Returns `x` and the device it
    /// is on, the last block's.
    pub fn run_blocks<A: Activations>(
        &self,
        x: A,
        count: usize,
        block: impl FnMut(usize, usize, A) -> Result<A>,
    ) -> Result<(A, usize)> {
        self.run_blocks_from(x, self.plan.head_device(), 0..count, block)
    }

    /// [`Placement::run_blocks`] over `blocks` only, `x` starting on
    /// device `here`: a part of a model spanning runtimes runs its own.
    pub fn run_blocks_from<A: Activations>(
        &self,
        x: A,
        mut here: usize,
        blocks: Range<usize>,
        mut block: impl FnMut(usize, usize, A) -> Result<A>,
    ) -> Result<(A, usize)> {
        let mut x = x;
        for i in blocks {
            let home = self.plan.home_of_block(i);
            x = self.hand_over(x, &mut here, home);
            for member in self.members_running(home) {
                self.devices[member].fault_check(FaultKind::Launch)?;
            }
            x = block(i, home, x)?;
        }
        Ok((x, here))
    }

    /// The members that run a part of a block whose home is `home`: the
    /// home alone in layer split; in row, tensor and expert split also
    /// every member holding a slice of the block (rows, heads, experts).
    fn members_running(&self, home: usize) -> impl Iterator<Item = usize> + '_ {
        let sliced = self.plan.mode != SplitMode::Layer;
        self.plan.devices.iter().enumerate().filter_map(move |(i, d)| {
            let holds_slice = !d.rows.is_empty() || d.heads.is_some() || d.experts.is_some();
            (i == home || (sliced && holds_slice)).then_some(i)
        })
    }

    /// `x` (on device `from`) as a tensor on device `to`: the same tensor
    /// when they are the same, else a peer copy where the runtime has one,
    /// a copy through the host otherwise.
    pub fn copy_to(&self, x: &Tensor, from: usize, to: usize) -> Tensor {
        if from == to {
            return x.clone();
        }
        let handle = profile::copy_to_client(&self.devices[from].client, &x.handle, &self.devices[to].client);
        Tensor::from_handle(handle, &x.shape)
    }

    /// The sum of `partials` (one per device that computed one) on device
    /// `to`: the all-reduce of tensor split. Where the runtime has
    /// collective operations (NCCL on CUDA) and every partial is on a
    /// device of its own, they sum the partials in place; elsewhere each
    /// partial is copied to `to` and added there in device order, which
    /// works on every backend and gives the same sum every run.
    pub fn all_reduce(&self, partials: Vec<(usize, Tensor)>, to: usize) -> Result<Tensor> {
        if <R::Server as ServerCommunication>::SERVER_COMM_ENABLED {
            if let Some(ids) = self.collective_ids(&partials, to) {
                return self.all_reduce_collective(partials, to, ids);
            }
        }
        let mut sum: Option<Tensor> = None;
        for (device, partial) in partials {
            let here = self.copy_to(&partial, device, to);
            match &sum {
                None => sum = Some(here),
                Some(total) => add_assign(self.client(to), total, &here)?,
            }
        }
        sum.ok_or_else(|| ModelError::Device("all-reduce of nothing".into()))
    }

    /// The runtime ids of the devices holding `partials`, if a collective
    /// can sum them: each on a device of its own (a communicator has one
    /// rank per device), `to` among them.
    fn collective_ids(&self, partials: &[(usize, Tensor)], to: usize) -> Option<Vec<DeviceId>> {
        let ids: Vec<DeviceId> = partials.iter().map(|(device, _)| self.devices[*device].id).collect();
        let distinct = ids.iter().enumerate().all(|(i, id)| !ids[..i].contains(id));
        let includes_to = partials.iter().any(|(device, _)| *device == to);
        (distinct && includes_to && partials.len() > 1).then_some(ids)
    }

    /// The all-reduce as one collective over the partials' devices: each
    /// device sums every partial into a buffer of its own; `to`'s is the
    /// result.
    fn all_reduce_collective(&self, partials: Vec<(usize, Tensor)>, to: usize, ids: Vec<DeviceId>) -> Result<Tensor> {
        let mut result = None;
        for (device, partial) in &partials {
            let mut client = self.client(*device).clone();
            let sum = Tensor::empty(&client, &partial.shape);
            profile::launch(&client.clone(), "all_reduce", || {
                client.all_reduce(
                    partial.handle.clone(),
                    sum.handle.clone(),
                    ElemType::Float(FloatKind::F32),
                    ids.clone(),
                    ReduceOperation::Sum,
                )
            });
            if *device == to {
                result = Some(sum);
            }
        }
        for (device, _) in &partials {
            self.client(*device).sync_collective();
        }
        result.ok_or_else(|| ModelError::Device("all-reduce without its destination".into()))
    }
}

/// A model loaded onto a device group: where its parts live.
pub trait PlacedModel<R: Runtime> {
    fn placement(&self) -> &Placement<R>;
}

/// Implements [`PlacedModel`] for a model type generic over the runtime
/// that keeps its placement in a field named `placement`.
#[macro_export]
macro_rules! placed_model {
    ($model:ident) => {
        impl<R: cleave_shaders::cubecl::Runtime> $crate::PlacedModel<R> for $model<R> {
            fn placement(&self) -> &$crate::Placement<R> {
                &self.placement
            }
        }
    };
}

/// What a block loop carries from device to device: one stream of hidden
/// states, or several (a FLUX double block's text and image streams).
pub trait Activations: Sized {
    /// These activations on device `to` (the same when `from == to`).
    fn moved<R: Runtime>(self, placement: &Placement<R>, from: usize, to: usize) -> Self;
}

impl Activations for Tensor {
    fn moved<R: Runtime>(self, placement: &Placement<R>, from: usize, to: usize) -> Self {
        placement.copy_to(&self, from, to)
    }
}

impl<A: Activations, B: Activations> Activations for (A, B) {
    fn moved<R: Runtime>(self, placement: &Placement<R>, from: usize, to: usize) -> Self {
        (self.0.moved(placement, from, to), self.1.moved(placement, from, to))
    }
}

impl<A: Activations> Activations for Option<A> {
    fn moved<R: Runtime>(self, placement: &Placement<R>, from: usize, to: usize) -> Self {
        self.map(|a| a.moved(placement, from, to))
    }
}

/// A value each device needs its own copy of (a rotary table, a pass's
/// key ranges, a bias), made on a device the first time it is asked for
/// there and kept for the rest of the pass.
pub struct PerDevice<'a, T> {
    values: Vec<OnceCell<T>>,
    make: Box<dyn Fn(usize) -> Result<T> + 'a>,
}

impl<'a, T> PerDevice<'a, T> {
    /// `make(device)` makes the value on `device`.
    pub fn new<R: Runtime>(placement: &Placement<R>, make: impl Fn(usize) -> Result<T> + 'a) -> Self {
        PerDevice {
            values: placement.devices().iter().map(|_| OnceCell::new()).collect(),
            make: Box::new(make),
        }
    }

    /// The value on `device`, made now if it is the first time.
    pub fn get(&self, device: usize) -> Result<&T> {
        let cell = self
            .values
            .get(device)
            .ok_or_else(|| ModelError::Device(format!("no device #{device} in this group")))?;
        if let Some(value) = cell.get() {
            return Ok(value);
        }
        let value = (self.make)(device)?;
        Ok(cell.get_or_init(|| value))
    }
}

#[cfg(test)]
mod tests {
    use cleave_device::{Backend, MemorySource};

    use super::*;

    fn vulkan(name: &str, total: u64, free: Option<u64>) -> DeviceInfo {
        DeviceInfo {
            name: name.into(),
            backend: Backend::Vulkan,
            adapter: "test".into(),
            device_type: "discrete".into(),
            total_bytes: Some(total),
            free_bytes: free,
            memory_source: Some(match free {
                Some(_) => MemorySource::MemoryBudget,
                None => MemorySource::HeapSize,
            }),
            index: 0,
        }
    }

    #[test]
    fn logical_devices_share_their_adapter_and_caps_come_first() {
        let a = vulkan("vulkan0", 12 << 30, Some(9 << 30));
        let b = vulkan("vulkan1", 8 << 30, None);
        let budgets_leaving = |elsewhere: &[String], left: u64| -> Vec<Option<u64>> {
            plan_members_of(
                [(&a, None), (&a, None), (&a, Some(1 << 30)), (&b, None)],
                elsewhere,
                |_| left,
            )
            .into_iter()
            .map(|m| m.budget)
            .collect()
        };
        let budgets = |elsewhere: &[String]| budgets_leaving(elsewhere, 0);
        // Three logical devices on vulkan0 share its free 9 GiB; the capped
        // one keeps its cap; vulkan1 reports only its heap, which stands in.
        assert_eq!(
            budgets(&[]),
            [Some(3 << 30), Some(3 << 30), Some(1 << 30), Some(8 << 30)]
        );
        // Another group opens vulkan0 once and vulkan1 once: four share the
        // first, two the second.
        let elsewhere = ["vulkan0".to_string(), "vulkan1".to_string()];
        let quarter = 9 << 28;
        assert_eq!(
            budgets(&elsewhere),
            [Some(quarter), Some(quarter), Some(1 << 30), Some(4 << 30)]
        );
        // What is to stay free is left once on each adapter, before its
        // logical devices share the rest; a cap is cleave's alone.
        assert_eq!(
            budgets_leaving(&elsewhere, 1 << 30),
            [Some(2 << 30), Some(2 << 30), Some(1 << 30), Some(7 << 29)]
        );
    }
}
