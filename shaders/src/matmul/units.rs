//! The decode product's unit form, for devices without matrix units (CPU
//! adapters): each unit forms a few outputs over their whole rows, with no
//! shared memory and no barriers.

use cubecl::prelude::*;

use super::{finish_output, Finish};
use crate::decode::decode_run;
use crate::{Tensor, Weight, WeightType};

/// Units per cube of the decode kernel's unit form.
const UNITS: u32 = 32;

/// Outputs one unit of the unit form computes, sharing each load of `x`.
const OUTPUTS: u32 = 4;

/// f32 values the unit form reads with one load: llvmpipe pays for a load
/// per instruction and invocation, whatever its width.
pub(super) const VECTOR: usize = 4;

/// Values of a typed weight's row the unit form decodes at once: the most
/// that share one scale in every block type (Q6_K keeps one per 16), so
/// that the scale is read once for all.
pub(super) const TYPED_RUN: usize = 16;

/// The unit form's dot products: `acc[r · outputs + t]` is row `row0 + r`
/// of `x` times row `j0 + t` of `w`, every row `vectors` vectors long. Each
/// load of `x` serves the unit's `outputs` rows of `w` and each load of `w`
/// its `rows` rows of `x`; two accumulators a pair (alternate vectors) keep
/// consecutive loads from waiting on one sum. Their order is fixed by
/// `vectors` alone.
#[cube]
fn row_dots<F: Float, V: Size>(
    x: &Array<Vector<F, V>>,
    w: &Array<Vector<F, V>>,
    acc: &mut Array<F>,
    at: OutputsAt,
    vectors: u32,
    #[comptime] outputs: u32,
    #[comptime] rows: u32,
) {
    let pairs = comptime!(outputs * rows) as usize;
    let mut even = Array::<Vector<F, V>>::new(pairs);
    let mut odd = Array::<Vector<F, V>>::new(pairs);
    #[unroll]
    for p in 0..pairs {
        even[p] = Vector::new(F::new(0.0));
        odd[p] = Vector::new(F::new(0.0));
    }
    // Past the last row of `x` or `w`, read a valid one: never written.
    let mut x_even = Array::<Vector<F, V>>::new(rows as usize);
    let mut x_odd = Array::<Vector<F, V>>::new(rows as usize);
    let mut i = 0;
    while i < vectors {
        // The odd accumulators take nothing past an odd count of vectors.
        let has_odd = i + 1 < vectors;
        #[unroll]
        for r in 0..rows {
            let at = min(at.row0 + r, at.m - 1) * vectors + i;
            x_even[r as usize] = x[at as usize];
            x_odd[r as usize] = Vector::new(F::new(0.0));
            if has_odd {
                x_odd[r as usize] = x[(at + 1) as usize];
            }
        }
        #[unroll]
        for t in 0..outputs {
            let at = min(at.j0 + t, at.n - 1) * vectors + i;
            let first = w[at as usize];
            let mut second = Vector::new(F::new(0.0));
            if has_odd {
                second = w[(at + 1) as usize];
            }
            #[unroll]
            for r in 0..rows {
                let p = (r * outputs + t) as usize;
                even[p] += x_even[r as usize] * first;
                odd[p] += x_odd[r as usize] * second;
            }
        }
        i += 2;
    }
    #[unroll]
    for p in 0..pairs {
        let both = even[p] + odd[p];
        let mut sum = F::new(0.0);
        #[unroll]
        for c in 0..V::value() {
            sum += both[c];
        }
        acc[p] = sum;
    }
}

/// The decode kernel's unit form, for f32 weights on devices without
/// matrix units: each unit forms `outputs` consecutive outputs over its
/// whole rows, `V` values a load, with no shared memory and no barriers. On
/// llvmpipe, where every load is a loop over the invocations of a SIMD
/// vector and every barrier a switch between the cube's units, this is
/// several times the lanes form (docs/BENCHMARKS.md). As there, each row's
/// sum is formed in the same order whatever `rows` and the batch are.
#[cube(launch)]
fn gemv_units<F: Float, V: Size>(
    x: &Array<Vector<F, V>>,
    w: &Array<Vector<F, V>>,
    up: &Array<Vector<F, V>>,
    bias: &Array<F>,
    out: &mut Array<F>,
    m: u32,
    n: u32,
    vectors: u32,
    out_stride: u32,
    out_offset: u32,
    bias_offset: u32,
    #[comptime] outputs: u32,
    #[comptime] rows: u32,
    #[comptime] finish: Finish,
) {
    let at = unit_outputs(m, n, out_stride, out_offset, bias_offset, outputs, rows);
    if at.j0 < n {
        let pairs = comptime!(outputs * rows) as usize;
        let mut acc = Array::<F>::new(pairs);
        let mut acc_up = Array::<F>::new(pairs);
        row_dots::<F, V>(x, w, &mut acc, at, vectors, outputs, rows);
        if comptime!(finish.gated) {
            row_dots::<F, V>(x, up, &mut acc_up, at, vectors, outputs, rows);
        }
        finish_unit_outputs::<F>(out, bias, &acc, &acc_up, at, outputs, rows, finish);
    }
}

