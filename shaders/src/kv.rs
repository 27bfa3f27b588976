//! The KV cache in its own type: f32, or f16 (llama.cpp's default cache
//! type, half the memory). A cache is a [`Weight`] of `[positions, kv
//! width]` rows; new rows are written into it converted to its type (by
//! [`crate::split_qkv`]), and attention reads them back as f32. An f16
//! cache holds two halves per u32 word, so no backend needs 16-bit
//! storage.

use cubecl::prelude::*;

use crate::error::check_shape;
use crate::{KernelError, Weight, WeightType};

/// The f16 bits nearest to `x` (round to nearest, ties to even), as
/// numpy's `astype(float16)` rounds: overflow to infinity, NaN kept,
/// subnormals exact.
#[cube]
pub(crate) fn f32_to_f16_bits<F: Float>(x: F) -> u32 {
    let bits = u32::reinterpret(x);
    let sign = (bits >> 16) & 0x8000;
    let exponent = (bits >> 23) & 0xff;
    let mantissa = bits & 0x7f_ffff;
    let mut half = sign | 0x7c00;
    if exponent == 0xff {
        // Infinity stays infinity; NaN stays a (quiet) NaN.
        if mantissa != 0 {
            half = sign | 0x7e00;
        }
    } else if exponent > 142 {
        // Past f16's largest exponent (15 + 127): infinity.
        half = sign | 0x7c00;
    } else if exponent >= 113 {
        // A normal f16: rebias, keep 10 mantissa bits, round the other 13.
        let kept = ((exponent - 112) << 10) | (mantissa >> 13);
        let rest = mantissa & 0x1fff;
        let mut up = 0u32;
        if rest > 0x1000 || (rest == 0x1000 && (kept & 1) == 1) {
            up = 1;
        }
        // A carry out of the mantissa raises the exponent, as it should.
        half = sign | (kept + up);
    } else if exponent >= 102 {
        // A subnormal f16: the implicit bit joins the mantissa, shifted.
        let full = mantissa | 0x80_0000;
        let shift = 126 - exponent;
        let kept = full >> shift;
        let rest = full & ((1u32 << shift) - 1);
        let halfway = 1u32 << (shift - 1);
        let mut up = 0u32;
        if rest > halfway || (rest == halfway && (kept & 1) == 1) {
            up = 1;
        }
        half = sign | (kept + up);
    } else {
        // Below half the smallest subnormal: a signed zero.
        half = sign;
    }
    half
}

/// An empty cache of `rows` positions of `cols` values in `ty` (F32 or
/// F16; `cols` even for F16).
pub fn kv_cache<R: Runtime>(
    client: &ComputeClient<R>,
    ty: WeightType,
    rows: usize,
    cols: usize,
) -> Result<Weight, KernelError> {
    check_kv_type(ty, cols)?;
    Weight::empty(client, ty, rows, cols)
}

fn check_kv_type(ty: WeightType, cols: usize) -> Result<(), KernelError> {
    let ok = match ty {
        WeightType::F32 => true,
        WeightType::F16 => cols.is_multiple_of(2),
        _ => false,
    };
    check_shape(ok, "kv cache", ty.name(), &[cols], || {
        "f32, or f16 rows of an even width".into()
    })
}
