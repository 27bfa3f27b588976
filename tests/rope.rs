//! Rotary embeddings against transformers' formulas, written out here in
//! f64 and never taken from the code under test:
//!
//! - `ModelConfig::inv_freq` for default, linear and llama3 scaling, and
//!   LongRoPE's short and long tables with their attention factor, read
//!   from edited copies of fixture configs in both config.json layouts;
//! - the host cos/sin table (`rope_table`, which `RopeTable`
//!   uploads) against `cos(pos · inv_freq)`;
//! - the rope kernel, through a `RopeTable`, against the rotation in f64;
//! - LongRoPE through phi3-tiny: which factors a pass takes;
//!
//! and end to end against transformers' own numbers: llama3 scaling and
//! LongRoPE on fixture models, past the original context
//! (tests/fixtures/rope-scaling).

use crate::common;

use std::f64::consts::PI;

use cleave_device::RuntimeTask;
use cleave_models::ModelConfig;
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{kv_cache, split_qkv, CacheWrite, RopeTable, RowIndex, Tensor, WeightType};
use serde_json::{json, Value};

/// transformers' `_compute_default_rope_parameters`:
/// `1 / base^(arange(0, dim, 2) / dim)`.
fn default_inv_freq(base: f64, dim: usize) -> Vec<f64> {
    (0..dim)
        .step_by(2)
        .map(|i| 1.0 / base.powf(i as f64 / dim as f64))
        .collect()
}

/// `_compute_linear_scaling_rope_parameters`: `inv_freq / factor`.
fn linear_inv_freq(base: f64, dim: usize, factor: f64) -> Vec<f64> {
    default_inv_freq(base, dim).into_iter().map(|f| f / factor).collect()
}

/// `_compute_llama3_parameters`: wavelengths shorter than
/// `old_context / high_freq_factor` keep their frequency, longer than
/// `old_context / low_freq_factor` are divided by `factor`, and those in
/// between are interpolated by `smooth = (old_context / wavelen - low) /
/// (high - low)`: `(1 - smooth) · f / factor + smooth · f`.
fn llama3_inv_freq(base: f64, dim: usize, factor: f64, low: f64, high: f64, old_context: f64) -> Vec<f64> {
    let (low_freq_wavelen, high_freq_wavelen) = (old_context / low, old_context / high);
    default_inv_freq(base, dim)
        .into_iter()
        .map(|f| {
            let wavelen = 2.0 * PI / f;
            if wavelen < high_freq_wavelen {
                f
            } else if wavelen > low_freq_wavelen {
                f / factor
            } else {
                let smooth = (old_context / wavelen - low) / (high - low);
                (1.0 - smooth) * f / factor + smooth * f
            }
        })
        .collect()
}

/// `_compute_longrope_parameters`: `1 / (factors[i] · base^(2i / dim))`.
fn longrope_inv_freq(base: f64, dim: usize, factors: &[f64]) -> Vec<f64> {
    default_inv_freq(base, dim)
        .into_iter()
        .zip(factors)
        .map(|(f, factor)| f / factor)
        .collect()
}

/// How many of `want`'s frequencies llama3 keeps, interpolates and divides.
fn llama3_regions(base: f64, dim: usize, low: f64, high: f64, old_context: f64) -> [usize; 3] {
    let mut regions = [0; 3];
    for f in default_inv_freq(base, dim) {
        let wavelen = 2.0 * PI / f;
        regions[if wavelen < old_context / high {
            0
        } else if wavelen > old_context / low {
            2
        } else {
            1
        }] += 1;
    }
    regions
}

/// `fixture`'s config.json edited by `edit`, validated as the loader does.
fn config(fixture: &str, edit: impl FnOnce(&mut Value)) -> ModelConfig {
    let dir = tempfile::TempDir::new().unwrap();
    let path = dir.path().join("config.json");
    std::fs::copy(common::fixture(fixture).join("config.json"), &path).unwrap();
    common::edit_json(&path, edit);
    ModelConfig::from_file(&path).unwrap_or_else(|e| panic!("{fixture}: {e}"))
}

