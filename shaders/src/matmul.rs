//! `out = x · wᵀ` with `w` stored as PyTorch's `nn.Linear` keeps it:
//! `[out_features, in_features]`, so both operands are read along `k`.
//!
//! Each sum can be finished in the same pass ([`Epilogue`]): a bias added,
//! the result added into `out` (a block's residual add), or a gated MLP's
//! `activation(x·gateᵀ) · (x·upᵀ)` formed from two weights at once. Each
//! finishing step does in registers what the separate kernel it replaces
//! did in memory, in the same order, so fused and unfused give the same
//! bits. Where cubek forms a prefill product (devices without matrix
//! units: it is faster there), one element-wise pass finishes it with the
//! same code.

use std::ops::Range;

use cubecl::prelude::*;

use crate::activation::{activation, Activation};
use crate::choice::kernels_for;
use crate::decode::{decode_run, dequantize_rows};
use crate::error::check_shape;
use crate::grid::{grid_1d, linear_pos};
use crate::norm::{inverse_rms, rms_norm, ROW_UNITS};
use crate::precision::{half_type, matrix_units, narrow, precision_for, rounded, Precision};
use crate::reduce::reduce_sum;
use crate::{KernelError, Kernels, Tensor, Weight, WeightType};

/// Each unit of the prefill kernel computes a BLOCK×BLOCK block of outputs.
const BLOCK: u32 = 4;
/// Units per cube along each axis of the prefill kernel.
const UNITS: u32 = 8;
/// Lanes that share one output's dot product in the decode kernel: a warp
/// on NVIDIA GPUs, so that a warp's loads of a run each are one contiguous
/// stretch of the weight's row. As many as `rms_norm`'s units, so that a
/// norm fused into the kernel reduces its row as `rms_norm` does.
const GEMV_LANES: u32 = ROW_UNITS;
/// Outputs one cube of the decode kernel computes.
const GEMV_OUTPUTS: u32 = 8;
/// Runs of values each lane of the decode kernel loads before it uses the
/// first: several loads in flight per lane are what keeps a GPU's memory
/// busy when a product has few outputs.
const GEMV_UNROLL: u32 = 4;
/// Rows one cube of the decode kernel computes, sharing each weight read.
const GEMV_ROWS: usize = 4;
/// Units per cube of the decode kernel's unit form.
const GEMV_UNITS: u32 = 32;
/// Outputs one unit of the unit form computes, sharing each load of `x`.
const GEMV_UNIT_OUTPUTS: u32 = 4;
/// f32 values the unit form reads with one load: llvmpipe pays for a load
/// per instruction and invocation, whatever its width.
const GEMV_VECTOR: usize = 4;
/// Values of a typed weight's row the unit form decodes at once: the most
/// that share one scale in every block type (Q6_K keeps one per 16), so
/// that the scale is read once for all.
const GEMV_TYPED_RUN: usize = 16;
/// The most f32 bytes a typed weight is widened into at once for prefill:
/// a bounded temporary, well under every backend's binding limit.
const PREFILL_CHUNK_BYTES: usize = 32 << 20;
/// Values a row of a matrix-unit product's operands is a multiple of: 16
/// bytes of halves, the alignment the tensor-memory copies need.
const MATRIX_ALIGN: usize = 8;

