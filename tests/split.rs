//! Layer, row and tensor split across logical devices opened on one
//! adapter: every split gives the single device's answer, and each device
//! holds what the plan says and never more than its cap.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_hf::{LoraAdapter, LoraMode};
use cleave_models::ModelDir;
use cleave_nn::{CacheType, CausalModel, Logits, ModelError, Placed};
use cleave_plan::{Member, Plan, SplitMode};
use cleave_shaders::cubecl::prelude::*;
use common::{capped_group, fixture, load_split, longest_case, reference, shared_model, test_device_name};

const CONTEXT: usize = 128;
const GREEDY_STEPS: usize = 24;
const MIB: u64 = 1 << 20;

/// Logits of every prompt position, then greedy ids through the KV cache.
fn answer<R: Runtime>(llama: &dyn CausalModel<R>, prompt: &[u32]) -> (Vec<f32>, Vec<u32>) {
    let mut ctx = llama.new_context(CONTEXT).unwrap();
    let logits = llama.forward(&mut ctx, prompt, Logits::All).unwrap();
    let vocab = llama.vocab_size();
    let last = logits[logits.len() - vocab..].to_vec();
    let ids = common::greedy(llama, &mut ctx, last, GREEDY_STEPS, &[]);
    (logits, ids)
}

/// Loads `model` on `group` (split evenly, or by `ratios`) and answers.
struct Answer<'a> {
    model: &'a ModelDir,
    group: &'a DeviceGroup,
    ratios: Option<&'a [f64]>,
    mode: SplitMode,
    prompt: &'a [u32],
}

impl RuntimeTask for Answer<'_> {
    type Output = (Plan, Vec<f32>, Vec<u32>, Vec<u64>);

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Self::Output {
        let llama = load_split(clients, self.group, self.model, CONTEXT, self.ratios, self.mode).expect("load");
        let (logits, ids) = answer(llama.as_ref(), self.prompt);
        let ctx = llama.new_context(CONTEXT).unwrap();
        let in_use = llama.placement().model_bytes_in_use().unwrap();
        drop(ctx);
        (llama.placement().plan().clone(), logits, ids, in_use)
    }
}

fn run_on(
    model: &ModelDir,
    group: &DeviceGroup,
    ratios: Option<&[f64]>,
    prompt: &[u32],
) -> (Plan, Vec<f32>, Vec<u32>, Vec<u64>) {
    run_in(SplitMode::Layer, model, group, ratios, prompt)
}

fn run_in(
    mode: SplitMode,
    model: &ModelDir,
    group: &DeviceGroup,
    ratios: Option<&[f64]>,
    prompt: &[u32],
) -> (Plan, Vec<f32>, Vec<u32>, Vec<u64>) {
    group.run(Answer {
        model,
        group,
        ratios,
        mode,
        prompt,
    })
}

/// Every prompt position's logits, then the greedy ids.
type LogitsAndIds = (Vec<f32>, Vec<u32>);

/// The single device's answer to a fixture's longest prompt, computed
/// once for the three split tests.
fn single_device_answer(dir: &Path, model: &ModelDir, prompt: &[u32]) -> LogitsAndIds {
    static ANSWERS: Mutex<BTreeMap<PathBuf, LogitsAndIds>> = Mutex::new(BTreeMap::new());
    if let Some(answer) = ANSWERS.lock().unwrap().get(dir) {
        return answer.clone();
    }
    let (_, logits, ids, _) = run_on(model, &capped_group(&[None]), None, prompt);
    ANSWERS
        .lock()
        .unwrap()
        .entry(dir.to_path_buf())
        .or_insert((logits, ids))
        .clone()
}

/// How far a split's logits may be from the single device's: `f32` with
/// an f32 KV cache, `f16_cache` with an f16 one (a 16-bit checkpoint's
/// default).
struct Bounds {
    f32: f32,
    f16_cache: f32,
}

