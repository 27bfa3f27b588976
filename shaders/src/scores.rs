//! Attention through its scores, as llama.cpp's CUDA backend computes it
//! without flash attention: per head, the scores `q·kᵀ` and the output
//! `p·v` are prefill products, with 16-bit inputs and f32 sums (on the
//! matrix units where the device has them, the same rounded products by
//! the other kernels elsewhere), and a softmax pass in f32 between them
//! masks each row to its keys, scales, caps and normalises it. The scores
//! go through device memory, a chunk of rows at a time; `attention`'s
//! flash kernel keeps them on chip, but multiplies on the ordinary cores.
//! Prefill passes take this path at `--precision fast` (see [`crate::attention`]).

use cubecl::prelude::*;

use crate::attention::{kv_at, KeysValues, MASKED};
use crate::grid::{grid_1d, linear_pos};
use crate::matmul::MATRIX_ALIGN;
use crate::precision::narrow;
use crate::reduce::{reduce_max, reduce_sum};
use crate::{matmul_weight, matmul_weight_into, AttentionShape, Epilogue, KernelError, KeyRanges, Tensor};
use crate::{Weight, WeightType};

/// The most bytes of scores one product writes: rows are taken in chunks
/// that keep within it.
pub const SCORES_BYTES: usize = 64 << 20;

/// Units a cube of the softmax pass spends on one row.
const SOFTMAX_UNITS: u32 = 256;

/// One unit per value of a `[rows, cols]` block: copies it from `src` (f32
/// values, or f16 ones two to a word where `half`), rows `row0..` and
/// columns `col0..` of rows `src_stride` wide, into `dst` at `(dst_row0,
/// dst_col0)` of rows `dst_stride` wide, transposed where `transpose`.
/// Source rows from `src_end` on read as zeros.
#[cube(launch)]
fn copy_block(
    src: &Array<f32>,
    src_words: &Array<u32>,
    dst: &mut Array<f32>,
    src_stride: u32,
    row0: u32,
    col0: u32,
    src_end: u32,
    dst_stride: u32,
    dst_row0: u32,
    dst_col0: u32,
    rows: u32,
    cols: u32,
    #[comptime] half: bool,
    #[comptime] transpose: bool,
) {
    let i = linear_pos() as u32;
    if i < rows * cols {
        let r = i / cols;
        let c = i % cols;
        let mut value = 0.0f32;
        if row0 + r < src_end {
            value = kv_at::<f32>(src, src_words, (row0 + r) * src_stride + col0 + c, half);
        }
        if transpose {
            dst[((dst_row0 + c) * dst_stride + dst_col0 + r) as usize] = value;
        } else {
            dst[((dst_row0 + r) * dst_stride + dst_col0 + c) as usize] = value;
        }
    }
}

/// One cube per row of `scores: [rows, keys]` (row `row0 + r` of the pass,
/// whose keys are `first..first + keys`): each score of a key in the row's
/// range scaled (and capped, `capped`: `cap · tanh(s / cap)`), then the
/// softmax over them; keys outside the range get 0.
#[cube(launch)]
fn softmax_scores(
    scores: &mut Array<f32>,
    bounds: &Array<u32>,
    row0: u32,
    first: u32,
    keys: u32,
    scale: f32,
    cap: f32,
    #[comptime] capped: bool,
) {
    let r = CUBE_POS_X;
    let base = r * keys;
    let start = bounds[(2 * (row0 + r)) as usize];
    let end = bounds[(2 * (row0 + r) + 1) as usize];
    let mut partial = SharedMemory::<f32>::new(SOFTMAX_UNITS as usize);
    // The scaled (and capped) scores in place, and their largest.
    let mut most = f32::new(MASKED);
    let mut j = UNIT_POS_X;
    while j < keys {
        let key = first + j;
        let mut s = f32::new(MASKED);
        if key >= start && key < end {
            s = scores[(base + j) as usize] * scale;
            if capped {
                s = f32::tanh(s / cap) * cap;
            }
        }
        scores[(base + j) as usize] = s;
        most = f32::max(most, s);
        j += SOFTMAX_UNITS;
    }
    partial[UNIT_POS_X as usize] = most;
    sync_cube();
    reduce_max::<f32>(&mut partial, 0);
    let most = partial[0];
    sync_cube();
    let mut sum = 0.0f32;
    let mut j = UNIT_POS_X;
    while j < keys {
        let key = first + j;
        if key >= start && key < end {
            sum += f32::exp(scores[(base + j) as usize] - most);
        }
        j += SOFTMAX_UNITS;
    }
    partial[UNIT_POS_X as usize] = sum;
    sync_cube();
    reduce_sum::<f32>(&mut partial, 0);
    let sum = partial[0];
    let mut j = UNIT_POS_X;
    while j < keys {
        let key = first + j;
        let mut p = 0.0f32;
        if key >= start && key < end {
            p = f32::exp(scores[(base + j) as usize] - most) / sum;
        }
        scores[(base + j) as usize] = p;
        j += SOFTMAX_UNITS;
    }
}

/// A block of `src` (`[.., stride]` values, f32 or f16 words) copied as
/// [`copy_block`] says into a new `[rows, cols]` tensor (`[cols, rows]`,
/// `transpose`).
#[allow(clippy::too_many_arguments)]
fn take_block<R: Runtime>(
    client: &ComputeClient<R>,
    src: KeysValues,
    (row0, col0, src_end): (usize, usize, usize),
    (rows, cols): (usize, usize),
    transpose: bool,
    other: &Tensor,
) -> Tensor {
    let shape = if transpose { [cols, rows] } else { [rows, cols] };
    let out = Tensor::empty(client, &shape);
    let stride = shape[1];
    put_block(
        client,
        src,
        (row0, col0, src_end),
        (&out, stride, 0, 0),
        (rows, cols),
        transpose,
        other,
    );
    out
}

