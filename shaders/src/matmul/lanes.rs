//! The decode product on GPUs: the lanes of a warp share each output's dot
//! product, reading the weight's row in runs decoded in registers, with an
//! RMS norm of `x` folded in where one feeds the product.

use cubecl::prelude::*;

use super::{finish_output, Finish};
use crate::decode::decode_run;
use crate::norm::{inverse_rms, ROW_UNITS};
use crate::reduce::{reduce, Sum};
use crate::{Tensor, Weight, WeightType};

/// Lanes that share one output's dot product in the decode kernel: a warp
/// on NVIDIA GPUs, so that a warp's loads of a run each are one contiguous
/// stretch of the weight's row. As many as `rms_norm`'s units, so that a
/// norm fused into the kernel reduces its row as `rms_norm` does.
const LANES: u32 = ROW_UNITS;

/// Outputs one cube of the decode kernel computes.
const OUTPUTS: u32 = 8;

/// Runs of values each lane of the decode kernel loads before it uses the
/// first: several loads in flight per lane are what keeps a GPU's memory
/// busy when a product has few outputs.
const UNROLL: u32 = 4;

/// Row `j`'s dot products with the cube's `rows` rows of `x`, this lane's
/// part of them: lane `l` takes the runs of `run` values starting at
/// `l·run, (l + lanes)·run, ..`, decoded in registers (see `decode_run`),
/// so the f32 values never exist in memory; UNROLL runs are loaded
/// before the first is used. The order of every sum is fixed by the lane
/// and the weight alone. `normed`, each row `r` of `x` is first RMS-normed
/// as it is read: times `inv[r]` and the norm's weight.
#[cube]
fn gemv_partials<F: Float>(
    x: &Array<F>,
    w: &Array<u32>,
    acc: &mut Array<F>,
    row_start: u32,
    row0: u32,
    m: u32,
    k: u32,
    inv: &Array<F>,
    norm: &Array<F>,
    #[comptime] lanes: u32,
    #[comptime] rows: u32,
    #[comptime] run: u32,
    #[comptime] ty: WeightType,
    #[comptime] normed: bool,
) {
    let stride = comptime!(lanes * run);
    let mut values = Array::<F>::new(comptime!(run * UNROLL) as usize);
    let mut i = UNIT_POS_X * run;
    while i < k {
        #[unroll]
        for u in 0..UNROLL {
            let at = i + u * stride;
            if at < k {
                decode_run::<F>(w, row_start, at, &mut values, u * run, run, ty);
            }
        }
        #[unroll]
        for u in 0..UNROLL {
            let at = i + u * stride;
            if at < k {
                #[unroll]
                for r in 0..rows {
                    // Past the last row, read a valid one: never written.
                    let row = min(row0 + r, m - 1);
                    #[unroll]
                    for g in 0..run {
                        let mut xv = x[(row * k + at + g) as usize];
                        if comptime!(normed) {
                            // As `rms_norm` forms it, in the same order.
                            xv = xv * inv[r as usize] * norm[(at + g) as usize];
                        }
                        acc[r as usize] += xv * values[(u * run + g) as usize];
                    }
                }
            }
        }
        i += stride * UNROLL;
    }
}

