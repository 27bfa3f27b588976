//! Float32 `log` and `sincos` as PyTorch's AVX2 normal kernel computes them
//! (`ATen/native/cpu/avx_mathfun.h`, Cephes polynomials after Julien Pommier's `sse_mathfun`).
//!
//! `torch.randn` on an x86-64 CPU with AVX2 uses these approximations rather than libm; libm (with
//! θ in double, as torch's scalar fallback computes it) gives noise that differs by up to ~1e-6 in
//! almost half the samples. PyTorch is built by GCC with `-mfma` and its default `-ffp-contract=fast`, which fuses
//! each intrinsic multiply followed by an add into one FMA; every such pair below is therefore a
//! `mul_add`. Without the fusion 5 of the fixture's 512 samples are one ulp off; with it all match.

// The C source initialises float arrays from double literals, hence `f64 as f32`; its digits are kept
// verbatim (beyond f64 precision in places) so they can be checked against it by eye.
#![allow(clippy::excessive_precision)]

/// `cephes_SQRTHF`, written `0.707106781186547524` in the C source.
const SQRT_HALF: f32 = std::f64::consts::FRAC_1_SQRT_2 as f32;
const LOG_POLY: [f32; 9] = [
    7.037_683_629_2e-2_f64 as f32,
    -1.151_461_031_0e-1_f64 as f32,
    1.167_699_874_0e-1_f64 as f32,
    -1.242_014_084_6e-1_f64 as f32,
    1.424_932_278_7e-1_f64 as f32,
    -1.666_805_766_5e-1_f64 as f32,
    2.000_071_476_5e-1_f64 as f32,
    -2.499_999_399_3e-1_f64 as f32,
    3.333_333_117_4e-1_f64 as f32,
];
/// ln 2 split into a part exact in float and a correction.
const LN2_LO: f32 = -2.121_944_40e-4_f64 as f32;
const LN2_HI: f32 = 0.693_359_375;

/// 4/π, and π/4 split in three parts for the "extended precision modular arithmetic" reduction.
const FOUR_OVER_PI: f32 = 1.273_239_544_735_16_f64 as f32;
const MINUS_PI_4: [f32; 3] = [
    -0.785_156_25,
    -2.418_756_484_985_351_562_5e-4_f64 as f32,
    -3.774_894_977_445_941_08e-8_f64 as f32,
];
const SIN_POLY: [f32; 3] = [
    -1.951_529_589_1e-4_f64 as f32,
    8.332_160_873_6e-3_f64 as f32,
    -1.666_665_461_1e-1_f64 as f32,
];
const COS_POLY: [f32; 3] = [
    2.443_315_711_809_948e-5_f64 as f32,
    -1.388_731_625_493_765e-3_f64 as f32,
    4.166_664_568_298_827e-2_f64 as f32,
];

const SIGN_BIT: u32 = 0x8000_0000;
const EXPONENT_MASK: u32 = 0x7f80_0000;
const EXPONENT_BIAS: i32 = 0x7f;

/// `log256_ps` for one lane, for the positive arguments the normal kernel passes (`1 - u` with
/// `u` in [0, 1)).
pub(super) fn log(x: f32) -> f32 {
    let bits = x.max(f32::MIN_POSITIVE).to_bits();
    let mut exponent = ((bits >> (f32::MANTISSA_DIGITS - 1)) as i32 - EXPONENT_BIAS) as f32 + 1.0;
    // Mantissa rescaled into [0.5, 1).
    let mut m = f32::from_bits((bits & !EXPONENT_MASK) | 0.5f32.to_bits());
    let small = m < SQRT_HALF;
    let doubled = if small { m } else { 0.0 };
    m -= 1.0;
    if small {
        exponent -= 1.0;
    }
    m += doubled;

    let z = m * m;
    let mut y = LOG_POLY[0];
    for &p in &LOG_POLY[1..] {
        y = y.mul_add(m, p);
    }
    y = y * m * z;
    y = exponent.mul_add(LN2_LO, y);
    y = (-z).mul_add(0.5, y);
    exponent.mul_add(LN2_HI, m + y)
}

/// `sincos256_ps` for one lane: returns `(sin x, cos x)`.
pub(super) fn sincos(x: f32) -> (f32, f32) {
    let mut sin_sign = x.to_bits() & SIGN_BIT;
    let mut x = x.abs();

    // Octant index rounded up to even, as in Cephes `sinf`.
    let octant = ((x * FOUR_OVER_PI) as i32 + 1) & !1;
    let y = octant as f32;
    sin_sign ^= ((octant & 4) as u32) << 29;
    let cos_sign = ((!(octant - 2) & 4) as u32) << 29;
    let sin_uses_sine_poly = octant & 2 == 0;
    for &part in &MINUS_PI_4 {
        x = y.mul_add(part, x);
    }

    let z = x * x;
    let mut cos_poly = COS_POLY[0];
    for &p in &COS_POLY[1..] {
        cos_poly = cos_poly.mul_add(z, p);
    }
    cos_poly = cos_poly * z * z;
    cos_poly = (-z).mul_add(0.5, cos_poly) + 1.0;

    let mut sin_poly = SIN_POLY[0];
    for &p in &SIN_POLY[1..] {
        sin_poly = sin_poly.mul_add(z, p);
    }
    sin_poly = (sin_poly * z).mul_add(x, x);

    let (sin, cos) = if sin_uses_sine_poly {
        (sin_poly, cos_poly)
    } else {
        (cos_poly, sin_poly)
    };
    (
        f32::from_bits(sin.to_bits() ^ sin_sign),
        f32::from_bits(cos.to_bits() ^ cos_sign),
    )
}
