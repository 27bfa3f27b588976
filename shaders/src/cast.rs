//! Half-precision weights to f32, on the device.
//!
//! The halves travel as the raw little-endian bytes of the checkpoint, read
//! as u32 words holding two halves each, and are widened with integer
//! operations only: WGSL has no bf16 at all and f16 only as an optional
//! feature, so this works on every backend.

use cubecl::prelude::*;

use crate::grid::{grid_1d, linear_pos};
use crate::Tensor;

/// The f32 bits of the f16 whose bits are `h` (exact, subnormals included).
#[cube]
pub(crate) fn f16_bits_to_f32<F: Float>(h: u32) -> F {
    let sign = (h & 0x8000) << 16;
    let exponent = (h >> 10) & 0x1f;
    let mantissa = h & 0x3ff;
    let mut value = F::reinterpret(sign | ((exponent + 112) << 23) | (mantissa << 13));
    if exponent == 0 {
        // Zero or subnormal: mantissa · 2⁻²⁴, exact in f32.
        value = F::cast_from(mantissa) * F::new(5.960_464_5e-8);
        if sign != 0 {
            value = -value;
        }
    } else if exponent == 31 {
        value = F::reinterpret(sign | 0x7f80_0000 | (mantissa << 13));
    }
    value
}

#[cube(launch)]
fn unpack_halves<F: Float>(words: &Array<u32>, out: &mut Array<F>, len: u32, #[comptime] bf16: bool) {
    let i = linear_pos();
    if i < len as usize {
        let word = words[i / 2];
        let half = if i.is_multiple_of(2) { word & 0xffff } else { word >> 16 };
        if bf16 {
            out[i] = F::reinterpret(half << 16);
        } else {
            out[i] = f16_bits_to_f32::<F>(half);
        }
    }
}

fn unpack<R: Runtime>(client: &ComputeClient<R>, raw: &[u8], shape: &[usize], bf16: bool) -> Tensor {
    let len: usize = shape.iter().product();
    debug_assert_eq!(raw.len(), len * 2);
    let words = if len.is_multiple_of(2) {
        crate::profile::upload(client, raw)
    } else {
        // Whole u32 words: an odd count of halves gets a zero half of padding.
        let mut padded = raw.to_vec();
        padded.extend([0, 0]);
        crate::profile::upload(client, &padded)
    };
    let out = Tensor::allocate(client, shape);
    let (count, dim) = grid_1d(len);
    crate::profile::launch(client, "unpack_halves", || {
        unpack_halves::launch::<f32, R>(
            client,
            count,
            dim,
            // SAFETY: the buffer holds len.div_ceil(2) words.
            unsafe { ArrayArg::from_raw_parts(words, len.div_ceil(2)) },
            out.arg(),
            len as u32,
            bf16,
        );
    });
    out
}

/// A bf16 tensor given as its raw little-endian bytes, widened to f32.
pub fn bf16_to_f32<R: Runtime>(client: &ComputeClient<R>, raw: &[u8], shape: &[usize]) -> Tensor {
    unpack(client, raw, shape, true)
}

/// An f16 tensor given as its raw little-endian bytes, widened to f32.
pub fn f16_to_f32<R: Runtime>(client: &ComputeClient<R>, raw: &[u8], shape: &[usize]) -> Tensor {
    unpack(client, raw, shape, false)
}
