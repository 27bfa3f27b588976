//! A FLUX.1 pipeline directory as diffusers publishes it
//! (`FluxPipeline.save_pretrained`): `model_index.json`, and one folder per
//! component. Its modules, each placed on its own device group, are `te`
//! (CLIP), `te2` (T5), `diffusion` (the transformer) and `vae`.

use std::path::{Path, PathBuf};

use cleave_diffusion::latents::VaeLatentConfig;
use cleave_diffusion::prompt::PromptTokenizer;
use cleave_diffusion::scheduler::SchedulerConfig;
use cleave_hf::{check_model_dir, pipeline_class, Checkpoint, ReadError};
use cleave_models::{ClipConfig, Family, FluxConfig, T5Config, VaeConfig};
use cleave_nn::{ModelError, Result};
use cleave_plan::Inventory;

/// Module names a FLUX pipeline directory holds.
pub const FLUX_MODULES: [&str; 4] = ["te", "te2", "diffusion", "vae"];

/// The pipelines cleave runs, by `model_index.json`'s `_class_name`.
const PIPELINES: [&str; 1] = ["FluxPipeline"];

/// A component's config and weights.
pub struct Component<C> {
    pub config: C,
    pub checkpoint: Checkpoint,
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
}

/// A FLUX pipeline directory, checked and opened, nothing on a device yet.
pub struct FluxDir {
    pub path: PathBuf,
    pub clip: Component<ClipConfig>,
    pub t5: Component<T5Config>,
    pub transformer: Component<FluxConfig>,
    pub vae: Component<VaeConfig>,
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
pub(crate) fn in_file(path: PathBuf, error: impl std::fmt::Display) -> ModelError {
    ReadError::in_file(path, error).into()
}
