//! Reading a [`Weight`]'s stored values on the device: one `#[cube]`
//! function per layout, each written as ggml's `dequantize_row_*`
//! (ggml-quants.c) computes it, operation for operation, so the f32 values
//! equal the plain-Rust twins' bit for bit. The decode products and the
//! gather below ([`dequantize_rows`], [`embedding_weight`]) all decode
//! through [`decode_run`].
//!
//! The buffer is u32 words; a value's bytes may sit at any byte offset
//! (a Q8_0 block is 34 bytes, a Q6_K block 210), so every read goes
//! through [`words_from`], [`byte_at`] or [`half_at`].

use std::ops::Range;

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::cast::f16_bits_to_f32;
use crate::error::check_shape;
use crate::grid::{grid_1d, linear_pos};
use crate::{KernelError, Picked, Tensor, Weight, WeightType};
use cleave_types::{IQ4_NL_LEVELS, MXFP4_LEVELS};

/// The byte at byte `at`.
#[cube]
fn byte_at(words: &Array<u32>, at: u32) -> u32 {
    (words[(at / 4) as usize] >> ((at % 4) * 8)) & 0xff
}

/// The 16 bits at byte `at`, which is even: every half in these layouts
/// is, since every block length in bytes is.
#[cube]
fn half_at(words: &Array<u32>, at: u32) -> u32 {
    (words[(at / 4) as usize] >> ((at % 4) * 8)) & 0xffff
}

/// The f16 at byte `at`, as f32 (ggml's `GGML_FP16_TO_FP32`, exact).
#[cube]
fn f16_at<F: Float>(words: &Array<u32>, at: u32) -> F {
    f16_bits_to_f32::<F>(half_at(words, at))
}

/// Byte `i` (0..4) of `word` as the i8 it stores.
#[cube]
fn signed_byte<F: Float>(word: u32, i: u32) -> F {
    // Flipping the sign bit and subtracting 128 sign-extends a byte.
    F::cast_from(i32::cast_from(((word >> (8 * i)) & 0xff) ^ 0x80) - 128)
}

/// Values `v..v + group_len` of the row starting at byte `row`, into
/// `out[0..group_len]`; `v` is a multiple of the group length, so the
/// values share a block and, for the block types, a scale.
#[cube]
pub(crate) fn decode<F: Float>(words: &Array<u32>, row: u32, v: u32, out: &mut Array<F>, #[comptime] ty: WeightType) {
    decode_run::<F>(words, row, v, out, 0u32, comptime!(ty.traits().decode_group), ty);
}

/// Values `v..v + len` of the row starting at byte `row`, into
/// `out[at..at + len]`, with as few loads as the layout allows: f32 one
/// value a word (the row word-aligned), the half types two values a word
/// (`len` and `v` even and the row word-aligned, or `len` 1 anywhere), the
/// block types a word of quants per four values and their scale once (`len`
/// a multiple of four up to 16 and `v` of `len`, so that the values share
/// one: Q6_K keeps one per 16).
#[cube]
pub(crate) fn decode_run<F: Float>(
    words: &Array<u32>,
    row: u32,
    v: u32,
    out: &mut Array<F>,
    at: u32,
    #[comptime] len: u32,
    #[comptime] ty: WeightType,
) {
    let halves = comptime!(ty == WeightType::F16 || ty == WeightType::BF16);
    if comptime!(ty == WeightType::F32) {
        let first = row / 4 + v;
        #[unroll]
        for i in 0..len {
            out[(at + i) as usize] = F::reinterpret(words[(first + i) as usize]);
        }
    } else if comptime!(halves && len == 1) {
        out[at as usize] = half_value::<F>(half_at(words, row + 2 * v), ty);
    } else if comptime!(halves) {
        let first = (row + v * 2) / 4;
        #[unroll]
        for i in 0..len / 2 {
            let word = words[(first + i) as usize];
            out[(at + 2 * i) as usize] = half_value::<F>(word & 0xffff, ty);
            out[(at + 2 * i + 1) as usize] = half_value::<F>(word >> 16, ty);
        }
    } else {
        let block_len = comptime!(ty.block_len() as u32);
        let block_bytes = comptime!(ty.block_bytes() as u32);
        let block = row + v / block_len * block_bytes;
        let j = v % block_len;
        let (step, offset) = block_scale::<F>(words, block, j, ty);
        // The run's quants (and high bits) are consecutive bytes, each
        // stream's read as whole words at once.
        let quads = comptime!(len / 4);
        let (quants_at, quants_shift) = quants_at(block, j, ty);
        let mut quants = Array::<u32>::new(quads as usize);
        words_from(words, quants_at, &mut quants, quads, ty);
        let mut high = Array::<u32>::new(quads as usize);
        let mut high_shift = 0u32;
        let high_bytes = comptime!(ty == WeightType::Q5_K || ty == WeightType::Q6_K || ty == WeightType::Q3_K);
        let high_word = comptime!(ty == WeightType::Q5_0 || ty == WeightType::Q5_1);
        if comptime!(high_bytes) {
            let (high_at, shift) = high_bits_at(block, j, ty);
            words_from(words, high_at, &mut high, quads, ty);
            high_shift = shift;
        } else if comptime!(high_word) {
            // One word holds the block's 32 fifth bits, value j's at bit j:
            // each four values take the next four bits.
            // They are the four bytes before the nibbles.
            let mut qh = Array::<u32>::new(1usize);
            words_from(words, block + comptime!(nibbles_offset(ty) - 4), &mut qh, 1u32, ty);
            #[unroll]
            for q in 0..quads {
                high[q as usize] = qh[0] >> (j + 4 * q);
            }
        }
        #[unroll]
        for q in 0..quads {
            let bits = (quants[q as usize] >> quants_shift, high[q as usize] >> high_shift);
            quad::<F>(bits, step, offset, out, at + 4 * q, ty);
        }
    }
}

