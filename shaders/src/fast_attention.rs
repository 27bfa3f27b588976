//! Prefill attention at `--precision fast`: flash attention whose two
//! products, the scores `q·kᵀ` and the weighted values `p·v`, take inputs
//! rounded to 16 bits and sum in f32, as transformers and llama.cpp form
//! them on GPUs. On a device with matrix units the products run there
//! (`cmma`, 16×16×16 tiles read from shared memory); elsewhere ordinary
//! units form the very same rounded products, so that CI checks the numbers
//! the matrix units must give. One launch per call, whatever the heads.
//!
//! A cube takes 64 rows of a key/value head (16 or 32 for heads wider than
//! 128): rows of all the query heads sharing it (grouped-query attention),
//! each query row with its group's heads side by side, so that a staged
//! tile of keys serves every head of the group. Its planes (32 units; a CUDA warp, which
//! a matrix-unit product takes whole) each hold 16 rows and at most 128 of
//! the head's dimensions: for wider heads, two or four planes share a block
//! of rows, each holding its part of the dimensions.
//!
//! Two passes over the cube's keys, a tile at a time: the first finds each
//! row's largest score; the second weighs the values by `exp(score − max)`,
//! rounded to 16 bits, and sums those exponentials unrounded in f32. With
//! the maximum known beforehand, a probability is rounded once, from the
//! row's final maximum, whichever tile it lies in, so a row's numbers do not
//! depend on how the keys are tiled, and the weighted values stay in the
//! matrix units' accumulators without being rescaled. The scores are formed
//! twice: attention is a few percent of a prefill's products.

use cubecl::cmma;
use cubecl::prelude::*;

use crate::attention::{kv_at, KeysValues, LLVMPIPE_LOOP_BUDGET, MASKED};
use crate::choice::kernels_for;
use crate::grid::{cube_grid, cube_index};
use crate::precision::{fragment, matrix_units, rounded_to_half, store_fragment, FRAG, LANES};
use crate::{AttentionShape, Kernels, KeyRanges, Tensor, WeightType};

/// Planes in a cube.
const PLANES: u32 = 4;
/// Units in a cube.
const UNITS: u32 = PLANES * LANES;
/// The widest head the kernel takes (the VAE's 512 channels).
const MAX_DIMS: usize = 512;

/// How a launch cuts a head, and where its parts lie in shared memory:
/// the head's dimensions padded to whole fragments, how many planes share
/// a block of rows (each holding its part of the dimensions), how many keys
/// a tile stages, and whether the products run on matrix units.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct TilePlan {
    dims: u32,
    col_splits: u32,
    key_tile: u32,
    matrix: bool,
}

impl TilePlan {
    /// The plan for heads of `head_dim`, or `None` past [`MAX_DIMS`].
    /// Shared memory on matrix units (16-bit tiles): the cube's queries,
    /// a tile of keys and one of values, and the probabilities, with the
    /// scores in f32: 73 KiB for heads of 128, 86 KiB for 512, within
    /// sm_80's 163 KiB. Elsewhere only the scores and probabilities are
    /// staged (the products read q, k and v where they lie), in tiles of 32
    /// keys: at most 16 KiB, within the 32 KiB of a CPU adapter.
    fn new(head_dim: usize, matrix: bool) -> Option<TilePlan> {
        let dims = head_dim.max(1).next_multiple_of(FRAG as usize);
        (dims <= MAX_DIMS).then(|| TilePlan {
            dims: dims as u32,
            col_splits: dims.div_ceil(128).next_power_of_two() as u32,
            key_tile: if matrix && dims <= 128 { 64 } else { 32 },
            matrix,
        })
    }

    /// Query rows (each of one head) a cube takes.
    fn cube_rows(self) -> u32 {
        FRAG * PLANES / self.col_splits
    }

    /// Units sharing one row's softmax.
    fn row_units(self) -> u32 {
        UNITS / self.cube_rows()
    }

    /// The head's dimensions one plane holds.
    fn plane_dims(self) -> u32 {
        self.dims / self.col_splits
    }

