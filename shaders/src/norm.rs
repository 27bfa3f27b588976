//! The norms: RMSNorm and LayerNorm over each row, GroupNorm over the
//! channel groups of an image map. One cube per row or group; the sums are
//! reduced in shared memory (`reduce`).

use cubecl::prelude::*;

use crate::activation::{activation, Activation};
use crate::error::check_shape;
use crate::grid::{cube_grid, cube_index};
use crate::reduce::{mean_variance, reduce_sum};
use crate::{KernelError, Tensor};

/// Units per cube of the row norms.
pub(crate) const ROW_UNITS: u32 = 32;

/// Units per cube of `group_norm`.
const GROUP_UNITS: u32 = 64;

/// `1 / sqrt(mean(x[base..base + cols]²) + eps)`, the sum of squares taken
/// by the cube's `units` units (its x-dimension, a power of two) and
/// reduced in shared memory; every unit gets it.
#[cube]
pub(crate) fn inverse_rms<F: Float>(x: &Array<F>, base: u32, cols: u32, eps: f32, #[comptime] units: u32) -> F {
    let mut partial = SharedMemory::<F>::new(units as usize);
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
    F::new(1.0) / F::sqrt(partial[0] / F::cast_from(cols) + F::cast_from(eps))
}

/// RMSNorm as Llama defines it: `x / sqrt(mean(x²) + eps) * weight`, one
/// cube per row (the grid of [`cube_grid`], whose last cubes may be past
/// the rows).
#[cube(launch)]
fn rms_norm_kernel<F: Float>(
    x: &Array<F>,
    weight: &Array<F>,
    out: &mut Array<F>,
    rows: u32,
    cols: u32,
    eps: f32,
    #[comptime] units: u32,
) {
    let row = cube_index();
    if row < rows {
        let base = row * cols;
        let inv = inverse_rms::<F>(x, base, cols, eps, units);
        let mut j = UNIT_POS_X;
        while j < cols {
            out[(base + j) as usize] = x[(base + j) as usize] * inv * weight[j as usize];
            j += units;
        }
    }
}

/// LayerNorm as PyTorch defines it: `(x - mean) / sqrt(var + eps) * weight
/// + bias`, with the biased variance; one cube per row, as
/// `rms_norm_kernel`.
#[cube(launch)]
fn layer_norm_kernel<F: Float>(
    x: &Array<F>,
    weight: &Array<F>,
    bias: &Array<F>,
    out: &mut Array<F>,
    rows: u32,
    cols: u32,
    eps: f32,
    #[comptime] units: u32,
) {
    let row = cube_index();
    if row < rows {
        let base = row * cols;
        let (mean, variance) = mean_variance::<F>(x, base, cols, units);
        let inv = F::new(1.0) / F::sqrt(variance + F::cast_from(eps));

        let mut l = UNIT_POS_X;
        while l < cols {
            out[(base + l) as usize] = (x[(base + l) as usize] - mean) * inv * weight[l as usize] + bias[l as usize];
            l += units;
        }
    }
}

/// GroupNorm, one cube per group: the group's `channels / groups` planes
/// are contiguous, so it is a two-pass mean/variance over one slice, then
/// the per-channel affine transform and, if `silu`, `v · sigmoid(v)`.
#[cube(launch)]
fn group_norm_kernel<F: Float>(
    x: &Array<F>,
    weight: &Array<F>,
    bias: &Array<F>,
    out: &mut Array<F>,
    group_len: u32,
    plane: u32,
    eps: f32,
    #[comptime] units: u32,
    #[comptime] silu: bool,
) {
    let base = CUBE_POS_X * group_len;
    let first_channel = base / plane;
    let (mean, variance) = mean_variance::<F>(x, base, group_len, units);
    let inv = F::new(1.0) / F::sqrt(variance + F::cast_from(eps));

    let mut l = UNIT_POS_X;
    while l < group_len {
        let channel = (first_channel + l / plane) as usize;
        let mut v = (x[(base + l) as usize] - mean) * inv * weight[channel] + bias[channel];
        if silu {
            v = activation::<F>(v, Activation::Silu);
        }
        out[(base + l) as usize] = v;
        l += units;
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
        cube_grid(x.rows()),
        CubeDim::new_1d(ROW_UNITS),
        x.arg(),
        weight.arg(),
        out.arg(),
        x.rows() as u32,
        cols as u32,
        eps,
        ROW_UNITS,
    );
    Ok(out)
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
        cube_grid(x.rows()),
        CubeDim::new_1d(ROW_UNITS),
        x.arg(),
        weight.arg(),
        bias.arg(),
        out.arg(),
        x.rows() as u32,
        cols as u32,
        eps,
        ROW_UNITS,
    );
    Ok(out)
}

/// PyTorch's `nn.GroupNorm(groups, channels, eps)` over `x: [channels,
/// ...]` (one sample; the channels' elements are normalised together in
/// `groups` consecutive groups), then `weight`/`bias` per channel, then
/// SiLU if `silu`.
pub fn group_norm<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    groups: usize,
    eps: f32,
    silu: bool,
) -> Result<Tensor, KernelError> {
    let channels = x.shape.first().copied().unwrap_or(0);
    check_shape(
        x.shape.len() >= 2 && groups > 0 && channels % groups == 0,
        "group_norm",
        "x",
        &x.shape,
        || format!("[channels, ...] with channels a multiple of {groups} groups"),
    )?;
    for (what, t) in [("weight", weight), ("bias", bias)] {
        check_shape(t.shape == [channels], "group_norm", what, &t.shape, || {
            format!("[{channels}]")
        })?;
    }
    let plane = x.len() / channels;
    let out = Tensor::empty(client, &x.shape);
    group_norm_kernel::launch::<f32, R>(
        client,
        CubeCount::Static(groups as u32, 1, 1),
        CubeDim::new_1d(GROUP_UNITS),
        x.arg(),
        weight.arg(),
        bias.arg(),
        out.arg(),
        (plane * channels / groups) as u32,
        plane as u32,
        eps,
        GROUP_UNITS,
        silu,
    );
    Ok(out)
}
