//! Fetching a revision's files into the cache, laid out as huggingface_hub
//! lays it out. Everything that becomes a path comes from the listing and
//! is checked first (the commit, each file name, each blob name); nothing
//! a download answers names a path. A file streams into
//! `blobs/ETAG.incomplete` (resumed with a range request, huggingface_hub's
//! partial name too), held to the listing's size while it streams, then
//! checked against the listing's hash, becomes `blobs/ETAG`, and
//! `snapshots/COMMIT/FILE` links to it.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use url::Url;

use super::cache;
use super::files::{self, Choice, Listing, Sibling};
use super::http::{self, Client, Fault};
use super::name::HubName;
use crate::error::{Result, SourceError};

/// The listing of a repo with thousands of files is a few MiB.
const MAX_LISTING_BYTES: u64 = 32 << 20;

/// Tries at a file whose connection breaks before its end, each resuming
/// where the last stopped.
const ATTEMPTS: usize = 3;

/// A download slower than this over a whole window of `RATE_WINDOWS`
/// waits is a dripping server, not a slow line.
const MIN_BYTES_PER_SECOND: u64 = 16 << 10;
const RATE_WINDOWS: u32 = 6;

/// What the hub may make cleave wait: huggingface_hub's variables and its
/// default of 10 seconds for a connection or a read. The listing must
/// arrive whole within `RATE_WINDOWS` such waits.
#[derive(Clone, Copy, Debug)]
pub struct Waits {
    pub listing: Duration,
    pub download: Duration,
}

impl Waits {
    pub fn from_env() -> Result<Self> {
        let seconds = |var: &str| -> Result<Duration> {
            let Some(value) = std::env::var(var).ok().filter(|v| !v.trim().is_empty()) else {
                return Ok(Duration::from_secs(10));
            };
            match value.trim().parse::<f64>() {
                Ok(s) if s.is_finite() && (0.01..=86_400.0).contains(&s) => Ok(Duration::from_secs_f64(s)),
                _ => Err(SourceError::io(
                    var,
                    format!("'{value}' is not a number of seconds from 0.01 to 86400"),
                )),
            }
        };
        Ok(Waits {
            listing: seconds("HF_HUB_ETAG_TIMEOUT")?,
            download: seconds("HF_HUB_DOWNLOAD_TIMEOUT")?,
        })
    }
}

/// The hub at one endpoint, with the cache its files go to.
pub struct Hub {
    endpoint: Url,
    listing_client: Client,
    download_client: Client,
    waits: Waits,
    cache: PathBuf,
    progress: bool,
}

impl Hub {
    pub fn new(cache: &Path, endpoint: &str, token: Option<String>, waits: Waits, progress: bool) -> Result<Self> {
        let endpoint = Url::parse(endpoint)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
            .ok_or_else(|| SourceError::io("HF_ENDPOINT", format!("'{endpoint}' is not an http(s) address")))?;
        Ok(Hub {
            listing_client: Client::new(&endpoint, token.clone(), waits.listing),
            download_client: Client::new(&endpoint, token, waits.download),
            endpoint,
            waits,
            cache: cache.to_path_buf(),
            progress,
        })
    }

    /// Downloads what `name` needs that its snapshot lacks; the path to
    /// open: the snapshot folder, or the GGUF file in it.
    pub fn fetch(&self, name: &HubName) -> Result<PathBuf> {
        let listing = self.listing(name)?;
        listing.check(&name.repo)?;
        let repo_dir = cache::repo_dir(&self.cache, &name.repo);
        if name.revision != listing.sha {
            cache::write_ref(&repo_dir, &name.revision, &listing.sha)?;
        }
        let snapshot = repo_dir.join("snapshots").join(&listing.sha);
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
        let get = |path: &str| self.file(name, &listing.sha, &snapshot, file(path)?);
        match files::choose(&name.repo, &listing.siblings, name.quant.as_deref())? {
            Choice::Gguf(path) => get(&path),
            Choice::Folder { first, index, last } => {
                for path in &first {
                    get(path)?;
                }
                if index {
                    for shard in &files::shards(&snapshot.join(files::INDEX))? {
                        get(shard)?;
                    }
                }
                get(&last)?;
                Ok(snapshot)
            }
        }
    }

