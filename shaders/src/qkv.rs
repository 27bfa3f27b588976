//! A decoder block's q, k and v from one projection's output, in one
//! kernel: each head's values normed (Qwen3's and Gemma 3's per-head
//! norms), rotated ("rotate half", as [`crate::rope`] describes), and k
//! and v written into the KV cache in its type, where separate kernels
//! would each read and write the whole of q and k again.

use cubecl::prelude::*;

use crate::error::check_shape;
use crate::grid::{cube_grid, cube_index};
use crate::kv::f32_to_f16_bits;
use crate::norm::{inverse_rms, ROW_UNITS};
use crate::{KernelError, RopeTable, RowIndex, Tensor, Weight, WeightType};

/// One cube per row and head of `qkv` (q's heads, then k's, then v's).
/// The head is staged in shared memory: normed, then rotated a pair of
/// dimensions per unit, then written out: q's heads to `q`, k's and v's to
/// their cache row, as f32 bits or as f16 pairs (each u32 word whole, so
/// no two units share one). The norm computes exactly what `rms_norm`
/// computes (the same `inverse_rms`), the rotation what transformers'
/// `rotate_half` does with the table's angles.
#[cube(launch)]
fn split_qkv_kernel<F: Float>(
    qkv: &Array<F>,
    cos: &Array<F>,
    sin: &Array<F>,
    positions: &Array<u32>,
    cache_rows: &Array<u32>,
    q_norm: &Array<F>,
    k_norm: &Array<F>,
    q: &mut Array<F>,
    k_cache: &mut Array<u32>,
    v_cache: &mut Array<u32>,
    rows: u32,
    heads: u32,
    kv_heads: u32,
    half: u32,
    eps: f32,
    #[comptime] head_dim: u32,
    #[comptime] norm: bool,
    #[comptime] v_norm: bool,
    #[comptime] f16: bool,
) {
    let units = comptime!(ROW_UNITS);
    let slots = heads + 2 * kv_heads;
    let cube = cube_index();
    if cube < rows * slots {
        let row = cube / slots;
        let slot = cube % slots;
        let base = cube * head_dim;
        let rotated = slot < heads + kv_heads;
        let mut head = SharedMemory::<F>::new(head_dim as usize);
        let mut scale = F::new(1.0);
        // `norm` and `v_norm` are known when the kernel is compiled,
        // `rotated` only when it runs: conditions cubecl expands apart, so
        // they are not merged.
        #[allow(clippy::collapsible_if, clippy::if_same_then_else)]
        if norm {
            if rotated {
                scale = inverse_rms::<F>(qkv, base, head_dim, eps, units, 1u32);
            } else if v_norm {
                scale = inverse_rms::<F>(qkv, base, head_dim, eps, units, 1u32);
            }
        }
        let mut d = UNIT_POS_X;
        while d < head_dim {
            let mut v = qkv[(base + d) as usize];
            if norm {
                if slot < heads {
                    v = v * scale * q_norm[d as usize];
                } else if rotated {
                    v = v * scale * k_norm[d as usize];
                } else if v_norm {
                    v *= scale;
                }
            }
            head[d as usize] = v;
            d += units;
        }
        sync_cube();
        if rotated {
            let at = positions[row as usize] * half;
            let mut i = UNIT_POS_X;
            while i < half {
                let c = cos[(at + i) as usize];
                let s = sin[(at + i) as usize];
                let x1 = head[i as usize];
                let x2 = head[(i + half) as usize];
                head[i as usize] = x1 * c - x2 * s;
                head[(i + half) as usize] = x2 * c + x1 * s;
                i += units;
            }
        }
        sync_cube();
        if slot < heads {
            let out = (row * heads + slot) * head_dim;
            let mut d = UNIT_POS_X;
            while d < head_dim {
                q[(out + d) as usize] = head[d as usize];
                d += units;
            }
        } else {
            let is_key = rotated;
            let mut kv = slot - heads;
            if !is_key {
                kv -= kv_heads;
            }
            let at = (cache_rows[row as usize] * kv_heads + kv) * head_dim;
            if f16 {
                let mut w = UNIT_POS_X;
                while w < head_dim / 2 {
                    let low = f32_to_f16_bits::<F>(head[(2 * w) as usize]);
                    let high = f32_to_f16_bits::<F>(head[(2 * w + 1) as usize]);
                    let word = low | (high << 16);
                    if is_key {
                        k_cache[(at / 2 + w) as usize] = word;
                    } else {
                        v_cache[(at / 2 + w) as usize] = word;
                    }
                    w += units;
                }
            } else {
                let mut d = UNIT_POS_X;
                while d < head_dim {
                    let bits = u32::reinterpret(head[d as usize]);
                    if is_key {
                        k_cache[(at + d) as usize] = bits;
                    } else {
                        v_cache[(at + d) as usize] = bits;
                    }
                    d += units;
                }
            }
        }
    }
}

/// Per-head norm weights for q and k, `[head_dim]` each, and their epsilon.
#[derive(Clone, Copy, Debug)]
pub struct HeadNorms<'a> {
    pub q: &'a Tensor,
    pub k: &'a Tensor,
    pub eps: f32,
    /// v's heads normed too, by no weight (Gemma 4's `v_norm`).
    pub values: bool,
}

