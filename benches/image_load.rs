//! `cleave serve` on the tiny FLUX.1 fixture pipeline under a bounded load:
//! 16 image requests (64×64, 8 steps, T5 cut at 64 tokens), 4 at a time, to 127.0.0.1, served by
//! one group with the modules kept loaded, by one group loading each module
//! just before use, and by two groups (each on its own logical devices of
//! one adapter). Reports images/s and p50/p99 latency.
//!
//! `cargo bench --bench image_load` (CLEAVE_BENCH_DEVICE picks the adapter,
//! CLEAVE_SHARED the fixtures).

// Only the device's name is needed here.
#[allow(dead_code)]
#[path = "support/device.rs"]
mod device;

#[path = "support/server.rs"]
mod server;

use std::path::PathBuf;

use serde_json::json;
use server::Server;

const REQUESTS: usize = 16;
const CONCURRENCY: usize = 4;
const SIZE: &str = "64x64";
const STEPS: usize = 8;
const T5_TOKENS: usize = 64;

fn main() {
    let device = device::bench_device();
    let shared = std::env::var_os("CLEAVE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared"));
    let pipeline = shared.join("fixtures/flux-tiny").to_str().unwrap().to_string();
    let setups = [
        ("1 group, modules loaded", device.clone(), "loaded"),
        ("1 group, modules on use", device.clone(), "on-use"),
        ("2 groups, modules loaded", format!("{device};{device}"), "loaded"),
    ];
    println!(
        "{REQUESTS} requests for a {SIZE} image of {STEPS} steps (T5 cut at {T5_TOKENS} tokens), {CONCURRENCY} at a \
         time, flux-tiny on {device}\n"
    );
    println!("| setup | images/s | p50 latency | p99 latency |");
    println!("| --- | ---: | ---: | ---: |");
    for (name, groups, modules) in setups {
        let args = [
            "-m",
            &pipeline,
            "--groups",
            &groups,
            "--pipeline-modules",
            modules,
            "--max-image-size",
            SIZE,
            "--queue",
            "64",
        ];
        let server = Server::start(&args.map(String::from));
        let url = server.url("/v1/images/generations");
        let body = |seed: usize| {
            json!({
                "prompt": "a squirrel eating a burger",
                "size": SIZE,
                "seed": seed,
                "num_inference_steps": STEPS,
                "max_sequence_length": T5_TOKENS,
            })
        };
        // Warm-up: compile every kernel on every group once.
        server::load(&url, 2, 2, body);
        let r = server::load(&url, REQUESTS, CONCURRENCY, body);
        println!(
            "| {name} | {:.2} | {:.2} s | {:.2} s |",
            REQUESTS as f64 / r.seconds,
            r.quantile(0.5),
            r.quantile(0.99)
        );
    }
}
