//! Image ops on one `[channels, height, width]` map (NCHW without the
//! batch): convolution, nearest upsampling and the transpose that turns a
//! `[C, H·W]` map into `[H·W, C]` rows for attention. (GroupNorm is with the
//! other norms.)

use cubecl::prelude::*;

use crate::error::check_shape;
use crate::grid::{grid_1d, linear_pos};
use crate::matmul::conv2d_into;
use crate::{KernelError, Tensor, Weight};

#[cube(launch)]
fn upsample_nearest2x_kernel<F: Float>(x: &Array<F>, out: &mut Array<F>, height: u32, width: u32, len: u32) {
    let i = linear_pos();
    if i < len as usize {
        let pos = i as u32;
        let wide = 2 * width;
        let tall = 2 * height;
        let c = pos / (tall * wide);
        let y = (pos / wide) % tall;
        let col = pos % wide;
        out[i] = x[((c * height + y / 2) * width + col / 2) as usize];
    }
}

#[cube(launch)]
fn transpose_kernel<F: Float>(x: &Array<F>, out: &mut Array<F>, rows: u32, cols: u32) {
    let i = linear_pos();
    if i < (rows * cols) as usize {
        let pos = i as u32;
        // out[c, r] = x[r, c]
        let c = pos / rows;
        let r = pos % rows;
        out[i] = x[(r * cols + c) as usize];
    }
}

/// A 2-D convolution of `x: [in, h, w]` by `weight` (PyTorch's `[out, in,
/// k, k]` seen as `[out, in · k²]` rows, in its stored type; k = `window`,
/// odd), stride 1, zero padding `k / 2`, plus `bias: [out]`: PyTorch's
/// `nn.Conv2d(in, out, k, padding=k // 2)` on a batch of one. Returns
/// `[out, h, w]`.
///
/// It runs as an implicit GEMM on the prefill product, whose rows are the
/// pixels' `k × k` windows gathered as they are read (measured against
/// the direct loop it replaced, one unit per output, each weight read once
/// per pixel: see docs/BENCHMARKS.md), and at `fast` precision on the
/// matrix units, the windows gathered into 16 bits a chunk of pixels at a
/// time.
pub fn conv2d<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Tensor,
    weight: &Weight,
    window: usize,
    bias: &Tensor,
) -> Result<Tensor, KernelError> {
    check_shape(x.shape.len() == 3, "conv2d", "x", &x.shape, || "[in, h, w]".into())?;
    let (channels, height, width) = (x.shape[0], x.shape[1], x.shape[2]);
    let out_channels = weight.rows;
    check_shape(
        window % 2 == 1 && Some(weight.cols) == window.checked_mul(window).and_then(|taps| channels.checked_mul(taps)),
        "conv2d",
        "weight",
        &[weight.rows, weight.cols],
        || format!("[out, {channels} · k²] with k = {window} odd"),
    )?;
    check_shape(bias.shape == [out_channels], "conv2d", "bias", &bias.shape, || {
        format!("[{out_channels}]")
    })?;
    let out = Tensor::empty(client, &[out_channels, height, width]);
    conv2d_into(client, x, weight, bias, &out, window)?;
    Ok(out)
}

/// `[c, h, w]` → `[c, 2h, 2w]`, each pixel repeated 2×2 (PyTorch's
/// `F.interpolate(x, scale_factor=2.0, mode="nearest")`).
pub fn upsample_nearest2x<R: Runtime>(client: &ComputeClient<R>, x: &Tensor) -> Result<Tensor, KernelError> {
    check_shape(x.shape.len() == 3, "upsample_nearest2x", "x", &x.shape, || {
        "[c, h, w]".into()
    })?;
    let (c, h, w) = (x.shape[0], x.shape[1], x.shape[2]);
    let out = Tensor::empty(client, &[c, 2 * h, 2 * w]);
    let (count, dim) = grid_1d(out.len());
    crate::profile::launch(client, "upsample_nearest2x", || {
        upsample_nearest2x_kernel::launch::<f32, R>(
            client,
            count,
            dim,
            x.arg(),
            out.arg(),
            h as u32,
            w as u32,
            out.len() as u32,
        );
    });
    Ok(out)
}

/// `[rows, cols]` → `[cols, rows]`.
pub fn transpose<R: Runtime>(client: &ComputeClient<R>, x: &Tensor) -> Result<Tensor, KernelError> {
    check_shape(x.shape.len() == 2, "transpose", "x", &x.shape, || "[rows, cols]".into())?;
    let (rows, cols) = (x.shape[0], x.shape[1]);
    let out = Tensor::empty(client, &[cols, rows]);
    let (count, dim) = grid_1d(out.len());
    crate::profile::launch(client, "transpose", || {
        transpose_kernel::launch::<f32, R>(client, count, dim, x.arg(), out.arg(), rows as u32, cols as u32);
    });
    Ok(out)
}
