//! The typed-weight kernels (`Weight`, `matmul_weight`, `dequantize_rows`,
//! `embedding_weight`) against cleave-gguf's plain-Rust twins, on random valid
//! blocks of every type (the seed is printed on failure; set
//! CLEAVE_TEST_SEED to replay it) and on the tensors of the GGUF fixtures
//! against cleave-gguf's own dequantization.

use std::path::{Path, PathBuf};

use cleave_gguf::GgufFile;
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{reference, Activation, Epilogue, KernelError, Output, Tensor, Weight, WeightType};
use rand::rngs::StdRng;
use rand::Rng;

use crate::common;
use common::{random, seeded};

// The checks of prefill products, in both forms of the product.
kernel_tests!(in both forms:
    epilogues_give_the_bits_of_the_separate_kernels,
    prefill_in_several_widened_chunks,
    matmul_weight_matches_f64_dot_products,
    batched_decode_rows_equal_single_rows,
    row_chunks_fill_one_output,
    f32_weights_take_the_f32_path_bit_for_bit,
    prefill_scratch_is_what_the_planner_counts,
);

kernel_tests!(
    fast_products_round_their_inputs,
    fast_half_products_finish_their_sums,
    fast_block_products_decode_their_tiles,
    fast_block_products_keep_within_the_loop_budget,
    fast_convolutions_round_their_inputs,
    conv_scratch_is_what_the_planner_counts,
    dequantize_rows_equals_the_twins,
    embedding_weight_in_chunks,
    bad_weights_are_refused_by_name,
    gguf_fixture_tensors,
);

/// A random f16 in [-1, 1], little-endian: a block's scale.
fn scale(rng: &mut StdRng) -> [u8; 2] {
    half::f16::from_f32(rng.random_range(-1.0..1.0)).to_le_bytes()
}

/// `rows` rows of `cols` random values of `ty`, stored as `ty` stores
/// them: quants and 6-bit scales are any bytes; each block's f16 scales
/// are finite and at most 1, as a quantizer writes them.
fn random_rows(rng: &mut StdRng, ty: WeightType, rows: usize, cols: usize) -> Vec<u8> {
    let len = rows * ty.row_bytes(cols).expect("whole blocks");
    let mut bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
    // Where each block keeps its f16 scales (an f16 value is one).
    let scales: &[usize] = match ty {
        WeightType::F32 => {
            return random(rng, rows * cols).iter().flat_map(|v| v.to_le_bytes()).collect();
        }
        WeightType::BF16 => {
            return random(rng, rows * cols)
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                .collect();
        }
        WeightType::F16 => &[0],
        _ => ty.traits().scale_offsets,
    };
    for block in bytes.chunks_exact_mut(ty.block_bytes()) {
        for &at in scales {
            block[at..at + 2].copy_from_slice(&scale(rng));
        }
        if ty == WeightType::MXFP4 {
            // Its e8m0 scale: 2^-10 to 2^0 once halved.
            block[0] = rng.random_range(118..=128);
        }
    }
    bytes
}

/// Row lengths for `ty`: one block, and several. The float types, whose
/// blocks are single values, get an odd count of fours (the decode
/// kernel's unit form reads f32 four values at a time), an odd count of
/// 16s (it decodes f16 and bf16 16 values at a time) and an odd count of
/// values.
fn widths(ty: WeightType) -> Vec<usize> {
    match ty.block_len() {
        1 => vec![1, 124, 144, 101],
        len => vec![len, 3 * len],
    }
}

/// Fails at the first value whose bits differ.
#[track_caller]
fn assert_same_bits(got: &[f32], want: &[f32], what: &str, seed: u64) {
    assert_eq!(got.len(), want.len(), "{what}: length (seed {seed})");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!("{what}: element {i} is {}, expected {} (seed {seed})", got[i], want[i]);
    }
}

/// `silu(s) · u` from the f64 sums `s` and `u` and their terms' sizes
/// (`matmul_f64`), and how far an f32 result may lie from it: each sum
/// within 1e-5 of its terms (only the order of the f32 sums differs),
/// carried through (silu's slope is at most 1.1).
fn gated_silu_f64((s, s_size): (f64, f64), (u, u_size): (f64, f64)) -> (f64, f64) {
    let silu = s / (1.0 + (-s).exp());
    (silu * u, 1e-5 * (1.1 * s_size * u.abs() + silu.abs() * u_size))
}

/// `x · wᵀ` in f64, and the sum of |x·w| terms of each output: the scale
/// an f32 sum's rounding error is relative to.
fn matmul_f64(x: &[f32], w: &[f32], k: usize) -> (Vec<f64>, Vec<f64>) {
    let mut out = Vec::new();
    let mut magnitude = Vec::new();
    for xr in x.chunks(k) {
        for wr in w.chunks(k) {
            let terms = xr.iter().zip(wr).map(|(&a, &b)| a as f64 * b as f64);
            out.push(terms.clone().sum());
            magnitude.push(terms.map(f64::abs).sum());
        }
    }
    (out, magnitude)
}

#[track_caller]
fn assert_matches_f64(got: &[f32], x: &[f32], w: &[f32], k: usize, what: &str, seed: u64) {
    let (want, magnitude) = matmul_f64(x, w, k);
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, ((&g, w), m)) in got.iter().zip(&want).zip(&magnitude).enumerate() {
        assert!(
            (g as f64 - w).abs() <= 1e-5 * m + 1e-30,
            "{what}: element {i} is {g}, f64 reference {w} (seed {seed})"
        );
    }
}

