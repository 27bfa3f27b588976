//! Rotary embeddings against transformers' formulas, written out here in
//! f64 and never taken from the code under test:
//!
//! - `ModelConfig::inv_freq` for default, linear and llama3 scaling, read
//!   from edited copies of fixture configs in both config.json layouts;
//! - the host cos/sin table (`rope_table`, which `RopeTable`
//!   uploads) against `cos(pos · inv_freq)`;
//! - the rope kernel, through a `RopeTable`, against the rotation in f64.

mod common;

use std::f64::consts::PI;

use cleave_device::RuntimeTask;
use cleave_models::ModelConfig;
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{RopeTable, RowIndex, Tensor};
use serde_json::{json, Value};

/// transformers' `_compute_default_rope_parameters`:
/// `1 / base^(arange(0, dim, 2) / dim)`.
fn default_inv_freq(base: f64, dim: usize) -> Vec<f64> {
    (0..dim)
        .step_by(2)
        .map(|i| 1.0 / base.powf(i as f64 / dim as f64))
        .collect()
}

/// `_compute_linear_scaling_rope_parameters`: `inv_freq / factor`.
fn linear_inv_freq(base: f64, dim: usize, factor: f64) -> Vec<f64> {
    default_inv_freq(base, dim).into_iter().map(|f| f / factor).collect()
}

/// `_compute_llama3_parameters`: wavelengths shorter than
/// `old_context / high_freq_factor` keep their frequency, longer than
/// `old_context / low_freq_factor` are divided by `factor`, and those in
/// between are interpolated by `smooth = (old_context / wavelen - low) /
/// (high - low)`: `(1 - smooth) · f / factor + smooth · f`.
fn llama3_inv_freq(base: f64, dim: usize, factor: f64, low: f64, high: f64, old_context: f64) -> Vec<f64> {
    let (low_freq_wavelen, high_freq_wavelen) = (old_context / low, old_context / high);
    default_inv_freq(base, dim)
        .into_iter()
        .map(|f| {
            let wavelen = 2.0 * PI / f;
            if wavelen < high_freq_wavelen {
                f
            } else if wavelen > low_freq_wavelen {
                f / factor
            } else {
                let smooth = (old_context / wavelen - low) / (high - low);
                (1.0 - smooth) * f / factor + smooth * f
            }
        })
        .collect()
}

/// How many of `want`'s frequencies llama3 keeps, interpolates and divides.
fn llama3_regions(base: f64, dim: usize, low: f64, high: f64, old_context: f64) -> [usize; 3] {
    let mut regions = [0; 3];
    for f in default_inv_freq(base, dim) {
        let wavelen = 2.0 * PI / f;
        regions[if wavelen < old_context / high {
            0
        } else if wavelen > old_context / low {
            2
        } else {
            1
        }] += 1;
    }
    regions
}

/// `fixture`'s config.json edited by `edit`, validated as the loader does.
fn config(fixture: &str, edit: impl FnOnce(&mut Value)) -> ModelConfig {
    let dir = tempfile::TempDir::new().unwrap();
    let path = dir.path().join("config.json");
    std::fs::copy(common::fixture(fixture).join("config.json"), &path).unwrap();
    common::edit_json(&path, edit);
    ModelConfig::from_file(&path).unwrap_or_else(|e| panic!("{fixture}: {e}"))
}

/// transformers computes the frequencies in f32; each must be the f64
/// value to within a few f32 roundings.
#[track_caller]
fn assert_inv_freq(config: &ModelConfig, want: &[f64], what: &str) {
    let got = config.inv_freq();
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: one frequency per pair of a head's dimensions"
    );
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let relative = ((g as f64 - w) / w).abs();
        assert!(
            relative <= 1e-6,
            "{what}: inv_freq[{i}] is {g}, transformers' {w} (relative {relative:e})"
        );
    }
}