    /// `GET /api/models/ORG/NAME/revision/REV?blobs=true`, read whole
    /// within its bound.
    fn listing(&self, name: &HubName) -> Result<Listing> {
        let mut url = self.endpoint.clone();
        let (org, model) = name.repo.split_once('/').unwrap_or((&name.repo, ""));
        url.path_segments_mut()
            .map_err(|_| SourceError::io("HF_ENDPOINT", format!("{} cannot take a path", self.endpoint)))?
            .pop_if_empty()
            .extend(["api", "models", org, model, "revision", &name.revision]);
        url.set_query(Some("blobs=true"));
        let response = self
            .listing_client
            .get(url.clone(), None, Some(self.waits.listing * RATE_WINDOWS))
            .map_err(|fault| self.fault(name, fault))?;
        if !response.status().is_success() {
            return Err(self.status_error(name, &url, &response));
        }
        let listing_error = |reason: String| SourceError::Listing {
            repo: name.repo.clone(),
            reason: format!("{url}: {reason}"),
        };
        let text = response
            .into_body()
            .into_with_config()
            .limit(MAX_LISTING_BYTES)
            .read_to_string()
            .map_err(|e| match e {
                ureq::Error::BodyExceedsLimit(_) => {
                    listing_error(format!("more than {MAX_LISTING_BYTES} bytes, more than a listing has"))
                }
                other => listing_error(http::describe(&other, &url)),
            })?;
        serde_json::from_str(&text).map_err(|e| listing_error(e.to_string()))
    }

    /// One file in the snapshot: kept when its size is the listing's,
    /// else linked to its blob, downloaded first where that is missing.
    fn file(&self, name: &HubName, commit: &str, snapshot: &Path, sibling: &Sibling) -> Result<PathBuf> {
        let fail = |reason: String| SourceError::Download {
            repo: name.repo.clone(),
            file: sibling.rfilename.clone(),
            reason,
        };
        let size = sibling
            .size()
            .ok_or_else(|| fail("the hub's listing gives no size for it".into()))?;
        let etag = sibling.etag().filter(|e| files::is_blob_name(e)).ok_or_else(|| {
            fail(format!(
                "the hub's listing names its blob {:?}, not a hash",
                sibling.etag()
            ))
        })?;
        let path = snapshot.join(&sibling.rfilename);
        match std::fs::metadata(&path) {
            Ok(metadata) if metadata.is_file() && metadata.len() == size => return Ok(path),
            // Only the link goes: what it points to may be outside the
            // cache, or another snapshot's.
            _ if path.symlink_metadata().is_ok() => std::fs::remove_file(&path).map_err(|e| fail(e.to_string()))?,
            _ => {}
        }
        let blobs = cache::repo_dir(&self.cache, &name.repo).join("blobs");
        let blob = blobs.join(etag);
        let have_blob = blob.symlink_metadata().is_ok_and(|m| m.is_file() && m.len() == size);
        if !have_blob {
            std::fs::create_dir_all(&blobs).map_err(|e| fail(format!("{}: {e}", blobs.display())))?;
            self.download(name, commit, sibling, size, &blob).map_err(&fail)?;
        }
        if let Err(e) = cache::link(&blob, &path, &sibling.rfilename) {
            // Another cleave may have linked it meanwhile.
            if !std::fs::metadata(&path).is_ok_and(|m| m.is_file() && m.len() == size) {
                return Err(fail(format!("{}: {e}", path.display())));
            }
        }
        Ok(path)
    }

    /// `blob` from the hub, through its `.incomplete` file.
    fn download(
        &self,
        name: &HubName,
        commit: &str,
        sibling: &Sibling,
        size: u64,
        blob: &Path,
    ) -> std::result::Result<(), String> {
        let partial = blob.with_extension("incomplete");
        let mut url = self.endpoint.clone();
        url.path_segments_mut()
            .map_err(|_| format!("{} cannot take a path", self.endpoint))?
            .pop_if_empty()
            .extend(name.repo.split('/'))
            .extend(["resolve", commit])
            .extend(sibling.rfilename.split('/'));
        let bar = Bar::new(self.progress, &sibling.rfilename, size);
        let mut why = String::new();
        for _ in 0..ATTEMPTS {
            match self.receive(&url, &partial, size, &bar) {
                Ok(()) => {
                    bar.0.finish();
                    if let Err(why) = check_hash(&partial, sibling) {
                        let _ = std::fs::remove_file(&partial);
                        return Err(format!("{why}; the download was removed"));
                    }
                    return std::fs::rename(&partial, blob).map_err(|e| format!("{}: {e}", blob.display()));
                }
                Err(Receive::Broken(reason)) => why = reason,
                Err(Receive::Failed(reason)) => return Err(reason),
            }
        }
        Err(format!("{why}, {ATTEMPTS} times; run again to resume"))
    }

