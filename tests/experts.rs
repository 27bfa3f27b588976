//! Expert split and expert streaming on the mixtures of experts
//! (mixtral-tiny: 4 experts, top-2; qwen3-moe-tiny: 8 experts, top-2,
//! renormalised), against transformers' logits and greedy ids: experts
//! divided over 2 and 3 logical devices, by memory, by ratios and under
//! caps, and with caches of 1 and 2 experts per block that upload the
//! routed experts they lack. Each device holds exactly what its plan says,
//! before and after the caches have turned over, one decode step uploads
//! at most `top_k` experts per block, and a LoRA adapter on the experts
//! applies to uploaded experts as to resident ones.

use crate::common;

use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_models::ModelDir;
use cleave_nn::{CacheType, CausalModel, Logits, UploadStats};
use cleave_plan::{Plan, PlanOptions};
use cleave_shaders::cubecl::prelude::*;
use common::{capped_group, fixture, reference};

const CONTEXT: usize = 256;
/// As the golden tests': expert split runs each expert with the same
/// kernels and adds their outputs in the same order as one device.
const LOGIT_TOLERANCE: f32 = 1e-4;
const MOE_FIXTURES: [&str; 5] = [
    "mixtral-tiny",
    "qwen3-moe-tiny",
    "gpt-oss-tiny",
    "gpt-oss-mxfp4-tiny",
    "gemma4-moe-tiny",
];

/// Loads `model` in expert split as `plan` says and checks it against the
/// fixture's reference; returns what it uploaded while running.
struct Golden<'a> {
    model: &'a ModelDir,
    group: &'a DeviceGroup,
    plan: Plan,
}

impl RuntimeTask for Golden<'_> {
    type Output = UploadStats;

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> UploadStats {
        let devices = cleave_nn::Placed::group(clients, self.group);
        let llama = self.model.load(devices, self.plan, &mut |_| {}).expect("load");
        common::assert_memory_matches_plan(llama.placement(), 0);
        for case in reference(&self.model.path).cases {
            common::check_logits(llama.as_ref(), &case, LOGIT_TOLERANCE);
            common::check_greedy(llama.as_ref(), &self.model.tokenizer, &case);
        }
        // Caches that turned over still hold no more than the plan.
        common::assert_memory_matches_plan(llama.placement(), 0);
        let stats = llama.upload_stats();
        check_decode_uploads(llama.as_ref(), self.model);
        stats
    }
}

/// One decode step uploads at most `top_k` experts of each block.
fn check_decode_uploads<R: Runtime>(llama: &dyn CausalModel<R>, model: &ModelDir) {
    let experts = model.config.experts.expect("a mixture of experts");
    let prompt = &reference(&model.path).cases[0].input_ids;
    let mut ctx = llama.new_context(CONTEXT).unwrap();
    let logits = llama.forward(&mut ctx, prompt, Logits::Last).unwrap();
    let next = cleave_shaders::argmax_on_host(&logits).unwrap();
    let before = llama.upload_stats();
    llama.forward(&mut ctx, &[next], Logits::Last).unwrap();
    let step = llama.upload_stats().since(&before);
    let inventory = model.inventory(CONTEXT);
    let per_expert = inventory.geometry.unwrap().expert_bytes_over_blocks;
    let routed = (experts.top_k * model.config.layers) as u64;
    assert_eq!(step.expert_hits + step.expert_misses, routed, "{step:?}");
    assert!(
        step.uploaded_bytes <= experts.top_k as u64 * per_expert,
        "one decode step uploaded {} bytes, more than top_k = {} experts of every block ({per_expert} bytes each)",
        step.uploaded_bytes,
        experts.top_k
    );
}

fn open(name: &str) -> ModelDir {
    let mut model = ModelDir::open(&fixture(name)).unwrap();
    model.cache_type = CacheType::F32;
    model
}

