//! Text to image with a FLUX.1 pipeline, as diffusers' `FluxPipeline` runs
//! it: encode the prompt (CLIP pooled + T5 sequence), draw the noise with
//! torch's CPU generator, take the flow-matching Euler steps with the
//! transformer, decode with the VAE.
//!
//! Each module runs on its own devices. A pipeline either keeps its four
//! modules loaded (a server whose group has room for all of them), or loads
//! each just before it is needed and drops it when it is done (the text
//! encoders before the transformer loads, the transformer before the VAE),
//! so that the peak is the largest module, not their sum.

use std::ops::ControlFlow;

use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_diffusion::latents::{image_ids, pack, text_ids, unpack, LatentShape};
use cleave_diffusion::rng::TorchRng;
use cleave_diffusion::scheduler::guidance_input;
use cleave_hf::ReadError;
use cleave_models::{Decode, Denoise, Encode, FluxDir, FluxInput, FLUX_MODULES};
use cleave_nn::{check_finite, ModelError, Placed};
use cleave_plan::Plan;
use cleave_shaders::cubecl::prelude::*;

/// What to draw, named and defaulted as `FluxPipeline.__call__`.
#[derive(Clone, Debug)]
pub struct ImageSettings {
    pub prompt: String,
    pub height: usize,
    pub width: usize,
    pub steps: usize,
    /// Embedded guidance (FLUX.1-dev); ignored by models without it.
    pub guidance: f64,
    pub max_sequence_length: usize,
    pub seed: u64,
}

impl ImageSettings {
    /// `FluxPipeline.__call__`'s defaults: a 1024×1024 image (its default
    /// sample size of 128 latents, times the VAE's 8), 28 steps, guidance
    /// 3.5, the prompt padded or cut to 512 T5 tokens.
    pub const DEFAULT_SIDE: usize = 1024;
    pub const DEFAULT_STEPS: usize = 28;
    pub const DEFAULT_GUIDANCE: f64 = 3.5;
    /// The most T5 tokens a prompt may take: FLUX.1's T5 takes 512, and
    /// the default is all of them.
    pub const MAX_T5_TOKENS: usize = 512;
    /// The most denoising steps one image may ask for.
    pub const MAX_STEPS: usize = 1000;
    /// The longest prompt, in bytes: far more than the 77 CLIP and at most
    /// 512 T5 tokens the pipeline reads (the rest is cut), so that no
    /// prompt costs seconds of tokenizing, or a PNG its size, for text the
    /// encoders never see.
    pub const MAX_PROMPT_BYTES: usize = 64 << 10;

    /// Refuses a prompt longer than [`Self::MAX_PROMPT_BYTES`].
    pub fn check_prompt(prompt: &str) -> Result<(), String> {
        if prompt.len() > Self::MAX_PROMPT_BYTES {
            return Err(format!(
                "the prompt is {} bytes: more than the {} KiB an image prompt may take \
                 (the encoders read at most 512 tokens of it)",
                prompt.len(),
                Self::MAX_PROMPT_BYTES >> 10
            ));
        }
        Ok(())
    }

    /// The generation parameters as stable-diffusion.cpp and A1111 store
    /// them in the PNG's `parameters` text chunk; `model` names the
    /// pipeline.
    pub fn parameters(&self, model: &str) -> String {
        format!(
            "{}\nSteps: {}, Sampler: Euler (flow matching), Guidance: {}, Seed: {}, Size: {}x{}, Model: {model}, \
             Max sequence length: {}, RNG: torch-cpu, Version: cleave {}",
            self.prompt,
            self.steps,
            self.guidance,
            self.seed,
            self.width,
            self.height,
            self.max_sequence_length,
            env!("CARGO_PKG_VERSION")
        )
    }
}

/// Where generation is, for progress bars and tests. The callback that
/// receives it answers whether to go on: `Break` stops the image at once
/// (a client that went away) and generation returns
/// [`ModelError::Cancelled`].
pub enum ImageProgress<'a> {
    /// The prompt is encoded; the denoising loop starts.
    Encoded,
    /// Step `index` (of `steps`) is done; `latents` are the packed latents
    /// after it.
    Step {
        index: usize,
        steps: usize,
        latents: &'a [f32],
    },
}