    /// One request for the rest of `partial`: appends what arrives, never
    /// past `size` bytes.
    fn receive(&self, url: &Url, partial: &Path, size: u64, bar: &Bar) -> std::result::Result<(), Receive> {
        let failed = |reason: String| Receive::Failed(reason);
        let have = match partial.symlink_metadata() {
            Ok(m) if m.is_file() => m.len(),
            Ok(_) => return Err(failed(format!("{} is not a file", partial.display()))),
            Err(_) => 0,
        };
        let mut out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(partial)
            .map_err(|e| failed(format!("{}: {e}", partial.display())))?;
        if have == size {
            return Ok(());
        }
        // A partial file longer than the file is not a prefix of it.
        let from = if have > size { 0 } else { have };
        if from == 0 {
            out.set_len(0)
                .map_err(|e| failed(format!("{}: {e}", partial.display())))?;
        }
        let response = self
            .download_client
            .get(url.clone(), Some(from), None)
            .map_err(|fault| match fault {
                Fault::Transport(reason) => Receive::Broken(reason),
                Fault::Redirect(reason) => Receive::Failed(reason),
            })?;
        let status = response.status().as_u16();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let start = match status {
            206 => match header("content-range").as_deref().and_then(range_start) {
                Some(start) if start == from => from,
                _ => {
                    return Err(failed(format!(
                        "{url} answered bytes {:?} to a request from byte {from}",
                        header("content-range").unwrap_or_default()
                    )))
                }
            },
            // The whole file, the range not honoured: start again.
            200 => {
                out.set_len(0)
                    .map_err(|e| failed(format!("{}: {e}", partial.display())))?;
                0
            }
            416 => {
                out.set_len(0)
                    .map_err(|e| failed(format!("{}: {e}", partial.display())))?;
                return Err(Receive::Broken(format!("{url} refused the range from byte {from}")));
            }
            _ => return Err(failed(format!("{url} answered {status}"))),
        };
        let rest = size - start;
        if let Some(length) = header("content-length").and_then(|l| l.parse::<u64>().ok()) {
            if length != rest {
                return Err(failed(format!(
                    "{url} sends {length} bytes where the hub's listing leaves {rest} of {size}"
                )));
            }
        }
        bar.0.set_position(start);
        let mut body = response.into_body().into_reader();
        let mut buffer = vec![0u8; 1 << 18];
        let mut got = 0u64;
        let mut window = (Instant::now(), 0u64);
        let window_length = self.waits.download * RATE_WINDOWS;
        loop {
            let n = match body.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if http::is_timeout(&e) => {
                    return Err(failed(format!(
                        "no byte from {url} in {:.1} s (HF_HUB_DOWNLOAD_TIMEOUT), after {} of {size} bytes",
                        self.waits.download.as_secs_f64(),
                        start + got
                    )))
                }
                Err(e) => {
                    return Err(Receive::Broken(format!(
                        "{url} broke off after {} of {size} bytes ({e})",
                        start + got
                    )))
                }
            };
            got += n as u64;
            if got > rest {
                drop(out);
                let _ = std::fs::remove_file(partial);
                return Err(failed(format!("{url} sends more than the {size} bytes the hub lists")));
            }
            out.write_all(&buffer[..n])
                .map_err(|e| failed(format!("{}: {e}", partial.display())))?;
            bar.0.inc(n as u64);
            window.1 += n as u64;
            let elapsed = window.0.elapsed();
            if elapsed >= window_length {
                if window.1 < MIN_BYTES_PER_SECOND * elapsed.as_secs().max(1) {
                    return Err(failed(format!(
                        "{url} sent {} bytes in {:.0} s, slower than {} KiB/s",
                        window.1,
                        elapsed.as_secs_f64(),
                        MIN_BYTES_PER_SECOND >> 10
                    )));
                }
                window = (Instant::now(), 0);
            }
        }
        out.flush().map_err(|e| failed(format!("{}: {e}", partial.display())))?;
        if got < rest {
            return Err(Receive::Broken(format!(
                "{url} broke off after {} of {size} bytes (the connection closed)",
                start + got
            )));
        }
        Ok(())
    }

    fn fault(&self, name: &HubName, fault: Fault) -> SourceError {
        match fault {
            Fault::Transport(reason) => SourceError::Network {
                repo: name.repo.clone(),
                endpoint: self.endpoint.to_string().trim_end_matches('/').to_string(),
                reason,
            },
            Fault::Redirect(reason) => SourceError::Listing {
                repo: name.repo.clone(),
                reason,
            },
        }
    }

    /// A refusal by its cause: a token wanted, no such repo, or another
    /// status.
    fn status_error(&self, name: &HubName, url: &Url, response: &ureq::http::Response<ureq::Body>) -> SourceError {
        let repo = name.repo.clone();
        let endpoint = self.endpoint.to_string().trim_end_matches('/').to_string();
        let status = response.status().as_u16();
        // The hub says why in X-Error-Code (and answers 401 for a private
        // repo it will not confirm exists).
        let code: String = response
            .headers()
            .get("x-error-code")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(64)
            .collect();
        let detail = match code.as_str() {
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
                detail,
            },
            401 | 403 | 404 => SourceError::NotFound {
                repo: format!("{}@{}", name.repo, name.revision),
                endpoint,
                detail,
            },
            _ => SourceError::Status {
                repo,
                endpoint,
                status,
                url: url.to_string(),
            },
        }
    }
}