/// What a matmul does with each sum `s = x·wᵀ (+ bias)` of its output,
/// and to `x` before: an RMS norm, where the norm feeds the product.
#[derive(Clone, Copy, Debug, Default)]
pub struct Epilogue<'a> {
    /// A bias vector, and the index in it of `w`'s first row (a weight in
    /// row chunks shares its layer's bias).
    pub bias: Option<(&'a Tensor, usize)>,
    pub output: Output<'a>,
    /// `x` RMS-normed first, as `rms_norm(x, weight, eps)`: in the decode
    /// kernel as it reads `x` (one launch less), else by `rms_norm`.
    pub norm: Option<(&'a Tensor, f32)>,
}

/// Where a matmul's finished sums go.
#[derive(Clone, Copy, Debug, Default)]
pub enum Output<'a> {
    /// `out = s`.
    #[default]
    Store,
    /// `out += s`: the residual add after a block's last projection.
    Accumulate,
    /// `out = activation(s) · (x·upᵀ)`: a gated MLP's gate and up
    /// projections and its activation, `w` being the gate and `up` a weight
    /// of the same shape (of any type).
    Gated { up: &'a Weight, activation: Activation },
}

impl<'a> Epilogue<'a> {
    /// Sums finished as `output` says.
    pub fn new(output: Output<'a>) -> Self {
        Epilogue {
            output,
            ..Epilogue::default()
        }
    }

    /// `out += x·wᵀ`.
    pub fn accumulate() -> Self {
        Epilogue::new(Output::Accumulate)
    }

    /// The same, `x` first RMS-normed by `weight` (with `eps`) where given.
    pub fn with_norm(self, norm: Option<(&'a Tensor, f32)>) -> Self {
        Epilogue { norm, ..self }
    }

    /// The same output, with `bias` (whose element `first` belongs to the
    /// weight's first row) added to each sum.
    pub fn with_bias(self, bias: Option<&'a Tensor>, first: usize) -> Self {
        Epilogue {
            bias: bias.map(|b| (b, first)),
            ..self
        }
    }
}

/// [`Output`] as the kernels are compiled for it.
#[derive(Clone, Copy, Hash, PartialEq, Eq)]
struct Finish {
    accumulate: bool,
    gated: bool,
    /// Applied to the sums where `gated`.
    activation: Activation,
    bias: bool,
}

/// One word for a kernel variant's name: `store`, `add`, `gated-Silu`,
/// with `+ bias` where it has one.
impl std::fmt::Debug for Finish {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.gated, self.accumulate) {
            (true, _) => write!(f, "gated-{:?}", self.activation)?,
            (false, true) => f.write_str("add")?,
            (false, false) => f.write_str("store")?,
        }
        if self.bias {
            f.write_str(" + bias")?;
        }
        Ok(())
    }
}

impl Epilogue<'_> {
    fn finish(&self) -> Finish {
        let (accumulate, gated, activation) = match self.output {
            Output::Store => (false, false, Activation::Silu),
            Output::Accumulate => (true, false, Activation::Silu),
            Output::Gated { activation, .. } => (false, true, activation),
        };
        Finish {
            accumulate,
            gated,
            activation,
            bias: self.bias.is_some(),
        }
    }

    fn up(&self) -> Option<&Weight> {
        match self.output {
            Output::Gated { up, .. } => Some(up),
            _ => None,
        }
    }
}

/// Writes output `at` of `out` from the sum `s` of its row and column `j`
/// of the weight, and `u`, the matching sum over `up` (gated only).
#[cube]
fn finish_output<F: Float>(
    out: &mut Array<F>,
    at: u32,
    s: F,
    u: F,
    bias: &Array<F>,
    bias_at: u32,
    #[comptime] finish: Finish,
) {
    let mut v = s;
    if comptime!(finish.bias) {
        v += bias[bias_at as usize];
    }
    if comptime!(finish.gated) {
        out[at as usize] = activation::<F>(v, finish.activation) * u;
    } else if comptime!(finish.accumulate) {
        out[at as usize] += v;
    } else {
        out[at as usize] = v;
    }
}

/// Row `j`'s dot products with the cube's `rows` rows of `x`, this lane's
/// part of them: lane `l` takes the runs of `run` values starting at
/// `l·run, (l + lanes)·run, ..`, decoded in registers (see `decode_run`),
/// so the f32 values never exist in memory; GEMV_UNROLL runs are loaded
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
    let mut values = Array::<F>::new(comptime!(run * GEMV_UNROLL) as usize);
    let mut i = UNIT_POS_X * run;
    while i < k {
        #[unroll]
        for u in 0..GEMV_UNROLL {
            let at = i + u * stride;
            if at < k {
                decode_run::<F>(w, row_start, at, &mut values, u * run, run, ty);
            }
        }
        #[unroll]
        for u in 0..GEMV_UNROLL {
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
        i += stride * GEMV_UNROLL;
    }
}

/// Matrix-vector products for a few rows (decode): GEMV_LANES lanes split
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
        reduce_sum::<F>(&mut partial, base);
        if comptime!(finish.gated) {
            reduce_sum::<F>(&mut partial_up, base);
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
    let at = OutputsAt {
        j0: ABSOLUTE_POS_X * outputs,
        n,
        row0: CUBE_POS_Y * rows,
        m,
        out_stride,
        out_offset,
        bias_offset,
    };
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
    let at = OutputsAt {
        j0: ABSOLUTE_POS_X * outputs,
        n,
        row0: CUBE_POS_Y * rows,
        m,
        out_stride,
        out_offset,
        bias_offset,
    };
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

/// How the prefill kernel reads its rows of `x` and where it writes the
/// output.
#[derive(Clone, Copy, Hash, PartialEq, Eq)]
pub(crate) struct Rows {
    /// `x` is a `[channels, height, width]` map and row `p` of the product
    /// is pixel p's `window × window` neighbourhood over every channel,
    /// zero past the edges, gathered as it is read (im2col that is never
    /// written: implicit GEMM); the output is `[n, pixels]` (channels
    /// first). Otherwise `x` is `[m, k]` and the output `[m, n]`.
    pub(crate) im2col: bool,
    /// The neighbourhood's side (odd) where `im2col`.
    pub(crate) window: u32,
}

impl Rows {
    const DENSE: Rows = Rows {
        im2col: false,
        window: 1,
    };
}

/// `dense` or `im2col 3x3`: the variant's name.
impl std::fmt::Debug for Rows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.im2col {
            true => write!(f, "im2col {0}x{0}", self.window),
            false => f.write_str("dense"),
        }
    }
}

