//! Hugging Face repos: from the local cache when the revision's snapshot
//! there is complete, else downloaded into it.

mod cache;
mod download;
mod files;
mod http;
mod name;

use std::path::PathBuf;

pub use name::HubName;

use crate::error::{Result, SourceError};

/// The local path of `name`'s model: the snapshot folder, or the GGUF file
/// in it. Downloads what is missing unless `offline`.
pub fn locate(name: &HubName, offline: bool, progress: bool) -> Result<PathBuf> {
    let cache = cache::hub_cache().ok_or_else(|| {
        SourceError::io(
            "~/.cache/huggingface/hub",
            "neither HF_HUB_CACHE, HF_HOME nor HOME is set",
        )
    })?;
    let snapshot = cache::snapshot(&cache, name)?;
    let missing = match &snapshot {
        Some(dir) => cache::missing(dir, name)?,
        None => vec![format!("a snapshot of revision '{}'", name.revision)],
    };
    if missing.is_empty() {
        if let Some(dir) = snapshot {
            return Ok(local_path(dir, name));
        }
    }
    if offline {
        return Err(SourceError::Offline {
            repo: name.repo.clone(),
            cache,
            missing: missing.join(", "),
        });
    }
    let waits = download::Waits::from_env()?;
    download::Hub::new(&cache, &cache::endpoint(), cache::token()?, waits, progress)?.fetch(name)
}

/// What a complete snapshot opens as: the GGUF file its quant names, or
/// the folder.
fn local_path(dir: PathBuf, name: &HubName) -> PathBuf {
    match &name.quant {
        Some(quant) => match files::pick_gguf(&name.repo, &cache::gguf_files(&dir), quant) {
            Ok(file) => dir.join(file),
            Err(_) => dir,
        },
        None => dir,
    }
}
