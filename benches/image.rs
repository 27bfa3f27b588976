//! Text to image with the tiny FLUX.1 fixture pipeline (32×32, 4 steps):
//! seconds per denoising step and per image with the diffusion transformer
//! on one, two and three logical devices of one adapter, all in one run;
//! and each transformer device's memory, planned vs measured while it
//! denoises.
//!
//! `cargo bench --bench image` (CLEAVE_BENCH_DEVICE picks the adapter,
//! CLEAVE_SHARED the fixtures). Figures are medians of several images
//! after a warm-up.

// Only the device's name is needed here.
#[allow(dead_code)]
#[path = "support/device.rs"]
mod device;

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::time::Instant;

use cleave_device::{open_group, DeviceGroup, MemberSpec};
use cleave_engine::{FluxPipeline, FluxPlacement, ImageProgress, ImageSettings, ModuleResidency};
use cleave_models::{FluxDir, FLUX_MODULES};
use cleave_plan::{format_bytes, plan_layers, Streaming};

const RUNS: usize = 5;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

struct Bench<'a> {
    dir: &'a FluxDir,
    groups: &'a [DeviceGroup],
    settings: &'a ImageSettings,
}

/// (seconds per image, seconds per step, per transformer device: planned
/// bytes, measured bytes in use)
type Figures = (f64, f64, Vec<(u64, u64)>);

impl Bench<'_> {
    fn run(self) -> Figures {
        let (mut images, mut steps, mut memory) = (Vec::new(), Vec::new(), Vec::new());
        for run in 0..=RUNS {
            let plans = self
                .groups
                .iter()
                .zip(FLUX_MODULES)
                .map(|(group, module)| {
                    let s = self.settings;
                    let inventory = self
                        .dir
                        .inventory(module, (s.height, s.width), s.max_sequence_length)
                        .unwrap();
                    plan_layers(&inventory, &cleave_nn::plan_members(group), None, Streaming::default()).unwrap()
                })
                .collect::<Vec<_>>();
            let diffusion_plan = plans[2].clone();
            // The transformer's devices follow those of the text encoders.
            let diffusion_first = self.groups[0].members.len() + self.groups[1].members.len();
            let placement = FluxPlacement::open(self.groups, plans).unwrap();
            let pipeline = FluxPipeline::new(self.dir, placement, ModuleResidency::OnUse).unwrap();
            let start = Instant::now();
            let mut last = None;
            let mut step_times = Vec::new();
            pipeline
                .generate(self.settings, &mut |progress| match progress {
                    ImageProgress::Encoded => {
                        last = Some(Instant::now());
                        ControlFlow::Continue(())
                    }
                    ImageProgress::Step { .. } => {
                        let now = Instant::now();
                        step_times.push((now - last.unwrap_or(now)).as_secs_f64());
                        last = Some(now);
                        if memory.is_empty() {
                            let in_use = pipeline.placement().bytes_in_use();
                            memory = diffusion_plan
                                .devices
                                .iter()
                                .zip(&in_use[diffusion_first..])
                                .map(|(p, (_, used))| (p.total_bytes(), *used))
                                .collect();
                        }
                        ControlFlow::Continue(())
                    }
                })
                .unwrap();
            // Run 0 warms up: it compiles every kernel.
            if run > 0 {
                images.push(start.elapsed().as_secs_f64());
                steps.push(median(step_times));
            }
        }
        (median(images), median(steps), memory)
    }
}

fn main() {
    let shared = std::env::var_os("CLEAVE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared"));
    let dir = FluxDir::open(&shared.join("fixtures/flux-tiny")).expect("the flux-tiny fixture");
    let device = device::bench_device();
    let settings = ImageSettings {
        prompt: "A painting of a squirrel eating a burger".into(),
        height: 32,
        width: 32,
        steps: 4,
        guidance: 3.5,
        max_sequence_length: 32,
        seed: 42,
    };
    println!("flux-tiny, 32x32, 4 steps, on {device}\n");
    println!(
        "| transformer on | s / image | s / step | vs one device (step) | memory per device: planned / measured |"
    );
    println!("| --- | ---: | ---: | ---: | --- |");
    let mut single_step = None;
    for devices in [1, 2, 3] {
        let member = MemberSpec {
            device: device.clone(),
            cap: None,
        };
        let groups: Vec<DeviceGroup> = FLUX_MODULES
            .iter()
            .map(|&m| open_group(&vec![member.clone(); if m == "diffusion" { devices } else { 1 }]).unwrap())
            .collect();
        let (image, step, memory) = Bench {
            dir: &dir,
            groups: &groups,
            settings: &settings,
        }
        .run();
        let base = *single_step.get_or_insert(step);
        let memory: Vec<String> = memory
            .iter()
            .map(|(plan, used)| format!("{} / {}", format_bytes(*plan), format_bytes(*used)))
            .collect();
        println!(
            "| {devices} device(s) | {image:.3} | {step:.3} | {:.2}x | {} |",
            base / step,
            memory.join(", ")
        );
    }
}