/// A module's group and plan, on whichever runtime the group has: what
/// loads a module there. The pipeline sees its modules only through this
/// and the traits it calls them by (cleave-models' `Encode`, `Denoise`,
/// `Decode`), so each module's group may be of another runtime
/// (`te=vulkan0,diffusion=cuda0`): the modules hand their outputs on
/// through the host, as they do on one runtime.
trait ModuleHome {
    fn clip(&self, dir: &FluxDir) -> Result<Box<dyn Encode>, ModelError>;
    fn t5(&self, dir: &FluxDir) -> Result<Box<dyn Encode>, ModelError>;
    fn transformer(&self, dir: &FluxDir) -> Result<Box<dyn Denoise>, ModelError>;
    fn vae(&self, dir: &FluxDir) -> Result<Box<dyn Decode>, ModelError>;
    /// Returns the memory a dropped module held to the devices.
    fn release(&self);
    /// Each device's name and the bytes cleave's buffers occupy there.
    fn bytes_in_use(&self) -> Vec<(String, u64)>;
    /// Arms the fault `CLEAVE_INJECT_FAULT` names for the group named
    /// `group`, on that member of this module's group.
    fn arm_faults(&mut self, group: &str) -> Result<(), ModelError>;
}

/// One module's devices and plan, on its group's runtime.
struct ModulePlacement<R: Runtime> {
    devices: Vec<Placed<R>>,
    plan: Plan,
}

impl<R: Runtime> ModulePlacement<R> {
    /// This module's devices and plan, for a load.
    fn place(&self) -> (Vec<Placed<R>>, Plan) {
        (self.devices.clone(), self.plan.clone())
    }
}

impl<R: Runtime> ModuleHome for ModulePlacement<R> {
    fn clip(&self, dir: &FluxDir) -> Result<Box<dyn Encode>, ModelError> {
        let (devices, plan) = self.place();
        dir.load_clip(devices, plan)
    }

    fn t5(&self, dir: &FluxDir) -> Result<Box<dyn Encode>, ModelError> {
        let (devices, plan) = self.place();
        dir.load_t5(devices, plan)
    }

    fn transformer(&self, dir: &FluxDir) -> Result<Box<dyn Denoise>, ModelError> {
        let (devices, plan) = self.place();
        dir.load_transformer(devices, plan)
    }

    fn vae(&self, dir: &FluxDir) -> Result<Box<dyn Decode>, ModelError> {
        let (devices, plan) = self.place();
        dir.load_vae(devices, plan)
    }

    fn release(&self) {
        for device in &self.devices {
            device.client.memory_cleanup();
        }
    }

    fn bytes_in_use(&self) -> Vec<(String, u64)> {
        let in_use = |d: &Placed<R>| (d.name.clone(), d.bytes_in_use().unwrap_or(0));
        self.devices.iter().map(in_use).collect()
    }

    fn arm_faults(&mut self, group: &str) -> Result<(), ModelError> {
        Placed::arm_faults(&mut self.devices, group)
    }
}

/// Places a module on its group's devices, through the group's runtime.
struct PlaceModule<'a> {
    group: &'a DeviceGroup,
    plan: Plan,
}

impl RuntimeTask for PlaceModule<'_> {
    type Output = Box<dyn ModuleHome>;

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Self::Output {
        Box::new(ModulePlacement {
            devices: Placed::group(clients, self.group),
            plan: self.plan,
        })
    }
}

/// Runs `run` on a module: the one kept loaded, or one `load`ed now on
/// `home` and dropped (its memory returned to the devices) when `run` is
/// done.
fn with<M: ?Sized, T>(
    home: &dyn ModuleHome,
    kept: Option<&M>,
    load: impl FnOnce() -> Result<Box<M>, ModelError>,
    run: impl FnOnce(&M) -> Result<T, ModelError>,
) -> Result<T, ModelError> {
    if let Some(module) = kept {
        return run(module);
    }
    let module = load()?;
    let result = run(&module);
    drop(module);
    home.release();
    result
}

/// The pipeline's four modules, each placed on its own group, of any
/// runtime.
pub struct FluxPlacement {
    te: Box<dyn ModuleHome>,
    te2: Box<dyn ModuleHome>,
    diffusion: Box<dyn ModuleHome>,
    vae: Box<dyn ModuleHome>,
}

