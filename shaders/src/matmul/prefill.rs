//! Products over many rows (prefill). At `fast`, a weight of a block type
//! is decoded tile by tile beside the products (`decoded`), on the matrix
//! units where the device has them; f16 and bf16 weights are read as
//! stored by cuBLAS (CUDA) or cubek's matrix-unit matmul there, and
//! elsewhere multiply the rounded input in the f32 kernels. At `exact`,
//! cubek or `matmul_blocked` form the products over f32 operands, typed
//! weights widened in row chunks. A convolution is such a product too,
//! its rows the pixels' windows ([`Rows`]).

use std::ops::Range;

use cubecl::prelude::*;

use super::blocked::{self, x_at, Blocked, Rows};
#[cfg(feature = "cuda")]
use super::cublas;
use super::decoded::{self, decoded_plan};
use super::{cubek, finish_output, Finish};
use crate::choice::kernels_for;
use crate::decode::dequantize_rows;
use crate::grid::{grid_1d, linear_pos};
use crate::precision::{half_type, matrix_units, narrow, pack_halves, precision_for, rounded, Precision};
use crate::{KernelError, Kernels, Tensor, Weight, WeightType};

/// The most f32 bytes a typed weight is widened into at once for prefill,
/// and the most bytes of a convolution's pixels' windows (or of their
/// sums) gathered at once for the matrix units: a bounded temporary, well
/// under every backend's binding limit.
const PREFILL_CHUNK_BYTES: usize = 32 << 20;

/// Values a row of a matrix-unit product's operands is a multiple of: 16
/// bytes of halves, the alignment the tensor-memory copies need.
pub(crate) const MATRIX_ALIGN: usize = 8;

/// The input of a prefill product: `x`, its rows read as [`Rows`] says
/// (with the map's width, for a convolution).
pub(super) type Input<'a> = (&'a Tensor, (Rows, usize));

