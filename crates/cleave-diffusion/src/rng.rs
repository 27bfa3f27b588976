//! A normal generator that reproduces `torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed))`
//! in float32, so that a seed gives the same initial latents, and so the same image, as diffusers.
//!
//! Three pieces of PyTorch are mirrored:
//!
//! * `at::mt19937` ([`mt19937`]): the standard Mersenne Twister behind `CPUGeneratorImpl`.
//! * `at::uniform_real_distribution`: a float takes the low 24 bits of one 32-bit draw, a double the
//!   low 53 bits of a 64-bit draw, each scaled into [0, 1).
//! * `normal_kernel` (`ATen/native/cpu/DistributionTemplates.h`): a contiguous float tensor of at
//!   least 16 elements is filled with uniform floats, then turned into normals 16 at a time by
//!   Box–Muller (`normal_fill_16`: `u1 = 1 - data[j]`, `u2 = data[j + 8]`, cosine sample to slot `j`,
//!   sine sample to slot `j + 8`); when the size is not a multiple of 16 the last 16 slots are
//!   refilled with fresh uniforms and transformed again. Smaller tensors take the scalar
//!   `at::normal_distribution<double>` path instead, which consumes the stream differently and caches
//!   its second sample in the generator.
//!
//! The 16-wide transform follows the AVX2 kernel (`normal_fill_16_AVX2`) with its Cephes `log` and
//! `sincos` ([`cephes`]), which is what torch runs on x86-64 CPUs with AVX2 and what produced the
//! reference noise. torch builds without AVX2 run a scalar libm version instead, whose samples differ
//! from these by up to ~1e-6.

mod cephes;
mod mt19937;

use mt19937::Mt19937;

/// Elements transformed together by torch's Box–Muller fill.
const CHUNK: usize = 16;
const HALF_CHUNK: usize = CHUNK / 2;

/// torch's CPU generator state: the engine plus the cached second sample of the double-precision
/// Box–Muller transform (`next_double_normal_sample_`).
#[derive(Clone)]
pub struct TorchRng {
    engine: Mt19937,
    next_double_normal: Option<f64>,
}

impl TorchRng {
    /// The state `torch.Generator("cpu").manual_seed(seed)` leaves behind.
    pub fn new(seed: u64) -> Self {
        Self {
            engine: Mt19937::new(seed),
            next_double_normal: None,
        }
    }

    /// `torch.randn(shape, generator=self)` in float32 for any shape of `n` elements: torch fills a
    /// contiguous tensor in memory order, so only the element count matters.
    pub fn randn(&mut self, n: usize) -> Vec<f32> {
        if n < CHUNK {
            return (0..n).map(|_| self.normal_f64() as f32).collect();
        }
        let mut data: Vec<f32> = (0..n).map(|_| self.uniform_f32()).collect();
        for chunk in data.chunks_exact_mut(CHUNK) {
            box_muller_16(chunk);
        }
        if !n.is_multiple_of(CHUNK) {
            let tail = &mut data[n - CHUNK..];
            for slot in tail.iter_mut() {
                *slot = self.uniform_f32();
            }
            box_muller_16(tail);
        }
        data
    }

    /// `at::uniform_real_distribution<float>(0, 1)`.
    fn uniform_f32(&mut self) -> f32 {
        let bits = self.engine.next_u32() & ((1 << f32::MANTISSA_DIGITS) - 1);
        bits as f32 / (1u32 << f32::MANTISSA_DIGITS) as f32
    }

    /// `at::uniform_real_distribution<double>(0, 1)`.
    fn uniform_f64(&mut self) -> f64 {
        let bits = self.engine.next_u64() & ((1 << f64::MANTISSA_DIGITS) - 1);
        bits as f64 / (1u64 << f64::MANTISSA_DIGITS) as f64
    }

    /// `at::normal_distribution<double>(0, 1)`: returns `r·cos θ` and caches `r·sin θ` for the next
    /// call, which is why two one-element draws equal one two-element draw.
    fn normal_f64(&mut self) -> f64 {
        if let Some(cached) = self.next_double_normal.take() {
            return cached;
        }
        let u1 = self.uniform_f64();
        let u2 = self.uniform_f64();
        let radius = (-2.0 * (-u2).ln_1p()).sqrt();
        let theta = 2.0 * std::f64::consts::PI * u1;
        self.next_double_normal = Some(radius * theta.sin());
        radius * theta.cos()
    }
}

/// `normal_fill_16_AVX2` with mean 0 and std 1 (its final `fmadd(n, std, mean)` is then exact).
/// All arithmetic is float32, including θ = (2π as float)·u2.
fn box_muller_16(data: &mut [f32]) {
    let two_pi = (2.0 * std::f64::consts::PI) as f32;
    let (cos_half, sin_half) = data.split_at_mut(HALF_CHUNK);
    for (first, second) in cos_half.iter_mut().zip(sin_half) {
        let radius = (-2.0 * cephes::log(1.0 - *first)).sqrt();
        let (sin, cos) = cephes::sincos(two_pi * *second);
        *first = radius * cos;
        *second = radius * sin;
    }
}
