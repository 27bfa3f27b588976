//! Time to first token of a prompt whose first 2,000 tokens a slot's cache
//! already holds, against the same prompt read whole: the demo model (its
//! context widened to 4,096 positions) on one slot, prompts given as token
//! ids. Each round sends a prompt of a new 2,000-token prefix and a
//! 16-token tail (read whole: nothing shares its prefix), then the same
//! prefix with another tail (the prefix read from the cache). Reports the
//! median of each and their ratio.
//!
//! `cargo bench --bench prefix_reuse` (CLEAVE_BENCH_DEVICE picks the
//! adapter; CLEAVE_BENCH_ROUNDS the rounds, 5).

#[allow(dead_code)]
#[path = "support/device.rs"]
mod device;

#[path = "support/server.rs"]
mod server;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server::{quantile, widened_demo, Server};

const PREFIX: u32 = 2000;
const TAIL: u32 = 16;
const CONTEXT: usize = 4096;
/// The demo model's vocabulary.
const VOCAB: u32 = 2048;

/// One token generated from `prompt`: the seconds it took, and how many
/// prompt tokens came from the cache.
fn first_token(agent: &ureq::Agent, url: &str, prompt: &[u32]) -> (f64, u64) {
    let body = json!({"prompt": prompt, "max_tokens": 1, "temperature": 0});
    let sent = Instant::now();
    let answer: Value = agent.post(url).send_json(body).unwrap().body_mut().read_json().unwrap();
    let seconds = sent.elapsed().as_secs_f64();
    (
        seconds,
        answer["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
    )
}

fn main() {
    let device = device::bench_device();
    let rounds: usize = std::env::var("CLEAVE_BENCH_ROUNDS").map_or(5, |r| r.parse().unwrap());
    let dir = tempfile::tempdir().unwrap();
    widened_demo(dir.path(), CONTEXT);
    let model = dir.path().to_str().unwrap();
    let server = Server::start(&["-m", model, "--backend", &device, "--parallel", "1", "-c", "4096"]);
    let url = server.url("/v1/completions");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(600)))
        .build()
        .into();
    let (mut whole, mut cached) = (Vec::new(), Vec::new());
    // Round 0 warms the kernels and is not counted.
    for round in 0..=rounds as u32 {
        let prefix: Vec<u32> = (0..PREFIX).map(|i| (i * 7 + round * 13 + 1) % VOCAB).collect();
        let tail = |seed: u32| (0..TAIL).map(move |i| (i * 3 + seed) % VOCAB);
        let first: Vec<u32> = prefix.iter().copied().chain(tail(5)).collect();
        let second: Vec<u32> = prefix.iter().copied().chain(tail(11)).collect();
        let (read_whole, none) = first_token(&agent, &url, &first);
        let (from_cache, reused) = first_token(&agent, &url, &second);
        assert_eq!((none, reused), (0, PREFIX as u64), "round {round}: what the cache held");
        if round > 0 {
            whole.push(read_whole);
            cached.push(from_cache);
        }
    }
    whole.sort_by(f64::total_cmp);
    cached.sort_by(f64::total_cmp);
    let (whole, cached) = (quantile(&whole, 0.5), quantile(&cached, 0.5));
    println!(
        "Time to first token, {PREFIX}-token prefix + {TAIL}-token tail, demo model on {device}, median of {rounds}:\n"
    );
    println!("| prompt | time to first token |");
    println!("| --- | ---: |");
    println!("| read whole | {:.0} ms |", whole * 1e3);
    println!("| prefix from the cache | {:.0} ms |", cached * 1e3);
    println!("\n{:.1}x faster from the cache", whole / cached);
}
