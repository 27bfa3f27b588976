use std::path::PathBuf;

use cleave_plan::format_bytes;
use thiserror::Error;

/// Everything that can be wrong with a model directory or a run on it.
#[derive(Debug, Error)]
pub enum ModelError {
    #[error("{path}: {reason}")]
    Io { path: PathBuf, reason: String },
    #[error("{path}: invalid JSON: {reason}")]
    Json { path: PathBuf, reason: String },
    #[error("{path}: field '{field}': {reason}")]
    Config {
        path: PathBuf,
        field: &'static str,
        reason: String,
    },
    #[error("{path}: unsupported architecture '{found}' (supported: {supported})")]
    Architecture {
        path: PathBuf,
        found: String,
        supported: String,
    },
    #[error("{path}: not a valid safetensors file: {reason}")]
    Safetensors { path: PathBuf, reason: String },
    #[error("{dir}: no weights found (expected model.safetensors, or model.safetensors.index.json with its shards; diffusers: diffusion_pytorch_model.*)")]
    NoWeights { dir: PathBuf },
    #[error("tensor '{name}' is missing from the checkpoint in {dir}")]
    MissingTensor { name: String, dir: PathBuf },
    #[error("tensor '{name}' in {path} has shape {got:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        path: PathBuf,
        got: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("tensor '{name}' in {path} has dtype {dtype}, which cleave cannot load (supported: F32, F16, BF16)")]
    TensorDtype { name: String, path: PathBuf, dtype: String },
    #[error("{path}: cannot load the tokenizer: {reason}")]
    Tokenizer { path: PathBuf, reason: String },
    #[error("tokenizing failed: {0}")]
    Encode(String),
    #[error("the prompt is {tokens} tokens, but the context holds {context} (raise -c/--ctx-size, at most {max})")]
    PromptTooLong { tokens: usize, context: usize, max: usize },
    #[error("the prompt is empty: nothing to run")]
    EmptyPrompt,
    #[error("token id {id} is outside the vocabulary (size {vocab})")]
    TokenId { id: u32, vocab: usize },
    #[error("the latents hold {got} values, expected {channels} channels of {height}x{width} ({expected}), and neither side may be 0")]
    LatentShape {
        got: usize,
        channels: usize,
        height: usize,
        width: usize,
        expected: usize,
    },
    #[error(
        "out of memory on {device}: {what} needs {} more, {} of its {} cap already in use",
        format_bytes(*.needed), format_bytes(*.in_use), format_bytes(*.cap)
    )]
    OutOfMemory {
        device: String,
        what: String,
        needed: u64,
        in_use: u64,
        cap: u64,
    },
    #[error("invalid model input: {0}")]
    Input(String),
    #[error("device error: {0}")]
    Device(String),
    #[error(transparent)]
    Plan(#[from] cleave_plan::PlanError),
    #[error(transparent)]
    Kernel(#[from] cleave_shaders::KernelError),
}

impl ModelError {
    /// An error of a file's own reader (a pipeline component's config or
    /// tokenizer), naming the file.
    pub fn in_file(path: PathBuf, error: impl std::fmt::Display) -> Self {
        ModelError::Io {
            path,
            reason: error.to_string(),
        }
    }
}

pub type Result<T> = std::result::Result<T, ModelError>;

/// Reads a file, naming it in the error.
pub(crate) fn read_to_string(path: &std::path::Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| ModelError::Io {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// Parses JSON from a file, naming it in the error.
pub(crate) fn read_json<T: serde::de::DeserializeOwned>(path: &std::path::Path) -> Result<T> {
    serde_json::from_str(&read_to_string(path)?).map_err(|e| ModelError::Json {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}
