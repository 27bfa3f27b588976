//! Embedding replicas: each group of devices holds one sentence encoder
//! on a thread of its own and embeds one request's inputs at a time,
//! packed into as few passes as they fit (each input attends only to
//! itself, so its embedding is the one it gets alone).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;

use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_models::{EncoderDir, SentenceEncoder};
use cleave_nn::Placed;
use cleave_plan::Plan;
use cleave_shaders::cubecl::prelude::*;
use tokio::sync::oneshot;

use crate::dispatch::{spawn_replica, Dispatcher, JobFailure, ReplicaHandle, ReplicaStats, IDLE_POLL};

/// What one request asks of the encoder: an embedding of each input's
/// token ids.
pub struct EmbeddingJob {
    pub inputs: Vec<Vec<u32>>,
    /// The embeddings, in the inputs' order, or why there are none. A
    /// dropped receiver (the client went away) skips the job.
    pub reply: oneshot::Sender<Result<Vec<Vec<f32>>, JobFailure>>,
}

/// What an embedding replica counts beside its queue, for `/metrics`.
#[derive(Default)]
pub struct EmbeddingStats {
    pub inputs: AtomicU64,
    pub tokens: AtomicU64,
}

pub type EmbeddingDispatcher = Dispatcher<EmbeddingJob, EmbeddingStats>;
type Stats = ReplicaStats<EmbeddingStats>;

/// How one embedding replica is built.
pub struct EmbeddingReplicaConfig {
    pub name: String,
    pub group: DeviceGroup,
    pub plan: Plan,
    pub queue_limit: usize,
}

/// Starts an embedding replica on a thread of its own: loads the encoder
/// onto its group, then embeds until the dispatcher is dropped or
/// `cancel` is set. Returns once the encoder is loaded (or failed to).
pub fn start_embedding_replica(
    dir: Arc<EncoderDir>,
    config: EmbeddingReplicaConfig,
    cancel: Arc<AtomicBool>,
) -> Result<ReplicaHandle<EmbeddingJob, EmbeddingStats>, String> {
    let name = config.name.clone();
    spawn_replica(&name, 1, config.queue_limit, move |receiver, stats, ready| {
        let group = config.group.clone();
        group.run(EmbeddingReplica {
            dir,
            config,
            receiver,
            stats,
            cancel,
            ready,
        })
    })
}

struct EmbeddingReplica {
    dir: Arc<EncoderDir>,
    config: EmbeddingReplicaConfig,
    receiver: mpsc::Receiver<EmbeddingJob>,
    stats: Arc<Stats>,
    cancel: Arc<AtomicBool>,
    ready: mpsc::Sender<Result<(), String>>,
}

impl RuntimeTask for EmbeddingReplica {
    type Output = ();

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) {
        let c = &self.config;
        let mut devices = Placed::group(clients, &c.group);
        let loaded = Placed::arm_faults(&mut devices, &c.name)
            .and_then(|()| self.dir.load(devices, c.plan.clone(), &mut |_| {}));
        let encoder = match loaded {
            Ok(encoder) => encoder,
            Err(e) => {
                let _ = self.ready.send(Err(format!("{}: {e}", c.name)));
                return;
            }
        };
        let _ = self.ready.send(Ok(()));
        self.serve(&encoder);
    }
}

impl EmbeddingReplica {
    fn serve(&self, encoder: &SentenceEncoder) {
        loop {
            let job = match self.receiver.recv_timeout(IDLE_POLL) {
                Ok(job) => job,
                Err(RecvTimeoutError::Timeout) if self.cancel.load(Ordering::Relaxed) => return,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            self.stats.active.store(1, Ordering::Relaxed);
            self.stats.queued.fetch_sub(1, Ordering::Relaxed);
            if job.reply.is_closed() {
                self.stats.active.store(0, Ordering::Relaxed);
                continue;
            }
            let embedded = encoder.embed(&job.inputs);
            self.stats.active.store(0, Ordering::Relaxed);
            match embedded {
                Ok(embeddings) => {
                    let work = &self.stats.work;
                    work.inputs.fetch_add(job.inputs.len() as u64, Ordering::Relaxed);
                    let tokens: usize = job.inputs.iter().map(Vec::len).sum();
                    work.tokens.fetch_add(tokens as u64, Ordering::Relaxed);
                    let _ = job.reply.send(Ok(embeddings));
                }
                Err(e) if e.is_device_failure() => return self.fail(job, &e),
                Err(e) => {
                    let _ = job.reply.send(Err(JobFailure::Request(e.to_string())));
                }
            }
        }
    }

    /// A device of the group failed: the job and every waiting one get the
    /// error, and the replica takes no more.
    fn fail(&self, job: EmbeddingJob, failure: &cleave_nn::ModelError) {
        let message = self
            .stats
            .fail(&self.config.name, failure, &self.receiver, |job, message| {
                let _ = job.reply.send(Err(JobFailure::Server(message.into())));
            });
        let _ = job.reply.send(Err(JobFailure::Server(message)));
    }
}
