//! The kernels of a profiled pass as `--profile` reports them (`cleave
//! run`: per decode token; `cleave bench`: per prompt pass): each kernel's
//! launches and device time per unit, and its share of the device time.

use std::time::Duration;

use cleave_shaders::profile::KernelTime;
use serde_json::{json, Value};

pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Device time per `unit` of `kernels`, timed over `count` units.
pub fn device_time(kernels: &[KernelTime], count: usize) -> Duration {
    kernels.iter().map(|k| k.time).sum::<Duration>() / count.max(1) as u32
}

/// A header and a row per kernel, longest first, over `count` units.
pub fn kernel_table(kernels: &[KernelTime], count: usize, unit: &str) -> String {
    let device = device_time(kernels, count);
    let per = count.max(1) as f64;
    let mut text = format!(
        "device time per {unit}: {:.0} us (each launch waited for; an idle wait taken off)\n\
         {:<20} {:>15} {:>10} {:>7}\n",
        us(device),
        "kernel",
        format!("launches/{unit}"),
        format!("us/{unit}"),
        "share"
    );
    for k in kernels {
        text.push_str(&format!(
            "{:<20} {:>15.1} {:>10.1} {:>6.1}%\n",
            k.kernel,
            k.launches as f64 / per,
            us(k.time) / per,
            100.0 * k.time.as_secs_f64() / per / device.as_secs_f64().max(f64::MIN_POSITIVE)
        ));
    }
    text
}

/// The same rows for `--format json`, times in microseconds.
pub fn kernels_json(kernels: &[KernelTime], count: usize, unit: &str) -> Value {
    let per = count.max(1) as f64;
    Value::Array(
        kernels
            .iter()
            .map(|k| {
                json!({
                    "kernel": k.kernel,
                    format!("launches_per_{unit}"): k.launches as f64 / per,
                    format!("us_per_{unit}"): us(k.time) / per,
                })
            })
            .collect(),
    )
}