    /// In `tiles`: the probabilities `[cube_rows, key_tile]` first, then
    /// on matrix units the queries `[cube_rows, dims]`, ...
    fn queries_at(self) -> u32 {
        self.cube_rows() * self.key_tile
    }

    /// ... a tile of keys `[key_tile, dims]`, ...
    fn keys_at(self) -> u32 {
        self.queries_at() + self.cube_rows() * self.dims
    }

    /// ... and one of values.
    fn values_at(self) -> u32 {
        self.keys_at() + self.key_tile * self.dims
    }

    fn tiles_len(self) -> u32 {
        match self.matrix {
            true => self.values_at() + self.key_tile * self.dims,
            false => self.queries_at(),
        }
    }

    /// In `sums`: the scores `[cube_rows, key_tile]` first, in room enough
    /// for each plane to pass a 16×16 fragment through on its way out; then
    /// each unit's partial maximum or sum, ...
    fn partial_at(self) -> u32 {
        (self.cube_rows() * self.key_tile).max(PLANES * FRAG * FRAG)
    }

    /// ... each row's sum, ...
    fn totals_at(self) -> u32 {
        self.partial_at() + UNITS
    }

    /// ... and which keys of the tile the cube's rows see.
    fn seen_at(self) -> u32 {
        self.totals_at() + self.cube_rows()
    }

    fn sums_len(self) -> u32 {
        self.seen_at() + self.key_tile
    }

    /// Elsewhere than on matrix units, the most keys a cube may span and
    /// keep each unit within llvmpipe's loop budget, with a tenth of it
    /// spare. Every loop counts its iterations and the check that ends it.
    /// A unit runs, for each tile of keys, an iteration of each pass's loop
    /// over the tiles; twice its share of the tile's scores (a loop over
    /// them, and for each a loop over the dimensions, 16 an iteration, the
    /// rest unrolled); its share of the weighted values; and (`gaps`) a
    /// loop over the cube's query rows. Once: a loop over those rows, the
    /// clearing and dividing of its share, and the ends of the passes'
    /// loops. (Measured with heads of 64 over a span of 9,056 keys, this
    /// count short by a tenth, and a span of 9,120 past the budget.)
    fn most_keys_on_units(self, gaps: bool) -> usize {
        let budget = LLVMPIPE_LOOP_BUDGET - LLVMPIPE_LOOP_BUDGET / 10;
        let (dims, rows, share) = (
            self.dims as usize,
            self.cube_rows() as usize,
            self.plane_dims() as usize / 2,
        );
        let unit_scores = (FRAG * self.key_tile / (LANES * self.col_splits)) as usize;
        let scores = unit_scores + 1 + unit_scores * (dims / FRAG as usize + 1);
        let per_tile = 2 + 2 * scores + (share + 1) + if gaps { rows + 1 } else { 0 };
        let once = (rows + 1) + 2 * (share + 1) + 2;
        (budget - once) / per_tile * self.key_tile as usize
    }
}

/// The plan by which [`attend_in_tiles`] takes a pass of heads of
/// `head_dim` over `ranges` on `client`'s device, if it takes it: heads up
/// to [`MAX_DIMS`], and on a CPU adapter (the unit form, without matrix
/// units) keys within [`TilePlan::most_keys_on_units`]; the flash kernel,
/// exact, takes the rest.
pub(crate) fn tile_plan<R: Runtime>(
    client: &ComputeClient<R>,
    head_dim: usize,
    ranges: &KeyRanges,
) -> Option<TilePlan> {
    let matrix = matrix_units(client);
    TilePlan::new(head_dim, matrix).filter(|plan| {
        let on_units = !matrix && kernels_for(client) == Kernels::Unit;
        let span = ranges.end() - ranges.start();
        !on_units || span <= plan.most_keys_on_units(!ranges.covers_span())
    })
}

/// Where the rows of a cube lie: query row `r`, head `h` of the cube's
/// key/value head's group, is its row `r·group + h − base`; and the end
/// of the keys its rows see, `hi`.
#[derive(CubeType, Clone, Copy)]
struct Rows {
    /// The cube's first row, counted as above.
    base: u32,
    rows: u32,
    group: u32,
    heads: u32,
    kv_h: u32,
    kv_heads: u32,
    head_dim: u32,
    hi: u32,
}

