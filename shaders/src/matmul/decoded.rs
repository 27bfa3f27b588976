//! The prefill product at `--precision fast` of a weight of a block type
//! (GGUF's Q8_0 to Q6_K, IQ4 and MXFP4), read in its own type: each cube
//! decodes the tile of weight rows it needs into shared memory, rounded to
//! f16, beside the tile of input rows, rounded too, and multiplies the two
//! on the matrix units (`cmma`, 16×16×16 fragments, f32 sums). No widened
//! copy of the weight lies in device memory, and the sums are finished in
//! the same launch. Where the device has no matrix units, ordinary units
//! form the very same rounded products from the same tiles, so that CI
//! checks the numbers the matrix units must give.
//!
//! A cube takes 64 input rows against 64 weight rows, a step of `depth`
//! values of k at a time; each of its four planes (32 units, a CUDA warp)
//! holds a 32×32 quarter of the outputs, four fragments (eight, gated).

use cubecl::cmma;
use cubecl::prelude::*;

use super::blocked::{x_at, Rows};
use super::{finish_output, Finish};
use crate::attention::LLVMPIPE_LOOP_BUDGET;
use crate::choice::kernels_for;
use crate::decode::decode_run;
use crate::grid::MAX_CUBES_PER_DIM;
use crate::precision::{fragment, matrix_units, rounded_to_half, store_fragment, FRAG, LANES};
use crate::{Kernels, Tensor, Weight, WeightType};

/// Input rows, and weight rows, a cube takes.
const TILE: u32 = 64;
/// Planes in a cube, two by two over its outputs.
const PLANES: u32 = 4;
/// Units in a cube.
const UNITS: u32 = PLANES * LANES;
/// A plane's outputs are `HALF × HALF`.
const HALF: u32 = TILE / 2;
/// Values a unit decodes at once: within one scale of every block type.
const RUN: u32 = 16;
/// Values of k a unit takes per iteration of its loop over a step where
/// ordinary units form the products.
const DEPTH_PER_ITERATION: u32 = 4;
/// Values of the input tile a unit stages per iteration of its loop.
const INPUTS_PER_ITERATION: u32 = 4;

/// How a launch stages its operands: values of k a step takes, and whether
/// the products run on matrix units.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct DecodedPlan {
    depth: u32,
    matrix: bool,
}

impl DecodedPlan {
    /// Shared memory: the input tile, the weight's (and `up`'s) in 16 bits
    /// on matrix units, 64 values deep (24 KiB, and 8 KiB for fragments on
    /// their way out); elsewhere in f32, 32 deep (24 KiB, within a CPU
    /// adapter's 32 KiB). `k` is a multiple of 32: every block type's rows
    /// are whole blocks of 32 or 256.
    fn new(k: usize, matrix: bool) -> DecodedPlan {
        DecodedPlan {
            depth: if matrix && k.is_multiple_of(64) { 64 } else { 32 },
            matrix,
        }
    }

    /// Length of each staged tile.
    fn tile_len(self) -> u32 {
        TILE * self.depth
    }

    /// Length of the room a plane's fragments (and `up`'s) pass through on
    /// their way out, on matrix units.
    fn stage_len(self) -> u32 {
        match self.matrix {
            true => 2 * PLANES * FRAG * FRAG,
            false => 1,
        }
    }

    /// Elsewhere than on matrix units, the most values of k a product may
    /// take and keep each unit within llvmpipe's loop budget (every loop
    /// of an invocation counted), with a tenth of it spare. A unit runs,
    /// for each step of k, an iteration of the loop over the steps, and
    /// its loops staging the inputs and the weight's runs (and `up`'s) and
    /// its loop over the step's depth, each of which also counts the check
    /// that ends it (measured: a gated Q8_0 product of 19 iterations a
    /// step keeps within the budget over 3,449 steps, not 3,450).
    fn most_depth_on_units(self) -> usize {
        let budget = LLVMPIPE_LOOP_BUDGET - LLVMPIPE_LOOP_BUDGET / 10;
        let inputs = self.tile_len() / UNITS / INPUTS_PER_ITERATION;
        let runs = self.tile_len() / RUN / UNITS;
        let per_step = 1 + (inputs + 1) + 2 * (runs + 1) + (self.depth / DEPTH_PER_ITERATION + 1);
        budget / per_step as usize * self.depth as usize
    }
}