impl FluxPlacement {
    /// The modules placed on `groups` (one per module, in `FLUX_MODULES`
    /// order) as `plans` say, each through its own group's runtime. A
    /// module's group must be of one runtime.
    pub fn open(groups: &[DeviceGroup], plans: Vec<Plan>) -> Result<Self, ModelError> {
        if groups.len() != FLUX_MODULES.len() || plans.len() != FLUX_MODULES.len() {
            return Err(ModelError::Device(format!(
                "a FLUX pipeline needs {} module groups and plans, not {} and {}",
                FLUX_MODULES.len(),
                groups.len(),
                plans.len()
            )));
        }
        let mut homes = groups
            .iter()
            .zip(plans)
            .zip(FLUX_MODULES)
            .map(|((group, plan), module)| {
                group
                    .one_runtime(&format!("the {module} module's group"))
                    .map_err(|e| ModelError::Device(e.to_string()))?;
                Ok(group.run(PlaceModule { group, plan }))
            });
        let mut next = || {
            homes
                .next()
                .unwrap_or_else(|| Err(ModelError::Device("a FLUX module without a group".into())))
        };
        Ok(FluxPlacement {
            te: next()?,
            te2: next()?,
            diffusion: next()?,
            vae: next()?,
        })
    }

    fn modules(&self) -> [&dyn ModuleHome; 4] {
        [&*self.te, &*self.te2, &*self.diffusion, &*self.vae]
    }

    /// Arms the fault `CLEAVE_INJECT_FAULT` names for the group named
    /// `group`, on that member of each module's group.
    pub fn arm_faults(&mut self, group: &str) -> Result<(), ModelError> {
        for module in [&mut self.te, &mut self.te2, &mut self.diffusion, &mut self.vae] {
            module.arm_faults(group)?;
        }
        Ok(())
    }

    /// Each module's devices (in `FLUX_MODULES` order) with the bytes
    /// cleave's buffers occupy there.
    pub fn bytes_in_use(&self) -> Vec<(String, u64)> {
        self.modules().iter().flat_map(|m| m.bytes_in_use()).collect()
    }
}

/// Whether a pipeline keeps its modules loaded between images.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModuleResidency {
    /// All four stay on their devices: nothing is loaded per image.
    Loaded,
    /// Each is loaded just before it runs and dropped after: the devices
    /// hold one module at a time.
    OnUse,
}

/// The four modules, loaded.
struct Modules {
    clip: Box<dyn Encode>,
    t5: Box<dyn Encode>,
    transformer: Box<dyn Denoise>,
    vae: Box<dyn Decode>,
}

/// A FLUX pipeline on its devices, ready to draw images one after another.
pub struct FluxPipeline<'d> {
    dir: &'d FluxDir,
    placement: FluxPlacement,
    /// Present when the modules stay loaded.
    kept: Option<Modules>,
}

impl<'d> FluxPipeline<'d> {
    /// The pipeline of `dir` on `placement`, its modules loaded now when
    /// `residency` keeps them.
    pub fn new(dir: &'d FluxDir, placement: FluxPlacement, residency: ModuleResidency) -> Result<Self, ModelError> {
        let mut pipeline = FluxPipeline {
            dir,
            placement,
            kept: None,
        };
        if residency == ModuleResidency::Loaded {
            let p = &pipeline.placement;
            pipeline.kept = Some(Modules {
                clip: p.te.clip(dir)?,
                t5: p.te2.t5(dir)?,
                transformer: p.diffusion.transformer(dir)?,
                vae: p.vae.vae(dir)?,
            });
        }
        Ok(pipeline)
    }

    pub fn placement(&self) -> &FluxPlacement {
        &self.placement
    }