/// Element `c` of the cube's query row `row`, rounded: 0 past the head's
/// dimensions or the pass's rows.
#[cube]
fn query_at(q: &Array<f32>, at: Rows, row: u32, c: u32, #[comptime] bf16: bool) -> f32 {
    let mut value = 0.0f32;
    if in_pass(at, row, c) {
        value = rounded_to_half(q[out_index(at, row, c) as usize], bf16);
    }
    value
}

/// Element `c` of key (or value) row `t`, rounded: 0 past the head's
/// dimensions or the cube's keys, and (`gaps`) for a key no row of the cube
/// sees, which no one may have written.
#[cube]
#[allow(clippy::too_many_arguments)]
fn key_at(
    values: &Array<f32>,
    words: &Array<u32>,
    seen: &SharedMemory<f32>,
    at: Rows,
    t0: u32,
    t: u32,
    c: u32,
    #[comptime] seen_at: u32,
    #[comptime] gaps: bool,
    #[comptime] half_kv: bool,
    #[comptime] bf16: bool,
) -> f32 {
    let mut value = 0.0f32;
    let mut visible = t < at.hi && c < at.head_dim;
    if gaps {
        visible = visible && seen[(seen_at + t - t0) as usize] != 0.0;
    }
    if visible {
        let i = (t * at.kv_heads + at.kv_h) * at.head_dim + c;
        value = rounded_to_half(kv_at::<f32>(values, words, i, half_kv), bf16);
    }
    value
}

/// A score as the softmax takes it: scaled (and capped), or [`MASKED`]
/// outside the row's keys `start..end`. The cap's tanh is formed from one
/// exp (within 2e-7 of tanh, far below the 16-bit rounding of what follows):
/// with CUDA's own tanh, ptxas spills a register around it on sm_90.
#[cube]
#[allow(clippy::too_many_arguments)]
fn masked_score(dot: f32, t: u32, start: u32, end: u32, scale: f32, cap: f32, #[comptime] capped: bool) -> f32 {
    let mut s = f32::new(MASKED);
    if t >= start && t < end {
        s = dot * scale;
        if capped {
            let x = s / cap;
            let e = f32::exp(-2.0 * f32::abs(x));
            let tanh = (1.0 - e) / (1.0 + e);
            s = select(x < 0.0, -tanh, tanh) * cap;
        }
    }
    s
}

