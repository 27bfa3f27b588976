//! Attention with grouped-query heads, each query row over its own range
//! of key rows ([`KeyRanges`]): causal over a sequence's part of a KV cache
//! (decoders, one or several sequences per pass), or bidirectional within
//! a sequence packed with others (encoders).
//!
//! Three passes: scaled scores `q · kᵀ` over each row's range (optionally
//! soft-capped, plus an optional additive bias per head, query row and
//! key: T5's relative position bias), a row softmax, then the probability-weighted sum of
//! values. The same code
//! serves prefill (many query rows) and decode (one per sequence). A row's
//! result depends only on its own range, never on the other rows.

use cubecl::prelude::*;

use crate::cast::f16_bits_to_f32;
use crate::error::check_shape;
use crate::grid::{grid_1d, linear_pos};
use crate::{softmax_rows, KernelError, KeyRanges, Tensor, Weight, WeightType};

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
    /// Scaled scores pass through `cap · tanh(score / cap)` before the
    /// softmax where this is set (Gemma 2's `attn_logit_softcapping`).
    pub softcap: Option<f32>,
}

impl AttentionShape {
    /// `heads` query heads over `kv_heads` key/value heads of `head_dim`,
    /// scores scaled by `1/√head_dim`, not capped.
    pub fn new(heads: usize, kv_heads: usize, head_dim: usize) -> Self {
        AttentionShape {
            heads,
            kv_heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            softcap: None,
        }
    }
}

/// Element `i` of a key or value buffer: f32 values, or (`half`) f16
/// values two to a u32 word.
#[cube]
fn kv_at<F: Float>(values: &Array<F>, words: &Array<u32>, i: u32, #[comptime] half: bool) -> F {
    if half {
        let word = words[(i / 2) as usize];
        f16_bits_to_f32::<F>(if i.is_multiple_of(2) { word & 0xffff } else { word >> 16 })
    } else {
        values[i as usize]
    }
}

#[cube(launch)]
fn scores_kernel<F: Float>(
    q: &Array<F>,
    k: &Array<F>,
    k_words: &Array<u32>,
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
    softcap: f32,
    #[comptime] biased: bool,
    #[comptime] capped: bool,
    #[comptime] half: bool,
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
                dot += q[(q_base + d) as usize] * kv_at::<F>(k, k_words, k_base + d, half);
            }
            value = dot * F::cast_from(scale);
            if capped {
                let cap = F::cast_from(softcap);
                value = F::tanh(value / cap) * cap;
            }
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
    v_words: &Array<u32>,
    out: &mut Array<F>,
    ranges: &Array<u32>,
    row0: u32,
    rows: u32,
    width: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    #[comptime] half: bool,
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
            acc += probs[(p_base + t - first) as usize]
                * kv_at::<F>(v, v_words, (t * kv_heads + kv_h) * head_dim + d, half);
        }
        out[idx + (row0 * heads * head_dim) as usize] = acc;
    }
}

/// Keys or values as attention reads them: an f32 tensor, or a cache
/// [`Weight`] of f32 or f16 rows.
#[derive(Clone, Copy)]
enum KeysValues<'a> {
    F32(&'a Tensor),
    Cache(&'a Weight),
}

impl KeysValues<'_> {
    fn rows(self) -> usize {
        match self {
            KeysValues::F32(t) => t.rows(),
            KeysValues::Cache(w) => w.rows,
        }
    }

    fn cols(self) -> usize {
        match self {
            KeysValues::F32(t) => t.cols(),
            KeysValues::Cache(w) => w.cols,
        }
    }

    fn half(self) -> bool {
        matches!(self, KeysValues::Cache(w) if w.ty == WeightType::F16)
    }

    /// The f32 argument and the u32-word argument; the kernel reads the
    /// one `half()` picks, and `other` fills the unused place.
    fn args<R: Runtime>(self, other: &Tensor) -> (ArrayArg<R>, ArrayArg<R>) {
        match self {
            KeysValues::F32(t) => (t.arg(), other.words_arg()),
            KeysValues::Cache(w) => match w.as_f32() {
                Some(t) => (t.arg(), other.words_arg()),
                None => (other.arg(), w.words_arg()),
            },
        }
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
    attend(client, q, KeysValues::F32(k), KeysValues::F32(v), shape, ranges, bias)
}

/// [`attention`] over a KV cache of f32 or f16 rows ([`crate::kv_cache`]).
pub fn attention_cached<R: Runtime>(
    client: &ComputeClient<R>,
    q: &Tensor,
    k: &Weight,
    v: &Weight,
    shape: AttentionShape,
    ranges: &KeyRanges,
) -> Result<Tensor, KernelError> {
    for (what, cache) in [("k", k), ("v", v)] {
        check_shape(
            matches!(cache.ty, WeightType::F32 | WeightType::F16),
            "attention",
            what,
            &[cache.rows, cache.cols],
            || "an f32 or f16 cache".into(),
        )?;
    }
    attend(
        client,
        q,
        KeysValues::Cache(k),
        KeysValues::Cache(v),
        shape,
        ranges,
        None,
    )
}

fn attend<R: Runtime>(
    client: &ComputeClient<R>,
    q: &Tensor,
    k: KeysValues,
    v: KeysValues,
    shape: AttentionShape,
    ranges: &KeyRanges,
    bias: Option<&Tensor>,
) -> Result<Tensor, KernelError> {
    let AttentionShape {
        heads,
        kv_heads,
        head_dim,
        scale,
        softcap,
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
            &[cache.rows(), cache.cols()],
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
        let (k_values, k_words) = k.args(q);
        scores_kernel::launch::<f32, R>(
            client,
            count,
            dim,
            q.arg(),
            k_values,
            k_words,
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
            softcap.unwrap_or(1.0),
            bias.is_some(),
            softcap.is_some(),
            k.half(),
        );
        softmax_rows(client, &scores)?;
        let (count, dim) = grid_1d(n * heads * head_dim);
        let (v_values, v_words) = v.args(q);
        values_kernel::launch::<f32, R>(
            client,
            count,
            dim,
            scores.arg(),
            v_values,
            v_words,
            out.arg(),
            ranges.arg(),
            row0 as u32,
            n as u32,
            width as u32,
            heads as u32,
            kv_heads as u32,
            head_dim as u32,
            v.half(),
        );
    }
    Ok(out)
}
