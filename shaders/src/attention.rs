//! Attention with grouped-query heads, each query row over its own range
//! of key rows ([`KeyRanges`]): causal over a sequence's part of a KV cache
//! (decoders, one or several sequences per pass), or bidirectional within
//! a sequence packed with others (encoders).
//!
//! One pass (flash attention, with an online softmax): scaled scores
//! `q · kᵀ` over each row's range (optionally soft-capped, plus an optional
//! additive bias per head, query row and key: T5's relative position
//! bias), taken a tile of keys at a time, and the probability-weighted sum
//! of values, without the score matrix ever being written. The same code
//! serves prefill (many query rows) and decode (one per sequence). A row's
//! result depends only on its own range, never on the other rows.
//!
//! Decode has one query row per sequence, so at long context a head's few
//! cubes would each walk thousands of keys while the device idles; there a
//! row's range is cut into pieces of [`SPLIT_KEYS`] keys, scored by cubes
//! of their own, whose partial softmax sums one more launch combines
//! (flash-decoding).

use cubecl::prelude::*;

use crate::cast::f16_bits_to_f32;
use crate::choice::kernels_for;
use crate::error::check_shape;
use crate::fast_attention::{attend_in_tiles, tile_plan};
use crate::grid::{cube_grid, cube_index, grid_1d, linear_pos};
use crate::precision::{half_type, precision_for, Precision};
use crate::reduce::{reduce, Max, Sum};
use crate::{KernelError, Kernels, KeyRanges, Tensor, Weight, WeightType};

/// What a score outside a row's range is set to: exp() of it is exactly 0,
/// and unlike an infinity it can be written in every shading language.
pub(crate) const MASKED: f32 = -3.0e38;

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
    /// The 16-bit type a prefill pass at `--precision fast` rounds
    /// attention's inputs to, as the products round theirs (see
    /// `fast_attention.rs`): the model's weights' (`None`: exact always, as for
    /// f32 weights).
    pub half: Option<WeightType>,
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
            half: None,
        }
    }

    /// This shape, its fast passes rounding to the 16-bit type the
    /// products of weights of `ty` round to (none for f32 weights).
    pub fn rounding_like(self, ty: WeightType) -> Self {
        AttentionShape {
            half: (ty != WeightType::F32).then(|| half_type(ty)),
            ..self
        }
    }
}

/// Element `i` of a key or value buffer: f32 values, or (`half`) f16
/// values two to a u32 word.
#[cube]
pub(crate) fn kv_at<F: Float>(values: &Array<F>, words: &Array<u32>, i: u32, #[comptime] half: bool) -> F {
    if half {
        let word = words[(i / 2) as usize];
        f16_bits_to_f32::<F>(if i.is_multiple_of(2) { word & 0xffff } else { word >> 16 })
    } else {
        values[i as usize]
    }
}

/// Keys one cube scores at a time, one per unit of a row of units; also
/// the head dimensions each row of units takes at a time.
const TILE: u32 = 64;
/// Rows of units a cube has at most (256 units: WebGPU's limit).
const MAX_UNIT_ROWS: u32 = 4;
/// Keys in one piece of a decode row's range (vLLM's partition size).
const SPLIT_KEYS: u32 = 512;
/// The most pieces a range is cut into; longer ranges get longer pieces,
/// which bounds the partial sums kept per row.
const MAX_PIECES: u32 = 64;
/// The most bytes of partial sums one launch keeps; a decode batch whose
/// partials would pass it runs as several launches over its rows.
const PARTIALS_BYTES: usize = 32 << 20;

/// The keys in each piece of a row's range of `len` (at least 1) keys when
/// pieces are `split_keys` long: longer where that would make more than
/// [`MAX_PIECES`]. It depends on the row's own range only, so a row is cut
/// the same way whatever else its launch holds, and the row's result with it.
#[cube]
fn piece_keys(len: u32, split_keys: u32) -> u32 {
    max(split_keys, (len - 1) / MAX_PIECES + 1)
}