/// Every fixture on 3 devices in `mode` (and some on 2 as well, see
/// [`fixtures`]) gives the single device's greedy ids and logits within `bounds`, for
/// its longest prompt (the most prefill rows and rope positions).
fn same_answer_on_splits(mode: SplitMode, bounds: Bounds) {
    let mut worst = BTreeMap::<String, f32>::new();
    for (dir, device_counts) in fixtures(mode) {
        let model = ModelDir::open(&dir).unwrap();
        let prompt = longest_case(reference(&dir)).input_ids;
        let (want_logits, want_ids) = single_device_answer(&dir, &model, &prompt);
        for &devices in device_counts {
            let group = capped_group(&vec![None; devices]);
            let (plan, logits, ids, in_use) = run_in(mode, &model, &group, None, &prompt);
            let what = format!("{} in {mode} split on {devices} devices", dir.display());
            // At least two devices really hold a share.
            let holding = plan.devices.iter().filter(|d| d.weight_bytes > 0).count();
            assert!(holding >= 2, "{what}: {plan}");
            assert_eq!(ids, want_ids, "{what}: greedy ids");
            let (cache, tolerance) = match model.cache_type {
                CacheType::F16 => ("f16 cache", bounds.f16_cache),
                CacheType::F32 => ("f32 cache", bounds.f32),
            };
            let diff = common::max_diff(&logits, &want_logits, &format!("{what}: logits"), tolerance);
            let entry = worst.entry(cache.to_string()).or_default();
            *entry = entry.max(diff);
            common::assert_holds_plan(&plan, &in_use, &model, CONTEXT);
        }
    }
    eprintln!("{mode} split: worst logit difference from one device by cache type {worst:?}");
}

/// The fixtures `mode` runs on, with the device counts for each: the tiny
/// ones on 3 devices (shares that do not divide evenly), llama-tiny on 2
/// as well (and every tiny one where every variant is asked for); the
/// demo model, whose six wide blocks cost more than every tiny fixture
/// together, on 3 (its 2-device layer split is in
/// `uneven_ratios_and_caps`). Tensor split leaves out the mixtures
/// of experts, whose experts it does not divide, and the hybrid models,
/// whose Gated DeltaNet layers it refuses
/// (`tensor_split_refuses_linear_attention_layers_by_name`); row and
/// tensor split leave out Gemma 4, whose blocks differ
/// (`row_and_tensor_split_refuse_uneven_blocks_by_name`).
fn fixtures(mode: SplitMode) -> Vec<(PathBuf, &'static [usize])> {
    let cuts = matches!(mode, SplitMode::Row | SplitMode::Tensor);
    let tiny = common::decoders::decoders()
        .into_iter()
        .filter(|d| mode != SplitMode::Tensor || !(d.block.has_experts() || d.block.is_hybrid()))
        .filter(|d| !(cuts && d.block.is_uneven()));
    let counts = |name: &str| match common::every_variant() || name == "llama-tiny" {
        true => &[2, 3][..],
        false => &[3][..],
    };
    let mut dirs: Vec<(PathBuf, &'static [usize])> = tiny.map(|d| (fixture(d.name), counts(d.name))).collect();
    dirs.push((shared_model("fortune-llama-3m"), &[3]));
    dirs
}

/// Layer split moves whole activations between devices, so every
/// operation runs as on one device, whatever the cache type: the logits
/// are the single device's bits on lavapipe; the bound allows only the
/// last bits a device of another kind in the group might give.
#[test]
fn layer_split_gives_the_same_answer_on_every_fixture() {
    same_answer_on_splits(
        SplitMode::Layer,
        Bounds {
            f32: 1e-5,
            f16_cache: 1e-5,
        },
    );
}

/// Row split gives each device some of a weight's rows (outputs) and
/// assembles them: the single device's bits on lavapipe, with either
/// cache. A backend whose matmul picks its kernel or tiles by a slice's
/// width may move the last bits, and in an f16 cache such a difference
/// can round a cached key or value the other way, which the next layers
/// carry to the logits.
#[test]
fn row_split_gives_the_same_answer_on_every_fixture() {
    same_answer_on_splits(
        SplitMode::Row,
        Bounds {
            f32: 1e-4,
            f16_cache: 2e-3,
        },
    );
}

/// Tensor split adds the devices' partial sums of o_proj and down_proj:
/// the worst difference measured on lavapipe is 1.7e-5 with an f32 cache,
/// 6.5e-4 with an f16 one (llama-tiny-bf16), where a last-bit difference
/// rounds cached keys and values the other way.
#[test]
fn tensor_split_gives_the_same_answer_on_every_fixture() {
    same_answer_on_splits(
        SplitMode::Tensor,
        Bounds {
            f32: 1e-4,
            f16_cache: 2e-3,
        },
    );
}

/// Tensor split does not divide a block's experts: the plan says so (and
/// `cleave` falls back to layer split, saying why).
#[test]
fn tensor_split_refuses_experts_by_name() {
    let model = ModelDir::open(&fixture("mixtral-tiny")).unwrap();
    let members = cleave_nn::plan_members(&capped_group(&[None, None]));
    let options = common::test_options(SplitMode::Tensor);
    let err = cleave_plan::plan(&model.inventory(CONTEXT), &members, None, &options).unwrap_err();
    let message = err.to_string();
    assert!(message.contains("tensor") && message.contains("experts"), "{message}");
}

/// Row and tensor split cut every block alike, and Gemma 4's differ (its
/// full layers' heads are of another size, its last layers read earlier
/// layers' KV caches): the plan says so, counting them.
#[test]
fn row_and_tensor_split_refuse_uneven_blocks_by_name() {
    let model = ModelDir::open(&fixture("gemma4-tiny")).unwrap();
    let members = cleave_nn::plan_members(&capped_group(&[None, None]));
    for mode in [SplitMode::Row, SplitMode::Tensor] {
        let options = common::test_options(mode);
        let err = cleave_plan::plan(&model.inventory(CONTEXT), &members, None, &options).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("3 of its blocks have attention heads of another size")
                && message.contains(&mode.to_string()),
            "{mode}: {message}"
        );
    }
}

