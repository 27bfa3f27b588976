//! Attention with grouped-query heads: causal over a KV cache (decoders),
//! or bidirectional within segments (encoders, several sequences packed
//! into one batch without padding).
//!
//! Three passes: scaled scores `q · kᵀ` with the mask, a row softmax, then
//! the probability-weighted sum of values. The same code serves prefill
//! (many query rows) and decode (one).

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
    pub scale: f32,
}

/// Which keys each query row sees.
#[derive(Clone, Copy, Debug)]
pub enum Mask<'a> {
    /// Query row `s` is at position `pos0 + s` and sees keys `0..=pos0 + s`
    /// of the cache, the last `window` of them if `window > 0`.
    Causal { pos0: usize, window: usize },
    /// Query row `s` sees keys `segments[s].0..segments[s].1`: the rows of
    /// its own sequence in a packed batch.
    Segments(&'a [(u32, u32)]),
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
    segments: &Array<u32>,
    scale: f32,
    #[comptime] causal: bool,
) {
    let idx = linear_pos();
    if idx < (heads * rows * keys) as usize {
        let t = idx as u32 % keys;
        let head_row = idx as u32 / keys;
        let s = head_row % rows;
        let h = head_row / rows;
        let kv_h = h / (heads / kv_heads);
        let mut value = F::new(MASKED);
        let q_pos = pos0 + s;
        let mut visible = t <= q_pos && (window == 0 || q_pos - t < window);
        if !causal {
            visible = segments[(2 * s) as usize] <= t && t < segments[(2 * s + 1) as usize];
        }
        if visible {
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
    segments: &Array<u32>,
    #[comptime] causal: bool,
) {
    let idx = linear_pos();
    if idx < (rows * heads * head_dim) as usize {
        let d = idx as u32 % head_dim;
        let row_head = idx as u32 / head_dim;
        let h = row_head % heads;
        let s = row_head / heads;
        let kv_h = h / (heads / kv_heads);
        let p_base = (h * rows + s) * keys;
        // Masked keys have probability exactly 0: skip them.
        let mut first = 0;
        let mut end = pos0 + s + 1;
        if !causal {
            first = segments[(2 * s) as usize];
            end = segments[(2 * s + 1) as usize];
        }
        let mut acc = F::new(0.0);
        for t in first..end {
            acc += probs[(p_base + t) as usize] * v[((t * kv_heads + kv_h) * head_dim + d) as usize];
        }
        out[idx] = acc;
    }
}

/// Attention of `q: [rows, heads * head_dim]` (already rotated, where the
/// model rotates) over the keys and values `[keys, kv_heads * head_dim]`
/// that `mask` lets each row see. Returns `[rows, heads * head_dim]`.
pub fn attention<R: Runtime>(
    client: &ComputeClient<R>,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    shape: AttentionShape,
    mask: Mask,
) -> Result<Tensor, KernelError> {
    let AttentionShape {
        heads,
        kv_heads,
        head_dim,
        scale,
    } = shape;
    let rows = q.rows();
    let (keys, pos0, window, causal, bounds) = match mask {
        Mask::Causal { pos0, window } => (pos0 + rows, pos0, window, true, vec![0, 0]),
        Mask::Segments(segments) => {
            check_shape(
                segments.len() == rows,
                "attention",
                "segments",
                &[segments.len()],
                || format!("one per query row ({rows})"),
            )?;
            let keys = k.rows();
            let valid = segments.iter().all(|&(lo, hi)| lo < hi && hi as usize <= keys);
            check_shape(valid, "attention", "segments", &[keys], || {
                "non-empty ranges within the keys".into()
            })?;
            (
                keys,
                0,
                0,
                false,
                segments.iter().flat_map(|&(lo, hi)| [lo, hi]).collect(),
            )
        }
    };
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
    for (what, cache) in [("k", k), ("v", v)] {
        check_shape(
            cache.cols() == kv_heads * head_dim && cache.rows() >= keys,
            "attention",
            what,
            &cache.shape,
            || format!("[>= {keys}, {}]", kv_heads * head_dim),
        )?;
    }
    let segments = client.create_from_slice(u32::as_bytes(&bounds));
    // SAFETY: the buffer was just created from `bounds`.
    let segments_arg = || unsafe { ArrayArg::from_raw_parts(segments.clone(), bounds.len()) };

    let scores = Tensor::empty(client, &[heads, rows, keys]);
    let (count, dim) = grid_1d(scores.len());
    scores_kernel::launch::<f32, R>(
        client,
        count,
        dim,
        q.arg(),
        k.arg(),
        scores.arg(),
        rows as u32,
        keys as u32,
        heads as u32,
        kv_heads as u32,
        head_dim as u32,
        pos0 as u32,
        window as u32,
        segments_arg(),
        scale,
        causal,
    );
    softmax_rows(client, &scores)?;

    let out = Tensor::empty(client, &q.shape);
    let (count, dim) = grid_1d(out.len());
    values_kernel::launch::<f32, R>(
        client,
        count,
        dim,
        scores.arg(),
        v.arg(),
        out.arg(),
        rows as u32,
        keys as u32,
        heads as u32,
        kv_heads as u32,
        head_dim as u32,
        pos0 as u32,
        segments_arg(),
        causal,
    );
    Ok(out)
}