/// A row's softmax denominator: `sum`, the exponentials of its scores
/// less `max`, with head `h`'s sink joined where `sunk` (gpt-oss): a
/// learned logit that takes its share of the softmax and weighs no value.
#[cube]
fn with_sink<F: Float>(sum: F, max: F, sinks: &Array<F>, h: u32, #[comptime] sunk: bool) -> F {
    if sunk {
        sum + F::exp(sinks[h as usize] - max)
    } else {
        sum
    }
}

/// Attention in one pass over each row's keys (flash attention), in one
/// of two forms.
///
/// `by_rows` ([`Kernels::Unit`], for devices that run units alone): one
/// unit per query row, head and piece of the row's keys, with no shared
/// memory and no barriers. Units next to each other take neighbouring rows
/// of one head, whose ranges are alike, so a CPU adapter runs them side by
/// side in its vector lanes. The weighted values accumulate in the row's
/// own place in `out`, or in `partials` as the tiled form leaves them.
///
/// Tiled: one cube per query row, head, block of output dimensions and
/// piece of the row's keys ([`piece_keys`]). The cube has `unit_rows`
/// rows of TILE units. For the scores, row y takes the y-th of `unit_rows`
/// equal runs of the head's dimensions; for the output, unit (x, y) of
/// block b holds dimension `(b·unit_rows + y)·TILE + x`. A head of up to
/// 256 dimensions is one block; a larger one (the VAE's 512 channels) has
/// `blocks` cubes score the same keys, so that each unit holds one output.
/// For each tile of keys, unit (x, y) takes key x's dot product over its
/// row's run, every unit adds the rows' parts for its key, and the scores
/// never leave shared memory: the running maximum, the softmax's sum and
/// the weighted values are rescaled as the maximum grows. A range in one
/// piece is finished here; a piece of a longer one leaves its maximum, sum
/// and unscaled weighted values in `partials` for [`combine_pieces`]. A
/// row's result depends on its own range only, in a fixed order.
#[cube(launch)]
fn attention_kernel<F: Float>(
    q: &Array<F>,
    k: &Array<F>,
    k_words: &Array<u32>,
    v: &Array<F>,
    v_words: &Array<u32>,
    bias: &Array<F>,
    sinks: &Array<F>,
    out: &mut Array<F>,
    partials: &mut Array<F>,
    ranges: &Array<u32>,
    rows: u32,
    row0: u32,
    launch_rows: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    keys: u32,
    scale: f32,
    softcap: f32,
    split_keys: u32,
    pieces: u32,
    #[comptime] tile: u32,
    #[comptime] unit_rows: u32,
    #[comptime] blocks: u32,
    #[comptime] biased: bool,
    #[comptime] capped: bool,
    #[comptime] sunk: bool,
    #[comptime] half: bool,
    #[comptime] by_rows: bool,
) {
    if by_rows {
        let unit = linear_pos() as u32;
        let g = row0 + unit % launch_rows;
        let h = (unit / launch_rows) % heads;
        let piece = unit / (launch_rows * heads);
        let first = ranges[(2 * g) as usize];
        let end = ranges[(2 * g + 1) as usize];
        let len = end - first;
        let chunk = piece_keys(len, split_keys);
        let row_pieces = (len - 1) / chunk + 1;
        // The grid may have a few units past the last piece.
        if piece < pieces && piece < row_pieces {
            let lo = first + piece * chunk;
            let row = RowKeys {
                q_base: (g * heads + h) * head_dim,
                kv_h: h / (heads / kv_heads),
                kv_heads,
                head_dim,
                lo,
                hi: lo + min(chunk, end - lo),
                bias_base: (h * rows + g) * keys,
                scale,
                softcap,
            };
            // `pieces` is the launch's, not the row's: in a launch of
            // several, a row of one piece leaves a partial too (which
            // `combine_pieces` finishes), so that no vector of units runs
            // both calls, whose loops would count together against
            // llvmpipe's budget.
            if pieces == 1 {
                let base = row.q_base;
                let (max, sum) = attend_row::<F>(q, k, k_words, v, v_words, bias, out, base, row, biased, capped, half);
                let total = with_sink::<F>(sum, max, sinks, h, sunk);
                for d in 0..head_dim {
                    out[(base + d) as usize] = out[(base + d) as usize] / total;
                }
            } else {
                let at = (((g - row0) * heads + h) * pieces + piece) * (head_dim + 2);
                let (max, sum) = attend_row::<F>(
                    q,
                    k,
                    k_words,
                    v,
                    v_words,
                    bias,
                    partials,
                    at + 2,
                    row,
                    biased,
                    capped,
                    half,
                );
                partials[at as usize] = max;
                partials[(at + 1) as usize] = sum;
            }
        }
    } else {
        let cube = cube_index();
        let piece = cube % pieces;
        let slot = cube / pieces;
        let block = slot % blocks;
        let h = (slot / blocks) % heads;
        let g = row0 + slot / (blocks * heads);
        // The grid may have a few cubes past the last row: they read a valid
        // range and do nothing.
        let read = min(g, rows - 1);
        let first = ranges[(2 * read) as usize];
        let end = ranges[(2 * read + 1) as usize];
        let len = end - first;
        let chunk = piece_keys(len, split_keys);
        let row_pieces = (len - 1) / chunk + 1;
        // The same for every unit of the cube, so its syncs are reached by all.
        if slot < launch_rows * heads * blocks && piece < row_pieces {
            let (x, y) = (UNIT_POS_X, UNIT_POS_Y);
            let kv_h = h / (heads / kv_heads);
            let lo = first + piece * chunk;
            let hi = lo + min(chunk, end - lo);
            let q_base = (g * heads + h) * head_dim;
            let own = y * tile;
            let d = (block * unit_rows + y) * tile + x;
            let run = head_dim.div_ceil(unit_rows);
            let (run_start, run_end) = (y * run, min((y + 1) * run, head_dim));
            // One shared allocation in four parts (several would be laid out
            // in no fixed order by the CUDA compiler, changing the code from one
            // build to the next): the query row, each row of units' dot products
            // and its copy of the scores to reduce, and the probabilities.
            let q_len = comptime!(tile * unit_rows * blocks);
            let dots = q_len;
            let partial = comptime!(q_len + tile * unit_rows);
            let probs = comptime!(q_len + 2 * tile * unit_rows);
            let mut shared = SharedMemory::<F>::new(comptime!(q_len + 2 * tile * unit_rows + tile) as usize);
            let mut i = own + x;
            while i < head_dim {
                shared[i as usize] = q[(q_base + i) as usize];
                i += comptime!(tile * unit_rows);
            }
            sync_cube();
            let mut acc = F::new(0.0);
            let mut max = F::new(MASKED);
            let mut sum = F::new(0.0);
            let mut t0 = lo;
            while t0 < hi {
                let t = t0 + x;
                let mut dot = F::new(0.0);
                if t < hi {
                    let k_base = (t * kv_heads + kv_h) * head_dim;
                    for i in run_start..run_end {
                        dot += shared[i as usize] * kv_at::<F>(k, k_words, k_base + i, half);
                    }
                }
                shared[(dots + own + x) as usize] = dot;
                sync_cube();
                let mut score = F::new(MASKED);
                if t < hi {
                    let mut whole = F::new(0.0);
                    #[unroll]
                    for part in 0..unit_rows {
                        whole += shared[(dots + part * tile + x) as usize];
                    }
                    score = whole * F::cast_from(scale);
                    if capped {
                        let cap = F::cast_from(softcap);
                        score = F::tanh(score / cap) * cap;
                    }
                    if biased {
                        score += bias[((h * rows + g) * keys + t) as usize];
                    }
                }
                // Each row of units reduces its own copy of the tile's scores.
                shared[(partial + own + x) as usize] = score;
                sync_cube();
                reduce::<F, Max>(&mut shared, partial + own);
                let new_max = F::max(max, shared[(partial + own) as usize]);
                sync_cube();
                let mut p = F::new(0.0);
                if t < hi {
                    p = F::exp(score - new_max);
                }
                if y == 0 {
                    shared[(probs + x) as usize] = p;
                }
                shared[(partial + own + x) as usize] = p;
                sync_cube();
                reduce::<F, Sum>(&mut shared, partial + own);
                // exp of (MASKED - a score) is 0: the first tile starts afresh.
                let rescale = F::exp(max - new_max);
                sum = sum * rescale + shared[(partial + own) as usize];
                max = new_max;
                if d < head_dim {
                    let mut weighted = acc * rescale;
                    for j in 0..min(tile, hi - t0) {
                        let at = ((t0 + j) * kv_heads + kv_h) * head_dim + d;
                        weighted += shared[(probs + j) as usize] * kv_at::<F>(v, v_words, at, half);
                    }
                    acc = weighted;
                }
                // Every unit is done with this tile's shared values.
                sync_cube();
                t0 += tile;
            }
            if row_pieces == 1 {
                if d < head_dim {
                    out[(q_base + d) as usize] = acc / with_sink::<F>(sum, max, sinks, h, sunk);
                }
            } else {
                // This piece's place: [launch row, head, piece, (max, sum, values)].
                let at = (((g - row0) * heads + h) * pieces + piece) * (head_dim + 2);
                if d < head_dim {
                    partials[(at + 2 + d) as usize] = acc;
                }
                if block == 0 && x == 0 && y == 0 {
                    partials[at as usize] = max;
                    partials[(at + 1) as usize] = sum;
                }
            }
        }
    }
}