/// [`copy_block`] of `(rows, cols)` values from `src` into `dst` at
/// `(dst_row0, dst_col0)` of rows `dst_stride` wide.
#[allow(clippy::too_many_arguments)]
fn put_block<R: Runtime>(
    client: &ComputeClient<R>,
    src: KeysValues,
    (row0, col0, src_end): (usize, usize, usize),
    (dst, dst_stride, dst_row0, dst_col0): (&Tensor, usize, usize, usize),
    (rows, cols): (usize, usize),
    transpose: bool,
    other: &Tensor,
) {
    let (values, words) = src.args(other);
    let (count, dim) = grid_1d(rows * cols);
    crate::profile::launch(client, "copy_block", || {
        copy_block::launch::<R>(
            client,
            count,
            dim,
            values,
            words,
            dst.arg(),
            src.cols() as u32,
            row0 as u32,
            col0 as u32,
            src_end as u32,
            dst_stride as u32,
            dst_row0 as u32,
            dst_col0 as u32,
            rows as u32,
            cols as u32,
            src.half(),
            transpose,
        )
    });
}

/// Attention of `q: [rows, heads · head_dim]` over `k`, `v`, row `s`
/// seeing keys `ranges[s]`, through its scores rounded to `half` (F16 or
/// BF16), into `out` (`q`'s shape). The caller has checked the shapes.
pub(crate) fn attend_by_scores<R: Runtime>(
    client: &ComputeClient<R>,
    q: &Tensor,
    (k, v): (KeysValues, KeysValues),
    shape: AttentionShape,
    ranges: &KeyRanges,
    (half, out): (WeightType, &Tensor),
) -> Result<(), KernelError> {
    let AttentionShape {
        heads,
        kv_heads,
        head_dim: d,
        scale,
        softcap,
        ..
    } = shape;
    let rows = q.rows();
    // Every row's keys lie in `first..end`; the products take them padded
    // to whole rows of the matrix units' operands, the padding zeros.
    let (first, end) = (ranges.start(), ranges.end());
    let keys = (end - first).next_multiple_of(MATRIX_ALIGN);
    let chunk = (SCORES_BYTES / (keys * size_of::<f32>())).clamp(1, rows);
    let group = heads / kv_heads;
    let q_values = KeysValues::F32(q);
    for kv_head in 0..kv_heads {
        // This head's keys `[keys, d]` and values transposed `[d, keys]`,
        // in 16 bits: the weights of the two products.
        let as_weight =
            |t: Tensor, rows: usize, cols: usize| Weight::halves(narrow(client, &t, half), rows, cols, half);
        let k_rows = take_block(client, k, (first, kv_head * d, end), (keys, d), false, q);
        let k_head = as_weight(k_rows, keys, d);
        let v_cols = take_block(client, v, (first, kv_head * d, end), (keys, d), true, q);
        let v_head = as_weight(v_cols, d, keys);
        for head in kv_head * group..(kv_head + 1) * group {
            for row0 in (0..rows).step_by(chunk) {
                let n = chunk.min(rows - row0);
                let q_head = take_block(client, q_values, (row0, head * d, rows), (n, d), false, q);
                let scores = matmul_weight(client, &q_head, &k_head)?;
                crate::profile::launch(client, "softmax_scores", || {
                    softmax_scores::launch::<R>(
                        client,
                        CubeCount::Static(n as u32, 1, 1),
                        CubeDim::new_1d(SOFTMAX_UNITS),
                        scores.arg(),
                        ranges.arg(),
                        row0 as u32,
                        first as u32,
                        keys as u32,
                        scale,
                        softcap.unwrap_or(1.0),
                        softcap.is_some(),
                    )
                });
                if n == rows {
                    matmul_weight_into(client, &scores, &v_head, out, head * d, Epilogue::default())?;
                } else {
                    let head_out = matmul_weight(client, &scores, &v_head)?;
                    let at = (out, out.cols(), row0, head * d);
                    put_block(client, KeysValues::F32(&head_out), (0, 0, n), at, (n, d), false, q);
                }
            }
        }
    }
    Ok(())
}

/// Device bytes [`attend_by_scores`] takes beyond its inputs and output for
/// `rows` query rows over `keys` keys of heads of `head_dim`: a head's keys
/// and values widened and in 16 bits, a chunk's query rows, scores and
/// output. What the planner counts for attention at `--precision fast`.
pub fn scores_bytes(rows: usize, keys: usize, head_dim: usize) -> u64 {
    let keys = keys.next_multiple_of(MATRIX_ALIGN) as u64;
    let (rows, d) = (rows as u64, head_dim as u64);
    let chunk = ((SCORES_BYTES as u64) / (keys * 4).max(1)).clamp(1, rows.max(1));
    let bytes = |parts: &[u64]| parts.iter().fold(1u64, |product, &p| product.saturating_mul(p));
    [
        // k and v, widened then in halves, and a product's own widened
        // copy of one (with the ids of its rows).
        bytes(&[2, keys, d, 4 + 2]),
        bytes(&[keys, d + 1, 4]),
        // A chunk's query rows and output, and the sums formed apart.
        bytes(&[3, chunk, d, 4]),
        // Its scores, and their rounded and 16-bit copies.
        bytes(&[chunk, keys, 4 + 4 + 2]),
    ]
    .into_iter()
    .fold(0, u64::saturating_add)
}