/// Element `kk` of row `row` of `x` as `rows` says to read it: the pixel
/// (`y`, `col`) of a `[k / window², height, width]` map for im2col.
#[cube]
fn x_at<F: Float>(
    x: &Array<F>,
    row: u32,
    kk: u32,
    k: u32,
    y: u32,
    col: u32,
    width: u32,
    height: u32,
    #[comptime] rows: Rows,
) -> F {
    let mut value = F::new(0.0);
    if comptime!(rows.im2col) {
        let taps = comptime!(rows.window * rows.window);
        let pad = comptime!(rows.window / 2);
        let tap = kk % taps;
        // Input pixel (y + ty - pad, col + tx - pad), kept unsigned by
        // adding pad first.
        let iy = y + tap / comptime!(rows.window);
        let ix = col + tap % comptime!(rows.window);
        if iy >= pad && iy < height + pad && ix >= pad && ix < width + pad {
            value = x[((kk / taps * height + iy - pad) * width + ix - pad) as usize];
        }
    } else {
        value = x[(row * k + kk) as usize];
    }
    value
}

/// Matmul for many rows (prefill): each unit accumulates a `bm × bn` block
/// of outputs in registers while walking k, reusing each loaded x value bn
/// times and each w value bm times (and, gated, each of `up`'s). No shared
/// memory and no barriers: measured on lavapipe this is 4.5× faster than
/// 16×16 shared-memory tiles. The same kernel is a convolution's implicit
/// GEMM ([`Rows`]).
#[cube(launch)]
fn matmul_blocked<F: Float>(
    x: &Array<F>,
    w: &Array<F>,
    up: &Array<F>,
    bias: &Array<F>,
    out: &mut Array<F>,
    m: u32,
    n: u32,
    k: u32,
    out_stride: u32,
    out_offset: u32,
    bias_offset: u32,
    width: u32,
    #[comptime] bm: u32,
    #[comptime] bn: u32,
    #[comptime] rows: Rows,
    #[comptime] finish: Finish,
) {
    let row0 = ABSOLUTE_POS_Y * bm;
    let col0 = ABSOLUTE_POS_X * bn;
    let mut acc = Array::<F>::new((bm * bn) as usize);
    let mut acc_up = Array::<F>::new((bm * bn) as usize);
    #[unroll]
    for i in 0..bm * bn {
        acc[i as usize] = F::new(0.0);
        acc_up[i as usize] = F::new(0.0);
    }
    // Each row's pixel, for im2col (width is 1 otherwise).
    let height = m / width;
    let mut ys = Array::<u32>::new(bm as usize);
    let mut cols = Array::<u32>::new(bm as usize);
    #[unroll]
    for r in 0..bm {
        // Past the edge, read a valid row: those results are never written.
        let row = min(row0 + r, m - 1);
        ys[r as usize] = row / width;
        cols[r as usize] = row % width;
    }
    for kk in 0..k {
        #[unroll]
        for r in 0..bm {
            let row = min(row0 + r, m - 1);
            let xv = x_at::<F>(x, row, kk, k, ys[r as usize], cols[r as usize], width, height, rows);
            #[unroll]
            for c in 0..bn {
                let col = min(col0 + c, n - 1);
                acc[(r * bn + c) as usize] += xv * w[(col * k + kk) as usize];
                if comptime!(finish.gated) {
                    acc_up[(r * bn + c) as usize] += xv * up[(col * k + kk) as usize];
                }
            }
        }
    }
    #[unroll]
    for r in 0..bm {
        #[unroll]
        for c in 0..bn {
            if row0 + r < m && col0 + c < n {
                let mut at = (row0 + r) * out_stride + out_offset + col0 + c;
                if comptime!(rows.im2col) {
                    at = (out_offset + col0 + c) * m + row0 + r;
                }
                let i = (r * bn + c) as usize;
                finish_output::<F>(out, at, acc[i], acc_up[i], bias, bias_offset + col0 + c, finish);
            }
        }
    }
}

