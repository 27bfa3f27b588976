use serde::Serialize;

/// The API a device is driven through. Its lowercase name is the prefix of
/// the device names (`vulkan0`, `cuda1`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Cuda,
    Vulkan,
    Metal,
    Dx12,
    Webgpu,
}

impl Backend {
    /// The cubecl runtime that drives this backend: every wgpu backend
    /// shares one.
    pub fn runtime(self) -> &'static str {
        match self {
            Backend::Cuda => "cuda",
            _ => "wgpu",
        }
    }

    pub fn prefix(self) -> &'static str {
        match self {
            Backend::Cuda => "cuda",
            Backend::Vulkan => "vulkan",
            Backend::Metal => "metal",
            Backend::Dx12 => "dx12",
            Backend::Webgpu => "webgpu",
        }
    }
}

/// Where a device's memory numbers come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemorySource {
    /// CUDA's `cuMemGetInfo`: total, and free now.
    Driver,
    /// Vulkan's `VK_EXT_memory_budget`: the device-local heaps' size, and
    /// the budget the driver gives this process less what it already uses.
    MemoryBudget,
    /// The device-local heaps' size only (Vulkan without the budget
    /// extension): free memory is unknown.
    HeapSize,
}

impl MemorySource {
    /// How `cleave devices` names it.
    pub fn label(self) -> &'static str {
        match self {
            MemorySource::Driver => "driver",
            MemorySource::MemoryBudget => "memory-budget",
            MemorySource::HeapSize => "heap-size",
        }
    }
}

/// One device as `cleave devices` lists it.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceInfo {
    /// `vulkan0`, `cuda1`, ...: the backend's prefix and its index among
    /// that backend's devices.
    pub name: String,
    pub backend: Backend,
    /// The adapter's own name, e.g. "NVIDIA H100" or "llvmpipe (LLVM 15.0.6, 256 bits)".
    pub adapter: String,
    /// discrete, integrated, virtual, cpu or other.
    pub device_type: String,
    /// Total memory, where the backend reports it (CUDA and Vulkan do;
    /// Metal, DX12 and WebGPU through wgpu do not).
    pub total_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
    /// Where `total_bytes` and `free_bytes` come from, when known.
    pub memory_source: Option<MemorySource>,
    /// The index of this device among its backend's devices.
    #[serde(skip)]
    pub index: usize,
}

impl DeviceInfo {
    /// How much we prefer this device when none is named: real GPUs first,
    /// software rasterisers last.
    pub(crate) fn preference(&self) -> u8 {
        let kind = match self.device_type.as_str() {
            "discrete" => 0,
            "integrated" => 1,
            "virtual" => 2,
            "other" => 3,
            _ => 4,
        };
        match self.backend {
            Backend::Cuda => 0,
            _ => 1 + kind,
        }
    }
}

/// Every device this machine has, CUDA first (when built with the `cuda`
/// feature and a driver is installed), then wgpu adapters.
pub fn list_devices() -> Vec<DeviceInfo> {
    let mut devices = Vec::new();
    #[cfg(feature = "cuda")]
    devices.extend(crate::cuda_devices::list());
    devices.extend(crate::wgpu_devices::list());
    devices
}
