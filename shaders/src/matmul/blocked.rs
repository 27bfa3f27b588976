//! The prefill product on devices with matrix units until they take the
//! cubek form, and the convolution's implicit GEMM everywhere: each unit
//! accumulates a block of outputs in registers while walking k.

use cubecl::prelude::*;

use super::{finish_output, Finish};
use crate::Tensor;

/// Each unit of the prefill kernel computes a BLOCK×BLOCK block of outputs.
const BLOCK: u32 = 4;

/// Units per cube along each axis of the prefill kernel.
const UNITS: u32 = 8;

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
    pub(super) const DENSE: Rows = Rows {
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
pub(super) fn x_at<F: Float>(
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

/// The prefill kernel's tensors: `up` and `bias` are bound to tensors it
/// has where it does not read them.
pub(super) struct Blocked<'a> {
    pub(super) x: &'a Tensor,
    pub(super) w: &'a Tensor,
    pub(super) up: &'a Tensor,
    pub(super) bias: &'a Tensor,
    pub(super) out: &'a Tensor,
}

/// One launch of the prefill kernel over `(m, n, k)`, writing at `(row
/// stride, column offset, bias offset)`, its rows read as `rows` says
/// (`width`: the map's, for im2col).
pub(super) fn launch<R: Runtime>(
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
