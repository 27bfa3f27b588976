//! A deadline for each input of a fuzz target. The target runs on a worker
//! thread of its own, and an input it has not finished within the deadline
//! fails the test, naming the input, where a hang would stall the whole
//! run. (The stuck worker is left behind: the test binary ends without
//! waiting for it.) Included by path from the fuzz tests of each crate.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

/// A thread that runs one input at a time.
pub struct Worker<I, O> {
    inputs: mpsc::Sender<I>,
    outputs: mpsc::Receiver<O>,
}

impl<I: Send + 'static, O: Send + 'static> Worker<I, O> {
    /// `run` should catch its own panics: one that escapes ends the worker.
    pub fn new(mut run: impl FnMut(I) -> O + Send + 'static) -> Self {
        let (inputs, to_run) = mpsc::channel::<I>();
        let (done, outputs) = mpsc::channel();
        std::thread::spawn(move || {
            for input in to_run {
                if done.send(run(input)).is_err() {
                    return;
                }
            }
        });
        Worker { inputs, outputs }
    }

    /// The output of `input`, or why there is none within `deadline`.
    pub fn run(&self, input: I, deadline: Duration) -> Result<O, String> {
        self.inputs
            .send(input)
            .map_err(|_| "the worker has stopped".to_string())?;
        self.outputs.recv_timeout(deadline).map_err(|e| match e {
            RecvTimeoutError::Timeout => format!("still running after {deadline:?}"),
            RecvTimeoutError::Disconnected => "the worker stopped while running it".into(),
        })
    }
}