/// Prefill attention for the rows of [`Rows`] (see the module's docs), cut
/// as `plan` says: `tiles` holds `F` (the 16-bit type on matrix units, f32
/// rounded to it elsewhere), `sums` f32. The output, `q`'s layout, gets each
/// row's weighted values over the sum of its exponentials.
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
fn attention_tiles<F: Float>(
    q: &Array<f32>,
    k: &Array<f32>,
    k_words: &Array<u32>,
    v: &Array<f32>,
    v_words: &Array<u32>,
    out: &mut Array<f32>,
    ranges: &Array<u32>,
    rows: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    scale: f32,
    cap: f32,
    #[comptime] plan: TilePlan,
    #[comptime] capped: bool,
    #[comptime] half_kv: bool,
    #[comptime] bf16: bool,
    #[comptime] gaps: bool,
) {
    let cube_rows = comptime!(plan.cube_rows());
    let row_units = comptime!(plan.row_units());
    let key_tile = comptime!(plan.key_tile);
    let group = heads / kv_heads;
    let cube = cube_index();
    let base = (cube / kv_heads) * cube_rows;
    // Cubes past the last row do nothing; the test is the same for all of a
    // cube's units, so its syncs are reached by all.
    if base < rows * group {
        // One allocation per type, its parts at fixed offsets (`TilePlan`).
        let mut tiles = SharedMemory::<F>::new_aligned(comptime!(plan.tiles_len()) as usize, 128usize);
        let mut sums = SharedMemory::<f32>::new_aligned(comptime!(plan.sums_len()) as usize, 128usize);
        let unit = UNIT_POS_X;
        // The cube's keys: from the first any of its rows sees to the last.
        let first_row = base / group;
        let last_row = min((base + cube_rows - 1) / group, rows - 1);
        let mut lo = ranges[(2 * first_row) as usize];
        let mut hi = ranges[(2 * first_row + 1) as usize];
        for r in first_row + 1..last_row + 1 {
            lo = min(lo, ranges[(2 * r) as usize]);
            hi = max(hi, ranges[(2 * r + 1) as usize]);
        }
        let at = Rows {
            base,
            rows,
            group,
            heads,
            kv_h: cube % kv_heads,
            kv_heads,
            head_dim,
            hi,
        };
        // The row whose softmax this unit shares, and its keys.
        let row = unit / row_units;
        let part = unit % row_units;
        let mut start = 0u32;
        let mut end = 0u32;
        if base + row < rows * group {
            let r = (base + row) / group;
            start = ranges[(2 * r) as usize];
            end = ranges[(2 * r + 1) as usize];
        }
        if plan.matrix {
            let dims = comptime!(plan.dims);
            let mut i = unit;
            while i < cube_rows * dims {
                let value = query_at(q, at, i / dims, i % dims, bf16);
                tiles[(comptime!(plan.queries_at()) + i) as usize] = F::cast_from(value);
                i += UNITS;
            }
        }

        // The first pass: each row's largest score.
        let mut most = f32::new(MASKED);
        let mut t0 = lo;
        while t0 < hi {
            score_tile::<F>(&mut tiles, &mut sums, q, k, k_words, at, t0, plan, half_kv, bf16);
            #[unroll]
            for jj in 0..comptime!(key_tile / row_units) {
                let j = part + jj * row_units;
                let dot = sums[(row * key_tile + j) as usize];
                most = f32::max(most, masked_score(dot, t0 + j, start, end, scale, cap, capped));
            }
            sync_cube();
            t0 += key_tile;
        }
        let partial_at = comptime!(plan.partial_at());
        sums[(partial_at + unit) as usize] = most;
        sync_cube();
        let mut row_most = f32::new(MASKED);
        #[unroll]
        for i in 0..row_units {
            row_most = f32::max(row_most, sums[(partial_at + row * row_units + i) as usize]);
        }
        sync_cube();

        // The second: the weighted values, and the sum of the weights. On
        // matrix units a plane's weighted values stay in its accumulators;
        // elsewhere each unit keeps its share of them in their places in
        // `out`.
        let mut weighted = Sequence::<cmma::Matrix<f32>>::new();
        if plan.matrix {
            #[unroll]
            for _ in 0..comptime!(plan.plane_dims() / FRAG) {
                let acc = fragment::<f32>(cmma::MatrixIdent::Accumulator, cmma::MatrixLayout::Undefined);
                cmma::fill(&acc, 0.0f32);
                weighted.push(acc);
            }
        } else {
            own_share::<F>(
                out,
                &tiles,
                &sums,
                v,
                v_words,
                at,
                lo,
                plan,
                Share::Clear,
                gaps,
                half_kv,
                bf16,
            );
        }
        let mut sum = 0.0f32;
        t0 = lo;
        while t0 < hi {
            let seen_at = comptime!(plan.seen_at());
            if gaps {
                if unit < key_tile {
                    let t = t0 + unit;
                    let mut seen = 0.0f32;
                    for r in first_row..last_row + 1 {
                        if t >= ranges[(2 * r) as usize] && t < ranges[(2 * r + 1) as usize] {
                            seen = 1.0;
                        }
                    }
                    sums[(seen_at + unit) as usize] = seen;
                }
                sync_cube();
            }
            if plan.matrix {
                let values_at = comptime!(plan.values_at());
                stage_keys::<F>(
                    &mut tiles, v, v_words, &sums, at, t0, values_at, plan, gaps, half_kv, bf16,
                );
            }
            score_tile::<F>(&mut tiles, &mut sums, q, k, k_words, at, t0, plan, half_kv, bf16);
            #[unroll]
            for jj in 0..comptime!(key_tile / row_units) {
                let j = part + jj * row_units;
                let t = t0 + j;
                let mut p = 0.0f32;
                if t >= start && t < end {
                    let dot = sums[(row * key_tile + j) as usize];
                    p = f32::exp(masked_score(dot, t, start, end, scale, cap, capped) - row_most);
                }
                sum += p;
                tiles[(row * key_tile + j) as usize] = F::cast_from(rounded_to_half(p, bf16));
            }
            sync_cube();
            if plan.matrix {
                values_product::<F>(&tiles, &weighted, plan);
            } else {
                own_share::<F>(
                    out,
                    &tiles,
                    &sums,
                    v,
                    v_words,
                    at,
                    t0,
                    plan,
                    Share::Weigh,
                    gaps,
                    half_kv,
                    bf16,
                );
            }
            sync_cube();
            t0 += key_tile;
        }
        let totals_at = comptime!(plan.totals_at());
        sums[(partial_at + unit) as usize] = sum;
        sync_cube();
        if part == 0 {
            let mut total = 0.0f32;
            #[unroll]
            for i in 0..row_units {
                total += sums[(partial_at + row * row_units + i) as usize];
            }
            sums[(totals_at + row) as usize] = total;
        }
        sync_cube();

        // Each row's weighted values over its sum, into its place in `out`.
        if plan.matrix {
            // A plane's fragment passes through its own 16×16 of the scores'
            // room (free now) on its way out.
            let plane = unit / LANES;
            let lane = unit % LANES;
            let stage = plane * FRAG * FRAG;
            let plane_dims = comptime!(plan.plane_dims());
            #[unroll]
            for f in 0..comptime!(plan.plane_dims() / FRAG) {
                store_fragment(&mut sums, stage, weighted.index(f as usize));
                sync_cube();
                #[unroll]
                for e in 0..comptime!(FRAG * FRAG / LANES) {
                    let i = e * LANES + lane;
                    let r = (plane / plan.col_splits) * FRAG + i / FRAG;
                    let c = (plane % plan.col_splits) * plane_dims + f * FRAG + i % FRAG;
                    if in_pass(at, r, c) {
                        let value = sums[(stage + i) as usize] / sums[(totals_at + r) as usize];
                        out[out_index(at, r, c) as usize] = value;
                    }
                }
                sync_cube();
            }
        } else {
            own_share::<F>(
                out,
                &tiles,
                &sums,
                v,
                v_words,
                at,
                lo,
                plan,
                Share::Divide,
                gaps,
                half_kv,
                bf16,
            );
        }
    }
}