/// Keys a unit of [`attention_kernel`]'s `by_rows` form scores before it
/// weighs their values.
const ROW_TILE: u32 = 16;
/// Units per cube of the `by_rows` form at most.
const ROW_UNITS: usize = 32;
/// Units per cube of the `by_rows` form at least: llvmpipe runs a cube's
/// units 8 at a time in the lanes of a 256-bit vector, and a cube of fewer
/// was measured 3 times slower on a decode row of one piece and up to 100
/// times slower on rows cut into pieces.
const ROW_UNITS_MIN: usize = 8;

/// Where one unit of [`attention_kernel`]'s `by_rows` form reads: its query row and head, the
/// keys `lo..hi` of its piece, and its row of the bias.
#[derive(CubeType, Clone, Copy)]
struct RowKeys {
    q_base: u32,
    kv_h: u32,
    kv_heads: u32,
    head_dim: u32,
    lo: u32,
    hi: u32,
    bias_base: u32,
    scale: f32,
    softcap: f32,
}

/// One row's unscaled weighted values over `row`'s keys into
/// `acc[base..base + head_dim]`, [`ROW_TILE`] keys at a time with an online
/// softmax; returns the scores' maximum and the sum of their exponentials.
/// The loops over a tile's keys are unrolled and those over dimensions go
/// four at a time, which keeps the loop iterations a unit runs within
/// llvmpipe's budget ([`unit_piece_keys`]). A tile running past the piece
/// reads its last key again, and scores it as masked.
#[cube]
fn attend_row<F: Float>(
    q: &Array<F>,
    k: &Array<F>,
    k_words: &Array<u32>,
    v: &Array<F>,
    v_words: &Array<u32>,
    bias: &Array<F>,
    acc: &mut Array<F>,
    base: u32,
    row: RowKeys,
    #[comptime] biased: bool,
    #[comptime] capped: bool,
    #[comptime] half: bool,
) -> (F, F) {
    let stride = row.kv_heads * row.head_dim;
    let kv_base = row.kv_h * row.head_dim;
    let whole = row.head_dim - row.head_dim % 4;
    for d in 0..row.head_dim {
        acc[(base + d) as usize] = F::new(0.0);
    }
    let mut at = Array::<u32>::new(comptime!(ROW_TILE as usize));
    let mut weights = Array::<F>::new(comptime!(ROW_TILE as usize));
    let mut max = F::new(MASKED);
    let mut sum = F::new(0.0);
    let mut t0 = row.lo;
    while t0 < row.hi {
        #[unroll]
        for j in 0..ROW_TILE {
            at[j as usize] = min(t0 + j, row.hi - 1) * stride + kv_base;
            weights[j as usize] = F::new(0.0);
        }
        let mut i = 0;
        while i < whole {
            #[unroll]
            for e in 0..4 {
                add_products::<F>(
                    &mut weights,
                    q[(row.q_base + i + e) as usize],
                    k,
                    k_words,
                    &at,
                    i + e,
                    half,
                );
            }
            i += 4;
        }
        for i in whole..row.head_dim {
            add_products::<F>(&mut weights, q[(row.q_base + i) as usize], k, k_words, &at, i, half);
        }
        let mut tile_max = F::new(MASKED);
        #[unroll]
        for j in 0..ROW_TILE {
            let mut score = weights[j as usize] * F::cast_from(row.scale);
            if capped {
                let cap = F::cast_from(row.softcap);
                score = F::tanh(score / cap) * cap;
            }
            if biased {
                score += bias[(row.bias_base + min(t0 + j, row.hi - 1)) as usize];
            }
            if t0 + j >= row.hi {
                score = F::new(MASKED);
            }
            weights[j as usize] = score;
            tile_max = F::max(tile_max, score);
        }
        let new_max = F::max(max, tile_max);
        // exp of (MASKED - a score) is 0: the first tile starts afresh, and
        // the keys past the piece weigh nothing.
        let rescale = F::exp(max - new_max);
        sum *= rescale;
        #[unroll]
        for j in 0..ROW_TILE {
            let p = F::exp(weights[j as usize] - new_max);
            weights[j as usize] = p;
            sum += p;
        }
        let mut d = 0;
        while d < whole {
            #[unroll]
            for e in 0..4 {
                let place = (base + d + e) as usize;
                acc[place] = acc[place] * rescale + weighted_value::<F>(&weights, v, v_words, &at, d + e, half);
            }
            d += 4;
        }
        for d in whole..row.head_dim {
            let place = (base + d) as usize;
            acc[place] = acc[place] * rescale + weighted_value::<F>(&weights, v, v_words, &at, d, half);
        }
        max = new_max;
        t0 += ROW_TILE;
    }
    (max, sum)
}

