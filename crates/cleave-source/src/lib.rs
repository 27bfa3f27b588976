//! Where a model named on the command line lies on disk. `-m` takes a
//! path; failing that, `ollama:NAME[:TAG]` (ollama's local store) or
//! `org/name[@revision][:quant]` (a Hugging Face repo, from the local
//! cache, downloaded into it when missing).

mod error;
mod hub;
mod ollama;
mod small_file;

use std::path::{Path, PathBuf};

pub use error::{Result, SourceError};
pub use hub::HubName;
pub use ollama::{OllamaModel, OllamaName, OllamaParams};

/// Where a model was found.
#[derive(Clone, Debug)]
pub enum Origin {
    /// The path as given.
    Path,
    /// A Hugging Face repo, in the hub cache.
    Hub(HubName),
    /// An ollama model, with what its manifest sets besides the weights.
    Ollama(OllamaModel),
}

/// A model spec made a local path that the model readers open.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub path: PathBuf,
    pub origin: Origin,
}

/// How a name may be resolved.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Never reach the network: a repo missing from the cache is an error.
    pub offline: bool,
    /// Draw a progress bar on stderr for each file downloaded.
    pub progress: bool,
}

const OLLAMA_PREFIX: &str = "ollama:";

/// The local path `spec` names: an existing path as it is, an ollama
/// model's GGUF blob, or a Hugging Face repo's snapshot folder (or GGUF
/// file). A spec that is none of these is an error saying so.
pub fn resolve(spec: &str, options: Options) -> Result<Resolved> {
    if Path::new(spec).exists() {
        return Ok(Resolved {
            path: spec.into(),
            origin: Origin::Path,
        });
    }
    if let Some(name) = spec.strip_prefix(OLLAMA_PREFIX) {
        let model = ollama::find(&ollama::store_dir()?, name)?;
        return Ok(Resolved {
            path: model.gguf.clone(),
            origin: Origin::Ollama(model),
        });
    }
    if let Some(name) = HubName::parse(spec) {
        let path = hub::locate(&name, options.offline, options.progress)?;
        return Ok(Resolved {
            path,
            origin: Origin::Hub(name),
        });
    }
    Err(SourceError::Unrecognized { spec: spec.into() })
}