/// `x · wᵀ` for `x: [.., k]` and `w: [n, k]`, as a new `[.., n]` tensor.
pub fn matmul<R: Runtime>(client: &ComputeClient<R>, x: &Tensor, w: &Tensor) -> Result<Tensor, KernelError> {
    let out = Tensor::empty(client, &x.shape_with_cols(w.shape.first().copied().unwrap_or(0)));
    matmul_into(client, x, w, &out, 0)?;
    Ok(out)
}

/// `x · wᵀ` written into columns `col_offset..col_offset + n` of `out`, whose
/// rows may be wider than `n`. This is how a weight stored as several row
/// chunks (one buffer each) fills one output.
pub fn matmul_into<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Tensor,
    w: &Tensor,
    out: &Tensor,
    col_offset: usize,
) -> Result<(), KernelError> {
    check_shape(w.shape.len() == 2, "matmul", "weight", &w.shape, || "[n, k]".into())?;
    let w = Weight::from_tensor(w.clone());
    matmul_weight_into(client, x, &w, out, col_offset, Epilogue::default())
}

/// `x · wᵀ` for `x: [.., k]` and a typed weight `w: [n, k]`, as a new
/// `[.., n]` tensor.
pub fn matmul_weight<R: Runtime>(client: &ComputeClient<R>, x: &Tensor, w: &Weight) -> Result<Tensor, KernelError> {
    let out = Tensor::empty(client, &x.shape_with_cols(w.rows));
    matmul_weight_into(client, x, w, &out, 0, Epilogue::default())?;
    Ok(out)
}

