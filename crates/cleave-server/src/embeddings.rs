//! Embedding replicas: each group of devices holds one sentence encoder
//! on a thread of its own and embeds one request's inputs at a time,
//! packed into as few passes as they fit (each input attends only to
//! itself, so its embedding is the one it gets alone).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_models::{EncoderDir, SentenceEncoder};
use cleave_nn::Placed;
use cleave_plan::Plan;
use cleave_shaders::cubecl::prelude::*;

use crate::dispatch::{answer_one_at_a_time, spawn_replica, Dispatcher, ReplicaHandle, ReplicaStats, WholeJob};

/// A request's inputs (each one's token ids) and where their embeddings
/// go, in the inputs' order; a dropped receiver (the client went away)
/// skips the job.
pub type EmbeddingJob = WholeJob<Vec<Vec<u32>>, Vec<Vec<f32>>>;

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
        let queue = (&self.receiver, self.stats.as_ref(), self.cancel.as_ref());
        answer_one_at_a_time(&self.config.name, queue, |job| {
            let embeddings = encoder.embed(&job.request)?;
            let work = &self.stats.work;
            work.inputs.fetch_add(job.request.len() as u64, Ordering::Relaxed);
            let tokens: usize = job.request.iter().map(Vec::len).sum();
            work.tokens.fetch_add(tokens as u64, Ordering::Relaxed);
            Ok(embeddings)
        });
    }
}
