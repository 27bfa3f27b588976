//! Reading the diffusers/transformers JSON config files that sit beside each pipeline component.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

/// A config file that could not be read or parsed, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot parse {path}: {source}")]
    Parse { path: PathBuf, source: serde_json::Error },
}

/// Parses a JSON file into `T`. Unknown keys are ignored, as diffusers ignores them too (configs
/// carry `_class_name`, `_diffusers_version` and options of other versions).
pub(crate) fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T, ConfigFileError> {
    let text = cleave_hf::read_regular_to_string(path).map_err(|source| ConfigFileError::Read {
        path: path.into(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| ConfigFileError::Parse {
        path: path.into(),
        source,
    })
}
