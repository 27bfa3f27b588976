//! cleave's compute devices: what the machine has, named as users see them
//! (`cuda0`, `vulkan0`, `metal0`, ...), and opening one as a cubecl client.

mod bytes;
// Its listing is also built for the crate's own tests, which check that it
// says why it found no driver, without building cubecl's CUDA runtime.
#[cfg(any(feature = "cuda", test))]
mod cuda_devices;
mod error;
mod info;
mod open;
mod spec;
#[cfg(not(any(target_vendor = "apple", target_arch = "wasm32")))]
mod vulkan_memory;
mod wgpu_devices;

pub use bytes::parse_bytes;
pub use error::DeviceError;
pub use info::{list_devices, Backend, DeviceInfo, MemorySource};
pub use open::{
    auto_group, best_device, open, open_default, open_group, resolve_group, Device, DeviceGroup, RuntimeTask, Slot,
};
pub use spec::{parse_backend_spec, MemberSpec, ModuleSpec, DEFAULT_MODULE};