#[test]
fn default_frequencies_are_transformers() {
    // llama-tiny: transformers-4 layout, head_dim 64 / 4 = 16, theta 1e4.
    let c = config("llama-tiny", |_| {});
    assert_eq!(c.head_dim, 16);
    assert_inv_freq(&c, &default_inv_freq(10_000.0, 16), "llama-tiny");
    // qwen2-tiny: theta 1e6.
    let c = config("qwen2-tiny", |_| {});
    assert_inv_freq(&c, &default_inv_freq(1e6, c.head_dim), "qwen2-tiny");
    // transformers-5 layout, with theta inside rope_parameters.
    let c = config("llama-tiny-bf16", |v| {
        v["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 50_000.0});
    });
    assert_inv_freq(&c, &default_inv_freq(50_000.0, 16), "rope_parameters, default");
}

#[test]
fn linear_scaling_divides_every_frequency_by_the_factor() {
    // transformers 4 spells the type `type` in older configs, `rope_type` in newer ones.
    let c = config("llama-tiny", |v| {
        v["rope_scaling"] = json!({"type": "linear", "factor": 4.0});
    });
    assert_inv_freq(&c, &linear_inv_freq(10_000.0, 16, 4.0), "rope_scaling type linear");
    let c = config("llama-tiny", |v| {
        v["rope_theta"] = json!(500_000.0);
        v["rope_scaling"] = json!({"rope_type": "linear", "factor": 2.5});
    });
    assert_inv_freq(
        &c,
        &linear_inv_freq(500_000.0, 16, 2.5),
        "rope_scaling rope_type linear",
    );
    let c = config("llama-tiny-bf16", |v| {
        v["rope_parameters"] = json!({"rope_type": "linear", "factor": 8.0, "rope_theta": 10_000.0});
    });
    assert_inv_freq(&c, &linear_inv_freq(10_000.0, 16, 8.0), "rope_parameters, linear");
}

#[test]
fn llama3_scaling_keeps_interpolates_and_divides_by_wavelength() {
    // Llama 3.1 8B's own config: head_dim 128, theta 5e5, factor 8 between
    // wavelengths 2048 and 8192.
    let c = config("llama-tiny", |v| {
        v["hidden_size"] = json!(4096);
        v["intermediate_size"] = json!(14336);
        v["num_attention_heads"] = json!(32);
        v["num_key_value_heads"] = json!(8);
        v["max_position_embeddings"] = json!(131_072);
        v["rope_theta"] = json!(500_000.0);
        v["rope_scaling"] = json!({
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192
        });
    });
    assert_eq!(c.head_dim, 128);
    let regions = llama3_regions(500_000.0, 128, 1.0, 4.0, 8192.0);
    assert!(regions.iter().all(|&n| n > 0), "{regions:?}");
    assert_inv_freq(
        &c,
        &llama3_inv_freq(500_000.0, 128, 8.0, 1.0, 4.0, 8192.0),
        "Llama 3.1 8B",
    );

    // head_dim 16 with a wide band, so that most frequencies are
    // interpolated; transformers-5 layout.
    let c = config("llama-tiny-bf16", |v| {
        v["rope_parameters"] = json!({
            "rope_type": "llama3", "rope_theta": 10_000.0, "factor": 4.0, "low_freq_factor": 1.0,
            "high_freq_factor": 32.0, "original_max_position_embeddings": 1024
        });
    });
    let regions = llama3_regions(10_000.0, 16, 1.0, 32.0, 1024.0);
    assert!(regions[1] >= 3 && regions[0] > 0 && regions[2] > 0, "{regions:?}");
    assert_inv_freq(
        &c,
        &llama3_inv_freq(10_000.0, 16, 4.0, 1.0, 32.0, 1024.0),
        "rope_parameters, llama3",
    );
}

/// The largest difference allowed between a table entry and the f64 value
/// at angle `angle`: transformers (and cleave) form the angle in f32, which
/// moves it by up to half an ulp of `angle`, and the result is an f32.
fn table_tolerance(angle: f64) -> f64 {
    angle * f32::EPSILON as f64 + f32::EPSILON as f64
}

#[test]
fn host_table_is_cos_and_sin_of_position_times_frequency() {
    let positions = 300;
    for c in [
        config("llama-tiny", |_| {}),
        config("llama-tiny", |v| {
            v["rope_scaling"] = json!({"type": "linear", "factor": 4.0});
        }),
    ] {
        let inv_freq = c.inv_freq();
        let half = inv_freq.len();
        let (cos, sin) = cleave_shaders::rope_table(&inv_freq, positions);
        assert_eq!((cos.len(), sin.len()), (positions * half, positions * half));
        for pos in 0..positions {
            for (i, &f) in inv_freq.iter().enumerate() {
                let angle = pos as f64 * f as f64;
                let at = pos * half + i;
                let (dc, ds) = (
                    (cos[at] as f64 - angle.cos()).abs(),
                    (sin[at] as f64 - angle.sin()).abs(),
                );
                assert!(
                    dc.max(ds) <= table_tolerance(angle),
                    "position {pos}, pair {i}: table ({}, {}), cos and sin of {angle} are ({}, {})",
                    cos[at],
                    sin[at],
                    angle.cos(),
                    angle.sin()
                );
            }
        }
    }
}

/// Rotates rows of `heads` heads at `positions` on the test device, with
/// a table made from `inv_freq`.
struct Rotate<'a> {
    x: &'a [f32],
    inv_freq: &'a [f32],
    heads: usize,
    positions: &'a [u32],
    context: usize,
}