/// transformers computes the frequencies in f32; each must be the f64
/// value to within a few f32 roundings.
#[track_caller]
fn assert_inv_freq(config: &ModelConfig, want: &[f64], what: &str) {
    assert_frequencies(&config.inv_freq(), want, what);
}

#[track_caller]
fn assert_frequencies(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: one frequency per pair of a head's dimensions"
    );
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let relative = ((g as f64 - w) / w).abs();
        assert!(
            relative <= 1e-6,
            "{what}: inv_freq[{i}] is {g}, transformers' {w} (relative {relative:e})"
        );
    }
}

#[test]
fn default_frequencies_are_transformers() {
    // llama-tiny: transformers-4 layout, head_dim 64 / 4 = 16, theta 1e4.
    let c = config("llama-tiny", |_| {});
    assert_eq!(c.head_dim, 16);
    assert_inv_freq(&c, &default_inv_freq(10_000.0, 16), "llama-tiny");
    // qwen2-tiny: theta 1e6.
    let c = config("qwen2-tiny", |_| {});
    assert_inv_freq(&c, &default_inv_freq(1e6, c.head_dim), "qwen2-tiny");
    // transformers-5 layout, with theta inside rope_parameters.
    let c = config("llama-tiny-bf16", |v| {
        v["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 50_000.0});
    });
    assert_inv_freq(&c, &default_inv_freq(50_000.0, 16), "rope_parameters, default");
}

#[test]
fn linear_scaling_divides_every_frequency_by_the_factor() {
    // transformers 4 spells the type `type` in older configs, `rope_type` in newer ones.
    let c = config("llama-tiny", |v| {
        v["rope_scaling"] = json!({"type": "linear", "factor": 4.0});
    });
    assert_inv_freq(&c, &linear_inv_freq(10_000.0, 16, 4.0), "rope_scaling type linear");
    let c = config("llama-tiny", |v| {
        v["rope_theta"] = json!(500_000.0);
        v["rope_scaling"] = json!({"rope_type": "linear", "factor": 2.5});
    });
    assert_inv_freq(
        &c,
        &linear_inv_freq(500_000.0, 16, 2.5),
        "rope_scaling rope_type linear",
    );
    let c = config("llama-tiny-bf16", |v| {
        v["rope_parameters"] = json!({"rope_type": "linear", "factor": 8.0, "rope_theta": 10_000.0});
    });
    assert_inv_freq(&c, &linear_inv_freq(10_000.0, 16, 8.0), "rope_parameters, linear");
}

#[test]
fn llama3_scaling_keeps_interpolates_and_divides_by_wavelength() {
    // Llama 3.1 8B's own config: head_dim 128, theta 5e5, factor 8 between
    // wavelengths 2048 and 8192.
    let c = config("llama-tiny", |v| {
        v["hidden_size"] = json!(4096);
        v["intermediate_size"] = json!(14336);
        v["num_attention_heads"] = json!(32);
        v["num_key_value_heads"] = json!(8);
        v["max_position_embeddings"] = json!(131_072);
        v["rope_theta"] = json!(500_000.0);
        v["rope_scaling"] = json!({
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192
        });
    });
    assert_eq!(c.head_dim, 128);
    let regions = llama3_regions(500_000.0, 128, 1.0, 4.0, 8192.0);
    assert!(regions.iter().all(|&n| n > 0), "{regions:?}");
    assert_inv_freq(
        &c,
        &llama3_inv_freq(500_000.0, 128, 8.0, 1.0, 4.0, 8192.0),
        "Llama 3.1 8B",
    );

    // head_dim 16 with a wide band, so that most frequencies are
    // interpolated; transformers-5 layout.
    let c = config("llama-tiny-bf16", |v| {
        v["rope_parameters"] = json!({
            "rope_type": "llama3", "rope_theta": 10_000.0, "factor": 4.0, "low_freq_factor": 1.0,
            "high_freq_factor": 32.0, "original_max_position_embeddings": 1024
        });
    });
    let regions = llama3_regions(10_000.0, 16, 1.0, 32.0, 1024.0);
    assert!(regions[1] >= 3 && regions[0] > 0 && regions[2] > 0, "{regions:?}");
    assert_inv_freq(
        &c,
        &llama3_inv_freq(10_000.0, 16, 4.0, 1.0, 32.0, 1024.0),
        "rope_parameters, llama3",
    );
}

/// LongRoPE in both config layouts: the short factors' frequencies for the
/// full table, the long factors' for the table a pass past the original
/// context uses, and cos/sin scaled by `sqrt(1 + ln(factor) / ln(original))`
/// (Phi-3's configs: the factor is max over original positions), or by the
/// attention factor given.
#[test]
fn longrope_scales_each_frequency_and_the_table() {
    // phi3-tiny: head_dim 16, partial rotary 0.5, so 4 frequencies.
    let (short, long) = ([1.0, 1.5, 2.0, 4.0], [1.0, 3.0, 9.0, 27.0]);
    let c = config("phi3-tiny", |v| {
        v["rope_parameters"] = Value::Null;
        v["rope_theta"] = json!(10_000.0);
        v["max_position_embeddings"] = json!(256);
        v["original_max_position_embeddings"] = json!(64);
        v["rope_scaling"] = json!({"type": "longrope", "short_factor": short, "long_factor": long});
    });
    assert_eq!(c.rotary_dim, 8);
    let tables = c.rope_tables();
    assert_eq!(tables.len(), 2);
    let attention = (1.0 + (256.0f64 / 64.0).ln() / 64.0f64.ln()).sqrt();
    for ((inv_freq, scale), (factors, which)) in tables.iter().zip([(&short, "short"), (&long, "long")]) {
        assert_frequencies(inv_freq, &longrope_inv_freq(10_000.0, 8, factors), which);
        assert!(
            ((*scale as f64) - attention).abs() < 1e-7,
            "{which}: scale {scale}, want {attention}"
        );
    }
    // A pass whose positions end at 64 keeps the short factors; past it, long.
    assert_eq!((c.rope_table(0, 64), c.rope_table(0, 65)), (0, 1));

    // transformers-5 layout, every parameter inside rope_parameters.
    let c = config("phi3-tiny", |v| {
        v["rope_parameters"] = json!({
            "rope_type": "longrope", "rope_theta": 5000.0, "partial_rotary_factor": 0.5,
            "short_factor": short, "long_factor": long, "attention_factor": 1.25,
            "original_max_position_embeddings": 128
        });
    });
    let tables = c.rope_tables();
    assert_frequencies(
        &tables[0].0,
        &longrope_inv_freq(5000.0, 8, &short),
        "rope_parameters, short",
    );
    assert_frequencies(
        &tables[1].0,
        &longrope_inv_freq(5000.0, 8, &long),
        "rope_parameters, long",
    );
    assert_eq!((tables[0].1, tables[1].1), (1.25, 1.25));

    // The cos/sin table scales by the factor, in f32.
    let (cos, sin) = cleave_shaders::rope_table(&tables[0].0, 3, 1.25);
    let (plain_cos, plain_sin) = cleave_shaders::rope_table(&tables[0].0, 3, 1.0);
    for (got, plain) in cos.iter().chain(&sin).zip(plain_cos.iter().chain(&plain_sin)) {
        assert_eq!(*got, plain * 1.25);
    }
}

/// The largest difference allowed between a table entry and the f64 value
/// at angle `angle`: transformers (and cleave) form the angle in f32, which
/// moves it by up to half an ulp of `angle`, and the result is an f32.
fn table_tolerance(angle: f64) -> f64 {
    angle * f32::EPSILON as f64 + f32::EPSILON as f64
}

#[test]
fn host_table_is_cos_and_sin_of_position_times_frequency() {
    let positions = 300;
    for c in [
        config("llama-tiny", |_| {}),
        config("llama-tiny", |v| {
            v["rope_scaling"] = json!({"type": "linear", "factor": 4.0});
        }),
    ] {
        let inv_freq = c.inv_freq();
        let half = inv_freq.len();
        let (cos, sin) = cleave_shaders::rope_table(&inv_freq, positions, 1.0);
        assert_eq!((cos.len(), sin.len()), (positions * half, positions * half));
        for pos in 0..positions {
            for (i, &f) in inv_freq.iter().enumerate() {
                let angle = pos as f64 * f as f64;
                let at = pos * half + i;
                let (dc, ds) = (
                    (cos[at] as f64 - angle.cos()).abs(),
                    (sin[at] as f64 - angle.sin()).abs(),
                );
                assert!(
                    dc.max(ds) <= table_tolerance(angle),
                    "position {pos}, pair {i}: table ({}, {}), cos and sin of {angle} are ({}, {})",
                    cos[at],
                    sin[at],
                    angle.cos(),
                    angle.sin()
                );
            }
        }
    }
}

/// Rotates rows of `heads` heads at `positions` on the test device, with
/// a table made from `inv_freq`.
struct Rotate<'a> {
    x: &'a [f32],
    inv_freq: &'a [f32],
    heads: usize,
    positions: &'a [u32],
    context: usize,
}

