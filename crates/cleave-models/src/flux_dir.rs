//! A FLUX.1 pipeline directory as diffusers publishes it
//! (`FluxPipeline.save_pretrained`): `model_index.json`, and one folder per
//! component. Its modules, each placed on its own device group, are `te`
//! (CLIP), `te2` (T5), `diffusion` (the transformer) and `vae`. Each loads
//! behind the trait the pipeline calls it by ([`Encode`], [`Denoise`],
//! [`Decode`]), so that the pipeline names no family's types and each
//! module may sit on a runtime of its own.

use std::path::{Path, PathBuf};

use cleave_diffusion::latents::VaeLatentConfig;
use cleave_diffusion::prompt::PromptTokenizer;
use cleave_diffusion::scheduler::SchedulerConfig;
use cleave_hf::{check_model_dir, pipeline_class, Checkpoint, ReadError};
use cleave_nn::{ModelError, Placed, Result};
use cleave_plan::{Inventory, Plan};
use cleave_shaders::cubecl::prelude::*;

use crate::compiled::{self, FluxModule, Job};
use crate::{
    Clip, ClipConfig, Family, FluxConfig, FluxInput, FluxTransformer, T5Config, T5Encoder, VaeConfig, VaeDecoder,
};

/// Module names a FLUX pipeline directory holds.
pub const FLUX_MODULES: [&str; 4] = ["te", "te2", "diffusion", "vae"];

/// The pipelines cleave runs, by `model_index.json`'s `_class_name`.
const PIPELINES: [&str; 1] = ["FluxPipeline"];

/// A component's config and weights.
struct Component<C> {
    config: C,
    checkpoint: Checkpoint,
}

impl<C> Component<C> {
    /// The component in `dir`, which must be of `family`.
    fn open(dir: &Path, family: Family, config: impl FnOnce(&Path) -> cleave_hf::Result<C>) -> Result<Self> {
        check_model_dir(dir)?;
        let config_path = dir.join("config.json");
        Family::of_config(&config_path, &[family])?;
        Ok(Component {
            config: config(&config_path)?,
            checkpoint: Checkpoint::open(dir)?,
        })
    }

    /// The component loaded onto `devices` as `plan` says, by its model's
    /// `load`.
    fn load<R: Runtime, M>(
        &self,
        (devices, plan): (Vec<Placed<R>>, Plan),
        load: impl FnOnce(Vec<Placed<R>>, Plan, &C, &Checkpoint, &mut dyn FnMut(u64)) -> Result<M>,
    ) -> Result<M> {
        load(devices, plan, &self.config, &self.checkpoint, &mut |_| {})
    }
}

/// The text encoders as the pipeline calls them: CLIP's pooled vector,
/// T5's states.
pub trait Encode {
    fn encode(&self, ids: &[u32]) -> Result<Vec<f32>>;
}

/// CLIP, of which the pipeline takes the pooled vector.
struct Pooled<R: Runtime>(Clip<R>);

impl<R: Runtime> Encode for Pooled<R> {
    fn encode(&self, ids: &[u32]) -> Result<Vec<f32>> {
        Ok(self.0.forward(ids)?.pooled)
    }
}

impl<R: Runtime> Encode for T5Encoder<R> {
    fn encode(&self, ids: &[u32]) -> Result<Vec<f32>> {
        self.forward(ids)
    }
}

/// The transformer as the pipeline calls it at each step.
pub trait Denoise {
    fn velocity(&self, input: &FluxInput) -> Result<Vec<f32>>;
}

impl<R: Runtime> Denoise for FluxTransformer<R> {
    fn velocity(&self, input: &FluxInput) -> Result<Vec<f32>> {
        self.forward(input)
    }
}

/// The VAE decoder as the pipeline calls it: latents of `h × w` to
/// pixels.
pub trait Decode {
    fn decode(&self, latents: &[f32], h: usize, w: usize) -> Result<Vec<f32>>;
}

impl<R: Runtime> Decode for VaeDecoder<R> {
    fn decode(&self, latents: &[f32], h: usize, w: usize) -> Result<Vec<f32>> {
        VaeDecoder::decode(self, latents, h, w)
    }
}

/// A FLUX pipeline directory, checked and opened, nothing on a device yet.
pub struct FluxDir {
    pub path: PathBuf,
    clip: Component<ClipConfig>,
    t5: Component<T5Config>,
    transformer: Component<FluxConfig>,
    vae: Component<VaeConfig>,
    /// How latents are laid out and rescaled for the VAE.
    pub latents: VaeLatentConfig,
    pub scheduler: SchedulerConfig,
    pub clip_tokenizer: PromptTokenizer,
}

impl FluxDir {
    pub fn open(path: &Path) -> Result<Self> {
        pipeline_class(path, &PIPELINES)?;
        let vae_config = path.join("vae/config.json");
        let scheduler_config = path.join("scheduler/scheduler_config.json");
        let tokenizer = path.join("tokenizer");
        Ok(FluxDir {
            clip: Component::open(&path.join("text_encoder"), Family::Clip, ClipConfig::from_file)?,
            t5: Component::open(&path.join("text_encoder_2"), Family::T5, T5Config::from_file)?,
            transformer: Component::open(&path.join("transformer"), Family::Flux, FluxConfig::from_file)?,
            vae: Component::open(&path.join("vae"), Family::Vae, VaeConfig::from_file)?,
            latents: VaeLatentConfig::from_file(&vae_config).map_err(|e| in_file(vae_config, e))?,
            scheduler: SchedulerConfig::from_file(&scheduler_config).map_err(|e| in_file(scheduler_config, e))?,
            clip_tokenizer: PromptTokenizer::clip(&tokenizer).map_err(|e| in_file(tokenizer, e))?,
            path: path.to_path_buf(),
        })
    }

