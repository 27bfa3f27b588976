//! `cleave serve` under a bounded load: 200 completion requests, 16 at a
//! time, to 127.0.0.1, served by one group and then by two groups (logical
//! devices of one adapter), each decoding up to 8 sequences together; and
//! for comparison one group decoding one sequence at a time. Reports
//! requests/s, generated tokens/s and p50/p99 latency.
//!
//! `cargo bench --bench server_load` (CLEAVE_BENCH_DEVICE picks the adapter).

// Only the device's name is needed here.
#[allow(dead_code)]
#[path = "support/device.rs"]
mod device;

#[path = "support/server.rs"]
mod server;

use serde_json::json;
use server::{Load, Server};

const REQUESTS: usize = 200;
const CONCURRENCY: usize = 16;
const MAX_TOKENS: usize = 16;

fn load(server: &Server) -> Load {
    let url = server.url("/v1/completions");
    let prompts = ["The best way to", "Computers are", "A friend is", "Never", "Life is"];
    // Warm-up: compile every kernel once.
    server::load(&url, 1, 1, |_| json!({"prompt": "Hi", "max_tokens": 2}));
    server::load(
        &url,
        REQUESTS,
        CONCURRENCY,
        |i| json!({"prompt": prompts[i % prompts.len()], "max_tokens": MAX_TOKENS, "seed": i, "ignore_eos": true}),
    )
}

fn main() {
    let device = device::bench_device();
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/models/fortune-llama-3m").to_string();
    let setups = [
        ("1 group, --parallel 1", device.clone(), 1),
        ("1 group, --parallel 8", device.clone(), 8),
        ("2 groups, --parallel 8", format!("{device};{device}"), 8),
    ];
    println!("{REQUESTS} requests of {MAX_TOKENS} tokens, {CONCURRENCY} at a time, demo model on {device}\n");
    println!("| setup | requests/s | generated tok/s | p50 latency | p99 latency |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for (name, groups, parallel) in setups {
        let server = Server::start(&[
            "-m".into(),
            model.clone(),
            "--groups".into(),
            groups,
            "--parallel".into(),
            parallel.to_string(),
            "--queue".into(),
            "64".into(),
        ]);
        let r = load(&server);
        let tokens: u64 = r
            .answers
            .iter()
            .map(|a| a["usage"]["completion_tokens"].as_u64().unwrap())
            .sum();
        println!(
            "| {name} | {:.1} | {:.0} | {:.2} s | {:.2} s |",
            REQUESTS as f64 / r.seconds,
            tokens as f64 / r.seconds,
            r.quantile(0.5),
            r.quantile(0.99)
        );
    }
}
