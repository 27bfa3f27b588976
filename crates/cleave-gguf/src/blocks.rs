//! Plain-Rust dequantization, one function per block layout, each written
//! as ggml's `dequantize_row_*` (ggml-quants.c) computes it, operation for
//! operation, so the f32 results are the same bit for bit. They are the
//! reference the GPU kernels are checked against: kept simple, not fast.

use half::{bf16, f16};

use crate::error::{GgufError, Result};
use cleave_types::{e8m0_half_bits, WeightType, IQ4_NL_LEVELS, MXFP4_LEVELS, QK, QK_K};

// Block sizes as types, so that a block function cannot disagree with
// `block_bytes` about the layout it walks.
const Q8_0_BYTES: usize = WeightType::Q8_0.block_bytes();
const Q4_0_BYTES: usize = WeightType::Q4_0.block_bytes();
const Q4_K_BYTES: usize = WeightType::Q4_K.block_bytes();
const Q5_K_BYTES: usize = WeightType::Q5_K.block_bytes();
const Q6_K_BYTES: usize = WeightType::Q6_K.block_bytes();
const Q4_1_BYTES: usize = WeightType::Q4_1.block_bytes();
const Q5_0_BYTES: usize = WeightType::Q5_0.block_bytes();
const Q5_1_BYTES: usize = WeightType::Q5_1.block_bytes();
const IQ4_NL_BYTES: usize = WeightType::IQ4_NL.block_bytes();
const MXFP4_BYTES: usize = WeightType::MXFP4.block_bytes();
const Q2_K_BYTES: usize = WeightType::Q2_K.block_bytes();
const Q3_K_BYTES: usize = WeightType::Q3_K.block_bytes();
const IQ4_XS_BYTES: usize = WeightType::IQ4_XS.block_bytes();

/// Widens `bytes`, whole blocks of `ty`, into `out`, one f32 per value.
pub fn dequantize(ty: WeightType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    if ty.bytes_for(out.len() as u64) != Some(bytes.len() as u64) {
        return Err(GgufError::Blocks {
            ty: ty.name(),
            reason: format!(
                "{} bytes do not hold {} values in whole blocks of {} values ({} bytes each)",
                bytes.len(),
                out.len(),
                ty.block_len(),
                ty.block_bytes()
            ),
        });
    }
    match ty {
        WeightType::F32 => each_block(bytes, out, f32_value),
        WeightType::F16 => each_block(bytes, out, f16_value),
        WeightType::BF16 => each_block(bytes, out, bf16_value),
        WeightType::Q8_0 => each_block(bytes, out, q8_0),
        WeightType::Q4_0 => each_block(bytes, out, q4_0),
        WeightType::Q4_K => each_block(bytes, out, q4_k),
        WeightType::Q5_K => each_block(bytes, out, q5_k),
        WeightType::Q6_K => each_block(bytes, out, q6_k),
        WeightType::Q4_1 => each_block(bytes, out, q4_1),
        WeightType::Q5_0 => each_block(bytes, out, q5_0),
        WeightType::Q5_1 => each_block(bytes, out, q5_1),
        WeightType::IQ4_NL => each_block(bytes, out, iq4_nl),
        WeightType::MXFP4 => each_block(bytes, out, mxfp4),
        WeightType::Q2_K => each_block(bytes, out, q2_k),
        WeightType::Q3_K => each_block(bytes, out, q3_k),
        WeightType::IQ4_XS => each_block(bytes, out, iq4_xs),
    }
    Ok(())
}

/// Applies `block` to each block of `B` bytes and its `L` values. The
/// lengths were checked to be whole blocks.
fn each_block<const B: usize, const L: usize>(bytes: &[u8], out: &mut [f32], block: fn(&[u8; B], &mut [f32; L])) {
    let (blocks, _) = bytes.as_chunks::<B>();
    let (values, _) = out.as_chunks_mut::<L>();
    for (b, v) in blocks.iter().zip(values) {
        block(b, v);
    }
}

