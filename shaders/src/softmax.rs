use cubecl::prelude::*;

use crate::reduce::{reduce_max, reduce_sum};
use crate::{KernelError, Tensor};

const UNITS: u32 = 32;

/// Numerically stable softmax of each row, in place; one cube per row.
#[cube(launch)]
fn softmax_kernel<F: Float>(x: &mut Array<F>, cols: u32, #[comptime] units: u32) {
    let mut partial = SharedMemory::<F>::new(units as usize);
    let base = CUBE_POS_X * cols;
    let mut max = F::new(-3.0e38);
    let mut i = UNIT_POS_X;
    while i < cols {
        max = F::max(max, x[(base + i) as usize]);
        i += units;
    }
    partial[UNIT_POS_X as usize] = max;
    sync_cube();
    reduce_max::<F>(&mut partial, 0);
    let row_max = partial[0];
    sync_cube();

    let mut sum = F::new(0.0);
    let mut j = UNIT_POS_X;
    while j < cols {
        let e = F::exp(x[(base + j) as usize] - row_max);
        x[(base + j) as usize] = e;
        sum += e;
        j += units;
    }
    partial[UNIT_POS_X as usize] = sum;
    sync_cube();
    reduce_sum::<F>(&mut partial, 0);
    let inv = F::new(1.0) / partial[0];

    let mut l = UNIT_POS_X;
    while l < cols {
        x[(base + l) as usize] = x[(base + l) as usize] * inv;
        l += units;
    }
}

/// Softmax over the last dimension of `x`, in place.
pub fn softmax_rows<R: Runtime>(client: &ComputeClient<R>, x: &Tensor) -> Result<(), KernelError> {
    softmax_kernel::launch::<f32, R>(
        client,
        CubeCount::Static(x.rows() as u32, 1, 1),
        CubeDim::new_1d(UNITS),
        x.arg(),
        x.cols() as u32,
        UNITS,
    );
    Ok(())
}
