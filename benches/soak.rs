//! `cleave serve` under ten minutes of mixed, partly hostile traffic:
//! streams read to the end, streams dropped after a few chunks, chat
//! requests, bodies announced past `--max-body`, and bodies that stop
//! arriving. Every 30 s it prints the server's resident memory; at the end
//! it checks that every slot and queue place came back (no leaked slot) and
//! that memory stayed flat.
//!
//! `cargo bench --bench soak` (CLEAVE_SOAK_SECONDS sets the length,
//! default 600; CLEAVE_BENCH_DEVICE picks the adapter).

// Only the device's name is needed here.
#[allow(dead_code)]
#[path = "support/device.rs"]
mod device;

#[path = "support/server.rs"]
mod server;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server::Server;

const WORKERS: usize = 8;

/// What one request of the mix does, and what the server must answer.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// A stream read to `[DONE]`.
    Stream,
    /// A stream dropped after its first chunks.
    Disconnect,
    /// A whole chat answer.
    Chat,
    /// A body announced past --max-body: 413 before it is sent.
    Oversized,
    /// Headers, then part of the body, then silence: 408.
    Trickle,
}

const MIX: [Kind; 10] = [
    Kind::Stream,
    Kind::Stream,
    Kind::Stream,
    Kind::Disconnect,
    Kind::Disconnect,
    Kind::Disconnect,
    Kind::Chat,
    Kind::Chat,
    Kind::Oversized,
    Kind::Trickle,
];

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(300)))
        .build()
        .into()
}

/// Sends one request of `kind`; true when the server answered as it must.
fn send(server: &Server, kind: Kind, i: usize) -> bool {
    let address = server.base.trim_start_matches("http://");
    let prompts = ["The best way to", "Computers are", "A friend is", "Never", "Life is"];
    let prompt = prompts[i % prompts.len()];
    match kind {
        Kind::Stream | Kind::Disconnect => {
            let body = json!({"prompt": prompt, "max_tokens": 32, "stream": true, "seed": i});
            let Ok(response) = agent().post(&server.url("/v1/completions")).send_json(body) else {
                return false;
            };
            if response.status() == 503 {
                return true;
            }
            let mut lines = BufReader::new(response.into_body().into_reader()).lines();
            let keep = if matches!(kind, Kind::Disconnect) {
                3
            } else {
                usize::MAX
            };
            let mut seen = 0;
            for line in lines.by_ref().map_while(Result::ok) {
                if line == "data: [DONE]" {
                    return true;
                }
                seen += usize::from(line.starts_with("data: "));
                if seen >= keep {
                    return true;
                }
            }
            false
        }
        Kind::Chat => {
            let body = json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 16, "seed": i});
            agent()
                .post(&server.url("/v1/chat/completions"))
                .send_json(body)
                .is_ok_and(|r| r.status() == 200 || r.status() == 503)
        }
        Kind::Oversized | Kind::Trickle => {
            let Ok(mut stream) = TcpStream::connect(address) else {
                return false;
            };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
            let (length, expect) = match kind {
                Kind::Oversized => (64 << 20, "HTTP/1.1 413"),
                _ => (200, "HTTP/1.1 408"),
            };
            let head = format!(
                "POST /v1/completions HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n{{\"prompt\": \"a"
            );
            if stream.write_all(head.as_bytes()).is_err() {
                return false;
            }
            let mut answer = [0u8; 12];
            stream.read_exact(&mut answer).is_ok() && answer == expect.as_bytes()
        }
    }
}

/// The server's resident memory, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The sum of a gauge over the groups in /metrics.
fn gauge(server: &Server, name: &str) -> u64 {
    let text = agent()
        .get(&server.url("/metrics"))
        .call()
        .ok()
        .and_then(|mut r| r.body_mut().read_to_string().ok())
        .unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<u64>().ok()))
        .sum()
}

fn main() {
    let seconds: u64 = std::env::var("CLEAVE_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let device = device::bench_device();
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/models/fortune-llama-3m").to_string();
    let args = [
        "-m",
        &model,
        "--backend",
        &device,
        "--parallel",
        "4",
        "--queue",
        "16",
        "--max-body",
        "64KiB",
        "--read-timeout",
        "5",
    ];
    let server = Arc::new(Server::start(&args.map(String::from)));
    let pid = server.child.id();
    println!("{seconds} s of mixed requests, {WORKERS} at a time, demo model on {device}, --parallel 4\n");
    let stop = Arc::new(AtomicBool::new(false));
    let counts: Arc<Vec<(AtomicUsize, AtomicUsize)>> =
        Arc::new(MIX.iter().map(|_| (AtomicUsize::new(0), AtomicUsize::new(0))).collect());
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (server, stop, counts) = (server.clone(), stop.clone(), counts.clone());
            thread::spawn(move || {
                let mut i = w;
                while !stop.load(Ordering::Relaxed) {
                    let slot = i % MIX.len();
                    let ok = send(&server, MIX[slot], i);
                    counts[slot].0.fetch_add(1, Ordering::Relaxed);
                    counts[slot].1.fetch_add(usize::from(ok), Ordering::Relaxed);
                    i += WORKERS;
                }
            })
        })
        .collect();
    println!("| time | server RSS |");
    println!("| ---: | ---: |");
    let start = Instant::now();
    let mut samples = Vec::new();
    while start.elapsed() < Duration::from_secs(seconds) {
        thread::sleep(Duration::from_secs(30).min(Duration::from_secs(seconds).saturating_sub(start.elapsed())));
        let rss = rss_kib(pid);
        samples.push(rss);
        println!(
            "| {:.0} s | {:.1} MiB |",
            start.elapsed().as_secs_f64(),
            rss as f64 / 1024.0
        );
    }
    stop.store(true, Ordering::Relaxed);
    workers.into_iter().for_each(|w| w.join().unwrap());
    // Every slot and queue place must come back once the clients are gone.
    let settle = Instant::now();
    while gauge(&server, "cleave_active_sequences") + gauge(&server, "cleave_queue_depth") > 0
        && settle.elapsed() < Duration::from_secs(30)
    {
        thread::sleep(Duration::from_millis(100));
    }
    let leaked = gauge(&server, "cleave_active_sequences") + gauge(&server, "cleave_queue_depth");
    println!("\n| request | sent | answered as expected |");
    println!("| --- | ---: | ---: |");
    let mut by_kind: Vec<(String, usize, usize)> = Vec::new();
    for (kind, (sent, ok)) in MIX.iter().zip(counts.iter()) {
        let name = format!("{kind:?}");
        let (sent, ok) = (sent.load(Ordering::Relaxed), ok.load(Ordering::Relaxed));
        match by_kind.iter_mut().find(|(n, _, _)| *n == name) {
            Some(row) => (row.1, row.2) = (row.1 + sent, row.2 + ok),
            None => by_kind.push((name, sent, ok)),
        }
    }
    for (name, sent, ok) in &by_kind {
        println!("| {name} | {sent} | {ok} |");
    }
    let first = samples.first().copied().unwrap_or(0) as f64 / 1024.0;
    let last = samples.last().copied().unwrap_or(0) as f64 / 1024.0;
    let peak = samples.iter().copied().max().unwrap_or(0) as f64 / 1024.0;
    println!("\nRSS after 30 s {first:.1} MiB, at the end {last:.1} MiB, peak {peak:.1} MiB; slots and queue places still taken after the clients left: {leaked}");
    let health: Value = agent()
        .get(&server.url("/health"))
        .call()
        .ok()
        .and_then(|mut r| r.body_mut().read_json().ok())
        .unwrap_or(Value::Null);
    println!("/health at the end: {health}");
}
