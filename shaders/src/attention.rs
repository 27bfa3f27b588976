//! Attention with grouped-query heads, each query row over its own range
//! of key rows ([`KeyRanges`]): causal over a sequence's part of a KV cache
//! (decoders, one or several sequences per pass), or bidirectional within
//! a sequence packed with others (encoders).
//!
//! Three passes: scaled scores `q · kᵀ` over each row's range (plus an
//! optional additive bias per head, query row and key: T5's relative
//! position bias), a row softmax, then the probability-weighted sum of
//! values. The same code
//! serves prefill (many query rows) and decode (one per sequence). A row's
//! result depends only on its own range, never on the other rows.

use cubecl::prelude::*;

use crate::error::check_shape;
use crate::grid::{grid_1d, linear_pos};
use crate::{softmax_rows, KernelError, KeyRanges, Tensor};

/// What a score outside a row's range is set to: exp() of it is exactly 0,
/// and unlike an infinity it can be written in every shading language.
const MASKED: f32 = -3.0e38;

/// The geometry of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
}

#[cube(launch)]
fn scores_kernel<F: Float>(
    q: &Array<F>,
    k: &Array<F>,
    bias: &Array<F>,
    scores: &mut Array<F>,
    ranges: &Array<u32>,
    row0: u32,
    rows: u32,
    all_rows: u32,
    width: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    keys: u32,
    scale: f32,
    #[comptime] biased: bool,
) {
    let idx = linear_pos();
    if idx < (heads * rows * width) as usize {
        let j = idx as u32 % width;
        let head_row = idx as u32 / width;
        let s = head_row % rows;
        let h = head_row / rows;
        let kv_h = h / (heads / kv_heads);
        // The query row in the whole call; scores hold this chunk's rows.
        let g = row0 + s;
        let t = ranges[(2 * g) as usize] + j;
        let mut value = F::new(MASKED);
        if t < ranges[(2 * g + 1) as usize] {
            let q_base = (g * heads + h) * head_dim;
            let k_base = (t * kv_heads + kv_h) * head_dim;
            let mut dot = F::new(0.0);
            for d in 0..head_dim {
                dot += q[(q_base + d) as usize] * k[(k_base + d) as usize];
            }
            value = dot * F::cast_from(scale);
            if biased {
                value += bias[((h * all_rows + g) * keys + t) as usize];
            }
        }
        scores[idx] = value;
    }
}

#[cube(launch)]
fn values_kernel<F: Float>(
    probs: &Array<F>,
    v: &Array<F>,
    out: &mut Array<F>,
    ranges: &Array<u32>,
    row0: u32,
    rows: u32,
    width: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
) {
    let idx = linear_pos();
    if idx < (rows * heads * head_dim) as usize {
        let d = idx as u32 % head_dim;
        let row_head = idx as u32 / head_dim;
        let h = row_head % heads;
        let s = row_head / heads;
        let kv_h = h / (heads / kv_heads);
        let p_base = (h * rows + s) * width;
        let g = row0 + s;
        let first = ranges[(2 * g) as usize];
        let end = ranges[(2 * g + 1) as usize];
        let mut acc = F::new(0.0);
        // Scores past the range have probability exactly 0: skip them.
        for t in first..end {
            acc += probs[(p_base + t - first) as usize] * v[((t * kv_heads + kv_h) * head_dim + d) as usize];
        }
        out[idx + (row0 * heads * head_dim) as usize] = acc;
    }
}

/// Attention of `q: [rows, heads * head_dim]` (already rotated, where the
/// model rotates) over the keys and values `[keys, kv_heads * head_dim]`,
/// query row `s` seeing key rows `ranges[s]`. `bias`, if given, is
/// `[heads, rows, keys]` and added to the scaled scores before the softmax.
/// Returns `[rows, heads * head_dim]`.
pub fn attention<R: Runtime>(
    client: &ComputeClient<R>,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    shape: AttentionShape,
    ranges: &KeyRanges,
    bias: Option<&Tensor>,
) -> Result<Tensor, KernelError> {
    let AttentionShape {
        heads,
        kv_heads,
        head_dim,
        scale,
    } = shape;
    let rows = q.rows();
    check_shape(q.cols() == heads * head_dim, "attention", "q", &q.shape, || {
        format!("[rows, {}]", heads * head_dim)
    })?;
    check_shape(
        ranges.rows() == rows && ranges.is_valid(),
        "attention",
        "key ranges",
        &[ranges.rows()],
        || format!("one non-empty range per query row ({rows})"),
    )?;
    check_shape(
        kv_heads > 0 && heads % kv_heads == 0,
        "attention",
        "heads / kv_heads",
        &[heads, kv_heads],
        || "kv_heads dividing heads".into(),
    )?;
    for (what, cache) in [("k", k), ("v", v)] {
        check_shape(
            cache.cols() == kv_heads * head_dim && cache.rows() >= ranges.end(),
            "attention",
            what,
            &cache.shape,
            || format!("[>= {}, {}]", ranges.end(), kv_heads * head_dim),
        )?;
    }
    let keys = k.rows();
    if let Some(bias) = bias {
        check_shape(
            bias.shape == [heads, rows, keys],
            "attention",
            "bias",
            &bias.shape,
            || format!("[{heads}, {rows}, {keys}]"),
        )?;
    }
    let width = ranges.longest();
    // Scores of every row at once may not fit one buffer (a 1024×1024
    // FLUX image: 24 heads × 4608² scores, 2 GiB): take the query rows in
    // chunks whose scores do.
    let limit = client.properties().memory.max_page_size as usize / size_of::<f32>();
    let chunk = (limit / (heads * width).max(1)).clamp(1, rows.max(1));
    let out = Tensor::empty(client, &q.shape);
    for row0 in (0..rows).step_by(chunk) {
        let n = chunk.min(rows - row0);
        let scores = Tensor::empty(client, &[heads, n, width]);
        let (count, dim) = grid_1d(scores.len());
        scores_kernel::launch::<f32, R>(
            client,
            count,
            dim,
            q.arg(),
            k.arg(),
            // Without a bias the kernel never reads this argument.
            bias.unwrap_or(q).arg(),
            scores.arg(),
            ranges.arg(),
            row0 as u32,
            n as u32,
            rows as u32,
            width as u32,
            heads as u32,
            kv_heads as u32,
            head_dim as u32,
            keys as u32,
            scale,
            bias.is_some(),
        );
        softmax_rows(client, &scores)?;
        let (count, dim) = grid_1d(n * heads * head_dim);
        values_kernel::launch::<f32, R>(
            client,
            count,
            dim,
            scores.arg(),
            v.arg(),
            out.arg(),
            ranges.arg(),
            row0 as u32,
            n as u32,
            width as u32,
            heads as u32,
            kv_heads as u32,
            head_dim as u32,
        );
    }
    Ok(out)
}
