//! Rotary position embedding in two layouts: "rotate half" as in Hugging
//! Face Llama (dimension `i` of a head pairs with `i + rotary_dim / 2`, over
//! the first `rotary_dim` dimensions: all of them, or Phi-3's partial
//! rotary), with its cos/sin table computed here and applied by
//! [`crate::split_qkv`] as it splits a decoder's q/k/v, and interleaved
//! pairs `(x[2i], x[2i+1])` as in FLUX, whose tables the model computes.

use cubecl::prelude::*;

use crate::error::check_shape;
use crate::grid::{grid_1d, linear_pos};
use crate::{KernelError, Tensor};

/// cos and sin of `position · inv_freq[i]` for every position of the context,
/// computed once on the host in f32 like transformers does, so every backend
/// rotates by exactly the same angles.
#[derive(Clone, Debug)]
pub struct RopeTable {
    pub(crate) cos: Tensor,
    pub(crate) sin: Tensor,
    pub(crate) half: usize,
}

impl RopeTable {
    pub fn new<R: Runtime>(client: &ComputeClient<R>, inv_freq: &[f32], positions: usize) -> Self {
        Self::scaled(client, inv_freq, positions, 1.0)
    }

    /// A table whose cos and sin are multiplied by `scale` (LongRoPE's
    /// attention factor).
    pub fn scaled<R: Runtime>(client: &ComputeClient<R>, inv_freq: &[f32], positions: usize, scale: f32) -> Self {
        let (cos, sin) = rope_table(inv_freq, positions, scale);
        let shape = [positions, inv_freq.len()];
        RopeTable {
            cos: Tensor::from_f32(client, &cos, &shape),
            sin: Tensor::from_f32(client, &sin, &shape),
            half: inv_freq.len(),
        }
    }

    pub fn positions(&self) -> usize {
        self.cos.shape[0]
    }
}

/// `(cos, sin)` tables `[positions, inv_freq.len()]` of `pos · inv_freq[i]`,
/// each times `scale`.
///
/// The angle is an f32 product, as transformers computes it; cos and sin of
/// that f32 are then rounded from f64, which is within an ulp of torch's,
/// and scaled in f32 as transformers scales them.
pub fn rope_table(inv_freq: &[f32], positions: usize, scale: f32) -> (Vec<f32>, Vec<f32>) {
    let angles = (0..positions).flat_map(|p| inv_freq.iter().map(move |f| p as f32 * f));
    angles
        .map(|a| ((a as f64).cos() as f32 * scale, (a as f64).sin() as f32 * scale))
        .unzip()
}

#[cube(launch)]
fn rope_pairs_kernel<F: Float>(x: &mut Array<F>, cos: &Array<F>, sin: &Array<F>, heads: u32, half: u32, len: u32) {
    let idx = linear_pos();
    if idx < len as usize {
        let i = idx as u32 % half;
        let head_row = idx as u32 / half;
        let table = (head_row / heads) * half + i;
        let c = cos[table as usize];
        let s = sin[table as usize];
        let even = (head_row * half * 2 + i * 2) as usize;
        let real = x[even];
        let imag = x[even + 1];
        x[even] = real * c - imag * s;
        x[even + 1] = imag * c + real * s;
    }
}

/// Rotates `x: [rows, heads * head_dim]` in place by interleaved pairs:
/// `(x[2i], x[2i+1])` of each head turns by the angle whose `cos`, `sin`
/// are at `[row, i]` of the tables `[rows, head_dim / 2]` (diffusers'
/// `apply_rotary_emb` with `use_real_unbind_dim=-1`, FLUX's rope).
pub fn rope_pairs<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    heads: usize,
) -> Result<(), KernelError> {
    let rows = x.rows();
    let half = cos.cols();
    check_shape(x.cols() == heads * half * 2, "rope_pairs", "x", &x.shape, || {
        format!("[rows, {}]", heads * half * 2)
    })?;
    for (what, table) in [("cos", cos), ("sin", sin)] {
        check_shape(table.shape == [rows, half], "rope_pairs", what, &table.shape, || {
            format!("[{rows}, {half}]")
        })?;
    }
    let len = rows * heads * half;
    let (count, dim) = grid_1d(len);
    crate::profile::launch(client, "rope_pairs", || {
        rope_pairs_kernel::launch::<f32, R>(
            client,
            count,
            dim,
            x.arg(),
            cos.arg(),
            sin.arg(),
            heads as u32,
            half as u32,
            len as u32,
        );
    });
    Ok(())
}
