//! Fetching a revision's files into the cache with hf-hub's sync client,
//! which resumes a blob's `.part` file with a range request. Every file's
//! size is checked against the hub's listing before it is used.

use std::path::{Path, PathBuf};

use hf_hub::api::sync::{Api, ApiBuilder, ApiError, ApiRepo};
use hf_hub::{Cache, Repo, RepoType};
use indicatif::{ProgressBar, ProgressStyle};

use super::files::{self, Choice, Listing, Sibling};
use super::name::HubName;
use crate::error::{Result, SourceError};

/// The hub at one endpoint, with the cache its files go to.
pub struct Hub {
    api: Api,
    endpoint: String,
    cache: PathBuf,
    progress: bool,
}

impl Hub {
    pub fn new(cache: &Path, endpoint: String, token: Option<String>, progress: bool) -> Result<Self> {
        let api = ApiBuilder::from_cache(Cache::new(cache.to_path_buf()))
            .with_endpoint(endpoint.clone())
            .with_token(token)
            .with_progress(false)
            .with_retries(3)
            .build()
            .map_err(|e| SourceError::Network {
                repo: String::new(),
                endpoint: endpoint.clone(),
                reason: e.to_string(),
            })?;
        Ok(Hub {
            api,
            endpoint,
            cache: cache.to_path_buf(),
            progress,
        })
    }

    /// Downloads what `name` needs that its snapshot lacks; the path to
    /// open: the snapshot folder, or the GGUF file in it.
    pub fn fetch(&self, name: &HubName) -> Result<PathBuf> {
        let repo = self.api.repo(Repo::with_revision(
            name.repo.clone(),
            RepoType::Model,
            name.revision.clone(),
        ));
        let listing = self.listing(&repo, name)?;
        if !super::name::is_commit(&listing.sha) {
            return Err(SourceError::Listing {
                repo: name.repo.clone(),
                reason: format!("'sha' is '{}', not a commit hash", listing.sha),
            });
        }
        let snapshot = super::cache::repo_dir(&self.cache, &name.repo)
            .join("snapshots")
            .join(&listing.sha);
        let file = |path: &str| -> Result<&Sibling> {
            listing
                .siblings
                .iter()
                .find(|s| s.rfilename == path)
                .ok_or_else(|| SourceError::Weights {
                    repo: name.repo.clone(),
                    reason: format!("{} names {path}, which the repo does not have", files::INDEX),
                })
        };
        match files::choose(&name.repo, &listing.siblings, name.quant.as_deref())? {
            Choice::Gguf(path) => self.file(&repo, name, &snapshot, file(&path)?),
            Choice::Folder { first, index, last } => {
                for path in &first {
                    self.file(&repo, name, &snapshot, file(path)?)?;
                }
                if index {
                    let shards = files::shards(&snapshot.join(files::INDEX))?;
                    for shard in &shards {
                        self.file(&repo, name, &snapshot, file(shard)?)?;
                    }
                }
                self.file(&repo, name, &snapshot, file(&last)?)?;
                Ok(snapshot)
            }
        }
    }

    fn listing(&self, repo: &ApiRepo, name: &HubName) -> Result<Listing> {
        let request = repo.info_request().query("blobs", "true");
        let url = request.url().to_string();
        let response = request.call().map_err(|e| self.http_error(name, &url, e))?;
        let text = response.into_string().map_err(|e| SourceError::Listing {
            repo: name.repo.clone(),
            reason: format!("{url}: {e}"),
        })?;
        serde_json::from_str(&text).map_err(|e| SourceError::Listing {
            repo: name.repo.clone(),
            reason: format!("{url}: {e}"),
        })
    }

    /// One file in the snapshot: kept when its size is the listing's,
    /// else downloaded (resuming a partial blob) and checked.
    fn file(&self, repo: &ApiRepo, name: &HubName, snapshot: &Path, sibling: &Sibling) -> Result<PathBuf> {
        let path = snapshot.join(&sibling.rfilename);
        let size = sibling.size();
        let fail = |reason: String| SourceError::Download {
            repo: name.repo.clone(),
            file: sibling.rfilename.clone(),
            reason,
        };
        match std::fs::metadata(&path) {
            Ok(metadata) if size.is_none_or(|s| s == metadata.len()) => return Ok(path),
            // A blob of the wrong size is not the file: fetch it again.
            Ok(_) => remove_link_and_blob(&path).map_err(|e| fail(e.to_string()))?,
            // A link whose blob was deleted would block the new link.
            Err(_) if path.symlink_metadata().is_ok() => {
                std::fs::remove_file(&path).map_err(|e| fail(e.to_string()))?
            }
            Err(_) => {}
        }
        if let Some(etag) = sibling.etag() {
            self.adopt_incomplete(&name.repo, etag);
        }
        let download = || repo.download_with_progress(&sibling.rfilename, Bar::new(self.progress));
        let downloaded = match download() {
            // A `.part` longer than the file is not a prefix of it.
            Err(ApiError::InvalidResume) => {
                if let Some(etag) = sibling.etag() {
                    let _ = std::fs::remove_file(self.blob(&name.repo, etag).with_extension("part"));
                }
                download()
            }
            other => other,
        }
        .map_err(|e| self.api_error(name, &sibling.rfilename, e))?;
        let found = std::fs::metadata(&downloaded).map_err(|e| fail(e.to_string()))?.len();
        if let Some(size) = size.filter(|s| *s != found) {
            let _ = remove_link_and_blob(&downloaded);
            return Err(fail(format!(
                "got {found} bytes where the hub lists {size}; the partial file was removed, run again"
            )));
        }
        Ok(downloaded)
    }