/// `x · wᵀ` for a weight in its stored type, finished as `epilogue` says
/// into columns `col_offset..col_offset + n` of `out`.
///
/// A single row, or `x: [sequences, 1, k]` (one row of each of several
/// sequences: a decode step), takes the decode kernel, which decodes the
/// stored values in registers and computes each row exactly as it computes
/// that row alone; any other `x` is many rows of one sequence and takes the
/// prefill product ([`prefill`]), over f32 weights as they are and over the
/// other types widened to f32 in row chunks of at most
/// [`PREFILL_CHUNK_BYTES`].
pub fn matmul_weight_into<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Tensor,
    w: &Weight,
    out: &Tensor,
    col_offset: usize,
    epilogue: Epilogue,
) -> Result<(), KernelError> {
    let (m, n, k) = check_operands("matmul", x, &[w.rows, w.cols], out, col_offset)?;
    let up = epilogue.up();
    if let Some(up) = up {
        check_shape(
            up.rows == n && up.cols == k,
            "matmul",
            "up",
            &[up.rows, up.cols],
            || format!("[{n}, {k}], the gate's shape"),
        )?;
    }
    let bias_offset = match epilogue.bias {
        Some((bias, first)) => {
            check_shape(
                bias.shape.len() == 1 && bias.len() >= first + n,
                "matmul",
                "bias",
                &bias.shape,
                || format!("[>= {}]", first + n),
            )?;
            first
        }
        None => 0,
    };
    if let Some((weight, _)) = epilogue.norm {
        check_shape(weight.shape == [k], "matmul", "norm weight", &weight.shape, || {
            format!("[{k}]")
        })?;
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let finish = epilogue.finish();
    let decode = x.rows_per_sequence() == 1;
    let units = kernels_for(client) == Kernels::Unit && k % GEMV_VECTOR == 0;
    // The decode kernel's lanes form norms `x` as it reads it; every other
    // kernel reads it normed by `rms_norm` first.
    let fused_norm = decode && !units;
    let normed_apart;
    let (x, norm) = match epilogue.norm {
        Some((weight, eps)) if !fused_norm => {
            normed_apart = rms_norm(client, x, weight, eps)?;
            (&normed_apart, None)
        }
        norm => (x, norm),
    };
    // Arguments a kernel does not read (no bias, not gated, no norm) are
    // bound to ones it has.
    let bias = epilogue.bias.map_or(x, |(bias, _)| bias);
    let up = up.unwrap_or(w);
    let (stride, offset) = (out.cols() as u32, col_offset as u32);
    if decode {
        let rows = m.min(GEMV_ROWS);
        let unit_cubes = || {
            let columns = (n as u32).div_ceil(GEMV_UNITS * GEMV_UNIT_OUTPUTS);
            CubeCount::Static(columns, m.div_ceil(rows) as u32, 1)
        };
        let typed = w.ty != WeightType::F32 && up.ty != WeightType::F32 && k % GEMV_TYPED_RUN == 0;
        if units && typed {
            crate::profile::launch(client, "gemv_units_typed", || {
                gemv_units_typed::launch::<f32, R>(
                    client,
                    unit_cubes(),
                    CubeDim::new_1d(GEMV_UNITS),
                    GEMV_VECTOR,
                    x.arg(),
                    w.words_arg(),
                    up.words_arg(),
                    bias.arg(),
                    out.arg(),
                    m as u32,
                    n as u32,
                    (k / GEMV_TYPED_RUN) as u32,
                    w.row_bytes() as u32,
                    up.row_bytes() as u32,
                    stride,
                    offset,
                    bias_offset as u32,
                    GEMV_TYPED_RUN as u32,
                    GEMV_UNIT_OUTPUTS,
                    rows as u32,
                    w.ty,
                    up.ty,
                    finish,
                );
            });
            return Ok(());
        }
        if let (true, Some(w), Some(up)) = (units, w.as_f32(), up.as_f32()) {
            crate::profile::launch(client, "gemv_units", || {
                gemv_units::launch::<f32, R>(
                    client,
                    unit_cubes(),
                    CubeDim::new_1d(GEMV_UNITS),
                    GEMV_VECTOR,
                    x.arg(),
                    w.arg(),
                    up.arg(),
                    bias.arg(),
                    out.arg(),
                    m as u32,
                    n as u32,
                    (k / GEMV_VECTOR) as u32,
                    stride,
                    offset,
                    bias_offset as u32,
                    GEMV_UNIT_OUTPUTS,
                    rows as u32,
                    finish,
                );
            });
            return Ok(());
        }
        crate::profile::launch(client, "gemv", || {
            gemv::launch::<f32, R>(
                client,
                CubeCount::Static((n as u32).div_ceil(GEMV_OUTPUTS), m.div_ceil(rows) as u32, 1),
                CubeDim::new_2d(GEMV_LANES, GEMV_OUTPUTS),
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
                bias_offset as u32,
                norm.map_or(0.0, |(_, eps)| eps),
                GEMV_LANES,
                GEMV_OUTPUTS,
                rows as u32,
                (gemv_run(w.ty, k), gemv_run(up.ty, k)),
                w.ty,
                up.ty,
                finish,
                norm.is_some(),
            );
        });
        return Ok(());
    }
    // Fast products take 16-bit inputs: the weight's own type, f16 for the
    // block types (an f32 checkpoint has none and stays exact).
    let half = half_type(w.ty);
    let fast = precision_for(client) == Precision::Fast
        && w.ty != WeightType::F32
        && up.ty != WeightType::F32
        && half_type(up.ty) == half;
    if fast && matrix_units(client) && k.is_multiple_of(MATRIX_ALIGN) {
        let at = (stride, offset, bias_offset as u32);
        return prefill_on_matrix_units(client, x, (w, up, half), (m, n, k), at, (bias, out), finish);
    }
    // Elsewhere the same rounded products, formed by the other kernels.
    let rounded_x;
    let x = if fast {
        rounded_x = rounded(client, x, half);
        &rounded_x
    } else {
        x
    };
    let blocked = |w: &Tensor, up: &Tensor, n: usize, first: usize| {
        let at = (stride, offset + first as u32, (bias_offset + first) as u32);
        prefill(client, Blocked { x, w, up, bias, out }, (m, n, k), at, finish)
    };
    if let (Some(w), Some(up)) = (w.as_f32(), up.as_f32()) {
        return blocked(&w, &up, n, 0);
    }
    for_row_chunks(client, (w, up), finish.gated, |rows, w_rows, up_rows| {
        // A block type's widened values are rounded to f16 as the matrix
        // units get them; 16-bit ones are exactly their stored values.
        let round = |t: Tensor| match fast && w.ty.block_len() > 1 {
            true => rounded(client, &t, half),
            false => t,
        };
        blocked(&round(w_rows), &round(up_rows), rows.len(), rows.start)
    })
}

/// Calls `each(rows, w rows, up rows)` for row chunks of `w` (and `up`,
/// `gated`) widened to f32, each chunk within PREFILL_CHUNK_BYTES.
fn for_row_chunks<R: Runtime>(
    client: &ComputeClient<R>,
    (w, up): (&Weight, &Weight),
    gated: bool,
    mut each: impl FnMut(Range<usize>, Tensor, Tensor) -> Result<(), KernelError>,
) -> Result<(), KernelError> {
    let (n, k) = (w.rows, w.cols);
    let widened = if gated { 2 } else { 1 };
    let chunk_rows = (PREFILL_CHUNK_BYTES / (widened * k * size_of::<f32>()).max(1)).max(1);
    for start in (0..n).step_by(chunk_rows) {
        let rows = start..n.min(start + chunk_rows);
        let w_rows = dequantize_rows(client, w, rows.clone())?;
        let up_rows = if gated {
            dequantize_rows(client, up, rows.clone())?
        } else {
            w_rows.clone()
        };
        each(rows, w_rows, up_rows)?;
    }
    Ok(())
}

/// A prefill product on the matrix units: `x` rounded to `half` (F16 or
/// BF16), the weight in `half` (its stored bytes where it is that type,
/// else widened and rounded in row chunks), f32 accumulation by cubek's
/// cmma matmul, finished into `out` at `(row stride, column offset, bias
/// offset)` as the other kernels finish theirs.
fn prefill_on_matrix_units<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Tensor,
    (w, up, half): (&Weight, &Weight, WeightType),
    (m, n, k): (usize, usize, usize),
    (stride, offset, bias_offset): (u32, u32, u32),
    (bias, out): (&Tensor, &Tensor),
    finish: Finish,
) -> Result<(), KernelError> {
    let x16 = narrow(client, x, half);
    // The sums `s` (and `u`, gated) of rows `rows` of the weights, finished
    // into their columns of `out`.
    let finish_rows = |rows: Range<usize>, w16: &cubecl::server::Handle, up16: &cubecl::server::Handle| {
        let plain = !finish.gated && !finish.accumulate && !finish.bias;
        let n = rows.len();
        if plain && offset == 0 && rows.start == 0 && out.cols() == n {
            return cubek_half_product(client, (&x16, w16, half), (m, n, k), out);
        }
        let s = Tensor::empty(client, &[m, n]);
        cubek_half_product(client, (&x16, w16, half), (m, n, k), &s)?;
        let u = match finish.gated {
            true => {
                let u = Tensor::empty(client, &[m, n]);
                cubek_half_product(client, (&x16, up16, half), (m, n, k), &u)?;
                u
            }
            false => s.clone(),
        };
        let at = (stride, offset + rows.start as u32, bias_offset + rows.start as u32);
        finish_sums(client, (&s, &u), (bias, out), (m, n), at, finish);
        Ok(())
    };
    if w.ty == half && up.ty == half {
        return finish_rows(0..n, &w.handle, &up.handle);
    }
    for_row_chunks(client, (w, up), finish.gated, |rows, w_rows, up_rows| {
        let w16 = narrow(client, &w_rows, half);
        let up16 = if finish.gated {
            narrow(client, &up_rows, half)
        } else {
            w16.clone()
        };
        finish_rows(rows, &w16.handle, &up16.handle)
    })
}

