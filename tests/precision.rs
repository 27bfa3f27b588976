//! `--precision fast` on a bf16 checkpoint, an f16 one and GGUF files
//! (Q8_0, Q4_K_M, a Gemma 2): prefill products, attention's among them,
//! take their inputs rounded to 16 bits (on matrix units where the device
//! has them, formed by the other kernels elsewhere, as here in CI). Their
//! logits stay within the bounds measured against transformers' f32
//! reference (and, for bf16, against transformers run in bf16 itself),
//! their greedy ids are the reference's, and they are not the exact
//! path's logits: the rounding is really there (but for a prompt so short
//! that it runs in the decode form, whose products are exact).

use crate::common;

use cleave_device::RuntimeTask;
use cleave_models::ModelDir;
use cleave_nn::Logits;
use cleave_plan::SplitMode;
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::Precision;
use common::{fixture, load_split, reference, Case};

/// Fast products' logits against transformers' f32 ones: the worst
/// measured on lavapipe is 1.2e-1 with attention's products rounded too
/// (each probability rounded before it is normalised, as flash attention
/// does; 1.04e-1 when they were rounded after; 8.4e-2 when only the
/// projections' products were rounded, 4.5e-2 on an H200's matrix units
/// then), and transformers' own bf16 logits are up to 0.26 away.
const FAST_TOLERANCE: f32 = 0.15;

/// Fast products' logits against transformers' own in bf16
/// (tests/fixtures/bf16-logits: every activation stored in bf16, which
/// is itself up to 0.26 from the f32 logits): the worst measured on
/// lavapipe is 2.9e-1.
const BF16_TOLERANCE: f32 = 0.5;

/// Fast products of GGUF files' dequantized weights against transformers'
/// f32 logits on those weights: the worst measured on lavapipe is 2.5e-2
/// (Q8_0; 2.4e-2 Q4_K_M, 7.4e-3 gemma2's Q8_0).
const FAST_GGUF_TOLERANCE: f32 = 5e-2;

/// Fast products of an f16 copy of llama-tiny against transformers' f32
/// logits of the f32 checkpoint: the worst measured on lavapipe is 2.0e-2,
/// of which the weights' rounding to f16 alone makes 1.0e-2 (the exact
/// path's distance).
const FAST_F16_TOLERANCE: f32 = 5e-2;

/// transformers' bf16 logits of each case, `[positions][vocab]`.
fn bf16_logits() -> Vec<Vec<Vec<f32>>> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bf16-logits/reference.json");
    let reference: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    reference["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|case| serde_json::from_value(case["logits"].clone()).unwrap())
        .collect()
}

struct Fast<'a> {
    model: &'a ModelDir,
    group: &'a cleave_device::DeviceGroup,
    cases: &'a [Case],
    /// The bound on fast logits against the cases' f32 ones.
    tolerance: f32,
    /// transformers' own bf16 logits of each case, where there are some.
    bf16: Option<Vec<Vec<Vec<f32>>>>,
}

impl RuntimeTask for Fast<'_> {
    /// The worst difference from the f32 reference over every case.
    type Output = f32;

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> f32 {
        let llama = load_split(clients, self.group, self.model, 64, None, SplitMode::Layer).expect("load");
        let logits = |precision: Precision, case: &Case| {
            cleave_shaders::with_precision(precision, || {
                let mut ctx = llama.new_context(case.input_ids.len()).unwrap();
                llama.forward(&mut ctx, &case.input_ids, Logits::All).unwrap()
            })
        };
        let vocab = llama.vocab_size();
        let worst_against = |fast: &[f32], want: &[Vec<f32>], what: &str, tolerance: f32| {
            fast.chunks(vocab)
                .zip(want)
                .enumerate()
                .map(|(pos, (got, want))| common::max_diff(got, want, &format!("{what} at position {pos}"), tolerance))
                .fold(0.0, f32::max)
        };
        let mut worst_of_all = 0.0f32;
        for (i, case) in self.cases.iter().enumerate() {
            let fast = logits(Precision::Fast, case);
            let exact = logits(Precision::Exact, case);
            let what = format!("{:?}: fast logits", case.prompt);
            let worst = worst_against(&fast, &case.logits, &what, self.tolerance);
            worst_of_all = worst_of_all.max(worst);
            let apart = fast.iter().zip(&exact).map(|(f, e)| (f - e).abs()).fold(0.0, f32::max);
            // A prompt short enough for the decode form is multiplied by
            // the decode products, exact at either precision.
            let decode_form = case.input_ids.len() <= 1 + cleave_nn::MAX_DRAFTS;
            assert_eq!(
                apart > 0.0,
                !decode_form,
                "{:?}: fast logits {apart} from the exact ones",
                case.prompt
            );
            eprintln!("{what} within {worst:.1e} of transformers' f32, {apart:.1e} of the exact path's");
            if let Some(bf16) = &self.bf16 {
                let worst_bf16 = worst_against(&fast, &bf16[i], &format!("{what} against bf16"), BF16_TOLERANCE);
                eprintln!("{what} within {worst_bf16:.1e} of transformers' bf16");
            }
            // Greedy decoding with fast prefill products keeps the ids.
            cleave_shaders::with_precision(Precision::Fast, || {
                common::check_greedy(llama.as_ref(), &self.model.tokenizer, case)
            });
        }
        worst_of_all
    }
}

