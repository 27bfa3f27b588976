use std::path::PathBuf;

use thiserror::Error;

/// Everything that can be wrong with a GGUF file. Each message names the
/// file and the part of it at fault (the key, the tensor).
#[derive(Debug, Error)]
pub enum GgufError {
    #[error("{path}: {reason}")]
    Io { path: PathBuf, reason: String },
    #[error("{path}: not a GGUF file: it starts with {found:02x?}, not \"GGUF\" (47 47 55 46)")]
    Magic { path: PathBuf, found: Vec<u8> },
    #[error("{path}: GGUF version {version} is not supported (cleave reads version 3)")]
    Version { path: PathBuf, version: u32 },
    #[error("{path}: {part} runs past the end of the file (needs {needed} bytes, {left} left): truncated or damaged")]
    Truncated {
        path: PathBuf,
        part: String,
        needed: u64,
        left: u64,
    },
    #[error("{path}: {part}: {reason}")]
    Malformed {
        path: PathBuf,
        part: String,
        reason: String,
    },
    #[error("{path}: tensor '{name}': {reason}")]
    Tensor {
        path: PathBuf,
        name: String,
        reason: String,
    },
    #[error("{path}: tensor '{name}' has {}, which cleave cannot read (supported: {})", type_label(*.id, .known), supported_types())]
    TensorType {
        path: PathBuf,
        name: String,
        id: u32,
        known: Option<&'static str>,
    },
    #[error("{path}: tensor '{name}' is missing")]
    MissingTensor { path: PathBuf, name: String },
    #[error("{path}: missing metadata key '{key}'")]
    MissingKey { path: PathBuf, key: String },
    #[error("{path}: metadata key '{key}' holds {found}, expected {expected}")]
    KeyType {
        path: PathBuf,
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("{path}: metadata key '{key}': {reason}")]
    KeyValue { path: PathBuf, key: String, reason: String },
    #[error("{path}: architecture '{found}' is not supported (supported: {})", crate::ARCHITECTURES.join(", "))]
    Architecture { path: PathBuf, found: String },
    #[error("{path}: cannot build the tokenizer: {reason}")]
    Tokenizer { path: PathBuf, reason: String },
    #[error("dequantizing {ty}: {reason}")]
    Blocks { ty: &'static str, reason: String },
}

/// The names of every type cleave reads.
fn supported_types() -> String {
    cleave_types::WeightType::ALL.map(|t| t.name()).join(", ")
}

fn type_label(id: u32, known: &Option<&'static str>) -> String {
    match known {
        Some(name) => format!("ggml type {name} (id {id})"),
        None => format!("unknown ggml type id {id}"),
    }
}

pub type Result<T> = std::result::Result<T, GgufError>;
