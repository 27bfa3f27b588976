//! The norms: RMSNorm and LayerNorm over each row, GroupNorm over the
//! channel groups of an image map. One cube per row, or per piece of a
//! group (GroupNorm takes three passes: sums, squared deviations from the
//! mean, the normalisation); the sums are reduced in shared memory
//! (`reduce`).

use cubecl::prelude::*;

use crate::activation::{activation, Activation};
use crate::error::check_shape;
use crate::grid::{cube_grid, cube_index};
use crate::reduce::{mean_variance, reduce, Sum};
use crate::{KernelError, Tensor};

/// Units per cube of the row norms.
pub(crate) const ROW_UNITS: u32 = 32;

/// Units per cube of `group_norm`.
const GROUP_UNITS: u32 = 64;

/// `1 / sqrt(mean(x[base..base + cols]²) + eps)`, the sum of squares taken
/// by the `units` units of the unit's row of the cube (its x-dimension, a
/// power of two; the cube has `unit_rows` such rows, each reducing its own
/// row of `x`) and reduced in shared memory; every unit of the row gets it.
/// Every caller forms the same sums in the same order, so a norm fused
/// into another kernel gives the bits of `rms_norm`'s.
#[cube]
pub(crate) fn inverse_rms<F: Float>(
    x: &Array<F>,
    base: u32,
    cols: u32,
    eps: f32,
    #[comptime] units: u32,
    #[comptime] unit_rows: u32,
) -> F {
    let mut partial = SharedMemory::<F>::new(comptime!(units * unit_rows) as usize);
    let first = UNIT_POS_Y * units;
    let mut sum = F::new(0.0);
    let mut i = UNIT_POS_X;
    while i < cols {
        let v = x[(base + i) as usize];
        sum += v * v;
        i += units;
    }
    partial[(first + UNIT_POS_X) as usize] = sum;
    sync_cube();
    reduce::<F, Sum>(&mut partial, first);
    let inv = F::new(1.0) / F::sqrt(partial[first as usize] / F::cast_from(cols) + F::cast_from(eps));
    // The partials may be written again by the next call.
    sync_cube();
    inv
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
        let inv = inverse_rms::<F>(x, base, cols, eps, units, 1u32);
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

/// Values of a group each unit of the group norm's kernels walks: a cube
/// takes a piece of `GROUP_UNITS · PIECE_STEPS` values of one group, so a
/// unit's loops stay far within llvmpipe's budget (65,535 iterations an
/// invocation, past which its loops stop silently) however large the
/// group, and a large group fills the device with cubes.
const PIECE_STEPS: u32 = 256;

/// The sum of group `g`'s `pieces` partial sums, in piece order: every
/// unit of every cube of the group computes the same bits.
#[cube]
fn group_total<F: Float>(partials: &Array<F>, g: u32, pieces: u32) -> F {
    let mut total = F::new(0.0);
    for p in 0..pieces {
        total += partials[(g * pieces + p) as usize];
    }
    total
}

/// Cube `cube`'s group, and the first value of its piece in the group and
/// the one past its last.
#[cube]
fn group_piece(cube: u32, pieces: u32, group_len: u32, #[comptime] units: u32) -> (u32, u32, u32) {
    let lo = cube % pieces * comptime!(units * PIECE_STEPS);
    (cube / pieces, lo, min(lo + comptime!(units * PIECE_STEPS), group_len))
}

/// One cube per piece of each group ([`PIECE_STEPS`]), the groups' `channels
/// / groups` planes being contiguous: the piece's sum into `partials`, or
/// with `deviations` its sum of squared deviations from the group's mean
/// (from `sums`, the first pass's partials): GroupNorm's two-pass
/// statistics.
#[cube(launch)]
fn group_partials<F: Float>(
    x: &Array<F>,
    sums: &Array<F>,
    partials: &mut Array<F>,
    groups: u32,
    group_len: u32,
    pieces: u32,
    #[comptime] units: u32,
    #[comptime] deviations: bool,
) {
    let cube = cube_index();
    // The same for every unit of the cube, so its syncs are reached by all.
    if cube < groups * pieces {
        let (g, lo, hi) = group_piece(cube, pieces, group_len, units);
        let base = g * group_len;
        let mut mean = F::new(0.0);
        if comptime!(deviations) {
            mean = group_total::<F>(sums, g, pieces) / F::cast_from(group_len);
        }
        let mut total = F::new(0.0);
        let mut i = lo + UNIT_POS_X;
        while i < hi {
            let v = x[(base + i) as usize];
            if comptime!(deviations) {
                let d = v - mean;
                total += d * d;
            } else {
                total += v;
            }
            i += units;
        }
        let mut partial = SharedMemory::<F>::new(units as usize);
        partial[UNIT_POS_X as usize] = total;
        sync_cube();
        reduce::<F, Sum>(&mut partial, 0);
        if UNIT_POS_X == 0 {
            partials[cube as usize] = partial[0];
        }
    }
}

/// GroupNorm's last pass, one cube per piece of each group as
/// [`group_partials`]: the group's mean and biased variance from the
/// partials, then the per-channel affine transform and, if `silu`,
/// `v · sigmoid(v)`.
#[cube(launch)]
fn group_norm_kernel<F: Float>(
    x: &Array<F>,
    sums: &Array<F>,
    squares: &Array<F>,
    weight: &Array<F>,
    bias: &Array<F>,
    out: &mut Array<F>,
    groups: u32,
    group_len: u32,
    pieces: u32,
    plane: u32,
    eps: f32,
    #[comptime] units: u32,
    #[comptime] silu: bool,
) {
    let cube = cube_index();
    if cube < groups * pieces {
        let (g, lo, hi) = group_piece(cube, pieces, group_len, units);
        let base = g * group_len;
        let n = F::cast_from(group_len);
        let mean = group_total::<F>(sums, g, pieces) / n;
        let variance = group_total::<F>(squares, g, pieces) / n;
        let inv = F::new(1.0) / F::sqrt(variance + F::cast_from(eps));
        let mut l = lo + UNIT_POS_X;
        while l < hi {
            let channel = ((base + l) / plane) as usize;
            let mut v = (x[(base + l) as usize] - mean) * inv * weight[channel] + bias[channel];
            if silu {
                v = activation::<F>(v, Activation::Silu);
            }
            out[(base + l) as usize] = v;
            l += units;
        }
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
    crate::profile::launch(client, "rms_norm", || {
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
    });
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
    crate::profile::launch(client, "layer_norm", || {
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
    });
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
    let group_len = plane * channels / groups;
    let pieces = group_len.div_ceil((GROUP_UNITS * PIECE_STEPS) as usize).max(1);
    let cubes = groups * pieces;
    let sums = Tensor::empty(client, &[cubes]);
    let squares = Tensor::empty(client, &[cubes]);
    let args = (groups as u32, group_len as u32, pieces as u32);
    // The first pass reads no sums: `x` stands in for them.
    for (sums_in, partials, deviations) in [(x, &sums, false), (&sums, &squares, true)] {
        crate::profile::launch(client, "group_partials", || {
            group_partials::launch::<f32, R>(
                client,
                cube_grid(cubes),
                CubeDim::new_1d(GROUP_UNITS),
                x.arg(),
                sums_in.arg(),
                partials.arg(),
                args.0,
                args.1,
                args.2,
                GROUP_UNITS,
                deviations,
            );
        });
    }
    let out = Tensor::empty(client, &x.shape);
    crate::profile::launch(client, "group_norm", || {
        group_norm_kernel::launch::<f32, R>(
            client,
            cube_grid(cubes),
            CubeDim::new_1d(GROUP_UNITS),
            x.arg(),
            sums.arg(),
            squares.arg(),
            weight.arg(),
            bias.arg(),
            out.arg(),
            args.0,
            args.1,
            args.2,
            plane as u32,
            eps,
            GROUP_UNITS,
            silu,
        );
    });
    Ok(out)
}