/// Whether element `c` of the cube's row `r` is one of the pass's: within
/// the head's dimensions and the pass's rows.
#[cube]
fn in_pass(at: Rows, r: u32, c: u32) -> bool {
    at.base + r < at.rows * at.group && c < at.head_dim
}

/// Where element `c` of the cube's row `r` lies in `q` and `out`.
#[cube]
fn out_index(at: Rows, r: u32, c: u32) -> u32 {
    let vr = at.base + r;
    let h = at.kv_h * at.group + vr % at.group;
    ((vr / at.group) * at.heads + h) * at.head_dim + c
}

/// Keys (or values) `t0..t0 + key_tile`, rounded, into `tiles` at `place`
/// as `[key_tile, dims]` by all the cube's units (see [`key_at`]).
#[allow(clippy::too_many_arguments)]
#[cube]
fn stage_keys<F: Float>(
    tiles: &mut SharedMemory<F>,
    values: &Array<f32>,
    words: &Array<u32>,
    sums: &SharedMemory<f32>,
    at: Rows,
    t0: u32,
    #[comptime] place: u32,
    #[comptime] plan: TilePlan,
    #[comptime] gaps: bool,
    #[comptime] half_kv: bool,
    #[comptime] bf16: bool,
) {
    let dims = comptime!(plan.dims);
    let seen_at = comptime!(plan.seen_at());
    let mut i = UNIT_POS_X;
    while i < comptime!(plan.key_tile * plan.dims) {
        let value = key_at(
            values,
            words,
            sums,
            at,
            t0,
            t0 + i / dims,
            i % dims,
            seen_at,
            gaps,
            half_kv,
            bf16,
        );
        tiles[(place + i) as usize] = F::cast_from(value);
        i += UNITS;
    }
}

