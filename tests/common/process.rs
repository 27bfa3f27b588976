//! The `cleave` binary as the tests and the server benchmarks run it, and
//! `cleave serve` as they start it: on port 0 of 127.0.0.1, its address
//! read from its log, killed when dropped. The benchmarks include this
//! file too (benches/support/server.rs).

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// The `cleave` binary built for these tests, on the device
/// CLEAVE_TEST_DEVICE names where it is set, at the precision the file
/// including this one pins (`PROCESS_PRECISION`: the tests' `exact`, the
/// benchmarks' none, so each device's default); `--precision` overrides it.
pub fn cleave() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cleave"));
    if let Ok(device) = std::env::var("CLEAVE_TEST_DEVICE") {
        cmd.env("CLEAVE_BACKEND", device);
    }
    if let Some(precision) = super::PROCESS_PRECISION {
        cmd.env("CLEAVE_PRECISION", precision);
    }
    cmd
}

pub struct Server {
    pub child: Child,
    pub base: String,
}

impl Server {
    /// Starts `cleave serve ARGS --port 0` and waits until it listens.
    pub fn start(args: &[impl AsRef<OsStr>]) -> Server {
        Self::start_with_env(args, &[])
    }

    /// Starts it with environment variables `env` set.
    pub fn start_with_env(args: &[impl AsRef<OsStr>], env: &[(&str, &str)]) -> Server {
        let mut child = cleave()
            .arg("serve")
            .args(args)
            .envs(env.iter().copied())
            .args(["--port", "0"])
            .stderr(Stdio::piped())
            .spawn()
            .expect("start cleave serve");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut seen = Vec::new();
        let base = loop {
            let line = match lines.next() {
                Some(Ok(line)) => line,
                _ => panic!("cleave serve exited before listening: {}", seen.join("\n")),
            };
            if let Some(rest) = line.split("on http://").nth(1) {
                break format!("http://{}", rest.split('/').next().unwrap());
            }
            seen.push(line);
        };
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Server { child, base }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