/// The prefill product `x · wᵀ` (gated: with `up`) over `(m, n, k)`,
/// finished into `out` at `(row stride, column offset, bias offset)`.
pub(super) fn product<R: Runtime>(
    client: &ComputeClient<R>,
    (x, form): Input,
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
    let at = (stride, offset, bias_offset);
    // A block type is decoded tile by tile beside the products, on every
    // device; past the decoded product's limits it takes the exact path.
    if let Some(plan) = decoded_plan(client, (w, up), m).filter(|_| fast) {
        decoded::launch(client, plan, (x, form), (w, up), (bias, out), (m, n, k), at, finish);
        return Ok(());
    }
    let fast = fast && w.ty == half && up.ty == half;
    if fast && matrix_units(client) && k.is_multiple_of(MATRIX_ALIGN) {
        return prefill_on_matrix_units(client, (x, form), (w, up, half), (m, n, k), at, (bias, out), finish);
    }
    // Elsewhere the same rounded products, formed by the other kernels: the
    // stored halves widen to exactly their values.
    let rounded_x;
    let x = if fast {
        rounded_x = rounded(client, x, half);
        &rounded_x
    } else {
        x
    };
    let blocked = |w: &Tensor, up: &Tensor, n: usize, first: usize| {
        let at = (stride, offset + first as u32, bias_offset + first as u32);
        f32_product(client, (Blocked { x, w, up, bias, out }, form), (m, n, k), at, finish)
    };
    if let (Some(w), Some(up)) = (w.as_f32(), up.as_f32()) {
        return blocked(&w, &up, n, 0);
    }
    for_row_chunks(client, (w, up), finish.gated, |rows, w_rows, up_rows| {
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

/// Pixels of a convolution whose windows are gathered for the matrix
/// units at once: as many as keep both their windows, `k` halves each, and
/// their sums, `n` f32 each, within PREFILL_CHUNK_BYTES.
fn window_chunk_rows(n: usize, k: usize) -> usize {
    let widest = (k * 2).max(n * size_of::<f32>()).max(1);
    (PREFILL_CHUNK_BYTES / widest).max(1)
}

/// How a prefill product is formed, as far as the buffers it takes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProductPath {
    /// f32 inputs: `exact`, and every f32 weight.
    Exact,
    /// 16-bit inputs on the matrix units: `fast` where the device has them.
    MatrixUnits,
    /// 16-bit inputs rounded, their products formed by ordinary units:
    /// `fast` elsewhere (the f32 kernels over the rounded input for 16-bit
    /// weights, the decoded product for block types).
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
    /// to 16 bits, the weight's row chunks widened to f32, and the sums
    /// formed apart from the output where a kernel other than
    /// `matmul_blocked` forms them; nothing for a block type decoded beside
    /// its products. What [`product`] asks for, chunk by chunk: the planner
    /// counts it.
    pub fn scratch_bytes(self, ty: WeightType, (m, n, k): (usize, usize, usize), gated: bool) -> u64 {
        self.scratch(ty, (m, n, k), gated, Rows::DENSE)
    }

    /// The same for a convolution over `pixels` pixels by a `ty` weight of
    /// `n` rows of `k` (its `[n, channels, window, window]` seen as rows):
    /// the map rounded, or its pixels' windows packed a chunk at a time.
    pub fn conv_scratch_bytes(self, ty: WeightType, (pixels, n, k): (usize, usize, usize), window: usize) -> u64 {
        let rows = Rows {
            im2col: true,
            window: window as u32,
        };
        self.scratch(ty, (pixels, n, k), false, rows)
    }

    fn scratch(self, ty: WeightType, (m, n, k): (usize, usize, usize), gated: bool, rows: Rows) -> u64 {
        let widened = if gated { 2 } else { 1 };
        // Saturating: the sizes come from a model's config.
        let bytes = |dims: &[usize], size: usize| {
            dims.iter()
                .fold(size as u64, |total, &d| total.saturating_mul(d as u64))
        };
        let f32s = |dims: &[usize]| bytes(dims, size_of::<f32>());
        let total = |parts: &[u64]| parts.iter().fold(0, |sum: u64, &p| sum.saturating_add(p));
        // The path `product` takes for this weight. Without matrix units
        // the device is taken for a CPU adapter, whose loop budget may send
        // a block type to the exact path (never at a model's sizes).
        let fast = self != ProductPath::Exact && ty != WeightType::F32;
        let on_units = self == ProductPath::Rounded;
        if fast && decoded::decodes((ty, ty), (m, n, k), on_units) {
            return 0;
        }
        let fast = fast && half_type(ty) == ty;
        let path = match self {
            ProductPath::MatrixUnits if fast && k.is_multiple_of(MATRIX_ALIGN) => ProductPath::MatrixUnits,
            _ if fast => ProductPath::Rounded,
            _ => ProductPath::Exact,
        };
        if path == ProductPath::MatrixUnits {
            // The input's rows packed at once (a convolution's windows a
            // chunk of pixels at a time) and the sums formed apart; the
            // stored halves are read as they are.
            let packed_rows = match rows.im2col {
                true => window_chunk_rows(n, k).min(m),
                false => m,
            };
            return total(&[bytes(&[packed_rows, k], 2), f32s(&[widened, packed_rows, n])]);
        }
        let weight_rows = match ty {
            WeightType::F32 => n,
            _ => chunk_rows(k, gated).min(n),
        };
        // A chunk's rows widened.
        let widened_rows = match ty {
            WeightType::F32 => 0,
            _ => f32s(&[widened, weight_rows, k]),
        };
        // Sums formed apart from the output by cubek (dense products);
        // `matmul_blocked` finishes a convolution's itself.
        let sums = match rows.im2col {
            true => 0,
            false => f32s(&[widened, m, weight_rows]),
        };
        match path {
            ProductPath::Exact => total(&[widened_rows, sums]),
            // The input rounded: a convolution's map has k / window²
            // channels.
            _ => {
                let taps = (rows.window as usize).pow(2).max(1);
                total(&[f32s(&[m, k / taps]), widened_rows, sums])
            }
        }
    }
}

/// A prefill product of 16-bit weights on the matrix units: `x` rounded
/// to `half` (F16 or BF16, the weights' type) and packed (a convolution's
/// pixels' windows gathered so, a chunk of pixels at a time), the weights
/// read as stored, f32 accumulation by [`HalfProducts`], finished into
/// `out` at `(row stride, column offset, bias offset)` as the other kernels
/// finish theirs (cuBLAS stores and adds its sums in place itself).
fn prefill_on_matrix_units<R: Runtime>(
    client: &ComputeClient<R>,
    (x, form): Input,
    (w, up, half): (&Weight, &Weight, WeightType),
    (m, n, k): (usize, usize, usize),
    (stride, offset, bias_offset): (u32, u32, u32),
    (bias, out): (&Tensor, &Tensor),
    finish: Finish,
) -> Result<(), KernelError> {
    let channels_first = form.0.im2col;
    // A dense input is packed once; a convolution's windows a chunk of
    // pixels at a time.
    let whole = (!channels_first).then(|| narrow(client, x, half));
    let input_chunk = match channels_first {
        true => window_chunk_rows(n, k),
        false => m,
    };
    let former = HalfProducts::for_device(client);
    for first in (0..m).step_by(input_chunk.max(1)) {
        let rows = first..m.min(first + input_chunk);
        let x16 = match &whole {
            Some(x16) => x16.clone(),
            None => packed_windows(client, x, form, rows.clone(), (m, k), half),
        };
        let dims = (rows.len(), n, k);
        let finished_in_place = !finish.gated && !finish.bias && !channels_first;
        #[cfg(feature = "cuda")]
        if former == HalfProducts::Cublas && finished_in_place {
            // Stored or added where they belong in `out`'s rows (a dense
            // input is one chunk, from row 0).
            let sums = cublas::Sums {
                out,
                first: offset as usize,
                row_stride: stride as usize,
                accumulate: finish.accumulate,
            };
            cublas::half_product(client, (&x16, &w.handle, half), dims, sums)?;
            continue;
        }
        let transposed = former == HalfProducts::Cubek && cubek::transposes(rows.len(), n);
        // Sums that are the whole output are formed in it.
        let stored = finished_in_place && !finish.accumulate && !transposed;
        if stored && offset == 0 && out.cols() == n {
            former.form(client, (&x16, &w.handle, half), dims, out)?;
            continue;
        }
        // `[rows, n]`, or `[n, rows]` transposed: the same bytes.
        let s = Tensor::empty(client, &[rows.len(), n]);
        former.form(client, (&x16, &w.handle, half), dims, &s)?;
        let u = match finish.gated {
            true => {
                let u = Tensor::empty(client, &[rows.len(), n]);
                former.form(client, (&x16, &up.handle, half), dims, &u)?;
                u
            }
            false => s.clone(),
        };
        let at = (stride, offset, bias_offset);
        finish_sums(
            client,
            (&s, &u),
            (bias, out),
            (rows, n),
            at,
            (channels_first, transposed),
            finish,
        );
    }
    Ok(())
}

/// Which library forms a device's products of 16-bit inputs on its
/// matrix units.
#[derive(Clone, Copy, PartialEq, Eq)]
enum HalfProducts {
    /// cubek's matmul, on every device with matrix units.
    Cubek,
    /// cuBLAS, on CUDA devices where it is found: faster than cubek there
    /// (docs/BENCHMARKS.md).
    #[cfg(feature = "cuda")]
    Cublas,
}

/// The library that forms `client`'s products of 16-bit inputs on its
/// matrix units: `cuBLAS` or `cubek`.
pub fn matrix_unit_library<R: Runtime>(client: &ComputeClient<R>) -> &'static str {
    match HalfProducts::for_device(client) {
        HalfProducts::Cubek => "cubek",
        #[cfg(feature = "cuda")]
        HalfProducts::Cublas => "cuBLAS",
    }
}

/// Device bytes that the library forming the products of a device of
/// `runtime` ("cuda", "wgpu") keeps there outside cleave's buffers, which
/// a plan must leave free: cuBLAS's workspace on a CUDA device, unless
/// `exact` was asked for (a CUDA device without matrix units, which never
/// calls cuBLAS, is counted too: the plan is made before the device is
/// opened).
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
pub fn library_bytes(runtime: &str) -> u64 {
    #[cfg(feature = "cuda")]
    if runtime == "cuda" && crate::fast_possible() && cublas::chosen() {
        return cublas::WORKSPACE_BYTES;
    }
    0
}

impl HalfProducts {
    // Without CUDA there is only cubek, whatever the device.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    fn for_device<R: Runtime>(client: &ComputeClient<R>) -> HalfProducts {
        #[cfg(feature = "cuda")]
        if cublas::forms_products(client) {
            return HalfProducts::Cublas;
        }
        HalfProducts::Cubek
    }

    /// The sums `x · wᵀ` over `(m, n, k)` into `s: [m, n]` (`[n, m]` where
    /// cubek [`cubek::transposes`] the product).
    fn form<R: Runtime>(
        self,
        client: &ComputeClient<R>,
        operands: (&Tensor, &cubecl::server::Handle, WeightType),
        (m, n, k): (usize, usize, usize),
        s: &Tensor,
    ) -> Result<(), KernelError> {
        match self {
            HalfProducts::Cubek => cubek::half_product(client, operands, (m, n, k), s),
            #[cfg(feature = "cuda")]
            HalfProducts::Cublas => {
                let sums = cublas::Sums {
                    out: s,
                    first: 0,
                    row_stride: n,
                    accumulate: false,
                };
                cublas::half_product(client, operands, (m, n, k), sums)
            }
        }
    }
}