/// `count` words of the bytes from byte `at` on, into `out`. A block type
/// whose blocks are whole words starts every stream on one, so a load a
/// word; the others' may start at any byte, and take one load more, each
/// word then pieced from two: no branch on the alignment, whose two sides
/// llvmpipe would both run for a vector of rows at mixed alignments.
#[cube]
fn words_from(words: &Array<u32>, at: u32, out: &mut Array<u32>, #[comptime] count: u32, #[comptime] ty: WeightType) {
    let first = at / 4;
    if comptime!(ty.block_bytes().is_multiple_of(4)) {
        #[unroll]
        for i in 0..count {
            out[i as usize] = words[(first + i) as usize];
        }
    } else {
        let shift = (at % 4) * 8;
        // The word after the last: within the buffer, and unused where
        // `at` is aligned, as every word of the stream then is whole.
        let mut next = words[first as usize];
        #[unroll]
        for i in 0..count {
            let word = next;
            next = words[min(first + i + 1, words.len() as u32 - 1) as usize];
            out[i as usize] = select(shift == 0, word, (word >> shift) | (next << ((32 - shift) % 32)));
        }
    }
}

/// The f16 or bf16 (`ty`) whose bits are `bits`, as f32.
#[cube]
fn half_value<F: Float>(bits: u32, #[comptime] ty: WeightType) -> F {
    if comptime!(ty == WeightType::BF16) {
        F::reinterpret(bits << 16)
    } else {
        f16_bits_to_f32::<F>(bits)
    }
}

