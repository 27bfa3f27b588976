use cubecl::prelude::*;

use crate::error::check_shape;
use crate::reduce::reduce_sum;
use crate::{KernelError, Tensor};

const UNITS: u32 = 32;

/// RMSNorm as Llama defines it: `x / sqrt(mean(x²) + eps) * weight`, one
/// cube per row, the sum of squares reduced in shared memory.
#[cube(launch)]
fn rms_norm_kernel<F: Float>(
    x: &Array<F>,
    weight: &Array<F>,
    out: &mut Array<F>,
    cols: u32,
    eps: f32,
    #[comptime] units: u32,
) {
    let mut partial = SharedMemory::<F>::new(units as usize);
    let base = CUBE_POS_X * cols;
    let mut sum = F::new(0.0);
    let mut i = UNIT_POS_X;
    while i < cols {
        let v = x[(base + i) as usize];
        sum += v * v;
        i += units;
    }
    partial[UNIT_POS_X as usize] = sum;
    sync_cube();
    reduce_sum::<F>(&mut partial, 0);
    let inv = F::new(1.0) / F::sqrt(partial[0] / F::cast_from(cols) + F::cast_from(eps));
    let mut j = UNIT_POS_X;
    while j < cols {
        out[(base + j) as usize] = x[(base + j) as usize] * inv * weight[j as usize];
        j += units;
    }
}

/// RMSNorm over the last dimension of `x`, scaled by `weight`.
pub fn rms_norm<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Tensor,
    weight: &Tensor,
    eps: f32,
) -> Result<Tensor, KernelError> {
    let cols = x.cols();
    check_shape(weight.shape == [cols], "rms_norm", "weight", &weight.shape, || {
        format!("[{cols}]")
    })?;
    let out = Tensor::empty(client, &x.shape);
    rms_norm_kernel::launch::<f32, R>(
        client,
        CubeCount::Static(x.rows() as u32, 1, 1),
        CubeDim::new_1d(UNITS),
        x.arg(),
        weight.arg(),
        out.arg(),
        cols as u32,
        eps,
        UNITS,
    );
    Ok(out)
}