impl RuntimeTask for Rotate<'_> {
    type Output = Vec<f32>;

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Vec<f32> {
        let client = &clients[0];
        let table = RopeTable::new(client, self.inv_freq, self.context);
        let head_dim = 2 * self.inv_freq.len();
        let rows = self.positions.len();
        // The rows as the q heads of a q/k/v output with one k and v head
        // beside them, which go to a cache of their own.
        let qkv: Vec<f32> = self
            .x
            .chunks(self.heads * head_dim)
            .flat_map(|row| [row.to_vec(), vec![0.0; 2 * head_dim]].concat())
            .collect();
        let qkv = Tensor::from_f32(client, &qkv, &[rows, (self.heads + 2) * head_dim]);
        let [k, v] = [0, 1].map(|_| kv_cache(client, WeightType::F32, rows, head_dim).unwrap());
        let positions = RowIndex::new(client, self.positions);
        let write = CacheWrite {
            k: &k,
            v: &v,
            rows: &RowIndex::new(client, &(0..rows as u32).collect::<Vec<_>>()),
        };
        let q = split_qkv(client, &qkv, (self.heads, 1), (&table, &positions), None, Some(write)).unwrap();
        q.to_vec(client).unwrap()
    }
}

/// The kernel rotates dimension `i` of each head with `i + head_dim / 2`
/// by `pos · inv_freq[i]`, as transformers' `rotate_half`.
#[test]
fn rope_kernel_rotates_by_position_times_frequency() {
    let c = config("llama-tiny", |v| {
        v["rope_scaling"] = json!({
            "rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
            "high_freq_factor": 32.0, "original_max_position_embeddings": 1024
        });
    });
    let inv_freq = c.inv_freq();
    let (half, heads) = (inv_freq.len(), c.heads);
    let positions = [0u32, 1, 2, 7, 63, 200, 255, 3];
    let width = heads * 2 * half;
    let x: Vec<f32> = (0..positions.len() * width)
        .map(|i| ((i as f32) * 0.731).sin() * 2.0)
        .collect();
    let group = common::test_device();
    let got = group.run(Rotate {
        x: &x,
        inv_freq: &inv_freq,
        heads,
        positions: &positions,
        context: c.max_positions,
    });
    assert_eq!(got.len(), x.len());
    for (row, &pos) in positions.iter().enumerate() {
        for head in 0..heads {
            let base = row * width + head * 2 * half;
            for (i, &f) in inv_freq.iter().enumerate() {
                let angle = pos as f64 * f as f64;
                let (x1, x2) = (x[base + i] as f64, x[base + i + half] as f64);
                let want = [x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()];
                let tolerance = (x1.abs() + x2.abs()) * table_tolerance(angle) + 1e-6;
                for (k, w) in want.into_iter().enumerate() {
                    let g = got[base + i + k * half] as f64;
                    assert!(
                        (g - w).abs() <= tolerance,
                        "row {row} (position {pos}), head {head}, dimension {}: {g}, expected {w}",
                        i + k * half
                    );
                }
            }
        }
    }
}

