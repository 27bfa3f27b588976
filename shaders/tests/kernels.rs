//! Every kernel against its plain-Rust reference, on random inputs drawn
//! fresh each run (the seed is printed on failure; set CLEAVE_TEST_SEED to
//! replay it), for several shapes including odd ones.
//!
//! Runs on the device named by CLEAVE_TEST_DEVICE, else the best one found
//! (lavapipe in CI).

use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{
    dequantize_rows, kv_cache, reference, Activation, AttentionShape, CacheWrite, HeadNorms, KernelError, KeyRanges,
    RopeTable, RowIndex, Tensor, Weight, WeightType,
};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

use crate::common;
use common::{assert_close, random, seeded};

// The ops with a tiled and a unit form, each checked in both.
kernel_tests!(in both forms:
    matmul,
    matmul_into_column_chunks,
    matmul_rows_do_not_depend_on_the_batch,
    matmul_over_long_rows,
    attention_prefill_and_decode,
    attention_sliding_window,
    attention_soft_capped,
    attention_within_segments,
    attention_over_long_rows,
    attention_of_wide_heads_over_many_keys,
    attention_with_score_bias,
    attention_decode_in_pieces,
    fast_attention_rounds_its_inputs,
);

kernel_tests!(
    matmul_past_the_loop_budget,
    fast_attention_keeps_within_the_loop_budget,
    argmax_picks_as_the_host_does,
    sample_picks_as_the_host_does,
    logprob_reports_as_the_host_gives_them,
    penalties_as_the_host_applies_them,
    rms_norm,
    split_qkv,
    causal_conv,
    gated_delta_rule,
    layer_norm,
    activations_in_place,
    gated_activations,
    modulate,
    in_place_updates,
    rope_pairs,
    add_rows_scaled,
    copy_rows,
    copy_columns,
    columns_of,
    embedding_in_chunks,
    half_casts,
    conv2d,
    group_norm,
    upsample_nearest2x,
    transpose,
);

mod checks {
    use super::*;
    use cleave_shaders::{DeltaHeads, StateRing, StateRoute, StateRoutes};

    /// The device's attention of query rows `q` (of shape `q_shape`) over
    /// the keys and values `k`, `v`, row `s` seeing key rows `ranges[s]`
    /// (plus `bias` on the scores), read back.
    fn attend<R: Runtime>(
        client: &ComputeClient<R>,
        (q, q_shape): (&[f32], &[usize]),
        (k, v): (&Tensor, &Tensor),
        shape: AttentionShape,
        ranges: &[(u32, u32)],
        bias: Option<&Tensor>,
    ) -> Vec<f32> {
        let q = Tensor::from_f32(client, q, q_shape);
        let out = cleave_shaders::attention(client, &q, k, v, shape, &KeyRanges::new(client, ranges), bias);
        out.unwrap().to_vec(client).unwrap()
    }

    /// The plain-Rust twin's attention where query row `s` sees key rows
    /// `ranges[s]`.
    fn twin_over_ranges(q: &[f32], k: &[f32], v: &[f32], shape: AttentionShape, ranges: &[(u32, u32)]) -> Vec<f32> {
        let visible = |s: usize, t: usize| ranges[s].0 as usize <= t && t < ranges[s].1 as usize;
        reference::attention(q, k, v, shape, visible, (None, None))
    }

    /// `x` rounded to `half` (F16 or BF16) and back, to nearest even.
    fn round_to(half: WeightType, x: f32) -> f32 {
        match half {
            WeightType::BF16 => half::bf16::from_f32(x).to_f32(),
            _ => half::f16::from_f32(x).to_f32(),
        }
    }

    /// Attention at `--precision fast` as its products form it: the
    /// scores of q and k rounded to `half`, each row's `exp(score − max)`
    /// rounded too before they weigh v rounded, the sum over the row's
    /// unrounded exponentials.
    fn fast_twin(
        (q, k, v): (&[f32], &[f32], &[f32]),
        shape: AttentionShape,
        half: WeightType,
        ranges: &[(u32, u32)],
    ) -> Vec<f32> {
        let (heads, kv_heads, d) = (shape.heads, shape.kv_heads, shape.head_dim);
        let round = |x: &[f32]| -> Vec<f64> { x.iter().map(|&v| round_to(half, v) as f64).collect() };
        let (q, k, v) = (round(q), round(k), round(v));
        let rows = q.len() / (heads * d);
        let mut out = vec![0.0; rows * heads * d];
        for s in 0..rows {
            let (start, end) = (ranges[s].0 as usize, ranges[s].1 as usize);
            for h in 0..heads {
                let g = h / (heads / kv_heads);
                let qv = &q[(s * heads + h) * d..][..d];
                let scores: Vec<f64> = (start..end)
                    .map(|t| {
                        let kv = &k[(t * kv_heads + g) * d..][..d];
                        let score = qv.iter().zip(kv).map(|(a, b)| a * b).sum::<f64>() * shape.scale as f64;
                        shape
                            .softcap
                            .map_or(score, |cap| (score / cap as f64).tanh() * cap as f64)
                    })
                    .collect();
                let most = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = scores.iter().map(|s| (s - most).exp()).sum();
                for (t, score) in (start..end).zip(&scores) {
                    let p = round_to(half, (score - most).exp() as f32) as f64 / sum;
                    for i in 0..d {
                        out[(s * heads + h) * d + i] += p * v[(t * kv_heads + g) * d + i];
                    }
                }
            }
        }
        out.into_iter().map(|o| o as f32).collect()
    }