/// The f32 values `matmul_weight` of `x: shape` should give, computed by
/// the twin, checked and returned.
fn check_matmul<R: Runtime>(
    client: &ComputeClient<R>,
    w: &Weight,
    values: &[f32],
    shape: &[usize],
    rng: &mut StdRng,
    seed: u64,
) -> Vec<f32> {
    let k = w.cols;
    let x = random(rng, shape.iter().product());
    let out = cleave_shaders::matmul_weight(client, &Tensor::from_f32(client, &x, shape), w).unwrap();
    let mut want_shape = shape.to_vec();
    *want_shape.last_mut().unwrap() = w.rows;
    assert_eq!(out.shape, want_shape);
    let got = out.to_vec(client).unwrap();
    let what = format!("{} matmul {shape:?} x [{}, {k}]", w.ty, w.rows);
    assert_matches_f64(&got, &x, values, k, &what, seed);
    got
}

/// Checks each way a fast product of `w` (and `up`, gated; each with its
/// widened values) over a random `x: [m, k]` finishes its sums into
/// columns `offset..offset + n` of a random `[m, wide]` output (stored,
/// with a bias, added in, gated): against the f64 product of the inputs
/// rounded to `half`, the other columns untouched.
fn check_fast_finishes<R: Runtime>(
    client: &ComputeClient<R>,
    rng: &mut StdRng,
    ((w, w_values), (up, up_values)): ((Weight, Vec<f32>), (Weight, Vec<f32>)),
    (m, wide, offset): (usize, usize, usize),
    half: WeightType,
    seed: u64,
) {
    use cleave_shaders::{with_precision, Precision};
    let (n, k) = (w.rows, w.cols);
    let x = random(rng, m * k);
    let bias = random(rng, n + 1);
    let before = random(rng, m * wide);
    let x_tensor = Tensor::from_f32(client, &x, &[m, k]);
    let bias_tensor = Tensor::from_f32(client, &bias, &[n + 1]);
    let x = round_to(half, &x);
    let (s, s_size) = matmul_f64(&x, &round_to(half, &w_values), k);
    let (u, u_size) = matmul_f64(&x, &round_to(half, &up_values), k);
    let gated = Output::Gated {
        up: &up,
        activation: Activation::Silu,
    };
    let epilogues = [
        ("store", Epilogue::default()),
        ("store + bias", Epilogue::default().with_bias(Some(&bias_tensor), 1)),
        ("add", Epilogue::accumulate()),
        ("gated", Epilogue::new(gated)),
    ];
    for (name, epilogue) in epilogues {
        let out = Tensor::from_f32(client, &before, &[m, wide]);
        with_precision(Precision::Fast, || {
            cleave_shaders::matmul_weight_into(client, &x_tensor, &w, &out, offset, epilogue).unwrap()
        });
        let got = out.to_vec(client).unwrap();
        let what = format!("fast {} product [{m}, {k}] x [{n}, {k}], {name} (up {})", w.ty, up.ty);
        for (i, &g) in got.iter().enumerate() {
            let (row, col) = (i / wide, i % wide);
            if !(offset..offset + n).contains(&col) {
                assert_eq!(g, before[i], "{what}: column {col} of row {row} written (seed {seed})");
                continue;
            }
            let j = row * n + col - offset;
            // Only the order of the f32 sums differs: an error within 1e-5
            // of each sum's terms, carried through.
            let (want, tolerance) = match name {
                "store" => (s[j], 1e-5 * s_size[j]),
                "store + bias" => (s[j] + bias[col - offset + 1] as f64, 1e-5 * s_size[j]),
                "add" => (s[j] + before[i] as f64, 1e-5 * s_size[j]),
                _ => gated_silu_f64((s[j], s_size[j]), (u[j], u_size[j])),
            };
            assert!(
                (g as f64 - want).abs() <= tolerance + 1e-6 * want.abs(),
                "{what}: element ({row}, {col}) is {g}, f64 reference {want} (seed {seed})"
            );
        }
    }
}

mod checks {
    use super::*;

