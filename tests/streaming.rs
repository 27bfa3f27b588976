//! Streaming: when the devices cannot hold every block, the plan keeps
//! some blocks' weights on the host and the model uploads each just before
//! it runs. The answers stay those of a fully resident run, and a capped
//! device never holds more than its cap.

use crate::common;

use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_models::ModelDir;
use cleave_nn::{Logits, Placed};
use cleave_plan::{Plan, PlanOptions, Residency, Streaming};
use cleave_shaders::cubecl::prelude::*;
use common::{fixture, reference, shared_model, test_device_name};

const CONTEXT: usize = 64;

/// (plan, greedy ids, bytes in use on each device after running)
struct Run<'a> {
    model: &'a ModelDir,
    group: &'a DeviceGroup,
    streaming: Streaming,
    prompt: &'a [u32],
}

impl RuntimeTask for Run<'_> {
    type Output = (Plan, Vec<u32>, Vec<u64>);

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Self::Output {
        let options = PlanOptions {
            streaming: self.streaming,
            ..PlanOptions::default()
        };
        let plan = cleave_plan::plan(
            &self.model.inventory(CONTEXT),
            &cleave_nn::plan_members(self.group),
            None,
            &options,
        )
        .unwrap();
        let llama = self
            .model
            .load(Placed::group(clients, self.group), plan, &mut |_| {})
            .unwrap();
        let mut ctx = llama.new_context(CONTEXT).unwrap();
        let logits = llama.forward(&mut ctx, self.prompt, Logits::Last).unwrap();
        let ids = common::greedy(llama.as_ref(), &mut ctx, logits, 16, &[]);
        let in_use = llama.placement().model_bytes_in_use().unwrap();
        (llama.placement().plan().clone(), ids, in_use)
    }
}

fn run(model: &ModelDir, caps: &[Option<u64>], streaming: Streaming, prompt: &[u32]) -> (Plan, Vec<u32>, Vec<u64>) {
    let group = common::capped_group(caps);
    group.run(Run {
        model,
        group: &group,
        streaming,
        prompt,
    })
}

/// A cap on one device that holds the head, tail, every block's KV cache,
/// compute buffers and a staging area, plus `resident` blocks' weights.
fn cap_for(model: &ModelDir, resident: usize) -> u64 {
    let inv = model.inventory(CONTEXT);
    let block = inv.block_bytes[0];
    let fixed = inv.head_bytes + inv.tail_bytes - inv.tail_shared_with_head
        + inv.cache_bytes_of(0..inv.block_bytes.len())
        + inv.compute_bytes
        + block;
    fixed + resident as u64 * block
}

#[test]
fn caps_that_force_blocks_off_the_device_give_the_same_ids() {
    let dir = shared_model("fortune-llama-3m");
    let model = ModelDir::open(&dir).unwrap();
    let prompt = reference(&dir).cases.remove(0).input_ids;
    let (_, want, _) = run(&model, &[None], Streaming::default(), &prompt);
    let layers = model.config.layers;
    // Streaming one block costs a staging area as large as the block, so
    // the smallest cap that streams streams two; one is asked for below.
    for resident in [layers - 2, layers / 2, 1] {
        let cap = cap_for(&model, resident);
        let (plan, ids, in_use) = run(&model, &[Some(cap)], Streaming::default(), &prompt);
        let streamed = plan.devices[0].streamed.len();
        assert_eq!(streamed, layers - resident, "{plan}");
        assert_eq!(ids, want, "{streamed} streamed blocks");
        assert!(in_use[0] <= cap, "{} bytes in use past the {cap}-byte cap", in_use[0]);
    }
    // With all but one block streamed, the model's weights are more than
    // twice what the cap leaves for weights after the KV cache and compute.
    let inv = model.inventory(CONTEXT);
    let weights = inv.head_bytes + inv.block_bytes.iter().sum::<u64>() + inv.tail_bytes - inv.tail_shared_with_head;
    let for_weights = cap_for(&model, 1) - inv.compute_bytes - inv.cache_bytes_of(0..layers);
    assert!(
        weights >= 2 * for_weights,
        "{weights} bytes of weights vs {for_weights} of room"
    );
    let one = Streaming {
        residency: Residency::Auto,
        stream_blocks: Some(1),
        expert_cache: None,
    };
    let (plan, ids, _) = run(&model, &[None], one, &prompt);
    assert_eq!(plan.devices[0].streamed, layers - 1..layers);
    assert_eq!(ids, want, "one streamed block");
}