/// Whether the decoded product takes weights of `types` (the weight's
/// and `up`'s) over `(m, n, k)`: one at least of a block type, the other of
/// a block type or f16; products whose cubes the grid holds (64 rows a
/// cube, 65,535 cubes a side: 4 million rows); and `on_units` (a CPU
/// adapter, whose products run on ordinary units) up to
/// [`DecodedPlan::most_depth_on_units`] (99,328 values of k, which no
/// model comes near). The exact product takes the rest.
pub(super) fn decodes((w, up): (WeightType, WeightType), (m, n, k): (usize, usize, usize), on_units: bool) -> bool {
    let block_type = |ty: WeightType| ty.block_len() > 1;
    let takes = |ty: WeightType| block_type(ty) || ty == WeightType::F16;
    let cubes = |rows: usize| rows.div_ceil(TILE as usize) <= MAX_CUBES_PER_DIM as usize;
    let fits = !on_units || k <= DecodedPlan::new(k, false).most_depth_on_units();
    (block_type(w) || block_type(up)) && takes(w) && takes(up) && cubes(m) && cubes(n) && fits
}

/// The plan by which [`launch`] forms a fast product of `w` (and `up`) over
/// `m` input rows on `client`'s device, if it takes it ([`decodes`]).
pub(super) fn decoded_plan<R: Runtime>(
    client: &ComputeClient<R>,
    (w, up): (&Weight, &Weight),
    m: usize,
) -> Option<DecodedPlan> {
    let matrix = matrix_units(client);
    let on_units = !matrix && kernels_for(client) == Kernels::Unit;
    decodes((w.ty, up.ty), (m, w.rows, w.cols), on_units).then(|| DecodedPlan::new(w.cols, matrix))
}

/// Where a cube's tiles lie in the product, and the product's sizes.
#[derive(CubeType, Clone, Copy)]
struct At {
    /// The cube's first input row and first weight row.
    row0: u32,
    col0: u32,
    m: u32,
    n: u32,
    k: u32,
    /// The width of a convolution's map (1 for a dense input).
    width: u32,
    /// Where the outputs go: `out`'s row stride, the first column, and
    /// the bias's first element.
    out_stride: u32,
    out_offset: u32,
    bias_offset: u32,
}

