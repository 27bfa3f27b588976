//! Which of a repo's files cleave needs: the hub's listing of a revision,
//! and the choice from it.

use std::collections::BTreeSet;
use std::path::Path;

use serde::Deserialize;

use crate::error::{Result, SourceError};

pub const INDEX: &str = "model.safetensors.index.json";

/// An index lists every tensor; the largest are a few MiB.
const MAX_INDEX_BYTES: u64 = 64 << 20;

/// `GET /api/models/ORG/NAME/revision/REV?blobs=true`, the fields cleave reads.
#[derive(Debug, Deserialize)]
pub struct Listing {
    /// The commit the revision names.
    pub sha: String,
    pub siblings: Vec<Sibling>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Sibling {
    pub rfilename: String,
    pub size: Option<u64>,
    /// The git blob id: a small file's etag, and its blob's name.
    #[serde(rename = "blobId")]
    pub blob_id: Option<String>,
    pub lfs: Option<Lfs>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Lfs {
    /// A large file's etag, and its blob's name.
    pub sha256: String,
    pub size: Option<u64>,
}

impl Sibling {
    pub fn size(&self) -> Option<u64> {
        self.lfs.as_ref().and_then(|l| l.size).or(self.size)
    }

    /// The name its blob has in the cache.
    pub fn etag(&self) -> Option<&str> {
        self.lfs.as_ref().map(|l| l.sha256.as_str()).or(self.blob_id.as_deref())
    }
}

/// git's longest path is 4096 bytes; a hub's names are far shorter.
const MAX_FILE_NAME: usize = 1024;

impl Listing {
    /// Refuses a listing whose commit or file names could not be a git
    /// repo's: the commit names a snapshot folder and each file name a path
    /// in it, so neither may lead out of the cache.
    pub fn check(&self, repo: &str) -> Result<()> {
        let bad = |reason: String| SourceError::Listing {
            repo: repo.into(),
            reason,
        };
        if !super::name::is_commit(&self.sha) {
            return Err(bad(format!("'sha' is '{}', not a commit hash", self.sha)));
        }
        for sibling in &self.siblings {
            if let Err(why) = repo_path(&sibling.rfilename) {
                return Err(bad(format!(
                    "it lists a file '{}', which {why}",
                    sibling.rfilename.escape_debug()
                )));
            }
        }
        Ok(())
    }
}

/// Whether `name` is a path inside a repo, as git would store it: parts
/// between `/` that are neither empty, `.` nor `..`, with no `\`, drive
/// letter or control character.
fn repo_path(name: &str) -> std::result::Result<(), &'static str> {
    if name.is_empty() || name.len() > MAX_FILE_NAME {
        return Err("is empty or too long to be a file name");
    }
    if name.starts_with('/') {
        return Err("is an absolute path");
    }
    if name.contains('\\') || name.contains(':') || name.chars().any(char::is_control) {
        return Err("holds a character no path in a repo may have ('\\', ':' or a control character)");
    }
    if name
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return Err("is not a path inside the repo (an empty, '.' or '..' part)");
    }
    Ok(())
}

/// Whether `etag` may name a blob: a git blob id (40 hex digits) or an
/// LFS file's sha256 (64).
pub fn is_blob_name(etag: &str) -> bool {
    matches!(etag.len(), 40 | 64) && etag.chars().all(|c| c.is_ascii_hexdigit())
}

/// What to download, in order: the files whose presence marks a complete
/// snapshot (config.json, model_index.json) come last, so that a download
/// cut short is never taken for a complete one.
#[derive(Debug, PartialEq, Eq)]
pub enum Choice {
    /// A model folder: `first`, then the shards `INDEX` lists (when
    /// `index`), then `last`.
    Folder {
        first: Vec<String>,
        index: bool,
        last: String,
    },
    /// One GGUF file.
    Gguf(String),
}

/// Weights and tokenizer files of a pipeline's components, and none of
/// the other formats repos carry besides safetensors.
const COMPONENT_EXTENSIONS: [&str; 4] = [".json", ".safetensors", ".txt", ".model"];

/// diffusers' reduced-precision copies, which its loader takes only when
/// asked for that variant.
fn is_variant(file: &str) -> bool {
    [".fp16.", ".bf16.", ".fp32."].iter().any(|v| file.contains(v))
}