/// Whether the file at `path` is the one the listing names: an LFS file's
/// sha256, or a small file's git blob id (the sha1 of `blob SIZE\0` and
/// its bytes), as git and the hub compute them.
fn check_hash(path: &Path, sibling: &Sibling) -> std::result::Result<(), String> {
    use ring::digest::{Context, SHA1_FOR_LEGACY_USE_ONLY, SHA256};
    let (mut context, kind, expected) = match (&sibling.lfs, &sibling.blob_id) {
        (Some(lfs), _) => (Context::new(&SHA256), "sha256", lfs.sha256.as_str()),
        (None, Some(blob_id)) => {
            let mut context = Context::new(&SHA1_FOR_LEGACY_USE_ONLY);
            let size = std::fs::metadata(path)
                .map_err(|e| format!("{}: {e}", path.display()))?
                .len();
            context.update(format!("blob {size}\0").as_bytes());
            (context, "git blob id", blob_id.as_str())
        }
        (None, None) => return Err("the hub's listing names no blob for it".into()),
    };
    let mut file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        match file.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => context.update(&buffer[..n]),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        }
    }
    let found: String = context.finish().as_ref().iter().map(|b| format!("{b:02x}")).collect();
    if found != expected.to_ascii_lowercase() {
        return Err(format!(
            "its bytes have the {kind} {found}, where the hub's listing gives {expected}"
        ));
    }
    Ok(())
}

/// How one request for a file ended short of it.
enum Receive {
    /// The connection broke: another request may resume it.
    Broken(String),
    /// The answer is wrong, or too slow: asking again would not help.
    Failed(String),
}

/// The first byte of a `Content-Range: bytes START-END/TOTAL`.
fn range_start(content_range: &str) -> Option<u64> {
    content_range
        .strip_prefix("bytes ")?
        .split('-')
        .next()?
        .trim()
        .parse()
        .ok()
}

/// A download's progress bar on stderr (drawn only on a terminal).
struct Bar(ProgressBar);

impl Bar {
    fn new(visible: bool, file: &str, size: u64) -> Self {
        let bar = if visible {
            ProgressBar::new(size)
        } else {
            ProgressBar::hidden()
        };
        if let Ok(style) =
            ProgressStyle::with_template("{msg:30!} [{wide_bar}] {bytes}/{total_bytes} {bytes_per_sec} ({eta})")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(file.to_string());
        Bar(bar)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_content_range_gives_its_first_byte() {
        assert_eq!(range_start("bytes 100-199/200"), Some(100));
        assert_eq!(range_start("bytes */200"), None);
        assert_eq!(range_start("items 1-2/3"), None);
    }
}
