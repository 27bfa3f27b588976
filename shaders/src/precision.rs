//! How precisely prefill products are formed, as users choose it
//! (`--precision`): `exact` multiplies f32 inputs (the weight widened
//! exactly from its stored type); `fast` first rounds the activations to
//! 16 bits (the weight's own type where it is f16 or bf16, f16 for the
//! block types, whose values are first widened), as transformers and
//! llama.cpp do on GPUs, and accumulates in f32. On devices with matrix
//! units (`cmma`) the fast products run there; elsewhere the other
//! kernels compute the very same rounded products, so that the numbers the
//! matrix units must give are the numbers the tests check on any device.
//! Decode products (one row per sequence) read memory, not arithmetic, and
//! stay exact.

use std::cell::Cell;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU8, Ordering};

use cubecl::cmma;
use cubecl::ir::features::MmaConfig;
use cubecl::ir::StorageType;
use cubecl::prelude::*;

use crate::cast::f16_bits_to_f32;
use crate::grid::{grid_1d, linear_pos};
use crate::kv::f32_to_f16_bits;
use crate::{Tensor, WeightType};

/// How precisely prefill products are formed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    /// f32 inputs, f32 accumulation.
    Exact,
    /// 16-bit inputs, f32 accumulation: on matrix units where the device
    /// has them.
    Fast,
}

impl Precision {
    pub const fn name(self) -> &'static str {
        match self {
            Precision::Exact => "exact",
            Precision::Fast => "fast",
        }
    }
}

/// The precision asked for: 0 where nothing was, so each device takes its
/// default.
static CHOSEN: AtomicU8 = AtomicU8::new(0);

/// Makes every later product take `precision` (`None`: each device's
/// default, [`default_precision`]).
pub fn set_precision(precision: Option<Precision>) {
    let code = match precision {
        None => 0,
        Some(Precision::Exact) => 1,
        Some(Precision::Fast) => 2,
    };
    CHOSEN.store(code, Ordering::Relaxed);
}

/// The precision [`set_precision`] asked for (`None`: each device's
/// default).
pub fn chosen_precision() -> Option<Precision> {
    match CHOSEN.load(Ordering::Relaxed) {
        1 => Some(Precision::Exact),
        2 => Some(Precision::Fast),
        _ => None,
    }
}

/// Whether some device may form prefill products at `fast`: unless
/// `exact` was asked for, a device with matrix units does.
pub fn fast_possible() -> bool {
    chosen_precision() != Some(Precision::Exact)
}

/// What a device does unless told: fast where it has matrix units for
/// 16-bit inputs, exact elsewhere (a CPU adapter would only round).
pub fn default_precision<R: Runtime>(client: &ComputeClient<R>) -> Precision {
    match matrix_units(client) {
        true => Precision::Fast,
        false => Precision::Exact,
    }
}

thread_local! {
    /// The precision [`with_precision`] imposes on this thread's launches.
    static IMPOSED: Cell<Option<Precision>> = const { Cell::new(None) };
}

/// Runs `f` with every product it forms on this thread at `precision`,
/// whatever was set: the tests check both on one device.
#[cfg(feature = "cpu-reference")]
pub fn with_precision<T>(precision: Precision, f: impl FnOnce() -> T) -> T {
    crate::choice::imposing(&IMPOSED, precision, f)
}

/// The precision of prefill products on `client`'s device.
pub fn precision_for<R: Runtime>(client: &ComputeClient<R>) -> Precision {
    if let Some(precision) = IMPOSED.get() {
        return precision;
    }
    chosen_precision().unwrap_or_else(|| default_precision(client))
}

/// Whether the device multiplies f16 and bf16 matrices on matrix units
/// with f32 accumulation, as the matrix-unit kernels take them.
pub(crate) fn matrix_units<R: Runtime>(client: &ComputeClient<R>) -> bool {
    let properties = client.properties();
    let hardware = &properties.hardware;
    takes_matrix_kernels(
        &properties.features.matmul.cmma,
        (hardware.plane_size_min, hardware.plane_size_max),
    )
}