/// Adds `q_i · k[key j, i]` to the dot product of each key `j` of a tile
/// (`at`: where each key's head starts).
#[cube]
fn add_products<F: Float>(
    dots: &mut Array<F>,
    q_i: F,
    k: &Array<F>,
    k_words: &Array<u32>,
    at: &Array<u32>,
    i: u32,
    #[comptime] half: bool,
) {
    #[unroll]
    for j in 0..ROW_TILE {
        dots[j as usize] += q_i * kv_at::<F>(k, k_words, at[j as usize] + i, half);
    }
}

/// `Σ_j p_j · v[key j, d]` over a tile's keys, in key order.
#[cube]
fn weighted_value<F: Float>(
    probs: &Array<F>,
    v: &Array<F>,
    v_words: &Array<u32>,
    at: &Array<u32>,
    d: u32,
    #[comptime] half: bool,
) -> F {
    let mut total = F::new(0.0);
    #[unroll]
    for j in 0..ROW_TILE {
        total += probs[j as usize] * kv_at::<F>(v, v_words, at[j as usize] + d, half);
    }
    total
}

/// The loop iterations one invocation may run on llvmpipe (lavapipe's
/// compiler): past 65,535 in all, every loop of the invocation stops
/// early, silently, as a guard against endless loops.
pub(crate) const LLVMPIPE_LOOP_BUDGET: usize = 65_535;