/// Plans `model` on `group` in expert split and checks it; returns the
/// plan and what was uploaded.
fn golden(model: &ModelDir, group: &DeviceGroup, ratios: Option<&[f64]>, cache: Option<usize>) -> (Plan, UploadStats) {
    let members = cleave_nn::plan_members(group);
    let plan = cleave_plan::plan(
        &model.inventory(CONTEXT),
        &members,
        ratios,
        &common::expert_options(cache),
    )
    .expect("plan");
    let stats = group.run(Golden {
        model,
        group,
        plan: plan.clone(),
    });
    (plan, stats)
}

/// Experts a device owns and keeps resident per block.
fn experts_of(plan: &Plan) -> Vec<(usize, usize)> {
    plan.devices
        .iter()
        .map(|d| d.experts.as_ref().map_or((0, 0), |s| (s.experts.len(), s.cached)))
        .collect()
}

#[test]
fn expert_split_over_two_and_three_devices() {
    for name in MOE_FIXTURES {
        let model = open(name);
        let count = model.config.experts.unwrap().count;
        for devices in [2, 3] {
            let (plan, stats) = golden(&model, &capped_group(&vec![None; devices]), None, None);
            let owned = experts_of(&plan);
            assert!(owned.iter().all(|&(n, cached)| n > 0 && cached == n), "{name}: {plan}");
            assert_eq!(owned.iter().map(|o| o.0).sum::<usize>(), count);
            assert_eq!((stats.expert_misses, stats.uploaded_bytes), (0, 0), "{name}: {stats:?}");
        }
    }
}

#[test]
fn expert_caches_of_one_and_two_upload_the_routed_experts() {
    for name in MOE_FIXTURES {
        let model = open(name);
        for (devices, cache) in [(1, 1), (2, 1), (2, 2)] {
            let (plan, stats) = golden(&model, &capped_group(&vec![None; devices]), None, Some(cache));
            assert!(
                experts_of(&plan).iter().all(|&(n, cached)| cached == n.min(cache)),
                "{name}: {plan}"
            );
            // Mixtral's 4 experts on 2 devices with 2 cached each are all
            // resident.
            let streams = experts_of(&plan).iter().any(|&(n, cached)| cached < n);
            assert_eq!(stats.expert_misses > 0, streams, "{name}: {stats:?}");
            assert_eq!(stats.uploaded_bytes > 0, streams, "{name}: {stats:?}");
            eprintln!(
                "{name}, cache {cache} on {devices} device(s): hit rate {:.2}",
                stats.expert_hit_rate().unwrap()
            );
        }
    }
}

/// gpt-oss's experts stored in MXFP4 are planned at their blocks' bytes
/// (17 a group of 32 weights: 0.53 a weight) and their biases' f32s, and
/// the devices hold just that (the expert split above checks each
/// device's bytes against its plan, this fixture among them).
#[test]
fn mxfp4_experts_are_planned_at_their_blocks_bytes() {
    let model = open("gpt-oss-mxfp4-tiny");
    let c = &model.config;
    let (h, i) = (c.hidden_size as u64, c.intermediate_size as u64);
    let per_expert = model.inventory(CONTEXT).geometry.unwrap().expert_bytes_over_blocks;
    let blocks = 3 * h * i / 32 * 17;
    let biases = (2 * i + h) * 4;
    assert_eq!(per_expert, c.layers as u64 * (blocks + biases));
    let f32_model = open("gpt-oss-tiny");
    let f32_expert = f32_model.inventory(CONTEXT).geometry.unwrap().expert_bytes_over_blocks;
    assert_eq!(f32_expert, c.layers as u64 * (3 * h * i * 4 + biases));
}