/// Whether matrix units offering `cmma`, in planes of `plane_sizes` (the
/// fewest and most units a plane may have) take the matrix-unit kernels:
/// FRAG × FRAG × FRAG fragments of f16 and of bf16 summed in f32, and
/// planes of exactly LANES units. A CUDA device has both. A Vulkan device's
/// cooperative matrices may come in other shapes only, or in planes whose
/// width the driver picks for each kernel (32 or 64 units on AMD's RDNA),
/// which these kernels, counting LANES units to a plane, cannot follow.
fn takes_matrix_kernels(cmma: &BTreeSet<MmaConfig>, plane_sizes: (u32, u32)) -> bool {
    let f32_type = f32::as_type_native_unchecked().storage_type();
    let takes = |ty: StorageType| {
        cmma.iter()
            .any(|c| (c.a_type, c.b_type, c.cd_type) == (ty, ty, f32_type) && (c.m, c.n, c.k) == (FRAG, FRAG, FRAG))
    };
    plane_sizes == (LANES, LANES)
        && takes(half::f16::as_type_native_unchecked().storage_type())
        && takes(half::bf16::as_type_native_unchecked().storage_type())
}

/// Rows, columns and depth of one matrix-unit product.
pub(crate) const FRAG: u32 = 16;
/// Units in a plane as the matrix-unit kernels count them: a CUDA warp,
/// which a matrix-unit product takes whole.
pub(crate) const LANES: u32 = 32;

/// A new matrix-unit fragment of 16×16 (×16) for the role `ident`.
#[cube]
pub(crate) fn fragment<E: Numeric>(
    #[comptime] ident: cmma::MatrixIdent,
    #[comptime] layout: cmma::MatrixLayout,
) -> cmma::Matrix<E> {
    unsafe { cmma::Matrix::<E>::uninitialized(ident, FRAG as usize, FRAG as usize, FRAG as usize, layout) }
}

/// `fragment` stored row-major into `room[at..at + 256]`: a plane's 16×16
/// sums on their way out of the matrix units.
#[cube]
pub(crate) fn store_fragment(room: &mut SharedMemory<f32>, at: u32, fragment: &cmma::Matrix<f32>) {
    let mut place = room.slice_mut(at as usize, (at + FRAG * FRAG) as usize);
    cmma::store(
        &mut place,
        fragment,
        u32::new(FRAG as i64),
        cmma::MatrixLayout::RowMajor,
    );
}

/// The 16-bit type fast products round to for weights of `ty`.
pub(crate) fn half_type(ty: WeightType) -> WeightType {
    match ty {
        WeightType::BF16 => WeightType::BF16,
        _ => WeightType::F16,
    }
}

/// The bf16 bits of `x`, rounded to nearest even (a NaN stays one).
#[cube]
fn bf16_bits(x: f32) -> u32 {
    let bits = u32::reinterpret(x);
    let mut half = (bits + 0x7fff + ((bits >> 16) & 1)) >> 16;
    if (bits & 0x7fff_ffff) > 0x7f80_0000 {
        half = (bits >> 16) | 0x40;
    }
    half
}

/// `x` rounded to the 16-bit type (`bf16`: bf16, else f16) and back: an
/// input a matrix unit multiplies, as the kernels that stand in for one
/// take it.
#[cube]
pub(crate) fn rounded_to_half(x: f32, #[comptime] bf16: bool) -> f32 {
    if bf16 {
        f32::reinterpret(bf16_bits(x) << 16)
    } else {
        f16_bits_to_f32::<f32>(f32_to_f16_bits::<f32>(x))
    }
}

/// Each of `x` [`rounded_to_half`].
#[cube(launch)]
fn round_to_half(x: &Array<f32>, out: &mut Array<f32>, len: u32, #[comptime] bf16: bool) {
    let i = linear_pos();
    if i < len as usize {
        out[i] = rounded_to_half(x[i], bf16);
    }
}

