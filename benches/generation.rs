//! Prefill and decode throughput on the built-in demo model, on one device,
//! split across 2 and 3 logical devices of the same adapter in layer, row
//! and tensor mode, in layer split across 2 and 3 runtime slots (each
//! device a part of its own, the activations crossing through the host
//! as between runtimes), and with half or all of its blocks streamed from
//! the host, all in one run so that the ratios are comparable.
//!
//! `cargo bench --bench generation` (CLEAVE_BENCH_DEVICE picks the adapter,
//! CLEAVE_BENCH_MODEL another model directory). Each figure is the median
//! of several runs after a warm-up.

// Only the device's name is needed here.
#[allow(dead_code)]
#[path = "support/device.rs"]
mod device;

#[path = "support/timing.rs"]
mod timing;

use cleave_device::{open_group, DeviceGroup, MemberSpec, RuntimeTask};
use cleave_hf::LoraMode;
use cleave_models::ModelDir;
use cleave_nn::Placed;
use cleave_plan::{PlanOptions, Residency, SplitMode, Streaming};
use cleave_shaders::cubecl::prelude::*;

const RUNS: usize = 7;
const PROMPT: usize = 128;
const DECODE_TOKENS: usize = 64;
const CONTEXT: usize = PROMPT + DECODE_TOKENS;

/// (prefill tok/s, decode tok/s)
struct Bench<'a> {
    model: &'a ModelDir,
    group: &'a DeviceGroup,
    mode: SplitMode,
    /// Blocks streamed from the host (layer split).
    streamed: usize,
}

impl RuntimeTask for Bench<'_> {
    type Output = (f64, f64);

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> (f64, f64) {
        // The demo model's weights are 192 to 512 wide: let row split slice them all.
        let inventory = self.model.inventory(CONTEXT);
        let options = PlanOptions {
            mode: self.mode,
            row_split_min: 32,
            streaming: Streaming {
                residency: Residency::Auto,
                stream_blocks: (self.streamed > 0).then_some(self.streamed),
                expert_cache: None,
            },
        };
        let plan = cleave_plan::plan(&inventory, &cleave_nn::plan_members(self.group), None, &options).expect("plan");
        let first = Placed::group(clients, &self.group.slots()[0].group);
        let llama = self
            .model
            .load_on_group(first, self.group, plan, (&[], LoraMode::Auto), &mut |_| {})
            .expect("load");
        timing::throughput(llama.as_ref(), PROMPT, DECODE_TOKENS, RUNS)
    }
}

fn main() {
    let dir = timing::bench_model_dir();
    let model = ModelDir::open(&dir).expect("model");
    let device = device::bench_device();
    println!(
        "{} on {device}, prompt {PROMPT} tokens, decode {DECODE_TOKENS} tokens",
        dir.display()
    );
    println!(
        "| mode | devices | runtime slots | streamed blocks | prefill tok/s | decode tok/s | vs one device (prefill / \
         decode) |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    let mut single = None;
    let blocks = model.config.layers;
    for (mode, n, apart, streamed) in [
        (SplitMode::Layer, 1, false, 0),
        (SplitMode::Layer, 2, false, 0),
        (SplitMode::Layer, 3, false, 0),
        (SplitMode::Layer, 2, true, 0),
        (SplitMode::Layer, 3, true, 0),
        (SplitMode::Row, 2, false, 0),
        (SplitMode::Row, 3, false, 0),
        (SplitMode::Tensor, 2, false, 0),
        (SplitMode::Tensor, 3, false, 0),
        (SplitMode::Layer, 1, false, blocks / 2),
        (SplitMode::Layer, 1, false, blocks),
    ] {
        let specs = vec![
            MemberSpec {
                device: device.clone(),
                cap: None,
            };
            n
        ];
        let mut group = open_group(&specs).expect("open devices");
        if apart {
            group = group.apart();
        }
        let (prefill, decode) = group.run(Bench {
            model: &model,
            group: &group,
            mode,
            streamed,
        });
        let (p1, d1) = *single.get_or_insert((prefill, decode));
        println!(
            "| {mode} | {n} | {} | {streamed} | {prefill:.1} | {decode:.1} | {:.2}x / {:.2}x |",
            group.slots().len(),
            prefill / p1,
            decode / d1
        );
    }
}