    /// A fast prefill product (16-bit inputs, f32 sums) is the f32 product
    /// of its inputs rounded as the `half` crate rounds them (x to the
    /// weight's type, f16 for the block types, whose widened values are
    /// rounded too), on the device's matrix units where it has them, else
    /// formed by the other kernels; values near the limits of f16 (large,
    /// subnormal) included. Also many rows by few outputs, which the
    /// matrix units form transposed.
    pub fn fast_products_round_their_inputs<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        let k = 256;
        let types = [WeightType::BF16, WeightType::F16, WeightType::Q8_0, WeightType::Q4_K];
        for (ty, (m, n)) in types.into_iter().flat_map(|ty| [(ty, (33, 40)), (ty, (300, 40))]) {
            let half = half_of(ty);
            let mut x = random(&mut rng, m * k);
            x[0] = 60_000.0;
            x[1] = 3.0e-6;
            x[2] = -1.0e-8;
            let stored = random_rows(&mut rng, ty, n, k);
            let w = Weight::upload(client, &stored, ty, n, k).unwrap();
            let widened = dequantized(ty, &stored);
            let x_tensor = Tensor::from_f32(client, &x, &[m, k]);
            let got = cleave_shaders::with_precision(cleave_shaders::Precision::Fast, || {
                cleave_shaders::matmul_weight(client, &x_tensor, &w).unwrap()
            });
            let got = got.to_vec(client).unwrap();
            let what = format!("fast {ty} product over {m} rows");
            // Only the order of the f32 sums differs from the f64 product
            // of the rounded inputs.
            let (x, widened) = (round_to(half, &x), round_to(half, &widened));
            assert_matches_f64(&got, &x, &widened, k, &what, seed);
        }
    }

    /// A fast product of block-type weights decodes them tile by tile in
    /// shared memory, on the matrix units where the device has them, else
    /// formed by ordinary units from the same tiles: each block layout
    /// (every block type under CLEAVE_TEST_EVERY_VARIANT), over
    /// more than one cube of rows and of columns with ragged edges, a step
    /// of 32 and of 64 values of k, and each way its sums are finished (a
    /// bias, into columns of a wider output; the residual add; a gated
    /// product whose up weight is of another type, or f16), against the f64
    /// product of the inputs rounded to f16.
    pub fn fast_block_products_decode_their_tiles<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        let block_types: Vec<WeightType> = common::product_types()
            .into_iter()
            .filter(|t| t.block_len() > 1)
            .collect();
        // Each type gated with the next as its up weight (f16 after the
        // last), over 256 values; and Q8_0 over 96, a step of 32.
        let mut cases: Vec<_> = (block_types.iter().enumerate())
            .map(|(i, &ty)| (ty, block_types.get(i + 1).copied().unwrap_or(WeightType::F16), 256))
            .collect();
        cases.push((WeightType::Q8_0, WeightType::Q4_0, 96));
        let (m, n) = (70, 67);
        for (ty, up_ty, k) in cases {
            let upload = |rng: &mut StdRng, ty: WeightType| {
                let stored = random_rows(rng, ty, n, k);
                let w = Weight::upload(client, &stored, ty, n, k).unwrap();
                (w, dequantized(ty, &stored))
            };
            let (w, up) = (upload(&mut rng, ty), upload(&mut rng, up_ty));
            check_fast_finishes(client, &mut rng, (w, up), (m, 72, 2), WeightType::F16, seed);
        }
    }

    /// A fast product of f16 or bf16 weights (on the matrix units where
    /// the device has them: cuBLAS on CUDA, cubek elsewhere) finishes its
    /// sums each way: stored into columns of a wider output, with a bias,
    /// added in (the residual add) and gated; over few rows and over many
    /// rows by few outputs, which cubek forms transposed.
    pub fn fast_half_products_finish_their_sums<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        let (n, k) = (40, 256);
        for (ty, m) in [WeightType::BF16, WeightType::F16]
            .into_iter()
            .flat_map(|ty| [(ty, 70), (ty, 300)])
        {
            let upload = |rng: &mut StdRng| {
                let stored = random_rows(rng, ty, n, k);
                let w = Weight::upload(client, &stored, ty, n, k).unwrap();
                (w, dequantized(ty, &stored))
            };
            let (w, up) = (upload(&mut rng), upload(&mut rng));
            check_fast_finishes(client, &mut rng, (w, up), (m, 48, 4), ty, seed);
        }
    }

    /// On a CPU adapter, llvmpipe stops every loop of an invocation past
    /// 65,535 iterations in all, silently. A gated product of Q8_0 weights
    /// over the most values of k the decoded product takes there
    /// (`most_depth_on_units`) is the product of the rounded inputs; a step
    /// past, the exact product takes it, its inputs unrounded.
    pub fn fast_block_products_keep_within_the_loop_budget<R: Runtime>(client: &ComputeClient<R>) {
        use cleave_shaders::{with_precision, Precision};
        let (mut rng, seed) = seeded();
        let (m, n) = (2, 2);
        for (k, rounded) in [(99_328, true), (99_360, false)] {
            let upload = |rng: &mut StdRng| {
                let stored = random_rows(rng, WeightType::Q8_0, n, k);
                let w = Weight::upload(client, &stored, WeightType::Q8_0, n, k).unwrap();
                (w, dequantized(WeightType::Q8_0, &stored))
            };
            let ((w, mut w_values), (up, mut up_values)) = (upload(&mut rng), upload(&mut rng));
            let mut x = random(&mut rng, m * k);
            let out = Tensor::empty(client, &[m, n]);
            let gated = Output::Gated {
                up: &up,
                activation: Activation::Silu,
            };
            with_precision(Precision::Fast, || {
                let x = Tensor::from_f32(client, &x, &[m, k]);
                cleave_shaders::matmul_weight_into(client, &x, &w, &out, 0, Epilogue::new(gated)).unwrap()
            });
            if rounded {
                for values in [&mut x, &mut w_values, &mut up_values] {
                    *values = round_to(WeightType::F16, values);
                }
            }
            let (s, s_size) = matmul_f64(&x, &w_values, k);
            let (u, u_size) = matmul_f64(&x, &up_values, k);
            for (i, &g) in out.to_vec(client).unwrap().iter().enumerate() {
                let (want, tolerance) = gated_silu_f64((s[i], s_size[i]), (u[i], u_size[i]));
                assert!(
                    (g as f64 - want).abs() <= tolerance + 1e-6 * want.abs(),
                    "fast gated Q8_0 product over {k} values, rounded {rounded}: element {i} is {g}, \
                     f64 reference {want} (seed {seed})"
                );
            }
        }
    }

    /// A convolution at `fast` is the f32 convolution of its map rounded
    /// to the weight's 16-bit type: by a bf16 or f16 weight on the matrix
    /// units where the device has them (each chunk of pixels' windows
    /// gathered into 16 bits), else by the implicit GEMM over the rounded
    /// map; by a block type's values rounded to f16, decoded tile by tile
    /// beside windows read in place (over more than one cube of pixels and
    /// of channels). At `exact` the same weight gives the bits of its f32
    /// widening.
    pub fn fast_convolutions_round_their_inputs<R: Runtime>(client: &ComputeClient<R>) {
        use cleave_shaders::Precision;
        let (mut rng, seed) = seeded();
        let cases = [
            (WeightType::BF16, (16, 24, 9, 13, 3)),
            (WeightType::F16, (8, 5, 6, 7, 1)),
            (WeightType::BF16, (24, 3, 7, 5, 3)),
            (WeightType::Q8_0, (32, 70, 9, 8, 3)),
            (WeightType::Q4_K, (256, 6, 5, 3, 1)),
        ];
        for (ty, (channels, out_channels, h, w, k)) in cases {
            let taps = channels * k * k;
            let mut x = random(&mut rng, channels * h * w);
            x[0] = 60_000.0;
            x[1] = 3.0e-6;
            x[2] = -1.0e-8;
            let stored = random_rows(&mut rng, ty, out_channels, taps);
            let weight = Weight::upload(client, &stored, ty, out_channels, taps).unwrap();
            let widened = dequantized(ty, &stored);
            let half = half_of(ty);
            let bias = random(&mut rng, out_channels);
            let (x_t, bias_t) = (
                Tensor::from_f32(client, &x, &[channels, h, w]),
                Tensor::from_f32(client, &bias, &[out_channels]),
            );
            let conv = |precision: Precision, weight: &Weight| {
                let out = cleave_shaders::with_precision(precision, || {
                    cleave_shaders::conv2d(client, &x_t, weight, k, &bias_t).unwrap()
                });
                out.to_vec(client).unwrap()
            };
            let what = format!("{ty} conv2d {channels}->{out_channels} {h}x{w} k{k}");
            let fast = conv(Precision::Fast, &weight);
            // A block type's values are rounded too, as its tiles are
            // decoded; the halves are exactly their stored values.
            let (rounded, rounded_weight) = (round_to(half, &x), round_to(half, &widened));
            let want = reference::conv2d(&rounded, &rounded_weight, &bias, channels, h, w, k);
            // The scale each f32 sum's rounding error is relative to.
            let abs = |v: &[f32]| v.iter().map(|a| a.abs()).collect::<Vec<_>>();
            let magnitude = reference::conv2d(&abs(&rounded), &abs(&rounded_weight), &abs(&bias), channels, h, w, k);
            for (i, ((&g, &w), &m)) in fast.iter().zip(&want).zip(&magnitude).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5 * m + 1e-30,
                    "fast {what}: element {i} is {g}, reference over the rounded map {w} (seed {seed})"
                );
            }
            let exact = conv(Precision::Exact, &weight);
            assert!(fast != exact, "fast {what}: the same values as exact");
            let f32_weight = Weight::from_tensor(Tensor::from_f32(client, &widened, &[out_channels, taps]));
            assert_same_bits(
                &exact,
                &conv(Precision::Exact, &f32_weight),
                &format!("exact {what}"),
                seed,
            );
        }
    }

    /// The path fast products take on `client`'s device: the matrix units
    /// where it has them (fast is then its default), else the rounded
    /// inputs in the other kernels.
    fn fast_path<R: Runtime>(client: &ComputeClient<R>) -> cleave_shaders::ProductPath {
        match cleave_shaders::default_precision(client) {
            cleave_shaders::Precision::Fast => cleave_shaders::ProductPath::MatrixUnits,
            cleave_shaders::Precision::Exact => cleave_shaders::ProductPath::Rounded,
        }
    }

    /// What a convolution allocates beside its output is what
    /// `ProductPath::conv_scratch_bytes` counts for the planner: all of
    /// it, but for the sums the matrix units form apart, which the pool
    /// may hand back from an earlier chunk. Exact and fast, f32 and 16-bit
    /// weights, 1×1 and 3×3; each case has shapes of its own, so that no
    /// buffer freed by an earlier one is taken again unseen.
    pub fn conv_scratch_is_what_the_planner_counts<R: Runtime>(client: &ComputeClient<R>) {
        use cleave_shaders::profile::Counters;
        use cleave_shaders::{Precision, ProductPath};
        // The allocations counted are the process's.
        if crate::common::alone::ran_alone() {
            return;
        }
        let (mut rng, _) = seeded();
        let mut case = 0;
        for (precision, path) in [
            (Precision::Exact, ProductPath::Exact),
            (Precision::Fast, fast_path(client)),
        ] {
            for ty in [WeightType::F32, WeightType::BF16, WeightType::F16] {
                for k in [1, 3] {
                    let (channels, out_channels, h, w) = (8, 5 + case, 6 + case, 7);
                    case += 1;
                    let taps = channels * k * k;
                    let stored = random_rows(&mut rng, ty, out_channels, taps);
                    let weight = Weight::upload(client, &stored, ty, out_channels, taps).unwrap();
                    let x = Tensor::from_f32(client, &random(&mut rng, channels * h * w), &[channels, h, w]);
                    let bias = Tensor::from_f32(client, &random(&mut rng, out_channels), &[out_channels]);
                    cleave_shaders::profile::sync(client).unwrap();
                    let before = Counters::now();
                    let out = cleave_shaders::with_precision(precision, || {
                        cleave_shaders::conv2d(client, &x, &weight, k, &bias).unwrap()
                    });
                    let output = (out.len() * size_of::<f32>()) as u64;
                    let scratch = Counters::now().since(before).allocated_bytes - output;
                    let counted = path.conv_scratch_bytes(ty, (h * w, out_channels, taps), k);
                    let sums = match path {
                        ProductPath::MatrixUnits => (h * w * out_channels * size_of::<f32>()) as u64,
                        _ => 0,
                    };
                    let what = format!(
                        "{} {ty} conv2d {channels}->{out_channels} {h}x{w} k{k}",
                        precision.name()
                    );
                    assert!(
                        scratch <= counted && scratch + sums >= counted,
                        "{what}: allocated {scratch} bytes beside its output, counted {counted}"
                    );
                }
            }
        }
    }

    /// What a prefill product allocates beyond its input and output is
    /// what `ProductPath::scratch_bytes` says (the planner's count): all of
    /// it where cubek forms the sums apart from the output, all but those
    /// sums where `matmul_blocked` finishes them itself. Exact and fast
    /// products (on the matrix units where the device has them), plain and
    /// gated, of every kind of weight type. Each case has shapes of its own,
    /// so that no buffer freed by an earlier one is taken again unseen.
    pub fn prefill_scratch_is_what_the_planner_counts<R: Runtime>(client: &ComputeClient<R>) {
        use cleave_shaders::profile::Counters;
        use cleave_shaders::{Precision, ProductPath};
        // The allocations counted are the process's.
        if crate::common::alone::ran_alone() {
            return;
        }
        let (mut rng, _) = seeded();
        let k = 256;
        let types = [
            WeightType::F32,
            WeightType::BF16,
            WeightType::F16,
            WeightType::Q8_0,
            WeightType::Q4_K,
        ];
        let mut case = 0;
        for (precision, path) in [
            (Precision::Exact, ProductPath::Exact),
            (Precision::Fast, fast_path(client)),
        ] {
            for ty in types {
                for gated in [false, true] {
                    let (m, n) = (61 + case, 100 + case);
                    case += 1;
                    let upload =
                        |rng: &mut StdRng| Weight::upload(client, &random_rows(rng, ty, n, k), ty, n, k).unwrap();
                    let (w, up) = (upload(&mut rng), upload(&mut rng));
                    let x = Tensor::from_f32(client, &random(&mut rng, m * k), &[m, k]);
                    let out = Tensor::from_f32(client, &vec![0.0; m * n], &[m, n]);
                    let epilogue = match gated {
                        true => Epilogue::new(Output::Gated {
                            up: &up,
                            activation: Activation::Silu,
                        }),
                        false => Epilogue::accumulate(),
                    };
                    cleave_shaders::profile::sync(client).unwrap();
                    let before = Counters::now();
                    cleave_shaders::with_precision(precision, || {
                        cleave_shaders::matmul_weight_into(client, &x, &w, &out, 0, epilogue).unwrap()
                    });
                    let allocated = Counters::now().since(before).allocated_bytes;
                    let counted = path.scratch_bytes(ty, (m, n, k), gated);
                    let sums = (if gated { 2 } else { 1 } * m * n * size_of::<f32>()) as u64;
                    let what = format!(
                        "{} {ty} product [{m}, {k}] x [{n}, {k}], gated {gated}",
                        precision.name()
                    );
                    assert!(
                        allocated <= counted && allocated + sums >= counted,
                        "{what}: allocated {allocated} bytes, counted {counted} (of which {sums} of sums)"
                    );
                }
            }
        }
    }

    pub fn dequantize_rows_equals_the_twins<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        for ty in WeightType::ALL {
            for cols in widths(ty) {
                let rows = 37;
                let bytes = random_rows(&mut rng, ty, rows, cols);
                let w = Weight::upload(client, &bytes, ty, rows, cols).unwrap();
                assert_eq!(w.bytes(), bytes.len());
                let want = dequantized(ty, &bytes);
                for range in [0..rows, 5..6, 3..20, 36..37] {
                    let out = cleave_shaders::dequantize_rows(client, &w, range.clone()).unwrap();
                    assert_eq!(out.shape, [range.len(), cols]);
                    assert_same_bits(
                        &out.to_vec(client).unwrap(),
                        &want[range.start * cols..range.end * cols],
                        &format!("{ty} rows {range:?} of [{rows}, {cols}]"),
                        seed,
                    );
                }
            }
        }
    }

    pub fn matmul_weight_matches_f64_dot_products<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        for ty in common::product_types() {
            for cols in widths(ty) {
                // 37 outputs: not a multiple of any tiling.
                let rows = 37;
                let bytes = random_rows(&mut rng, ty, rows, cols);
                let w = Weight::upload(client, &bytes, ty, rows, cols).unwrap();
                let values = dequantized(ty, &bytes);
                // Decode (one row, three sequences), then prefill.
                for shape in [vec![1, cols], vec![3, 1, cols], vec![7, cols], vec![33, cols]] {
                    check_matmul(client, &w, &values, &shape, &mut rng, seed);
                }
            }
        }
    }

    /// A sequence decoded beside others gets exactly what it gets alone,
    /// whatever the weight's type.
    pub fn batched_decode_rows_equal_single_rows<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        for ty in common::product_types() {
            let (n, k, m) = (45, widths(ty)[1], 9);
            let w = Weight::upload(client, &random_rows(&mut rng, ty, n, k), ty, n, k).unwrap();
            let x = random(&mut rng, m * k);
            let single: Vec<f32> = x
                .chunks(k)
                .flat_map(|row| {
                    let x = Tensor::from_f32(client, row, &[1, k]);
                    cleave_shaders::matmul_weight(client, &x, &w)
                        .unwrap()
                        .to_vec(client)
                        .unwrap()
                })
                .collect();
            for rows in [2, 3, 5, m] {
                let x = Tensor::from_f32(client, &x[..rows * k], &[rows, 1, k]);
                let got = cleave_shaders::matmul_weight(client, &x, &w)
                    .unwrap()
                    .to_vec(client)
                    .unwrap();
                assert_same_bits(
                    &got,
                    &single[..rows * n],
                    &format!("{ty}: {rows} sequences at once vs one by one"),
                    seed,
                );
            }
        }
    }

    /// A weight split by rows (`upload_rows`), each part filling its
    /// columns of one output, gives what the whole weight gives.
    pub fn row_chunks_fill_one_output<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        for ty in common::product_types() {
            let (n, k) = (41, widths(ty)[1]);
            let bytes = random_rows(&mut rng, ty, n, k);
            let whole = Weight::upload(client, &bytes, ty, n, k).unwrap();
            for m in [1, 6] {
                let x = Tensor::from_f32(client, &random(&mut rng, m * k), &[m, k]);
                let out = Tensor::empty(client, &[m, n]);
                for rows in [0..17, 17..40, 40..41] {
                    let part = Weight::upload_rows(client, &bytes, ty, k, rows.clone()).unwrap();
                    assert_eq!((part.rows, part.cols), (rows.len(), k));
                    cleave_shaders::matmul_weight_into(client, &x, &part, &out, rows.start, Epilogue::default())
                        .unwrap();
                }
                let want = cleave_shaders::matmul_weight(client, &x, &whole).unwrap();
                assert_same_bits(
                    &out.to_vec(client).unwrap(),
                    &want.to_vec(client).unwrap(),
                    &format!("{ty}: {m} rows through three row chunks"),
                    seed,
                );
            }
        }
    }

    /// A bias, the residual add and the gated product finished by the
    /// matmul give bit for bit what the separate kernels give after a
    /// plain matmul, for decode and prefill shapes, gate and up of any two
    /// types.
    pub fn epilogues_give_the_bits_of_the_separate_kernels<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        let k = 256;
        let n = 37;
        let pairs = [
            (WeightType::F32, WeightType::F32),
            (WeightType::Q4_K, WeightType::Q6_K),
            (WeightType::BF16, WeightType::Q8_0),
        ];
        for (gate_ty, up_ty) in pairs {
            let upload = |rng: &mut StdRng, ty| Weight::upload(client, &random_rows(rng, ty, n, k), ty, n, k).unwrap();
            let (gate, up) = (upload(&mut rng, gate_ty), upload(&mut rng, up_ty));
            // The bias of a layer whose rows 3.. this weight holds.
            let bias_values = random(&mut rng, n + 5);
            let bias = Tensor::from_f32(client, &bias_values, &[n + 5]);
            let own_bias = Tensor::from_f32(client, &bias_values[3..3 + n], &[n]);
            for shape in [vec![1, k], vec![3, 1, k], vec![6, k]] {
                let m: usize = shape[..shape.len() - 1].iter().product();
                let x = Tensor::from_f32(client, &random(&mut rng, m * k), &shape);
                let what = format!("{gate_ty}/{up_ty} {shape:?}");
                let plain = cleave_shaders::matmul_weight(client, &x, &gate).unwrap();
                let with_bias = plain.to_vec(client).unwrap();
                let with_bias = Tensor::from_f32(client, &with_bias, &plain.shape);
                cleave_shaders::add_bias(client, &with_bias, &own_bias).unwrap();
                let run = |out: &Tensor, epilogue: Epilogue| {
                    cleave_shaders::matmul_weight_into(client, &x, &gate, out, 0, epilogue).unwrap();
                    out.to_vec(client).unwrap()
                };
                let biased = Epilogue::default().with_bias(Some(&bias), 3);
                let got = run(&Tensor::empty(client, &plain.shape), biased);
                assert_same_bits(&got, &with_bias.to_vec(client).unwrap(), &format!("{what}: bias"), seed);

                let residual = random(&mut rng, m * n);
                let want = Tensor::from_f32(client, &residual, &plain.shape);
                cleave_shaders::add_assign(client, &want, &with_bias).unwrap();
                let into = Tensor::from_f32(client, &residual, &plain.shape);
                let got = run(&into, Epilogue::accumulate().with_bias(Some(&bias), 3));
                assert_same_bits(
                    &got,
                    &want.to_vec(client).unwrap(),
                    &format!("{what}: residual add"),
                    seed,
                );

                let up_sums = cleave_shaders::matmul_weight(client, &x, &up).unwrap();
                // The activation is one line of the kernel whatever the
                // types: every one over the first pair, silu over the rest.
                let activations = match (gate_ty, up_ty) == pairs[0] || common::every_variant() {
                    true => &Activation::ALL[..],
                    false => &[Activation::Silu],
                };
                for &activation in activations {
                    let want = cleave_shaders::gated_mul(client, &with_bias, &up_sums, activation).unwrap();
                    let output = Output::Gated { up: &up, activation };
                    let epilogue = Epilogue::new(output).with_bias(Some(&bias), 3);
                    let got = run(&Tensor::empty(client, &plain.shape), epilogue);
                    let what = format!("{what}: gated {activation:?}");
                    assert_same_bits(&got, &want.to_vec(client).unwrap(), &what, seed);
                }

                // An RMS norm of `x` first, in the decode kernel as it
                // reads `x`: the bits of `rms_norm` and then the product,
                // plain and gated.
                let norm = Tensor::from_f32(client, &random(&mut rng, k), &[k]);
                let normed = cleave_shaders::rms_norm(client, &x, &norm, 1e-5).unwrap();
                let want = cleave_shaders::matmul_weight(client, &normed, &gate).unwrap();
                let got = run(
                    &Tensor::empty(client, &plain.shape),
                    Epilogue::default().with_norm(Some((&norm, 1e-5))),
                );
                assert_same_bits(&got, &want.to_vec(client).unwrap(), &format!("{what}: normed"), seed);
                let gate_sums = cleave_shaders::matmul_weight(client, &normed, &up).unwrap();
                let want = cleave_shaders::gated_mul(client, &want, &gate_sums, Activation::Silu).unwrap();
                let output = Output::Gated {
                    up: &up,
                    activation: Activation::Silu,
                };
                let epilogue = Epilogue::new(output).with_norm(Some((&norm, 1e-5)));
                let got = run(&Tensor::empty(client, &plain.shape), epilogue);
                assert_same_bits(
                    &got,
                    &want.to_vec(client).unwrap(),
                    &format!("{what}: normed, gated"),
                    seed,
                );
            }
        }
        let w = Weight::empty(client, WeightType::F32, 4, 8).unwrap();
        let other = Weight::empty(client, WeightType::F32, 5, 8).unwrap();
        let (x, out) = (Tensor::empty(client, &[1, 8]), Tensor::empty(client, &[1, 4]));
        let gated = Output::Gated {
            up: &other,
            activation: Activation::Silu,
        };
        let epilogue = Epilogue::new(gated);
        let err = cleave_shaders::matmul_weight_into(client, &x, &w, &out, 0, epilogue).unwrap_err();
        assert!(err.to_string().contains("up"), "{err}");
        let short = Tensor::empty(client, &[5]);
        let epilogue = Epilogue::default().with_bias(Some(&short), 2);
        let err = cleave_shaders::matmul_weight_into(client, &x, &w, &out, 0, epilogue).unwrap_err();
        assert!(err.to_string().contains("bias"), "{err}");
    }

    /// Prefill widens a typed weight in row chunks of at most 32 MiB of
    /// f32: a weight of 4100 rows of 2048 takes two.
    pub fn prefill_in_several_widened_chunks<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        let (ty, n, k) = (WeightType::Q4_0, 4100, 2048);
        let bytes = random_rows(&mut rng, ty, n, k);
        let w = Weight::upload(client, &bytes, ty, n, k).unwrap();
        check_matmul(client, &w, &dequantized(ty, &bytes), &[5, k], &mut rng, seed);
    }

    /// F32 weights go through `matmul_into` unchanged, whether made from a
    /// tensor or uploaded as bytes.
    pub fn f32_weights_take_the_f32_path_bit_for_bit<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        let n = 37;
        for k in widths(WeightType::F32) {
            let values = random(&mut rng, n * k);
            let tensor = Tensor::from_f32(client, &values, &[n, k]);
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            let uploaded = Weight::upload(client, &bytes, WeightType::F32, n, k).unwrap();
            for shape in [vec![1, k], vec![3, 1, k], vec![7, k]] {
                let x = Tensor::from_f32(client, &random(&mut rng, shape.iter().product()), &shape);
                let want = cleave_shaders::matmul(client, &x, &tensor)
                    .unwrap()
                    .to_vec(client)
                    .unwrap();
                for w in [Weight::from_tensor(tensor.clone()), uploaded.clone()] {
                    let got = cleave_shaders::matmul_weight(client, &x, &w)
                        .unwrap()
                        .to_vec(client)
                        .unwrap();
                    assert_same_bits(&got, &want, &format!("F32 {shape:?}"), seed);
                }
            }
        }
    }

    pub fn embedding_weight_in_chunks<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        for ty in WeightType::ALL {
            let (vocab, cols) = (11, widths(ty)[1]);
            let bytes = random_rows(&mut rng, ty, vocab, cols);
            let ids: Vec<u32> = (0..9).map(|_| rng.random_range(0..vocab as u32)).collect();
            let out = Tensor::empty(client, &[ids.len(), cols]);
            for rows in [0..4, 4..10, 10..11] {
                let chunk = Weight::upload_rows(client, &bytes, ty, cols, rows.clone()).unwrap();
                cleave_shaders::embedding_weight(client, &chunk, rows.start, &ids, &out).unwrap();
            }
            let want = reference::embedding(&dequantized(ty, &bytes), cols, &ids);
            assert_same_bits(&out.to_vec(client).unwrap(), &want, &format!("{ty} embedding"), seed);
        }
    }

    pub fn bad_weights_are_refused_by_name<R: Runtime>(client: &ComputeClient<R>) {
        let message = |e: KernelError| e.to_string();
        let wrong_length = Weight::upload(client, &[0; 33], WeightType::Q8_0, 1, 32).unwrap_err();
        assert!(matches!(wrong_length, KernelError::Weight { .. }));
        assert_eq!(
            message(wrong_length),
            "Weight::upload: 33 bytes given for 1 rows of 32 Q8_0 values, which take 34"
        );
        assert_eq!(
            message(Weight::upload(client, &[0; 144], WeightType::Q4_K, 1, 100).unwrap_err()),
            "Weight::upload: rows of 100 Q4_K values are not whole blocks of 256"
        );
        assert_eq!(
            message(Weight::upload_rows(client, &[0; 36], WeightType::Q4_0, 32, 1..3).unwrap_err()),
            "Weight::upload_rows: rows 1..3 of 32 Q4_0 values (18 bytes each) are not within 36 bytes"
        );
        let w = Weight::upload(client, &[0; 36], WeightType::Q4_0, 2, 32).unwrap();
        assert_eq!(
            message(cleave_shaders::dequantize_rows(client, &w, 1..3).unwrap_err()),
            "dequantize_rows: rows 1..3 asked of a Q4_0 weight of 2 rows"
        );
        let x = Tensor::empty(client, &[1, 31]);
        assert_eq!(
            message(cleave_shaders::matmul_weight(client, &x, &w).unwrap_err()),
            "matmul: weight has shape [2, 32], expected [n, 31]"
        );
        let out = Tensor::empty(client, &[2, 31]);
        assert_eq!(
            message(cleave_shaders::embedding_weight(client, &w, 0, &[0, 1], &out).unwrap_err()),
            "embedding_weight: out has shape [2, 31], expected [2, 32]"
        );
    }

    /// Every tensor of each GGUF fixture (rows as stored), uploaded as it
    /// is stored, widens on the device to exactly what cleave-gguf's
    /// dequantization (bit-exact against gguf-py) gives, and multiplies a
    /// random x as the f64 dot products of those values do.
    pub fn gguf_fixture_tensors<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        let files = fixture_files();
        assert!(!files.is_empty(), "no GGUF fixtures in {}", fixture_dir().display());
        let mut types_seen = Vec::new();
        for path in files {
            let file = GgufFile::open(&path).unwrap();
            for info in file.tensors() {
                // ggml's ne: the row first. Vectors are one row.
                let (cols, rows) = (info.dims[0], info.dims[1..].iter().product::<usize>());
                let ty = info.ty;
                let data = file.tensor_data(&info.name).unwrap();
                let what = format!("{} {} ({ty}, [{rows}, {cols}])", path.display(), info.name);
                let mut want = vec![0.0; info.elements()];
                cleave_gguf::dequantize(info.ty, data, &mut want).unwrap();
                let w = Weight::upload(client, data, ty, rows, cols).unwrap();
                let got = cleave_shaders::dequantize_rows(client, &w, 0..rows).unwrap();
                assert_same_bits(&got.to_vec(client).unwrap(), &want, &what, seed);
                if rows > 1 {
                    let got = check_matmul(client, &w, &want, &[1, cols], &mut rng, seed);
                    assert_eq!(got.len(), rows, "{what}");
                }
                if !types_seen.contains(&ty) {
                    types_seen.push(ty);
                }
            }
        }
        for ty in WeightType::ALL {
            assert!(types_seen.contains(&ty), "no fixture tensor of type {ty}");
        }
    }
}

