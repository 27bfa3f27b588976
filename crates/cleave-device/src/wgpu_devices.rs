//! wgpu adapters: Vulkan, Metal, DX12 (and WebGPU in a browser).

use std::sync::{Arc, Mutex};

use cubecl::prelude::*;
use cubecl::wgpu::{init_device, RuntimeOptions, WgpuDevice, WgpuRuntime, WgpuSetup};

use crate::{Backend, DeviceError, DeviceInfo, MemorySource};

/// Logical devices that dropped groups gave back, with their adapter's
/// name. cubecl keeps every client it is given for the life of the
/// process, each with a thread that polls it: a process that opens groups
/// again and again (the tests, the benches) takes these back instead of
/// opening more, which would leave ever more threads polling.
static IDLE: Mutex<Vec<(String, WgpuDevice)>> = Mutex::new(Vec::new());

/// A logical device on loan to a group, given back when the last member
/// holding it is dropped.
#[derive(Debug)]
pub(crate) struct Lease {
    adapter: String,
    device: WgpuDevice,
}

impl Lease {
    pub(crate) fn device(&self) -> &WgpuDevice {
        &self.device
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // The next group starts with no memory pooled by this one.
        WgpuRuntime::client(&self.device).memory_cleanup();
        if let Ok(mut idle) = IDLE.lock() {
            idle.push((self.adapter.clone(), self.device.clone()));
        }
    }
}

fn backends() -> wgpu::Backends {
    wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12 | wgpu::Backends::BROWSER_WEBGPU
}

fn instance() -> wgpu::Instance {
    wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: backends(),
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    })
}

fn backend_of(backend: wgpu::Backend) -> Option<Backend> {
    match backend {
        wgpu::Backend::Vulkan => Some(Backend::Vulkan),
        wgpu::Backend::Metal => Some(Backend::Metal),
        wgpu::Backend::Dx12 => Some(Backend::Dx12),
        wgpu::Backend::BrowserWebGpu => Some(Backend::Webgpu),
        _ => None,
    }
}

fn device_type(kind: wgpu::DeviceType) -> &'static str {
    match kind {
        wgpu::DeviceType::DiscreteGpu => "discrete",
        wgpu::DeviceType::IntegratedGpu => "integrated",
        wgpu::DeviceType::VirtualGpu => "virtual",
        wgpu::DeviceType::Cpu => "cpu",
        wgpu::DeviceType::Other => "other",
    }
}

/// The adapters in a stable order, each with its cleave description.
fn adapters(instance: &wgpu::Instance) -> Vec<(DeviceInfo, wgpu::Adapter)> {
    let mut found: Vec<(DeviceInfo, wgpu::Adapter)> = Vec::new();
    for adapter in pollster::block_on(instance.enumerate_adapters(backends())) {
        let info = adapter.get_info();
        let Some(backend) = backend_of(info.backend) else {
            continue;
        };
        let index = found.iter().filter(|(d, _)| d.backend == backend).count();
        let memory = memory_of(&adapter);
        let device = DeviceInfo {
            name: format!("{}{index}", backend.prefix()),
            backend,
            adapter: info.name.clone(),
            device_type: device_type(info.device_type).to_string(),
            total_bytes: memory.map(|m| m.total),
            free_bytes: memory.and_then(|m| m.free),
            memory_source: memory.map(|m| m.source),
            index,
        };
        found.push((device, adapter));
    }
    found
}

/// What the adapter's backend says of its memory: Vulkan does (see
/// `vulkan_memory`); wgpu has no such query for the others.
fn memory_of(adapter: &wgpu::Adapter) -> Option<Memory> {
    #[cfg(not(any(target_vendor = "apple", target_arch = "wasm32")))]
    if adapter.get_info().backend == wgpu::Backend::Vulkan {
        return crate::vulkan_memory::of(adapter);
    }
    let _ = adapter;
    None
}

/// An adapter's device memory, and where the numbers come from.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Memory {
    pub(crate) total: u64,
    pub(crate) free: Option<u64>,
    pub(crate) source: MemorySource,
}

pub(crate) fn list() -> Vec<DeviceInfo> {
    adapters(&instance()).into_iter().map(|(info, _)| info).collect()
}

/// A logical device (its own wgpu device and queue, registered with cubecl
/// as its own client) on the adapter `info` names: one given back earlier,
/// else a new one.
pub(crate) fn open(info: &DeviceInfo) -> Result<Arc<Lease>, DeviceError> {
    let reused = IDLE.lock().ok().and_then(|mut idle| {
        let at = idle.iter().position(|(adapter, _)| *adapter == info.name)?;
        Some(idle.swap_remove(at).1)
    });
    let device = match reused {
        Some(device) => device,
        None => open_new(info)?,
    };
    Ok(Arc::new(Lease {
        adapter: info.name.clone(),
        device,
    }))
}

fn open_new(info: &DeviceInfo) -> Result<WgpuDevice, DeviceError> {
    let instance = instance();
    let (_, adapter) = adapters(&instance)
        .into_iter()
        .find(|(d, _)| d.name == info.name)
        .ok_or_else(|| DeviceError::Open {
            name: info.name.clone(),
            reason: "the adapter disappeared".into(),
        })?;
    let backend = adapter.get_info().backend;
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some(&info.name),
        // Everything the adapter offers (f16, subgroups, ...), except
        // mappable primary buffers, which cubecl does not use.
        required_features: adapter.features().difference(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS),
        required_limits: adapter.limits(),
        memory_hints: wgpu::MemoryHints::MemoryUsage,
        trace: wgpu::Trace::Off,
        experimental_features: wgpu::ExperimentalFeatures::disabled(),
    }))
    .map_err(|e| DeviceError::Open {
        name: info.name.clone(),
        reason: e.to_string(),
    })?;
    let setup = WgpuSetup {
        instance,
        adapter,
        device,
        queue,
        backend,
    };
    Ok(init_device(setup, RuntimeOptions::default()))
}