/// Where [`split_qkv`] puts a pass's keys and values: rows `rows` of the
/// caches `k` and `v` (`[positions, kv_heads · head_dim]`, f32 or f16).
#[derive(Clone, Copy, Debug)]
pub struct CacheWrite<'a> {
    pub k: &'a Weight,
    pub v: &'a Weight,
    pub rows: &'a RowIndex,
}

/// Splits `qkv: [rows, (heads + 2·kv_heads) · head_dim]`, one projection's
/// output (q's heads, then k's, then v's): q and k normed per head where
/// `norms` are given (and v where they say), then rotated by `table` at
/// `positions` (the table's frequencies cover the first `2 · frequencies`
/// dimensions of a head; the rest pass unrotated); k and v written into
/// `cache`. Without a cache, `qkv` holds q's heads alone (a layer reading
/// the keys and values another layer cached). Returns q, `[rows, heads ·
/// head_dim]` (with `qkv`'s leading dimensions).
pub fn split_qkv<R: Runtime>(
    client: &ComputeClient<R>,
    qkv: &Tensor,
    (heads, kv_heads): (usize, usize),
    (table, positions): (&RopeTable, &RowIndex),
    norms: Option<HeadNorms>,
    cache: Option<CacheWrite>,
) -> Result<Tensor, KernelError> {
    let rows = qkv.rows();
    let kv_heads = if cache.is_some() { kv_heads } else { 0 };
    let slots = heads + 2 * kv_heads;
    let head_dim = qkv.cols() / slots.max(1);
    let half = table.half;
    check_shape(
        heads > 0 && (kv_heads > 0 || cache.is_none()) && qkv.cols() == slots * head_dim && 2 * half <= head_dim,
        "split_qkv",
        "qkv",
        &qkv.shape,
        || format!("[rows, {slots} heads of at least {} dimensions]", 2 * half),
    )?;
    check_shape(
        positions.len() == rows && (positions.max() as usize) < table.positions(),
        "split_qkv",
        "positions",
        &[positions.len(), positions.max() as usize],
        || {
            format!(
                "one per row ({rows}), below {} (the rope table's context)",
                table.positions()
            )
        },
    )?;
    if let Some(cache) = cache {
        check_cache_write(cache, rows, kv_heads * head_dim, head_dim)?;
    }
    if let Some(norms) = norms {
        for (what, t) in [("q norm", norms.q), ("k norm", norms.k)] {
            check_shape(t.shape == [head_dim], "split_qkv", what, &t.shape, || {
                format!("[{head_dim}]")
            })?;
        }
    }
    let q = Tensor::empty(client, &qkv.shape_with_cols(heads * head_dim));
    if rows == 0 {
        return Ok(q);
    }
    // Without norms the kernel never reads those arguments; without a
    // cache it writes none (its arguments are a word it never touches).
    let (q_norm, k_norm, eps) = norms.map_or((qkv, qkv, 0.0), |n| (n.q, n.k, n.eps));
    let unused;
    let (k_cache, v_cache, cache_rows) = match cache {
        Some(c) => (c.k.words_arg(), c.v.words_arg(), c.rows.arg()),
        None => {
            unused = Tensor::empty(client, &[1]);
            (unused.words_arg(), unused.words_arg(), positions.arg())
        }
    };
    let f16 = cache.is_some_and(|c| c.k.ty == WeightType::F16);
    crate::profile::launch(client, "split_qkv", || {
        split_qkv_kernel::launch::<f32, R>(
            client,
            cube_grid(rows * slots),
            CubeDim::new_1d(ROW_UNITS),
            qkv.arg(),
            table.cos.arg(),
            table.sin.arg(),
            positions.arg(),
            cache_rows,
            q_norm.arg(),
            k_norm.arg(),
            q.arg(),
            k_cache,
            v_cache,
            rows as u32,
            heads as u32,
            kv_heads as u32,
            half as u32,
            eps,
            head_dim as u32,
            norms.is_some(),
            norms.is_some_and(|n| n.values),
            f16,
        );
    });
    Ok(q)
}

/// Fails unless `cache` takes `rows` rows of `width` values (heads of
/// `head_dim`): both caches f32, or f16 with an even head dimension.
fn check_cache_write(cache: CacheWrite, rows: usize, width: usize, head_dim: usize) -> Result<(), KernelError> {
    check_shape(
        cache.rows.len() == rows,
        "split_qkv",
        "cache rows",
        &[cache.rows.len()],
        || format!("one per row ({rows})"),
    )?;
    let f16 = cache.k.ty == WeightType::F16;
    for (what, c) in [("k cache", cache.k), ("v cache", cache.v)] {
        let typed = c.ty == cache.k.ty && (c.ty == WeightType::F32 || (f16 && head_dim.is_multiple_of(2)));
        check_shape(
            typed && c.cols == width && (cache.rows.max() as usize) < c.rows,
            "split_qkv",
            what,
            &[c.rows, c.cols],
            || {
                format!(
                    "[> {}, {width}] of f32, or of f16 with an even head dimension, like the other cache",
                    cache.rows.max(),
                )
            },
        )?;
    }
    Ok(())
}