/// Rows `rows` of a convolution's input, each a pixel's window over the
/// `[channels, m / width, width]` map `x` (`form`), rounded to `half` and
/// packed two to a word: the matrix units' input for those pixels.
fn packed_windows<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Tensor,
    (rows_form, width): (Rows, usize),
    rows: Range<usize>,
    (m, k): (usize, usize),
    half: WeightType,
) -> Tensor {
    let pairs = rows.len() * k / 2;
    let words = Tensor::empty(client, &[pairs]);
    let (count, dim) = grid_1d(pairs);
    crate::profile::launch(client, "pack_windows", || {
        pack_windows::launch::<R>(
            client,
            count,
            dim,
            x.arg(),
            words.words_arg(),
            rows.start as u32,
            pairs as u32,
            m as u32,
            k as u32,
            width as u32,
            rows_form,
            half == WeightType::BF16,
        )
    });
    words
}

/// One unit per pair of values: rows from `first` on of `x` read as `rows`
/// says (`k` values each, even), rounded and packed as [`pack_halves`]
/// packs them.
#[cube(launch)]
fn pack_windows(
    x: &Array<f32>,
    words: &mut Array<u32>,
    first: u32,
    pairs: u32,
    m: u32,
    k: u32,
    width: u32,
    #[comptime] rows: Rows,
    #[comptime] bf16: bool,
) {
    let i = linear_pos();
    if i < pairs as usize {
        let pair = i as u32;
        let row = first + pair / (k / 2);
        let kk = 2 * (pair % (k / 2));
        let (y, col, height) = (row / width, row % width, m / width);
        let a = x_at::<f32>(x, row, kk, k, y, col, width, height, rows);
        let b = x_at::<f32>(x, row, kk + 1, k, y, col, width, height, rows);
        words[i] = pack_halves(a, b, bf16);
    }
}

