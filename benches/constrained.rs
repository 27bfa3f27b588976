//! Decode speed of a request held to a JSON schema against the same request
//! free: `cleave serve` on the demo model, one slot, 128 tokens after a
//! short prompt (EOS ignored), greedy and sampled. The schema (an array of
//! at least 500 short strings) cannot end within 128 tokens, so both
//! requests decode all of them. Rounds alternate free and constrained;
//! reports each one's median tokens per second and their ratio.
//!
//! `cargo bench --bench constrained` (CLEAVE_BENCH_DEVICE picks the
//! adapter; CLEAVE_BENCH_ROUNDS the rounds, 5).

#[allow(dead_code)]
#[path = "support/device.rs"]
mod device;

#[path = "support/server.rs"]
mod server;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server::{quantile, Server};

const TOKENS: u64 = 128;

/// Tokens per second of one request, its prompt's pass included (5 tokens
/// against 128 decoded).
fn tokens_per_second(agent: &ureq::Agent, url: &str, body: &Value) -> f64 {
    let sent = Instant::now();
    let answer: Value = agent.post(url).send_json(body).unwrap().body_mut().read_json().unwrap();
    let seconds = sent.elapsed().as_secs_f64();
    let tokens = answer["usage"]["completion_tokens"].as_u64().unwrap();
    assert_eq!(tokens, TOKENS, "{answer}");
    tokens as f64 / seconds
}

fn main() {
    let device = device::bench_device();
    let rounds: usize = std::env::var("CLEAVE_BENCH_ROUNDS").map_or(5, |r| r.parse().unwrap());
    let server = Server::start(&["--backend", &device, "--parallel", "1"]);
    let url = server.url("/v1/completions");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(600)))
        .build()
        .into();
    let schema = json!({"type": "array", "items": {"type": "string", "maxLength": 6}, "minItems": 500});
    let format = json!({"type": "json_schema", "json_schema": {"name": "words", "schema": schema}});
    println!("Decode of {TOKENS} tokens, demo model on {device}, one slot, median of {rounds}:\n");
    println!("| pick | free | JSON schema | ratio |");
    println!("| --- | ---: | ---: | ---: |");
    for (pick, temperature) in [("greedy", 0.0), ("sampled", 0.8)] {
        let body = |constrained: bool| {
            let mut body = json!({"prompt": "Your fortune:", "max_tokens": TOKENS, "ignore_eos": true,
                "temperature": temperature, "seed": 1});
            if constrained {
                body["response_format"] = format.clone();
            }
            body
        };
        let (mut free, mut held) = (Vec::new(), Vec::new());
        // Round 0 warms the kernels and the constrainer and is not counted.
        for round in 0..=rounds {
            let f = tokens_per_second(&agent, &url, &body(false));
            let h = tokens_per_second(&agent, &url, &body(true));
            if round > 0 {
                free.push(f);
                held.push(h);
            }
        }
        free.sort_by(f64::total_cmp);
        held.sort_by(f64::total_cmp);
        let (free, held) = (quantile(&free, 0.5), quantile(&held, 0.5));
        println!("| {pick} | {free:.1} tok/s | {held:.1} tok/s | {:.2}x |", held / free);
    }
}
