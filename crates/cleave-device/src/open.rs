use cubecl::prelude::*;
use cubecl::wgpu::{WgpuDevice, WgpuRuntime};

use crate::{list_devices, DeviceError, DeviceInfo};

/// Work that runs on whichever runtime a [`Device`] turns out to be.
///
/// Model code is generic over `cubecl::Runtime`; this is the one place that
/// picks the concrete runtime, so callers never match on backends.
pub trait RuntimeTask {
    type Output;
    fn run<R: Runtime>(self, client: ComputeClient<R>) -> Self::Output;
}

/// An opened device.
#[derive(Clone, Debug)]
pub struct Device {
    pub info: DeviceInfo,
    handle: Handle,
}

#[derive(Clone, Debug)]
enum Handle {
    Wgpu(WgpuDevice),
    #[cfg(feature = "cuda")]
    Cuda(cubecl::cuda::CudaDevice),
}

impl Device {
    /// Runs `task` with this device's cubecl client.
    pub fn run<T: RuntimeTask>(&self, task: T) -> T::Output {
        match &self.handle {
            Handle::Wgpu(device) => task.run(WgpuRuntime::client(device)),
            #[cfg(feature = "cuda")]
            Handle::Cuda(device) => task.run(cubecl::cuda::CudaRuntime::client(device)),
        }
    }
}

fn open_info(info: DeviceInfo) -> Result<Device, DeviceError> {
    let handle = match info.backend {
        #[cfg(feature = "cuda")]
        crate::Backend::Cuda => Handle::Cuda(crate::cuda_devices::open(&info)),
        _ => Handle::Wgpu(crate::wgpu_devices::open(&info)?),
    };
    Ok(Device { info, handle })
}

/// Opens the device called `name` (`vulkan0`, `cuda1`, ...).
pub fn open(name: &str) -> Result<Device, DeviceError> {
    let devices = list_devices();
    match devices.iter().find(|d| d.name == name) {
        Some(info) => open_info(info.clone()),
        None => Err(DeviceError::Unknown {
            name: name.to_string(),
            available: if devices.is_empty() {
                "none".into()
            } else {
                devices
                    .iter()
                    .map(|d| d.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        }),
    }
}

/// Opens the best device this machine has: a CUDA GPU, else a discrete,
/// integrated or virtual GPU, else a software adapter.
pub fn open_default() -> Result<Device, DeviceError> {
    let best = list_devices()
        .into_iter()
        .min_by_key(DeviceInfo::preference)
        .ok_or(DeviceError::NoneFound)?;
    open_info(best)
}