#[test]
fn streaming_every_block_from_disk_or_host_gives_the_same_ids() {
    let dir = shared_model("fortune-llama-3m");
    let model = ModelDir::open(&dir).unwrap();
    let prompt = reference(&dir).cases.remove(1).input_ids;
    let (_, want, _) = run(&model, &[None], Streaming::default(), &prompt);
    for residency in [Residency::Disk, Residency::Host] {
        let streaming = Streaming {
            residency,
            stream_blocks: None,
            expert_cache: None,
        };
        let (plan, ids, _) = run(&model, &[None, None], streaming, &prompt);
        let streamed: usize = plan.devices.iter().map(|d| d.streamed.len()).sum();
        assert_eq!(streamed, model.config.layers, "{plan}");
        assert_eq!(ids, want, "{residency:?}");
    }
}

/// Gemma 3's blocks (four norms each, two rotary tables), the mixtures
/// of experts' (a router and every expert) and the Gated DeltaNet layers
/// (whose recurrent state stays while their weights come and go) stream
/// from disk like any other: the same greedy ids as when they are
/// resident.
#[test]
fn streamed_gemma_expert_and_linear_blocks_give_the_same_ids() {
    let unusual = common::decoders::one_per_family()
        .into_iter()
        .filter(|d| d.block != common::decoders::Block::Plain && d.block != common::decoders::Block::Fused);
    for name in unusual.map(|d| d.name) {
        let dir = fixture(name);
        let model = ModelDir::open(&dir).unwrap();
        let prompt = reference(&dir).cases.remove(0).input_ids;
        let (_, want, _) = run(&model, &[None], Streaming::default(), &prompt);
        let disk = Streaming {
            residency: Residency::Disk,
            stream_blocks: None,
            expert_cache: None,
        };
        let (plan, ids, _) = run(&model, &[None, None], disk, &prompt);
        let streamed: usize = plan.devices.iter().map(|d| d.streamed.len()).sum();
        assert_eq!(streamed, model.config.layers, "{name}: {plan}");
        assert_eq!(ids, want, "{name} streamed from disk");
    }
}

