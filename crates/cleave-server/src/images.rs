//! Image replicas: each group of devices holds one FLUX pipeline on a
//! thread of its own and draws one image at a time; the `n` images of a
//! request run one after another on the same replica. A job whose client
//! went away stops at the next denoising step and frees the replica.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;

use cleave_device::DeviceGroup;
use cleave_diffusion::image::RgbImage;
use cleave_engine::{FluxPipeline, FluxPlacement, ImageProgress, ImageSettings, ModuleResidency};
use cleave_models::FluxDir;
use cleave_nn::ModelError;
use cleave_plan::Plan;
use tokio::sync::oneshot;

use crate::dispatch::{spawn_replica, Dispatcher, JobFailure, ReplicaHandle, ReplicaStats, IDLE_POLL};

/// What one request asks of the pipeline: `n` images, the i-th drawn with
/// `settings.seed + i` (so each is the image `cleave image` draws with that
/// seed).
pub struct ImageJob {
    pub settings: ImageSettings,
    pub n: usize,
    /// The PNGs, or why there are none. A dropped receiver (the client
    /// went away) cancels the job at its next step.
    pub reply: oneshot::Sender<Result<Vec<Vec<u8>>, JobFailure>>,
}

/// What an image replica counts beside its queue, for `/metrics`.
#[derive(Default)]
pub struct ImageStats {
    pub images: AtomicU64,
    /// The denoising step the image in progress is at (steps done), and
    /// its steps in all: 0 of 0 when idle.
    pub step: AtomicUsize,
    pub steps: AtomicUsize,
    /// Whether the pipeline's modules stay loaded between images.
    pub modules_loaded: AtomicBool,
}

pub type ImageDispatcher = Dispatcher<ImageJob, ImageStats>;
type Stats = ReplicaStats<ImageStats>;

/// How one image replica is built.
pub struct ImageReplicaConfig {
    pub name: String,
    /// The groups of the pipeline's modules, in `FLUX_MODULES` order, and
    /// their plans.
    pub groups: Vec<DeviceGroup>,
    pub plans: Vec<Plan>,
    pub residency: ModuleResidency,
    pub queue_limit: usize,
}

/// Starts an image replica on a thread of its own: places the pipeline
/// (loading its modules when they stay loaded), then draws images until
/// the dispatcher is dropped or `cancel` is set. Returns once it is ready.
pub fn start_image_replica(
    dir: Arc<FluxDir>,
    config: ImageReplicaConfig,
    cancel: Arc<AtomicBool>,
) -> Result<ReplicaHandle<ImageJob, ImageStats>, String> {
    let name = config.name.clone();
    spawn_replica(&name, 1, config.queue_limit, move |receiver, stats, ready| {
        ImageReplica {
            dir,
            config,
            receiver,
            stats,
            cancel,
            ready,
        }
        .run()
    })
}

struct ImageReplica {
    dir: Arc<FluxDir>,
    config: ImageReplicaConfig,
    receiver: mpsc::Receiver<ImageJob>,
    stats: Arc<Stats>,
    cancel: Arc<AtomicBool>,
    ready: mpsc::Sender<Result<(), String>>,
}

impl ImageReplica {
    /// Places the pipeline (each module through its own group's runtime),
    /// then draws images until told to stop.
    fn run(self) {
        let c = &self.config;
        let pipeline = FluxPlacement::open(&c.groups, c.plans.clone()).and_then(|mut placement| {
            placement.arm_faults(&c.name)?;
            FluxPipeline::new(&self.dir, placement, c.residency)
        });
        let pipeline = match pipeline {
            Ok(pipeline) => pipeline,
            Err(e) => {
                let _ = self.ready.send(Err(format!("{}: {e}", c.name)));
                return;
            }
        };
        let loaded = c.residency == ModuleResidency::Loaded;
        self.stats.work.modules_loaded.store(loaded, Ordering::Relaxed);
        self.record_memory(&pipeline);
        let _ = self.ready.send(Ok(()));
        self.serve(&pipeline);
    }

    fn serve(&self, pipeline: &FluxPipeline) {
        loop {
            let job = match self.receiver.recv_timeout(IDLE_POLL) {
                Ok(job) => job,
                Err(RecvTimeoutError::Timeout) if self.cancel.load(Ordering::Relaxed) => return,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            self.stats.active.store(1, Ordering::Relaxed);
            self.stats.queued.fetch_sub(1, Ordering::Relaxed);
            let outcome = self.draw(pipeline, &job);
            self.stats.work.step.store(0, Ordering::Relaxed);
            self.stats.work.steps.store(0, Ordering::Relaxed);
            self.stats.active.store(0, Ordering::Relaxed);
            match outcome {
                Ok(pngs) => {
                    self.stats.work.images.fetch_add(pngs.len() as u64, Ordering::Relaxed);
                    let _ = job.reply.send(Ok(pngs));
                }
                // Nobody is waiting for it.
                Err(ModelError::Cancelled) if !self.cancel.load(Ordering::Relaxed) => {}
                Err(ModelError::Cancelled) => {
                    let _ = job
                        .reply
                        .send(Err(JobFailure::Server("the server is shutting down".into())));
                }
                Err(e) if e.is_device_failure() => return self.fail(job, &e),
                Err(e) => {
                    let _ = job.reply.send(Err(JobFailure::Request(e.to_string())));
                }
            }
            self.record_memory(pipeline);
        }
    }

    /// The job's images as PNGs, stopping at the next step once its client
    /// has gone away or the server is shutting down.
    fn draw(&self, pipeline: &FluxPipeline, job: &ImageJob) -> Result<Vec<Vec<u8>>, ModelError> {
        let model = self.dir.name();
        let work = &self.stats.work;
        let mut pngs = Vec::with_capacity(job.n);
        for i in 0..job.n as u64 {
            let settings = ImageSettings {
                seed: job.settings.seed.wrapping_add(i),
                ..job.settings.clone()
            };
            if job.reply.is_closed() {
                return Err(ModelError::Cancelled);
            }
            work.steps.store(settings.steps, Ordering::Relaxed);
            let (decoded, _) = pipeline.generate(&settings, &mut |progress| {
                if let ImageProgress::Step { index, .. } = progress {
                    work.step.store(index + 1, Ordering::Relaxed);
                }
                if job.reply.is_closed() || self.cancel.load(Ordering::Relaxed) {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })?;
            let png = RgbImage::from_decoded(&decoded, settings.height, settings.width)
                .and_then(|image| image.encode_png(&settings.parameters(&model)))
                .map_err(|e| ModelError::Input(e.to_string()))?;
            pngs.push(png);
        }
        Ok(pngs)
    }

    /// A device of the group failed: the job and every waiting one get the
    /// error, and the replica takes no more.
    fn fail(&self, job: ImageJob, failure: &ModelError) {
        let message = self
            .stats
            .fail(&self.config.name, failure, &self.receiver, |job, message| {
                let _ = job.reply.send(Err(JobFailure::Server(message.into())));
            });
        let _ = job.reply.send(Err(JobFailure::Server(message)));
    }

    fn record_memory(&self, pipeline: &FluxPipeline) {
        self.stats.record_memory(pipeline.placement().bytes_in_use());
    }
}
