//! CUDA devices, found through the driver library at run time: a machine
//! without one simply has no CUDA devices, and says why once.

use std::sync::Once;

#[cfg(feature = "cuda")]
use cubecl::cuda::CudaDevice;
use cudarc::driver::{result, CudaContext};

use crate::{Backend, DeviceInfo, MemorySource};

/// Whether the driver can be used, or why not. cubecl's CUDA client panics
/// without a driver, so nothing else here runs before this says yes.
fn probe() -> Result<(), String> {
    // SAFETY: only tries to load the driver library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("no CUDA driver library (libcuda) on this machine".into());
    }
    result::init().map_err(|e| format!("the CUDA driver did not initialise: {e}"))
}

pub(crate) fn list() -> Vec<DeviceInfo> {
    if let Err(why) = probe() {
        static SAID: Once = Once::new();
        SAID.call_once(|| eprintln!("cuda: {why}; listing the other devices only"));
        return Vec::new();
    }
    let count = CudaContext::device_count().unwrap_or(0).max(0) as usize;
    (0..count)
        .filter_map(|index| {
            let context = CudaContext::new(index).ok()?;
            // cuMemGetInfo: what the driver says is free now, other
            // processes' allocations excluded.
            let (free, total) = context.mem_get_info().ok()?;
            Some(DeviceInfo {
                name: format!("cuda{index}"),
                backend: Backend::Cuda,
                adapter: context.name().unwrap_or_else(|_| "CUDA device".into()),
                device_type: "discrete".into(),
                total_bytes: Some(total as u64),
                free_bytes: Some(free as u64),
                memory_source: Some(MemorySource::Driver),
                index,
            })
        })
        .collect()
}

#[cfg(feature = "cuda")]
pub(crate) fn open(info: &DeviceInfo) -> CudaDevice {
    CudaDevice::new(info.index)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without a driver (CI), listing finds no CUDA device and
    /// the reason names the missing library; with one, every device found
    /// reports its memory.
    #[test]
    fn listing_never_panics_and_says_why_when_empty() {
        let devices = list();
        match probe() {
            Err(why) => {
                assert!(devices.is_empty());
                assert!(why.contains("libcuda") || why.contains("initialise"), "{why}");
            }
            Ok(()) => assert!(devices
                .iter()
                .all(|d| d.total_bytes.is_some() && d.free_bytes.is_some())),
        }
    }
}