/// The little-endian f16 at byte `at` (ggml's `GGML_FP16_TO_FP32`, exact).
fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

fn f32_value(b: &[u8; 4], out: &mut [f32; 1]) {
    out[0] = f32::from_le_bytes(*b);
}

fn f16_value(b: &[u8; 2], out: &mut [f32; 1]) {
    out[0] = f16_at(b, 0);
}

fn bf16_value(b: &[u8; 2], out: &mut [f32; 1]) {
    out[0] = bf16::from_le_bytes(*b).to_f32();
}

/// `block_q8_0`: d (f16), then 32 signed bytes; y = q·d.
fn q8_0(b: &[u8; Q8_0_BYTES], out: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    for (y, &q) in out.iter_mut().zip(&b[2..]) {
        *y = f32::from(q as i8) * d;
    }
}

/// `block_q4_0`: d (f16), then 16 bytes of two 4-bit values each; the low
/// nibbles are the first 16 values, the high nibbles the last 16, each
/// offset by 8: y = (q − 8)·d.
fn q4_0(b: &[u8; Q4_0_BYTES], out: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    let qs = &b[2..];
    for j in 0..QK / 2 {
        let x0 = i32::from(qs[j] & 0x0F) - 8;
        let x1 = i32::from(qs[j] >> 4) - 8;
        out[j] = x0 as f32 * d;
        out[j + QK / 2] = x1 as f32 * d;
    }
}

/// The 32 4-bit values of a legacy block's 16 bytes `qs`, as Q4_0 keeps
/// them: the low nibbles are the first 16 values, the high nibbles the last.
fn nibbles(qs: &[u8]) -> impl Iterator<Item = (usize, u8)> + '_ {
    (0..QK).map(|j| (j, (qs[j % 16] >> (4 * (j / 16))) & 0x0F))
}

/// `block_q4_1`: d and m (f16), then Q4_0's nibbles; y = q·d + m.
fn q4_1(b: &[u8; Q4_1_BYTES], out: &mut [f32; QK]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for (j, q) in nibbles(&b[4..]) {
        out[j] = f32::from(q) * d + m;
    }
}

/// Value `j`'s fifth bit in a Q5_0 or Q5_1 block's `qh` (bit `j` of a
/// little-endian u32), as 16 or 0.
fn fifth_bit(qh: &[u8], j: usize) -> u8 {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    (((qh >> j) & 1) << 4) as u8
}

/// `block_q5_0`: d (f16), 4 bytes of fifth bits, Q4_0's nibbles;
/// y = (q − 16)·d.
fn q5_0(b: &[u8; Q5_0_BYTES], out: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    for (j, q) in nibbles(&b[6..]) {
        out[j] = (i32::from(q | fifth_bit(&b[2..6], j)) - 16) as f32 * d;
    }
}

/// `block_q5_1`: d and m (f16), then Q5_0's fifth bits and nibbles;
/// y = q·d + m.
fn q5_1(b: &[u8; Q5_1_BYTES], out: &mut [f32; QK]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for (j, q) in nibbles(&b[8..]) {
        out[j] = f32::from(q | fifth_bit(&b[4..8], j)) * d + m;
    }
}

/// `block_iq4_nl`: d (f16), then Q4_0's nibbles, each an index into the
/// 16 levels; y = d·level.
fn iq4_nl(b: &[u8; IQ4_NL_BYTES], out: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    for (j, q) in nibbles(&b[2..]) {
        out[j] = d * f32::from(IQ4_NL_LEVELS[q as usize]);
    }
}

/// `block_mxfp4`: an e8m0 scale byte, then Q4_0's nibbles, each a doubled
/// FP4 value; y = level·(scale / 2).
fn mxfp4(b: &[u8; MXFP4_BYTES], out: &mut [f32; QK]) {
    let d = f32::from_bits(e8m0_half_bits(b[0]));
    for (j, q) in nibbles(&b[1..]) {
        out[j] = f32::from(MXFP4_LEVELS[q as usize]) * d;
    }
}

