//! The adaptive-norm arithmetic of diffusion transformers (DiT, FLUX.1):
//! per-column shift, scale and gate vectors computed from the timestep
//! embedding.

use cubecl::prelude::*;

use crate::error::check_shape;
use crate::grid::{grid_1d, linear_pos};
use crate::{KernelError, Tensor};

#[cube(launch)]
fn modulate_kernel<F: Float>(
    x: &Array<F>,
    shift: &Array<F>,
    scale: &Array<F>,
    out: &mut Array<F>,
    cols: u32,
    len: u32,
) {
    let i = linear_pos();
    if i < len as usize {
        let col = (i as u32 % cols) as usize;
        out[i] = x[i] * (F::new(1.0) + scale[col]) + shift[col];
    }
}

#[cube(launch)]
fn add_gated_kernel<F: Float>(x: &mut Array<F>, y: &Array<F>, gate: &Array<F>, cols: u32, len: u32) {
    let i = linear_pos();
    if i < len as usize {
        let g = gate[(i as u32 % cols) as usize];
        x[i] += g * y[i];
    }
}

fn check_vector(v: &Tensor, cols: usize, op: &'static str, what: &'static str) -> Result<(), KernelError> {
    check_shape(v.len() == cols, op, what, &v.shape, || format!("{cols} elements"))
}

/// `x · (1 + scale) + shift` with `shift`, `scale` one value per column of
/// `x`: a norm's output modulated by the timestep (`AdaLayerNorm*`).
pub fn modulate<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Tensor,
    shift: &Tensor,
    scale: &Tensor,
) -> Result<Tensor, KernelError> {
    let cols = x.cols();
    check_vector(shift, cols, "modulate", "shift")?;
    check_vector(scale, cols, "modulate", "scale")?;
    let out = Tensor::empty(client, &x.shape);
    let (count, dim) = grid_1d(x.len());
    crate::profile::launch(client, "modulate", || {
        modulate_kernel::launch::<f32, R>(
            client,
            count,
            dim,
            x.arg(),
            shift.arg(),
            scale.arg(),
            out.arg(),
            cols as u32,
            x.len() as u32,
        );
    });
    Ok(out)
}

/// `x += gate · y`, `gate` one value per column: a gated residual.
pub fn add_gated<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Tensor,
    y: &Tensor,
    gate: &Tensor,
) -> Result<(), KernelError> {
    let cols = x.cols();
    check_shape(y.shape == x.shape, "add_gated", "y", &y.shape, || {
        format!("{:?}", x.shape)
    })?;
    check_vector(gate, cols, "add_gated", "gate")?;
    let (count, dim) = grid_1d(x.len());
    crate::profile::launch(client, "add_gated", || {
        add_gated_kernel::launch::<f32, R>(
            client,
            count,
            dim,
            x.arg(),
            y.arg(),
            gate.arg(),
            cols as u32,
            x.len() as u32,
        );
    });
    Ok(())
}