#[test]
fn expert_split_by_ratios_and_under_caps() {
    let model = open("qwen3-moe-tiny");
    let (plan, _) = golden(&model, &capped_group(&[None, None]), Some(&[1.0, 3.0]), None);
    assert_eq!(experts_of(&plan), [(2, 2), (6, 6)], "{plan}");

    // Room on each device for three of its four experts of every block
    // beside what it must hold: each caches three.
    let inventory = model.inventory(CONTEXT);
    let per_expert = inventory.geometry.as_ref().unwrap().expert_bytes_over_blocks;
    let main = &plan.devices[0];
    let main_fixed = main.weight_bytes - 2 * per_expert + main.kv_bytes;
    let room = inventory.compute_bytes + 3 * per_expert + per_expert / 2;
    let (plan, stats) = golden(
        &model,
        &capped_group(&[Some(main_fixed + room), Some(room)]),
        None,
        None,
    );
    assert_eq!(experts_of(&plan), [(4, 3), (4, 3)], "{plan}");
    assert!(stats.expert_misses > 0, "{stats:?}");
}

/// Random LoRA factors on every block's q_proj and on every expert's
/// gate and down projections of `model`.
fn expert_adapter(model: &ModelDir) -> common::RandomAdapter {
    let c = &model.config;
    let (h, q, i) = (c.hidden_size, c.heads * c.head_dim, c.intermediate_size);
    let mut layers = Vec::new();
    for layer in 0..c.layers {
        let block = format!("model.layers.{layer}");
        layers.push((format!("{block}.self_attn.q_proj"), q, h));
        for expert in 0..c.experts.unwrap().count {
            let mlp = c.mlp_tensors(layer, expert);
            layers.push((format!("{block}.{}", mlp.gate.name), i, h));
            layers.push((format!("{block}.{}", mlp.down.name), h, i));
        }
    }
    common::RandomAdapter::new(&layers, 11)
}

/// The prompt's logits with `adapter` applied, `model` placed by `plan`.
struct WithLora<'a> {
    model: &'a ModelDir,
    group: &'a DeviceGroup,
    plan: Plan,
    adapter: &'a cleave_hf::LoraAdapter,
    prompt: &'a [u32],
}

impl RuntimeTask for WithLora<'_> {
    type Output = Vec<f32>;

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Vec<f32> {
        let devices = cleave_nn::Placed::group(clients, self.group);
        let adapters = std::slice::from_ref(self.adapter);
        let llama = self
            .model
            .load_with_lora(devices, self.plan, adapters, cleave_hf::LoraMode::Auto, &mut |_| {})
            .expect("load");
        let mut ctx = llama.new_context(CONTEXT).unwrap();
        llama.forward(&mut ctx, self.prompt, Logits::All).unwrap()
    }
}

/// A LoRA adapter on the experts applies in expert split as on one
/// device: to the experts loaded with the model and to those a cache of
/// one uploads while running. (No PEFT reference exists for a mixture, so
/// the single device's answer is the reference; the adapter moves the
/// logits far more than the tolerance.)
#[test]
fn lora_on_experts_applies_in_expert_split() {
    let model = open("qwen3-moe-tiny");
    let random = expert_adapter(&model);
    let adapter = model.open_adapter(random.dir.path(), 1.0).unwrap();
    let prompt = reference(&model.path).cases.remove(0).input_ids;
    let inventory = model.inventory(CONTEXT);
    let logits = |devices: usize, options: &PlanOptions| {
        let group = capped_group(&vec![None; devices]);
        let members = cleave_nn::plan_members(&group);
        let plan = cleave_plan::plan(&inventory, &members, None, options).expect("plan");
        group.run(WithLora {
            model: &model,
            group: &group,
            plan,
            adapter: &adapter,
            prompt: &prompt,
        })
    };
    let single = logits(1, &PlanOptions::default());
    let base: Vec<f32> = reference(&model.path).cases.remove(0).logits.concat();
    let moved = single.iter().zip(&base).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
    assert!(moved > 1e-2, "the adapter moves the logits by only {moved}");
    for cache in [None, Some(1)] {
        let split = logits(2, &common::expert_options(cache));
        common::max_diff(
            &split,
            &single,
            &format!("expert split, cache {cache:?}, with LoRA"),
            LOGIT_TOLERANCE,
        );
    }
}