/// `out = x · wᵀ` for 16-bit `x: [m, k]` (packed two to a word) and `w:
/// [n, k]` of type `half`, into f32 `out: [m, n]`, on the matrix units by
/// cubek: with the Hopper tensor-memory copies where the device has them
/// (the fastest measured, docs/BENCHMARKS.md), else double-buffered.
fn cubek_half_product<R: Runtime>(
    client: &ComputeClient<R>,
    (x, w, half): (&Tensor, &cubecl::server::Handle, WeightType),
    (m, n, k): (usize, usize, usize),
    out: &Tensor,
) -> Result<(), KernelError> {
    use cubek_matmul::definition::{MatmulElems, MatmulGlobalElems};
    use cubek_matmul::launch::{launch_ref, Strategy};
    use cubek_matmul::routines::BlueprintStrategy;
    use cubek_std::InputBinding;

    let ty = match half {
        WeightType::BF16 => half::bf16::as_type_native_unchecked().storage_type(),
        _ => half::f16::as_type_native_unchecked().storage_type(),
    };
    let binding = |handle: &cubecl::server::Handle, shape: [usize; 2], strides: [usize; 2]| TensorBinding::<R> {
        handle: handle.clone().binding(),
        shape: shape.as_slice().into(),
        strides: strides.as_slice().into(),
        runtime: std::marker::PhantomData,
    };
    let tma = !client.properties().features.tma.is_empty();
    let strategies = [
        tma.then(|| Strategy::SpecializedTmaCmma(BlueprintStrategy::default())),
        Some(Strategy::DoubleCyclicCmma(BlueprintStrategy::default())),
    ];
    let mut refusal = String::new();
    for strategy in strategies.into_iter().flatten() {
        let lhs = InputBinding::new(binding(&x.handle, [m, k], [k, 1]), ty);
        // `w` row-major `[n, k]` is the `[k, n]` right-hand side in
        // column-major order: the same bytes.
        let rhs = InputBinding::new(binding(w, [k, n], [1, k]), ty);
        let mut types = MatmulElems::from_globals(&MatmulGlobalElems {
            lhs: ty,
            rhs: ty,
            out: f32::as_type_native_unchecked().storage_type(),
        });
        let launched = crate::profile::launch(client, "cubek_cmma", || {
            launch_ref(
                &strategy,
                client,
                lhs,
                rhs,
                binding(&out.handle, [m, n], [n, 1]),
                &mut types,
            )
        });
        match launched {
            Ok(()) => return Ok(()),
            Err(e) => refusal = format!("{e:?}"),
        }
    }
    Err(KernelError::Launch {
        op: "matmul",
        problem: format!("cubek's matrix-unit matmul refused [{m}, {k}] x [{n}, {k}] in {half}: {refusal}"),
    })
}

