//! The model code, compiled here once for each runtime cleave opens.
//!
//! Code generic over the runtime is compiled again in every crate that
//! instantiates it: an optimized build shares no generic instances between
//! crates. cleave's is large (each kernel's expansion, every family's
//! forward pass), and each crate that loaded a model (the CLI, the server,
//! the engine, each test binary) spent a minute or two compiling it again.
//! So the public loaders, generic over the runtime for their callers, hand
//! their work to a function that is not generic, one per runtime
//! ([`on_wgpu`], [`on_cuda`]), which this crate compiles once. The devices
//! go in and the loaded model comes out through `Any`: on the runtime that
//! runs, the types on both sides are the same, so the downcasts hold.

use std::any::{type_name, Any};

use cleave_device::DeviceGroup;
use cleave_hf::{LoraAdapter, LoraMode};
use cleave_nn::{ModelError, Placed, Result};
use cleave_plan::Plan;
#[cfg(feature = "cuda")]
use cleave_shaders::cubecl::cuda::CudaRuntime;
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::cubecl::wgpu::WgpuRuntime;

use crate::encoder_dir::EncoderDir;
use crate::flux_dir::FluxDir;
use crate::registry::ModelDir;

/// A loader's work: which loader, and its arguments but the devices.
pub(crate) enum Job<'a> {
    /// [`ModelDir::load_on_group`], or without a group
    /// [`ModelDir::load_with_lora`].
    Causal {
        dir: &'a ModelDir,
        group: Option<&'a DeviceGroup>,
        plan: Plan,
        lora: (&'a [LoraAdapter], LoraMode),
        progress: &'a mut dyn FnMut(u64),
    },
    /// [`EncoderDir::load`].
    Encoder {
        dir: &'a EncoderDir,
        plan: Plan,
        progress: &'a mut dyn FnMut(u64),
    },
    /// [`FluxDir::load_clip`], [`FluxDir::load_t5`],
    /// [`FluxDir::load_transformer`], [`FluxDir::load_vae`].
    Flux {
        dir: &'a FluxDir,
        module: FluxModule,
        plan: Plan,
    },
}

/// A module of a FLUX pipeline, as [`Job::Flux`] loads it.
pub(crate) enum FluxModule {
    Clip,
    T5,
    Transformer,
    Vae,
}

impl Job<'_> {
    /// The loader's result, `Result<T>` for its `T` on `R`, boxed.
    fn run<R: Runtime>(self, devices: Vec<Placed<R>>) -> Box<dyn Any> {
        match self {
            Job::Causal {
                dir,
                group,
                plan,
                lora,
                progress,
            } => Box::new(dir.load_here(devices, group, plan, lora, progress)),
            Job::Encoder { dir, plan, progress } => Box::new(dir.load_here(devices, plan, progress)),
            Job::Flux { dir, module, plan } => match module {
                FluxModule::Clip => Box::new(dir.clip_here(devices, plan)),
                FluxModule::T5 => Box::new(dir.t5_here(devices, plan)),
                FluxModule::Transformer => Box::new(dir.transformer_here(devices, plan)),
                FluxModule::Vae => Box::new(dir.vae_here(devices, plan)),
            },
        }
    }
}

/// `job` on `devices`, by the code compiled here for the runtime `R` is;
/// `T` is what the job gives on `R`.
pub(crate) fn run<R: Runtime, T: 'static>(devices: Vec<Placed<R>>, job: Job) -> Result<T> {
    let devices: Box<dyn Any> = Box::new(devices);
    let devices = match devices.downcast::<Vec<Placed<WgpuRuntime>>>() {
        Ok(devices) => return same_type(on_wgpu(*devices, job)),
        Err(devices) => devices,
    };
    #[cfg(feature = "cuda")]
    let devices = match devices.downcast::<Vec<Placed<CudaRuntime>>>() {
        Ok(devices) => return same_type(on_cuda(*devices, job)),
        Err(devices) => devices,
    };
    drop(devices);
    let compiled_for = match cfg!(feature = "cuda") {
        true => "wgpu and CUDA",
        false => "wgpu (CUDA needs cleave-models' feature `cuda`)",
    };
    Err(ModelError::Device(format!(
        "cleave's model code is compiled for {compiled_for}, not for the runtime {}",
        type_name::<R>()
    )))
}

/// What a job gave on the runtime its caller's `R` is, as the caller's type.
fn same_type<T: 'static>(done: Box<dyn Any>) -> T {
    *done.downcast::<T>().unwrap_or_else(|_| {
        panic!(
            "a loader asked its job for {}, which that job does not give",
            type_name::<T>()
        )
    })
}

/// Never inlined, so that its callers' crates call this crate's copy
/// rather than compile the model code again.
#[inline(never)]
fn on_wgpu(devices: Vec<Placed<WgpuRuntime>>, job: Job) -> Box<dyn Any> {
    job.run(devices)
}

#[cfg(feature = "cuda")]
#[inline(never)]
fn on_cuda(devices: Vec<Placed<CudaRuntime>>, job: Job) -> Box<dyn Any> {
    job.run(devices)
}