#[test]
fn cli_streams_when_asked_and_refuses_when_told_not_to() {
    let device = test_device_name();
    let args = ["run", "-p", "A man is", "--temp", "0", "-n", "12", "--format", "json"];
    let text = |extra: &[&str]| {
        let out = common::cleave().args(args).args(extra).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (
            v["text"].as_str().unwrap().to_string(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (single, _) = text(&[]);
    let (streamed, stderr) = text(&["--stream-layers", "2"]);
    assert_eq!(streamed, single);
    assert!(stderr.contains("2 blocks streamed from the host"), "{stderr}");
    let (host, _) = text(&["--residency", "host", "--backend", &format!("{device}&{device}")]);
    assert_eq!(host, single);

    let out = common::cleave()
        .args([
            "plan",
            "--backend",
            &format!("{device}:16MiB"),
            "--residency",
            "device",
            "-c",
            "512",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("does not fit"), "{stderr}");
    let out = common::cleave()
        .args(["plan", "--backend", &format!("{device}:16MiB")])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("streams blocks"), "{stdout}");
}

#[test]
fn auto_fit_shrinks_the_context_and_says_so_unless_one_is_given() {
    let device = test_device_name();
    let capped = format!("{device}:8MiB");
    let out = common::cleave().args(["plan", "--backend", &capped]).output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("the context is 256 tokens, not the model's 512"),
        "{stderr}"
    );
    assert!(stdout.contains("context 256"), "{stdout}");
    let out = common::cleave()
        .args(["plan", "--backend", &capped, "-c", "512"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("does not fit"), "{stderr}");
}

/// A mixture of experts on a device that cannot hold it: with no mode
/// chosen, cleave caches the routed experts rather than stream whole
/// blocks, says so, and still gives transformers' greedy ids; asked for
/// layer split, it streams blocks where they fit.
#[test]
fn a_mixture_short_of_memory_caches_experts_unless_layer_split_is_asked() {
    let device = test_device_name();
    let dir = fixture("qwen3-moe-tiny");
    let model = ModelDir::open(&dir).unwrap();
    // Room for the main device's share and two experts of every block.
    let inventory = model.inventory(64);
    let members = [cleave_plan::Member {
        name: device.clone(),
        budget: None,
        runtime: None,
    }];
    let options = PlanOptions {
        mode: cleave_plan::SplitMode::Expert,
        streaming: Streaming {
            expert_cache: Some(2),
            ..Streaming::default()
        },
        ..PlanOptions::default()
    };
    let cap = cleave_plan::plan(&inventory, &members, None, &options).unwrap().devices[0].total_bytes();
    let backend = format!("{device}:{cap}B");
    // Transformers' greedy ids through the CLI, with a 64-token context.
    let run = |backend: &str, extra: &[&str]| {
        let flags = [&["--backend", backend, "-c", "64"][..], extra].concat();
        common::greedy_run_matches_reference(&dir, &flags).1
    };
    let cached = run(&backend, &[]);
    assert!(
        cached.contains("caching the routed ones") && cached.contains("cached per block"),
        "{cached}"
    );
    // The least room (in 4 KiB steps) in which layer split streams blocks.
    let layer_streams = |budget: u64| {
        let member = [cleave_plan::Member {
            name: device.clone(),
            budget: Some(budget),
            runtime: None,
        }];
        cleave_plan::plan_layers(&inventory, &member, None, Streaming::default())
            .is_ok_and(|plan| plan.devices.iter().any(|d| !d.streamed.is_empty()))
    };
    let roomier = (cap..cap * 4).step_by(4096).find(|&c| layer_streams(c)).unwrap();
    let roomier = format!("{device}:{roomier}B");
    let streamed = run(&roomier, &["--split-mode", "layer"]);
    assert!(streamed.contains("streamed from the host"), "{streamed}");
}

/// The bytes a whole model's load reports, which the progress bar counts
/// and a streamed block's upload adds to the uploaded-bytes counter.
struct LoadedBytes<'a> {
    model: &'a ModelDir,
    group: &'a DeviceGroup,
}

impl RuntimeTask for LoadedBytes<'_> {
    type Output = u64;

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> u64 {
        let plan = cleave_plan::plan(
            &self.model.inventory(CONTEXT),
            &cleave_nn::plan_members(self.group),
            None,
            &PlanOptions::default(),
        )
        .unwrap();
        let mut loaded = 0;
        self.model
            .load(Placed::group(clients, self.group), plan, &mut |bytes| loaded += bytes)
            .unwrap();
        loaded
    }
}

/// Loading counts each byte of the checkpoint once, whether a tensor is
/// uploaded alone or stacked with others (q, k and v, and Qwen2's biases of
/// them).
#[test]
fn loading_counts_each_checkpoint_byte_once() {
    let stacked = common::decoders::one_per_family()
        .into_iter()
        .filter(|d| d.block == common::decoders::Block::Plain);
    for name in stacked.map(|d| d.name) {
        let model = ModelDir::open(&fixture(name)).unwrap();
        let group = common::capped_group(&[None]);
        let loaded = group.run(LoadedBytes {
            model: &model,
            group: &group,
        });
        assert_eq!(loaded, model.checkpoint.total_bytes(), "{name}");
    }
}
