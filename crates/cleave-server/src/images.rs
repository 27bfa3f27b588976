//! Image replicas: each group of devices holds one FLUX pipeline on a
//! thread of its own and draws one image at a time; the `n` images of a
//! request run one after another on the same replica. A job whose client
//! went away stops at the next denoising step and frees the replica.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use cleave_device::DeviceGroup;
use cleave_diffusion::image::RgbImage;
use cleave_engine::{FluxPipeline, FluxPlacement, ImageProgress, ImageSettings, ModuleResidency};
use cleave_models::FluxDir;
use cleave_nn::ModelError;
use cleave_plan::Plan;

use crate::dispatch::{answer_one_at_a_time, spawn_replica, Dispatcher, ReplicaHandle, ReplicaStats, WholeJob};

/// What one request asks of the pipeline: `n` images, the i-th drawn with
/// `settings.seed + i` (so each is the image `cleave image` draws with that
/// seed).
pub struct Images {
    pub settings: ImageSettings,
    pub n: usize,
}

/// A request's images and where their PNGs go; a dropped receiver cancels
/// the job at its next step.
pub type ImageJob = WholeJob<Images, Vec<Vec<u8>>>;

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
        let queue = (&self.receiver, self.stats.as_ref(), self.cancel.as_ref());
        answer_one_at_a_time(&self.config.name, queue, |job| {
            let drawn = self.draw(pipeline, job);
            let work = &self.stats.work;
            work.step.store(0, Ordering::Relaxed);
            work.steps.store(0, Ordering::Relaxed);
            if let Ok(pngs) = &drawn {
                work.images.fetch_add(pngs.len() as u64, Ordering::Relaxed);
            }
            self.record_memory(pipeline);
            drawn
        });
    }

    /// The job's images as PNGs, stopping at the next step once its client
    /// has gone away or the server is shutting down.
    fn draw(&self, pipeline: &FluxPipeline, job: &ImageJob) -> Result<Vec<Vec<u8>>, ModelError> {
        let model = self.dir.name();
        let work = &self.stats.work;
        let Images { settings: asked, n } = &job.request;
        let mut pngs = Vec::with_capacity(*n);
        for i in 0..*n as u64 {
            let settings = ImageSettings {
                seed: asked.seed.wrapping_add(i),
                ..asked.clone()
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

    fn record_memory(&self, pipeline: &FluxPipeline) {
        self.stats.record_memory(pipeline.placement().bytes_in_use());
    }
}