/// Values of a row of `k` values of `ty` one lane of the decode kernel
/// decodes at once: four words' worth of f32 or halves where the rows are
/// whole such runs and words, else a group (see `WeightType::group_len`);
/// 16 values of the block types (within one scale of every type).
fn gemv_run(ty: WeightType, k: usize) -> u32 {
    let run = match ty {
        WeightType::F32 => 4,
        WeightType::F16 | WeightType::BF16 => 8,
        _ => GEMV_TYPED_RUN,
    };
    if k.is_multiple_of(run) {
        run as u32
    } else {
        ty.traits().decode_group
    }
}

/// Checks `x: [.., k]`, a weight of shape `w` (`[n, k]`) and `out: [m, >=
/// col_offset + n]`; returns (m, n, k).
fn check_operands(
    op: &'static str,
    x: &Tensor,
    w: &[usize],
    out: &Tensor,
    col_offset: usize,
) -> Result<(usize, usize, usize), KernelError> {
    let k = x.cols();
    let m = x.rows();
    check_shape(w.len() == 2 && w[1] == k, op, "weight", w, || format!("[n, {k}]"))?;
    let n = w[0];
    check_shape(
        out.rows() == m && out.cols() >= col_offset + n,
        op,
        "output",
        &out.shape,
        || format!("[{m}, >= {}]", col_offset + n),
    )?;
    Ok((m, n, k))
}

/// The prefill kernel's tensors: `up` and `bias` are bound to tensors it
/// has where it does not read them.
struct Blocked<'a> {
    x: &'a Tensor,
    w: &'a Tensor,
    up: &'a Tensor,
    bias: &'a Tensor,
    out: &'a Tensor,
}

/// One launch of the prefill kernel over `(m, n, k)`, writing at `(row
/// stride, column offset, bias offset)`, its rows read as `rows` says
/// (`width`: the map's, for im2col).
fn launch_blocked<R: Runtime>(
    client: &ComputeClient<R>,
    t: Blocked,
    (m, n, k): (usize, usize, usize),
    (stride, offset, bias_offset): (u32, u32, u32),
    (rows, width): (Rows, usize),
    finish: Finish,
) {
    crate::profile::launch(client, "matmul_blocked", || {
        matmul_blocked::launch::<f32, R>(
            client,
            CubeCount::Static(
                (n as u32).div_ceil(BLOCK * UNITS),
                (m as u32).div_ceil(BLOCK * UNITS),
                1,
            ),
            CubeDim::new_2d(UNITS, UNITS),
            t.x.arg(),
            t.w.arg(),
            t.up.arg(),
            t.bias.arg(),
            t.out.arg(),
            m as u32,
            n as u32,
            k as u32,
            stride,
            offset,
            bias_offset,
            width as u32,
            BLOCK,
            BLOCK,
            rows,
            finish,
        );
    });
}

/// A stride-1 convolution with zero padding `window / 2` as an implicit
/// GEMM: `x: [channels, height, width]`, `weight: [out, channels · window²]`
/// (PyTorch's `[out, channels, window, window]` seen as rows), `bias:
/// [out]`, into `out: [out, height, width]`. The caller checks the shapes.
pub(crate) fn conv2d_into<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    out: &Tensor,
    window: usize,
) {
    let (height, width) = (x.shape[1], x.shape[2]);
    let (n, k) = (weight.shape[0], weight.shape[1]);
    let pixels = height * width;
    if pixels == 0 || n == 0 {
        return;
    }
    let rows = Rows {
        im2col: true,
        window: window as u32,
    };
    let finish = Epilogue::default().with_bias(Some(bias), 0).finish();
    let operands = Blocked {
        x,
        w: weight,
        up: weight,
        bias,
        out,
    };
    launch_blocked(client, operands, (pixels, n, k), (0, 0, 0), (rows, width), finish);
}