/// The tile of keys from `t0` staged (on matrix units) and scored into
/// `sums` by [`scores_product`], each step behind a barrier.
#[allow(clippy::too_many_arguments)]
#[cube]
fn score_tile<F: Float>(
    tiles: &mut SharedMemory<F>,
    sums: &mut SharedMemory<f32>,
    q: &Array<f32>,
    k: &Array<f32>,
    k_words: &Array<u32>,
    at: Rows,
    t0: u32,
    #[comptime] plan: TilePlan,
    #[comptime] half_kv: bool,
    #[comptime] bf16: bool,
) {
    if plan.matrix {
        let keys_at = comptime!(plan.keys_at());
        stage_keys::<F>(tiles, k, k_words, sums, at, t0, keys_at, plan, false, half_kv, bf16);
    }
    sync_cube();
    scores_product::<F>(tiles, sums, q, k, k_words, at, t0, plan, half_kv, bf16);
    sync_cube();
}

/// A plane's scores of its block of 16 rows against the tile of keys from
/// `t0`, into `sums` as `[cube_rows, key_tile]`: on matrix units from the
/// staged queries and keys, the planes that share a block taking every
/// `col_splits`-th fragment of keys; elsewhere each unit a share of the
/// block's scores, its rounded inputs read where they lie.
#[allow(clippy::too_many_arguments)]
#[cube]
fn scores_product<F: Float>(
    tiles: &SharedMemory<F>,
    sums: &mut SharedMemory<f32>,
    q: &Array<f32>,
    k: &Array<f32>,
    k_words: &Array<u32>,
    at: Rows,
    t0: u32,
    #[comptime] plan: TilePlan,
    #[comptime] half_kv: bool,
    #[comptime] bf16: bool,
) {
    let plane = UNIT_POS_X / LANES;
    let block = plane / plan.col_splits;
    let split = plane % plan.col_splits;
    let key_tile = comptime!(plan.key_tile);
    if plan.matrix {
        let dims = comptime!(plan.dims);
        let tiles_len = comptime!(plan.tiles_len()) as usize;
        let queries = fragment::<F>(cmma::MatrixIdent::A, cmma::MatrixLayout::RowMajor);
        // Keys `[key_tile, dims]` row-major are the `[dims, key_tile]`
        // right-hand side column-major.
        let keys = fragment::<F>(cmma::MatrixIdent::B, cmma::MatrixLayout::ColMajor);
        let scores = fragment::<f32>(cmma::MatrixIdent::Accumulator, cmma::MatrixLayout::Undefined);
        let mut kf = split;
        while kf < comptime!(plan.key_tile / FRAG) {
            cmma::fill(&scores, 0.0f32);
            // A loop, not unrolled: unrolled over wide heads, ptxas spills.
            let mut kk = 0u32;
            while kk < comptime!(plan.dims / FRAG) {
                let a = comptime!(plan.queries_at()) + block * FRAG * dims + kk * FRAG;
                cmma::load(&queries, &tiles.slice(a as usize, tiles_len), u32::new(dims as i64));
                let b = comptime!(plan.keys_at()) + kf * FRAG * dims + kk * FRAG;
                cmma::load(&keys, &tiles.slice(b as usize, tiles_len), u32::new(dims as i64));
                cmma::execute::<F, F, f32, f32>(&queries, &keys, &scores, &scores);
                kk += 1;
            }
            let at = block * FRAG * key_tile + kf * FRAG;
            let mut place = sums.slice_mut(at as usize, comptime!(plan.partial_at()) as usize);
            cmma::store(
                &mut place,
                &scores,
                u32::new(key_tile as i64),
                cmma::MatrixLayout::RowMajor,
            );
            kf += plan.col_splits;
        }
    } else {
        let mut f = split * LANES + UNIT_POS_X % LANES;
        while f < FRAG * key_tile {
            let r = block * FRAG + f / key_tile;
            let t = t0 + f % key_tile;
            let mut dot = 0.0f32;
            // Sixteen dimensions a loop iteration (see `TilePlan::most_keys_on_units`).
            let mut c0 = 0u32;
            while c0 < comptime!(plan.dims) {
                #[unroll]
                for cc in 0..FRAG {
                    let c = c0 + cc;
                    let key = key_at(k, k_words, sums, at, t0, t, c, 0u32, false, half_kv, bf16);
                    dot += query_at(q, at, r, c, bf16) * key;
                }
                c0 += FRAG;
            }
            sums[(r * key_tile + f % key_tile) as usize] = dot;
            f += LANES * plan.col_splits;
        }
    }
}

