//! Golden tests: every reference model in ../shared, against the numbers
//! Hugging Face transformers computed for it (float32, CPU).
//!
//! - the tokenizer gives the reference input ids exactly;
//! - a full prefill gives every position's logits within 1e-3;
//! - 24 greedy tokens, each fed back one at a time through the KV cache,
//!   are exactly the reference's. The reference never picks EOS (it was
//!   made with transformers' min_new_tokens), so neither does the test.

mod common;

use std::path::Path;

use cleave_device::RuntimeTask;
use cleave_models::ModelDir;
use cleave_nn::{CausalModel, Logits};
use cleave_shaders::cubecl::prelude::*;
use common::{reference, test_device, Case};

const LOGIT_TOLERANCE: f32 = 1e-3;

struct Golden<'a> {
    model: &'a ModelDir,
    group: &'a cleave_device::DeviceGroup,
    cases: &'a [Case],
}

impl RuntimeTask for Golden<'_> {
    type Output = ();

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) {
        let llama = common::load_split(
            clients,
            self.group,
            self.model,
            256,
            None,
            cleave_plan::SplitMode::Layer,
        )
        .expect("load");
        for case in self.cases {
            check_logits(llama.as_ref(), case);
            check_prefill_in_pieces(llama.as_ref(), case);
            check_greedy(llama.as_ref(), self.model, case);
        }
    }
}

fn check_logits<R: Runtime>(llama: &dyn CausalModel<R>, case: &Case) {
    let mut ctx = llama.new_context(case.input_ids.len()).unwrap();
    let logits = llama.forward(&mut ctx, &case.input_ids, Logits::All).expect("prefill");
    let vocab = llama.vocab_size();
    assert_eq!(logits.len(), case.logits.len() * vocab, "{}: logits rows", case.prompt);
    let mut worst = (0.0f32, 0, 0);
    for (pos, (got, want)) in logits.chunks(vocab).zip(&case.logits).enumerate() {
        for (id, (g, w)) in got.iter().zip(want).enumerate() {
            let diff = (g - w).abs();
            if diff.is_nan() || diff > worst.0 {
                worst = (diff, pos, id);
            }
        }
    }
    let (diff, pos, id) = worst;
    assert!(
        diff <= LOGIT_TOLERANCE,
        "{:?}: logit of token {id} at position {pos} differs from transformers by {diff}",
        case.prompt
    );
}

/// A prompt fed in two pieces (the second many rows at once after the
/// first in the cache, as a long prompt is prefilled in batches) gives the
/// reference logits too.
fn check_prefill_in_pieces<R: Runtime>(llama: &dyn CausalModel<R>, case: &Case) {
    let split = case.input_ids.len() / 2;
    let mut ctx = llama.new_context(case.input_ids.len()).unwrap();
    let mut logits = llama.forward(&mut ctx, &case.input_ids[..split], Logits::All).unwrap();
    logits.extend(llama.forward(&mut ctx, &case.input_ids[split..], Logits::All).unwrap());
    let worst = common::max_abs_diff(&logits, &case.logits.concat());
    assert!(
        worst <= LOGIT_TOLERANCE,
        "{:?} prefilled in two pieces: logits differ by {worst}",
        case.prompt
    );
}

fn check_greedy<R: Runtime>(llama: &dyn CausalModel<R>, model: &ModelDir, case: &Case) {
    let steps = case.greedy_new_ids.len();
    let mut ctx = llama.new_context(case.input_ids.len() + steps).unwrap();
    let logits = llama.forward(&mut ctx, &case.input_ids, Logits::Last).expect("prefill");
    let ids = common::greedy(llama, &mut ctx, logits, steps, model.tokenizer.eos_ids());
    assert_eq!(ids, case.greedy_new_ids, "{:?}: greedy ids", case.prompt);
    assert_eq!(
        model.tokenizer.decode(&ids).unwrap(),
        case.greedy_text,
        "{:?}: greedy text",
        case.prompt
    );
}

fn golden(dir: &Path) {
    let reference = reference(dir);
    let model = ModelDir::open(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for case in &reference.cases {
        let ids = model.tokenizer.encode(&case.prompt).unwrap();
        assert_eq!(
            ids, case.input_ids,
            "{}: token ids of {:?}",
            reference.model, case.prompt
        );
    }
    let group = test_device();
    group.run(Golden {
        model: &model,
        group: &group,
        cases: &reference.cases,
    });
}

#[test]
fn llama_tiny() {
    golden(&common::fixture("llama-tiny"));
}

#[test]
fn llama_tiny_bf16() {
    golden(&common::fixture("llama-tiny-bf16"));
}

#[test]
fn llama_tiny_sharded() {
    golden(&common::fixture("llama-tiny-sharded"));
}

#[test]
fn qwen2_tiny() {
    golden(&common::fixture("qwen2-tiny"));
}

#[test]
fn fortune_llama_3m() {
    golden(&common::shared_model("fortune-llama-3m"));
}

/// A config that does not say whether the head is tied: a checkpoint
/// without `lm_head.weight` ties it, as transformers does.
#[test]
fn head_tied_by_the_checkpoint_when_the_config_is_silent() {
    let dir = common::copy_of("qwen2-tiny");
    common::edit_json(&dir.path().join("config.json"), |c| {
        c.as_object_mut().unwrap().remove("tie_word_embeddings");
    });
    let mut reference = reference(&common::fixture("qwen2-tiny"));
    reference.cases.truncate(1);
    let model = ModelDir::open(dir.path()).unwrap();
    let group = test_device();
    group.run(Golden {
        model: &model,
        group: &group,
        cases: &reference.cases,
    });
}
