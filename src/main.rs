//! The `cleave` command line.

mod commands;
mod output;
mod parse;
mod setup;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

/// The built-in demo model, shipped in the repository.
const DEMO_MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/models/fortune-llama-3m");

#[derive(Parser)]
#[command(
    name = "cleave",
    version,
    about = "Run transformer models on every accelerator this machine has"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it to stdout.
    Run(commands::run::RunArgs),
    /// Print the logits of every position of a token sequence, as JSON.
    Logits(commands::logits::LogitsArgs),
    /// List the compute devices this machine has.
    Devices(commands::devices::DevicesArgs),
    /// Show where each part of a model would go, without loading it.
    Plan(commands::plan::PlanArgs),
    /// Embed sentences with an encoder (BERT, sentence-transformers layout).
    Embed(commands::embed::EmbedArgs),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(commands::serve::ServeArgs),
    /// Generate an image from a prompt with a FLUX.1 pipeline.
    Image(commands::image::ImageArgs),
    /// Measure a language model's prompt and generation speed (tok/s), as
    /// llama-bench does.
    Bench(commands::bench::BenchArgs),
    /// Renders one chat template request from stdin: the child process in
    /// which `cleave serve` renders each conversation, under the memory
    /// limit (bytes) and CPU seconds it is given. Not for users.
    #[command(name = "render-chat", hide = true)]
    RenderChat { memory: u64, cpu_seconds: u64 },
}

