//! What the kernel test files share: the device, seeded random inputs,
//! the comparison, and the macro that makes one #[test] per check.
#![allow(dead_code)] // each test file uses its own part of this

pub mod alone;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub fn test_device() -> cleave_device::DeviceGroup {
    match std::env::var("CLEAVE_TEST_DEVICE") {
        Ok(name) => cleave_device::open(&name),
        Err(_) => cleave_device::open_default(),
    }
    .expect("a compute device for the kernel tests")
}

/// Whether the tests cover every variant (CLEAVE_TEST_EVERY_VARIANT set,
/// as the GPU check does): each weight type in every product. Elsewhere
/// they take one of each layout, which exercises every code path the
/// others share, at a fraction of the kernels lavapipe compiles (the CUDA
/// check compiles every variant for sm_80 and sm_90 on each run).
pub fn every_variant() -> bool {
    std::env::var_os("CLEAVE_TEST_EVERY_VARIANT").is_some()
}

/// The weight types a test of products covers: every type under
/// [`every_variant`], else one of each layout (f32, a 16-bit float, blocks
/// of 32 values, super-blocks of 256 with scales of their own). Each
/// type's own decoder still meets its twin on every run: the
/// dequantization and GGUF fixture tests go through all of them.
pub fn product_types() -> Vec<cleave_shaders::WeightType> {
    use cleave_shaders::WeightType;
    match every_variant() {
        true => WeightType::ALL.to_vec(),
        false => vec![WeightType::F32, WeightType::BF16, WeightType::Q8_0, WeightType::Q4_K],
    }
}

pub fn seeded() -> (StdRng, u64) {
    let seed = std::env::var("CLEAVE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    (StdRng::seed_from_u64(seed), seed)
}

pub fn random(rng: &mut StdRng, len: usize) -> Vec<f32> {
    (0..len).map(|_| rng.random_range(-1.0..1.0)).collect()
}

#[track_caller]
pub fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str, seed: u64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}: element {i} is {g}, reference {w} (seed {seed})"
        );
    }
}

/// One #[test] per check, run on the test device through its runtime.
/// Each check runs with exact products imposed.
/// After `in both forms:`, a module per check with two tests, `tiled` and
/// `unit`, that run it with each form of the kernels
/// ([`cleave_shaders::Kernels`]) imposed, whichever the device would take.
macro_rules! kernel_tests {
    (in both forms: $($name:ident),* $(,)?) => {$(
        mod $name {
            use super::*;
            kernel_tests!(@test tiled, checks::$name, Some(cleave_shaders::Kernels::Tiled));
            kernel_tests!(@test unit, checks::$name, Some(cleave_shaders::Kernels::Unit));
        }
    )*};
    ($($name:ident),* $(,)?) => {$(
        kernel_tests!(@test $name, checks::$name, None);
    )*};
    (@test $test:ident, $check:path, $kernels:expr) => {
        #[test]
        fn $test() {
            struct Task;
            impl cleave_device::RuntimeTask for Task {
                type Output = ();
                fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) {
                    let kernels: Option<cleave_shaders::Kernels> = $kernels;
                    // The checks are of exact products, whatever the device
                    // would take; a check of fast ones imposes them itself.
                    let exact = cleave_shaders::Precision::Exact;
                    cleave_shaders::with_precision(exact, || match kernels {
                        Some(kernels) => cleave_shaders::with_kernels(kernels, || $check(&clients[0])),
                        None => $check(&clients[0]),
                    })
                }
            }
            common::test_device().run(Task)
        }
    };
}