/// Logits against transformers' f32, golden's bound: the worst difference
/// measured on lavapipe is 1.4e-5 (llama3 scaling), 1.0e-5 (LongRoPE).
const LOGIT_TOLERANCE: f32 = 1e-4;

/// `model` (a fixture with its rope parameters replaced) loaded on the
/// test device: every case of the reference.json in `references`, logits
/// within [`LOGIT_TOLERANCE`] and greedy ids through the KV cache; then,
/// with `prefix`, each prompt's first `prefix` tokens passed on their own,
/// their logits and the reference's for the same positions.
struct AgainstReference<'a> {
    model: &'a cleave_models::ModelDir,
    references: &'a std::path::Path,
    group: &'a cleave_device::DeviceGroup,
    prefix: Option<usize>,
}

impl RuntimeTask for AgainstReference<'_> {
    type Output = Vec<(Vec<f32>, Vec<f32>)>;

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Self::Output {
        let layer = cleave_plan::SplitMode::Layer;
        let llama = common::load_split(clients, self.group, self.model, 256, None, layer).expect("load");
        let vocab = llama.vocab_size();
        let reference = common::reference(self.references);
        let mut worst = 0.0f32;
        let mut prefixes = Vec::new();
        for case in &reference.cases {
            worst = worst.max(common::check_logits(llama.as_ref(), case, LOGIT_TOLERANCE));
            common::check_greedy(llama.as_ref(), &self.model.tokenizer, case);
            if let Some(prefix) = self.prefix {
                let mut ctx = llama.new_context(256).unwrap();
                let ids = &case.input_ids[..prefix];
                let got = llama.forward(&mut ctx, ids, cleave_nn::Logits::All).unwrap();
                assert_eq!(got.len(), prefix * vocab);
                prefixes.push((got, case.logits[..prefix].concat()));
            }
        }
        eprintln!("{}: worst logit difference {worst:e}", reference.model);
        prefixes
    }
}

