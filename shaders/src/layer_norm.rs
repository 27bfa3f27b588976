use cubecl::prelude::*;

use crate::error::check_shape;
use crate::reduce::reduce_sum;
use crate::{KernelError, Tensor};

const UNITS: u32 = 32;

/// LayerNorm as PyTorch defines it: `(x - mean) / sqrt(var + eps) * weight
/// + bias`, with the biased variance; one cube per row.
#[cube(launch)]
fn layer_norm_kernel<F: Float>(
    x: &Array<F>,
    weight: &Array<F>,
    bias: &Array<F>,
    out: &mut Array<F>,
    cols: u32,
    eps: f32,
    #[comptime] units: u32,
) {
    let mut partial = SharedMemory::<F>::new(units as usize);
    let base = CUBE_POS_X * cols;
    let n = F::cast_from(cols);
    let mut sum = F::new(0.0);
    let mut i = UNIT_POS_X;
    while i < cols {
        sum += x[(base + i) as usize];
        i += units;
    }
    partial[UNIT_POS_X as usize] = sum;
    sync_cube();
    reduce_sum::<F>(&mut partial, 0);
    let mean = partial[0] / n;
    sync_cube();

    let mut squares = F::new(0.0);
    let mut j = UNIT_POS_X;
    while j < cols {
        let d = x[(base + j) as usize] - mean;
        squares += d * d;
        j += units;
    }
    partial[UNIT_POS_X as usize] = squares;
    sync_cube();
    reduce_sum::<F>(&mut partial, 0);
    let inv = F::new(1.0) / F::sqrt(partial[0] / n + F::cast_from(eps));

    let mut l = UNIT_POS_X;
    while l < cols {
        out[(base + l) as usize] = (x[(base + l) as usize] - mean) * inv * weight[l as usize] + bias[l as usize];
        l += units;
    }
}

/// LayerNorm over the last dimension of `x`.
pub fn layer_norm<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    eps: f32,
) -> Result<Tensor, KernelError> {
    let cols = x.cols();
    for (what, t) in [("weight", weight), ("bias", bias)] {
        check_shape(t.shape == [cols], "layer_norm", what, &t.shape, || format!("[{cols}]"))?;
    }
    let out = Tensor::empty(client, &x.shape);
    layer_norm_kernel::launch::<f32, R>(
        client,
        CubeCount::Static(x.rows() as u32, 1, 1),
        CubeDim::new_1d(UNITS),
        x.arg(),
        weight.arg(),
        bias.arg(),
        out.arg(),
        cols as u32,
        eps,
        UNITS,
    );
    Ok(out)
}
