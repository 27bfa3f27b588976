use std::path::{Path, PathBuf};

use thiserror::Error;

/// Everything that can be wrong with the files of a model directory.
#[derive(Debug, Error)]
pub enum ReadError {
    #[error("{path}: {reason}")]
    Io { path: PathBuf, reason: String },
    /// A file of another format (GGUF), whose reader's message names the
    /// file and the fault.
    #[error("{0}")]
    Foreign(String),
    #[error("{path}: invalid JSON: {reason}")]
    Json { path: PathBuf, reason: String },
    /// Valid JSON with a value of the wrong kind (a string for a count).
    #[error("{path}: field '{field}': {reason}")]
    JsonValue {
        path: PathBuf,
        field: String,
        reason: String,
    },
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
    #[error("LoRA adapter {path}: {reason}")]
    Adapter { path: PathBuf, reason: String },
    #[error("{path}: cannot load the tokenizer: {reason}")]
    Tokenizer { path: PathBuf, reason: String },
    #[error("tokenizing failed: {0}")]
    Encode(String),
}

impl ReadError {
    /// An error of a file's own reader (a pipeline component's config or
    /// tokenizer), naming the file.
    pub fn in_file(path: PathBuf, error: impl std::fmt::Display) -> Self {
        ReadError::Io {
            path,
            reason: error.to_string(),
        }
    }
}

pub type Result<T> = std::result::Result<T, ReadError>;

/// Reads a file, which must be a regular one, naming it in the error.
pub fn read_to_string(path: &Path) -> Result<String> {
    crate::file::read_regular_to_string(path).map_err(|e| ReadError::in_file(path.to_path_buf(), e))
}

/// Parses JSON from a file, naming it in the error, and the field whose
/// value is of the wrong kind.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = read_to_string(path)?;
    let invalid = |e: serde_json::Error| ReadError::Json {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let mut reader = serde_json::Deserializer::from_str(&text);
    let value = serde_path_to_error::deserialize(&mut reader).map_err(|e| {
        let field = e.path().to_string();
        match e.into_inner() {
            e if e.classify() == serde_json::error::Category::Data && field != "." => ReadError::JsonValue {
                path: path.to_path_buf(),
                field,
                reason: e.to_string(),
            },
            e => invalid(e),
        }
    })?;
    reader.end().map_err(invalid)?;
    Ok(value)
}