pub fn choose(repo: &str, siblings: &[Sibling], quant: Option<&str>) -> Result<Choice> {
    let names: Vec<&str> = siblings.iter().map(|s| s.rfilename.as_str()).collect();
    let ggufs: Vec<String> = names
        .iter()
        .filter(|n| n.ends_with(".gguf"))
        .map(|n| n.to_string())
        .collect();
    if let Some(quant) = quant {
        return pick_gguf(repo, &ggufs, quant).map(Choice::Gguf);
    }
    let at_root = |n: &&str| !n.contains('/');
    if names.contains(&"model_index.json") {
        let first = names
            .iter()
            .filter(|n| n.contains('/') && !is_variant(n) && COMPONENT_EXTENSIONS.iter().any(|e| n.ends_with(e)))
            .map(|n| n.to_string())
            .collect();
        return Ok(Choice::Folder {
            first,
            index: false,
            last: "model_index.json".into(),
        });
    }
    let root_weights: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| at_root(n) && n.ends_with(".safetensors") && !is_variant(n))
        .collect();
    if names.contains(&"config.json") && (names.contains(&INDEX) || !root_weights.is_empty()) {
        // Every JSON file at the root (tokenizer, generation and
        // sentence-transformers settings), and the pooling modules'.
        let mut first: Vec<String> = names
            .iter()
            .filter(|n| n.ends_with(".json") && **n != "config.json" && **n != INDEX)
            .filter(|n| at_root(n) || n.split('/').next().is_some_and(|dir| dir.ends_with("_Pooling")))
            .map(|n| n.to_string())
            .collect();
        let index = names.contains(&INDEX);
        if index {
            first.push(INDEX.into());
        } else if root_weights.contains(&"model.safetensors") {
            first.push("model.safetensors".into());
        } else {
            first.extend(root_weights.iter().map(|n| n.to_string()));
        }
        return Ok(Choice::Folder {
            first,
            index,
            last: "config.json".into(),
        });
    }
    if !ggufs.is_empty() {
        return Err(SourceError::Weights {
            repo: repo.into(),
            reason: format!(
                "holds GGUF files and no safetensors model: name one as {repo}:QUANT, e.g. {repo}:Q4_K_M \
                 (it has: {})",
                ggufs.join(", ")
            ),
        });
    }
    Err(SourceError::Weights {
        repo: repo.into(),
        reason: "holds neither a model cleave reads (config.json with safetensors weights, or a diffusers \
                 model_index.json) nor GGUF files"
            .into(),
    })
}

/// The one `.gguf` file of `files` whose name holds `quant` (any case);
/// an exact file name wins.
pub fn pick_gguf(repo: &str, files: &[String], quant: &str) -> Result<String> {
    if let Some(exact) = files
        .iter()
        .find(|f| *f == quant || f.rsplit('/').next() == Some(quant))
    {
        return Ok(exact.clone());
    }
    let wanted = quant.to_ascii_lowercase();
    let matching: Vec<&String> = files
        .iter()
        .filter(|f| f.rsplit('/').next().unwrap_or(f).to_ascii_lowercase().contains(&wanted))
        .collect();
    match matching.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(SourceError::Weights {
            repo: repo.into(),
            reason: format!(
                "no .gguf file's name holds '{quant}' (it has: {})",
                if files.is_empty() {
                    "none".into()
                } else {
                    files.join(", ")
                }
            ),
        }),
        several => Err(SourceError::Weights {
            repo: repo.into(),
            reason: format!(
                "several .gguf files' names hold '{quant}' ({}): name one, e.g. {repo}:{}",
                several.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
                several[0].rsplit('/').next().unwrap_or(several[0])
            ),
        }),
    }
}

#[derive(Deserialize)]
struct Index {
    weight_map: std::collections::BTreeMap<String, String>,
}