/// The prefill product of f32 operands over `(m, n, k)`, finished into
/// `out` at `(row stride, column offset, bias offset)`: by cubek's matmul
/// and [`finish_products`] where the device runs [`Kernels::Unit`] (2.5 to
/// 4 times `matmul_blocked` on lavapipe, with the same bits), else by
/// `matmul_blocked` alone.
fn prefill<R: Runtime>(
    client: &ComputeClient<R>,
    t: Blocked,
    (m, n, k): (usize, usize, usize),
    at: (u32, u32, u32),
    finish: Finish,
) -> Result<(), KernelError> {
    if kernels_for(client) == Kernels::Tiled {
        launch_blocked(client, t, (m, n, k), at, (Rows::DENSE, 1), finish);
        return Ok(());
    }
    let plain = !finish.gated && !finish.accumulate && !finish.bias;
    if plain && at.1 == 0 && t.out.cols() == n {
        return cubek_product(client, t.x, t.w, t.out);
    }
    let s = Tensor::empty(client, &[m, n]);
    cubek_product(client, t.x, t.w, &s)?;
    let u = if finish.gated {
        let u = Tensor::empty(client, &[m, n]);
        cubek_product(client, t.x, t.up, &u)?;
        u
    } else {
        s.clone()
    };
    finish_sums(client, (&s, &u), (t.bias, t.out), (m, n), at, finish);
    Ok(())
}

/// Finishes sums `s: [m, n]` formed apart (and `u` over `up`, gated) into
/// `out` at `(row stride, column offset, bias offset)`, as the kernels that
/// form their own sums finish them.
fn finish_sums<R: Runtime>(
    client: &ComputeClient<R>,
    (s, u): (&Tensor, &Tensor),
    (bias, out): (&Tensor, &Tensor),
    (m, n): (usize, usize),
    (stride, offset, bias_offset): (u32, u32, u32),
    finish: Finish,
) {
    let (count, dim) = grid_1d(m * n);
    crate::profile::launch(client, "finish_products", || {
        finish_products::launch::<f32, R>(
            client,
            count,
            dim,
            s.arg(),
            u.arg(),
            bias.arg(),
            out.arg(),
            m as u32,
            n as u32,
            stride,
            offset,
            bias_offset,
            finish,
        );
    });
}

/// `out = x · wᵀ` for f32 `x: [m, k]`, `w: [n, k]` and `out: [m, n]`, by
/// cubek's unit-tiled matmul (`w` read in place as the column-major `[k,
/// n]` right-hand side).
fn cubek_product<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Tensor,
    w: &Tensor,
    out: &Tensor,
) -> Result<(), KernelError> {
    use cubek_matmul::definition::MatmulElems;
    use cubek_matmul::launch::{launch_ref, Strategy};
    use cubek_matmul::routines::BlueprintStrategy;
    use cubek_std::InputBinding;

    let (m, k, n) = (x.rows(), x.cols(), w.rows());
    let binding = |t: &Tensor, shape: [usize; 2], strides: [usize; 2]| TensorBinding::<R> {
        handle: t.handle.clone().binding(),
        shape: shape.as_slice().into(),
        strides: strides.as_slice().into(),
        runtime: std::marker::PhantomData,
    };
    let f32_type = f32::as_type_native_unchecked();
    let lhs = InputBinding::new(binding(x, [m, k], [k, 1]), f32_type.storage_type());
    let rhs = InputBinding::new(binding(w, [k, n], [1, k]), f32_type.storage_type());
    let mut types = MatmulElems::from_single_dtype(f32_type);
    let strategy = Strategy::SimpleUnit(BlueprintStrategy::default());
    let launched = crate::profile::launch(client, "cubek_matmul", || {
        launch_ref(&strategy, client, lhs, rhs, binding(out, [m, n], [n, 1]), &mut types)
    });
    launched.map_err(|e| KernelError::Launch {
        op: "matmul",
        problem: format!("cubek's matmul refused [{m}, {k}] x [{n}, {k}]: {e:?}"),
    })
}

/// One unit per output: finishes sums `s: [m, n]` formed apart (and `u`, the
/// matching sums over `up`, gated only) into `out` as [`matmul_blocked`]
/// finishes its own, so both give the same bits.
#[cube(launch)]
fn finish_products<F: Float>(
    s: &Array<F>,
    u: &Array<F>,
    bias: &Array<F>,
    out: &mut Array<F>,
    m: u32,
    n: u32,
    out_stride: u32,
    out_offset: u32,
    bias_offset: u32,
    #[comptime] finish: Finish,
) {
    let i = linear_pos() as u32;
    if i < m * n {
        let (row, col) = (i / n, i % n);
        let at = row * out_stride + out_offset + col;
        finish_output::<F>(out, at, s[i as usize], u[i as usize], bias, bias_offset + col, finish);
    }
}
