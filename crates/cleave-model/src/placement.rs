//! A module's devices and where its plan puts each part: what every model
//! family needs to run split by layers.

use cleave_plan::Plan;
use cleave_shaders::cubecl::ir::{ElemType, FloatKind};
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::Tensor;

use crate::error::{ModelError, Result};

/// A device of the group as the loader and the model see it.
#[derive(Clone)]
pub struct Placed<R: Runtime> {
    pub name: String,
    pub client: ComputeClient<R>,
    /// Bytes cleave may allocate on it, if capped.
    pub cap: Option<u64>,
}

impl<R: Runtime> Placed<R> {
    /// The members of `group` with their clients (one per member, in order).
    pub fn group(clients: Vec<ComputeClient<R>>, group: &cleave_device::DeviceGroup) -> Vec<Self> {
        clients
            .into_iter()
            .zip(&group.members)
            .map(|(client, member)| Placed {
                name: member.info.name.clone(),
                client,
                cap: member.cap,
            })
            .collect()
    }

    /// The largest buffer one binding may address, in bytes.
    pub fn max_buffer(&self) -> usize {
        self.client.properties().memory.max_page_size as usize
    }

    /// Bytes cleave's buffers occupy on the device now.
    pub fn bytes_in_use(&self) -> Result<u64> {
        self.client
            .memory_usage()
            .map(|u| u.bytes_in_use)
            .map_err(|e| ModelError::Device(format!("{}: {e:?}", self.name)))
    }

    /// Fails like an out-of-memory error if `bytes` more would pass the cap.
    pub fn reserve(&self, bytes: u64, what: &str) -> Result<()> {
        let Some(cap) = self.cap else { return Ok(()) };
        let in_use = self.bytes_in_use()?;
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

    /// Moves `x` from device `*here` to device `to` (a no-op when they are
    /// the same): a peer copy where the runtime has one, else via the host.
    /// Models call it only where one range of blocks ends.
    pub fn hand_over(&self, x: Tensor, here: &mut usize, to: usize) -> Tensor {
        if *here == to {
            return x;
        }
        let mut from = self.devices[*here].client.clone();
        let handle = from.to_client(x.handle, &self.devices[to].client, ElemType::Float(FloatKind::F32));
        *here = to;
        Tensor { handle, shape: x.shape }
    }
}
