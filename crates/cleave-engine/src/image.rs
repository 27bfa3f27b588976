//! Text to image with a FLUX.1 pipeline, as diffusers' `FluxPipeline` runs
//! it: encode the prompt (CLIP pooled + T5 sequence), draw the noise with
//! torch's CPU generator, take the flow-matching Euler steps with the
//! transformer, decode with the VAE.
//!
//! Each module runs on its own devices, and each is loaded just before it
//! is needed and dropped when it is done (the text encoders before the
//! transformer loads, the transformer before the VAE), so the peak is the
//! largest module, not their sum.

use cleave_device::DeviceGroup;
use cleave_diffusion::latents::{image_ids, pack, text_ids, unpack, LatentShape};
use cleave_diffusion::rng::TorchRng;
use cleave_diffusion::scheduler::guidance_input;
use cleave_models::{Clip, FluxInput, FluxTransformer, T5Encoder, VaeDecoder};
use cleave_nn::{ModelError, Placed};

use crate::flux_dir::{in_file, FluxDir, FLUX_MODULES};
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

/// Where generation is, for progress bars and tests.
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

/// One module's devices and plan.
pub struct ModulePlacement<R: Runtime> {
    pub devices: Vec<Placed<R>>,
    pub plan: Plan,
}

impl<R: Runtime> ModulePlacement<R> {
    /// Returns the memory its (dropped) model held to the devices.
    fn release(&self) {
        for device in &self.devices {
            device.client.memory_cleanup();
        }
    }
}

/// The pipeline's four modules, placed.
pub struct FluxPlacement<R: Runtime> {
    pub te: ModulePlacement<R>,
    pub te2: ModulePlacement<R>,
    pub diffusion: ModulePlacement<R>,
    pub vae: ModulePlacement<R>,
}

impl<R: Runtime> FluxPlacement<R> {
    /// The modules' placements from the clients of their groups joined in
    /// `FLUX_MODULES` order (`DeviceGroup::join`), one plan per module.
    pub fn from_groups(
        clients: Vec<ComputeClient<R>>,
        groups: &[DeviceGroup],
        plans: Vec<Plan>,
    ) -> Result<Self, ModelError> {
        let mut clients = clients.into_iter();
        let mut modules = groups.iter().zip(plans).map(|(group, plan)| ModulePlacement {
            devices: Placed::group(clients.by_ref().take(group.members.len()).collect(), group),
            plan,
        });
        let mut next = || {
            modules.next().ok_or_else(|| {
                ModelError::Device(format!("a FLUX pipeline needs {} module groups", FLUX_MODULES.len()))
            })
        };
        Ok(FluxPlacement {
            te: next()?,
            te2: next()?,
            diffusion: next()?,
            vae: next()?,
        })
    }
}

/// The decoded image `[3, H, W]` in [-1, 1] (before diffusers'
/// post-processing), and the latent grid it came from.
pub fn generate_image<R: Runtime>(
    dir: &FluxDir,
    placement: FluxPlacement<R>,
    settings: &ImageSettings,
    on_progress: &mut dyn FnMut(ImageProgress),
) -> Result<(Vec<f32>, LatentShape), ModelError> {
    let pipeline_error = |what: &str, e: &dyn std::fmt::Display| in_file(dir.path.join(what), e);
    let ids = |ids: Vec<i64>| ids.into_iter().map(|id| id as u32).collect::<Vec<u32>>();
    let clip_ids = ids(dir
        .clip_tokenizer
        .encode(&settings.prompt)
        .map_err(|e| pipeline_error("tokenizer", &e))?);
    let t5_ids = ids(dir
        .t5_tokenizer(settings.max_sequence_length)?
        .encode(&settings.prompt)
        .map_err(|e| pipeline_error("tokenizer_2", &e))?);
    let mut no_progress = |_| {};

    let FluxPlacement {
        te,
        te2,
        diffusion,
        vae,
    } = placement;
    let pooled = {
        let clip = Clip::load(
            te.devices.clone(),
            te.plan.clone(),
            &dir.clip.config,
            &dir.clip.checkpoint,
            &mut no_progress,
        )?;
        clip.forward(&clip_ids)?.pooled
    };
    te.release();
    let text = {
        let t5 = T5Encoder::load(
            te2.devices.clone(),
            te2.plan.clone(),
            &dir.t5.config,
            &dir.t5.checkpoint,
            &mut no_progress,
        )?;
        t5.forward(&t5_ids)?
    };
    te2.release();
    on_progress(ImageProgress::Encoded);

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
    {
        let transformer = FluxTransformer::load(
            diffusion.devices.clone(),
            diffusion.plan.clone(),
            &dir.transformer.config,
            &dir.transformer.checkpoint,
            &mut no_progress,
        )?;
        let guidance = dir
            .transformer
            .config
            .guidance_embeds
            .then(|| guidance_input(settings.guidance));
        for index in 0..schedule.num_steps() {
            let velocity = transformer.forward(&FluxInput {
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
            on_progress(ImageProgress::Step {
                index,
                steps: schedule.num_steps(),
                latents: &latents,
            });
        }
    }
    diffusion.release();

    let mut z = unpack(shape, &latents).map_err(|e| pipeline_error("vae/config.json", &e))?;
    dir.latents.to_vae_input(&mut z);
    let decoder = VaeDecoder::load(
        vae.devices,
        vae.plan,
        &dir.vae.config,
        &dir.vae.checkpoint,
        &mut no_progress,
    )?;
    let image = decoder.decode(&z, shape.height(), shape.width())?;
    Ok((image, shape))
}
