use std::path::PathBuf;

use thiserror::Error;

/// Everything that can keep a model name from becoming a local path. Each
/// message names the model, and the file, field or address at fault.
#[derive(Debug, Error)]
pub enum SourceError {
    #[error(
        "no file or directory {spec}, and '{spec}' is not a Hugging Face repo name \
         (org/name[@revision][:quant]) or an ollama model (ollama:name[:tag])"
    )]
    Unrecognized { spec: String },
    #[error("{path}: {reason}")]
    Io { path: PathBuf, reason: String },

    // The Hugging Face hub and its cache.
    #[error(
        "{repo} is not complete in the Hugging Face cache {cache} (missing: {missing}), \
         and --offline (or HF_HUB_OFFLINE) forbids downloading it"
    )]
    Offline {
        repo: String,
        cache: PathBuf,
        missing: String,
    },
    #[error(
        "{repo} needs a token: set HF_TOKEN (or log in with `hf auth login`); {endpoint} answered {status}{detail}"
    )]
    Unauthorized {
        repo: String,
        endpoint: String,
        status: u16,
        detail: String,
    },
    #[error("{repo}: no such repository or revision on {endpoint}{detail}")]
    NotFound {
        repo: String,
        endpoint: String,
        detail: String,
    },
    #[error("{repo}: {endpoint} answered {status} to {url}")]
    Status {
        repo: String,
        endpoint: String,
        status: u16,
        url: String,
    },
    #[error("{repo}: cannot reach the hub at {endpoint}: {reason}")]
    Network {
        repo: String,
        endpoint: String,
        reason: String,
    },
    #[error("{repo}: the hub's listing of its files is not what cleave expects: {reason}")]
    Listing { repo: String, reason: String },
    #[error("{repo}: downloading {file}: {reason}")]
    Download { repo: String, file: String, reason: String },
    #[error("{repo}: {reason}")]
    Weights { repo: String, reason: String },

    // The ollama store.
    #[error("ollama model {name}: no manifest {path} (pull it with `ollama pull {name}`, or set OLLAMA_MODELS to the store)")]
    NoManifest { name: String, path: PathBuf },
    #[error("ollama model {name} has no tag '{tag}' in {dir} (it has: {tags})")]
    UnknownTag {
        name: String,
        tag: String,
        dir: PathBuf,
        tags: String,
    },
    #[error("'{spec}' is not an ollama model name: {reason}")]
    OllamaName { spec: String, reason: String },
    #[error("ollama manifest {path}: {reason}")]
    Manifest { path: PathBuf, reason: String },
    #[error("ollama blob {path}: {reason}")]
    Blob { path: PathBuf, reason: String },
}

impl SourceError {
    pub(crate) fn io(path: impl Into<PathBuf>, error: impl std::fmt::Display) -> Self {
        SourceError::Io {
            path: path.into(),
            reason: error.to_string(),
        }
    }
}

pub type Result<T> = std::result::Result<T, SourceError>;