/// The scale of value `j` of the block at byte `block`, as (step, offset)
/// for [`quad`]: what ggml computes once per block or sub-block.
///
/// - `block_q8_0`: d (f16), 32 × i8; y = q·d. Step d.
/// - `block_q4_0`: d (f16), 16 bytes; y = (q − 8)·d. Step d.
/// - `block_q4_K`: d, dmin (f16), 12 bytes of 6-bit scales and mins, 128
///   bytes of nibbles; y = d·scale·q − dmin·min over each sub-block of 32
///   values. Step d·scale, offset dmin·min. `block_q5_K` the same.
/// - `block_q6_K`: 128 bytes `ql`, 64 bytes `qh`, 16 × i8 scales (one per
///   16 values), d (f16); y = d·scale·(q − 32). Step d·scale.
/// - `block_q4_1`, `block_q5_1`: d, m (f16); y = q·d + m. Step d, offset
///   −m. `block_q5_0`, `block_iq4_nl`: d (f16). Step d.
/// - `block_mxfp4`: an e8m0 byte. Step half its power of two.
/// - `block_q2_K`: a byte per 16 values, a 4-bit scale and min; d, dmin
///   (f16) last. Step d·scale, offset dmin·min.
/// - `block_q3_K`: sixteen 6-bit scales packed in 12 bytes (scale `s`: low
///   4 bits in byte `s % 8`, high nibble from s = 8; high 2 bits in byte
///   `8 + s % 4`, bits `2·(s / 4)`), d (f16) last. Step d·(scale − 32).
/// - `block_iq4_xs`: d (f16), 16 bits of the scales' high pairs, 4 bytes
///   of their low nibbles, a scale per 32 values. Step d·(scale − 32).
#[cube]
fn block_scale<F: Float>(words: &Array<u32>, block: u32, j: u32, #[comptime] ty: WeightType) -> (F, F) {
    let k_quants = comptime!(ty == WeightType::Q4_K || ty == WeightType::Q5_K);
    let with_min = comptime!(ty == WeightType::Q4_1 || ty == WeightType::Q5_1);
    // The block's f16 scales, where the type table says: d, then the min's
    // scale (dmin, or Q4_1's and Q5_1's m) where there is one.
    let d_at = comptime!(ty.traits().scale_offsets.first().map_or(0, |&at| at as u32));
    let min_at = comptime!(ty.traits().scale_offsets.get(1).map_or(0, |&at| at as u32));
    let mut step = if comptime!(ty == WeightType::MXFP4) {
        F::reinterpret(e8m0_half_bits(byte_at(words, block)))
    } else {
        f16_at::<F>(words, block + d_at)
    };
    let mut offset = F::new(0.0);
    if comptime!(with_min) {
        // y = q·d + m, as q·d − (−m), which rounds alike.
        offset = -f16_at::<F>(words, block + min_at);
    } else if comptime!(k_quants) {
        let packed = scale_min_k4(words, block + 4, 2 * (j / 64) + (j / 32) % 2);
        step *= F::cast_from(packed & 0xff);
        offset = f16_at::<F>(words, block + min_at) * F::cast_from(packed >> 8);
    } else if comptime!(ty == WeightType::Q6_K) {
        let at = block + 192 + 8 * (j / 128) + (j % 32) / 16 + 2 * ((j % 128) / 32);
        step *= signed_byte::<F>(byte_at(words, at), 0);
    } else if comptime!(ty == WeightType::Q2_K) {
        let sc = byte_at(words, block + j / 16);
        step *= F::cast_from(sc & 0xf);
        offset = f16_at::<F>(words, block + min_at) * F::cast_from(sc >> 4);
    } else if comptime!(ty == WeightType::Q3_K) {
        let s = j / 16;
        let low = (byte_at(words, block + 96 + s % 8) >> (4 * (s / 8))) & 0xf;
        let high = (byte_at(words, block + 104 + s % 4) >> (2 * (s / 4))) & 3;
        step *= F::cast_from(i32::cast_from(low | (high << 4)) - 32);
    } else if comptime!(ty == WeightType::IQ4_XS) {
        let ib = j / 32;
        let low = (byte_at(words, block + 4 + ib / 2) >> (4 * (ib % 2))) & 0xf;
        let high = (half_at(words, block + 2) >> (2 * ib)) & 3;
        step *= F::cast_from(i32::cast_from(low | (high << 4)) - 32);
    }
    (step, offset)
}

