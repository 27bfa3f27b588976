//! The hub's local cache, laid out as huggingface_hub lays it out (and
//! shared with it): `HUB/models--org--name/refs/REVISION` holds a commit,
//! `snapshots/COMMIT/FILE` links to `blobs/ETAG`.

use std::path::{Path, PathBuf};

use super::name::{is_commit, HubName};

/// `HF_HOME`: `$XDG_CACHE_HOME/huggingface` or `~/.cache/huggingface` by
/// default, as huggingface_hub has it.
pub fn hf_home() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("HF_HOME")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("huggingface")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("huggingface")))
}

/// The hub cache: `HF_HUB_CACHE` (or its old name `HUGGINGFACE_HUB_CACHE`),
/// else `HF_HOME/hub`.
pub fn hub_cache() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("HF_HUB_CACHE")
        .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
        .or_else(|| hf_home().map(|h| h.join("hub")))
}

/// `HF_TOKEN`, else the token `hf auth login` saved in `HF_HOME/token`.
pub fn token() -> Option<String> {
    if let Some(token) = std::env::var("HF_TOKEN").ok().filter(|t| !t.trim().is_empty()) {
        return Some(token.trim().to_string());
    }
    let path = hf_home()?.join("token");
    // A token is a few dozen bytes; a large file here is not one.
    if std::fs::metadata(&path).ok()?.len() > 4096 {
        return None;
    }
    let token = std::fs::read_to_string(path).ok()?;
    let token = token.trim();
    (!token.is_empty()).then(|| token.to_string())
}

/// `HF_ENDPOINT`, else the public hub.
pub fn endpoint() -> String {
    std::env::var("HF_ENDPOINT")
        .ok()
        .filter(|e| !e.is_empty())
        .map(|e| e.trim_end_matches('/').to_string())
        .unwrap_or_else(|| "https://huggingface.co".into())
}

/// The folder of `repo`'s files in the cache.
pub fn repo_dir(cache: &Path, repo: &str) -> PathBuf {
    cache.join(format!("models--{}", repo.replace('/', "--")))
}

/// The snapshot folder `name`'s revision has in the cache, if any.
pub fn snapshot(cache: &Path, name: &HubName) -> Option<PathBuf> {
    let repo = repo_dir(cache, &name.repo);
    let commit = if is_commit(&name.revision) {
        name.revision.clone()
    } else {
        let commit = std::fs::read_to_string(repo.join("refs").join(&name.revision)).ok()?;
        let commit = commit.trim().to_string();
        is_commit(&commit).then_some(commit)?
    };
    let dir = repo.join("snapshots").join(commit);
    dir.is_dir().then_some(dir)
}

/// What a snapshot lacks to be opened, by what cleave downloads: for a
/// GGUF quant, a matching `.gguf`; for a pipeline, model_index.json (which
/// is downloaded after every component); for a model, config.json (also
/// downloaded last), tokenizer.json and its weights, every shard the index
/// lists. Empty when it is complete.
pub fn missing(snapshot: &Path, name: &HubName) -> Vec<String> {
    if let Some(quant) = &name.quant {
        return match super::files::pick_gguf(&name.repo, &gguf_files(snapshot), quant) {
            Ok(_) => Vec::new(),
            Err(_) => vec![format!("a .gguf file matching '{quant}'")],
        };
    }
    if snapshot.join("model_index.json").is_file() {
        return Vec::new();
    }
    let mut missing: Vec<String> = ["config.json", "tokenizer.json"]
        .into_iter()
        .filter(|f| !snapshot.join(f).is_file())
        .map(String::from)
        .collect();
    let index = snapshot.join(super::files::INDEX);
    if index.is_file() {
        match super::files::shards(&index) {
            Ok(shards) => missing.extend(shards.into_iter().filter(|s| !snapshot.join(s).is_file())),
            Err(_) => missing.push(super::files::INDEX.into()),
        }
    } else if !has_safetensors(snapshot) {
        missing.push("*.safetensors".into());
    }
    missing
}

fn has_safetensors(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy().ends_with(".safetensors") && e.path().is_file())
    })
}

/// The `.gguf` files of a snapshot, as paths relative to it (a repo may
/// keep them in folders, one per quant).
pub fn gguf_files(snapshot: &Path) -> Vec<String> {
    fn walk(dir: &Path, prefix: &str, depth: usize, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.filter_map(|e| e.ok()) {
            let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
            let path = entry.path();
            if path.is_dir() && depth > 0 {
                walk(&path, &format!("{name}/"), depth - 1, out);
            } else if name.ends_with(".gguf") && path.is_file() {
                out.push(name);
            }
        }
    }
    let mut files = Vec::new();
    walk(snapshot, "", 2, &mut files);
    files.sort();
    files
}