/// Value `v`'s 2 bits in the 64 bytes `qs` of a Q2_K or Q3_K block: each
/// half of 128 values takes 32 bytes, its quarter `k` the bits `2k..2k+2`
/// of them.
fn two_bits(qs: &[u8], v: usize) -> u8 {
    (qs[32 * (v / 128) + v % 32] >> (2 * ((v % 128) / 32))) & 3
}

/// `block_q2_K`: 16 scale bytes (a 4-bit scale low, a 4-bit min high, one
/// per 16 values), 64 bytes of 2-bit values ([`two_bits`]), d and dmin
/// (f16). y = d·scale·q − dmin·min.
fn q2_k(b: &[u8; Q2_K_BYTES], out: &mut [f32; QK_K]) {
    let (scales, rest) = b.split_at(QK_K / 16);
    let (qs, rest) = rest.split_at(QK_K / 4);
    let (d, min) = (f16_at(rest, 0), f16_at(rest, 2));
    for (v, y) in out.iter_mut().enumerate() {
        let sc = scales[v / 16];
        let (dl, ml) = (d * f32::from(sc & 0xF), min * f32::from(sc >> 4));
        *y = dl * f32::from(two_bits(qs, v)) - ml;
    }
}

/// `block_q3_K`: 32 bytes `hmask`, 64 bytes of 2-bit values (laid out as
/// Q2_K's), 12 bytes of sixteen 6-bit scales, d (f16). Value `v`'s high
/// bit is bit `4·(v / 128) + (v % 128) / 32` of `hmask[v % 32]`; a clear
/// high bit takes 4 off. Scale `s` has its low 4 bits in byte `s % 8`
/// (high nibble from s = 8) and its high 2 in byte `8 + s % 4` (bits
/// `2·(s / 4)`). y = d·(scale − 32)·q.
fn q3_k(b: &[u8; Q3_K_BYTES], out: &mut [f32; QK_K]) {
    let (hmask, rest) = b.split_at(QK_K / 8);
    let (qs, rest) = rest.split_at(QK_K / 4);
    let (sc, d) = rest.split_at(12);
    let d = f16_at(d, 0);
    for (v, y) in out.iter_mut().enumerate() {
        let s = v / 16;
        let low = (sc[s % 8] >> (4 * (s / 8))) & 0xF;
        let high = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
        let dl = d * (i32::from(low | (high << 4)) - 32) as f32;
        let q = two_bits(qs, v);
        let high_bit = (hmask[v % 32] >> (4 * (v / 128) + (v % 128) / 32)) & 1;
        *y = dl * (i32::from(q) - if high_bit == 1 { 0 } else { 4 }) as f32;
    }
}