/// Where the quants of values `j..` of the block at byte `block` start,
/// and how far their words are shifted down to put value `j` in the low
/// bits of the first byte.
///
/// Q8_0: one i8 a value after d. Q4_0: value j < 16 is the low nibble of
/// byte j, value j ≥ 16 the high nibble of byte j − 16 (the other 32-value
/// types the same after their scales and fifth bits). Q4_K: each run of
/// 32 bytes holds two sub-blocks of 32 values, low nibbles first (Q5_K the
/// same after its 32 bytes of fifth bits). Q6_K: each half of 128 values
/// takes 64 bytes of `ql`; its quarter `q` takes value `l`'s low bits from
/// `ql[l + 32·(q % 2)]`, the high nibble from quarter 2 on. Q2_K and Q3_K:
/// each half of 128 values takes 32 bytes, its quarter `q` bits `2q..2q+2`
/// of byte `l`. IQ4_XS: 16 bytes per 32 values, as Q4_0's.
#[cube]
fn quants_at(block: u32, j: u32, #[comptime] ty: WeightType) -> (u32, u32) {
    let mut at = block;
    let mut shift = 0u32;
    match ty {
        WeightType::F32 => {}
        WeightType::F16 => {}
        WeightType::BF16 => {}
        WeightType::Q8_0 => at = block + 2 + j,
        WeightType::Q4_0
        | WeightType::Q4_1
        | WeightType::Q5_0
        | WeightType::Q5_1
        | WeightType::IQ4_NL
        | WeightType::MXFP4 => {
            at = block + comptime!(nibbles_offset(ty)) + j % 16;
            shift = 4 * (j / 16);
        }
        WeightType::Q2_K => {
            at = block + 16 + 32 * (j / 128) + j % 32;
            shift = 2 * ((j % 128) / 32);
        }
        WeightType::Q3_K => {
            at = block + 32 + 32 * (j / 128) + j % 32;
            shift = 2 * ((j % 128) / 32);
        }
        WeightType::IQ4_XS => {
            at = block + 8 + 16 * (j / 32) + j % 16;
            shift = 4 * ((j % 32) / 16);
        }
        WeightType::Q4_K => {
            at = block + 16 + 32 * (j / 64) + j % 32;
            shift = 4 * ((j / 32) % 2);
        }
        WeightType::Q5_K => {
            at = block + 48 + 32 * (j / 64) + j % 32;
            shift = 4 * ((j / 32) % 2);
        }
        WeightType::Q6_K => {
            let quarter = (j % 128) / 32;
            at = block + 64 * (j / 128) + 32 * (quarter % 2) + j % 32;
            shift = 4 * (quarter / 2);
        }
    }
    (at, shift)
}

/// Where a 32-value block of nibbles laid out as Q4_0's keeps them: after
/// its scales (and Q5_0's and Q5_1's 4 bytes of fifth bits).
fn nibbles_offset(ty: WeightType) -> u32 {
    match ty {
        WeightType::MXFP4 => 1,
        WeightType::Q4_1 => 4,
        WeightType::Q5_0 => 6,
        WeightType::Q5_1 => 8,
        _ => 2,
    }
}

/// Where Q5_K's fifth bits, Q6_K's high bit pairs or Q3_K's high bits of
/// values `j..` start, and their words' shift. Q5_K: bit `s` of `qh[l]` is
/// the fifth bit of value `l` of sub-block `s`. Q6_K: each half's 32 bytes
/// of `qh` give quarter `q`'s value `l` bits `2q..2q+2` of `qh[l]`. Q3_K:
/// bit `4·half + quarter` of `hmask[l]`.
#[cube]
fn high_bits_at(block: u32, j: u32, #[comptime] ty: WeightType) -> (u32, u32) {
    let l = j % 32;
    let mut at = block + 16 + l;
    let mut shift = 2 * (j / 64) + (j / 32) % 2;
    if comptime!(ty == WeightType::Q6_K) {
        at = block + 128 + 32 * (j / 128) + l;
        shift = 2 * ((j % 128) / 32);
    } else if comptime!(ty == WeightType::Q3_K) {
        at = block + l;
        shift = 4 * (j / 128) + (j % 128) / 32;
    }
    (at, shift)
}

/// Four values from their quants' word and high bits' word (`bits`, each
/// shifted to the values' bits) and their block's scale (`block_scale`),
/// into `out[at..at + 4]`, each as ggml's `dequantize_row_*` forms it.
#[cube]
fn quad<F: Float>(bits: (u32, u32), step: F, offset: F, out: &mut Array<F>, at: u32, #[comptime] ty: WeightType) {
    let (q, high) = bits;
    #[unroll]
    for i in 0..4u32 {
        let byte = (q >> (8 * i)) & 0xff;
        let mut value = F::new(0.0);
        match ty {
            // The float types have no blocks: `decode` and `decode_run`
            // read them without a scale.
            WeightType::F32 => {}
            WeightType::F16 => {}
            WeightType::BF16 => {}
            WeightType::Q8_0 => value = signed_byte::<F>(byte, 0) * step,
            WeightType::Q4_0 => value = F::cast_from(i32::cast_from(byte & 0xf) - 8) * step,
            WeightType::Q4_K | WeightType::Q4_1 => value = step * F::cast_from(byte & 0xf) - offset,
            WeightType::Q5_K => {
                let fifth = ((high >> (8 * i)) & 1) * 16;
                value = step * F::cast_from((byte & 0xf) + fifth) - offset;
            }
            WeightType::Q6_K => {
                let q6 = (byte & 0xf) | (((high >> (8 * i)) & 3) << 4);
                value = step * F::cast_from(i32::cast_from(q6) - 32);
            }
            WeightType::Q5_0 => {
                let q5 = (byte & 0xf) | (((high >> i) & 1) << 4);
                value = F::cast_from(i32::cast_from(q5) - 16) * step;
            }
            WeightType::Q5_1 => {
                let q5 = (byte & 0xf) | (((high >> i) & 1) << 4);
                value = F::cast_from(q5) * step - offset;
            }
            WeightType::IQ4_NL | WeightType::IQ4_XS | WeightType::MXFP4 => {
                value = step * F::cast_from(level(byte & 0xf, ty))
            }
            WeightType::Q2_K => value = step * F::cast_from(byte & 3) - offset,
            WeightType::Q3_K => {
                // A clear high bit takes 4 off.
                let q3 = i32::cast_from(byte & 3) - 4 * i32::cast_from(1 - ((high >> (8 * i)) & 1));
                value = step * F::cast_from(q3);
            }
        }
        out[(at + i) as usize] = value;
    }
}