impl RuntimeTask for Rotate<'_> {
    type Output = Vec<f32>;

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Vec<f32> {
        let client = &clients[0];
        let table = RopeTable::new(client, self.inv_freq, self.context);
        let width = self.heads * 2 * self.inv_freq.len();
        let x = Tensor::from_f32(client, self.x, &[self.positions.len(), width]);
        cleave_shaders::rope(client, &x, &table, self.heads, &RowIndex::new(client, self.positions)).unwrap();
        x.to_vec(client).unwrap()
    }
}

/// The kernel rotates dimension `i` of each head with `i + head_dim / 2`
/// by `pos · inv_freq[i]`, as transformers' `rotate_half`.
#[test]
fn rope_kernel_rotates_by_position_times_frequency() {
    let c = config("llama-tiny", |v| {
        v["rope_scaling"] = json!({
            "rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
            "high_freq_factor": 32.0, "original_max_position_embeddings": 1024
        });
    });
    let inv_freq = c.inv_freq();
    let (half, heads) = (inv_freq.len(), c.heads);
    let positions = [0u32, 1, 2, 7, 63, 200, 255, 3];
    let width = heads * 2 * half;
    let x: Vec<f32> = (0..positions.len() * width)
        .map(|i| ((i as f32) * 0.731).sin() * 2.0)
        .collect();
    let group = common::test_device();
    let got = group.run(Rotate {
        x: &x,
        inv_freq: &inv_freq,
        heads,
        positions: &positions,
        context: c.max_positions,
    });
    assert_eq!(got.len(), x.len());
    for (row, &pos) in positions.iter().enumerate() {
        for head in 0..heads {
            let base = row * width + head * 2 * half;
            for (i, &f) in inv_freq.iter().enumerate() {
                let angle = pos as f64 * f as f64;
                let (x1, x2) = (x[base + i] as f64, x[base + i + half] as f64);
                let want = [x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()];
                let tolerance = (x1.abs() + x2.abs()) * table_tolerance(angle) + 1e-6;
                for (k, w) in want.into_iter().enumerate() {
                    let g = got[base + i + k * half] as f64;
                    assert!(
                        (g - w).abs() <= tolerance,
                        "row {row} (position {pos}), head {head}, dimension {}: {g}, expected {w}",
                        i + k * half
                    );
                }
            }
        }
    }
}
