//! Rotary position embedding, "rotate half" layout as in Hugging Face Llama:
//! dimension `i` of a head pairs with `i + head_dim / 2`.

use cubecl::prelude::*;

use crate::error::check_shape;
use crate::grid::{grid_1d, linear_pos};
use crate::{KernelError, RowIndex, Tensor};

/// cos and sin of `position · inv_freq[i]` for every position of the context,
/// computed once on the host in f32 like transformers does, so every backend
/// rotates by exactly the same angles.
#[derive(Clone, Debug)]
pub struct RopeTable {
    cos: Tensor,
    sin: Tensor,
    half: usize,
}

impl RopeTable {
    pub fn new<R: Runtime>(client: &ComputeClient<R>, inv_freq: &[f32], positions: usize) -> Self {
        let (cos, sin) = crate::reference::rope_table(inv_freq, positions);
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

#[cube(launch)]
fn rope_kernel<F: Float>(
    x: &mut Array<F>,
    cos: &Array<F>,
    sin: &Array<F>,
    positions: &Array<u32>,
    rows: u32,
    heads: u32,
    half: u32,
) {
    let idx = linear_pos();
    if idx < (rows * heads * half) as usize {
        let i = idx as u32 % half;
        let head_row = idx as u32 / half;
        let pos = positions[(head_row / heads) as usize];
        let base = head_row * half * 2;
        let c = cos[(pos * half + i) as usize];
        let s = sin[(pos * half + i) as usize];
        let x1 = x[(base + i) as usize];
        let x2 = x[(base + i + half) as usize];
        x[(base + i) as usize] = x1 * c - x2 * s;
        x[(base + i + half) as usize] = x2 * c + x1 * s;
    }
}

/// Rotates `x: [rows, heads * head_dim]` in place; row `r` is at position
/// `positions[r]`.
pub fn rope<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Tensor,
    table: &RopeTable,
    heads: usize,
    positions: &RowIndex,
) -> Result<(), KernelError> {
    let half = table.half;
    let rows = x.rows();
    check_shape(x.cols() == heads * half * 2, "rope", "x", &x.shape, || {
        format!("[rows, {}]", heads * half * 2)
    })?;
    check_shape(
        positions.len() == rows && (positions.max() as usize) < table.positions(),
        "rope",
        "positions",
        &[positions.len(), positions.max() as usize],
        || {
            format!(
                "one per row ({rows}), below {} (the rope table's context)",
                table.positions()
            )
        },
    )?;
    let (count, dim) = grid_1d(rows * heads * half);
    rope_kernel::launch::<f32, R>(
        client,
        count,
        dim,
        x.arg(),
        table.cos.arg(),
        table.sin.arg(),
        positions.arg(),
        rows as u32,
        heads as u32,
        half as u32,
    );
    Ok(())
}
