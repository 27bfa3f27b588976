//! One model across devices of different runtimes (a CUDA GPU beside a
//! Vulkan one), run here on logical devices of the test device opened
//! apart (`DeviceGroup::apart`): each member is a runtime slot of its own,
//! holding its own part of the model (a run of blocks in layer split, the
//! experts it owns in expert split), loaded through its own runtime task,
//! the activations crossing between parts through the host, as between
//! runtimes. Every family's fixture gives transformers' logits and greedy
//! ids that way, picked on the host and on the device, one sequence and
//! several at once, and each member holds what the plan gives it; so do
//! the mixtures in expert split, their experts cached or not.

use crate::common;

use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_hf::LoraMode;
use cleave_models::ModelDir;
use cleave_nn::{CacheType, CausalModel, ModelError, PickRule, Placed};
use cleave_plan::{Plan, PlanOptions, SplitMode};
use cleave_shaders::cubecl::prelude::*;
use common::{capped_group, fixture, reference, Case};

const CONTEXT: usize = 128;
/// As the golden tests': layer split runs every block as one device does.
const LOGIT_TOLERANCE: f32 = 1e-4;

/// `members` logical devices of the test device, each a runtime slot of
/// its own.
fn apart(members: usize) -> DeviceGroup {
    capped_group(&vec![None; members]).apart()
}

/// Loads `model` on `group` in `mode`, the later slots' parts through
/// their own runtime tasks, as `cleave run` loads it.
fn load<R: Runtime>(
    clients: Vec<ComputeClient<R>>,
    group: &DeviceGroup,
    model: &ModelDir,
    (options, ratios): (&PlanOptions, Option<&[f64]>),
) -> Result<(Box<dyn CausalModel<R>>, Plan), ModelError> {
    let inventory = model.inventory(CONTEXT);
    let members = cleave_nn::plan_members(group);
    let plan = cleave_plan::plan(&inventory, &members, ratios, options)?;
    let first = Placed::group(clients, &group.slots()[0].group);
    let llama = model.load_on_group(first, group, plan.clone(), (&[], LoraMode::Auto), &mut |_| {})?;
    Ok((llama, plan))
}

struct Golden<'a> {
    model: &'a ModelDir,
    group: &'a DeviceGroup,
    options: PlanOptions,
    /// How the plan divides the group (evenly where `None`).
    ratios: Option<&'a [f64]>,
}

impl RuntimeTask for Golden<'_> {
    type Output = ();

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) {
        let (llama, plan) = load(clients, self.group, self.model, (&self.options, self.ratios)).expect("load");
        let what = self.model.path.display();
        let holding = plan.devices.iter().filter(|d| d.weight_bytes > 0).count();
        assert!(holding >= 2, "{what}: at least two parts hold weights:\n{plan}");
        for (device, ratio) in plan.devices.iter().zip(self.ratios.unwrap_or_default()) {
            assert!(
                *ratio > 0.0 || device.blocks.is_empty(),
                "{what}: a share of 0 holds blocks:\n{plan}"
            );
        }
        let ctx = llama.new_context(CONTEXT).unwrap();
        common::assert_holds_plan(&plan, &llama.model_bytes_in_use().unwrap(), self.model, CONTEXT);
        drop(ctx);
        let cases = reference(&self.model.path).cases;
        let mut worst = 0.0f32;
        for case in &cases {
            worst = worst.max(common::check_logits(llama.as_ref(), case, LOGIT_TOLERANCE));
            worst = worst.max(common::check_prefill_in_pieces(llama.as_ref(), case, LOGIT_TOLERANCE));
            common::check_greedy(llama.as_ref(), &self.model.tokenizer, case);
        }
        check_device_picks(llama.as_ref(), &self.model.tokenizer, &cases);
        let uploads = llama.upload_stats();
        eprintln!(
            "{what} in {} split across {holding} runtime slots: worst logit difference {worst:e}, {uploads:?}",
            plan.mode
        );
    }
}

/// Every case prefilled into a slot of its own and decoded greedily in
/// steps that carry all of them, each token picked on the device where
/// the tail is: the reference's greedy ids.
fn check_device_picks<R: Runtime>(llama: &dyn CausalModel<R>, tokenizer: &cleave_hf::Tokenizer, cases: &[Case]) {
    let rule = PickRule::greedy(tokenizer.eos_ids().to_vec());
    let mut ctx = llama.new_context_slots(CONTEXT, cases.len()).unwrap();
    let mut ids: Vec<Vec<u32>> = cases
        .iter()
        .enumerate()
        .map(|(slot, case)| {
            llama
                .forward_pick(&mut ctx, slot, &case.input_ids, std::slice::from_ref(&rule))
                .unwrap()
        })
        .collect();
    let steps = cases.iter().map(|c| c.greedy_new_ids.len()).max().unwrap_or(0);
    let rules = vec![rule; cases.len()];
    for _ in 1..steps {
        let step: Vec<(usize, u32)> = ids
            .iter()
            .enumerate()
            .map(|(slot, ids)| (slot, ids[ids.len() - 1]))
            .collect();
        let picked = llama.decode_pick(&mut ctx, &step, &rules).unwrap();
        for (ids, id) in ids.iter_mut().zip(picked) {
            ids.push(id);
        }
    }
    for (ids, case) in ids.iter().zip(cases) {
        let n = case.greedy_new_ids.len();
        common::assert_greedy_ids(
            &ids[..n],
            case,
            "batched decode picked on the device across runtime slots",
        );
    }
}