/// The 16-bit type fast products round to for weights of `ty`: bf16 for
/// bf16, f16 for the rest (the block types among them).
fn half_of(ty: WeightType) -> WeightType {
    match ty {
        WeightType::BF16 => WeightType::BF16,
        _ => WeightType::F16,
    }
}

/// `x` rounded to `half` (F16 or BF16) and back, as the `half` crate (and
/// PyTorch) round: to nearest, ties to even.
fn round_to(half: WeightType, x: &[f32]) -> Vec<f32> {
    x.iter()
        .map(|&v| match half {
            WeightType::BF16 => half::bf16::from_f32(v).to_f32(),
            _ => half::f16::from_f32(v).to_f32(),
        })
        .collect()
}

/// `bytes` stored as `ty`, dequantized by cleave-gguf's twins of ggml's
/// `dequantize_row_*` (equal to gguf-py's on every fixture tensor).
fn dequantized(ty: WeightType, bytes: &[u8]) -> Vec<f32> {
    let mut out = vec![0.0; bytes.len() / ty.block_bytes() * ty.block_len()];
    cleave_gguf::dequantize(ty, bytes, &mut out).expect("whole blocks");
    out
}

/// The GGUF fixtures: CLEAVE_SHARED, else `shared/` beside the repository.
fn fixture_dir() -> PathBuf {
    std::env::var_os("CLEAVE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared"))
        .join("fixtures/llama-gguf")
}

/// The GGUF files of the shared llama-gguf fixture and of the project's
/// own quant-type fixtures (tests/fixtures/gguf-types*).
fn fixture_files() -> Vec<PathBuf> {
    let own = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let dirs = [fixture_dir(), own.join("gguf-types"), own.join("gguf-types-k")];
    let mut files: Vec<PathBuf> = dirs
        .iter()
        .flat_map(|dir| {
            std::fs::read_dir(dir)
                .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect::<Vec<_>>())
                .unwrap_or_default()
        })
        .collect();
    files.retain(|p| p.extension().is_some_and(|e| e == "gguf"));
    files.sort();
    files
}
