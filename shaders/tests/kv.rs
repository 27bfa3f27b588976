//! The KV cache in f16: rows written into it are rounded as `half`
//! rounds them (ties to even, subnormals, overflow to infinity), and
//! attention over an f16 or f32 cache equals attention over f32 tensors
//! holding the same values, bit for bit.

use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{
    attention, attention_cached, dequantize_rows, kv_cache, reference, split_qkv, AttentionShape, CacheWrite,
    KeyRanges, RopeTable, RowIndex, Tensor, Weight, WeightType,
};

use crate::common;
use common::{random, seeded};

kernel_tests!(
    f16_rows_round_as_half_does,
    attention_over_a_cache_equals_attention_over_its_values,
    a_cache_of_another_type_or_odd_width_is_refused,
);
kernel_tests!(in both forms: sinks_join_each_heads_softmax);

/// Writes `values: [rows, width]` unchanged into rows `rows` of `cache`,
/// through `split_qkv`'s v heads (one head of `width` dimensions; the q
/// and k heads beside them go to throwaway buffers).
fn write_rows<R: Runtime>(client: &ComputeClient<R>, values: &[f32], width: usize, cache: &Weight, rows: &[u32]) {
    let n = rows.len();
    let qkv: Vec<f32> = values
        .chunks(width)
        .flat_map(|row| [vec![0.0; 2 * width], row.to_vec()].concat())
        .collect();
    let keys = kv_cache(client, cache.ty, cache.rows, width).unwrap();
    let table = RopeTable::new(client, &[0.0], 1);
    let write = CacheWrite {
        k: &keys,
        v: cache,
        rows: &RowIndex::new(client, rows),
    };
    let at_zero = RowIndex::new(client, &vec![0; n]);
    let qkv = Tensor::from_f32(client, &qkv, &[n, 3 * width]);
    split_qkv(client, &qkv, (1, 1), (&table, &at_zero), None, Some(write)).unwrap();
}

mod checks {
    use super::*;