    /// Prefill attention at `--precision fast` (`fast_attention.rs`):
    /// rows of one sequence after a cached prefix, grouped heads (one, two
    /// and four to a key/value head), plain and with a sliding window and a
    /// soft cap, in bf16 and f16, heads of 64, of 40 (padded to whole
    /// 16-wide fragments) and of 512 (each plane holding half of it), against
    /// the rounded twin. An exponential the device computes in f32 and the
    /// twin in f64 may round to neighbouring halves where it lies near their
    /// midpoint: each element is held to one such step summed over a row's
    /// keys (2^-8 in bf16, 2^-11 in f16), and on average to a twentieth of
    /// its distance from the f32 twin. Measured on lavapipe: at most 1.2e-7
    /// from the rounded twin in bf16 and 6.7e-5 in f16 (a step), against
    /// 1.4e-3 to 2.8e-3 and 1.9e-4 to 3.5e-4 from the f32 twin. At exact precision the same call takes the flash kernel and
    /// matches the f32 twin as ever. Rows of two sequences in slots apart,
    /// the keys between them no row's and poisoned with NaN, take the same
    /// paths: the fast pass reads those keys as zeros.
    pub fn fast_attention_rounds_its_inputs<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        let (prefix, rows) = (5, 37);
        let keys = prefix + rows;
        let cases = [
            (WeightType::BF16, (4, 2, 64), 0, None, 4e-3),
            (WeightType::F16, (4, 2, 64), 16, Some(2.0), 5e-4),
            (WeightType::BF16, (4, 1, 40), 0, None, 4e-3),
            (WeightType::F16, (1, 1, 512), 8, None, 5e-4),
        ];
        for (half, (heads, kv_heads, head_dim), window, softcap, tolerance) in cases {
            let q = random(&mut rng, rows * heads * head_dim);
            let k = random(&mut rng, keys * kv_heads * head_dim);
            let v = random(&mut rng, keys * kv_heads * head_dim);
            let shape = AttentionShape {
                softcap,
                ..AttentionShape::new(heads, kv_heads, head_dim)
            }
            .rounding_like(half);
            let run = |precision, (k, v): (&[f32], &[f32]), ranges: &[(u32, u32)]| {
                let kt = Tensor::from_f32(client, k, &[keys, kv_heads * head_dim]);
                let vt = Tensor::from_f32(client, v, &[keys, kv_heads * head_dim]);
                cleave_shaders::with_precision(precision, || {
                    attend(client, (&q, &[rows, heads * head_dim]), (&kt, &vt), shape, ranges, None)
                })
            };
            let what = format!(
                "{half} attention, {heads}/{kv_heads} heads of {head_dim}, window {window}, soft cap {softcap:?}"
            );
            // The device's keys and values, and the twins' (which read keys
            // no row sees).
            let check = |device: (&[f32], &[f32]), (k, v): (&[f32], &[f32]), ranges: &[(u32, u32)], what: &str| {
                let fast = run(cleave_shaders::Precision::Fast, device, ranges);
                let rounded = fast_twin((&q, k, v), shape, half, ranges);
                let unrounded = twin_over_ranges(&q, k, v, shape, ranges);
                assert_rounded(&fast, (&rounded, &unrounded), tolerance, &format!("fast {what}"), seed);
                let exact = run(cleave_shaders::Precision::Exact, device, ranges);
                assert_close(&exact, &unrounded, 1e-5, &format!("exact {what}"), seed);
            };
            let ranges: Vec<(u32, u32)> = (0..rows).map(|r| KeyRanges::causal(prefix + r, window)).collect();
            check((&k, &v), (&k, &v), &ranges, &what);
            let apart: Vec<(u32, u32)> = (0..rows)
                .map(|r| match r < 10 {
                    true => (0, r as u32 + 1),
                    false => (20, 20 + (r as u32 - 10) / 2 + 1),
                })
                .collect();
            let gap = 10 * kv_heads * head_dim..20 * kv_heads * head_dim;
            let (mut k_poisoned, mut v_poisoned) = (k.clone(), v.clone());
            k_poisoned[gap.clone()].fill(f32::NAN);
            v_poisoned[gap].fill(f32::NAN);
            let what = format!("{what}, two sequences apart");
            check((&k_poisoned, &v_poisoned), (&k, &v), &apart, &what);
        }
    }

    /// `fast` within `tolerance` of its `rounded` twin, and on average far
    /// nearer it than the `unrounded` one: where the device and the twin
    /// round a value to neighbouring halves the difference is a step, but
    /// such steps are rare.
    #[track_caller]
    fn assert_rounded(fast: &[f32], (rounded, unrounded): (&[f32], &[f32]), tolerance: f32, what: &str, seed: u64) {
        assert_close(fast, rounded, tolerance, what, seed);
        let mean_off = |want: &[f32]| -> f64 {
            let off: f64 = fast.iter().zip(want).map(|(g, w)| (g - w).abs() as f64).sum();
            off / fast.len() as f64
        };
        let (mean_rounded, mean_unrounded) = (mean_off(rounded), mean_off(unrounded));
        assert!(
            mean_rounded * 20.0 < mean_unrounded,
            "{what}: {mean_rounded:e} from the rounded twin on average, {mean_unrounded:e} from the f32 one (seed {seed})"
        );
    }

    /// Prefill attention at `fast` over as many keys as a CPU adapter's
    /// loop budget lets one pass of the tiles span (8,192 for heads of 64,
    /// 4,832 for heads of 128: `TilePlan::most_keys_on_units`), near its
    /// rounded twin: were the budget's count of a unit's loop iterations
    /// short, llvmpipe would cut the loops and the result would be far off
    /// (as it was over 9,696 keys of heads of 64, when the count left out
    /// the checks that end each loop). One key more takes the flash kernel
    /// there, exact. Devices without that budget take the tiles for both.
    pub fn fast_attention_keeps_within_the_loop_budget<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        let rows = 2;
        let budgeted = cleave_shaders::default_precision(client) == cleave_shaders::Precision::Exact
            && cleave_shaders::kernels_for(client) == cleave_shaders::Kernels::Unit;
        for (head_dim, most) in [(64, 8_192), (128, 4_832)] {
            let shape = AttentionShape::new(1, 1, head_dim).rounding_like(WeightType::BF16);
            for keys in [most, most + 1] {
                let q = random(&mut rng, rows * head_dim);
                let (k, v) = (random(&mut rng, keys * head_dim), random(&mut rng, keys * head_dim));
                let (kt, vt) = (
                    Tensor::from_f32(client, &k, &[keys, head_dim]),
                    Tensor::from_f32(client, &v, &[keys, head_dim]),
                );
                let ranges: Vec<(u32, u32)> = (0..rows).map(|r| KeyRanges::causal(keys - rows + r, 0)).collect();
                let fast = cleave_shaders::with_precision(cleave_shaders::Precision::Fast, || {
                    attend(client, (&q, &[rows, head_dim]), (&kt, &vt), shape, &ranges, None)
                });
                let unrounded = twin_over_ranges(&q, &k, &v, shape, &ranges);
                let what = format!("fast attention over {keys} keys of heads of {head_dim}");
                match budgeted && keys > most {
                    true => assert_close(&fast, &unrounded, 1e-5, &what, seed),
                    false => {
                        let rounded = fast_twin((&q, &k, &v), shape, WeightType::BF16, &ranges);
                        assert_rounded(&fast, (&rounded, &unrounded), 4e-3, &what, seed);
                    }
                }
            }
        }
    }

    pub fn matmul<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        for (m, n, k) in [
            (1, 1, 1),
            (1, 129, 100),
            (1, 7, 333),
            (3, 7, 5),
            (5, 40, 33),
            (17, 64, 64),
            (33, 129, 100),
        ] {
            let x = random(&mut rng, m * k);
            let w = random(&mut rng, n * k);
            let out = cleave_shaders::matmul(
                client,
                &Tensor::from_f32(client, &x, &[m, k]),
                &Tensor::from_f32(client, &w, &[n, k]),
            )
            .unwrap();
            assert_eq!(out.shape, [m, n]);
            let want = reference::matmul(&x, &w, m, n, k);
            assert_close(
                &out.to_vec(client).unwrap(),
                &want,
                1e-5,
                &format!("matmul {m}x{n}x{k}"),
                seed,
            );
        }
    }

    /// Rows as long as FLUX's MLP down projection takes, in prefill and
    /// decode: every value of k counts.
    pub fn matmul_over_long_rows<R: Runtime>(client: &ComputeClient<R>) {
        long_products(client, &[(5, 9, 12_288), (1, 9, 12_288)]);
    }

    /// Rows past llvmpipe's loop budget (65,535 iterations an invocation,
    /// after which its loops stop silently), in the form the device takes
    /// (on llvmpipe the unit form: cubek's product in prefill).
    pub fn matmul_past_the_loop_budget<R: Runtime>(client: &ComputeClient<R>) {
        long_products(client, &[(5, 9, 70_000), (1, 9, 70_000)]);
    }

    /// `matmul` for each `(m, n, k)` against f64 dot products, within a
    /// millionth of each sum's magnitude (its terms' absolute values
    /// summed), about what f32 sums of these lengths keep; a dropped share
    /// of the terms is orders of magnitude more.
    fn long_products<R: Runtime>(client: &ComputeClient<R>, shapes: &[(usize, usize, usize)]) {
        let (mut rng, seed) = seeded();
        for &(m, n, k) in shapes {
            let x = random(&mut rng, m * k);
            let w = random(&mut rng, n * k);
            let out = cleave_shaders::matmul(
                client,
                &Tensor::from_f32(client, &x, &[m, k]),
                &Tensor::from_f32(client, &w, &[n, k]),
            )
            .unwrap()
            .to_vec(client)
            .unwrap();
            for (at, got) in out.iter().enumerate() {
                let (r, c) = (at / n, at % n);
                let terms = (0..k).map(|i| x[r * k + i] as f64 * w[c * k + i] as f64);
                let (sum, magnitude) = terms.fold((0.0, 0.0), |(s, a), t| (s + t, a + t.abs()));
                assert!(
                    (*got as f64 - sum).abs() <= 1e-6 * magnitude,
                    "matmul {m}x{n}x{k}: element {at} is {got}, f64 reference {sum} (seed {seed})"
                );
            }
        }
    }

    pub fn matmul_into_column_chunks<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        for m in [1, 5] {
            let (n, k) = (37, 19);
            let x = random(&mut rng, m * k);
            let w = random(&mut rng, n * k);
            let xt = Tensor::from_f32(client, &x, &[m, k]);
            let out = Tensor::empty(client, &[m, n]);
            // Rows 0..20 and 20..37 of w as two buffers filling one output.
            for (start, end) in [(0, 20), (20, n)] {
                let chunk = Tensor::from_f32(client, &w[start * k..end * k], &[end - start, k]);
                cleave_shaders::matmul_into(client, &xt, &chunk, &out, start).unwrap();
            }
            let want = reference::matmul(&x, &w, m, n, k);
            assert_close(&out.to_vec(client).unwrap(), &want, 1e-5, "chunked matmul", seed);
        }
        let bad = Tensor::empty(client, &[4, 3]);
        let x = Tensor::empty(client, &[1, 5]);
        assert!(
            cleave_shaders::matmul(client, &x, &bad).is_err(),
            "k mismatch must be refused"
        );
    }

    /// Decoding several sequences in one pass must give each exactly what
    /// it gets alone: every row of `x: [sequences, 1, k]` is bit-for-bit
    /// the product of that row on its own.
    pub fn matmul_rows_do_not_depend_on_the_batch<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        let (n, k, m) = (70, 200, 19);
        let w = Tensor::from_f32(client, &random(&mut rng, n * k), &[n, k]);
        let x = random(&mut rng, m * k);
        let single: Vec<f32> = x
            .chunks(k)
            .flat_map(|row| {
                let out = cleave_shaders::matmul(client, &Tensor::from_f32(client, row, &[1, k]), &w).unwrap();
                out.to_vec(client).unwrap()
            })
            .collect();
        for rows in [2, 3, 5, m] {
            let x = Tensor::from_f32(client, &x[..rows * k], &[rows, 1, k]);
            let out = cleave_shaders::matmul(client, &x, &w).unwrap();
            assert_eq!(out.shape, [rows, 1, n]);
            let got = out.to_vec(client).unwrap();
            assert_close(
                &got,
                &single[..rows * n],
                0.0,
                &format!("{rows} sequences at once vs one by one"),
                seed,
            );
        }
    }

    /// The device's greedy pick of each row: random rows, rows whose
    /// largest value occurs twice (the first wins), a banned largest value,
    /// an all -∞ row, NaNs and infinities (named by their first index), and
    /// a soft cap under which two large logits tie; vocabularies past one
    /// unit's loop and past llvmpipe's budget for one; and all of it again
    /// with grammar masks on some rows ([`masks_for`]).
    pub fn argmax_picks_as_the_host_does<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        for cols in [1, 5, 300, 2048 + 7, 70_000] {
            let rows = 7;
            let mut x = random(&mut rng, rows * cols);
            let at = |r: usize, j: usize| r * cols + j.min(cols - 1);
            x[at(1, 3)] = 9.0;
            x[at(1, cols / 2)] = 9.0;
            x[at(2, 7)] = 8.0;
            x[at(3, 0)..at(3, cols - 1) + 1].fill(f32::NEG_INFINITY);
            x[at(4, cols / 3)] = f32::NAN;
            x[at(4, cols - 1)] = f32::INFINITY;
            x[at(5, cols - 1)] = f32::NEG_INFINITY;
            x[at(6, 2)] = 30.0;
            x[at(6, cols / 2 + 2)] = 40.0;
            let banned: [&[u32]; 7] = [&[], &[], &[(7).min(cols as u32 - 1), 0], &[1], &[], &[2, 3], &[]];
            let logits = Tensor::from_f32(client, &x, &[rows, cols]);
            let unmasked = (vec![None; rows], banned.iter().map(|b| b.to_vec()).collect());
            for (masks, held) in [unmasked, masks_for(&mut rng, &banned, cols)] {
                let held: Vec<&[u32]> = held.iter().map(Vec::as_slice).collect();
                let masks: Vec<Option<&[u32]>> = masks.iter().map(Option::as_deref).collect();
                for softcap in [None, Some(1.0)] {
                    let picked = cleave_shaders::Picked::new(client, rows);
                    let table = cleave_shaders::Banned::masked(client, &banned, &masks, cols);
                    cleave_shaders::argmax(client, &logits, &table, softcap, &picked).unwrap();
                    let got = picked.read(client).unwrap();
                    let want = reference::argmax(&x, cols, &held, softcap);
                    let masked = masks.iter().flatten().count();
                    assert_eq!(
                        got, want,
                        "argmax over {cols} columns, soft cap {softcap:?}, {masked} rows masked (seed {seed})"
                    );
                }
            }
        }
    }

    /// Sampling on the device against the host's sampler, draw after
    /// draw (the device moves each row's count of uniforms on): greedy
    /// rows beside sampling ones with top-k from 1 to the most the device
    /// takes, top-p cuts and temperatures, banned ids, grammar masks
    /// ([`masks_for`]), a soft cap, a row with fewer tokens than its
    /// top-k, and NaNs and infinities (named by their first index);
    /// vocabularies of one chunk and of several passes.
    pub fn sample_picks_as_the_host_does<R: Runtime>(client: &ComputeClient<R>) {
        use cleave_shaders::{sample_on_host, Penalties, SampleRules, SamplerConfig, NON_FINITE};
        let (mut rng, seed) = seeded();
        let config = |temperature, top_k, top_p| SamplerConfig {
            temperature,
            top_k,
            top_p,
            seed: rng_seed(seed, top_k),
            penalties: Penalties::default(),
        };
        let configs = [
            config(0.8, 40, 0.95),
            config(0.0, 40, 0.95),
            config(1.0, 1, 1.0),
            config(2.0, 256, 1.0),
            config(0.5, 7, 0.5),
            config(1.5, 100, 0.99),
            config(1.0, 3, 1.0),
        ];
        for cols in [5, 300, 2048 + 7, 70_000] {
            let rows = configs.len();
            // Logits spread enough that top-p cuts somewhere inside top-k:
            // each row a shuffle of values evenly spaced over ±6. Spaced,
            // not drawn: two drawn logits can lie closer than the device's
            // tanh and the host's differ (a few ulps), and the soft cap
            // would then order them differently on each side.
            let mut x = spaced_rows(&mut rng, rows, cols, 6.0);
            let at = |r: usize, j: usize| r * cols + j.min(cols - 1);
            x[at(1, 3)] = 9.0;
            x[at(1, cols / 2)] = 9.0;
            x[at(5, cols / 3)] = f32::NAN;
            x[at(5, cols - 1)] = f32::INFINITY;
            let banned: Vec<&[u32]> = vec![&[0, 1], &[3], &[], &[2], &[], &[], &[4]];
            let (masks, held) = masks_for(&mut rng, &banned, cols);
            let masks: Vec<Option<&[u32]>> = masks.iter().map(Option::as_deref).collect();
            let logits = Tensor::from_f32(client, &x, &[rows, cols]);
            for softcap in [None, Some(4.0)] {
                let table = cleave_shaders::Banned::masked(client, &banned, &masks, cols);
                let picked = cleave_shaders::Picked::new(client, rows);
                let rules: Vec<(SamplerConfig, u32)> = configs.iter().map(|c| (*c, 0)).collect();
                let rules = SampleRules::new(client, &rules).unwrap();
                for drawn in 0..4 {
                    cleave_shaders::sample(client, &logits, &table, softcap, &rules, &picked).unwrap();
                    let got = picked.read(client).unwrap();
                    for (r, config) in configs.iter().enumerate() {
                        let mut row: Vec<f32> = x[r * cols..(r + 1) * cols].to_vec();
                        let first_bad = row.iter().position(|l| !l.is_finite());
                        if let Some(cap) = softcap {
                            row.iter_mut().for_each(|l| *l = (*l / cap).tanh() * cap);
                        }
                        for &id in &held[r] {
                            if let Some(l) = row.get_mut(id as usize) {
                                *l = f32::NEG_INFINITY;
                            }
                        }
                        let want = match first_bad {
                            Some(j) => j as u32 | NON_FINITE,
                            None => sample_on_host(&row, config, drawn, &[]).unwrap(),
                        };
                        assert_eq!(
                            got[r], want,
                            "row {r} ({config:?}) over {cols} columns, soft cap {softcap:?}, draw {drawn} (seed {seed})"
                        );
                    }
                }
            }
        }
    }

    /// Each pick's log-probability and the most likely tokens' against the
    /// log-softmax in f64 of the same logits: soft-capped or not; a row
    /// whose largest logit occurs twice (the smaller id first); vocabularies
    /// of one chunk, of several, and narrower than the tokens asked for.
    pub fn logprob_reports_as_the_host_gives_them<R: Runtime>(client: &ComputeClient<R>) {
        use cleave_shaders::{logprob_reports, LogprobReports};
        let (mut rng, seed) = seeded();
        let rows = 3;
        for cols in [4, 300, 2048 + 7, 70_000] {
            // Spaced values, as in the sampling test: no two drawn logits
            // land closer than the device's tanh and the host's differ.
            let mut x = spaced_rows(&mut rng, rows, cols, 8.0);
            x[cols + cols / 2] = 9.0;
            x[cols + cols - 1] = 9.0;
            let logits = Tensor::from_f32(client, &x, &[rows, cols]);
            let top = 5.min(cols);
            let reports = LogprobReports::new(client, rows, top).unwrap();
            let banned = cleave_shaders::Banned::new(client, &[&[], &[], &[0]]);
            for softcap in [None, Some(4.0)] {
                let picked = cleave_shaders::Picked::new(client, rows);
                cleave_shaders::argmax(client, &logits, &banned, softcap, &picked).unwrap();
                logprob_reports(client, &logits, softcap, &picked, &reports).unwrap();
                let ids = picked.read(client).unwrap();
                for (r, got) in reports.read(client).unwrap().into_iter().enumerate() {
                    let row = &x[r * cols..(r + 1) * cols];
                    let (logprob, want) = reference::logprobs(row, ids[r], top, softcap);
                    let what = format!("row {r} over {cols} columns, soft cap {softcap:?} (seed {seed})");
                    assert!(
                        (got.logprob - logprob).abs() < 1e-4,
                        "{what}: {} vs {logprob}",
                        got.logprob
                    );
                    let got_ids: Vec<u32> = got.top.iter().map(|&(id, _)| id).collect();
                    let want_ids: Vec<u32> = want.iter().map(|&(id, _)| id).collect();
                    assert_eq!(got_ids, want_ids, "{what}");
                    for (&(_, g), &(_, w)) in got.top.iter().zip(&want) {
                        assert!((g - w).abs() < 1e-4, "{what}: {g} vs {w}");
                    }
                }
            }
        }
    }

    /// Repetition penalties against the host's: soft-capped first where
    /// asked, repeats counted (an id three times), negative and positive
    /// logits, a row without penalties, an empty window; then each row's
    /// pick appended to its window on the device, the oldest id giving way
    /// in a full one.
    pub fn penalties_as_the_host_applies_them<R: Runtime>(client: &ComputeClient<R>) {
        use cleave_shaders::{append_picks_to, penalize, History, Penalties};
        let (mut rng, seed) = seeded();
        let cols = 300;
        let on = |last_n| Penalties {
            repeat: 1.3,
            frequency: 0.25,
            presence: -0.5,
            last_n,
        };
        let rows: Vec<(Penalties, Vec<u32>)> = vec![
            (on(4), vec![5, 7, 7, 7]),
            (Penalties::default(), vec![]),
            (on(8), vec![]),
            (on(3), vec![1, 2, 299]),
        ];
        let host = |x: &[f32], windows: &[Vec<u32>], softcap: Option<f32>| -> Vec<f32> {
            let mut out = x.to_vec();
            for (r, (penalties, _)) in rows.iter().enumerate() {
                let row = &mut out[r * cols..(r + 1) * cols];
                if let Some(cap) = softcap {
                    row.iter_mut().for_each(|l| *l = (*l / cap).tanh() * cap);
                }
                if !penalties.is_off() {
                    penalties.apply_on_host(row, penalties.window(&windows[r]));
                }
            }
            out
        };
        for softcap in [None, Some(2.0)] {
            let table: Vec<(Penalties, &[u32])> = rows.iter().map(|(p, w)| (*p, w.as_slice())).collect();
            let history = History::new(client, &table).unwrap();
            let mut windows: Vec<Vec<u32>> = rows.iter().map(|(_, w)| w.clone()).collect();
            for round in 0..3 {
                let x: Vec<f32> = random(&mut rng, rows.len() * cols).iter().map(|v| v * 4.0).collect();
                let logits = Tensor::from_f32(client, &x, &[rows.len(), cols]);
                penalize(client, &logits, &history, softcap).unwrap();
                let want = host(&x, &windows, softcap);
                let what = format!("penalties, soft cap {softcap:?}, round {round}");
                assert_close(&logits.to_vec(client).unwrap(), &want, 1e-5, &what, seed);
                // Each row's pick joins its window (of the penalized logits).
                let picked = cleave_shaders::Picked::new(client, rows.len());
                let banned = cleave_shaders::Banned::new(client, &[&[], &[], &[], &[]]);
                cleave_shaders::argmax(client, &logits, &banned, None, &picked).unwrap();
                append_picks_to(client, &picked, &history).unwrap();
                for (window, id) in windows.iter_mut().zip(picked.read(client).unwrap()) {
                    window.push(id);
                }
            }
        }
    }

    /// `rows` rows of `cols` logits, each a shuffle of values evenly spaced
    /// over ±`spread`.
    fn spaced_rows(rng: &mut StdRng, rows: usize, cols: usize, spread: f32) -> Vec<f32> {
        let spaced = |j: usize| ((j as f32 + 0.5) / cols as f32 * 2.0 - 1.0) * spread;
        (0..rows)
            .flat_map(|_| {
                let mut row: Vec<f32> = (0..cols).map(spaced).collect();
                row.shuffle(rng);
                row
            })
            .collect()
    }

    /// Grammar masks over `cols` ids for every other row of `banned`:
    /// random ids allowed (the last always, so that some id is), a mask
    /// shorter than the vocabulary (its missing words allow nothing) and
    /// the rest unmasked; beside them each row's ids held from its pick,
    /// its banned ones and those outside its mask, for the host to take
    /// as -∞.
    #[allow(clippy::type_complexity)]
    fn masks_for(rng: &mut StdRng, banned: &[&[u32]], cols: usize) -> (Vec<Option<Vec<u32>>>, Vec<Vec<u32>>) {
        let words = cols.div_ceil(32);
        let masks: Vec<Option<Vec<u32>>> = (0..banned.len())
            .map(|r| match r % 4 {
                0 => {
                    let mut mask: Vec<u32> = (0..words).map(|_| rng.random()).collect();
                    mask[(cols - 1) / 32] |= 1 << ((cols - 1) % 32);
                    Some(mask)
                }
                2 => Some(vec![u32::MAX; words.div_ceil(2)]),
                _ => None,
            })
            .collect();
        let held = banned
            .iter()
            .zip(&masks)
            .map(|(banned, mask)| {
                let outside = |j: usize| match mask {
                    Some(mask) => mask.get(j / 32).is_none_or(|word| word >> (j % 32) & 1 == 0),
                    None => false,
                };
                let mut held = banned.to_vec();
                held.extend((0..cols).filter(|&j| outside(j)).map(|j| j as u32));
                held
            })
            .collect();
        (masks, held)
    }

    /// A sampler seed of its own for each row.
    fn rng_seed(seed: u64, salt: usize) -> u64 {
        seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(salt as u64)
    }

    pub fn rms_norm<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        // More rows than one grid dimension has cubes (FLUX's per-head norm
        // of a 1024x1024 image has 110,592).
        for (rows, cols) in [(1, 1), (1, 64), (3, 100), (7, 333), (70_000, 3)] {
            let x = random(&mut rng, rows * cols);
            let w = random(&mut rng, cols);
            let out = cleave_shaders::rms_norm(
                client,
                &Tensor::from_f32(client, &x, &[rows, cols]),
                &Tensor::from_f32(client, &w, &[cols]),
                1e-5,
            )
            .unwrap();
            let want = reference::rms_norm(&x, &w, 1e-5);
            assert_close(
                &out.to_vec(client).unwrap(),
                &want,
                1e-5,
                &format!("rms_norm {rows}x{cols}"),
                seed,
            );
        }
    }

    /// Four sequences in one pass, as a server's batch and a speculative
    /// step give them: one continuing from its state, one starting from
    /// zeros, and two keeping their recent states in a ring: one of fewer
    /// rows than the ring (every row's state and the one before, from
    /// position 3 on, in states 3..=8) and one of more (the last four
    /// rows', in states 9..=12).
    fn state_routes() -> ([StateRoute; 4], usize) {
        let ring = |base, len, at| Some(StateRing { base, len, at });
        let routes = [
            StateRoute {
                first_row: 0,
                rows: 3,
                source: Some(1),
                dest: 1,
                ring: None,
            },
            StateRoute {
                first_row: 3,
                rows: 1,
                source: None,
                dest: 0,
                ring: None,
            },
            StateRoute {
                first_row: 4,
                rows: 5,
                source: Some(2),
                dest: 2,
                ring: ring(3, 6, 3),
            },
            StateRoute {
                first_row: 9,
                rows: 5,
                source: Some(9),
                dest: 13,
                ring: ring(9, 4, 2),
            },
        ];
        (routes, 14)
    }

    /// Each route's rows of `rows` (of `width` values each).
    fn route_rows<'a>(rows: &'a [f32], route: &StateRoute, width: usize) -> &'a [f32] {
        &rows[route.first_row * width..(route.first_row + route.rows) * width]
    }

    /// Where `route` leaves the state after `done` of its rows: its ring
    /// slot, where it keeps that one.
    fn ring_slot(route: &StateRoute, done: usize) -> Option<usize> {
        let ring = route.ring?;
        (route.rows - done < ring.len).then(|| ring.base + (ring.at + done) % ring.len)
    }

    /// `causal_conv` against its f64 twin: each sequence's output, its
    /// window after the pass, and the checkpointed windows.
    pub fn causal_conv<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        let (routes, states) = state_routes();
        for (channels, taps) in [(128, 4), (37, 2), (5, 3)] {
            let keep = taps - 1;
            let x = random(&mut rng, 14 * channels);
            let weight = random(&mut rng, channels * taps);
            let windows = random(&mut rng, states * keep * channels);
            let on_device = Tensor::from_f32(client, &windows, &[states, keep, channels]);
            let out = cleave_shaders::causal_conv(
                client,
                &Tensor::from_f32(client, &x, &[14, channels]),
                &Tensor::from_f32(client, &weight, &[channels, taps]),
                &on_device,
                &StateRoutes::new(client, &routes).unwrap(),
            )
            .unwrap()
            .to_vec(client)
            .unwrap();
            let after = on_device.to_vec(client).unwrap();
            let window = |i: usize| i * keep * channels..(i + 1) * keep * channels;
            for route in &routes {
                let start = route
                    .source
                    .map_or(vec![0.0; keep * channels], |s| windows[window(s)].to_vec());
                let rows = route_rows(&x, route, channels);
                let (want, last) = reference::causal_conv(rows, &weight, &start, channels);
                let what = format!("causal_conv {channels}x{taps}, rows from {}", route.first_row);
                assert_close(route_rows(&out, route, channels), &want, 1e-5, &what, seed);
                assert_close(&after[window(route.dest)], &last, 0.0, &format!("{what}: window"), seed);
                for r in 0..=route.rows {
                    if let Some(slot) = ring_slot(route, r) {
                        let (_, at) = reference::causal_conv(&rows[..r * channels], &weight, &start, channels);
                        let what = format!("{what}: the ring's window after {r} rows");
                        assert_close(&after[window(slot)], &at, 0.0, &what, seed);
                    }
                }
            }
        }
    }

    /// `gated_delta_rule` against its f64 twin: the output and the state
    /// of each sequence, and the states its ring keeps, for grouped heads
    /// and odd sizes.
    pub fn gated_delta_rule<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        let (routes, count) = state_routes();
        let sizes = [
            (2, 16, 4, 16, false),
            (2, 16, 4, 16, true),
            (1, 5, 3, 7, false),
            (2, 128, 2, 64, false),
        ];
        for (key_heads, key_dim, value_heads, value_dim, tiled_values) in sizes {
            let heads = DeltaHeads {
                key_heads,
                key_dim,
                value_heads,
                value_dim,
                tiled_values,
            };
            let (width, out_width, len) = (heads.qkv_width(), value_heads * value_dim, heads.state_len());
            let qkv = random(&mut rng, 14 * width);
            let (a, b) = (random(&mut rng, 14 * value_heads), random(&mut rng, 14 * value_heads));
            let a_log: Vec<f32> = random(&mut rng, value_heads).iter().map(|v| v * 2.0).collect();
            let dt_bias = random(&mut rng, value_heads);
            let states = random(&mut rng, count * len);
            let on_device = Tensor::from_f32(client, &states, &[count, value_heads, key_dim, value_dim]);
            let tensor = |v: &[f32], cols| Tensor::from_f32(client, v, &[14, cols]);
            let out = cleave_shaders::gated_delta_rule(
                client,
                heads,
                &tensor(&qkv, width),
                (&tensor(&a, value_heads), &tensor(&b, value_heads)),
                (
                    &Tensor::from_f32(client, &a_log, &[value_heads]),
                    &Tensor::from_f32(client, &dt_bias, &[value_heads]),
                ),
                &on_device,
                &StateRoutes::new(client, &routes).unwrap(),
            )
            .unwrap()
            .to_vec(client)
            .unwrap();
            let after = on_device.to_vec(client).unwrap();
            let state = |i: usize| i * len..(i + 1) * len;
            for route in &routes {
                let start = route.source.map_or(vec![0.0; len], |s| states[state(s)].to_vec());
                let twin = |rows: usize| {
                    let part = StateRoute { rows, ..*route };
                    let gates = (route_rows(&a, &part, value_heads), route_rows(&b, &part, value_heads));
                    reference::gated_delta_rule(
                        heads,
                        route_rows(&qkv, &part, width),
                        gates,
                        (&a_log, &dt_bias),
                        &start,
                    )
                };
                let (want, last) = twin(route.rows);
                let what = format!("gated_delta_rule {heads:?}, rows from {}", route.first_row);
                assert_close(route_rows(&out, route, out_width), &want, 1e-4, &what, seed);
                assert_close(&after[state(route.dest)], &last, 1e-4, &format!("{what}: state"), seed);
                for r in 0..=route.rows {
                    if let Some(slot) = ring_slot(route, r) {
                        let what = format!("{what}: the ring's state after {r} rows");
                        assert_close(&after[state(slot)], &twin(r).1, 1e-4, &what, seed);
                    }
                }
            }
        }
    }

    /// `split_qkv` against the twins: each q and k head normed (where
    /// norms are given) and rotated, k and v in their cache rows, in f32 and
    /// in f16 caches.
    pub fn split_qkv<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        // (heads, kv heads, rotated pairs, head_dim, positions): head_dim
        // past twice the pairs is a partial rotary (Phi-3), its tail
        // unrotated; 300 dimensions take several turns of the units.
        let cases: [(usize, usize, usize, usize, &[u32]); 6] = [
            (1, 1, 1, 2, &[0]),
            (4, 2, 4, 8, &[0, 1, 2, 3, 4]),
            (4, 4, 16, 32, &[37]),
            (2, 1, 5, 10, &[11, 12, 13, 14, 15, 16]),
            // Rows of three sequences at their own positions.
            (2, 2, 3, 6, &[7, 0, 1, 2, 40]),
            (3, 1, 100, 300, &[0, 5]),
        ];
        for (heads, kv_heads, half, head_dim, positions) in cases {
            // (q and k normed, v normed too, the cache's type)
            for (normed, values, ty) in [
                (false, false, WeightType::F32),
                (true, false, WeightType::F32),
                (true, true, WeightType::F32),
                (true, false, WeightType::F16),
            ] {
                let rows = positions.len();
                let slots = heads + 2 * kv_heads;
                let inv_freq: Vec<f32> = (0..half).map(|i| 10000f32.powf(-(i as f32) / half as f32)).collect();
                let qkv = random(&mut rng, rows * slots * head_dim);
                let (q_norm, k_norm) = (random(&mut rng, head_dim), random(&mut rng, head_dim));
                let table = RopeTable::new(client, &inv_freq, 64);
                // Each row's keys and values go to cache row 2·r + 1 of 2·rows + 1.
                let cache_rows: Vec<u32> = (0..rows as u32).map(|r| 2 * r + 1).collect();
                let width = kv_heads * head_dim;
                let caches = [0, 1].map(|_| kv_cache(client, ty, 2 * rows + 1, width).unwrap());
                let norm_tensors = [&q_norm, &k_norm].map(|w| Tensor::from_f32(client, w, &[head_dim]));
                let norms = normed.then(|| HeadNorms {
                    q: &norm_tensors[0],
                    k: &norm_tensors[1],
                    eps: 1e-5,
                    values,
                });
                let q = cleave_shaders::split_qkv(
                    client,
                    &Tensor::from_f32(client, &qkv, &[rows, slots * head_dim]),
                    (heads, kv_heads),
                    (&table, &RowIndex::new(client, positions)),
                    norms,
                    Some(CacheWrite {
                        k: &caches[0],
                        v: &caches[1],
                        rows: &RowIndex::new(client, &cache_rows),
                    }),
                )
                .unwrap();
                // The twins: the heads of q, k and v, each normed and rotated.
                let part = |first: usize, count: usize, norm: Option<&[f32]>, rotate: bool| {
                    let mut out: Vec<f32> = qkv
                        .chunks(slots * head_dim)
                        .flat_map(|row| row[first * head_dim..(first + count) * head_dim].to_vec())
                        .collect();
                    if let Some(weight) = norm.filter(|_| normed) {
                        out = out
                            .chunks(head_dim)
                            .flat_map(|h| reference::rms_norm(h, weight, 1e-5))
                            .collect();
                    }
                    if rotate {
                        reference::rope(&mut out, &inv_freq, count, positions);
                    }
                    out
                };
                let what =
                    format!("split_qkv {heads}+{kv_heads} heads of {head_dim}, {ty} cache, norms {normed}, v {values}");
                let want_q = part(0, heads, Some(&q_norm), true);
                assert_close(&q.to_vec(client).unwrap(), &want_q, 1e-5, &format!("{what}: q"), seed);
                // q's heads alone, with no cache to write: the same q.
                let q_only: Vec<f32> = qkv
                    .chunks(slots * head_dim)
                    .flat_map(|row| row[..heads * head_dim].to_vec())
                    .collect();
                let q_alone = cleave_shaders::split_qkv(
                    client,
                    &Tensor::from_f32(client, &q_only, &[rows, heads * head_dim]),
                    (heads, kv_heads),
                    (&table, &RowIndex::new(client, positions)),
                    norms,
                    None,
                )
                .unwrap();
                assert_close(
                    &q_alone.to_vec(client).unwrap(),
                    &want_q,
                    1e-5,
                    &format!("{what}: q alone"),
                    seed,
                );
                let unit = vec![1.0; head_dim];
                let wants = [
                    part(heads, kv_heads, Some(&k_norm), true),
                    part(heads + kv_heads, kv_heads, values.then_some(unit.as_slice()), false),
                ];
                for (name, cache, want) in [("k", &caches[0], &wants[0]), ("v", &caches[1], &wants[1])] {
                    let held = dequantize_rows(client, cache, 0..2 * rows + 1)
                        .unwrap()
                        .to_vec(client)
                        .unwrap();
                    for (r, want_row) in want.chunks(width).enumerate() {
                        let at = cache_rows[r] as usize * width;
                        let want_row: Vec<f32> = match ty {
                            WeightType::F16 => want_row.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect(),
                            _ => want_row.to_vec(),
                        };
                        // An f16 value one rounding step off the twin's is
                        // a difference of an f32 ulp at a tie.
                        let tol = if ty == WeightType::F16 { 1e-3 } else { 1e-5 };
                        assert_close(
                            &held[at..at + width],
                            &want_row,
                            tol,
                            &format!("{what}: {name} row {r}"),
                            seed,
                        );
                    }
                }
            }
        }
        // Refusals: positions past the table, one position per row.
        let table = RopeTable::new(client, &[1.0], 4);
        let cache = kv_cache(client, WeightType::F32, 4, 2).unwrap();
        let qkv = Tensor::empty(client, &[3, 6]);
        let split = |positions: &[u32]| {
            let write = CacheWrite {
                k: &cache,
                v: &cache,
                rows: &RowIndex::new(client, &[0, 1, 2]),
            };
            cleave_shaders::split_qkv(
                client,
                &qkv,
                (1, 1),
                (&table, &RowIndex::new(client, positions)),
                None,
                Some(write),
            )
        };
        assert!(split(&[2, 3, 4]).is_err(), "positions past the table must be refused");
        assert!(split(&[0, 1]).is_err(), "one position per row");
        assert!(split(&[0, 1, 2]).is_ok());
    }

    fn check_attention<R: Runtime>(
        client: &ComputeClient<R>,
        (window, softcap): (usize, Option<f32>),
        rng: &mut StdRng,
        seed: u64,
    ) {
        // Heads of up to 80 dimensions (two rows of units) and of 300 (more
        // than four rows: two dimensions a unit), and ranges of up to 145
        // keys (three tiles).
        for (heads, kv_heads, head_dim) in [(1, 1, 1), (4, 2, 8), (6, 1, 5), (3, 3, 16), (4, 2, 80), (1, 1, 300)] {
            let context = 150;
            let width = kv_heads * head_dim;
            let k = random(rng, context * width);
            let v = random(rng, context * width);
            let kt = Tensor::from_f32(client, &k, &[context, width]);
            let vt = Tensor::from_f32(client, &v, &[context, width]);
            let shape = AttentionShape {
                heads,
                kv_heads,
                head_dim,
                scale: 1.0 / (head_dim as f32).sqrt(),
                softcap,
                half: None,
            };
            // A prefill of 9 rows, then one decode row at position 9, ...
            for (rows, pos0) in [(9, 0), (1, 9), (4, 19), (6, 139)] {
                let q = random(rng, rows * heads * head_dim);
                let ranges: Vec<(u32, u32)> = (0..rows).map(|s| KeyRanges::causal(pos0 + s, window)).collect();
                let out = attend(
                    client,
                    (&q, &[rows, heads * head_dim]),
                    (&kt, &vt),
                    shape,
                    &ranges,
                    None,
                );
                let visible = |s: usize, t: usize| t <= pos0 + s && (window == 0 || pos0 + s - t < window);
                let want = reference::attention(&q, &k, &v, shape, visible, (None, None));
                let what = format!(
                    "attention h{heads} kv{kv_heads} d{head_dim} rows{rows} pos{pos0} window{window} cap{softcap:?}"
                );
                assert_close(&out, &want, 1e-5, &what, seed);
            }
            // ... and decode rows of three sequences, each in its own part
            // of the cache (rows 0..8, 8..16, 16..23), in one call.
            let (parts, positions) = ([0usize, 8, 16], [7usize, 2, 6]);
            let ranges: Vec<(u32, u32)> = parts
                .iter()
                .zip(positions)
                .map(|(&base, pos)| {
                    let (start, end) = KeyRanges::causal(pos, window);
                    (base as u32 + start, base as u32 + end)
                })
                .collect();
            let q = random(rng, 3 * heads * head_dim);
            let out = attend(
                client,
                (&q, &[3, 1, heads * head_dim]),
                (&kt, &vt),
                shape,
                &ranges,
                None,
            );
            let want = twin_over_ranges(&q, &k, &v, shape, &ranges);
            let what = format!("batched decode attention h{heads} kv{kv_heads} d{head_dim} window{window}");
            assert_close(&out, &want, 1e-5, &what, seed);
        }
    }

    pub fn attention_prefill_and_decode<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        check_attention(client, (0, None), &mut rng, seed);
    }

    pub fn attention_sliding_window<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        check_attention(client, (4, None), &mut rng, seed);
    }

    /// Gemma 2's soft-capped scores, with a cap small enough that tanh
    /// bends most of them.
    pub fn attention_soft_capped<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        check_attention(client, (4, Some(0.3)), &mut rng, seed);
    }

    /// 6000 rows over 6000 keys: scores (144 MB) that would pass the 128
    /// MiB one buffer holds on lavapipe and many GPUs, had they been
    /// written; every row gets its full attention.
    pub fn attention_over_long_rows<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        let (rows, head_dim) = (6000, 2);
        let (q, k, v) = (
            random(&mut rng, rows * head_dim),
            random(&mut rng, rows * head_dim),
            random(&mut rng, rows * head_dim),
        );
        let shape = AttentionShape {
            heads: 1,
            kv_heads: 1,
            head_dim,
            scale: 0.5,
            softcap: None,
            half: None,
        };
        let ranges = vec![(0, rows as u32); rows];
        let (kt, vt) = (
            Tensor::from_f32(client, &k, &[rows, head_dim]),
            Tensor::from_f32(client, &v, &[rows, head_dim]),
        );
        let out = attend(client, (&q, &[rows, head_dim]), (&kt, &vt), shape, &ranges, None);
        let want = reference::attention(&q, &k, &v, shape, |_, _| true, (None, None));
        assert_close(&out, &want, 1e-5, "attention over long rows", seed);
    }

    /// Prefill rows over thousands of keys with wide heads: as many keys as
    /// a unit of the unit form may take in one piece before llvmpipe stops
    /// its loops (for heads of 128), and more, which that form cuts into
    /// pieces (heads of 512, the VAE's).
    pub fn attention_of_wide_heads_over_many_keys<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        for (head_dim, keys) in [(128, 14_000), (512, 8_000)] {
            let (k, v) = (random(&mut rng, keys * head_dim), random(&mut rng, keys * head_dim));
            let ranges = [(0, keys as u32), (1, keys as u32 - 1), (keys as u32 / 2, keys as u32)];
            let q = random(&mut rng, ranges.len() * head_dim);
            let shape = AttentionShape::new(1, 1, head_dim);
            let (kt, vt) = (
                Tensor::from_f32(client, &k, &[keys, head_dim]),
                Tensor::from_f32(client, &v, &[keys, head_dim]),
            );
            let out = attend(
                client,
                (&q, &[ranges.len(), head_dim]),
                (&kt, &vt),
                shape,
                &ranges,
                None,
            );
            let want = twin_over_ranges(&q, &k, &v, shape, &ranges);
            let what = format!("attention d{head_dim} over {keys} keys");
            assert_close(&out, &want, 1e-5, &what, seed);
        }
    }

    /// Decode rows (one per sequence) whose ranges are cut into pieces that
    /// other cubes score (flash-decoding): one piece, three, and more keys
    /// than the most pieces hold at their usual length, with heads of one
    /// block of output dimensions and of two, at full range and with a
    /// window; and a batch whose partial sums pass what one launch keeps, so
    /// that its rows take several launches (the long row the last). In one
    /// call, each row gives the bits it gives alone.
    pub fn attention_decode_in_pieces<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        let many: Vec<usize> = (1..40).chain([8200]).collect();
        // The batch of many rows is checked for bits only: its reference
        // would take the plain-Rust twin minutes.
        for (heads, kv_heads, head_dim, lengths, against_reference) in [
            (4, 2, 8, &[40, 1300, 35_000][..], true),
            (2, 1, 300, &[7, 1100, 1537][..], true),
            (64, 1, 256, &many[..], false),
        ] {
            let context: usize = lengths.iter().sum();
            let width = kv_heads * head_dim;
            let (k, v) = (random(&mut rng, context * width), random(&mut rng, context * width));
            let (kt, vt) = (
                Tensor::from_f32(client, &k, &[context, width]),
                Tensor::from_f32(client, &v, &[context, width]),
            );
            let shape = AttentionShape::new(heads, kv_heads, head_dim);
            for window in [0, 1025] {
                // Each sequence's part of the cache follows the one before.
                let mut base = 0;
                let ranges: Vec<(u32, u32)> = lengths
                    .iter()
                    .map(|&len| {
                        let (start, end) = KeyRanges::causal(len - 1, window);
                        base += len;
                        ((base - len) as u32 + start, (base - len) as u32 + end)
                    })
                    .collect();
                let q = random(&mut rng, lengths.len() * heads * head_dim);
                let decode = |q: &[f32], ranges: &[(u32, u32)]| {
                    attend(
                        client,
                        (q, &[ranges.len(), 1, heads * head_dim]),
                        (&kt, &vt),
                        shape,
                        ranges,
                        None,
                    )
                };
                let together = decode(&q, &ranges);
                let what = format!("decode in pieces h{heads} kv{kv_heads} d{head_dim} window{window}");
                if against_reference {
                    let want = twin_over_ranges(&q, &k, &v, shape, &ranges);
                    assert_close(&together, &want, 1e-5, &what, seed);
                }
                let row = heads * head_dim;
                for (s, &range) in ranges.iter().enumerate() {
                    let alone = decode(&q[s * row..(s + 1) * row], &[range]);
                    assert!(
                        alone
                            .iter()
                            .map(|x| x.to_bits())
                            .eq(together[s * row..(s + 1) * row].iter().map(|x| x.to_bits())),
                        "{what}: row {s} alone differs from the batch (seed {seed})"
                    );
                }
            }
        }
    }

    pub fn attention_within_segments<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        // Three sequences of 5, 1 and 7 tokens packed into 13 rows.
        let lengths = [5usize, 1, 7];
        let mut segments = Vec::new();
        let mut start = 0;
        for len in lengths {
            segments.extend(std::iter::repeat_n((start as u32, (start + len) as u32), len));
            start += len;
        }
        let rows = start;
        for (heads, kv_heads, head_dim) in [(2, 2, 8), (4, 1, 3)] {
            let q = random(&mut rng, rows * heads * head_dim);
            let k = random(&mut rng, rows * kv_heads * head_dim);
            let v = random(&mut rng, rows * kv_heads * head_dim);
            let shape = AttentionShape {
                heads,
                kv_heads,
                head_dim,
                scale: 0.3,
                softcap: None,
                half: None,
            };
            let (kt, vt) = (
                Tensor::from_f32(client, &k, &[rows, kv_heads * head_dim]),
                Tensor::from_f32(client, &v, &[rows, kv_heads * head_dim]),
            );
            let out = attend(
                client,
                (&q, &[rows, heads * head_dim]),
                (&kt, &vt),
                shape,
                &segments,
                None,
            );
            let want = twin_over_ranges(&q, &k, &v, shape, &segments);
            assert_close(&out, &want, 1e-5, "segment attention", seed);
        }
    }

    /// An additive bias per head, query row and key (T5's relative
    /// position bias), over full and causal ranges; a bias of the wrong
    /// shape is refused.
    pub fn attention_with_score_bias<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        let rows = 11;
        for (heads, head_dim, causal) in [(1, 1, false), (6, 8, false), (3, 5, true)] {
            let width = heads * head_dim;
            let q = random(&mut rng, rows * width);
            let k = random(&mut rng, rows * width);
            let v = random(&mut rng, rows * width);
            let bias: Vec<f32> = random(&mut rng, heads * rows * rows).iter().map(|b| b * 4.0).collect();
            let ranges: Vec<(u32, u32)> = (0..rows)
                .map(|s| {
                    if causal {
                        KeyRanges::causal(s, 0)
                    } else {
                        (0, rows as u32)
                    }
                })
                .collect();
            let shape = AttentionShape {
                heads,
                kv_heads: heads,
                head_dim,
                scale: 1.0,
                softcap: None,
                half: None,
            };
            let (kt, vt) = (
                Tensor::from_f32(client, &k, &[rows, width]),
                Tensor::from_f32(client, &v, &[rows, width]),
            );
            let scores_bias = Tensor::from_f32(client, &bias, &[heads, rows, rows]);
            let out = attend(
                client,
                (&q, &[rows, width]),
                (&kt, &vt),
                shape,
                &ranges,
                Some(&scores_bias),
            );
            let visible = |s: usize, t: usize| !causal || t <= s;
            let want = reference::attention(&q, &k, &v, shape, visible, (Some(&bias), None));
            let what = format!("biased attention h{heads} d{head_dim} causal {causal}");
            assert_close(&out, &want, 1e-5, &what, seed);
        }
        let x = Tensor::empty(client, &[3, 4]);
        let ranges = KeyRanges::new(client, &[(0, 3); 3]);
        let shape = AttentionShape {
            heads: 2,
            kv_heads: 2,
            head_dim: 2,
            scale: 1.0,
            softcap: None,
            half: None,
        };
        let bad = Tensor::empty(client, &[2, 3, 2]);
        assert!(
            cleave_shaders::attention(client, &x, &x, &x, shape, &ranges, Some(&bad)).is_err(),
            "a bias of the wrong shape must be refused"
        );
        let capped = AttentionShape {
            softcap: Some(30.0),
            ..shape
        };
        let bias = Tensor::empty(client, &[2, 3, 3]);
        assert!(
            cleave_shaders::attention(client, &x, &x, &x, capped, &ranges, Some(&bias)).is_err(),
            "a bias with a soft cap must be refused"
        );
    }

    pub fn layer_norm<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        for (rows, cols) in [(1, 1), (2, 3), (5, 384), (3, 1000), (70_000, 16)] {
            let x: Vec<f32> = random(&mut rng, rows * cols).iter().map(|v| v * 5.0 + 1.0).collect();
            let (w, b) = (random(&mut rng, cols), random(&mut rng, cols));
            let out = cleave_shaders::layer_norm(
                client,
                &Tensor::from_f32(client, &x, &[rows, cols]),
                &Tensor::from_f32(client, &w, &[cols]),
                &Tensor::from_f32(client, &b, &[cols]),
                1e-12,
            )
            .unwrap();
            let want = reference::layer_norm(&x, &w, &b, 1e-12);
            assert_close(
                &out.to_vec(client).unwrap(),
                &want,
                1e-5,
                &format!("layer_norm {rows}x{cols}"),
                seed,
            );
        }
    }

    /// Inputs for the activations: random values in [-10, 10], then zero,
    /// values near it, and values far in the tails, where exp, erf and tanh
    /// saturate (no overflow to NaN).
    fn activation_inputs(rng: &mut StdRng, len: usize) -> Vec<f32> {
        let mut x: Vec<f32> = random(rng, len).iter().map(|v| v * 10.0).collect();
        x.extend([0.0, 1e-4, -1e-4, -40.0, 40.0, -60.0, 60.0]);
        x
    }

    type Twin = fn(&[f32]) -> Vec<f32>;
    type GatedTwin = fn(&[f32], &[f32]) -> Vec<f32>;
    type Gated<R> = fn(&ComputeClient<R>, &Tensor, &Tensor) -> Result<Tensor, KernelError>;

    pub fn activations_in_place<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        let table: [(&str, Activation, Twin); 5] = [
            ("silu", Activation::Silu, reference::silu),
            ("sigmoid", Activation::Sigmoid, reference::sigmoid),
            ("gelu", Activation::Gelu, reference::gelu),
            ("quick_gelu", Activation::QuickGelu, reference::quick_gelu),
            ("gelu_tanh", Activation::GeluTanh, reference::gelu_tanh),
        ];
        for (name, activation, twin) in table {
            for len in [1, 7, 1000] {
                let x = activation_inputs(&mut rng, len);
                let t = Tensor::from_f32(client, &x, &[x.len()]);
                cleave_shaders::activate(client, &t, activation).unwrap();
                assert_close(&t.to_vec(client).unwrap(), &twin(&x), 1e-6, name, seed);
            }
        }
    }

    pub fn gated_activations<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        let table: [(&str, Gated<R>, GatedTwin); 3] = [
            ("silu_mul", cleave_shaders::silu_mul, reference::silu_mul),
            ("gelu_tanh_mul", cleave_shaders::gelu_tanh_mul, reference::gelu_tanh_mul),
            (
                "clamped_swiglu",
                |client, gate, up| cleave_shaders::gated_mul(client, gate, up, Activation::ClampedSwiGlu),
                reference::clamped_swiglu_mul,
            ),
        ];
        for (name, launch, twin) in table {
            // Past the clamp of gpt-oss's up too.
            let up_scale = if name == "clamped_swiglu" { 9.0 } else { 1.0 };
            for len in [1, 7, 1000] {
                let g = activation_inputs(&mut rng, len);
                let u: Vec<f32> = random(&mut rng, g.len()).iter().map(|u| u * up_scale).collect();
                let out = launch(
                    client,
                    &Tensor::from_f32(client, &g, &[g.len()]),
                    &Tensor::from_f32(client, &u, &[u.len()]),
                )
                .unwrap();
                assert_close(&out.to_vec(client).unwrap(), &twin(&g, &u), 1e-6, name, seed);
            }
            let (gate, up) = (Tensor::empty(client, &[2, 3]), Tensor::empty(client, &[3, 2]));
            assert!(
                launch(client, &gate, &up).is_err(),
                "{name}: up of another shape must be refused"
            );
        }
    }

    pub fn modulate<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        for (rows, cols) in [(1, 1), (3, 7), (36, 64), (70_000, 5)] {
            let x = random(&mut rng, rows * cols);
            let (shift, scale) = (random(&mut rng, cols), random(&mut rng, cols));
            let up = |v: &[f32], shape: &[usize]| Tensor::from_f32(client, v, shape);
            let out = cleave_shaders::modulate(
                client,
                &up(&x, &[rows, cols]),
                &up(&shift, &[cols]),
                &up(&scale, &[1, cols]),
            )
            .unwrap();
            assert_eq!(out.shape, [rows, cols]);
            let want = reference::modulate(&x, &shift, &scale);
            assert_close(
                &out.to_vec(client).unwrap(),
                &want,
                1e-6,
                &format!("modulate {rows}x{cols}"),
                seed,
            );
        }
        let x = Tensor::empty(client, &[2, 3]);
        assert!(
            cleave_shaders::modulate(client, &x, &Tensor::empty(client, &[2]), &Tensor::empty(client, &[3])).is_err(),
            "a shift of the wrong length must be refused"
        );
    }

    /// An in-place update of `x: [rows, cols]` from `y` of the same shape
    /// and a vector `v` of one value per column (each op uses what it needs).
    type Update<R> = fn(&ComputeClient<R>, &Tensor, &Tensor, &Tensor) -> Result<(), KernelError>;
    type UpdateTwin = fn(&mut [f32], &[f32], &[f32]);

    pub fn in_place_updates<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        let table: [(&str, Update<R>, UpdateTwin); 5] = [
            (
                "add_assign",
                |c, x, y, _| cleave_shaders::add_assign(c, x, y),
                |x, y, _| reference::add_assign(x, y),
            ),
            (
                "add_scaled",
                |c, x, y, _| cleave_shaders::add_scaled(c, x, y, 0.5),
                |x, y, _| reference::add_scaled(x, y, 0.5),
            ),
            (
                "add_bias",
                |c, x, _, v| cleave_shaders::add_bias(c, x, v),
                |x, _, v| reference::add_bias(x, v),
            ),
            ("add_gated", cleave_shaders::add_gated, reference::add_gated),
            (
                "scale_shift",
                |c, x, _, _| cleave_shaders::scale_shift(c, x, 1.5, -0.25),
                |x, _, _| reference::scale_shift(x, 1.5, -0.25),
            ),
        ];
        for (name, launch, twin) in table {
            for (rows, cols) in [(1, 1), (3, 7), (36, 64), (70_000, 5)] {
                let (x, y, v) = (
                    random(&mut rng, rows * cols),
                    random(&mut rng, rows * cols),
                    random(&mut rng, cols),
                );
                let xt = Tensor::from_f32(client, &x, &[rows, cols]);
                let (yt, vt) = (
                    Tensor::from_f32(client, &y, &[rows, cols]),
                    Tensor::from_f32(client, &v, &[cols]),
                );
                launch(client, &xt, &yt, &vt).unwrap();
                let mut want = x.clone();
                twin(&mut want, &y, &v);
                assert_close(
                    &xt.to_vec(client).unwrap(),
                    &want,
                    1e-6,
                    &format!("{name} {rows}x{cols}"),
                    seed,
                );
            }
        }
    }

    pub fn rope_pairs<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        for (rows, heads, half) in [(1, 1, 1), (3, 2, 4), (36, 4, 8), (5, 3, 64)] {
            let mut x = random(&mut rng, rows * heads * half * 2);
            let angles: Vec<f32> = random(&mut rng, rows * half).iter().map(|a| a * 10.0).collect();
            let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
            let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
            let xt = Tensor::from_f32(client, &x, &[rows, heads * half * 2]);
            cleave_shaders::rope_pairs(
                client,
                &xt,
                &Tensor::from_f32(client, &cos, &[rows, half]),
                &Tensor::from_f32(client, &sin, &[rows, half]),
                heads,
            )
            .unwrap();
            reference::rope_pairs(&mut x, &cos, &sin, heads, half);
            assert_close(
                &xt.to_vec(client).unwrap(),
                &x,
                1e-6,
                &format!("rope_pairs {rows}x{heads}x{half}"),
                seed,
            );
        }
        let table = Tensor::empty(client, &[2, 4]);
        assert!(
            cleave_shaders::rope_pairs(client, &Tensor::empty(client, &[3, 16]), &table, &table, 2).is_err(),
            "a table with the wrong rows must be refused"
        );
    }

    /// Expert outputs added into the rows of their tokens: some rows
    /// get nothing, the others their weighted row; a row named twice is
    /// refused (two units would write it at once).
    pub fn add_rows_scaled<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        let (rows, cols) = (9, 13);
        let dst = random(&mut rng, rows * cols);
        let src = random(&mut rng, 4 * cols);
        let (to, weights) = ([7u32, 0, 3, 8], [0.25f32, 1.5, -0.75, 0.5]);
        let dst_t = Tensor::from_f32(client, &dst, &[rows, cols]);
        let src_t = Tensor::from_f32(client, &src, &[4, cols]);
        cleave_shaders::add_rows_scaled(client, &dst_t, &src_t, &to, &weights).unwrap();
        let mut want = dst.clone();
        reference::add_rows_scaled(&mut want, &src, &to, &weights, cols);
        assert_close(&dst_t.to_vec(client).unwrap(), &want, 1e-6, "add_rows_scaled", seed);
        assert!(
            cleave_shaders::add_rows_scaled(client, &dst_t, &src_t, &[1, 2, 1, 3], &weights).is_err(),
            "a row named twice must be refused"
        );
        assert!(
            cleave_shaders::add_rows_scaled(client, &dst_t, &src_t, &[1, 2, 9, 3], &weights).is_err(),
            "a row past dst must be refused"
        );
    }

    pub fn copy_rows<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        let src = random(&mut rng, 5 * 3);
        let dst = random(&mut rng, 8 * 3);
        let (st, dt) = (
            Tensor::from_f32(client, &src, &[5, 3]),
            Tensor::from_f32(client, &dst, &[8, 3]),
        );
        cleave_shaders::copy_rows(client, &st, 1, &dt, 6, 2).unwrap();
        let mut want = dst.clone();
        want[18..24].copy_from_slice(&src[3..9]);
        assert_close(&dt.to_vec(client).unwrap(), &want, 0.0, "copy_rows", seed);
        assert!(
            cleave_shaders::copy_rows(client, &st, 0, &dt, 7, 2).is_err(),
            "writing past the end must be refused"
        );
    }

    pub fn copy_columns<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        let (rows, n, m, offset) = (3, 2, 7, 4);
        let src = random(&mut rng, rows * n);
        let dst = random(&mut rng, rows * m);
        let dt = Tensor::from_f32(client, &dst, &[rows, m]);
        cleave_shaders::copy_columns(client, &Tensor::from_f32(client, &src, &[rows, n]), &dt, offset).unwrap();
        let mut want = dst.clone();
        for r in 0..rows {
            want[r * m + offset..r * m + offset + n].copy_from_slice(&src[r * n..(r + 1) * n]);
        }
        assert_close(&dt.to_vec(client).unwrap(), &want, 0.0, "copy_columns", seed);
        let src = Tensor::empty(client, &[rows, 4]);
        assert!(
            cleave_shaders::copy_columns(client, &src, &dt, 4).is_err(),
            "columns past the end must be refused"
        );
    }

    pub fn columns_of<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        // The decode form's `[rows, 1, cols]`, as a pass's per-layer inputs.
        let (rows, cols, range) = (3, 10, 4..7);
        let src = random(&mut rng, rows * cols);
        let st = Tensor::from_f32(client, &src, &[rows, 1, cols]);
        let out = cleave_shaders::columns_of(client, &st, range.clone()).unwrap();
        assert_eq!(out.shape, [rows, 1, range.len()]);
        let want: Vec<f32> = (0..rows)
            .flat_map(|r| src[r * cols + range.start..r * cols + range.end].to_vec())
            .collect();
        assert_close(&out.to_vec(client).unwrap(), &want, 0.0, "columns_of", seed);
        assert!(
            cleave_shaders::columns_of(client, &st, 8..11).is_err(),
            "columns past the end must be refused"
        );
    }

    pub fn embedding_in_chunks<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        let (vocab, cols) = (11, 6);
        let table = random(&mut rng, vocab * cols);
        let ids: Vec<u32> = (0..9).map(|_| rng.random_range(0..vocab as u32)).collect();
        let out = Tensor::empty(client, &[ids.len(), cols]);
        for (start, end) in [(0, 4), (4, 10), (10, 11)] {
            let chunk = Tensor::from_f32(client, &table[start * cols..end * cols], &[end - start, cols]);
            cleave_shaders::embedding(client, &chunk, start, &ids, &out).unwrap();
        }
        let want = reference::embedding(&table, cols, &ids);
        assert_close(&out.to_vec(client).unwrap(), &want, 0.0, "embedding", seed);
    }

    pub fn half_casts<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        for len in [1, 2, 7, 1001] {
            let mut values: Vec<f32> = random(&mut rng, len).iter().map(|v| v * 1000.0).collect();
            // Edge cases: zeros, a subnormal f16, the largest f16, infinities.
            values.extend([0.0, -0.0, 3.0e-6, -65504.0, f32::INFINITY, f32::NEG_INFINITY]);
            let shape = [values.len()];
            let bf: Vec<u8> = values
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect();
            let f: Vec<u8> = values
                .iter()
                .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                .collect();
            let got = cleave_shaders::bf16_to_f32(client, &bf, &shape).to_vec(client).unwrap();
            assert_eq!(got, reference::bf16_to_f32(&bf), "bf16 (seed {seed})");
            let got = cleave_shaders::f16_to_f32(client, &f, &shape).to_vec(client).unwrap();
            assert_eq!(got, reference::f16_to_f32(&f), "f16 (seed {seed})");
        }
    }

    pub fn conv2d<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        for (channels, out_channels, h, w, k) in [
            (1, 1, 1, 1, 3),
            (3, 5, 7, 9, 3),
            (5, 3, 6, 5, 1),
            (16, 8, 11, 4, 3),
            (20, 40, 13, 17, 3),
            (4, 6, 9, 10, 5),
        ] {
            let x = random(&mut rng, channels * h * w);
            let weight = random(&mut rng, out_channels * channels * k * k);
            let bias = random(&mut rng, out_channels);
            let out = cleave_shaders::conv2d(
                client,
                &Tensor::from_f32(client, &x, &[channels, h, w]),
                &Weight::from_tensor(Tensor::from_f32(client, &weight, &[out_channels, channels * k * k])),
                k,
                &Tensor::from_f32(client, &bias, &[out_channels]),
            )
            .unwrap();
            assert_eq!(out.shape, [out_channels, h, w]);
            assert_close(
                &out.to_vec(client).unwrap(),
                &reference::conv2d(&x, &weight, &bias, channels, h, w, k),
                1e-5,
                &format!("conv2d {channels}->{out_channels} {h}x{w} k{k}"),
                seed,
            );
        }
        let x = Tensor::from_f32(client, &[0.0; 12], &[3, 2, 2]);
        let even = Weight::from_tensor(Tensor::from_f32(client, &[0.0; 12], &[1, 3 * 2 * 2]));
        let bias = Tensor::from_f32(client, &[0.0], &[1]);
        assert!(
            cleave_shaders::conv2d(client, &x, &even, 2, &bias).is_err(),
            "even kernel"
        );
        let narrow = Weight::from_tensor(Tensor::from_f32(client, &[0.0; 18], &[1, 2 * 3 * 3]));
        assert!(
            cleave_shaders::conv2d(client, &x, &narrow, 3, &bias).is_err(),
            "weight of 2 channels"
        );
    }

    pub fn group_norm<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        // The last: a group of 2^21 values, as the VAE's last blocks
        // normalise at 1024x1024 (4 channels of 512x512).
        for (channels, groups, plane) in [
            (1, 1, 1),
            (6, 3, 35),
            (8, 4, 1000),
            (12, 1, 7),
            (5, 5, 3),
            (4, 2, 1 << 20),
        ] {
            // An offset, so the mean matters.
            let x: Vec<f32> = random(&mut rng, channels * plane)
                .iter()
                .map(|v| v * 3.0 + 0.5)
                .collect();
            let w = random(&mut rng, channels);
            let b = random(&mut rng, channels);
            for silu in [false, true] {
                let out = cleave_shaders::group_norm(
                    client,
                    &Tensor::from_f32(client, &x, &[channels, plane]),
                    &Tensor::from_f32(client, &w, &[channels]),
                    &Tensor::from_f32(client, &b, &[channels]),
                    groups,
                    1e-6,
                    silu,
                )
                .unwrap();
                assert_close(
                    &out.to_vec(client).unwrap(),
                    &reference::group_norm(&x, &w, &b, groups, 1e-6, silu),
                    1e-5,
                    &format!("group_norm {channels}/{groups}x{plane} silu {silu}"),
                    seed,
                );
            }
        }
    }

    pub fn upsample_nearest2x<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        for (c, h, w) in [(1, 1, 1), (3, 5, 7), (2, 4, 1)] {
            let x = random(&mut rng, c * h * w);
            let out = cleave_shaders::upsample_nearest2x(client, &Tensor::from_f32(client, &x, &[c, h, w])).unwrap();
            assert_eq!(out.shape, [c, 2 * h, 2 * w]);
            assert_close(
                &out.to_vec(client).unwrap(),
                &reference::upsample_nearest2x(&x, c, h, w),
                0.0,
                &format!("upsample_nearest2x {c}x{h}x{w}"),
                seed,
            );
        }
    }

    pub fn transpose<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        for (rows, cols) in [(1, 1), (1, 7), (5, 3), (33, 17)] {
            let x = random(&mut rng, rows * cols);
            let out = cleave_shaders::transpose(client, &Tensor::from_f32(client, &x, &[rows, cols])).unwrap();
            assert_eq!(out.shape, [cols, rows]);
            assert_close(
                &out.to_vec(client).unwrap(),
                &reference::transpose(&x, rows, cols),
                0.0,
                &format!("transpose {rows}x{cols}"),
                seed,
            );
        }
    }
}