    /// The pipeline's name: its directory's.
    pub fn name(&self) -> String {
        let path = self.path.canonicalize().unwrap_or_else(|_| self.path.clone());
        path.file_name()
            .map_or_else(|| "pipeline".into(), |n| n.to_string_lossy().into_owned())
    }

    /// The T5 tokenizer, padding and truncating to `max_sequence_length`.
    pub fn t5_tokenizer(&self, max_sequence_length: usize) -> Result<PromptTokenizer> {
        let dir = self.path.join("tokenizer_2");
        PromptTokenizer::t5(&dir, max_sequence_length).map_err(|e| in_file(dir, e))
    }

    /// Whether the transformer takes embedded guidance (FLUX.1-dev).
    pub fn guidance_embeds(&self) -> bool {
        self.transformer.config.guidance_embeds
    }

    /// CLIP, loaded onto `devices` as `plan` places the `te` module.
    pub fn load_clip<R: Runtime>(&self, devices: Vec<Placed<R>>, plan: Plan) -> Result<Box<dyn Encode>> {
        self.load_module(devices, plan, FluxModule::Clip)
    }

    /// T5, loaded as `plan` places the `te2` module.
    pub fn load_t5<R: Runtime>(&self, devices: Vec<Placed<R>>, plan: Plan) -> Result<Box<dyn Encode>> {
        self.load_module(devices, plan, FluxModule::T5)
    }

    /// The transformer, loaded as `plan` places the `diffusion` module.
    pub fn load_transformer<R: Runtime>(&self, devices: Vec<Placed<R>>, plan: Plan) -> Result<Box<dyn Denoise>> {
        self.load_module(devices, plan, FluxModule::Transformer)
    }

    /// The VAE decoder, loaded as `plan` places the `vae` module.
    pub fn load_vae<R: Runtime>(&self, devices: Vec<Placed<R>>, plan: Plan) -> Result<Box<dyn Decode>> {
        self.load_module(devices, plan, FluxModule::Vae)
    }

    fn load_module<R: Runtime, M: ?Sized + 'static>(
        &self,
        devices: Vec<Placed<R>>,
        plan: Plan,
        module: FluxModule,
    ) -> Result<Box<M>> {
        compiled::run(
            devices,
            Job::Flux {
                dir: self,
                module,
                plan,
            },
        )
    }

    /// What the loaders above do, compiled in this crate (see
    /// [`compiled`]).
    pub(crate) fn clip_here<R: Runtime>(&self, devices: Vec<Placed<R>>, plan: Plan) -> Result<Box<dyn Encode>> {
        Ok(Box::new(Pooled(self.clip.load((devices, plan), Clip::load)?)))
    }

    pub(crate) fn t5_here<R: Runtime>(&self, devices: Vec<Placed<R>>, plan: Plan) -> Result<Box<dyn Encode>> {
        Ok(Box::new(self.t5.load((devices, plan), T5Encoder::load)?))
    }

    pub(crate) fn transformer_here<R: Runtime>(&self, devices: Vec<Placed<R>>, plan: Plan) -> Result<Box<dyn Denoise>> {
        Ok(Box::new(self.transformer.load((devices, plan), FluxTransformer::load)?))
    }

    pub(crate) fn vae_here<R: Runtime>(&self, devices: Vec<Placed<R>>, plan: Plan) -> Result<Box<dyn Decode>> {
        Ok(Box::new(self.vae.load((devices, plan), VaeDecoder::load)?))
    }

    /// What the planner needs to place `module` for an image of
    /// `height × width` pixels and a T5 sequence of `text_tokens`.
    pub fn inventory(&self, module: &str, (height, width): (usize, usize), text_tokens: usize) -> Result<Inventory> {
        Ok(match module {
            "te" => self.clip.config.inventory(&self.clip.checkpoint),
            "te2" => self.t5.config.inventory(&self.t5.checkpoint, text_tokens),
            "diffusion" => {
                let shape = self
                    .latents
                    .latent_shape(height, width)
                    .map_err(|e| in_file(self.path.join("vae/config.json"), e))?;
                self.transformer
                    .config
                    .inventory(&self.transformer.checkpoint, text_tokens + shape.seq_len())
            }
            "vae" => self.vae.config.inventory(&self.vae.checkpoint, height, width),
            other => {
                return Err(ModelError::Device(format!(
                    "a FLUX pipeline has no module '{other}' (it has: {})",
                    FLUX_MODULES.join(", ")
                )))
            }
        })
    }
}

/// An error of a component's own reader, naming its file.
fn in_file(path: PathBuf, error: impl std::fmt::Display) -> ModelError {
    ReadError::in_file(path, error).into()
}