/// Word `w` of the 16 signed levels of `ty`'s table (IQ4_NL's, which
/// IQ4_XS shares, or MXFP4's) as biased bytes (level + 128), four to a
/// word, so that a kernel picks a level with three selects and a shift,
/// no memory.
fn level_word(ty: WeightType, w: usize) -> u32 {
    let table = if ty == WeightType::MXFP4 {
        MXFP4_LEVELS
    } else {
        IQ4_NL_LEVELS
    };
    (0..4)
        .map(|i| ((table[4 * w + i] as i32 + 128) as u32) << (8 * i))
        .sum()
}

/// Level `q` (0..16) of `ty`'s table.
#[cube]
fn level(q: u32, #[comptime] ty: WeightType) -> i32 {
    let low = select(q < 4, comptime!(level_word(ty, 0)), comptime!(level_word(ty, 1)));
    let high = select(q < 12, comptime!(level_word(ty, 2)), comptime!(level_word(ty, 3)));
    let word = select(q < 8, low, high);
    i32::cast_from((word >> (8 * (q % 4))) & 0xff) - 128
}

/// ggml's `GGML_E8M0_TO_FP32_HALF`: the f32 bits of `2^(e − 128)`.
#[cube]
fn e8m0_half_bits(e: u32) -> u32 {
    select(e < 2, 0x0020_0000u32 << e, (e - 1) << 23)
}

/// ggml's `get_scale_min_k4`: the 6-bit scale (low byte) and min (next
/// byte) of sub-block `sub` (of 8) from the 12 bytes at `at`. Sub-blocks
/// 0-3 keep theirs in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins);
/// sub-blocks 4-7 keep their low 4 bits in bytes 8-11 and their high 2
/// bits in the top bits of bytes 0-7.
#[cube]
fn scale_min_k4(words: &Array<u32>, at: u32, sub: u32) -> u32 {
    // Byte `sub % 4` holds sub-block `sub`'s scale (0-3) or its high bits
    // (4-7); byte `sub % 4 + 4` its min or its min's high bits.
    let first = byte_at(words, at + sub % 4);
    let second = byte_at(words, at + sub % 4 + 4);
    let mut packed = (first & 63) | ((second & 63) << 8);
    if sub >= 4 {
        let low = byte_at(words, at + sub + 4);
        let scale = (low & 0xf) | ((first >> 6) << 4);
        let min = (low >> 4) | ((second >> 6) << 4);
        packed = scale | (min << 8);
    }
    packed
}

/// Row `ids[t] - first_row` of the weight (`listed`; else row `first_id +
/// t`), decoded, into row `t` of `out`, for the rows the weight holds; a
/// unit per group of values.
#[cube(launch)]
fn gather_rows<F: Float>(
    words: &Array<u32>,
    ids: &Array<u32>,
    out: &mut Array<F>,
    first_row: u32,
    rows: u32,
    cols: u32,
    row_bytes: u32,
    units: u32,
    first_id: u32,
    #[comptime] ty: WeightType,
    #[comptime] listed: bool,
) {
    let unit = linear_pos() as u32;
    if unit < units {
        let group = comptime!(ty.traits().decode_group);
        let groups = cols / group;
        let t = unit / groups;
        let v = unit % groups * group;
        let mut id = first_id + t;
        if comptime!(listed) {
            id = ids[t as usize];
        }
        // A table stored in row chunks fills only the rows it holds.
        if id >= first_row && id - first_row < rows {
            let mut values = Array::<F>::new(group as usize);
            decode::<F>(words, (id - first_row) * row_bytes, v, &mut values, ty);
            #[unroll]
            for i in 0..group {
                out[(t * cols + v + i) as usize] = values[i as usize];
            }
        }
    }
}