/// A unit of the unit form: its outputs `j0..` of `n` in rows `row0..` of
/// `m`, and where in `out` they go.
#[derive(CubeType, Clone, Copy)]
struct OutputsAt {
    j0: u32,
    n: u32,
    row0: u32,
    m: u32,
    out_stride: u32,
    out_offset: u32,
    bias_offset: u32,
}

/// This unit's outputs: `outputs` of them at its place along x, in the
/// `rows` rows at its cube's place along y.
#[cube]
fn unit_outputs(
    m: u32,
    n: u32,
    out_stride: u32,
    out_offset: u32,
    bias_offset: u32,
    #[comptime] outputs: u32,
    #[comptime] rows: u32,
) -> OutputsAt {
    OutputsAt {
        j0: ABSOLUTE_POS_X * outputs,
        n,
        row0: CUBE_POS_Y * rows,
        m,
        out_stride,
        out_offset,
        bias_offset,
    }
}

/// A unit-form unit's sums `acc` (and `acc_up`, gated), row by row, into
/// the outputs that exist.
#[cube]
fn finish_unit_outputs<F: Float>(
    out: &mut Array<F>,
    bias: &Array<F>,
    acc: &Array<F>,
    acc_up: &Array<F>,
    at: OutputsAt,
    #[comptime] outputs: u32,
    #[comptime] rows: u32,
    #[comptime] finish: Finish,
) {
    #[unroll]
    for r in 0..rows {
        #[unroll]
        for t in 0..outputs {
            let j = at.j0 + t;
            if at.row0 + r < at.m && j < at.n {
                let p = (r * outputs + t) as usize;
                let o = (at.row0 + r) * at.out_stride + at.out_offset + j;
                // Only the gated kernel has a sum over `up` to read.
                let mut u = F::new(0.0);
                if comptime!(finish.gated) {
                    u = acc_up[p];
                }
                finish_output::<F>(out, o, acc[p], u, bias, at.bias_offset + j, finish);
            }
        }
    }
}

/// The unit form's dot products over a typed weight: as `row_dots`, each
/// `run` values of the unit's rows of `w` decoded in registers with one
/// scale read (see `decode_run`) and multiplied by `run / V` loads of each
/// row of `x`. Each sum runs along k in order.
#[cube]
fn typed_row_dots<F: Float, V: Size>(
    x: &Array<Vector<F, V>>,
    w: &Array<u32>,
    acc: &mut Array<F>,
    at: OutputsAt,
    runs: u32,
    row_bytes: u32,
    #[comptime] run: u32,
    #[comptime] outputs: u32,
    #[comptime] rows: u32,
    #[comptime] ty: WeightType,
) {
    let pairs = comptime!(outputs * rows) as usize;
    #[unroll]
    for p in 0..pairs {
        acc[p] = F::new(0.0);
    }
    // `V` is known only while the kernel is expanded, not inside
    // `comptime!`: bound first, then converted.
    let vector = V::value();
    let per_run = comptime!(run / vector as u32);
    let mut xs = Array::<Vector<F, V>>::new(comptime!(rows * per_run) as usize);
    let mut values = Array::<F>::new(run as usize);
    let mut i = 0;
    while i < runs {
        #[unroll]
        for r in 0..rows {
            // Past the last row of `x` or `w`, read a valid one: never written.
            let first = (min(at.row0 + r, at.m - 1) * runs + i) * per_run;
            #[unroll]
            for q in 0..per_run {
                xs[(r * per_run + q) as usize] = x[(first + q) as usize];
            }
        }
        #[unroll]
        for t in 0..outputs {
            let row_start = min(at.j0 + t, at.n - 1) * row_bytes;
            decode_run::<F>(w, row_start, i * run, &mut values, 0u32, run, ty);
            #[unroll]
            for r in 0..rows {
                let p = (r * outputs + t) as usize;
                #[unroll]
                for q in 0..per_run {
                    #[unroll]
                    for c in 0..vector {
                        let value = values[comptime!(q as usize * vector + c)];
                        acc[p] += xs[(r * per_run + q) as usize][c] * value;
                    }
                }
            }
        }
        i += 1;
    }
}