/// Which devices a model runs on: shared by every command that places one.
#[derive(clap::Args, Clone, Debug)]
pub struct PlacementArgs {
    /// Devices to run on, as `cleave devices` names them: `vulkan0`,
    /// `llm=cuda0&cuda1` (a layer split), `vulkan0:64MiB&vulkan0:64MiB`
    /// (two capped logical devices on one adapter). Default: the best device.
    #[arg(long, env = "CLEAVE_BACKEND")]
    pub backend: Option<String>,
    /// Share of the blocks each device of the group takes, e.g. `3,1`
    /// (default: in proportion to each device's memory).
    #[arg(long = "tensor-split", value_delimiter = ',', allow_hyphen_values = true, value_parser = parse::non_negative)]
    pub tensor_split: Option<Vec<f64>>,
    /// How to divide the model: `layer` (ranges of blocks per device), `row`
    /// (big matmul weights sliced by rows), `tensor` (attention heads and
    /// MLP columns per device, with all-reduce), `expert` (a mixture's
    /// experts per device, the rest on the main device). Default: layer, or
    /// expert when --expert-cache is given.
    #[arg(long = "split-mode", value_enum)]
    pub split_mode: Option<SplitModeArg>,
    /// Row split: weights with fewer rows or columns than this stay whole.
    #[arg(long = "row-split-min", default_value_t = 256, allow_negative_numbers = true, value_parser = parse::count::<usize>)]
    pub row_split_min: usize,
    /// Row and tensor split: which member of the group (0-based) is the
    /// main device, holding the embeddings, norms and output head.
    #[arg(long = "main-gpu", default_value_t = 0, allow_negative_numbers = true, value_parser = parse::count::<usize>)]
    pub main_gpu: usize,
    /// Where block weights live when the devices are short of memory:
    /// `auto` streams as few blocks as needed from the host, `device`
    /// refuses to, `host` and `disk` stream blocks from a copy in memory or
    /// from the mapped file (every block, unless --stream-layers says how many).
    #[arg(long, value_enum, default_value_t)]
    pub residency: ResidencyArg,
    /// Stream this many blocks (the last ones) instead of keeping them on
    /// the devices (layer split).
    #[arg(long = "stream-layers", allow_negative_numbers = true, value_parser = parse::count::<usize>)]
    pub stream_layers: Option<usize>,
    /// Expert split: keep at most N of each block's experts on each device
    /// and upload the others from the host when the router picks them,
    /// evicting the least recently used (default: as many as fit).
    #[arg(long = "expert-cache", value_name = "N", value_parser = parse::expert_cache, allow_negative_numbers = true)]
    pub expert_cache: Option<usize>,
    /// MiB to leave free on each device whose memory its backend reports
    /// (`cleave devices`), on top of the model's compute buffers (and, on
    /// CUDA, of cuBLAS's workspace) [default: 1024 where free memory is
    /// measured (CUDA, Vulkan's memory budget), 0 where only a heap's size
    /// is known].
    #[arg(long = "fit-target", value_name = "MIB", allow_negative_numbers = true, value_parser = parse::count::<u64>)]
    pub fit_target: Option<u64>,
    /// The logical devices that other groups of this process open (one name
    /// each), whose memory this group's devices share: set by `cleave
    /// serve` for each of its groups, not a flag.
    #[arg(skip)]
    pub elsewhere: Vec<String>,
    /// Bytes another model of this process holds on a device, by the
    /// device's name (a draft model's): set by `cleave run`, not a flag.
    #[arg(skip)]
    pub taken: Vec<(String, u64)>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ResidencyArg {
    #[default]
    Auto,
    Device,
    Host,
    Disk,
}

impl From<ResidencyArg> for cleave_plan::Residency {
    fn from(residency: ResidencyArg) -> Self {
        match residency {
            ResidencyArg::Auto => cleave_plan::Residency::Auto,
            ResidencyArg::Device => cleave_plan::Residency::Device,
            ResidencyArg::Host => cleave_plan::Residency::Host,
            ResidencyArg::Disk => cleave_plan::Residency::Disk,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, ValueEnum)]
pub enum LoraModeArg {
    #[default]
    Auto,
    Direct,
    Runtime,
}

impl From<LoraModeArg> for cleave_hf::LoraMode {
    fn from(mode: LoraModeArg) -> Self {
        match mode {
            LoraModeArg::Auto => cleave_hf::LoraMode::Auto,
            LoraModeArg::Direct => cleave_hf::LoraMode::Direct,
            LoraModeArg::Runtime => cleave_hf::LoraMode::Runtime,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, ValueEnum)]
pub enum SplitModeArg {
    #[default]
    Layer,
    Row,
    Tensor,
    Expert,
}

impl From<SplitModeArg> for cleave_plan::SplitMode {
    fn from(mode: SplitModeArg) -> Self {
        match mode {
            SplitModeArg::Layer => cleave_plan::SplitMode::Layer,
            SplitModeArg::Row => cleave_plan::SplitMode::Row,
            SplitModeArg::Tensor => cleave_plan::SplitMode::Tensor,
            SplitModeArg::Expert => cleave_plan::SplitMode::Expert,
        }
    }
}

/// How a model that `-m` names rather than points to is found.
#[derive(clap::Args, Clone, Debug)]
pub struct SourceArgs {
    /// Never download: a Hugging Face repo named by -m must be complete in
    /// the local cache (HF_HUB_OFFLINE takes 1, true, yes or on).
    #[arg(long, env = "HF_HUB_OFFLINE", value_parser = clap::builder::BoolishValueParser::new())]
    pub offline: bool,
}

/// Where a language model comes from and where it runs.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// Model directory in Hugging Face layout (config.json, tokenizer.json,
    /// model.safetensors or shards), or a GGUF file; or a name: a Hugging
    /// Face repo `org/name[@revision][:quant]` (from the local cache,
    /// downloaded when missing) or `ollama:name[:tag]`. Default: the
    /// built-in demo model.
    #[arg(short = 'm', long = "model", default_value = DEMO_MODEL)]
    pub model: PathBuf,
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub placement: PlacementArgs,
    /// A LoRA adapter in PEFT layout, optionally scaled: `DIR` or
    /// `DIR:0.5`. Repeat for several.
    #[arg(long = "lora", value_name = "DIR[:SCALE]")]
    pub lora: Vec<String>,
    /// `direct` merges adapters into the weights at load, `runtime` applies
    /// them at every matmul, `auto` does runtime for weights split across
    /// devices and direct otherwise.
    #[arg(long = "lora-mode", value_enum, default_value_t)]
    pub lora_mode: LoraModeArg,
    /// Context size in tokens (default: the model's, at most 4096).
    #[arg(short = 'c', long = "ctx-size", allow_negative_numbers = true, value_parser = parse::count::<usize>)]
    pub ctx_size: Option<usize>,
    /// The KV cache's type: `f16` halves its memory, `f32` keeps keys and
    /// values exact (default: f32 for f32 weights, f16 for 16-bit or
    /// quantized ones, as llama.cpp's `-ctk/-ctv f16`).
    #[arg(long = "cache-type", value_enum)]
    pub cache_type: Option<CacheTypeArg>,
    /// Prefill products: `fast` rounds their inputs to the weights' 16-bit
    /// type and accumulates in f32, on matrix units where the device has
    /// them (as transformers and llama.cpp do on GPUs); `exact` multiplies
    /// f32 inputs. Default: fast on devices with matrix units, else exact.
    #[arg(long = "precision", value_enum, env = "CLEAVE_PRECISION")]
    pub precision: Option<PrecisionArg>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PrecisionArg {
    Fast,
    Exact,
}

impl From<PrecisionArg> for cleave_shaders::Precision {
    fn from(precision: PrecisionArg) -> Self {
        match precision {
            PrecisionArg::Fast => cleave_shaders::Precision::Fast,
            PrecisionArg::Exact => cleave_shaders::Precision::Exact,
        }
    }
}

/// How a prompt goes through the model.
#[derive(clap::Args, Clone, Debug)]
pub struct PrefillArgs {
    /// Prompt tokens one forward pass takes; a longer prompt goes in
    /// chunks (0: all at once). `cleave serve` runs the other sequences'
    /// decode steps between a new prompt's chunks.
    #[arg(long = "prefill-chunk", value_name = "TOKENS", default_value_t = cleave_engine::PrefillChunk::DEFAULT_TOKENS, allow_negative_numbers = true, value_parser = parse::count::<usize>)]
    pub prefill_chunk: usize,
}

impl PrefillArgs {
    pub fn chunk(&self) -> cleave_engine::PrefillChunk {
        cleave_engine::PrefillChunk::new(self.prefill_chunk)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CacheTypeArg {
    F32,
    F16,
}

impl From<CacheTypeArg> for cleave_nn::CacheType {
    fn from(cache: CacheTypeArg) -> Self {
        match cache {
            CacheTypeArg::F32 => cleave_nn::CacheType::F32,
            CacheTypeArg::F16 => cleave_nn::CacheType::F16,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, ValueEnum)]
pub enum Format {
    #[default]
    Text,
    Json,
}

/// Which flags of a command the user gave (on the command line or in the
/// environment), as opposed to their defaults: what a model's own
/// defaults (an ollama model's parameters) may not override.
pub struct Given<'a>(Option<&'a clap::ArgMatches>);

impl Given<'_> {
    pub fn by_user(&self, id: &str) -> bool {
        use clap::parser::ValueSource;
        let source = self
            .0
            .and_then(|m| m.try_get_raw(id).ok().flatten().and_then(|_| m.value_source(id)));
        matches!(source, Some(ValueSource::CommandLine | ValueSource::EnvVariable))
    }
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let result = match cli.command {
        Command::Run(args) => commands::run::run(args, Given(matches.subcommand_matches("run"))),
        Command::Logits(args) => commands::logits::run(args),
        Command::Devices(args) => commands::devices::run(args),
        Command::Plan(args) => commands::plan::run(args),
        Command::Embed(args) => commands::embed::run(args),
        Command::Serve(args) => commands::serve::run(args),
        Command::Image(args) => commands::image::run(args),
        Command::Bench(args) => commands::bench::run(args),
        Command::RenderChat { memory, cpu_seconds } => return cleave_server::render_chat_command(memory, cpu_seconds),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of stdout went away (`| head`): nothing is wrong.
        Err(e) if output::is_closed_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