    /// The decoded image `[3, H, W]` in [-1, 1] (before diffusers'
    /// post-processing), and the latent grid it came from.
    pub fn generate(
        &self,
        settings: &ImageSettings,
        on_progress: &mut dyn FnMut(ImageProgress) -> ControlFlow<()>,
    ) -> Result<(Vec<f32>, LatentShape), ModelError> {
        let dir = self.dir;
        ImageSettings::check_prompt(&settings.prompt).map_err(ModelError::Input)?;
        let pipeline_error =
            |what: &str, e: &dyn std::fmt::Display| -> ModelError { ReadError::in_file(dir.path.join(what), e).into() };
        let ids = |ids: Vec<i64>| ids.into_iter().map(|id| id as u32).collect::<Vec<u32>>();
        let clip_ids = ids(dir
            .clip_tokenizer
            .encode(&settings.prompt)
            .map_err(|e| pipeline_error("tokenizer", &e))?);
        let t5_ids = ids(dir
            .t5_tokenizer(settings.max_sequence_length)?
            .encode(&settings.prompt)
            .map_err(|e| pipeline_error("tokenizer_2", &e))?);
        let (p, kept) = (&self.placement, self.kept.as_ref());

        let pooled = with(
            &*p.te,
            kept.map(|m| &*m.clip),
            || p.te.clip(dir),
            |clip| clip.encode(&clip_ids),
        )?;
        let text = with(&*p.te2, kept.map(|m| &*m.t5), || p.te2.t5(dir), |t5| t5.encode(&t5_ids))?;
        go_on(on_progress(ImageProgress::Encoded))?;

        let shape = dir
            .latents
            .latent_shape(settings.height, settings.width)
            .map_err(|e| pipeline_error("vae/config.json", &e))?;
        let noise = TorchRng::new(settings.seed).randn(shape.num_values());
        let mut latents = pack(shape, &noise).map_err(|e| pipeline_error("vae/config.json", &e))?;
        let schedule = dir
            .scheduler
            .schedule(settings.steps, shape.seq_len())
            .map_err(|e| pipeline_error("scheduler/scheduler_config.json", &e))?;
        let (img_ids, txt_ids) = (image_ids(shape), text_ids(t5_ids.len()));
        let guidance = dir.guidance_embeds().then(|| guidance_input(settings.guidance));
        with(
            &*p.diffusion,
            kept.map(|m| &*m.transformer),
            || p.diffusion.transformer(dir),
            |transformer| {
                for index in 0..schedule.num_steps() {
                    let velocity = transformer.velocity(&FluxInput {
                        img: &latents,
                        img_ids: &img_ids,
                        txt: &text,
                        txt_ids: &txt_ids,
                        pooled: &pooled,
                        timestep: schedule
                            .transformer_timestep(index)
                            .map_err(|e| pipeline_error("scheduler", &e))?,
                        guidance,
                    })?;
                    schedule
                        .step(index, &mut latents, &velocity)
                        .map_err(|e| pipeline_error("scheduler", &e))?;
                    check_finite(
                        &latents,
                        || format!("the latent tensor after step {} of {}", index + 1, schedule.num_steps()),
                        OVERFLOW_HINT,
                    )?;
                    go_on(on_progress(ImageProgress::Step {
                        index,
                        steps: schedule.num_steps(),
                        latents: &latents,
                    }))?;
                }
                Ok(())
            },
        )?;

        let mut z = unpack(shape, &latents).map_err(|e| pipeline_error("vae/config.json", &e))?;
        dir.latents.to_vae_input(&mut z);
        let image = with(
            &*p.vae,
            kept.map(|m| &*m.vae),
            || p.vae.vae(dir),
            |vae| vae.decode(&z, shape.height(), shape.width()),
        )?;
        check_finite(&image, || "the decoded image".into(), OVERFLOW_HINT)?;
        Ok((image, shape))
    }
}

/// What a non-finite latent or pixel most likely means: an image drawn
/// from it would be black or noise, with nothing said.
const OVERFLOW_HINT: &str = " (a value overflowed: is the guidance scale far too large?)";

/// What a progress callback answered, as generation goes on with it.
fn go_on(flow: ControlFlow<()>) -> Result<(), ModelError> {
    match flow {
        ControlFlow::Continue(()) => Ok(()),
        ControlFlow::Break(()) => Err(ModelError::Cancelled),
    }
}

/// One image with each module loaded just for its part (`cleave image`).
pub fn generate_image(
    dir: &FluxDir,
    placement: FluxPlacement,
    settings: &ImageSettings,
    on_progress: &mut dyn FnMut(ImageProgress) -> ControlFlow<()>,
) -> Result<(Vec<f32>, LatentShape), ModelError> {
    FluxPipeline::new(dir, placement, ModuleResidency::OnUse)?.generate(settings, on_progress)
}
