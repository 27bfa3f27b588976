//! Which of two forms a device runs where an op has both: kernels whose
//! cubes share tiles through shared memory and barriers, written for GPUs,
//! or kernels whose units each work alone on whole rows, which CPU adapters
//! run several times faster (a barrier there is a switch between the
//! cube's units, each one a loop iteration on one core). The choice is
//! measured on lavapipe (docs/BENCHMARKS.md); devices with matrix units
//! keep the tiled kernels, which the CUDA check covers, until the unit
//! kernels are measured there.

use std::cell::Cell;

use cubecl::prelude::*;

/// The form of the matmuls and of attention a device runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernels {
    /// `matmul_blocked`, the decode product's lanes sharing a dot product
    /// and the tiled flash attention.
    Tiled,
    /// cubek's unit-tiled matmul, the decode product one unit per four
    /// outputs (`gemv_units` for f32 weights, `gemv_units_typed` for the
    /// other types where rows are whole runs of 16) and attention one unit
    /// per query row.
    Unit,
}

thread_local! {
    /// The form [`with_kernels`] imposes on this thread's launches.
    static IMPOSED: Cell<Option<Kernels>> = const { Cell::new(None) };
}

/// The form launches on `client` take: [`Kernels::Unit`] on devices without
/// matrix units, unless [`with_kernels`] imposes one.
pub fn kernels_for<R: Runtime>(client: &ComputeClient<R>) -> Kernels {
    IMPOSED.get().unwrap_or_else(|| {
        if client.properties().features.matmul.cmma.is_empty() {
            Kernels::Unit
        } else {
            Kernels::Tiled
        }
    })
}

/// Runs `f` with every launch it makes on this thread taking `kernels`,
/// whatever the device: the tests check both forms on one device.
#[cfg(feature = "cpu-reference")]
pub fn with_kernels<T>(kernels: Kernels, f: impl FnOnce() -> T) -> T {
    imposing(&IMPOSED, kernels, f)
}

/// Runs `f` with `value` in the thread-local `choice`, and puts the
/// previous value back afterwards, even if `f` panics.
#[cfg(feature = "cpu-reference")]
pub(crate) fn imposing<V: Copy + 'static, T>(
    choice: &'static std::thread::LocalKey<Cell<Option<V>>>,
    value: V,
    f: impl FnOnce() -> T,
) -> T {
    struct Restore<V: Copy + 'static>(&'static std::thread::LocalKey<Cell<Option<V>>>, Option<V>);
    impl<V: Copy + 'static> Drop for Restore<V> {
        fn drop(&mut self) {
            self.0.set(self.1);
        }
    }
    let _restore = Restore(choice, choice.replace(Some(value)));
    f()
}
