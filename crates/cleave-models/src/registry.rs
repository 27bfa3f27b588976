//! The one map from a checkpoint's class (config.json's `architectures[0]`,
//! diffusers' `_class_name`) to the family folder that runs it, and the
//! causal-LM directory that loads through it. Adding a family is a folder
//! and a line in `FAMILIES`; a decoder family also takes a place in
//! `DECODERS` and an arm in `ModelDir::load_with_lora`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cleave_device::{DeviceGroup, RuntimeTask, Slot};
use cleave_gguf::GgufFile;
use cleave_hf::{check_model_dir, Checkpoint, ConfigClass, LoraAdapter, LoraMode, ReadError, Tokenizer, WeightType};
use cleave_nn::{CacheType, CausalModel, LaterPart, ModelError, Placed, Result, WeightSource};
use cleave_plan::{Inventory, Plan};
use cleave_shaders::cubecl::prelude::*;

use crate::compiled::{self, Job};
use crate::llama::{self, Elsewhere, ExpertPart, ExpertsElsewhere, LlamaModel, ModelConfig};

/// The model families cleave runs, each a folder of this crate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Every rotary causal decoder, one block with switches: the classes of
    /// `llama::ARCHITECTURES` (Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 2
    /// and 3, Mixtral, Qwen3-MoE).
    Llama,
    /// BERT encoders (`cleave embed`).
    Bert,
    /// CLIP's text encoder (a FLUX pipeline's `te`).
    Clip,
    /// T5's encoder (a FLUX pipeline's `te2`).
    T5,
    /// FLUX.1's transformer (`diffusion`).
    Flux,
    /// FLUX.1's VAE (`vae`).
    Vae,
}

/// Each family and the classes it runs.
const FAMILIES: [(Family, &[&str]); 6] = [
    (Family::Llama, &llama::ARCHITECTURES),
    (Family::Bert, &["BertModel"]),
    (Family::Clip, &["CLIPTextModel"]),
    (Family::T5, &["T5EncoderModel"]),
    (Family::Flux, &["FluxTransformer2DModel"]),
    (Family::Vae, &["AutoencoderKL"]),
];

impl Family {
    /// The family of the model whose config is at `path`, which must be
    /// one of `wanted`; the error lists the classes those families run.
    pub fn of_config(path: &Path, wanted: &[Family]) -> std::result::Result<Family, ReadError> {
        let class = ConfigClass::read(path)?;
        let family = match &class.name {
            Some(name) => FAMILIES
                .iter()
                .find(|(_, classes)| classes.contains(&name.as_str()))
                .map(|(family, _)| *family),
            // BERT checkpoints saved without `architectures` still say
            // `model_type`.
            None if class.model_type.as_deref() == Some("bert") => Some(Family::Bert),
            None => None,
        };
        let mut supported = Self::classes(wanted);
        let found = match (class.name, family) {
            (Some(name), _) => name,
            (None, Some(Family::Bert)) => "BertModel".into(),
            (None, _) => {
                return Err(ReadError::Config {
                    path: path.to_path_buf(),
                    field: "architectures",
                    reason: format!(
                        "missing, and the file has no '_class_name' either, so it names no model class \
                         (supported: {supported})"
                    ),
                })
            }
        };
        match family {
            Some(family) if wanted.contains(&family) => return Ok(family),
            // A model cleave runs, through another command: say which.
            Some(other) => supported.push_str(&format!("; {found} runs through {}", other.command())),
            None => {}
        }
        Err(ReadError::Architecture {
            path: path.to_path_buf(),
            found,
            supported,
        })
    }

    /// The command that runs this family's models.
    fn command(self) -> &'static str {
        match self {
            Family::Llama => "`cleave run`",
            Family::Bert => "`cleave embed` (or `cleave serve`, for `/v1/embeddings`)",
            Family::Clip | Family::T5 | Family::Flux | Family::Vae => "`cleave image`, as part of a FLUX pipeline",
        }
    }

    /// The classes `families` run, for error messages.
    fn classes(families: &[Family]) -> String {
        let names: Vec<&str> = FAMILIES
            .iter()
            .filter(|(family, _)| families.contains(family))
            .flat_map(|(_, classes)| classes.iter().copied())
            .collect();
        names.join(", ")
    }
}

