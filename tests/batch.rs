//! Several sequences decoded together, each in its own slot of one KV
//! cache (what the server does): every sequence gets transformers' greedy
//! ids, and bit for bit the logits it gets when decoded alone, on one
//! device and split across logical devices in every mode.

use crate::common;

use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_models::ModelDir;
use cleave_nn::{CausalModel, Logits};
use cleave_plan::SplitMode;
use cleave_shaders::cubecl::prelude::*;
use common::{fixture, load_split, reference, shared_model, Case};

const CONTEXT: usize = 96;
const STEPS: usize = 24;

/// Greedy decoding of every case at once: the ids per case, and every
/// step's logits per case.
fn decode_together<R: Runtime>(
    llama: &dyn CausalModel<R>,
    cases: &[Case],
    eos: &[u32],
) -> Vec<(Vec<u32>, Vec<Vec<f32>>)> {
    // A spare slot first, so that no case sits at the start of the cache.
    let mut ctx = llama.new_context_slots(CONTEXT, cases.len() + 1).unwrap();
    let mut last: Vec<Vec<f32>> = cases
        .iter()
        .enumerate()
        .map(|(i, case)| {
            llama
                .forward_slot(&mut ctx, i + 1, &case.input_ids, Logits::Last)
                .unwrap()
        })
        .collect();
    let mut out: Vec<(Vec<u32>, Vec<Vec<f32>>)> = vec![(Vec::new(), Vec::new()); cases.len()];
    for _ in 0..STEPS {
        let steps: Vec<(usize, u32)> = last
            .iter_mut()
            .enumerate()
            .map(|(i, logits)| {
                for &id in eos {
                    logits[id as usize] = f32::NEG_INFINITY;
                }
                (
                    i + 1,
                    cleave_shaders::argmax_on_host(logits).expect("a token: the logits hold no NaN"),
                )
            })
            .collect();
        for (i, &(_, id)) in steps.iter().enumerate() {
            out[i].0.push(id);
        }
        last = llama.decode(&mut ctx, &steps).unwrap();
        for (i, logits) in last.iter().enumerate() {
            out[i].1.push(logits.clone());
        }
    }
    out
}

/// The same, one case at a time in a context of its own.
fn decode_alone<R: Runtime>(llama: &dyn CausalModel<R>, case: &Case, eos: &[u32]) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut ctx = llama.new_context(CONTEXT).unwrap();
    let mut logits = llama.forward(&mut ctx, &case.input_ids, Logits::Last).unwrap();
    let (mut ids, mut all) = (Vec::new(), Vec::new());
    for _ in 0..STEPS {
        for &id in eos {
            logits[id as usize] = f32::NEG_INFINITY;
        }
        let id = cleave_shaders::argmax_on_host(&logits).expect("a token: the logits hold no NaN");
        ids.push(id);
        logits = llama.forward(&mut ctx, &[id], Logits::Last).unwrap();
        all.push(logits.clone());
    }
    (ids, all)
}

struct Together<'a> {
    model: &'a ModelDir,
    group: &'a DeviceGroup,
    mode: SplitMode,
    cases: &'a [Case],
}

impl RuntimeTask for Together<'_> {
    type Output = ();

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) {
        let llama = load_split(clients, self.group, self.model, CONTEXT, None, self.mode).expect("load");
        let eos = self.model.tokenizer.eos_ids();
        let together = decode_together(llama.as_ref(), self.cases, eos);
        for (case, (ids, logits)) in self.cases.iter().zip(together) {
            common::assert_greedy_ids(&ids, case, &format!("decoded together ({:?} split)", self.mode));
            let (alone_ids, alone_logits) = decode_alone(llama.as_ref(), case, eos);
            assert_eq!(ids, alone_ids);
            assert!(
                logits == alone_logits,
                "{:?} ({:?} split): logits decoded beside other sequences differ from alone",
                case.prompt,
                self.mode
            );
        }
    }
}

fn check(model_dir: std::path::PathBuf, devices: usize, mode: SplitMode) {
    let model = ModelDir::open(&model_dir).unwrap();
    let reference = reference(&model_dir);
    let group = common::logical_group(devices);
    group.run(Together {
        model: &model,
        group: &group,
        mode,
        cases: &reference.cases,
    });
}

/// Each fixture on the groups the fixture table gives it: those of one
/// device (`split` false) or of several.
fn check_table(split: bool) {
    for decoder in common::decoders::decoders() {
        for &(devices, mode) in decoder.batch.iter().filter(|(devices, _)| (*devices > 1) == split) {
            check(fixture(decoder.name), devices, mode);
        }
    }
}

#[test]
fn sequences_decoded_together_match_transformers_and_decoding_alone() {
    check_table(false);
    check(shared_model("fortune-llama-3m"), 1, SplitMode::Layer);
}

#[test]
fn sequences_decoded_together_on_a_split_model() {
    check_table(true);
}