/// On matrix units, a plane's weighted values plus its block's
/// probabilities times the staged values, in its accumulators.
#[cube]
fn values_product<F: Float>(
    tiles: &SharedMemory<F>,
    weighted: &Sequence<cmma::Matrix<f32>>,
    #[comptime] plan: TilePlan,
) {
    let plane = UNIT_POS_X / LANES;
    let block = plane / plan.col_splits;
    let split = plane % plan.col_splits;
    let dims = comptime!(plan.dims);
    let key_tile = comptime!(plan.key_tile);
    let tiles_len = comptime!(plan.tiles_len()) as usize;
    let probs = fragment::<F>(cmma::MatrixIdent::A, cmma::MatrixLayout::RowMajor);
    let values = fragment::<F>(cmma::MatrixIdent::B, cmma::MatrixLayout::RowMajor);
    // Each fragment of probabilities is loaded once for all the plane's
    // fragments of values; the loop over it is not unrolled (fewer
    // registers live).
    let mut kk = 0u32;
    while kk < comptime!(plan.key_tile / FRAG) {
        let a = block * FRAG * key_tile + kk * FRAG;
        cmma::load(&probs, &tiles.slice(a as usize, tiles_len), u32::new(key_tile as i64));
        #[unroll]
        for f in 0..comptime!(plan.plane_dims() / FRAG) {
            let col = split * comptime!(plan.plane_dims()) + f * FRAG;
            let b = comptime!(plan.values_at()) + kk * FRAG * dims + col;
            cmma::load(&values, &tiles.slice(b as usize, tiles_len), u32::new(dims as i64));
            let acc = weighted.index(f as usize);
            cmma::execute::<F, F, f32, f32>(&probs, &values, acc, acc);
        }
        kk += 1;
    }
}

/// What [`own_share`] does to a unit's share of the weighted values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Share {
    /// Zeroes it.
    Clear,
    /// Adds the tile's probabilities times its values.
    Weigh,
    /// Divides it by its row's sum.
    Divide,
}

/// Elsewhere than on matrix units, each unit keeps its share of its plane's
/// weighted values (elements `lane`, `lane + 32`, ... of the plane's `[16,
/// plane_dims]`) in their places in `out`, and `step` says what to do to it.
#[allow(clippy::too_many_arguments)]
#[cube]
fn own_share<F: Float>(
    out: &mut Array<f32>,
    tiles: &SharedMemory<F>,
    sums: &SharedMemory<f32>,
    v: &Array<f32>,
    v_words: &Array<u32>,
    at: Rows,
    t0: u32,
    #[comptime] plan: TilePlan,
    #[comptime] step: Share,
    #[comptime] gaps: bool,
    #[comptime] half_kv: bool,
    #[comptime] bf16: bool,
) {
    let plane = UNIT_POS_X / LANES;
    let plane_dims = comptime!(plan.plane_dims());
    let key_tile = comptime!(plan.key_tile);
    let seen_at = comptime!(plan.seen_at());
    let totals_at = comptime!(plan.totals_at());
    let mut f = UNIT_POS_X % LANES;
    while f < FRAG * plane_dims {
        let r = (plane / plan.col_splits) * FRAG + f / plane_dims;
        let c = (plane % plan.col_splits) * plane_dims + f % plane_dims;
        if in_pass(at, r, c) {
            let i = out_index(at, r, c) as usize;
            if comptime!(step == Share::Clear) {
                out[i] = 0.0;
            } else if comptime!(step == Share::Weigh) {
                let mut total = out[i];
                #[unroll]
                for j in 0..key_tile {
                    let value = key_at(v, v_words, sums, at, t0, t0 + j, c, seen_at, gaps, half_kv, bf16);
                    total += f32::cast_from(tiles[(r * key_tile + j) as usize]) * value;
                }
                out[i] = total;
            } else {
                out[i] = out[i] / sums[(totals_at + r) as usize];
            }
        }
        f += LANES;
    }
}

