//! `cleave serve` under a bounded load: 200 completion requests, 16 at a
//! time, to 127.0.0.1, served by one group and then by two groups (logical
//! devices of one adapter), each decoding up to 8 sequences together; and
//! for comparison one group decoding one sequence at a time. Reports
//! requests/s, generated tokens/s and p50/p99 latency.
//!
//! `cargo bench --bench server_load` (CLEAVE_BENCH_DEVICE picks the adapter).

#[path = "support/server.rs"]
mod server;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server::Server;

const REQUESTS: usize = 200;
const CONCURRENCY: usize = 16;
const MAX_TOKENS: usize = 16;

struct Result {
    seconds: f64,
    tokens: usize,
    latencies: Vec<f64>,
}

fn load(server: &Server) -> Result {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(300)))
        .build()
        .into();
    let url = server.url("/v1/completions");
    let prompts = ["The best way to", "Computers are", "A friend is", "Never", "Life is"];
    // Warm-up: compile every kernel once.
    let _ = agent
        .post(&url)
        .send_json(json!({"prompt": "Hi", "max_tokens": 2}))
        .unwrap();
    let next = Arc::new(AtomicUsize::new(0));
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let tokens = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let workers: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (agent, url, next, latencies, tokens) =
                (agent.clone(), url.clone(), next.clone(), latencies.clone(), tokens.clone());
            thread::spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= REQUESTS {
                    return;
                }
                let body = json!({"prompt": prompts[i % prompts.len()], "max_tokens": MAX_TOKENS, "seed": i, "ignore_eos": true});
                let sent = Instant::now();
                let reply: Value = agent.post(&url).send_json(body).unwrap().body_mut().read_json().unwrap();
                latencies.lock().unwrap().push(sent.elapsed().as_secs_f64());
                let generated = reply["usage"]["completion_tokens"].as_u64().unwrap() as usize;
                tokens.fetch_add(generated, Ordering::Relaxed);
            })
        })
        .collect();
    workers.into_iter().for_each(|w| w.join().unwrap());
    let mut latencies = latencies.lock().unwrap().clone();
    latencies.sort_by(f64::total_cmp);
    Result {
        seconds: start.elapsed().as_secs_f64(),
        tokens: tokens.load(Ordering::Relaxed),
        latencies,
    }
}

fn main() {
    let device = std::env::var("CLEAVE_BENCH_DEVICE").unwrap_or_else(|_| "vulkan0".into());
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
        let quantile = |q: f64| r.latencies[((r.latencies.len() - 1) as f64 * q).round() as usize];
        println!(
            "| {name} | {:.1} | {:.0} | {:.2} s | {:.2} s |",
            REQUESTS as f64 / r.seconds,
            r.tokens as f64 / r.seconds,
            quantile(0.5),
            quantile(0.99)
        );
    }
}