/// The product `x · wᵀ` (and `x · upᵀ`, gated) of a cube's 64 input rows
/// and 64 weight rows, finished into `out` as [`matmul_blocked`] finishes
/// its own (`rows`: a convolution's windows, its output channels first).
/// `F` is f16 on matrix units, else f32 holding values rounded to f16.
///
/// [`matmul_blocked`]: super::blocked
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
fn matmul_decoded<F: Float>(
    x: &Array<f32>,
    w: &Array<u32>,
    up: &Array<u32>,
    bias: &Array<f32>,
    out: &mut Array<f32>,
    m: u32,
    n: u32,
    k: u32,
    w_row_bytes: u32,
    up_row_bytes: u32,
    out_stride: u32,
    out_offset: u32,
    bias_offset: u32,
    width: u32,
    #[comptime] plan: DecodedPlan,
    #[comptime] w_ty: WeightType,
    #[comptime] up_ty: WeightType,
    #[comptime] rows: Rows,
    #[comptime] finish: Finish,
) {
    let at = At {
        row0: CUBE_POS_Y * TILE,
        col0: CUBE_POS_X * TILE,
        m,
        n,
        k,
        width,
        out_stride,
        out_offset,
        bias_offset,
    };
    let tile_len = comptime!(plan.tile_len()) as usize;
    let mut xs = SharedMemory::<F>::new_aligned(tile_len, 128usize);
    let mut ws = SharedMemory::<F>::new_aligned(tile_len, 128usize);
    // Bound to `ws` where not gated: never staged nor read then.
    let mut ups = SharedMemory::<F>::new_aligned(
        comptime!(if finish.gated { plan.tile_len() } else { 1 }) as usize,
        128usize,
    );
    let mut stage = SharedMemory::<f32>::new_aligned(comptime!(plan.stage_len()) as usize, 128usize);
    let plane = UNIT_POS_X / LANES;
    let lane = UNIT_POS_X % LANES;
    // The plane's quarter of the outputs: rows `r0..r0 + 32` of the cube's
    // input rows, columns `c0..c0 + 32` of its weight rows.
    let r0 = (plane / 2) * HALF;
    let c0 = (plane % 2) * HALF;

    let mut sums = Sequence::<cmma::Matrix<f32>>::new();
    let mut own = Array::<f32>::new(comptime!(if plan.matrix { 1 } else { 2 * HALF }) as usize);
    if plan.matrix {
        #[unroll]
        for _ in 0..comptime!(if finish.gated { 8 } else { 4 }) {
            let acc = fragment::<f32>(cmma::MatrixIdent::Accumulator, cmma::MatrixLayout::Undefined);
            cmma::fill(&acc, 0.0f32);
            sums.push(acc);
        }
    } else {
        // Elsewhere each unit holds column `c0 + lane` of the plane's
        // outputs, over `up` too where gated.
        #[unroll]
        for i in 0..2 * HALF {
            own[i as usize] = 0.0;
        }
    }

    let depth = comptime!(plan.depth);
    let mut k0 = 0u32;
    while k0 < k {
        stage_inputs::<F>(&mut xs, x, at, k0, plan, rows);
        stage_weight::<F>(&mut ws, w, at, w_row_bytes, k0, plan, w_ty);
        if comptime!(finish.gated) {
            stage_weight::<F>(&mut ups, up, at, up_row_bytes, k0, plan, up_ty);
        }
        sync_cube();
        if plan.matrix {
            tiles_product::<F>(&xs, &ws, &ups, &sums, r0, c0, plan, finish.gated);
        } else {
            let mut kk = 0u32;
            while kk < depth {
                #[unroll]
                for d in 0..DEPTH_PER_ITERATION {
                    let c = (c0 + lane) * depth + kk + d;
                    let wv = f32::cast_from(ws[c as usize]);
                    let mut uv = 0.0f32;
                    if comptime!(finish.gated) {
                        uv = f32::cast_from(ups[c as usize]);
                    }
                    #[unroll]
                    for r in 0..HALF {
                        let xv = f32::cast_from(xs[((r0 + r) * depth + kk + d) as usize]);
                        own[r as usize] += xv * wv;
                        if comptime!(finish.gated) {
                            own[(HALF + r) as usize] += xv * uv;
                        }
                    }
                }
                kk += DEPTH_PER_ITERATION;
            }
        }
        sync_cube();
        k0 += depth;
    }

    if plan.matrix {
        // Each fragment passes through the plane's part of `stage` (and of
        // `up`'s half) on its way out.
        let own_at = plane * FRAG * FRAG;
        let up_at = PLANES * FRAG * FRAG + own_at;
        #[unroll]
        for f in 0..4u32 {
            store_fragment(&mut stage, own_at, sums.index(f as usize));
            if comptime!(finish.gated) {
                store_fragment(&mut stage, up_at, sums.index((4 + f) as usize));
            }
            sync_cube();
            #[unroll]
            for e in 0..comptime!(FRAG * FRAG / LANES) {
                let i = e * LANES + lane;
                let r = r0 + (f / 2) * FRAG + i / FRAG;
                let c = c0 + (f % 2) * FRAG + i % FRAG;
                let s = stage[(own_at + i) as usize];
                let u = stage[(up_at + i) as usize];
                finish_at(out, bias, at, r, c, s, u, rows, finish);
            }
            sync_cube();
        }
    } else {
        #[unroll]
        for r in 0..HALF {
            let (s, u) = (own[r as usize], own[(HALF + r) as usize]);
            finish_at(out, bias, at, r0 + r, c0 + lane, s, u, rows, finish);
        }
    }
}