/// The most keys one unit of the `by_rows` form may take for heads of
/// `head_dim` and stay within [`LLVMPIPE_LOOP_BUDGET`], with a tenth of it
/// spare: a whole number of tiles, each of which runs `head_dim / 2 + 7`
/// iterations at most, after `2 · head_dim` for clearing and dividing the
/// row. `None` for heads too wide for one tile.
fn unit_piece_keys(head_dim: usize) -> Option<u32> {
    let budget = LLVMPIPE_LOOP_BUDGET - LLVMPIPE_LOOP_BUDGET / 10;
    let tiles = budget.checked_sub(head_dim.checked_mul(2)?)? / (head_dim / 2 + 7);
    (tiles > 0).then(|| (tiles * ROW_TILE as usize).min(u32::MAX as usize) as u32)
}

/// Keys in a piece of a row's range, where ranges are cut (`None`: not
/// cut). Decode cuts long ranges into pieces of 512; prefill's many rows
/// already fill the device, and each row's range is one piece, but in the
/// unit form (`unit`), whose units may take no more keys than llvmpipe's
/// loop budget allows.
fn split_keys_for(unit: bool, decode: bool, head_dim: usize) -> Option<u32> {
    if unit {
        let most = unit_piece_keys(head_dim).unwrap_or(1);
        Some(if decode { SPLIT_KEYS.min(most) } else { most })
    } else {
        decode.then_some(SPLIT_KEYS)
    }
}

