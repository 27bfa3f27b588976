//! A decode step that picks its tokens on the device: the same ids as the
//! host's greedy pick of the same logits, for one sequence and for several
//! decoded together, with end-of-sequence ids banned; and, once warm, a
//! step allocates nothing on the device, writes nothing to it, and reads
//! back one id (4 bytes) per sequence.

mod common;

use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_models::ModelDir;
use cleave_nn::{CausalModel, Logits};
use cleave_plan::SplitMode;
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::profile::Counters;
use common::{fixture, load_split, reference, shared_model};

const CONTEXT: usize = 96;
const STEPS: usize = 16;
/// Steps before a decode step's buffers are all made: the first makes the
/// workspace's and the picks', the second its rows' on the device.
const WARM_UP: usize = 2;

/// The host's greedy pick of each sequence's logits, `banned` ids never.
fn host_picks(logits: Vec<Vec<f32>>, banned: &[u32]) -> Vec<u32> {
    logits
        .into_iter()
        .map(|mut logits| {
            for &id in banned {
                logits[id as usize] = f32::NEG_INFINITY;
            }
            cleave_engine::argmax(&logits).expect("a token: the logits hold no NaN")
        })
        .collect()
}

struct Steps<'a> {
    model: &'a ModelDir,
    group: &'a DeviceGroup,
    /// Prompts decoded together, each in a slot of its own.
    prompts: Vec<Vec<u32>>,
}

impl RuntimeTask for Steps<'_> {
    type Output = ();

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) {
        let llama = load_split(clients, self.group, self.model, CONTEXT, None, SplitMode::Layer).expect("load");
        let eos = self.model.tokenizer.eos_ids();
        let n = self.prompts.len();
        let banned: Vec<&[u32]> = vec![eos; n];
        // The same sequences on the device's picks and on the host's, a
        // spare slot first so that no sequence starts the cache.
        let (mut device, mut host) = (context(llama.as_ref(), n), context(llama.as_ref(), n));
        let mut ids: Vec<u32> = Vec::new();
        for (i, prompt) in self.prompts.iter().enumerate() {
            let id = llama.forward_greedy(&mut device, i + 1, prompt, eos).unwrap();
            let logits = llama.forward_slot(&mut host, i + 1, prompt, Logits::Last).unwrap();
            assert_eq!(id, host_picks(vec![logits], eos)[0], "first token of prompt {i}");
            ids.push(id);
        }
        for step in 0..STEPS {
            let steps: Vec<(usize, u32)> = ids.iter().enumerate().map(|(i, &id)| (i + 1, id)).collect();
            let before = Counters::now();
            let picked = llama.decode_greedy(&mut device, &steps, &banned).unwrap();
            let counted = Counters::now().since(before);
            let want = host_picks(llama.decode(&mut host, &steps).unwrap(), eos);
            assert_eq!(picked, want, "step {step} of {n} sequences");
            if step >= WARM_UP {
                let what = format!("step {step} of {n} sequences: {counted:?}");
                assert_eq!(counted.allocations, 0, "{what}");
                assert_eq!(counted.writes, 0, "{what}");
                assert_eq!(counted.reads, 1, "{what}");
                assert_eq!(counted.read_bytes, 4 * n as u64, "{what}");
            }
            ids = picked;
        }
    }
}

fn context<R: Runtime>(llama: &dyn CausalModel<R>, sequences: usize) -> cleave_nn::Context {
    llama.new_context_slots(CONTEXT, sequences + 1).unwrap()
}

/// Decodes the reference prompts of `model_dir`: alone (each its own
/// run) and all together.
fn check(model_dir: std::path::PathBuf) {
    let model = ModelDir::open(&model_dir).unwrap();
    let prompts: Vec<Vec<u32>> = reference(&model_dir).cases.into_iter().map(|c| c.input_ids).collect();
    let group = common::test_device();
    for prompt in &prompts {
        group.run(Steps {
            model: &model,
            group: &group,
            prompts: vec![prompt.clone()],
        });
    }
    group.run(Steps {
        model: &model,
        group: &group,
        prompts,
    });
}

#[test]
fn device_picks_equal_host_picks_and_a_warm_step_allocates_nothing() {
    check(shared_model("fortune-llama-3m"));
    // Sliding-window layers, whose key ranges move on differently.
    check(fixture("gemma3-tiny"));
}
