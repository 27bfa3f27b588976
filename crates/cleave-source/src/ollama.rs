//! ollama's local store: `manifests/HOST/NAMESPACE/NAME/TAG` (JSON listing
//! the model's layers by digest) and `blobs/sha256-HEX` (the layers). The
//! model layer is a GGUF file; the parameters layer is JSON; the template
//! layer is a Go template, which cleave does not render.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Result, SourceError};
use crate::small_file;

const DEFAULT_HOST: &str = "registry.ollama.ai";
const DEFAULT_NAMESPACE: &str = "library";
const DEFAULT_TAG: &str = "latest";

const MODEL_LAYER: &str = "application/vnd.ollama.image.model";
const PARAMS_LAYER: &str = "application/vnd.ollama.image.params";
const TEMPLATE_LAYER: &str = "application/vnd.ollama.image.template";

/// Manifests and parameter layers are a few hundred bytes; anything past
/// this is not one.
const MAX_JSON_BYTES: u64 = 1 << 20;

/// `NAME[:TAG]`, `NAMESPACE/NAME[:TAG]` or `HOST/NAMESPACE/NAME[:TAG]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OllamaName {
    pub host: String,
    pub namespace: String,
    pub model: String,
    pub tag: String,
}

impl OllamaName {
    pub fn parse(name: &str) -> Result<Self> {
        let invalid = |reason: &str| SourceError::OllamaName {
            spec: format!("ollama:{name}"),
            reason: reason.to_string(),
        };
        let (path, tag) = match name.rsplit_once(':') {
            Some((path, tag)) => (path, tag),
            None => (name, DEFAULT_TAG),
        };
        let parts: Vec<&str> = path.split('/').collect();
        let (host, namespace, model) = match parts.as_slice() {
            [model] => (DEFAULT_HOST, DEFAULT_NAMESPACE, *model),
            [namespace, model] => (DEFAULT_HOST, *namespace, *model),
            [host, namespace, model] => (*host, *namespace, *model),
            _ => {
                return Err(invalid(
                    "expected NAME, NAMESPACE/NAME or HOST/NAMESPACE/NAME, then :TAG",
                ))
            }
        };
        for part in [host, namespace, model, tag] {
            let allowed = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
            if part.is_empty() || part.starts_with('.') || !part.chars().all(allowed) {
                return Err(invalid(&format!(
                    "'{part}' is not a name part (letters, digits, '.', '_', '-'; not starting with '.')"
                )));
            }
        }
        Ok(OllamaName {
            host: host.into(),
            namespace: namespace.into(),
            model: model.into(),
            tag: tag.into(),
        })
    }

    /// The name as `ollama list` shows it.
    pub fn display(&self) -> String {
        let mut name = self.model.clone();
        if self.namespace != DEFAULT_NAMESPACE || self.host != DEFAULT_HOST {
            name = format!("{}/{name}", self.namespace);
        }
        if self.host != DEFAULT_HOST {
            name = format!("{}/{name}", self.host);
        }
        format!("{name}:{}", self.tag)
    }

    fn manifest_dir(&self, store: &Path) -> PathBuf {
        store
            .join("manifests")
            .join(&self.host)
            .join(&self.namespace)
            .join(&self.model)
    }
}

/// The store: `OLLAMA_MODELS`, else `~/.ollama/models`.
pub fn store_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("OLLAMA_MODELS").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".ollama").join("models")),
        None => Err(SourceError::io(
            "~/.ollama/models",
            "HOME is not set: set OLLAMA_MODELS",
        )),
    }
}

#[derive(Deserialize)]
struct Manifest {
    layers: Vec<Layer>,
}

#[derive(Deserialize)]
struct Layer {
    #[serde(rename = "mediaType")]
    media_type: String,
    digest: String,
    size: u64,
}