/// Nor does it cut a Gated DeltaNet layer: the plan says so by name.
#[test]
fn tensor_split_refuses_linear_attention_layers_by_name() {
    let model = ModelDir::open(&fixture("qwen3_5-tiny")).unwrap();
    let members = cleave_nn::plan_members(&capped_group(&[None, None]));
    let options = common::test_options(SplitMode::Tensor);
    let err = cleave_plan::plan(&model.inventory(CONTEXT), &members, None, &options).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("tensor") && message.contains("6 of its blocks are Gated DeltaNet"),
        "{message}"
    );
}

#[test]
fn uneven_ratios_and_caps() {
    let dir = shared_model("fortune-llama-3m");
    let model = ModelDir::open(&dir).unwrap();
    let prompt = reference(&dir).cases.remove(0).input_ids;
    let (_, _, want_ids, _) = run_on(&model, &capped_group(&[None]), None, &prompt);

    // --tensor-split 2,1: four blocks, then two.
    let (plan, _, ids, _) = run_on(&model, &capped_group(&[None, None]), Some(&[2.0, 1.0]), &prompt);
    assert_eq!(
        (plan.devices[0].blocks.clone(), plan.devices[1].blocks.clone()),
        (0..4, 4..6)
    );
    assert_eq!(ids, want_ids);

    // Caps of 30, 12 and 12 MiB: the first device takes the most blocks.
    let (plan, _, ids, in_use) = run_on(
        &model,
        &capped_group(&[Some(30 * MIB), Some(12 * MIB), Some(12 * MIB)]),
        None,
        &prompt,
    );
    let counts: Vec<usize> = plan.devices.iter().map(|d| d.blocks.len()).collect();
    assert!(counts[0] > counts[1] && counts[0] > counts[2], "{plan}");
    assert_eq!(ids, want_ids);
    for (device, used) in plan.devices.iter().zip(&in_use) {
        assert!(
            *used <= device.budget_bytes.unwrap(),
            "{}: {used} bytes over its cap",
            device.name
        );
    }
}

/// Loads with a plan that ignores the caps, so that only the cap stops it.
struct LoadPastCap<'a> {
    model: &'a ModelDir,
    group: &'a DeviceGroup,
}

