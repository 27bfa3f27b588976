//! The hub's local cache, laid out as huggingface_hub lays it out (and
//! shared with it): `HUB/models--org--name/refs/REVISION` holds a commit,
//! `snapshots/COMMIT/FILE` links to `blobs/ETAG`.

use std::path::{Path, PathBuf};

use super::name::{is_commit, HubName};
use crate::error::{Result, SourceError};

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
pub fn token() -> Result<Option<String>> {
    if let Some(token) = std::env::var("HF_TOKEN").ok().filter(|t| !t.trim().is_empty()) {
        return Ok(Some(token.trim().to_string()));
    }
    let Some(path) = hf_home().map(|h| h.join("token")) else {
        return Ok(None);
    };
    // A token is a few dozen bytes.
    let token = read_small(&path, 4096)?.unwrap_or_default();
    let token = token.trim();
    Ok((!token.is_empty()).then(|| token.to_string()))
}

/// The text of a small file the cache keeps (a ref, the token), `None`
/// where there is none.
fn read_small(path: &Path, max: u64) -> Result<Option<String>> {
    match crate::small_file::read(path, max) {
        Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(SourceError::io(path, e)),
    }
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
pub fn snapshot(cache: &Path, name: &HubName) -> Result<Option<PathBuf>> {
    let repo = repo_dir(cache, &name.repo);
    let commit = if is_commit(&name.revision) {
        name.revision.clone()
    } else {
        let path = repo.join("refs").join(&name.revision);
        match read_small(&path, 256)? {
            Some(commit) if is_commit(commit.trim()) => commit.trim().to_string(),
            Some(commit) => {
                return Err(SourceError::io(
                    path,
                    format!("holds '{}', not a commit hash", commit.trim().escape_debug()),
                ))
            }
            None => return Ok(None),
        }
    };
    let dir = repo.join("snapshots").join(commit);
    Ok(dir.is_dir().then_some(dir))
}

/// Records that `revision` of the repo in `repo_dir` is `commit`, as
/// huggingface_hub does. Written beside and renamed over, so that what
/// stood there (a FIFO, say) is replaced, never opened.
pub fn write_ref(repo_dir: &Path, revision: &str, commit: &str) -> Result<()> {
    let path = repo_dir.join("refs").join(revision);
    let parent = path.parent().unwrap_or(repo_dir);
    let temporary = parent.join(format!(".{}.{}", commit, std::process::id()));
    std::fs::create_dir_all(parent)
        .and_then(|_| std::fs::write(&temporary, commit))
        .and_then(|_| std::fs::rename(&temporary, &path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&temporary);
            SourceError::io(&path, e)
        })
}

/// Links the snapshot's `file` (at `path`) to its blob, relatively, as
/// huggingface_hub does (`../../blobs/ETAG`, one `..` more for each folder
/// in the file's name); a copy where the file system takes no links.
pub fn link(blob: &Path, path: &Path, file: &str) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let up = "../".repeat(file.matches('/').count() + 2);
    let target = Path::new(&up).join("blobs").join(blob.file_name().unwrap_or_default());
    #[cfg(unix)]
    return std::os::unix::fs::symlink(target, path);
    #[cfg(not(unix))]
    {
        let _ = target;
        std::fs::copy(blob, path).map(|_| ())
    }
}

/// What a snapshot lacks to be opened, by what cleave downloads: for a
/// GGUF quant, a matching `.gguf`; for a pipeline, model_index.json (which
/// is downloaded after every component); for a model, config.json (also
/// downloaded last), tokenizer.json and its weights, every shard the index
/// lists. Empty when it is complete. A quant that names several files,
/// or an index that cannot be read, is an error of its own, not a lack.
pub fn missing(snapshot: &Path, name: &HubName) -> Result<Vec<String>> {
    if let Some(quant) = &name.quant {
        let ggufs = gguf_files(snapshot);
        return Ok(match super::files::pick_gguf(&name.repo, &ggufs, quant) {
            Ok(_) => Vec::new(),
            Err(e)
                if ggufs.iter().any(|f| {
                    f.rsplit('/')
                        .next()
                        .unwrap_or(f)
                        .to_ascii_lowercase()
                        .contains(&quant.to_ascii_lowercase())
                }) =>
            {
                return Err(e)
            }
            Err(_) => vec![format!("a .gguf file matching '{quant}'")],
        });
    }
    if snapshot.join("model_index.json").is_file() {
        return Ok(Vec::new());
    }
    let mut missing: Vec<String> = ["config.json", "tokenizer.json"]
        .into_iter()
        .filter(|f| !snapshot.join(f).is_file())
        .map(String::from)
        .collect();
    let index = snapshot.join(super::files::INDEX);
    if index.is_file() {
        let shards = super::files::shards(&index)?;
        missing.extend(shards.into_iter().filter(|s| !snapshot.join(s).is_file()));
    } else if !has_safetensors(snapshot) {
        missing.push("*.safetensors".into());
    }
    Ok(missing)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn name(spec: &str) -> HubName {
        HubName::parse(spec).unwrap()
    }

    #[test]
    fn a_snapshot_lacking_files_says_which_and_an_ambiguous_or_broken_one_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let snapshot = dir.path();
        assert_eq!(
            missing(snapshot, &name("o/m")).unwrap(),
            ["config.json", "tokenizer.json", "*.safetensors"]
        );
        std::fs::write(snapshot.join("m-Q8_0.gguf"), "").unwrap();
        assert!(missing(snapshot, &name("o/m:Q8_0")).unwrap().is_empty());
        assert_eq!(
            missing(snapshot, &name("o/m:Q4_K_M")).unwrap(),
            ["a .gguf file matching 'Q4_K_M'"]
        );
        std::fs::write(snapshot.join("m-Q8_0-imat.gguf"), "").unwrap();
        let err = missing(snapshot, &name("o/m:q8_0")).unwrap_err().to_string();
        assert!(err.contains("several .gguf files"), "{err}");

        std::fs::write(snapshot.join(super::super::files::INDEX), "{not json").unwrap();
        let err = missing(snapshot, &name("o/m")).unwrap_err().to_string();
        assert!(
            err.contains("model.safetensors.index.json") && err.contains("invalid JSON"),
            "{err}"
        );
    }

    #[test]
    fn a_ref_that_is_no_file_or_no_commit_is_refused_and_a_written_ref_replaces_it() {
        let cache = tempfile::tempdir().unwrap();
        let repo = repo_dir(cache.path(), "o/m");
        std::fs::create_dir_all(repo.join("refs/main")).unwrap();
        let err = snapshot(cache.path(), &name("o/m")).unwrap_err().to_string();
        assert!(err.contains("a directory, not a regular file"), "{err}");
        std::fs::remove_dir(repo.join("refs/main")).unwrap();
        std::fs::write(repo.join("refs/main"), "../../../etc").unwrap();
        let err = snapshot(cache.path(), &name("o/m")).unwrap_err().to_string();
        assert!(err.contains("not a commit hash"), "{err}");

        let commit = "0123456789abcdef0123456789abcdef01234567";
        write_ref(&repo, "refs/pr/1", commit).unwrap();
        std::fs::create_dir_all(repo.join("snapshots").join(commit)).unwrap();
        assert_eq!(
            snapshot(cache.path(), &name("o/m@refs/pr/1")).unwrap(),
            Some(repo.join("snapshots").join(commit))
        );
    }
}
