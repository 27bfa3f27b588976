//! The device a benchmark runs on: the one CLEAVE_BENCH_DEVICE names (as
//! `cleave devices` lists them), else the best one.

use cleave_device::{open_group, DeviceGroup, MemberSpec};

pub fn bench_device() -> String {
    std::env::var("CLEAVE_BENCH_DEVICE").unwrap_or_else(|_| cleave_device::best_device().expect("a device").name)
}

/// `device` opened alone, with all its memory.
pub fn open_alone(device: &str) -> DeviceGroup {
    open_group(&[MemberSpec {
        device: device.to_string(),
        cap: None,
    }])
    .expect("open the device")
}