impl RuntimeTask for LoadPastCap<'_> {
    type Output = Result<(), ModelError>;

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Self::Output {
        let uncapped: Vec<Member> = self
            .group
            .members
            .iter()
            .map(|d| Member {
                name: d.info.name.clone(),
                budget: None,
                runtime: None,
            })
            .collect();
        let plan = cleave_plan::plan(&self.model.inventory(CONTEXT), &uncapped, None, &Default::default())?;
        self.model
            .load(Placed::group(clients, self.group), plan, &mut |_| {})
            .map(|_| ())
    }
}

#[test]
fn a_cap_is_enforced_like_out_of_memory() {
    let model = ModelDir::open(&shared_model("fortune-llama-3m")).unwrap();
    let group = capped_group(&[Some(2 * MIB), None]);
    let err = group
        .run(LoadPastCap {
            model: &model,
            group: &group,
        })
        .expect_err("loading past a 2 MiB cap must fail");
    let message = err.to_string();
    assert!(matches!(err, ModelError::OutOfMemory { .. }), "{message}");
    assert!(
        message.contains("out of memory on") && message.contains("2.0 MiB cap"),
        "{message}"
    );
}

#[test]
fn cli_split_prints_the_same_text_and_plan() {
    let device = test_device_name();
    let three = format!("llm={device}&{device}&{device}");
    let args = [
        "run",
        "-p",
        "The best way to",
        "--temp",
        "0",
        "-n",
        "20",
        "--format",
        "json",
    ];
    let single = common::cleave().args(args).output().unwrap();
    let split = common::cleave()
        .args(args)
        .args(["--backend", &three])
        .output()
        .unwrap();
    assert!(split.status.success(), "{}", String::from_utf8_lossy(&split.stderr));
    let text = |out: &std::process::Output| {
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["text"].as_str().unwrap().to_string()
    };
    assert_eq!(text(&single), text(&split));
    let stderr = String::from_utf8_lossy(&split.stderr);
    assert!(
        stderr.contains("blocks 0..2 +head") && stderr.contains("blocks 4..6 +tail"),
        "{stderr}"
    );

    let plan = common::cleave()
        .args(["plan", "--backend", &three, "--format", "json"])
        .output()
        .unwrap();
    let plan: serde_json::Value = serde_json::from_slice(&plan.stdout).unwrap();
    let blocks: Vec<serde_json::Value> = plan["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["blocks"].clone())
        .collect();
    assert_eq!(
        blocks,
        [
            serde_json::json!([0, 2]),
            serde_json::json!([2, 4]),
            serde_json::json!([4, 6])
        ]
    );
}

#[test]
fn cli_cap_too_small_does_not_fit() {
    let device = test_device_name();
    let out = common::cleave()
        .args(["plan", "--backend", &format!("{device}:1MiB&{device}:1MiB")])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("does not fit") && stderr.contains("1.0 MiB"),
        "{stderr}"
    );
}