/// A copy of the shared fixture `base` with its config.json edited by
/// `edit`, opened with an f32 cache (the references are f32 arithmetic).
fn with_config(base: &str, edit: impl FnOnce(&mut Value)) -> (tempfile::TempDir, cleave_models::ModelDir) {
    let dir = common::copy_of(base);
    common::edit_json(&dir.path().join("config.json"), edit);
    let mut model = cleave_models::ModelDir::open(dir.path()).unwrap();
    model.cache_type = cleave_nn::CacheType::F32;
    (dir, model)
}

fn with_rope(rope: Value) -> (tempfile::TempDir, cleave_models::ModelDir) {
    with_config("phi3-tiny", |v| v["rope_parameters"] = rope)
}

/// The largest difference between two runs' logits, all of them finite
/// (a NaN would otherwise drop out of the maximum).
fn largest_difference(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    assert!(
        got.iter().chain(want).all(|v| v.is_finite()),
        "logits that are not finite"
    );
    got.iter().zip(want).map(|(g, w)| (g - w).abs()).fold(0.0, f32::max)
}

/// LongRoPE through the model: short factors of 1 within the original
/// context are the default rope, so transformers' references hold; with
/// an original context of 8 positions, every pass of the fixture's
/// prompts (13 tokens and more) takes the long factors, here 1, while a
/// pass of 8 tokens takes the short ones, here 7, and moves far from the
/// references.
#[test]
fn longrope_picks_short_or_long_factors_by_where_a_pass_ends() {
    let group = common::test_device();
    let rope = |short: f64, long: f64, original: usize| {
        json!({
            "rope_type": "longrope", "rope_theta": 10_000.0, "partial_rotary_factor": 0.5,
            "short_factor": [short, short, short, short], "long_factor": [long, long, long, long], "attention_factor": 1.0,
            "original_max_position_embeddings": original
        })
    };
    for (rope, short_is_default) in [(rope(1.0, 5.0, 4096), true), (rope(7.0, 1.0, 8), false)] {
        let (_dir, model) = with_rope(rope);
        let prefixes = group.run(AgainstReference {
            model: &model,
            references: &model.path,
            group: &group,
            prefix: Some(8),
        });
        for (got, want) in prefixes {
            let worst = largest_difference(&got, &want);
            assert_eq!(
                worst <= LOGIT_TOLERANCE,
                short_is_default,
                "8-token pass: worst logit difference {worst}"
            );
        }
    }
}

