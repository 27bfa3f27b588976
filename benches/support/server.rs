//! `cleave serve` as the server benchmarks start it (the tests' own
//! `Server`), and a bounded load of requests against it.

// Each server benchmark uses part of this.
#![allow(dead_code)]

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

#[path = "../../tests/common/process.rs"]
mod process;
/// Benchmarks measure what a user gets: each device's default precision.
const PROCESS_PRECISION: Option<&str> = None;
pub use process::Server;

/// The demo model in `dir` with room for `positions`: the same weights
/// and tokenizer, `max_position_embeddings` raised (rotary positions need
/// no weights, so the model runs there; its text is not the point).
pub fn widened_demo(dir: &Path, positions: usize) {
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/fortune-llama-3m");
    for file in [
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        std::fs::copy(demo.join(file), dir.join(file)).unwrap();
    }
    let mut config: Value = serde_json::from_slice(&std::fs::read(demo.join("config.json")).unwrap()).unwrap();
    config["max_position_embeddings"] = json!(positions);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
}

/// What a load gave: its wall time, each request's latency (sorted), and
/// the answers.
pub struct Load {
    pub seconds: f64,
    pub latencies: Vec<f64>,
    pub answers: Vec<Value>,
}

impl Load {
    /// The latency at quantile `q` (0.5: the median).
    pub fn quantile(&self, q: f64) -> f64 {
        quantile(&self.latencies, q)
    }
}

/// The value at quantile `q` of `sorted` (nearest rank).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// POSTs `requests` bodies (`body(i)` for the i-th) to `url`, `concurrency`
/// at a time, each answer waited for before the worker sends its next.
pub fn load(url: &str, requests: usize, concurrency: usize, body: impl Fn(usize) -> Value + Sync) -> Load {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(600)))
        .build()
        .into();
    let next = AtomicUsize::new(0);
    let done = Mutex::new((Vec::new(), Vec::new()));
    let start = Instant::now();
    thread::scope(|scope| {
        for _ in 0..concurrency {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= requests {
                    return;
                }
                let sent = Instant::now();
                let answer: Value = agent
                    .post(url)
                    .send_json(body(i))
                    .unwrap()
                    .body_mut()
                    .read_json()
                    .unwrap();
                let mut done = done.lock().unwrap();
                done.0.push(sent.elapsed().as_secs_f64());
                done.1.push(answer);
            });
        }
    });
    let (mut latencies, answers) = done.into_inner().unwrap();
    latencies.sort_by(f64::total_cmp);
    Load {
        seconds: start.elapsed().as_secs_f64(),
        latencies,
        answers,
    }
}
