//! CUDA devices, found through the driver library at run time: a machine
//! without one simply has no CUDA devices.

use cubecl::cuda::CudaDevice;
use cudarc::driver::{result, CudaContext};

use crate::{Backend, DeviceInfo};

fn driver_present() -> bool {
    // SAFETY: only tries to load the driver library.
    let loaded = unsafe { cudarc::driver::sys::is_culib_present() };
    loaded && result::init().is_ok()
}

pub(crate) fn list() -> Vec<DeviceInfo> {
    if !driver_present() {
        return Vec::new();
    }
    let count = CudaContext::device_count().unwrap_or(0).max(0) as usize;
    (0..count)
        .filter_map(|index| {
            let context = CudaContext::new(index).ok()?;
            let (free, total) = context.mem_get_info().ok()?;
            Some(DeviceInfo {
                name: format!("cuda{index}"),
                backend: Backend::Cuda,
                adapter: context.name().unwrap_or_else(|_| "CUDA device".into()),
                device_type: "discrete".into(),
                total_bytes: Some(total as u64),
                free_bytes: Some(free as u64),
                index,
            })
        })
        .collect()
}

pub(crate) fn open(info: &DeviceInfo) -> CudaDevice {
    CudaDevice::new(info.index)
}