/// `block_iq4_xs`: d (f16), 2 bytes of the scales' high bits, 4 bytes of
/// their low nibbles, then per 32 values 16 bytes of IQ4_NL's indices
/// (low nibbles first). y = d·(scale − 32)·level.
fn iq4_xs(b: &[u8; IQ4_XS_BYTES], out: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    for (ib, y) in out.chunks_exact_mut(32).enumerate() {
        let low = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF;
        let high = ((scales_h >> (2 * ib)) & 3) as u8;
        let dl = d * (i32::from(low | (high << 4)) - 32) as f32;
        for (j, q) in nibbles(&b[8 + 16 * ib..8 + 16 * ib + 16]) {
            y[j] = dl * f32::from(IQ4_NL_LEVELS[q as usize]);
        }
    }
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j`
/// (of 8) from the 12 packed bytes of a Q4_K or Q5_K block. Sub-blocks 0-3
/// keep theirs in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins);
/// sub-blocks 4-7 keep their low 4 bits in bytes 8-11 and their high 2 bits
/// in the top bits of bytes 0-7.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        let d = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
        let m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        (d, m)
    }
}

/// `block_q4_K`: d and dmin (f16), 12 bytes of scales and mins, 128 bytes
/// of 4-bit values. 256 values in 8 sub-blocks of 32; each run of 32 bytes
/// holds two sub-blocks, low nibbles first. y = d·scale·q − dmin·min.
fn q4_k(b: &[u8; Q4_K_BYTES], out: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    let min = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..];
    for (chunk, (q, y)) in qs.chunks_exact(32).zip(out.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * chunk, scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, m1) = (d * f32::from(sc1), min * f32::from(m1));
        let (d2, m2) = (d * f32::from(sc2), min * f32::from(m2));
        for l in 0..32 {
            y[l] = d1 * f32::from(q[l] & 0x0F) - m1;
            y[l + 32] = d2 * f32::from(q[l] >> 4) - m2;
        }
    }
}

/// `block_q5_K`: as Q4_K, with 32 bytes `qh` before the 4-bit values
/// holding each value's fifth bit: bit `s` of `qh[l]` belongs to value `l`
/// of sub-block `s`.
fn q5_k(b: &[u8; Q5_K_BYTES], out: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    let min = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..];
    for (chunk, (ql, y)) in qs.chunks_exact(32).zip(out.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * chunk, scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, m1) = (d * f32::from(sc1), min * f32::from(m1));
        let (d2, m2) = (d * f32::from(sc2), min * f32::from(m2));
        let (u1, u2) = (1u8 << (2 * chunk), 2u8 << (2 * chunk));
        let high = |l: usize, u: u8| if qh[l] & u != 0 { 16 } else { 0 };
        for l in 0..32 {
            y[l] = d1 * f32::from((ql[l] & 0x0F) + high(l, u1)) - m1;
            y[l + 32] = d2 * f32::from((ql[l] >> 4) + high(l, u2)) - m2;
        }
    }
}

/// `block_q6_K`: 128 bytes of low 4 bits, 64 bytes of high 2 bits, 16
/// signed 8-bit scales (one per 16 values), d (f16). Each half of 128
/// values takes 64 bytes of `ql`, 32 of `qh` and 8 scales; value `l` of
/// each quarter of the half shares `ql`/`qh` bytes with the other quarters.
/// y = d·scale·(q − 32).
fn q6_k(b: &[u8; Q6_K_BYTES], out: &mut [f32; QK_K]) {
    let (ql_all, rest) = b.split_at(QK_K / 2);
    let (qh_all, rest) = rest.split_at(QK_K / 4);
    let (scales, d) = rest.split_at(QK_K / 16);
    let d = f16_at(d, 0);
    for (half, y) in out.chunks_exact_mut(128).enumerate() {
        let ql = &ql_all[64 * half..];
        let qh = &qh_all[32 * half..];
        let sc = |i: usize| f32::from(scales[8 * half + i] as i8);
        for l in 0..32 {
            let is = l / 16;
            let q1 = i32::from((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) - 32;
            let q2 = i32::from((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
            let q3 = i32::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            let q4 = i32::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * sc(is) * q1 as f32;
            y[l + 32] = d * sc(is + 2) * q2 as f32;
            y[l + 64] = d * sc(is + 4) * q3 as f32;
            y[l + 96] = d * sc(is + 6) * q4 as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_that_are_not_whole_blocks_of_the_values_are_refused() {
        let mut out = [0.0; 32];
        let error = dequantize(WeightType::Q8_0, &[0; 33], &mut out).unwrap_err();
        assert_eq!(
            error.to_string(),
            "dequantizing Q8_0: 33 bytes do not hold 32 values in whole blocks of 32 values (34 bytes each)"
        );
        assert!(dequantize(WeightType::Q4_K, &[0; 144], &mut out).is_err());
        assert!(dequantize(WeightType::Q4_K, &[0; 144], &mut [0.0; 256]).is_ok());
    }
}