/// The cube's input rows `k0..k0 + depth` of k, rounded to f16, into `xs`
/// as `[64, depth]`: consecutive units read consecutive values. Rows past
/// the last read the last (their outputs are never written).
#[cube]
fn stage_inputs<F: Float>(
    xs: &mut SharedMemory<F>,
    x: &Array<f32>,
    at: At,
    k0: u32,
    #[comptime] plan: DecodedPlan,
    #[comptime] rows: Rows,
) {
    let depth = comptime!(plan.depth);
    let height = at.m / at.width;
    // A loop, a few values an iteration (see `most_depth_on_units`).
    let mut e = 0u32;
    while e < comptime!(plan.tile_len() / UNITS) {
        #[unroll]
        for ee in 0..INPUTS_PER_ITERATION {
            let i = (e + ee) * UNITS + UNIT_POS_X;
            let row = min(at.row0 + i / depth, at.m - 1);
            let (y, col) = (row / at.width, row % at.width);
            let value = x_at::<f32>(x, row, k0 + i % depth, at.k, y, col, at.width, height, rows);
            xs[i as usize] = F::cast_from(rounded_to_half(value, false));
        }
        e += INPUTS_PER_ITERATION;
    }
}

/// Values `k0..k0 + depth` of the cube's weight rows, decoded from
/// `words` (`ty`, rows of `row_bytes`) and rounded to f16, into `ws` as
/// `[64, depth]`, a run of 16 values a unit at a time. Rows past the last
/// read the last (their outputs are never written).
#[cube]
fn stage_weight<F: Float>(
    ws: &mut SharedMemory<F>,
    words: &Array<u32>,
    at: At,
    row_bytes: u32,
    k0: u32,
    #[comptime] plan: DecodedPlan,
    #[comptime] ty: WeightType,
) {
    let depth = comptime!(plan.depth);
    let mut values = Array::<f32>::new(RUN as usize);
    // A loop, not unrolled: one run's values live at a time.
    let mut i = UNIT_POS_X;
    while i < comptime!(plan.tile_len() / RUN) {
        let r = i / comptime!(plan.depth / RUN);
        let v = i % comptime!(plan.depth / RUN) * RUN;
        let row = min(at.col0 + r, at.n - 1);
        decode_run::<f32>(words, row * row_bytes, k0 + v, &mut values, 0u32, RUN, ty);
        #[unroll]
        for j in 0..RUN {
            ws[(r * depth + v + j) as usize] = F::cast_from(rounded_to_half(values[j as usize], false));
        }
        i += UNITS;
    }
}

/// On matrix units, a step's products added into a plane's fragments of
/// sums: `sums[2i + j]` holds its rows `r0 + 16i ..` against weight rows
/// `c0 + 16j ..`, and `sums[4 + 2i + j]` the same against `up`, gated.
#[allow(clippy::too_many_arguments)]
#[cube]
fn tiles_product<F: Float>(
    xs: &SharedMemory<F>,
    ws: &SharedMemory<F>,
    ups: &SharedMemory<F>,
    sums: &Sequence<cmma::Matrix<f32>>,
    r0: u32,
    c0: u32,
    #[comptime] plan: DecodedPlan,
    #[comptime] gated: bool,
) {
    let depth = comptime!(plan.depth);
    let len = comptime!(plan.tile_len()) as usize;
    let stride = u32::new(depth as i64);
    let inputs = fragment::<F>(cmma::MatrixIdent::A, cmma::MatrixLayout::RowMajor);
    // Weight rows `[64, depth]` row-major are the `[depth, 64]` right-hand
    // side column-major.
    let weights = fragment::<F>(cmma::MatrixIdent::B, cmma::MatrixLayout::ColMajor);
    #[unroll]
    for kk in 0..comptime!(plan.depth / FRAG) {
        #[unroll]
        for i in 0..2u32 {
            let a = (r0 + i * FRAG) * depth + kk * FRAG;
            cmma::load(&inputs, &xs.slice(a as usize, len), stride);
            #[unroll]
            for j in 0..2u32 {
                let b = (c0 + j * FRAG) * depth + kk * FRAG;
                cmma::load(&weights, &ws.slice(b as usize, len), stride);
                let acc = sums.index((2 * i + j) as usize);
                cmma::execute::<F, F, f32, f32>(&inputs, &weights, acc, acc);
                if gated {
                    cmma::load(&weights, &ups.slice(b as usize, len), stride);
                    let acc = sums.index((4 + 2 * i + j) as usize);
                    cmma::execute::<F, F, f32, f32>(&inputs, &weights, acc, acc);
                }
            }
        }
    }
}