/// The pieces a range of `longest` keys is cut into, `split_keys` a piece
/// (`None`: not cut).
fn piece_count(longest: usize, split_keys: Option<u32>) -> usize {
    split_keys.map_or(1, |keys| longest.div_ceil(keys as usize).clamp(1, MAX_PIECES as usize))
}

/// Query rows one launch takes where each row's keys are in `pieces`
/// pieces: all of them without pieces, else as many as keep their partial
/// sums within [`PARTIALS_BYTES`] (at least one).
fn rows_per_launch(rows: usize, heads: usize, pieces: usize, head_dim: usize) -> usize {
    if pieces == 1 {
        return rows;
    }
    let row_bytes = heads.saturating_mul(pieces).saturating_mul(piece_bytes(head_dim));
    (PARTIALS_BYTES / row_bytes.max(1)).clamp(1, rows)
}

/// The most bytes of partial sums attention keeps beside its output for
/// `rows` query rows (`decode`: one a sequence) of `heads` heads of
/// `head_dim` over at most `keys` keys each, on any device: what a planner
/// sets aside for it. Nothing where no row's keys are cut into pieces.
pub fn attention_partials_bytes(rows: usize, heads: usize, head_dim: usize, keys: usize, decode: bool) -> usize {
    // The unit form cuts the shortest pieces, and the most of them.
    let pieces = piece_count(keys, split_keys_for(true, decode, head_dim));
    if pieces == 1 {
        return 0;
    }
    let launch_rows = rows_per_launch(rows, heads, pieces, head_dim);
    launch_rows
        .saturating_mul(heads)
        .saturating_mul(pieces)
        .saturating_mul(piece_bytes(head_dim))
}

/// Bytes of one piece's partial sums: its maximum, its sum and its
/// weighted values.
fn piece_bytes(head_dim: usize) -> usize {
    head_dim.saturating_add(2).saturating_mul(size_of::<f32>())
}

/// One unit per output value, after a launch that cut rows into pieces:
/// each row's pieces' weighted values, each rescaled from its own maximum
/// to the row's, over their rescaled sums, added in piece order. The tiled
/// form finishes rows of one piece itself; `every_row` (the unit form's
/// launches) finishes them here too.
#[cube(launch)]
fn combine_pieces<F: Float>(
    partials: &Array<F>,
    sinks: &Array<F>,
    out: &mut Array<F>,
    ranges: &Array<u32>,
    row0: u32,
    launch_rows: u32,
    heads: u32,
    head_dim: u32,
    split_keys: u32,
    pieces: u32,
    #[comptime] sunk: bool,
    #[comptime] every_row: bool,
) {
    let i = linear_pos() as u32;
    if i < launch_rows * heads * head_dim {
        let d = i % head_dim;
        let row_head = i / head_dim;
        let g = row0 + row_head / heads;
        let len = ranges[(2 * g + 1) as usize] - ranges[(2 * g) as usize];
        let row_pieces = (len - 1) / piece_keys(len, split_keys) + 1;
        if every_row || row_pieces > 1 {
            let base = row_head * pieces * (head_dim + 2);
            let mut max = F::new(MASKED);
            for p in 0..row_pieces {
                max = F::max(max, partials[(base + p * (head_dim + 2)) as usize]);
            }
            // A row of one piece gets `(acc·1) / (sum·1)`: the bits of the
            // division a launch of one piece a row makes.
            let rescale = F::exp(partials[base as usize] - max);
            let mut sum = partials[(base + 1) as usize] * rescale;
            let mut acc = partials[(base + 2 + d) as usize] * rescale;
            for p in 1..row_pieces {
                let at = base + p * (head_dim + 2);
                let rescale = F::exp(partials[at as usize] - max);
                sum += partials[(at + 1) as usize] * rescale;
                acc += partials[(at + 2 + d) as usize] * rescale;
            }
            let total = with_sink::<F>(sum, max, sinks, row_head % heads, sunk);
            out[(row0 * heads * head_dim + i) as usize] = acc / total;
        }
    }
}