/// A plan that does not fit for the room `--fit-target` leaves says so,
/// naming the device and the flag.
#[test]
fn cli_fit_target_past_the_memory_does_not_fit_and_says_why() {
    let device = test_device_name();
    let out = common::cleave()
        .args([
            "plan",
            "--backend",
            &device,
            "--residency",
            "device",
            "--fit-target",
            "1000000000",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for needle in [
        "does not fit",
        &format!("left free on {device}: 953.7 TiB (--fit-target)"),
        "a smaller --fit-target",
    ] {
        assert!(stderr.contains(needle), "{stderr}: lacks {needle}");
    }
}

#[test]
fn cli_bad_specs_name_the_problem() {
    for (spec, expected) in [
        ("llm=vulkan0&&vulkan0", "is not a device"),
        ("llm=nosuch3", "no device named 'nosuch3'"),
        ("te=vulkan0", "does not have (it has: llm)"),
        ("llm=vulkan0:lots", "is not a size"),
    ] {
        let out = common::cleave().args(["plan", "--backend", spec]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(expected), "{spec}: {stderr}");
    }
}

#[test]
fn cli_row_and_tensor_split_print_the_same_text_and_their_slices() {
    let device = test_device_name();
    let two = format!("{device}&{device}");
    let args = [
        "run",
        "-p",
        "Computers are",
        "--temp",
        "0",
        "-n",
        "16",
        "--format",
        "json",
    ];
    let text = |extra: &[&str]| {
        let out = common::cleave().args(args).args(extra).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["text"].as_str().unwrap().to_string()
    };
    let single = text(&[]);
    for mode in ["row", "tensor"] {
        assert_eq!(
            text(&["--backend", &two, "--split-mode", mode, "--row-split-min", "16"]),
            single,
            "{mode}"
        );
    }
    let plan = common::cleave()
        .args(["plan", "--backend", &two, "--split-mode", "tensor", "--format", "json"])
        .output()
        .unwrap();
    let plan: serde_json::Value = serde_json::from_slice(&plan.stdout).unwrap();
    assert_eq!(plan["mode"], "tensor");
    // fortune-llama-3m: 6 heads in 2 KV groups, one group per device.
    assert_eq!(plan["devices"][0]["heads"]["heads"], serde_json::json!([0, 3]));
    assert_eq!(plan["devices"][1]["heads"]["kv_heads"], serde_json::json!([1, 2]));
}

#[test]
fn cli_main_gpu_must_be_in_the_group() {
    let device = test_device_name();
    let out = common::cleave()
        .args([
            "plan",
            "--backend",
            &format!("{device}&{device}"),
            "--split-mode",
            "row",
            "--main-gpu",
            "2",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("--main-gpu 2"), "{stderr}");
}

/// Loads a model (with `adapters` merged into its weights) and makes a
/// context on one device: what the bytes its buffers hold, the bytes of
/// their padding to the device's alignment, and the bytes its memory pool
/// reserved for them grew by.
struct PoolGrowth<'a> {
    model: &'a ModelDir,
    adapters: &'a [LoraAdapter],
    group: &'a DeviceGroup,
}

impl RuntimeTask for PoolGrowth<'_> {
    type Output = (Plan, [u64; 3]);

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Self::Output {
        let client = clients[0].clone();
        let usage = || {
            let u = client.memory_usage().unwrap();
            [u.bytes_in_use, u.bytes_padding, u.bytes_reserved]
        };
        let before = usage();
        let inventory = self.model.inventory(CONTEXT);
        let members = cleave_nn::plan_members(self.group);
        let plan = cleave_plan::plan(&inventory, &members, None, &common::test_options(SplitMode::Layer)).unwrap();
        let devices = Placed::group(clients, self.group);
        let llama = self
            .model
            .load_with_lora(devices, plan, self.adapters, LoraMode::Direct, &mut |_| {})
            .expect("load");
        let ctx = llama.new_context(CONTEXT).unwrap();
        let after = usage();
        drop(ctx);
        (
            llama.placement().plan().clone(),
            std::array::from_fn(|i| after[i] - before[i]),
        )
    }
}

/// A model's weights, KV cache and rotary tables take buffers of their
/// own size, so that the device holds what the plan counts: were they
/// sliced out of cubecl's pooled pages, the pages' unused rest would be
/// held too (up to a quarter of a CUDA device's memory a page). What a
/// load makes and drops (an adapter's update, merged into the weights) is
/// let go.
#[test]
fn weights_and_caches_reserve_what_they_use() {
    let tiny = fixture("llama-tiny");
    let adapter = [LoraAdapter::open(&fixture("llama-tiny-lora"), 1.0).unwrap()];
    for (dir, adapters) in [(shared_model("fortune-llama-3m"), &[][..]), (tiny, &adapter[..])] {
        let model = ModelDir::open(&dir).unwrap();
        let group = capped_group(&[None]);
        let (plan, [in_use, padding, reserved]) = group.run(PoolGrowth {
            model: &model,
            adapters,
            group: &group,
        });
        let what = format!("{} with {} adapters", dir.display(), adapters.len());
        assert_eq!(
            reserved,
            in_use + padding,
            "{what}: bytes reserved against bytes in use and their padding"
        );
        common::assert_holds_plan(&plan, &[in_use], &model, CONTEXT);
    }
}
