//! A Vulkan adapter's memory, read as llama.cpp's Vulkan backend reads it:
//! `VK_EXT_memory_budget` where the driver has it (the budget this process
//! may use, less what it uses already), else the size of the device-local
//! heaps. The query goes to the physical device wgpu itself opened, through
//! wgpu-hal's handles, so there is no second instance to match up.

use ash::vk;

use crate::wgpu_devices::Memory;
use crate::MemorySource;

/// `adapter`'s device-local memory, or `None` if it is not a Vulkan
/// adapter or reports no device-local heap.
pub(crate) fn of(adapter: &wgpu::Adapter) -> Option<Memory> {
    // SAFETY: the hal adapter is only read, and not kept past `adapter`.
    let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }?;
    let shared = hal.shared_instance();
    let instance = shared.raw_instance();
    let physical = hal.raw_physical_device();
    // The budget comes through vkGetPhysicalDeviceMemoryProperties2, core
    // from Vulkan 1.1.
    let with_budget = shared.instance_api_version() >= vk::API_VERSION_1_1
        && hal
            .physical_device_capabilities()
            .supports_extension(ash::ext::memory_budget::NAME);
    let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
    let properties = if with_budget {
        let mut properties = vk::PhysicalDeviceMemoryProperties2::default().push_next(&mut budget);
        // SAFETY: `physical` belongs to `instance`, which supports 1.1; the
        // chained struct is the one the extension fills.
        unsafe { instance.get_physical_device_memory_properties2(physical, &mut properties) };
        properties.memory_properties
    } else {
        // SAFETY: `physical` belongs to `instance`.
        unsafe { instance.get_physical_device_memory_properties(physical) }
    };
    let count = (properties.memory_heap_count as usize).min(vk::MAX_MEMORY_HEAPS);
    let local: Vec<usize> = (0..count)
        .filter(|&i| {
            properties.memory_heaps[i]
                .flags
                .contains(vk::MemoryHeapFlags::DEVICE_LOCAL)
        })
        .collect();
    if local.is_empty() {
        return None;
    }
    let total = local.iter().map(|&i| properties.memory_heaps[i].size).sum();
    let free = with_budget.then(|| {
        local
            .iter()
            .map(|&i| budget.heap_budget[i].saturating_sub(budget.heap_usage[i]))
            .sum::<u64>()
            .min(total)
    });
    let source = match with_budget {
        true => MemorySource::MemoryBudget,
        false => MemorySource::HeapSize,
    };
    Some(Memory { total, free, source })
}