#[test]
fn fast_products_of_a_bf16_checkpoint_stay_near_the_reference() {
    let dir = fixture("llama-tiny-bf16");
    let model = ModelDir::open(&dir).unwrap();
    let reference = reference(&dir);
    let group = common::test_device();
    group.run(Fast {
        model: &model,
        group: &group,
        cases: &reference.cases,
        tolerance: FAST_TOLERANCE,
        bf16: Some(bf16_logits()),
    });
}

/// GGUF files at `fast`: a Q8_0 and a Q4_K_M llama and a family's Q8_0
/// (gemma2: soft caps, sliding windows), against transformers' f32 logits
/// on their dequantized weights.
#[test]
fn fast_products_of_gguf_files_stay_near_the_reference() {
    let families = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf-families");
    let files = [
        (fixture("llama-gguf"), "llama-gguf-Q8_0.gguf"),
        (fixture("llama-gguf"), "llama-gguf-Q4_K_M.gguf"),
        (families.join("gemma2"), "gemma2-Q8_0.gguf"),
    ];
    let group = common::test_device();
    for (dir, name) in files {
        let reference = crate::gguf::references_in(&dir).remove(name).unwrap().cases;
        let mut model = ModelDir::open(&dir.join(name)).unwrap();
        // The references' cache is f32; a GGUF model's default is f16.
        model.cache_type = cleave_nn::CacheType::F32;
        let worst = group.run(Fast {
            model: &model,
            group: &group,
            cases: &reference,
            tolerance: FAST_GGUF_TOLERANCE,
            bf16: None,
        });
        eprintln!("{name}: fast logits within {worst:.1e} of the reference");
    }
}

/// An f16 copy of llama-tiny (every tensor rounded to f16 here) at
/// `fast`, against transformers' f32 logits of the f32 checkpoint.
#[test]
fn fast_products_of_an_f16_checkpoint_stay_near_the_reference() {
    let source = fixture("llama-tiny");
    let copy = common::copy_of("llama-tiny");
    let bytes = std::fs::read(source.join("model.safetensors")).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let rounded: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
            let f16: Vec<u8> = view
                .data()
                .chunks_exact(4)
                .flat_map(|b| half::f16::from_f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]])).to_le_bytes())
                .collect();
            (name, view.shape().to_vec(), f16)
        })
        .collect();
    let views: Vec<(&str, safetensors::tensor::TensorView)> = rounded
        .iter()
        .map(|(name, shape, data)| {
            let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F16, shape.clone(), data).unwrap();
            (name.as_str(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, &copy.path().join("model.safetensors")).unwrap();
    let model = ModelDir::open(copy.path()).unwrap();
    let reference = reference(&source);
    let group = common::test_device();
    let worst = group.run(Fast {
        model: &model,
        group: &group,
        cases: &reference.cases,
        tolerance: FAST_F16_TOLERANCE,
        bf16: None,
    });
    eprintln!("f16 llama-tiny: fast logits within {worst:.1e} of the reference");
}