/// The shard files a safetensors index lists, each once, sorted.
pub fn shards(index: &Path) -> std::result::Result<Vec<String>, SourceError> {
    let bad = |reason: String| SourceError::io(index, reason);
    let size = std::fs::metadata(index).map_err(|e| bad(e.to_string()))?.len();
    if size > MAX_INDEX_BYTES {
        return Err(bad(format!(
            "{size} bytes, more than an index may have ({MAX_INDEX_BYTES})"
        )));
    }
    let text = std::fs::read_to_string(index).map_err(|e| bad(e.to_string()))?;
    let index: Index = serde_json::from_str(&text).map_err(|e| bad(format!("invalid JSON: {e}")))?;
    let shards: BTreeSet<String> = index.weight_map.into_values().collect();
    for shard in &shards {
        // A shard is a file beside the index, never a path out of it.
        if shard.is_empty() || shard.contains('/') || shard.contains('\\') || shard.starts_with('.') {
            return Err(bad(format!(
                "weight_map names '{shard}', which is not a file beside the index"
            )));
        }
    }
    Ok(shards.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn siblings(names: &[&str]) -> Vec<Sibling> {
        names
            .iter()
            .map(|n| Sibling {
                rfilename: n.to_string(),
                size: None,
                blob_id: None,
                lfs: None,
            })
            .collect()
    }

    #[test]
    fn a_model_takes_its_json_files_and_weights_and_config_last() {
        let files = siblings(&[
            "README.md",
            "config.json",
            "tokenizer.json",
            "model.safetensors",
            "pytorch_model.bin",
        ]);
        assert_eq!(
            choose("o/m", &files, None).unwrap(),
            Choice::Folder {
                first: vec!["tokenizer.json".into(), "model.safetensors".into()],
                index: false,
                last: "config.json".into()
            }
        );
    }

    #[test]
    fn a_sharded_model_takes_the_index_not_every_safetensors_file() {
        let files = siblings(&[
            "config.json",
            INDEX,
            "model-00001-of-00002.safetensors",
            "consolidated.safetensors",
        ]);
        let Choice::Folder { first, index, .. } = choose("o/m", &files, None).unwrap() else {
            panic!()
        };
        assert!(index);
        assert_eq!(first, [INDEX]);
    }

    #[test]
    fn a_pipeline_takes_its_components_and_model_index_last() {
        let files = siblings(&[
            "model_index.json",
            "flux1-dev.safetensors",
            "vae/config.json",
            "vae/diffusion_pytorch_model.safetensors",
            "vae/diffusion_pytorch_model.fp16.safetensors",
            "text_encoder/model.onnx",
            "tokenizer/merges.txt",
        ]);
        let Choice::Folder { first, last, .. } = choose("o/p", &files, None).unwrap() else {
            panic!()
        };
        assert_eq!(
            first,
            [
                "vae/config.json",
                "vae/diffusion_pytorch_model.safetensors",
                "tokenizer/merges.txt"
            ]
        );
        assert_eq!(last, "model_index.json");
    }

    #[test]
    fn a_gguf_repo_needs_a_quant_that_names_one_file() {
        let files = siblings(&["m-Q4_K_M.gguf", "m-Q8_0.gguf", "m-Q4_K_S.gguf"]);
        let err = choose("o/m", &files, None).unwrap_err().to_string();
        assert!(err.contains("o/m:QUANT") && err.contains("m-Q8_0.gguf"), "{err}");
        assert_eq!(
            choose("o/m", &files, Some("q8_0")).unwrap(),
            Choice::Gguf("m-Q8_0.gguf".into())
        );
        let err = choose("o/m", &files, Some("Q4_K")).unwrap_err().to_string();
        assert!(err.contains("several"), "{err}");
        let err = choose("o/m", &files, Some("Q2_K")).unwrap_err().to_string();
        assert!(err.contains("no .gguf file"), "{err}");
    }

    fn listing(sha: &str, names: &[&str]) -> Listing {
        Listing {
            sha: sha.into(),
            siblings: siblings(names),
        }
    }

    #[test]
    fn a_listing_naming_a_path_out_of_the_repo_or_no_commit_is_refused() {
        let commit = "0123456789abcdef0123456789abcdef01234567";
        listing(commit, &["config.json", "1_Pooling/config.json", "a b/c..d.gguf"])
            .check("o/m")
            .unwrap();
        for name in [
            "../x.json",
            "a/../../x.gguf",
            "/etc/passwd",
            "./config.json",
            "a//b",
            "a/",
            "",
            "C:x",
            "a\\b",
            "a\nb",
        ] {
            let err = listing(commit, &["config.json", name])
                .check("o/m")
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("o/m") && err.contains("it lists a file"),
                "{name:?}: {err}"
            );
        }
        let err = listing("../../x", &["config.json"])
            .check("o/m")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a commit hash"), "{err}");
    }

    #[test]
    fn a_blob_name_is_a_git_or_lfs_hash() {
        assert!(is_blob_name(&"a".repeat(40)) && is_blob_name(&"0f".repeat(32)));
        for etag in [
            "",
            "../../x",
            &"a".repeat(41),
            &format!("{}/", "a".repeat(39)),
            &"g".repeat(40),
        ] {
            assert!(!is_blob_name(etag), "{etag}");
        }
    }

    #[test]
    fn an_index_naming_a_path_outside_its_folder_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let index = dir.path().join(INDEX);
        std::fs::write(&index, r#"{"weight_map": {"a": "../../etc/passwd"}}"#).unwrap();
        assert!(shards(&index).is_err());
        std::fs::write(
            &index,
            r#"{"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}}"#,
        )
        .unwrap();
        assert_eq!(shards(&index).unwrap(), ["s1.safetensors"]);
    }
}