/// Keys or values as attention reads them: an f32 tensor, or a cache
/// [`Weight`] of f32 or f16 rows.
#[derive(Clone, Copy)]
pub(crate) enum KeysValues<'a> {
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

    pub(crate) fn cols(self) -> usize {
        match self {
            KeysValues::F32(t) => t.cols(),
            KeysValues::Cache(w) => w.cols,
        }
    }

    pub(crate) fn half(self) -> bool {
        matches!(self, KeysValues::Cache(w) if w.ty == WeightType::F16)
    }

    /// The f32 argument and the u32-word argument; the kernel reads the
    /// one `half()` picks, and `other` fills the unused place.
    pub(crate) fn args<R: Runtime>(self, other: &Tensor) -> (ArrayArg<R>, ArrayArg<R>) {
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
    attend(
        client,
        q,
        KeysValues::F32(k),
        KeysValues::F32(v),
        shape,
        ranges,
        Scores::bias(bias),
    )
}

/// [`attention`] over a KV cache of f32 or f16 rows ([`crate::kv_cache`]),
/// each head's softmax joined by its logit in `sinks` (`[heads]`) where
/// given (gpt-oss's attention sinks).
pub fn attention_cached<R: Runtime>(
    client: &ComputeClient<R>,
    q: &Tensor,
    k: &Weight,
    v: &Weight,
    shape: AttentionShape,
    ranges: &KeyRanges,
    sinks: Option<&Tensor>,
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
    let scores = Scores { bias: None, sinks };
    attend(
        client,
        q,
        KeysValues::Cache(k),
        KeysValues::Cache(v),
        shape,
        ranges,
        scores,
    )
}

/// What joins the scaled scores beside the keys: an additive bias
/// `[heads, rows, keys]` (T5's), and one more logit per head in each
/// row's softmax (gpt-oss's sinks, `[heads]`).
#[derive(Clone, Copy, Default)]
struct Scores<'a> {
    bias: Option<&'a Tensor>,
    sinks: Option<&'a Tensor>,
}

impl<'a> Scores<'a> {
    fn bias(bias: Option<&'a Tensor>) -> Self {
        Scores { bias, sinks: None }
    }
}