/// Finishes the sums `s` (and `u`, gated) of the cube's input row `r` and
/// weight row `c` into `out`, if both lie within the product.
#[allow(clippy::too_many_arguments)]
#[cube]
fn finish_at(
    out: &mut Array<f32>,
    bias: &Array<f32>,
    at: At,
    r: u32,
    c: u32,
    s: f32,
    u: f32,
    #[comptime] rows: Rows,
    #[comptime] finish: Finish,
) {
    let (row, col) = (at.row0 + r, at.col0 + c);
    if row < at.m && col < at.n {
        let mut place = row * at.out_stride + at.out_offset + col;
        if comptime!(rows.im2col) {
            place = (at.out_offset + col) * at.out_stride + row;
        }
        finish_output::<f32>(out, place, s, u, bias, at.bias_offset + col, finish);
    }
}

/// The fast prefill product of `w` (and `up`) by `x` read as `form` says,
/// over `(m, n, k)`, finished into `out` at `(row stride, column offset,
/// bias offset)`, in one launch; `plan` is [`decoded_plan`]'s.
#[allow(clippy::too_many_arguments)]
pub(super) fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    plan: DecodedPlan,
    (x, (rows, width)): (&Tensor, (Rows, usize)),
    (w, up): (&Weight, &Weight),
    (bias, out): (&Tensor, &Tensor),
    (m, n, k): (usize, usize, usize),
    (stride, offset, bias_offset): (u32, u32, u32),
    finish: Finish,
) {
    let count = CubeCount::Static((n as u32).div_ceil(TILE), (m as u32).div_ceil(TILE), 1);
    macro_rules! launch {
        ($tile:ty) => {
            matmul_decoded::launch::<$tile, R>(
                client,
                count,
                CubeDim::new_1d(UNITS),
                x.arg(),
                w.words_arg(),
                up.words_arg(),
                bias.arg(),
                out.arg(),
                m as u32,
                n as u32,
                k as u32,
                w.row_bytes() as u32,
                up.row_bytes() as u32,
                stride,
                offset,
                bias_offset,
                width as u32,
                plan,
                w.ty,
                up.ty,
                rows,
                finish,
            )
        };
    }
    crate::profile::launch(client, "matmul_decoded", || match plan.matrix {
        true => launch!(half::f16),
        false => launch!(f32),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_fit_the_shared_memory_of_each_kind_of_device() {
        for k in [32, 96, 256, 4096, 14_336] {
            // 16-bit tiles and sm_80's limit on matrix units; f32 tiles and
            // a CPU adapter's limit elsewhere. Gated: three tiles.
            for (matrix, tile_bytes, limit) in [(true, 2, 163 << 10), (false, 4, 32 << 10)] {
                let plan = DecodedPlan::new(k, matrix);
                let bytes = 3 * plan.tile_len() * tile_bytes + plan.stage_len() * 4;
                assert!(bytes <= limit, "k {k}, matrix {matrix}: {bytes} bytes");
                // Steps of whole fragments, within every row's blocks; the
                // units stage whole runs and whole loop iterations.
                assert!(k.is_multiple_of(plan.depth as usize) && plan.depth.is_multiple_of(FRAG));
                assert!(plan.tile_len().is_multiple_of(RUN * UNITS));
                assert!(plan.tile_len().is_multiple_of(INPUTS_PER_ITERATION * UNITS));
            }
        }
    }

    #[test]
    fn the_exact_product_takes_what_the_decoded_one_does_not() {
        let q8 = (WeightType::Q8_0, WeightType::Q8_0);
        // The limit tests/weights.rs runs a product at, and a step past.
        assert_eq!(DecodedPlan::new(32, false).most_depth_on_units(), 99_328);
        assert!(decodes(q8, (2, 2, 99_328), true));
        assert!(!decodes(q8, (2, 2, 99_360), true));
        assert!(decodes(q8, (2, 2, 99_360), false));
        // 16-bit weights alone take cubek's product; f16 beside a block
        // type is decoded with it; bf16 is not.
        assert!(!decodes((WeightType::F16, WeightType::F16), (2, 2, 256), false));
        assert!(decodes((WeightType::F16, WeightType::Q4_K), (2, 2, 256), false));
        assert!(!decodes((WeightType::BF16, WeightType::Q4_K), (2, 2, 256), false));
        // The grid's 65,535 cubes a side.
        assert!(decodes(q8, (65_535 * 64, 2, 256), false));
        assert!(!decodes(q8, (65_535 * 64 + 1, 2, 256), false));
    }
}
