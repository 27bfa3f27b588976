//! Tree reductions across the x-dimension of a cube, in shared memory.
//!
//! Each row of units along y owns `partial[base..base + CUBE_DIM_X]`; after
//! the call `partial[base]` holds the row's result, visible to every unit.
//! [`mean_variance`] builds LayerNorm's statistics on them.

use cubecl::prelude::*;

/// How a reduction joins two partial results into one.
#[cube]
pub(crate) trait Combine {
    fn combine<F: Float>(a: F, b: F) -> F;
}

/// Partial sums join by adding.
pub(crate) struct Sum;

/// Partial maxima join by the larger.
pub(crate) struct Max;

#[cube]
impl Combine for Sum {
    fn combine<F: Float>(a: F, b: F) -> F {
        a + b
    }
}

#[cube]
impl Combine for Max {
    fn combine<F: Float>(a: F, b: F) -> F {
        F::max(a, b)
    }
}

/// Joins the row's `CUBE_DIM_X` partial results by `C`, pairwise down a
/// tree, into `partial[base]`.
#[cube]
pub(crate) fn reduce<F: Float, C: Combine>(partial: &mut SharedMemory<F>, base: u32) {
    let lane = UNIT_POS_X;
    let mut stride = CUBE_DIM_X / 2;
    while stride > 0 {
        if lane < stride {
            let other = partial[(base + lane + stride) as usize];
            let mine = partial[(base + lane) as usize];
            partial[(base + lane) as usize] = C::combine::<F>(mine, other);
        }
        sync_cube();
        stride /= 2;
    }
}

/// The mean and the biased variance of `x[base..base + len]`, reduced by
/// the cube's `units` units (a power of two, the cube's x-dimension) in two
/// passes: the mean, then the squared deviations from it. Every unit gets
/// both.
#[cube]
pub(crate) fn mean_variance<F: Float>(x: &Array<F>, base: u32, len: u32, #[comptime] units: u32) -> (F, F) {
    let mut partial = SharedMemory::<F>::new(units as usize);
    let n = F::cast_from(len);
    let mut sum = F::new(0.0);
    let mut i = UNIT_POS_X;
    while i < len {
        sum += x[(base + i) as usize];
        i += units;
    }
    partial[UNIT_POS_X as usize] = sum;
    sync_cube();
    reduce::<F, Sum>(&mut partial, 0);
    let mean = partial[0] / n;
    sync_cube();

    let mut squares = F::new(0.0);
    let mut j = UNIT_POS_X;
    while j < len {
        let d = x[(base + j) as usize] - mean;
        squares += d * d;
        j += units;
    }
    partial[UNIT_POS_X as usize] = squares;
    sync_cube();
    reduce::<F, Sum>(&mut partial, 0);
    (mean, partial[0] / n)
}