    fn blob(&self, repo: &str, etag: &str) -> PathBuf {
        super::cache::repo_dir(&self.cache, repo).join("blobs").join(etag)
    }

    /// huggingface_hub keeps a partial blob as `ETAG.incomplete`, hf-hub
    /// as `ETAG.part`: the first becomes the second, to be resumed.
    fn adopt_incomplete(&self, repo: &str, etag: &str) {
        if etag.is_empty() || !etag.chars().all(|c| c.is_ascii_alphanumeric()) {
            return;
        }
        let blob = self.blob(repo, etag);
        let incomplete = blob.with_extension("incomplete");
        let part = blob.with_extension("part");
        if incomplete.is_file() && !part.exists() {
            let _ = std::fs::rename(incomplete, part);
        }
    }

    fn api_error(&self, name: &HubName, file: &str, error: ApiError) -> SourceError {
        match error {
            ApiError::RequestError(e) => self.http_error(name, file, *e),
            ApiError::TooManyRetries(e) => self.api_error(name, file, *e),
            other => SourceError::Download {
                repo: name.repo.clone(),
                file: file.into(),
                reason: other.to_string(),
            },
        }
    }

    /// A refusal by its cause: a token wanted, no such repo, or no hub.
    fn http_error(&self, name: &HubName, what: &str, error: ureq::Error) -> SourceError {
        let repo = name.repo.clone();
        let endpoint = self.endpoint.clone();
        match error {
            ureq::Error::Status(status, response) => {
                // The hub says why in X-Error-Code (and answers 401 for a
                // private repo it will not confirm exists).
                let code = response.header("x-error-code").unwrap_or_default().to_string();
                let detail = |code: &str| match code {
                    "" => String::new(),
                    "GatedRepo" => " (the repo is gated: accept its terms on the hub)".into(),
                    // Without a token, the hub answers so for a misspelt name too.
                    "RepoNotFound" if status == 401 => " (RepoNotFound: or the name is misspelt)".into(),
                    code => format!(" ({code})"),
                };
                match status {
                    401 | 403 if code != "RevisionNotFound" && code != "EntryNotFound" => SourceError::Unauthorized {
                        repo,
                        endpoint,
                        status,
                        detail: detail(&code),
                    },
                    401 | 403 | 404 => SourceError::NotFound {
                        repo: format!("{}@{}", name.repo, name.revision),
                        endpoint,
                        detail: detail(&code),
                    },
                    _ => SourceError::Status {
                        repo,
                        endpoint,
                        status,
                        url: what.into(),
                    },
                }
            }
            ureq::Error::Transport(transport) => SourceError::Network {
                repo,
                endpoint,
                reason: transport.to_string(),
            },
        }
    }
}

/// Removes a snapshot's link and the blob it points to (or the file
/// itself where the cache holds copies).
fn remove_link_and_blob(path: &Path) -> std::io::Result<()> {
    if path.symlink_metadata()?.file_type().is_symlink() {
        if let Ok(blob) = std::fs::canonicalize(path) {
            std::fs::remove_file(blob)?;
        }
    }
    std::fs::remove_file(path)
}

/// A download's progress bar on stderr (drawn only on a terminal).
struct Bar(ProgressBar);

impl Bar {
    fn new(visible: bool) -> Self {
        Bar(if visible {
            ProgressBar::new(0)
        } else {
            ProgressBar::hidden()
        })
    }
}

impl hf_hub::api::Progress for Bar {
    fn init(&mut self, size: usize, filename: &str) {
        if let Ok(style) =
            ProgressStyle::with_template("{msg:30!} [{wide_bar}] {bytes}/{total_bytes} {bytes_per_sec} ({eta})")
        {
            self.0.set_style(style.progress_chars("=> "));
        }
        self.0.set_length(size as u64);
        self.0.set_position(0);
        self.0.set_message(filename.to_string());
    }

    fn update(&mut self, size: usize) {
        self.0.inc(size as u64);
    }

    fn finish(&mut self) {
        self.0.finish();
    }
}