/// f32 for a checkpoint whose embedding table is f32, f16 for one whose
/// weights are 16-bit or quantized (whose precision an f32 cache would not
/// add to).
fn default_cache_type(checkpoint: &Checkpoint) -> CacheType {
    match checkpoint.dtype("model.embed_tokens.weight") {
        Some(WeightType::F32) | None => CacheType::F32,
        Some(_) => CacheType::F16,
    }
}

/// The GGUF file `path` names: itself when it ends in `.gguf` or is any
/// other file (an ollama blob is named by its digest; the GGUF reader
/// refuses a file without the magic), or the one `.gguf` file of a
/// directory that has no config.json (several are an error listing them).
fn gguf_file(path: &Path) -> std::result::Result<Option<PathBuf>, ReadError> {
    let is_gguf = |p: &Path| p.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    if (is_gguf(path) && !path.is_dir()) || path.is_file() {
        return Ok(Some(path.to_path_buf()));
    }
    if !path.is_dir() || path.join("config.json").exists() {
        return Ok(None);
    }
    let entries = std::fs::read_dir(path).map_err(|e| ReadError::in_file(path.to_path_buf(), e))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| is_gguf(p) && p.is_file())
        .collect();
    files.sort();
    match files.len() {
        0 => Ok(None),
        1 => Ok(files.pop()),
        _ => Err(ReadError::in_file(
            path.to_path_buf(),
            format!(
                "holds {} GGUF files ({}): name one with -m",
                files.len(),
                files
                    .iter()
                    .filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

/// Module names a causal-LM directory holds.
pub const LLM_MODULES: [&str; 1] = ["llm"];

/// The families that are causal language models.
const DECODERS: [Family; 1] = [Family::Llama];

/// A causal language model's directory, checked and opened, with nothing
/// on a device yet.
pub struct ModelDir {
    pub path: PathBuf,
    pub family: Family,
    pub config: ModelConfig,
    pub tokenizer: Tokenizer,
    pub checkpoint: Arc<Checkpoint>,
    /// The type the KV cache keeps keys and values in: by default f32 for
    /// an f32 checkpoint, f16 for 16-bit or quantized weights (as
    /// llama.cpp's default).
    pub cache_type: CacheType,
}

impl ModelDir {
    /// Opens a model directory (config.json, tokenizer.json, safetensors),
    /// or a GGUF file: `path` itself, or the one a directory without a
    /// config.json holds.
    pub fn open(path: &Path) -> Result<Self> {
        if let Some(file) = gguf_file(path)? {
            return Self::open_gguf(&file);
        }
        check_model_dir(path)?;
        if path.join("model_index.json").is_file() {
            return Err(ReadError::Io {
                path: path.to_path_buf(),
                reason: "a diffusers pipeline (model_index.json), which runs through `cleave image`".into(),
            }
            .into());
        }
        let config_path = path.join("config.json");
        let family = Family::of_config(&config_path, &DECODERS)?;
        let config = ModelConfig::from_file(&config_path)?;
        let tokenizer = Tokenizer::from_dir(path, &config.eos_token_ids)?;
        let mut checkpoint = Checkpoint::open(path)?;
        config.adapt(&mut checkpoint);
        let checkpoint = Arc::new(checkpoint);
        config.check_checkpoint(&checkpoint)?;
        Ok(ModelDir {
            path: path.to_path_buf(),
            family,
            cache_type: default_cache_type(&checkpoint),
            config,
            tokenizer,
            checkpoint,
        })
    }

    /// A GGUF file: config and tokenizer from its metadata, tensors by
    /// transformers' names.
    fn open_gguf(file: &Path) -> Result<Self> {
        let gguf = GgufFile::open(file).map_err(ReadError::from)?;
        let mut config = ModelConfig::from_value(file, gguf.hf_config().map_err(ReadError::from)?)?;
        // llama.cpp's converter tiles Qwen3.5's value heads (the only GGUF
        // architecture with linear attention): see `DeltaHeads`.
        if let Some(linear) = &mut config.linear_attention {
            linear.heads.tiled_values = true;
        }
        let tokenizer = gguf.tokenizer().map_err(ReadError::from)?;
        let mut checkpoint = Checkpoint::foreign(Box::new(gguf));
        // Phi-3's q/k/v and gate/up are fused in GGUF as in safetensors.
        config.adapt(&mut checkpoint);
        let checkpoint = Arc::new(checkpoint);
        config.check_checkpoint(&checkpoint)?;
        Ok(ModelDir {
            path: file.to_path_buf(),
            family: Family::Llama,
            cache_type: default_cache_type(&checkpoint),
            config,
            tokenizer,
            checkpoint,
        })
    }

    /// Ids the model has embeddings and logits for.
    pub fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    /// The most positions the model was trained for: the longest context.
    pub fn max_positions(&self) -> usize {
        self.config.max_positions
    }

    /// Its shape in a few words, for `cleave plan`: blocks, hidden width,
    /// vocabulary.
    pub fn describe(&self) -> String {
        let c = &self.config;
        let mut about = format!("{} blocks, hidden {}, vocab {}", c.layers, c.hidden_size, c.vocab_size);
        let linear = (0..c.layers).filter(|&l| c.is_linear(l)).count();
        if linear > 0 {
            let state = cleave_plan::format_bytes(c.recurrent_state_bytes() as u64);
            about += &format!(
                ", {linear} of the blocks Gated DeltaNet layers with a recurrent state of {state} a sequence each \
                 (the others keep a KV cache)"
            );
        }
        if let Some(p) = c.per_layer_inputs {
            let bytes = cleave_plan::format_bytes(c.per_layer_input_bytes(&self.checkpoint));
            about += &format!(
                ", per-layer inputs of {} values a block (their table and projection, {bytes}, beside the embeddings)",
                p.width
            );
        }
        if c.first_kv_shared < c.layers {
            let mut sources: Vec<usize> = (c.first_kv_shared..c.layers).map(|l| c.kv_source(l)).collect();
            sources.sort_unstable();
            sources.dedup();
            let sources: Vec<String> = sources.iter().map(usize::to_string).collect();
            about += &format!(
                ", blocks {}..{} attending over the KV caches of blocks {} (no cache of their own)",
                c.first_kv_shared,
                c.layers,
                sources.join(" and ")
            );
        }
        if c.stored_prefix.is_some() {
            let towers = match c.architecture {
                llama::Architecture::Gemma4 => "vision and audio towers are",
                _ => "vision tower is",
            };
            about += &format!("; the checkpoint's {towers} not loaded (text only)");
        }
        about
    }

    /// What the planner needs to place the `llm` module for one sequence
    /// of `context` positions.
    pub fn inventory(&self, context: usize) -> Inventory {
        self.inventory_for(context, 1)
    }

    /// [`ModelDir::inventory`] with a KV cache for `sequences` sequences
    /// of `context` positions each (a server's parallel slots).
    pub fn inventory_for(&self, context: usize, sequences: usize) -> Inventory {
        let tied = self.config.ties_output_head(&self.checkpoint);
        self.config
            .inventory(context, sequences, tied, &self.checkpoint, self.cache_type)
    }

    /// Uploads the model to `devices` as `plan` places it; `progress` is
    /// told the checkpoint bytes read after each tensor.
    pub fn load<R: Runtime>(
        &self,
        devices: Vec<Placed<R>>,
        plan: Plan,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Box<dyn CausalModel<R>>> {
        self.load_with_lora(devices, plan, &[], LoraMode::Auto, progress)
    }

    /// The LoRA adapter in `dir` (PEFT's layout), its update times
    /// `scale`, opened for this model: updates of fused projections
    /// (Phi-3's `qkv_proj`) split as the model loads their weights, and
    /// every update checked against the layer it names
    /// ([`LoraAdapter::check_targets`]), so that what loading would refuse
    /// is refused before anything is planned.
    pub fn open_adapter(&self, dir: &Path, scale: f32) -> std::result::Result<LoraAdapter, ReadError> {
        let mut adapter = LoraAdapter::open(dir, scale)?;
        self.config.adapt_adapter(&mut adapter)?;
        adapter.check_targets(&self.checkpoint)?;
        Ok(adapter)
    }

    /// [`ModelDir::load`], with LoRA `adapters` (opened by
    /// [`ModelDir::open_adapter`]) applied in `mode`.
    pub fn load_with_lora<R: Runtime>(
        &self,
        devices: Vec<Placed<R>>,
        plan: Plan,
        adapters: &[LoraAdapter],
        mode: LoraMode,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Box<dyn CausalModel<R>>> {
        compiled::run(
            devices,
            Job::Causal {
                dir: self,
                group: None,
                plan,
                lora: (adapters, mode),
                progress,
            },
        )
    }

    /// The checkpoint with `adapters` applied in `mode`, each adapter's
    /// targets checked against it.
    fn weight_source(&self, adapters: &[LoraAdapter], mode: LoraMode) -> Result<WeightSource> {
        for adapter in adapters {
            adapter.check_targets(&self.checkpoint)?;
        }
        Ok(WeightSource::new(self.checkpoint.clone()).with_lora(adapters, mode))
    }

    /// [`ModelDir::load_with_lora`] on a group that may span runtimes
    /// (a CUDA GPU beside a Vulkan one): `first` holds the members of the
    /// group's first runtime slot (with the clients [`DeviceGroup::run`]
    /// gives). Each later slot's part of the model is loaded on its own
    /// runtime: a run of blocks in layer split, to which the part before
    /// hands its activations through the host (see
    /// [`cleave_nn::LaterPart`]); the experts its devices own in expert
    /// split, to which the main part sends their rows through the host.
    pub fn load_on_group<R: Runtime>(
        &self,
        first: Vec<Placed<R>>,
        group: &DeviceGroup,
        plan: Plan,
        lora: (&[LoraAdapter], LoraMode),
        progress: &mut dyn FnMut(u64),
    ) -> Result<Box<dyn CausalModel<R>>> {
        compiled::run(
            first,
            Job::Causal {
                dir: self,
                group: Some(group),
                plan,
                lora,
                progress,
            },
        )
    }

    /// What [`ModelDir::load_on_group`] and, without a group,
    /// [`ModelDir::load_with_lora`] do, compiled in this crate (see
    /// [`compiled`]).
    pub(crate) fn load_here<R: Runtime>(
        &self,
        first: Vec<Placed<R>>,
        group: Option<&DeviceGroup>,
        plan: Plan,
        (adapters, mode): (&[LoraAdapter], LoraMode),
        progress: &mut dyn FnMut(u64),
    ) -> Result<Box<dyn CausalModel<R>>> {
        let slots = group.map(DeviceGroup::slots).unwrap_or_default();
        let Some(group) = group.filter(|_| slots.len() > 1) else {
            let source = self.weight_source(adapters, mode)?;
            return Ok(self.load_part(first, plan, source, Elsewhere::default(), progress)?);
        };
        if !plan.mode.may_span_runtimes() {
            let names = group.names().join("&");
            return Err(ModelError::Device(format!(
                "{} split cannot span runtimes ({names}): its blocks would sum partial results across them; use \
                 --split-mode layer (or expert, for a mixture of experts)",
                plan.mode
            )));
        }
        let source = self.weight_source(adapters, mode)?;
        let parts: Vec<(&Slot, Plan)> = slots
            .iter()
            .map(|slot| (slot, plan.part(slot.members.clone())))
            .collect();
        if plan.places_experts() {
            let mut experts = Vec::new();
            for (slot, part) in &parts[1..] {
                experts.push(slot.group.run(LoadExperts {
                    dir: self,
                    group: &slot.group,
                    plan: part.clone(),
                    source: source.clone(),
                    progress: &mut *progress,
                })?);
            }
            let elsewhere = Elsewhere { next: None, experts };
            return Ok(self.load_part(first, parts[0].1.clone(), source, elsewhere, progress)?);
        }
        if parts[0].1.blocks().is_empty() {
            return Err(ModelError::Device(format!(
                "the plan gives {} none of the model's blocks, so the model cannot start there: leave it out of \
                 the group",
                parts[0].0.group.names().join("&")
            )));
        }
        // A layer reading an earlier layer's KV cache (Gemma 4) runs where
        // that cache is: the caches do not cross runtimes.
        for (_, part) in &parts {
            let blocks = part.blocks();
            let c = &self.config;
            if let Some(i) = blocks.clone().find(|&i| !blocks.contains(&c.kv_source(i))) {
                return Err(ModelError::Input(format!(
                    "layer {i} reads the KV cache of layer {}, which devices of another runtime run: put both on \
                     one runtime's devices",
                    c.kv_source(i)
                )));
            }
        }
        // A slot the plan gives no block holds an empty part, which passes
        // the activations on untouched (or, after the tail, never runs).
        let mut next = None;
        for (slot, part) in parts[1..].iter().rev() {
            next = Some(slot.group.run(LoadPart {
                dir: self,
                group: &slot.group,
                plan: part.clone(),
                source: source.clone(),
                next,
                progress: &mut *progress,
            })?);
        }
        let elsewhere = Elsewhere {
            next,
            experts: Vec::new(),
        };
        Ok(self.load_part(first, parts[0].1.clone(), source, elsewhere, progress)?)
    }

    /// The model, or the part of it that `plan` places, on `devices`, with
    /// the parts on other runtimes that it holds.
    fn load_part<R: Runtime>(
        &self,
        devices: Vec<Placed<R>>,
        plan: Plan,
        source: WeightSource,
        elsewhere: Elsewhere,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Box<LlamaModel<R>>> {
        match self.family {
            Family::Llama => Ok(Box::new(llama::Llama::load(
                devices,
                plan,
                &self.config,
                (source, self.cache_type),
                elsewhere,
                progress,
            )?)),
            other => Err(ModelError::Device(format!("{other:?} is not a causal language model"))),
        }
    }
}

/// Loads a model's part on a later runtime slot of its group, on that
/// slot's runtime.
struct LoadPart<'a> {
    dir: &'a ModelDir,
    group: &'a DeviceGroup,
    plan: Plan,
    source: WeightSource,
    next: Option<Box<dyn LaterPart>>,
    progress: &'a mut dyn FnMut(u64),
}

impl RuntimeTask for LoadPart<'_> {
    type Output = Result<Box<dyn LaterPart>>;

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Self::Output {
        let devices = Placed::group(clients, self.group);
        let elsewhere = Elsewhere {
            next: self.next,
            experts: Vec::new(),
        };
        let part: Box<dyn LaterPart> = self
            .dir
            .load_part(devices, self.plan, self.source, elsewhere, self.progress)?;
        Ok(part)
    }
}

/// Loads the experts a later runtime slot's devices own (expert split),
/// on that slot's runtime.
struct LoadExperts<'a> {
    dir: &'a ModelDir,
    group: &'a DeviceGroup,
    plan: Plan,
    source: WeightSource,
    progress: &'a mut dyn FnMut(u64),
}

impl RuntimeTask for LoadExperts<'_> {
    type Output = Result<Box<dyn ExpertsElsewhere>>;

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Self::Output {
        let devices = Placed::group(clients, self.group);
        let part = ExpertPart::load(devices, self.plan, &self.dir.config, self.source, self.progress)?;
        Ok(Box::new(part))
    }
}
