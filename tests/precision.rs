//! `--precision fast` on a bf16 checkpoint: prefill products take their
//! activations rounded to bf16 (on matrix units where the device has them,
//! formed by the other kernels elsewhere, as here in CI). Its logits stay
//! within the bound measured against transformers' f32 reference (worst
//! 4.5e-2 on an H200's matrix units, the same rounding emulated on lavapipe
//! within it), its greedy ids are the reference's, and they are not the
//! exact path's logits: the rounding is really there (but for a prompt so
//! short that it runs in the decode form, whose products are exact).

mod common;

use cleave_device::RuntimeTask;
use cleave_models::ModelDir;
use cleave_nn::Logits;
use cleave_plan::SplitMode;
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::Precision;
use common::{fixture, load_split, reference, Case};

/// Fast products' logits against transformers' f32 ones: twice the worst
/// measured (4.5e-2).
const FAST_TOLERANCE: f32 = 0.1;

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
        for case in self.cases {
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
            eprintln!("{:?}: fast logits within {worst:.1e} of transformers' f32", case.prompt);
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
