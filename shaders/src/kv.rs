//! The KV cache in its own type: f32, or f16 (llama.cpp's default cache
//! type, half the memory). A cache is a [`Weight`] of `[positions, kv
//! width]` rows; new rows are scattered into it converted to its type, and
//! attention reads them back as f32. An f16 cache holds two halves per u32
//! word, so no backend needs 16-bit storage.

use cubecl::prelude::*;

use crate::error::check_shape;
use crate::grid::{grid_1d, linear_pos};
use crate::{scatter_rows, KernelError, RowIndex, Tensor, Weight, WeightType};

/// The f16 bits nearest to `x` (round to nearest, ties to even), as
/// numpy's `astype(float16)` rounds: overflow to infinity, NaN kept,
/// subnormals exact.
#[cube]
pub(crate) fn f32_to_f16_bits<F: Float>(x: F) -> u32 {
    let bits = u32::reinterpret(x);
    let sign = (bits >> 16) & 0x8000;
    let exponent = (bits >> 23) & 0xff;
    let mantissa = bits & 0x7f_ffff;
    let mut half = sign | 0x7c00;
    if exponent == 0xff {
        // Infinity stays infinity; NaN stays a (quiet) NaN.
        if mantissa != 0 {
            half = sign | 0x7e00;
        }
    } else if exponent > 142 {
        // Past f16's largest exponent (15 + 127): infinity.
        half = sign | 0x7c00;
    } else if exponent >= 113 {
        // A normal f16: rebias, keep 10 mantissa bits, round the other 13.
        let kept = ((exponent - 112) << 10) | (mantissa >> 13);
        let rest = mantissa & 0x1fff;
        let mut up = 0u32;
        if rest > 0x1000 || (rest == 0x1000 && (kept & 1) == 1) {
            up = 1;
        }
        // A carry out of the mantissa raises the exponent, as it should.
        half = sign | (kept + up);
    } else if exponent >= 102 {
        // A subnormal f16: the implicit bit joins the mantissa, shifted.
        let full = mantissa | 0x80_0000;
        let shift = 126 - exponent;
        let kept = full >> shift;
        let rest = full & ((1u32 << shift) - 1);
        let halfway = 1u32 << (shift - 1);
        let mut up = 0u32;
        if rest > halfway || (rest == halfway && (kept & 1) == 1) {
            up = 1;
        }
        half = sign | (kept + up);
    } else {
        // Below half the smallest subnormal: a signed zero.
        half = sign;
    }
    half
}

/// Writes row `i` of `src` (two values per thread: one u32 word) into row
/// `rows[i]` of the f16 cache `dst`.
#[cube(launch)]
fn scatter_rows_f16_kernel<F: Float>(src: &Array<F>, dst: &mut Array<u32>, rows: &Array<u32>, cols: u32, words: u32) {
    let w = linear_pos();
    if w < words as usize {
        let per_row = cols / 2;
        let row = w as u32 / per_row;
        let pair = w as u32 % per_row;
        let at = (row * cols + 2 * pair) as usize;
        let low = f32_to_f16_bits::<F>(src[at]);
        let high = f32_to_f16_bits::<F>(src[at + 1]);
        let to = rows[row as usize];
        dst[(to * per_row + pair) as usize] = low | (high << 16);
    }
}

/// An empty cache of `rows` positions of `cols` values in `ty` (F32 or
/// F16; `cols` even for F16).
pub fn kv_cache<R: Runtime>(
    client: &ComputeClient<R>,
    ty: WeightType,
    rows: usize,
    cols: usize,
) -> Result<Weight, KernelError> {
    check_kv_type(ty, cols)?;
    match ty {
        WeightType::F32 => Ok(Weight::from_tensor(Tensor::empty(client, &[rows, cols]))),
        _ => Weight::empty(client, ty, rows, cols),
    }
}

fn check_kv_type(ty: WeightType, cols: usize) -> Result<(), KernelError> {
    let ok = match ty {
        WeightType::F32 => true,
        WeightType::F16 => cols.is_multiple_of(2),
        _ => false,
    };
    check_shape(ok, "kv cache", ty.name(), &[cols], || {
        "f32, or f16 rows of an even width".into()
    })
}

/// Writes the rows of `src: [n, cols]` into rows `rows` of the cache `dst`
/// (`[positions, cols]`, f32 or f16), converting them to its type.
pub fn scatter_rows_into<R: Runtime>(
    client: &ComputeClient<R>,
    src: &Tensor,
    dst: &Weight,
    rows: &RowIndex,
) -> Result<(), KernelError> {
    check_kv_type(dst.ty, dst.cols)?;
    if let Some(dst) = dst.as_f32() {
        return scatter_rows(client, src, &dst, rows);
    }
    let cols = src.cols();
    check_shape(rows.len() == src.rows(), "scatter_rows", "rows", &[rows.len()], || {
        format!("one per source row ({})", src.rows())
    })?;
    check_shape(
        dst.cols == cols && (rows.max() as usize) < dst.rows,
        "scatter_rows",
        "dst",
        &[dst.rows, dst.cols],
        || format!("[> {}, {cols}]", rows.max()),
    )?;
    let words = src.len() / 2;
    let (count, dim) = grid_1d(words);
    scatter_rows_f16_kernel::launch::<f32, R>(
        client,
        count,
        dim,
        src.arg(),
        dst.words_arg(),
        rows.arg(),
        cols as u32,
        words as u32,
    );
    Ok(())
}
