//! Running streams while a long prompt arrives: 8 streams of the demo
//! model (its context widened to 4,096 positions) each decode 160 tokens;
//! once they run, a prompt of about 2,000 tokens arrives. With
//! `--prefill-chunk 0` the prompt is read in one pass and every stream
//! waits for it; with 512 (the default) it is read a chunk per step
//! between their tokens (128: smaller chunks, shorter pauses). Reports the
//! streams' inter-token latency (p50, p99, the longest gap, and how many
//! gaps passed a second) and the long prompt's time to its first token.
//!
//! `cargo bench --bench long_prompt` (CLEAVE_BENCH_DEVICE picks the adapter).

// Only the device's name is needed here.
#[allow(dead_code)]
#[path = "support/device.rs"]
mod device;

#[path = "support/server.rs"]
mod server;

use std::io::{BufRead, BufReader};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server::{widened_demo, Server};

const STREAMS: usize = 8;
const STREAM_TOKENS: usize = 160;
const CONTEXT: usize = 4096;

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(600)))
        .build()
        .into()
}

/// Streams `STREAM_TOKENS` tokens and returns when each event arrived.
fn stream(url: &str, seed: usize) -> Vec<Instant> {
    let body = json!({"prompt": "The best way to", "max_tokens": STREAM_TOKENS, "seed": seed, "ignore_eos": true, "stream": true});
    let response = agent().post(url).send_json(body).unwrap();
    let mut arrivals = Vec::new();
    for line in BufReader::new(response.into_body().into_reader()).lines() {
        let line = line.unwrap();
        if line == "data: [DONE]" {
            break;
        }
        if line.starts_with("data: ") {
            arrivals.push(Instant::now());
        }
    }
    arrivals
}

struct Run {
    gaps: Vec<f64>,
    first_token: f64,
    prompt_tokens: u64,
}

fn run(server: &Server, long_prompt: &str) -> Run {
    let url = server.url("/v1/completions");
    let long = json!({"prompt": long_prompt, "max_tokens": 1});
    // Warm-up: every kernel of prefill and decode compiled once.
    agent().post(&url).send_json(&long).unwrap();
    stream(&url, 0);
    let streams: Vec<_> = (0..STREAMS)
        .map(|i| {
            let url = url.clone();
            thread::spawn(move || stream(&url, i))
        })
        .collect();
    // Let every stream get going before the long prompt arrives.
    thread::sleep(Duration::from_secs(2));
    let sent = Instant::now();
    let reply: Value = agent()
        .post(&url)
        .send_json(&long)
        .unwrap()
        .body_mut()
        .read_json()
        .unwrap();
    let first_token = sent.elapsed().as_secs_f64();
    let mut gaps: Vec<f64> = streams
        .into_iter()
        .flat_map(|s| {
            let arrivals = s.join().unwrap();
            arrivals
                .windows(2)
                .map(|w| (w[1] - w[0]).as_secs_f64())
                .collect::<Vec<_>>()
        })
        .collect();
    gaps.sort_by(f64::total_cmp);
    Run {
        gaps,
        first_token,
        prompt_tokens: reply["usage"]["prompt_tokens"].as_u64().unwrap(),
    }
}

fn main() {
    let device = device::bench_device();
    let dir = tempfile::tempdir().unwrap();
    widened_demo(dir.path(), CONTEXT);
    let model = dir.path().to_str().unwrap().to_string();
    let long_prompt = "Never say never. ".repeat(400);
    println!("{STREAMS} streams of {STREAM_TOKENS} tokens, one long prompt arriving, demo model on {device}\n");
    println!("| --prefill-chunk | long prompt | its first token | stream gap p50 | p99 | longest | gaps > 1 s |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for chunk in ["0", "512", "128"] {
        let args = [
            "-m",
            &model,
            "--backend",
            &device,
            "--parallel",
            "9",
            "-c",
            "4096",
            "--prefill-chunk",
            chunk,
        ];
        let server = Server::start(&args.map(String::from));
        let r = run(&server, &long_prompt);
        let quantile = |q: f64| server::quantile(&r.gaps, q);
        println!(
            "| {chunk} | {} tokens | {:.2} s | {:.0} ms | {:.0} ms | {:.0} ms | {} of {} |",
            r.prompt_tokens,
            r.first_token,
            quantile(0.5) * 1e3,
            quantile(0.99) * 1e3,
            r.gaps.last().unwrap() * 1e3,
            r.gaps.iter().filter(|&&g| g > 1.0).count(),
            r.gaps.len()
        );
    }
}
