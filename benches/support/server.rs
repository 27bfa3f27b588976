//! `cleave serve` as the server benchmarks start it: on port 0, its
//! address read from its log, killed when dropped.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::thread;

pub struct Server {
    pub child: Child,
    pub base: String,
}

impl Server {
    /// Starts `cleave serve ARGS --port 0` and waits until it listens.
    pub fn start(args: &[String]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cleave"))
            .arg("serve")
            .args(args)
            .args(["--port", "0"])
            .stderr(Stdio::piped())
            .spawn()
            .expect("start cleave serve");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let base = loop {
            let line = lines.next().expect("cleave serve exited").unwrap();
            if let Some(rest) = line.split("on http://").nth(1) {
                break format!("http://{}", rest.split('/').next().unwrap());
            }
        };
        thread::spawn(move || lines.for_each(drop));
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