/// The decode kernel's unit form for typed weights (f16, bf16 and the
/// block types) on devices without matrix units: as [`gemv_units`], each
/// unit forms `outputs` outputs over their whole rows, decoding `run`
/// values of each at a time where the lanes form decodes four and shares
/// them across a cube.
#[cube(launch)]
fn gemv_units_typed<F: Float, V: Size>(
    x: &Array<Vector<F, V>>,
    w: &Array<u32>,
    up: &Array<u32>,
    bias: &Array<F>,
    out: &mut Array<F>,
    m: u32,
    n: u32,
    runs: u32,
    row_bytes: u32,
    up_row_bytes: u32,
    out_stride: u32,
    out_offset: u32,
    bias_offset: u32,
    #[comptime] run: u32,
    #[comptime] outputs: u32,
    #[comptime] rows: u32,
    #[comptime] ty: WeightType,
    #[comptime] up_ty: WeightType,
    #[comptime] finish: Finish,
) {
    let at = unit_outputs(m, n, out_stride, out_offset, bias_offset, outputs, rows);
    if at.j0 < n {
        let pairs = comptime!(outputs * rows) as usize;
        let mut acc = Array::<F>::new(pairs);
        let mut acc_up = Array::<F>::new(pairs);
        typed_row_dots::<F, V>(x, w, &mut acc, at, runs, row_bytes, run, outputs, rows, ty);
        if comptime!(finish.gated) {
            typed_row_dots::<F, V>(x, up, &mut acc_up, at, runs, up_row_bytes, run, outputs, rows, up_ty);
        }
        finish_unit_outputs::<F>(out, bias, &acc, &acc_up, at, outputs, rows, finish);
    }
}

/// Launches the unit form for `x`'s `m` rows (`rows` a cube) into `out` at
/// `(row stride, column offset, bias offset)`, if it takes these weights:
/// both f32, or both of other types with rows of whole runs.
#[allow(clippy::too_many_arguments)]
pub(super) fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Tensor,
    (w, up): (&Weight, &Weight),
    (bias, out): (&Tensor, &Tensor),
    (m, n, k): (usize, usize, usize),
    rows: usize,
    (stride, offset, bias_offset): (u32, u32, u32),
    finish: Finish,
) -> bool {
    let unit_cubes = || {
        let columns = (n as u32).div_ceil(UNITS * OUTPUTS);
        CubeCount::Static(columns, m.div_ceil(rows) as u32, 1)
    };
    let typed = w.ty != WeightType::F32 && up.ty != WeightType::F32 && k % TYPED_RUN == 0;
    if typed {
        crate::profile::launch(client, "gemv_units_typed", || {
            gemv_units_typed::launch::<f32, R>(
                client,
                unit_cubes(),
                CubeDim::new_1d(UNITS),
                VECTOR,
                x.arg(),
                w.words_arg(),
                up.words_arg(),
                bias.arg(),
                out.arg(),
                m as u32,
                n as u32,
                (k / TYPED_RUN) as u32,
                w.row_bytes() as u32,
                up.row_bytes() as u32,
                stride,
                offset,
                bias_offset,
                TYPED_RUN as u32,
                OUTPUTS,
                rows as u32,
                w.ty,
                up.ty,
                finish,
            );
        });
        return true;
    }
    if let (Some(w), Some(up)) = (w.as_f32(), up.as_f32()) {
        crate::profile::launch(client, "gemv_units", || {
            gemv_units::launch::<f32, R>(
                client,
                unit_cubes(),
                CubeDim::new_1d(UNITS),
                VECTOR,
                x.arg(),
                w.arg(),
                up.arg(),
                bias.arg(),
                out.arg(),
                m as u32,
                n as u32,
                (k / VECTOR) as u32,
                stride,
                offset,
                bias_offset,
                OUTPUTS,
                rows as u32,
                finish,
            );
        });
        return true;
    }
    false
}
