//! A FLUX.1 pipeline directory as diffusers publishes it
//! (`FluxPipeline.save_pretrained`): `model_index.json`, and one folder per
//! component. Its modules, each placed on its own device group, are `te`
//! (CLIP), `te2` (T5), `diffusion` (the transformer) and `vae`.

use std::path::{Path, PathBuf};

use cleave_diffusion::latents::VaeLatentConfig;
use cleave_diffusion::prompt::PromptTokenizer;
use cleave_diffusion::scheduler::SchedulerConfig;
use cleave_plan::Inventory;
use serde::Deserialize;

use crate::error::{read_json, ModelError, Result};
use crate::{Checkpoint, ClipConfig, FluxConfig, T5Config, VaeConfig};

/// Module names a FLUX pipeline directory holds.
pub const FLUX_MODULES: [&str; 4] = ["te", "te2", "diffusion", "vae"];

/// The pipelines cleave runs, by `model_index.json`'s `_class_name`.
const PIPELINES: [&str; 1] = ["FluxPipeline"];

#[derive(Deserialize)]
struct ModelIndex {
    #[serde(rename = "_class_name")]
    class_name: Option<String>,
}

/// A component's config and weights.
pub struct Component<C> {
    pub config: C,
    pub checkpoint: Checkpoint,
}

impl<C> Component<C> {
    fn open(dir: &Path, config: impl FnOnce(&Path) -> Result<C>) -> Result<Self> {
        crate::check_model_dir(dir)?;
        Ok(Component {
            config: config(&dir.join("config.json"))?,
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
        let index_path = path.join("model_index.json");
        if !index_path.is_file() {
            return Err(ModelError::Io {
                path: path.to_path_buf(),
                reason: "not a pipeline directory (expected model_index.json and a folder per component, \
                         as diffusers' save_pretrained writes them)"
                    .into(),
            });
        }
        let index: ModelIndex = read_json(&index_path)?;
        let class = index.class_name.unwrap_or_default();
        if !PIPELINES.contains(&class.as_str()) {
            return Err(ModelError::Architecture {
                path: index_path,
                found: class,
                supported: PIPELINES.join(", "),
            });
        }
        let vae_config = path.join("vae/config.json");
        let scheduler_config = path.join("scheduler/scheduler_config.json");
        let tokenizer = path.join("tokenizer");
        Ok(FluxDir {
            clip: Component::open(&path.join("text_encoder"), ClipConfig::from_file)?,
            t5: Component::open(&path.join("text_encoder_2"), T5Config::from_file)?,
            transformer: Component::open(&path.join("transformer"), FluxConfig::from_file)?,
            vae: Component::open(&path.join("vae"), VaeConfig::from_file)?,
            latents: VaeLatentConfig::from_file(&vae_config).map_err(|e| ModelError::in_file(vae_config, e))?,
            scheduler: SchedulerConfig::from_file(&scheduler_config)
                .map_err(|e| ModelError::in_file(scheduler_config, e))?,
            clip_tokenizer: PromptTokenizer::clip(&tokenizer).map_err(|e| ModelError::in_file(tokenizer, e))?,
            path: path.to_path_buf(),
        })
    }

    /// The T5 tokenizer, padding and truncating to `max_sequence_length`.
    pub fn t5_tokenizer(&self, max_sequence_length: usize) -> Result<PromptTokenizer> {
        let dir = self.path.join("tokenizer_2");
        PromptTokenizer::t5(&dir, max_sequence_length).map_err(|e| ModelError::in_file(dir, e))
    }

    /// What the planner needs to place `module` for an image of
    /// `height × width` pixels and a T5 sequence of `text_tokens`.
    pub fn inventory(&self, module: &str, (height, width): (usize, usize), text_tokens: usize) -> Result<Inventory> {
        Ok(match module {
            "te" => self.clip.config.inventory(),
            "te2" => self.t5.config.inventory(text_tokens),
            "diffusion" => {
                let shape = self
                    .latents
                    .latent_shape(height, width)
                    .map_err(|e| ModelError::in_file(self.path.join("vae/config.json"), e))?;
                self.transformer.config.inventory(text_tokens + shape.seq_len())
            }
            "vae" => self.vae.config.inventory(height, width),
            other => {
                return Err(ModelError::Device(format!(
                    "a FLUX pipeline has no module '{other}' (it has: {})",
                    FLUX_MODULES.join(", ")
                )))
            }
        })
    }
}
