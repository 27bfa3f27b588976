//! Products over many rows (prefill): on the matrix units where the
//! precision is fast and the device has them, else by cubek or
//! `matmul_blocked` over f32 operands, typed weights widened in row chunks.

use std::ops::Range;

use cubecl::prelude::*;

use super::blocked::{self, Blocked, Rows};
use super::{cubek, finish_output, Finish};
use crate::choice::kernels_for;
use crate::decode::dequantize_rows;
use crate::grid::{grid_1d, linear_pos};
use crate::precision::{half_type, matrix_units, narrow, precision_for, rounded, Precision};
use crate::{KernelError, Kernels, Tensor, Weight, WeightType};

/// The most f32 bytes a typed weight is widened into at once for prefill:
/// a bounded temporary, well under every backend's binding limit.
const PREFILL_CHUNK_BYTES: usize = 32 << 20;

/// Values a row of a matrix-unit product's operands is a multiple of: 16
/// bytes of halves, the alignment the tensor-memory copies need.
pub(crate) const MATRIX_ALIGN: usize = 8;

/// The prefill product `x · wᵀ` (gated: with `up`) over `(m, n, k)`,
/// finished into `out` at `(row stride, column offset, bias offset)`.
pub(super) fn product<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Tensor,
    (w, up): (&Weight, &Weight),
    (bias, out): (&Tensor, &Tensor),
    (m, n, k): (usize, usize, usize),
    (stride, offset, bias_offset): (u32, u32, u32),
    finish: Finish,
) -> Result<(), KernelError> {
    // Fast products take 16-bit inputs: the weight's own type, f16 for the
    // block types (an f32 checkpoint has none and stays exact).
    let half = half_type(w.ty);
    let fast = precision_for(client) == Precision::Fast
        && w.ty != WeightType::F32
        && up.ty != WeightType::F32
        && half_type(up.ty) == half;
    if fast && matrix_units(client) && k.is_multiple_of(MATRIX_ALIGN) {
        let at = (stride, offset, bias_offset);
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
        let at = (stride, offset + first as u32, bias_offset + first as u32);
        f32_product(client, Blocked { x, w, up, bias, out }, (m, n, k), at, finish)
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
        let w_rows = round(w_rows);
        let up_rows = match finish.gated {
            true => round(up_rows),
            false => w_rows.clone(),
        };
        blocked(&w_rows, &up_rows, rows.len(), rows.start)
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
    let chunk_rows = chunk_rows(k, gated);
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

/// Rows of a weight of `k` columns (and of `up`, `gated`) widened to f32 at
/// once: as many as fit PREFILL_CHUNK_BYTES.
fn chunk_rows(k: usize, gated: bool) -> usize {
    let widened = if gated { 2 } else { 1 };
    (PREFILL_CHUNK_BYTES / (widened * k * size_of::<f32>()).max(1)).max(1)
}

/// How a prefill product is formed, as far as the buffers it takes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProductPath {
    /// f32 inputs: `exact`, and every f32 weight.
    Exact,
    /// 16-bit inputs on the matrix units: `fast` where the device has them.
    MatrixUnits,
    /// 16-bit inputs rounded, formed by the f32 kernels: `fast` elsewhere.
    Rounded,
}

impl ProductPath {
    /// The paths a device may take where `chosen` was asked for (`None`:
    /// each device its default, fast on matrix units or else exact).
    pub fn possible(chosen: Option<Precision>) -> &'static [ProductPath] {
        match chosen {
            Some(Precision::Exact) => &[ProductPath::Exact],
            Some(Precision::Fast) => &[ProductPath::MatrixUnits, ProductPath::Rounded],
            None => &[ProductPath::Exact, ProductPath::MatrixUnits],
        }
    }

    /// Device bytes a prefill product over `(m, n, k)` of a `ty` weight
    /// (`gated`: and an up weight of its shape and type) takes at most on
    /// this path beyond its input and output: the input rounded or packed
    /// to 16 bits, the weight's row chunks widened to f32 (and rounded, or
    /// packed, for the matrix units), and the sums formed apart from the
    /// output where a kernel other than `matmul_blocked` forms them. What
    /// [`product`] asks for, chunk by chunk: the planner counts it.
    pub fn scratch_bytes(self, ty: WeightType, (m, n, k): (usize, usize, usize), gated: bool) -> u64 {
        let widened = if gated { 2 } else { 1 };
        // Saturating: the sizes come from a model's config.
        let bytes = |dims: &[usize], size: usize| {
            dims.iter()
                .fold(size as u64, |total, &d| total.saturating_mul(d as u64))
        };
        let f32s = |dims: &[usize]| bytes(dims, size_of::<f32>());
        let total = |parts: &[u64]| parts.iter().fold(0, |sum: u64, &p| sum.saturating_add(p));
        // The path `product` takes for this weight.
        let fast = self != ProductPath::Exact && ty != WeightType::F32;
        let path = match self {
            ProductPath::MatrixUnits if fast && k.is_multiple_of(MATRIX_ALIGN) => ProductPath::MatrixUnits,
            _ if fast => ProductPath::Rounded,
            _ => ProductPath::Exact,
        };
        if path == ProductPath::MatrixUnits && half_type(ty) == ty {
            // The stored halves are read as they are; the input is packed.
            return total(&[bytes(&[m, k], 2), f32s(&[widened, m, n])]);
        }
        let rows = match ty {
            WeightType::F32 => n,
            _ => chunk_rows(k, gated).min(n),
        };
        // A chunk's rows widened, and the ids of the rows gathered.
        let (widened_rows, ids) = match ty {
            WeightType::F32 => (0, 0),
            _ => (f32s(&[widened, rows, k]), f32s(&[widened, rows])),
        };
        let sums = f32s(&[widened, m, rows]);
        let block_type = ty.block_len() > 1;
        match path {
            ProductPath::Exact => total(&[widened_rows, ids, sums]),
            // A block type's widened rows are rounded into a copy, one
            // weight at a time (the rows it came from are let go).
            ProductPath::Rounded => {
                let copy = if block_type { f32s(&[rows, k]) } else { 0 };
                total(&[f32s(&[m, k]), widened_rows, copy, ids, sums])
            }
            // The widened rows are packed into halves.
            ProductPath::MatrixUnits => total(&[bytes(&[m, k], 2), widened_rows, widened_rows / 2, ids, sums]),
        }
    }
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
            return cubek::half_product(client, (&x16, w16, half), (m, n, k), out);
        }
        let s = Tensor::empty(client, &[m, n]);
        cubek::half_product(client, (&x16, w16, half), (m, n, k), &s)?;
        let u = match finish.gated {
            true => {
                let u = Tensor::empty(client, &[m, n]);
                cubek::half_product(client, (&x16, up16, half), (m, n, k), &u)?;
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

/// The prefill product of f32 operands over `(m, n, k)`, finished into
/// `out` at `(row stride, column offset, bias offset)`: by cubek's matmul
/// and [`finish_products`] where the device runs [`Kernels::Unit`] (2.5 to
/// 4 times `matmul_blocked` on lavapipe, with the same bits), else by
/// `matmul_blocked` alone.
fn f32_product<R: Runtime>(
    client: &ComputeClient<R>,
    t: Blocked,
    (m, n, k): (usize, usize, usize),
    at: (u32, u32, u32),
    finish: Finish,
) -> Result<(), KernelError> {
    if kernels_for(client) == Kernels::Tiled {
        blocked::launch(client, t, (m, n, k), at, (Rows::DENSE, 1), finish);
        return Ok(());
    }
    let plain = !finish.gated && !finish.accumulate && !finish.bias;
    if plain && at.1 == 0 && t.out.cols() == n {
        return cubek::product(client, t.x, t.w, t.out);
    }
    let s = Tensor::empty(client, &[m, n]);
    cubek::product(client, t.x, t.w, &s)?;
    let u = if finish.gated {
        let u = Tensor::empty(client, &[m, n]);
        cubek::product(client, t.x, t.up, &u)?;
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