fn attend<R: Runtime>(
    client: &ComputeClient<R>,
    q: &Tensor,
    k: KeysValues,
    v: KeysValues,
    shape: AttentionShape,
    ranges: &KeyRanges,
    Scores { bias, sinks }: Scores,
) -> Result<Tensor, KernelError> {
    let AttentionShape {
        heads,
        kv_heads,
        head_dim,
        scale,
        softcap,
        half,
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
    // No model has both; leaving the pair out keeps every variant within
    // its registers on CUDA.
    check_shape(
        bias.is_none() || softcap.is_none(),
        "attention",
        "bias with soft cap",
        &[],
        || "a score bias or a soft cap, not both".into(),
    )?;
    if let Some(sinks) = sinks {
        check_shape(sinks.shape == [heads], "attention", "sinks", &sinks.shape, || {
            format!("[{heads}]")
        })?;
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
    let head_tiles = head_dim.div_ceil(TILE as usize).max(1) as u32;
    let unit_rows = head_tiles.min(MAX_UNIT_ROWS);
    let blocks = head_tiles.div_ceil(unit_rows);
    let out = Tensor::empty(client, &q.shape);
    if rows == 0 {
        return Ok(out);
    }
    let decode = q.rows_per_sequence() == 1;
    let fast = precision_for(client) == Precision::Fast;
    // The tiles take neither a bias nor sinks: those rows run exactly.
    if let Some(half) = half.filter(|_| fast && !decode && bias.is_none() && sinks.is_none()) {
        if let Some(plan) = tile_plan(client, head_dim, ranges) {
            attend_in_tiles(client, plan, q, (k, v), shape, ranges, (half, &out));
            return Ok(out);
        }
    }
    let unit = kernels_for(client) == Kernels::Unit;
    if unit {
        let most = unit_piece_keys(head_dim);
        check_shape(
            most.is_some_and(|most| ranges.longest() <= most as usize * MAX_PIECES as usize),
            "attention",
            "key ranges",
            &[ranges.longest()],
            || match most {
                Some(most) => format!(
                    "at most {} keys a row on this device",
                    most as usize * MAX_PIECES as usize
                ),
                None => format!("heads narrower than {head_dim} on this device"),
            },
        )?;
    }
    let split_keys = split_keys_for(unit, decode, head_dim);
    let pieces = piece_count(ranges.longest(), split_keys);
    let split_keys = split_keys.unwrap_or(u32::MAX);
    let rows_per_launch = rows_per_launch(rows, heads, pieces, head_dim);
    // Without pieces to combine the kernel never writes this argument.
    let partials = if pieces == 1 {
        out.clone()
    } else {
        Tensor::empty(client, &[rows_per_launch, heads, pieces, head_dim + 2])
    };
    for row0 in (0..rows).step_by(rows_per_launch) {
        let launch_rows = rows_per_launch.min(rows - row0);
        let (k_values, k_words) = k.args(q);
        let (v_values, v_words) = v.args(q);
        let (count, dim) = if unit {
            // Cubes of fewer units where a small launch would leave cores
            // idle, but never fewer than a vector's lanes.
            let units = launch_rows * heads * pieces;
            let per_cube = (units / 8).clamp(ROW_UNITS_MIN, ROW_UNITS);
            (cube_grid(units.div_ceil(per_cube)), CubeDim::new_1d(per_cube as u32))
        } else {
            (
                cube_grid(launch_rows * heads * blocks as usize * pieces),
                CubeDim::new_2d(TILE, unit_rows),
            )
        };
        crate::profile::launch(client, "attention", || {
            attention_kernel::launch::<f32, R>(
                client,
                count,
                dim,
                q.arg(),
                k_values,
                k_words,
                v_values,
                v_words,
                // Without a bias the kernel never reads this argument.
                bias.unwrap_or(q).arg(),
                // Nor this one without sinks.
                sinks.unwrap_or(q).arg(),
                out.arg(),
                partials.arg(),
                ranges.arg(),
                rows as u32,
                row0 as u32,
                launch_rows as u32,
                heads as u32,
                kv_heads as u32,
                head_dim as u32,
                keys as u32,
                scale,
                softcap.unwrap_or(1.0),
                split_keys,
                pieces as u32,
                TILE,
                unit_rows,
                blocks,
                bias.is_some(),
                softcap.is_some(),
                sinks.is_some(),
                k.half(),
                unit,
            );
        });
        if pieces > 1 {
            let (count, dim) = grid_1d(launch_rows * heads * head_dim);
            crate::profile::launch(client, "combine_pieces", || {
                combine_pieces::launch::<f32, R>(
                    client,
                    count,
                    dim,
                    partials.arg(),
                    sinks.unwrap_or(q).arg(),
                    out.arg(),
                    ranges.arg(),
                    row0 as u32,
                    launch_rows as u32,
                    heads as u32,
                    head_dim as u32,
                    split_keys,
                    pieces as u32,
                    sinks.is_some(),
                    unit,
                );
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partials_are_counted_where_ranges_are_cut() {
        // A decode step over one piece of keys keeps none; one key more
        // makes two pieces a row.
        assert_eq!(attention_partials_bytes(4, 8, 64, 512, true), 0);
        assert_eq!(attention_partials_bytes(4, 8, 64, 513, true), 4 * 8 * 2 * 66 * 4);
        // Prefill rows are cut only past the unit form's loop budget.
        assert_eq!(attention_partials_bytes(512, 8, 64, 4096, false), 0);
        let long = attention_partials_bytes(512, 8, 64, 100_000, false);
        assert!(long > 0 && long <= PARTIALS_BYTES, "{long}");
        // Many rows over long ranges: one launch's bound at most.
        let batch = attention_partials_bytes(100_000, 32, 128, 1 << 20, true);
        assert!(batch > PARTIALS_BYTES / 2 && batch <= PARTIALS_BYTES, "{batch}");
        // Sizes from a file saturate rather than wrap.
        assert_eq!(
            attention_partials_bytes(usize::MAX, usize::MAX, usize::MAX, usize::MAX, true),
            usize::MAX
        );
    }
}