/// `x` rounded to the 16-bit type, two values to a word (the first in the
/// low half): what the matrix units read.
#[cube(launch)]
fn narrow_to_halves(x: &Array<f32>, words: &mut Array<u32>, pairs: u32, #[comptime] bf16: bool) {
    let i = linear_pos();
    if i < pairs as usize {
        words[i] = pack_halves(x[2 * i], x[2 * i + 1], bf16);
    }
}

/// `a` and `b` rounded to the 16-bit type (`bf16`: bf16, else f16) in one
/// word, `a` in the low half: two elements of a matrix unit's input.
#[cube]
pub(crate) fn pack_halves(a: f32, b: f32, #[comptime] bf16: bool) -> u32 {
    if bf16 {
        bf16_bits(a) | (bf16_bits(b) << 16)
    } else {
        f32_to_f16_bits::<f32>(a) | (f32_to_f16_bits::<f32>(b) << 16)
    }
}

/// `x` rounded to `half` (F16 or BF16) and back, as a new tensor.
pub fn rounded<R: Runtime>(client: &ComputeClient<R>, x: &Tensor, half: WeightType) -> Tensor {
    let out = Tensor::empty(client, &x.shape);
    let (count, dim) = grid_1d(x.len());
    crate::profile::launch(client, "round_to_half", || {
        round_to_half::launch::<R>(
            client,
            count,
            dim,
            x.arg(),
            out.arg(),
            x.len() as u32,
            half == WeightType::BF16,
        )
    });
    out
}

/// `x` (of an even length) rounded to `half`, packed two to a word in a
/// new buffer (a tensor of half as many f32-sized words).
pub fn narrow<R: Runtime>(client: &ComputeClient<R>, x: &Tensor, half: WeightType) -> Tensor {
    let pairs = x.len() / 2;
    let words = Tensor::empty(client, &[pairs]);
    let (count, dim) = grid_1d(pairs);
    crate::profile::launch(client, "narrow_to_halves", || {
        narrow_to_halves::launch::<R>(
            client,
            count,
            dim,
            x.arg(),
            words.words_arg(),
            pairs as u32,
            half == WeightType::BF16,
        )
    });
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(ty: StorageType, (m, n, k): (u32, u32, u32)) -> MmaConfig {
        let f32_type = f32::as_type_native_unchecked().storage_type();
        MmaConfig {
            a_type: ty,
            b_type: ty,
            cd_type: f32_type,
            m,
            n,
            k,
        }
    }

    /// A CUDA device's fragments and warps take the kernels; another
    /// fragment shape, a missing type or a plane of another width does not.
    #[test]
    fn matrix_kernels_need_their_fragments_and_32_unit_planes() {
        let f16 = half::f16::as_type_native_unchecked().storage_type();
        let bf16 = half::bf16::as_type_native_unchecked().storage_type();
        let full = (FRAG, FRAG, FRAG);
        let cuda = BTreeSet::from([config(f16, full), config(bf16, full), config(f16, (16, 8, 16))]);
        assert!(takes_matrix_kernels(&cuda, (32, 32)));
        for planes in [(32, 64), (64, 64), (8, 32), (16, 16)] {
            assert!(!takes_matrix_kernels(&cuda, planes), "planes of {planes:?} units");
        }
        let f16_only = BTreeSet::from([config(f16, full), config(bf16, (16, 8, 16))]);
        assert!(!takes_matrix_kernels(&f16_only, (32, 32)));
        let other_shapes = BTreeSet::from([config(f16, (8, 8, 16)), config(bf16, (8, 8, 16))]);
        assert!(!takes_matrix_kernels(&other_shapes, (32, 32)));
        assert!(!takes_matrix_kernels(&BTreeSet::new(), (32, 32)));
    }
}