/// What an ollama model's parameters layer sets, as `ollama show
/// --parameters` lists it. The values cleave has flags for are kept as
/// written, for the flags' own parsers to judge (a `top_k` of -1 or a
/// `num_ctx` of 0 is refused by name there, not lost to a type here); the
/// others are kept to be reported.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct OllamaParams {
    #[serde(default)]
    pub stop: Vec<String>,
    pub temperature: Option<serde_json::Value>,
    pub top_k: Option<serde_json::Value>,
    pub top_p: Option<serde_json::Value>,
    pub num_ctx: Option<serde_json::Value>,
    pub num_predict: Option<serde_json::Value>,
    pub seed: Option<serde_json::Value>,
    pub repeat_penalty: Option<serde_json::Value>,
    pub frequency_penalty: Option<serde_json::Value>,
    pub presence_penalty: Option<serde_json::Value>,
    pub repeat_last_n: Option<serde_json::Value>,
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// An ollama model found in the store.
#[derive(Clone, Debug)]
pub struct OllamaModel {
    /// The GGUF blob.
    pub gguf: PathBuf,
    /// Boxed: its values, kept as written, would make every [`crate::Origin`]
    /// several times the size of the others.
    pub params: Box<OllamaParams>,
    /// Whether the manifest has a template layer (which cleave leaves
    /// unused: the GGUF's own chat template is used).
    pub has_template: bool,
}

/// The model `name` (what follows `ollama:`) names in `store`.
pub fn find(store: &Path, name: &str) -> Result<OllamaModel> {
    let name = OllamaName::parse(name)?;
    let dir = name.manifest_dir(store);
    let manifest_path = dir.join(&name.tag);
    // Anything at the tag's path is its manifest, whatever its kind
    // (`read_small_json` names a FIFO or a folder there).
    if matches!(manifest_path.try_exists(), Ok(false)) {
        if dir.is_dir() {
            let tags = tags(&dir);
            return Err(SourceError::UnknownTag {
                name: name.display(),
                tag: name.tag.clone(),
                tags: if tags.is_empty() {
                    "none".into()
                } else {
                    tags.join(", ")
                },
                dir,
            });
        }
        return Err(SourceError::NoManifest {
            name: name.display(),
            path: manifest_path,
        });
    }
    let manifest: Manifest = read_small_json(&manifest_path).map_err(|reason| SourceError::Manifest {
        path: manifest_path.clone(),
        reason,
    })?;
    let layer = |media_type: &str| manifest.layers.iter().find(|l| l.media_type == media_type);
    let model = layer(MODEL_LAYER).ok_or_else(|| SourceError::Manifest {
        path: manifest_path.clone(),
        reason: format!("no layer of type {MODEL_LAYER}"),
    })?;
    let gguf = blob(store, &manifest_path, model)?;
    check_gguf(&gguf)?;
    let params = match layer(PARAMS_LAYER) {
        Some(params) => {
            let path = blob(store, &manifest_path, params)?;
            read_small_json(&path).map_err(|reason| SourceError::Blob { path, reason })?
        }
        None => OllamaParams::default(),
    };
    Ok(OllamaModel {
        gguf,
        params: Box::new(params),
        has_template: layer(TEMPLATE_LAYER).is_some(),
    })
}

/// The tags a model's manifest directory holds, sorted.
fn tags(dir: &Path) -> Vec<String> {
    let mut tags: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter(|e| e.path().is_file())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    tags.sort();
    tags
}

/// A layer's blob, a regular file of the size the manifest gives.
fn blob(store: &Path, manifest: &Path, layer: &Layer) -> Result<PathBuf> {
    let hex = layer
        .digest
        .strip_prefix("sha256:")
        .filter(|hex| hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit()))
        .ok_or_else(|| SourceError::Manifest {
            path: manifest.to_path_buf(),
            reason: format!("layer digest '{}' is not sha256:<64 hex digits>", layer.digest),
        })?;
    let path = store.join("blobs").join(format!("sha256-{hex}"));
    let metadata = std::fs::metadata(&path).map_err(|e| SourceError::Blob {
        path: path.clone(),
        reason: format!("{e} (listed by {} as {})", manifest.display(), layer.media_type),
    })?;
    if !metadata.is_file() {
        return Err(SourceError::Blob {
            reason: small_file::not_a_file(&metadata),
            path,
        });
    }
    if metadata.len() != layer.size {
        return Err(SourceError::Blob {
            reason: format!(
                "{} bytes, but {} says {} (an interrupted pull? run `ollama pull` again)",
                metadata.len(),
                manifest.display(),
                layer.size
            ),
            path,
        });
    }
    Ok(path)
}

