//! Causal attention over a KV cache, with grouped-query heads.
//!
//! Three passes: scaled scores `q · kᵀ` with the causal (and sliding window)
//! mask, a row softmax, then the probability-weighted sum of values. The
//! same code serves prefill (many query rows) and decode (one).

use cubecl::prelude::*;

use crate::error::check_shape;
use crate::grid::{grid_1d, linear_pos};
use crate::{softmax_rows, KernelError, Tensor};

/// What a masked score is set to: exp() of it is exactly 0, and unlike an
/// infinity it can be written in every shading language.
const MASKED: f32 = -3.0e38;

/// The geometry of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Position of the first query row; keys `0..pos0 + rows` are in the cache.
    pub pos0: usize,
    /// Keys further back than this many positions are masked (0: no window).
    pub window: usize,
    pub scale: f32,
}

#[cube(launch)]
fn scores_kernel<F: Float>(
    q: &Array<F>,
    k: &Array<F>,
    scores: &mut Array<F>,
    rows: u32,
    keys: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    pos0: u32,
    window: u32,
    scale: f32,
) {
    let idx = linear_pos();
    if idx < (heads * rows * keys) as usize {
        let t = idx as u32 % keys;
        let head_row = idx as u32 / keys;
        let s = head_row % rows;
        let h = head_row / rows;
        let q_pos = pos0 + s;
        let kv_h = h / (heads / kv_heads);
        let mut value = F::new(MASKED);
        if t <= q_pos && (window == 0 || q_pos - t < window) {
            let q_base = (s * heads + h) * head_dim;
            let k_base = (t * kv_heads + kv_h) * head_dim;
            let mut dot = F::new(0.0);
            for d in 0..head_dim {
                dot += q[(q_base + d) as usize] * k[(k_base + d) as usize];
            }
            value = dot * F::cast_from(scale);
        }
        scores[idx] = value;
    }
}

#[cube(launch)]
fn values_kernel<F: Float>(
    probs: &Array<F>,
    v: &Array<F>,
    out: &mut Array<F>,
    rows: u32,
    keys: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    pos0: u32,
) {
    let idx = linear_pos();
    if idx < (rows * heads * head_dim) as usize {
        let d = idx as u32 % head_dim;
        let row_head = idx as u32 / head_dim;
        let h = row_head % heads;
        let s = row_head / heads;
        let kv_h = h / (heads / kv_heads);
        let p_base = (h * rows + s) * keys;
        // Masked keys have probability exactly 0: skip the future ones.
        let last = pos0 + s + 1;
        let mut acc = F::new(0.0);
        for t in 0..last {
            acc += probs[(p_base + t) as usize] * v[((t * kv_heads + kv_h) * head_dim + d) as usize];
        }
        out[idx] = acc;
    }
}

/// Attention of `q: [rows, heads * head_dim]` (already rotated) over the
/// first `pos0 + rows` rows of `k_cache` and `v_cache`
/// (`[context, kv_heads * head_dim]`). Returns `[rows, heads * head_dim]`.
pub fn attention<R: Runtime>(
    client: &ComputeClient<R>,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    shape: AttentionShape,
) -> Result<Tensor, KernelError> {
    let AttentionShape {
        heads,
        kv_heads,
        head_dim,
        pos0,
        ..
    } = shape;
    let rows = q.rows();
    let keys = pos0 + rows;
    check_shape(q.cols() == heads * head_dim, "attention", "q", &q.shape, || {
        format!("[rows, {}]", heads * head_dim)
    })?;
    check_shape(
        kv_heads > 0 && heads % kv_heads == 0,
        "attention",
        "heads / kv_heads",
        &[heads, kv_heads],
        || "kv_heads dividing heads".into(),
    )?;
    for (what, cache) in [("k_cache", k_cache), ("v_cache", v_cache)] {
        check_shape(
            cache.cols() == kv_heads * head_dim && cache.rows() >= keys,
            "attention",
            what,
            &cache.shape,
            || format!("[>= {keys}, {}]", kv_heads * head_dim),
        )?;
    }

    let scores = Tensor::empty(client, &[heads, rows, keys]);
    let (count, dim) = grid_1d(scores.len());
    scores_kernel::launch::<f32, R>(
        client,
        count,
        dim,
        q.arg(),
        k_cache.arg(),
        scores.arg(),
        rows as u32,
        keys as u32,
        heads as u32,
        kv_heads as u32,
        head_dim as u32,
        pos0 as u32,
        shape.window as u32,
        shape.scale,
    );
    softmax_rows(client, &scores)?;

    let out = Tensor::empty(client, &q.shape);
    let (count, dim) = grid_1d(out.len());
    values_kernel::launch::<f32, R>(
        client,
        count,
        dim,
        scores.arg(),
        v_cache.arg(),
        out.arg(),
        rows as u32,
        keys as u32,
        heads as u32,
        kv_heads as u32,
        head_dim as u32,
        pos0 as u32,
    );
    Ok(out)
}