/// The prefill product of f32 operands over `(m, n, k)`, finished into
/// `out` at `(row stride, column offset, bias offset)`: by cubek's matmul
/// and [`finish_products`] where the device runs [`Kernels::Unit`] (2.5 to
/// 4 times `matmul_blocked` on lavapipe, with the same bits), else by
/// `matmul_blocked` alone, which alone gathers a convolution's windows.
fn f32_product<R: Runtime>(
    client: &ComputeClient<R>,
    (t, form): (Blocked, (Rows, usize)),
    (m, n, k): (usize, usize, usize),
    at: (u32, u32, u32),
    finish: Finish,
) -> Result<(), KernelError> {
    if kernels_for(client) == Kernels::Tiled || form.0.im2col {
        blocked::launch(client, t, (m, n, k), at, form, finish);
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
    finish_sums(client, (&s, &u), (t.bias, t.out), (0..m, n), at, (false, false), finish);
    Ok(())
}

/// Finishes sums `s: [rows, n]` formed apart (and `u` over `up`, gated)
/// into those rows of `out` at `(row stride, column offset, bias offset)`,
/// as the kernels that form their own sums finish them; `channels_first`:
/// `out` is a convolution's `[columns, stride]`, a pixel to a column;
/// `transposed`: the sums are `[n, rows]`.
fn finish_sums<R: Runtime>(
    client: &ComputeClient<R>,
    (s, u): (&Tensor, &Tensor),
    (bias, out): (&Tensor, &Tensor),
    (rows, n): (Range<usize>, usize),
    (stride, offset, bias_offset): (u32, u32, u32),
    (channels_first, transposed): (bool, bool),
    finish: Finish,
) {
    let (count, dim) = grid_1d(rows.len() * n);
    crate::profile::launch(client, "finish_products", || {
        finish_products::launch::<f32, R>(
            client,
            count,
            dim,
            s.arg(),
            u.arg(),
            bias.arg(),
            out.arg(),
            rows.start as u32,
            rows.len() as u32,
            n as u32,
            stride,
            offset,
            bias_offset,
            channels_first,
            transposed,
            finish,
        );
    });
}

/// One unit per output: finishes sums `s: [m, n]` (`[n, m]`, `transposed`)
/// formed apart (and `u`, the matching sums over `up`, gated only) into
/// rows `first..first + m` of `out` as [`matmul_blocked`] finishes its
/// own, so both give the same bits.
#[cube(launch)]
fn finish_products<F: Float>(
    s: &Array<F>,
    u: &Array<F>,
    bias: &Array<F>,
    out: &mut Array<F>,
    first: u32,
    m: u32,
    n: u32,
    out_stride: u32,
    out_offset: u32,
    bias_offset: u32,
    #[comptime] channels_first: bool,
    #[comptime] transposed: bool,
    #[comptime] finish: Finish,
) {
    let i = linear_pos() as u32;
    if i < m * n {
        let (local, col) = (i / n, i % n);
        let row = first + local;
        let mut at = row * out_stride + out_offset + col;
        if comptime!(channels_first) {
            at = (out_offset + col) * out_stride + row;
        }
        let mut sum = i;
        if comptime!(transposed) {
            sum = col * m + local;
        }
        let sum = sum as usize;
        finish_output::<F>(out, at, s[sum], u[sum], bias, bias_offset + col, finish);
    }
}
