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
//!
//! One file per kernel: `lanes` (the decode product on GPUs), `units` (its
//! unit form on CPU adapters), `blocked` (the prefill product and the
//! convolution's implicit GEMM), `cubek` (cubek's products, on f32 and on
//! matrix units), `cublas` (cuBLAS's, on CUDA's matrix units), `decoded` (the fast product of block-type weights,
//! decoded tile by tile in shared memory); `prefill` chooses among the
//! prefill products.

mod blocked;
mod cubek;
#[cfg(feature = "cuda")]
mod cublas;
mod decoded;
mod lanes;
mod prefill;
mod units;

pub use prefill::{library_bytes, matrix_unit_library, ProductPath};

use cubecl::prelude::*;

use crate::activation::{gated_product, Activation};
use crate::choice::kernels_for;
use crate::error::check_shape;
use crate::norm::rms_norm;
use crate::{KernelError, Kernels, Tensor, Weight};

/// Rows one cube of the decode kernel computes, sharing each weight read.
const GEMV_ROWS: usize = 4;

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
        out[at as usize] = gated_product::<F>(v, u, finish.activation);
    } else if comptime!(finish.accumulate) {
        out[at as usize] += v;
    } else {
        out[at as usize] = v;
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
/// prefill product (`prefill::product`).
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
    let units = kernels_for(client) == Kernels::Unit && k % units::VECTOR == 0;
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
    let at = (stride, offset, bias_offset as u32);
    if decode {
        let rows = m.min(GEMV_ROWS);
        if units && units::launch(client, x, (w, up), (bias, out), (m, n, k), rows, at, finish) {
            return Ok(());
        }
        lanes::launch(client, x, (w, up), norm, (bias, out), (m, n, k), rows, at, finish);
        return Ok(());
    }
    let form = (blocked::Rows::DENSE, 1);
    prefill::product(client, (x, form), (w, up), (bias, out), (m, n, k), at, finish)
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

/// A stride-1 convolution with zero padding `window / 2`: `x: [channels,
/// height, width]`, `weight: [out, channels · window²]` (PyTorch's `[out,
/// channels, window, window]` seen as rows), `bias: [out]`, into `out:
/// [out, height, width]`. It is a prefill product whose rows are the
/// pixels' windows (an implicit GEMM, or on the matrix units at `fast`
/// where the device has them). The caller checks the shapes.
pub(crate) fn conv2d_into<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Tensor,
    weight: &Weight,
    bias: &Tensor,
    out: &Tensor,
    window: usize,
) -> Result<(), KernelError> {
    let (height, width) = (x.shape[1], x.shape[2]);
    let (n, k) = (weight.rows, weight.cols);
    let pixels = height * width;
    if pixels == 0 || n == 0 {
        return Ok(());
    }
    let rows = blocked::Rows {
        im2col: true,
        window: window as u32,
    };
    let finish = Epilogue::default().with_bias(Some(bias), 0).finish();
    // The output is `[n, pixels]`: a row of it is `pixels` long.
    let at = (pixels as u32, 0, 0);
    let weights = (weight, weight);
    prefill::product(
        client,
        (x, (rows, width)),
        weights,
        (bias, out),
        (pixels, n, k),
        at,
        finish,
    )
}