    pub fn f16_rows_round_as_half_does<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        // Edges: the largest half, the first value that rounds to infinity,
        // ties either way, subnormals, the smallest ones, signed zero, NaN.
        let mut values = vec![
            65504.0,
            65520.0,
            -65536.0,
            1.0 + 1.0 / 2048.0,
            1.0 + 3.0 / 2048.0,
            6.1e-5,
            5.96e-8,
            2.98e-8,
            2.0e-8,
            -0.0,
            f32::INFINITY,
            f32::NAN,
            1e-3,
            -3.3e-6,
        ];
        values.extend(random(&mut rng, 50).iter().map(|v| v * 300.0));
        let cols = values.len();
        let cache = kv_cache(client, WeightType::F16, 3, cols).unwrap();
        write_rows(client, &values, cols, &cache, &[2]);
        let got = dequantize_rows(client, &cache, 2..3).unwrap().to_vec(client).unwrap();
        for (i, (&g, &v)) in got.iter().zip(&values).enumerate() {
            let want = half::f16::from_f32(v).to_f32();
            let same = g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan());
            assert!(
                same,
                "element {i}: {v} cached as {g}, half rounds it to {want} (seed {seed})"
            );
        }
    }

    pub fn attention_over_a_cache_equals_attention_over_its_values<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        let (heads, kv_heads, head_dim, keys) = (4, 2, 8, 11);
        let width = kv_heads * head_dim;
        let shape = AttentionShape {
            heads,
            kv_heads,
            head_dim,
            scale: 0.3,
            softcap: None,
            half: None,
        };
        // Three query rows at positions 8..11, each seeing the keys up to itself.
        let q = Tensor::from_f32(client, &random(&mut rng, 3 * heads * head_dim), &[3, heads * head_dim]);
        let ranges = KeyRanges::new(client, &[(0, 9), (0, 10), (0, 11)]);
        let k = random(&mut rng, keys * width);
        let v = random(&mut rng, keys * width);
        let all_rows: Vec<u32> = (0..keys as u32).collect();
        for ty in [WeightType::F32, WeightType::F16] {
            let (k_cache, v_cache) = (
                kv_cache(client, ty, keys, width).unwrap(),
                kv_cache(client, ty, keys, width).unwrap(),
            );
            for (values, cache) in [(&k, &k_cache), (&v, &v_cache)] {
                write_rows(client, values, width, cache, &all_rows);
            }
            let got = attention_cached(client, &q, &k_cache, &v_cache, shape, &ranges, None)
                .unwrap()
                .to_vec(client)
                .unwrap();
            // The same attention over f32 tensors of what the cache holds.
            let held = |cache| dequantize_rows(client, cache, 0..keys).unwrap();
            let want = attention(client, &q, &held(&k_cache), &held(&v_cache), shape, &ranges, None)
                .unwrap()
                .to_vec(client)
                .unwrap();
            assert_eq!(got, want, "{ty} cache (seed {seed})");
        }
    }

    /// gpt-oss's sinks, against the twin's softmax over the scores and the
    /// sink: prefill rows, and decode rows over ranges cut into pieces
    /// (combined by another launch), one of them so short that its sink
    /// outweighs its keys.
    pub fn sinks_join_each_heads_softmax<R: Runtime>(client: &ComputeClient<R>) {
        let (mut rng, seed) = seeded();
        let (heads, kv_heads, head_dim, keys) = (4, 2, 16, 1300);
        let width = kv_heads * head_dim;
        let shape = AttentionShape::new(heads, kv_heads, head_dim);
        let k = random(&mut rng, keys * width);
        let v = random(&mut rng, keys * width);
        let (k_cache, v_cache) = (
            kv_cache(client, WeightType::F32, keys, width).unwrap(),
            kv_cache(client, WeightType::F32, keys, width).unwrap(),
        );
        let all_rows: Vec<u32> = (0..keys as u32).collect();
        for (values, cache) in [(&k, &k_cache), (&v, &v_cache)] {
            write_rows(client, values, width, cache, &all_rows);
        }
        let sinks: Vec<f32> = [0.5, -2.0, 3.0, 8.0].to_vec();
        let sink_tensor = Tensor::from_f32(client, &sinks, &[heads]);
        let prefill: Vec<(u32, u32)> = (0..9).map(|s| (0, s + 1)).collect();
        let decode = vec![(0, 1300), (100, 700), (5, 7)];
        for ranges in [prefill, decode] {
            let rows = ranges.len();
            let q = random(&mut rng, rows * heads * head_dim);
            let q_tensor = Tensor::from_f32(client, &q, &[rows, heads * head_dim]);
            let (key_ranges, sinks_arg) = (KeyRanges::new(client, &ranges), Some(&sink_tensor));
            let got = attention_cached(client, &q_tensor, &k_cache, &v_cache, shape, &key_ranges, sinks_arg)
                .unwrap()
                .to_vec(client)
                .unwrap();
            let visible = |s: usize, t: usize| ranges[s].0 as usize <= t && t < ranges[s].1 as usize;
            let want = reference::attention(&q, &k, &v, shape, visible, (None, Some(&sinks)));
            common::assert_close(&got, &want, 1e-5, &format!("sinks over {ranges:?}"), seed);
        }
        let wrong = Tensor::from_f32(client, &sinks[..3], &[3]);
        let ranges = KeyRanges::new(client, &[(0, 1)]);
        let q = Tensor::from_f32(client, &vec![0.0; heads * head_dim], &[1, heads * head_dim]);
        let err = attention_cached(client, &q, &k_cache, &v_cache, shape, &ranges, Some(&wrong));
        assert!(err.unwrap_err().to_string().contains("sinks"));
    }

    pub fn a_cache_of_another_type_or_odd_width_is_refused<R: Runtime>(client: &ComputeClient<R>) {
        assert!(kv_cache(client, WeightType::Q8_0, 4, 32).is_err());
        let err = kv_cache(client, WeightType::F16, 4, 7).unwrap_err().to_string();
        assert!(err.contains("kv cache"), "{err}");
    }
}
