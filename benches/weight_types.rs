//! Bytes on the device per parameter and prefill/decode throughput for
//! each weight type cleave keeps on the device: the demo model as its f32
//! safetensors and as F16, Q8_0 and Q4_0 GGUF files, and the llama-gguf
//! fixture (every width a multiple of 256, so k-quants apply) as F16, Q8_0,
//! Q4_K_M and Q6_K, on one device, all in one run.
//!
//! `cargo bench --bench weight_types` (CLEAVE_BENCH_DEVICE picks the
//! adapter; the GGUF files are read from ../shared).

#[path = "support/device.rs"]
mod device;

#[allow(dead_code)]
#[path = "support/timing.rs"]
mod timing;

use std::path::PathBuf;

use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_models::{ModelConfig, ModelDir};
use cleave_nn::Placed;
use cleave_plan::PlanOptions;
use cleave_shaders::cubecl::prelude::*;

const RUNS: usize = 5;
const PROMPT: usize = 128;
const DECODE_TOKENS: usize = 64;

/// (weight bytes on the device, prefill tok/s, decode tok/s)
struct Bench<'a> {
    model: &'a ModelDir,
    group: &'a DeviceGroup,
}

impl RuntimeTask for Bench<'_> {
    type Output = (u64, f64, f64);

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> (u64, f64, f64) {
        let inventory = self.model.inventory(PROMPT + DECODE_TOKENS);
        let members = cleave_nn::plan_members(self.group);
        let plan = cleave_plan::plan(&inventory, &members, None, &PlanOptions::default()).expect("plan");
        let llama = self
            .model
            .load(Placed::group(clients, self.group), plan, &mut |_| {})
            .expect("load");
        // Before any context: the weights alone.
        let bytes = llama
            .placement()
            .model_bytes_in_use()
            .expect("memory usage")
            .iter()
            .sum();
        let (prefill, decode) = timing::throughput(llama.as_ref(), PROMPT, DECODE_TOKENS, RUNS);
        (bytes, prefill, decode)
    }
}

/// Parameters of a Llama-shaped model, from its config.
fn parameters(c: &ModelConfig, tied: bool) -> u64 {
    let (h, q, kv, i) = c.widths(0);
    let block = h * (2 * q + 2 * kv) + 3 * h * i + 2 * h;
    let embed = c.vocab_size * h;
    (embed * if tied { 1 } else { 2 } + c.layers * block + h) as u64
}

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let shared = root.join("../shared");
    let demo_gguf = shared.join("models/fortune-llama-3m-gguf");
    let fixture = shared.join("fixtures/llama-gguf");
    let models: [(&str, PathBuf); 8] = [
        ("demo, f32 safetensors", root.join("models/fortune-llama-3m")),
        ("demo, F16", demo_gguf.join("fortune-llama-3m-F16.gguf")),
        ("demo, Q8_0", demo_gguf.join("fortune-llama-3m-Q8_0.gguf")),
        ("demo, Q4_0", demo_gguf.join("fortune-llama-3m-Q4_0.gguf")),
        ("llama-gguf, F16", fixture.join("llama-gguf-F16.gguf")),
        ("llama-gguf, Q8_0", fixture.join("llama-gguf-Q8_0.gguf")),
        ("llama-gguf, Q4_K_M", fixture.join("llama-gguf-Q4_K_M.gguf")),
        ("llama-gguf, Q6_K", fixture.join("llama-gguf-Q6_K.gguf")),
    ];
    let device = device::bench_device();
    let group = device::open_alone(&device);
    println!("one device ({device}), prompt {PROMPT} tokens, decode {DECODE_TOKENS} tokens, median of {RUNS}\n");
    println!("| model, weights | bytes on the device | bytes per parameter | prefill tok/s | decode tok/s | vs first row of its model (prefill / decode) |");
    println!("| --- | ---: | ---: | ---: | ---: | --- |");
    let mut baseline: Option<(&str, f64, f64)> = None;
    for (name, path) in &models {
        let model = ModelDir::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let tied = model.config.ties_output_head(&model.checkpoint);
        let (bytes, prefill, decode) = group.run(Bench {
            model: &model,
            group: &group,
        });
        let family = name.split(',').next().unwrap_or(name);
        let (_, p0, d0) = match baseline {
            Some(b) if b.0 == family => b,
            _ => *baseline.insert((family, prefill, decode)),
        };
        println!(
            "| {name} | {:.2} MiB | {:.2} | {prefill:.0} | {decode:.1} | {:.2}x / {:.2}x |",
            bytes as f64 / (1 << 20) as f64,
            bytes as f64 / parameters(&model.config, tied) as f64,
            prefill / p0,
            decode / d0
        );
    }
}