/// A shared fixture with the rope scaling of tests/fixtures/rope-scaling/
/// `variant` (its config.json), against what transformers computed for it
/// there (make_rope_fixtures.py): every position's logits and 24 greedy
/// tokens, for a prompt past the original context and one whose greedy
/// steps pass its end. The same from the F32 GGUF file llama.cpp's
/// converter made of it (`<variant>-F32.gguf`).
fn scaled_rope_matches_transformers(variant: &str, base: &str) {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/rope-scaling")
        .join(variant);
    let config: Value = serde_json::from_str(&std::fs::read_to_string(fixture.join("config.json")).unwrap()).unwrap();
    let rope = config.get("rope_scaling").unwrap_or(&config["rope_parameters"]);
    let original = rope["original_max_position_embeddings"].as_u64().unwrap() as usize;
    let (dir, model) = with_config(base, |v| *v = config);
    std::fs::copy(fixture.join("reference.json"), dir.path().join("reference.json")).unwrap();
    let reference = common::reference(dir.path());
    let past = reference.cases.iter().any(|c| c.input_ids.len() > original);
    let crossing = reference.cases.iter().any(|c| {
        let prompt = c.input_ids.len();
        prompt <= original && prompt + c.greedy_new_ids.len() > original
    });
    assert!(
        past && crossing,
        "{variant}: a prompt past the original context ({past}), one whose greedy steps pass its end ({crossing})"
    );
    // The same model as llama.cpp's converter writes it, the scaling as
    // tensors of per-frequency factors.
    let mut gguf = cleave_models::ModelDir::open(&fixture.join(format!("{variant}-F32.gguf"))).unwrap();
    gguf.cache_type = cleave_nn::CacheType::F32;
    let group = common::test_device();
    for model in [&model, &gguf] {
        for case in &reference.cases {
            assert_eq!(model.tokenizer.encode(&case.prompt).unwrap(), case.input_ids);
        }
        group.run(AgainstReference {
            model,
            references: dir.path(),
            group: &group,
            prefix: None,
        });
    }
}

/// Llama 3 scaling (llama-tiny, transformers 4's `rope_scaling`): its
/// 16-dimension heads keep, interpolate and divide frequencies alike.
#[test]
fn llama3_scaling_gives_transformers_numbers_past_the_original_context() {
    scaled_rope_matches_transformers("llama3", "llama-tiny");
}

/// LongRoPE (phi3-tiny, transformers 5's `rope_parameters`, the attention
/// factor derived from the context lengths): a 20-token prompt prefilled
/// with the short factors whose greedy steps pass position 32, each of
/// those calls taking the long factors over the keys the short ones
/// rotated, as transformers' forward calls do (its `generate` for Phi-3
/// prefills the whole sequence again at that point instead); and a
/// 62-token prompt with the long factors throughout.
#[test]
fn longrope_gives_transformers_numbers_past_the_original_context() {
    scaled_rope_matches_transformers("longrope", "phi3-tiny");
}