/// The model layer must be GGUF: ollama also stores other formats under
/// the same media type in old pulls.
fn check_gguf(path: &Path) -> Result<()> {
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .map_err(|e| SourceError::Blob {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    if &magic != b"GGUF" {
        return Err(SourceError::Blob {
            path: path.to_path_buf(),
            reason: format!("the model layer is not a GGUF file (it starts with {magic:02x?})"),
        });
    }
    Ok(())
}

/// A JSON file of at most `MAX_JSON_BYTES`.
fn read_small_json<T: serde::de::DeserializeOwned>(path: &Path) -> std::result::Result<T, String> {
    let bytes = small_file::read(path, MAX_JSON_BYTES).map_err(|e| e.to_string())?;
    serde_json::from_slice(&bytes).map_err(|e| format!("invalid JSON: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_take_the_default_namespace_host_and_tag() {
        let name = OllamaName::parse("llama3.2").unwrap();
        assert_eq!(
            (
                name.host.as_str(),
                name.namespace.as_str(),
                name.model.as_str(),
                name.tag.as_str()
            ),
            ("registry.ollama.ai", "library", "llama3.2", "latest")
        );
        let name = OllamaName::parse("user/tiny:q8").unwrap();
        assert_eq!((name.namespace.as_str(), name.tag.as_str()), ("user", "q8"));
        let name = OllamaName::parse("hf.co/org/model:Q4_K_M").unwrap();
        assert_eq!(name.host, "hf.co");
        assert_eq!(name.display(), "hf.co/org/model:Q4_K_M");
    }

    #[test]
    fn names_that_would_leave_the_store_are_refused() {
        for bad in ["../x", "a/../b", "a/b/c/d", "x:", "", "x:../y", ".hidden"] {
            assert!(OllamaName::parse(bad).is_err(), "{bad}");
        }
    }

    /// What `find` says of `tiny` when its manifest is `make` at its path,
    /// under a deadline: a FIFO that were opened would block forever.
    #[cfg(unix)]
    fn manifest_error(make: impl FnOnce(&Path)) -> String {
        let store = tempfile::tempdir().unwrap();
        let dir = store.path().join("manifests/registry.ollama.ai/library/tiny");
        std::fs::create_dir_all(&dir).unwrap();
        make(&dir.join("latest"));
        let root = store.path().to_path_buf();
        let (send, receive) = std::sync::mpsc::channel();
        std::thread::spawn(move || send.send(find(&root, "tiny").map(|_| ())));
        let found = receive
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("find blocked on the manifest");
        found.unwrap_err().to_string()
    }

    #[cfg(unix)]
    #[test]
    fn a_manifest_that_is_no_file_is_named_by_its_kind_and_never_opened() {
        let fifo = manifest_error(|path| {
            let made = std::process::Command::new("mkfifo").arg(path).status().unwrap();
            assert!(made.success(), "mkfifo {}", path.display());
        });
        assert!(fifo.contains("tiny/latest: a FIFO, not a regular file"), "{fifo}");
        let folder = manifest_error(|path| std::fs::create_dir(path).unwrap());
        assert!(
            folder.contains("tiny/latest: a directory, not a regular file"),
            "{folder}"
        );
        let device = manifest_error(|path| std::os::unix::fs::symlink("/dev/zero", path).unwrap());
        assert!(device.contains("tiny/latest: a device, not a regular file"), "{device}");
        let none = manifest_error(|_| {});
        assert!(
            none.contains("has no tag 'latest'") && none.contains("(it has: none)"),
            "{none}"
        );
    }

    #[test]
    fn params_keep_what_cleave_has_no_flag_for() {
        let params: OllamaParams = serde_json::from_str(
            r#"{"stop": ["<|eot|>"], "temperature": 0.6, "num_ctx": 8192, "repeat_penalty": 1.1, "mirostat": 2}"#,
        )
        .unwrap();
        assert_eq!(params.stop, ["<|eot|>"]);
        assert_eq!(params.num_ctx, Some(8192.into()));
        assert_eq!(params.repeat_penalty, Some(1.1.into()));
        assert!(params.other.contains_key("mirostat"));
    }
}