/// Attention of `q: [rows, heads · head_dim]` over `k`, `v`, row `s`
/// seeing keys `ranges[s]`, its products' inputs rounded to `half` (F16 or
/// BF16), into `out` (`q`'s shape), in one launch. The caller has checked
/// the shapes; `plan` is [`tile_plan`]'s.
pub(crate) fn attend_in_tiles<R: Runtime>(
    client: &ComputeClient<R>,
    plan: TilePlan,
    q: &Tensor,
    (k, v): (KeysValues, KeysValues),
    shape: AttentionShape,
    ranges: &KeyRanges,
    (half, out): (WeightType, &Tensor),
) {
    let AttentionShape {
        heads,
        kv_heads,
        head_dim,
        scale,
        softcap,
        ..
    } = shape;
    let rows = q.rows();
    let blocks = (rows * (heads / kv_heads)).div_ceil(plan.cube_rows() as usize);
    let (k_values, k_words) = k.args(q);
    let (v_values, v_words) = v.args(q);
    let bf16 = half == WeightType::BF16;
    // A key between two rows' ranges that no row sees may never have been
    // written: those are read as zeros, where any gap lies between ranges.
    let gaps = !ranges.covers_span();
    macro_rules! launch {
        ($tile:ty) => {
            attention_tiles::launch::<$tile, R>(
                client,
                cube_grid(blocks * kv_heads),
                CubeDim::new_1d(UNITS),
                q.arg(),
                k_values,
                k_words,
                v_values,
                v_words,
                out.arg(),
                ranges.arg(),
                rows as u32,
                heads as u32,
                kv_heads as u32,
                head_dim as u32,
                scale,
                softcap.unwrap_or(1.0),
                plan,
                softcap.is_some(),
                k.half(),
                bf16,
                gaps,
            )
        };
    }
    crate::profile::launch(client, "attention_tiles", || match (plan.matrix, bf16) {
        (false, _) => launch!(f32),
        (true, true) => launch!(half::bf16),
        (true, false) => launch!(half::f16),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_fit_the_shared_memory_of_each_kind_of_device() {
        for head_dim in [8, 64, 80, 96, 128, 256, 512] {
            // The 16-bit tiles of matrix units, or f32 elsewhere; sm_80's
            // limit, or a CPU adapter's.
            for (matrix, tile_bytes, limit) in [(true, 2, 163 << 10), (false, 4, 32 << 10)] {
                let plan = TilePlan::new(head_dim, matrix).unwrap();
                let bytes = plan.tiles_len() * tile_bytes + plan.sums_len() * 4;
                assert!(bytes <= limit, "heads of {head_dim}, matrix {matrix}: {bytes} bytes");
                // Every unit shares one row's softmax, and every plane
                // holds whole fragments, at most 128 dimensions.
                assert_eq!(UNITS % plan.cube_rows(), 0);
                assert!(plan.plane_dims().is_multiple_of(FRAG) && plan.plane_dims() <= 128);
                assert!(plan.dims as usize >= head_dim);
            }
        }
        assert_eq!(TilePlan::new(MAX_DIMS + 1, true), None);
        // The limits tests/kernels.rs runs a pass at, and one key past.
        assert_eq!(TilePlan::new(64, false).unwrap().most_keys_on_units(false), 8_192);
        assert_eq!(TilePlan::new(128, false).unwrap().most_keys_on_units(false), 4_832);
    }
}
