//! `--precision fast` on a bf16 checkpoint: prefill products, attention's
//! among them, take their inputs rounded to bf16 (on matrix units where
//! the device has them, formed by the other kernels elsewhere, as here in
//! CI). Its logits stay
//! within the bounds measured against transformers' f32 reference and
//! against transformers run in bf16 itself, its greedy ids are the
//! reference's, and they are not the exact path's logits: the rounding is
//! really there (but for a prompt so short that it runs in the decode
//! form, whose products are exact).

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
}

impl RuntimeTask for Fast<'_> {
    type Output = ();

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) {
        let llama = load_split(clients, self.group, self.model, 64, None, SplitMode::Layer).expect("load");
        let logits = |precision: Precision, case: &Case| {
            cleave_shaders::with_precision(precision, || {
                let mut ctx = llama.new_context(case.input_ids.len()).unwrap();
                llama.forward(&mut ctx, &case.input_ids, Logits::All).unwrap()
            })
        };
        for (case, bf16) in self.cases.iter().zip(bf16_logits()) {
            let fast = logits(Precision::Fast, case);
            let exact = logits(Precision::Exact, case);
            let vocab = llama.vocab_size();
            let worst = fast
                .chunks(vocab)
                .zip(&case.logits)
                .enumerate()
                .map(|(pos, (got, want))| {
                    let what = format!("{:?}: fast logits at position {pos}", case.prompt);
                    common::max_diff(got, want, &what, FAST_TOLERANCE)
                })
                .fold(0.0, f32::max);
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
            let worst_bf16 = fast
                .chunks(vocab)
                .zip(&bf16)
                .enumerate()
                .map(|(pos, (got, want))| {
                    let what = format!("{:?}: fast logits at position {pos}, against bf16", case.prompt);
                    common::max_diff(got, want, &what, BF16_TOLERANCE)
                })
                .fold(0.0, f32::max);
            eprintln!(
                "{:?}: fast logits within {worst:.1e} of transformers' f32, {worst_bf16:.1e} of its bf16",
                case.prompt
            );
            // Greedy decoding with fast prefill products keeps the ids.
            cleave_shaders::with_precision(Precision::Fast, || {
                common::check_greedy(llama.as_ref(), &self.model.tokenizer, case)
            });
        }
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
    });
}