/// `name`'s fixture on `members` runtime slots in layer split.
fn golden(name: &str, members: usize) {
    golden_in(name, members, common::test_options(SplitMode::Layer), None);
}

/// `name`'s fixture on `members` runtime slots, placed by `options` (and
/// `ratios`, where given).
fn golden_in(name: &str, members: usize, options: PlanOptions, ratios: Option<&[f64]>) {
    let dir = fixture(name);
    let mut model = ModelDir::open(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    // The references are f32 arithmetic (a 16-bit checkpoint's cache
    // defaults to f16).
    model.cache_type = CacheType::F32;
    let group = apart(members);
    assert_eq!(group.slots().len(), members, "each member a runtime slot");
    group.run(Golden {
        model: &model,
        group: &group,
        options,
        ratios,
    });
}

#[test]
fn llama_across_runtime_slots() {
    golden("llama-tiny", 3);
    golden("llama-tiny-bf16", 2);
}

#[test]
fn qwen_across_runtime_slots() {
    golden("qwen2-tiny", 3);
    golden("qwen3-tiny", 2);
}

#[test]
fn phi3_and_gemma3_across_runtime_slots() {
    golden("phi3-tiny", 2);
    golden("gemma3-tiny", 3);
}

/// The mixtures have two blocks: on three slots, the third holds nothing
/// and is left out.
#[test]
fn mixtures_across_runtime_slots() {
    golden("mixtral-tiny", 3);
    golden("qwen3-moe-tiny", 2);
}

/// Expert split across runtime slots: the main slot keeps attention, the
/// routers and the KV cache, and sends each routed expert's rows to the
/// slot that owns it; with caches of one expert per block, the slots
/// upload the experts they lack.
#[test]
fn experts_across_runtime_slots() {
    golden_in("mixtral-tiny", 2, common::expert_options(None), None);
    golden_in("qwen3-moe-tiny", 3, common::expert_options(None), None);
    golden_in("mixtral-tiny", 3, common::expert_options(Some(1)), None);
}

/// Gemma 4's per-layer inputs cross the runtimes with the residual
/// stream, and its experts beside the MLP go to the slots that own them.
#[test]
fn gemma4_across_runtime_slots() {
    golden("gemma4-tiny", 2);
    golden_in("gemma4-moe-tiny", 2, common::expert_options(None), None);
}

/// A layer reading an earlier layer's KV cache held by another runtime's
/// part is refused by both layers' numbers: the caches do not cross.
#[test]
fn a_shared_kv_cache_on_another_runtime_is_refused_by_name() {
    let group = apart(3);
    let model = ModelDir::open(&fixture("gemma4-tiny")).unwrap();
    let error = group.run(Refused {
        model: &model,
        group: &group,
        mode: SplitMode::Layer,
    });
    for needle in ["layer 6 reads the KV cache of layer 4", "another runtime"] {
        assert!(error.contains(needle), "{error:?} lacks {needle:?}");
    }
}

/// A slot the plan gives no block, between two that hold blocks, passes
/// the activations on untouched.
#[test]
fn an_empty_slot_between_two_passes_the_rows_on() {
    let layer = common::test_options(SplitMode::Layer);
    golden_in("llama-tiny", 3, layer, Some(&[1.0, 0.0, 1.0]));
}

struct Refused<'a> {
    model: &'a ModelDir,
    group: &'a DeviceGroup,
    mode: SplitMode,
}

impl RuntimeTask for Refused<'_> {
    type Output = String;

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> String {
        match load(
            clients,
            self.group,
            self.model,
            (&common::test_options(self.mode), None),
        ) {
            Ok(_) => panic!("{} split across runtime slots loaded", self.mode),
            Err(e) => e.to_string(),
        }
    }
}

/// Row and tensor split would sum partial results of every block across
/// runtimes: each is refused by name, before anything loads.
#[test]
fn splits_inside_a_block_are_refused_across_runtime_slots() {
    let group = apart(2);
    let model = ModelDir::open(&fixture("llama-tiny")).unwrap();
    for mode in [SplitMode::Row, SplitMode::Tensor] {
        let error = group.run(Refused {
            model: &model,
            group: &group,
            mode,
        });
        for needle in [&format!("{mode} split"), "cannot span runtimes", "--split-mode layer"] {
            assert!(error.contains(needle), "{mode} split: {error:?} lacks {needle:?}");
        }
    }
}

/// A group of one runtime is one slot; apart, each member is one.
#[test]
fn slots_are_runs_of_one_runtime() {
    let group = capped_group(&[None, None, None]);
    let slots = group.slots();
    assert_eq!(slots.len(), 1);
    assert_eq!(slots[0].members, 0..3);
    let apart = group.apart();
    let members: Vec<_> = apart.slots().into_iter().map(|s| s.members).collect();
    assert_eq!(members, [0..1, 1..2, 2..3]);
}