/// The rows [`gather`] takes: ids listed in a device buffer, or a run of
/// rows from a first one, which needs no buffer (nothing to upload).
enum RowIds {
    Listed(Handle),
    From(u32),
}

/// Launches [`gather_rows`] for `count` rows named by `ids`, the `out`
/// rows in order.
fn gather<R: Runtime>(
    client: &ComputeClient<R>,
    w: &Weight,
    first_row: usize,
    (ids, count): (RowIds, usize),
    out: &Tensor,
) {
    let units = count * w.cols / w.ty.traits().decode_group as usize;
    let (grid, dim) = grid_1d(units);
    let (ids, listed, first_id) = match ids {
        // SAFETY: the buffer holds `count` ids.
        RowIds::Listed(ids) => (unsafe { ArrayArg::from_raw_parts(ids, count) }, true, 0),
        // Unread: bound to the weight's words.
        RowIds::From(first) => (w.words_arg(), false, first),
    };
    crate::profile::launch(client, "gather_rows", || {
        gather_rows::launch::<f32, R>(
            client,
            grid,
            dim,
            w.words_arg(),
            ids,
            out.arg(),
            first_row as u32,
            w.rows as u32,
            w.cols as u32,
            w.row_bytes() as u32,
            units as u32,
            first_id,
            w.ty,
            listed,
        );
    });
}

/// Rows `rows` of `w` as f32: a `[rows.len(), cols]` tensor.
pub fn dequantize_rows<R: Runtime>(
    client: &ComputeClient<R>,
    w: &Weight,
    rows: Range<usize>,
) -> Result<Tensor, KernelError> {
    if rows.start > rows.end || rows.end > w.rows {
        return Err(KernelError::Weight {
            op: "dequantize_rows",
            problem: format!("rows {rows:?} asked of a {} weight of {} rows", w.ty, w.rows),
        });
    }
    let out = Tensor::empty(client, &[rows.len(), w.cols]);
    if !out.is_empty() {
        gather(client, w, 0, (RowIds::From(rows.start as u32), rows.len()), &out);
    }
    Ok(out)
}

/// Gathers rows of an embedding table stored as `table`'s type into
/// `out: [ids.len(), cols]`, as f32.
///
/// `table` holds rows `first_row..first_row + table.rows` of the full
/// table; ids outside that range are left for the other chunks to fill.
pub fn embedding_weight<R: Runtime>(
    client: &ComputeClient<R>,
    table: &Weight,
    first_row: usize,
    ids: &[u32],
    out: &Tensor,
) -> Result<(), KernelError> {
    gather_ids(client, table, first_row, ids.len(), out, || {
        crate::profile::upload(client, u32::as_bytes(ids))
    })
}

/// [`embedding_weight`] for the ids a pick left on the device.
pub fn embedding_weight_picked<R: Runtime>(
    client: &ComputeClient<R>,
    table: &Weight,
    first_row: usize,
    ids: &Picked,
    out: &Tensor,
) -> Result<(), KernelError> {
    gather_ids(client, table, first_row, ids.len(), out, || ids.handle())
}

/// Checks `out: [count, cols]` and gathers into it the rows of the `count`
/// ids in the buffer `ids` gives (asked for only when there are rows).
fn gather_ids<R: Runtime>(
    client: &ComputeClient<R>,
    table: &Weight,
    first_row: usize,
    count: usize,
    out: &Tensor,
    ids: impl FnOnce() -> Handle,
) -> Result<(), KernelError> {
    let cols = table.cols;
    check_shape(
        out.shape == [count, cols],
        "embedding_weight",
        "out",
        &out.shape,
        || format!("[{count}, {cols}]"),
    )?;
    if !out.is_empty() {
        gather(client, table, first_row, (RowIds::Listed(ids()), count), out);
    }
    Ok(())
}
