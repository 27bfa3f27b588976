//! Prefill and decode throughput on the built-in demo model.
//!
//! `cargo bench --bench generation` (set CLEAVE_DEVICE to pick a device,
//! CLEAVE_BENCH_MODEL for another model directory). Each figure is the
//! median of several runs, measured in one process.

use std::path::PathBuf;
use std::time::Instant;

use cleave_device::RuntimeTask;
use cleave_model::{Llama, Logits, ModelDir};
use cleave_shaders::cubecl::prelude::*;

const RUNS: usize = 5;
const PROMPTS: [usize; 2] = [32, 128];
const DECODE_TOKENS: usize = 64;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

struct Bench<'a> {
    model: &'a ModelDir,
}

impl RuntimeTask for Bench<'_> {
    type Output = ();

    fn run<R: Runtime>(self, client: ComputeClient<R>) {
        let llama = Llama::load(client, self.model, &mut |_| {}).expect("load");
        let vocab = self.model.config.vocab_size as u32;
        let prompt = |len: usize| {
            (0..len as u32)
                .map(|i| (i * 7 + 3) % vocab)
                .collect::<Vec<_>>()
        };
        // Compile every kernel once before timing.
        let mut warm = llama.new_context(64);
        llama
            .forward(&mut warm, &prompt(8), Logits::Last)
            .expect("warm-up");
        llama
            .forward(&mut warm, &[1], Logits::Last)
            .expect("warm-up");

        for len in PROMPTS {
            let rates = (0..RUNS)
                .map(|_| {
                    let mut ctx = llama.new_context(len);
                    let start = Instant::now();
                    llama
                        .forward(&mut ctx, &prompt(len), Logits::Last)
                        .expect("prefill");
                    len as f64 / start.elapsed().as_secs_f64()
                })
                .collect();
            println!("prefill {len:>4} tokens: {:>8.1} tok/s", median(rates));
        }
        let rates = (0..RUNS)
            .map(|_| {
                let mut ctx = llama.new_context(16 + DECODE_TOKENS);
                let mut logits = llama
                    .forward(&mut ctx, &prompt(16), Logits::Last)
                    .expect("prefill");
                let start = Instant::now();
                for _ in 0..DECODE_TOKENS {
                    let next = cleave_engine::argmax(&logits);
                    logits = llama
                        .forward(&mut ctx, &[next], Logits::Last)
                        .expect("decode");
                }
                DECODE_TOKENS as f64 / start.elapsed().as_secs_f64()
            })
            .collect();
        println!(
            "decode  {DECODE_TOKENS:>4} tokens: {:>8.1} tok/s",
            median(rates)
        );
    }
}

fn main() {
    let dir = std::env::var_os("CLEAVE_BENCH_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/fortune-llama-3m")
        });
    let model = ModelDir::open(&dir).expect("model");
    let device = match std::env::var("CLEAVE_DEVICE") {
        Ok(name) => cleave_device::open(&name),
        Err(_) => cleave_device::open_default(),
    }
    .expect("device");
    println!(
        "{} on {} ({})",
        dir.display(),
        device.info.name,
        device.info.adapter
    );
    device.run(Bench { model: &model });
}