/// Matrix-vector products for a few rows (decode): LANES lanes split
/// one output's dot product along k and sum their parts in shared memory;
/// each weight read serves the cube's `rows` rows. Every row's sum is formed
/// in the same order whatever `rows` and the batch are, so a sequence decoded
/// beside others gets bit-for-bit the logits it gets alone. Gated, each
/// unit also forms the same output's sum over `up`.
#[cube(launch)]
fn gemv<F: Float>(
    x: &Array<F>,
    w: &Array<u32>,
    up: &Array<u32>,
    bias: &Array<F>,
    norm: &Array<F>,
    out: &mut Array<F>,
    m: u32,
    n: u32,
    k: u32,
    row_bytes: u32,
    up_row_bytes: u32,
    out_stride: u32,
    out_offset: u32,
    bias_offset: u32,
    eps: f32,
    #[comptime] lanes: u32,
    #[comptime] outputs: u32,
    #[comptime] rows: u32,
    #[comptime] runs: (u32, u32),
    #[comptime] ty: WeightType,
    #[comptime] up_ty: WeightType,
    #[comptime] finish: Finish,
    #[comptime] normed: bool,
) {
    // Each weight's own run, so that its sums are formed as in its own
    // product's.
    let (run, up_run) = runs;
    let j = CUBE_POS_X * outputs + UNIT_POS_Y;
    let row0 = CUBE_POS_Y * rows;
    let mut acc = Array::<F>::new(rows as usize);
    let mut acc_up = Array::<F>::new(rows as usize);
    let mut inv = Array::<F>::new(rows as usize);
    #[unroll]
    for r in 0..rows {
        acc[r as usize] = F::new(0.0);
        acc_up[r as usize] = F::new(0.0);
        inv[r as usize] = F::new(1.0);
        if comptime!(normed) {
            // Each row of units reduces the row as `rms_norm` does (its
            // lanes are as many as `rms_norm`'s units), to the same bits.
            let row = min(row0 + r, m - 1);
            inv[r as usize] = inverse_rms::<F>(x, row * k, k, eps, lanes, outputs);
        }
    }
    if j < n {
        let start = j * row_bytes;
        gemv_partials::<F>(
            x, w, &mut acc, start, row0, m, k, &inv, norm, lanes, rows, run, ty, normed,
        );
        if comptime!(finish.gated) {
            let start = j * up_row_bytes;
            gemv_partials::<F>(
                x,
                up,
                &mut acc_up,
                start,
                row0,
                m,
                k,
                &inv,
                norm,
                lanes,
                rows,
                up_run,
                up_ty,
                normed,
            );
        }
    }
    // The lanes' partial sums of each row are added in shared memory and
    // lane 0 finishes the output, if it is one.
    let lane = UNIT_POS_X;
    let mut partial = SharedMemory::<F>::new((lanes * outputs) as usize);
    let up_len = comptime!(if finish.gated { lanes * outputs } else { 1 });
    let mut partial_up = SharedMemory::<F>::new(up_len as usize);
    let base = UNIT_POS_Y * lanes;
    #[unroll]
    for r in 0..rows {
        partial[(base + lane) as usize] = acc[r as usize];
        if comptime!(finish.gated) {
            partial_up[(base + lane) as usize] = acc_up[r as usize];
        }
        sync_cube();
        reduce::<F, Sum>(&mut partial, base);
        if comptime!(finish.gated) {
            reduce::<F, Sum>(&mut partial_up, base);
        }
        if lane == 0 && j < n && row0 + r < m {
            let at = (row0 + r) * out_stride + out_offset + j;
            // Only the gated kernel has a sum over `up` to read.
            let mut u = F::new(0.0);
            if comptime!(finish.gated) {
                u = partial_up[base as usize];
            }
            finish_output::<F>(out, at, partial[base as usize], u, bias, bias_offset + j, finish);
        }
        sync_cube();
    }
}

/// Launches the decode product for `x`'s `m` rows (`rows` a cube) into
/// `out` at `(row stride, column offset, bias offset)`, `x` RMS-normed by
/// `norm` as it is read where given.
#[allow(clippy::too_many_arguments)]
pub(super) fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Tensor,
    (w, up): (&Weight, &Weight),
    norm: Option<(&Tensor, f32)>,
    (bias, out): (&Tensor, &Tensor),
    (m, n, k): (usize, usize, usize),
    rows: usize,
    (stride, offset, bias_offset): (u32, u32, u32),
    finish: Finish,
) {
    crate::profile::launch(client, "gemv", || {
        gemv::launch::<f32, R>(
            client,
            CubeCount::Static((n as u32).div_ceil(OUTPUTS), m.div_ceil(rows) as u32, 1),
            CubeDim::new_2d(LANES, OUTPUTS),
            x.arg(),
            w.words_arg(),
            up.words_arg(),
            bias.arg(),
            norm.map_or(x, |(weight, _)| weight).arg(),
            out.arg(),
            m as u32,
            n as u32,
            k as u32,
            w.row_bytes() as u32,
            up.row_bytes() as u32,
            stride,
            offset,
            bias_offset,
            norm.map_or(0.0, |(_, eps)| eps),
            LANES,
            OUTPUTS,
            rows as u32,
            (gemv_run(w.ty, k), gemv_run(up.ty, k)),
            w.ty,
            up.ty,
            finish,
            norm.is_some(),
        );
    });
}

/// Values of a row of `k` values of `ty` one lane of the decode kernel
/// decodes at once: four words' worth of f32 or halves where the rows are
/// whole such runs and words, else a group (see `WeightType::group_len`);
/// 16 values of the block types (within one scale of every type).
fn gemv_run(ty: WeightType, k: usize) -> u32 {
    let run = match ty {
        WeightType::F32 => 4,
        WeightType::F16 | WeightType::BF16 => 8,
        _ => super::units::TYPED_RUN,
    };
    if k.is_multiple_of(run) {
        run as u32
    } else {
        ty.traits().decode_group
    }
}
