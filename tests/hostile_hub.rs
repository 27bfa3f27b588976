//! A hub that lies, stalls, drips, loops and redirects elsewhere (a local
//! server on 127.0.0.1): every case ends in bounded time with an error
//! naming the fault, the token reaches no other origin, and nothing
//! outside the test's cache changes, checked by walking a victim folder
//! beside it.

use crate::common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::fixture;

const COMMIT: &str = "89abcdef0123456789abcdef0123456789abcdef";
const TOKEN: &str = "hf_secret";

/// What the server was asked: the path, and the token if one came.
#[derive(Clone, Debug)]
struct Asked {
    path: String,
    authorization: Option<String>,
}

type Handler = dyn Fn(&str, &mut TcpStream) + Send + Sync;

/// A server that answers each connection, on a thread of its own (so that
/// a stalled answer holds up no other), as `handler` says.
struct Scripted {
    url: String,
    asked: Arc<Mutex<Vec<Asked>>>,
}

impl Scripted {
    fn start(handler: impl Fn(&str, &mut TcpStream) + Send + Sync + 'static) -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let asked = Arc::new(Mutex::new(Vec::new()));
        let log = asked.clone();
        let handler: Arc<Handler> = Arc::new(handler);
        // The thread ends with the test binary; each test's port is its own.
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                let (handler, log) = (handler.clone(), log.clone());
                std::thread::spawn(move || {
                    if let Some(asked) = read_request(&stream) {
                        log.lock().unwrap().push(asked.clone());
                        handler(&asked.path, &mut stream);
                    }
                });
            }
        });
        Scripted { url, asked }
    }

    fn asked(&self) -> Vec<Asked> {
        self.asked.lock().unwrap().clone()
    }
}

fn read_request(stream: &TcpStream) -> Option<Asked> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let path = line.split_whitespace().nth(1)?.to_string();
    let mut authorization = None;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).ok()? == 0 || header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.trim().eq_ignore_ascii_case("authorization") {
                authorization = Some(value.trim().to_string());
            }
        }
    }
    Some(Asked { path, authorization })
}

fn head(stream: &mut TcpStream, status: u16, headers: &[(&str, String)]) {
    let mut text = format!("HTTP/1.1 {status} X\r\nconnection: close\r\n");
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str("\r\n");
    let _ = stream.write_all(text.as_bytes());
}

fn respond(stream: &mut TcpStream, status: u16, body: &[u8]) {
    head(stream, status, &[("content-length", body.len().to_string())]);
    let _ = stream.write_all(body);
}

fn is_listing(path: &str) -> bool {
    path.starts_with("/api/models/")
}

/// A repo's files: each one's name and bytes.
type Files = Vec<(String, Vec<u8>)>;

/// A listing of `files` (name, bytes), each a small git file named by
/// its blob id.
fn listing(sha: &str, files: &[(String, Vec<u8>)]) -> Vec<u8> {
    let siblings: Vec<serde_json::Value> = files
        .iter()
        .map(|(name, bytes)| {
            serde_json::json!({"rfilename": name, "size": bytes.len(), "blobId": common::git_blob_id(bytes)})
        })
        .collect();
    serde_json::json!({"sha": sha, "siblings": siblings})
        .to_string()
        .into_bytes()
}

/// llama-tiny's files, as the hub would list them.
fn llama_tiny() -> Vec<(String, Vec<u8>)> {
    [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    .iter()
    .map(|f| (f.to_string(), std::fs::read(fixture("llama-tiny").join(f)).unwrap()))
    .collect()
}

/// The file `path` asks for (`/ORG/NAME/resolve/REV/FILE`) among `files`.
fn wanted<'a>(path: &str, files: &'a [(String, Vec<u8>)]) -> Option<&'a [u8]> {
    let file = path.splitn(6, '/').nth(5)?;
    files.iter().find(|(name, _)| name == file).map(|(_, b)| b.as_slice())
}

/// A test's folders: `home` for HF_HOME, and `victim` beside it, which no
/// hub may touch.
struct Ground {
    root: tempfile::TempDir,
}

impl Ground {
    fn new() -> Ground {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("home")).unwrap();
        std::fs::create_dir_all(root.path().join("victim/sub")).unwrap();
        std::fs::write(root.path().join("victim/precious.json"), "{\"keep\": true}").unwrap();
        std::fs::write(root.path().join("victim/sub/data.gguf"), "not yours").unwrap();
        Ground { root }
    }

    fn home(&self) -> PathBuf {
        self.root.path().join("home")
    }

    fn victim(&self) -> PathBuf {
        self.root.path().join("victim")
    }

    /// Every entry outside `home`, with its size and kind.
    fn outside(&self) -> BTreeMap<PathBuf, (u64, bool)> {
        fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, (u64, bool)>) {
            for entry in std::fs::read_dir(dir).unwrap().flatten() {
                let path = entry.path();
                let meta = path.symlink_metadata().unwrap();
                out.insert(path.clone(), (meta.len(), meta.file_type().is_symlink()));
                if meta.is_dir() {
                    walk(&path, out);
                }
            }
        }
        let mut out = BTreeMap::new();
        for entry in std::fs::read_dir(self.root.path()).unwrap().flatten() {
            let path = entry.path();
            if path != self.home() {
                out.insert(
                    path.clone(),
                    (0, path.symlink_metadata().unwrap().file_type().is_symlink()),
                );
                if path.is_dir() {
                    walk(&path, &mut out);
                }
            }
        }
        out
    }

    /// `cleave plan -m MODEL` against `endpoint` with waits of half a
    /// second; its stderr, and whether it succeeded. It must end within
    /// `bound`, without a panic, and change nothing outside `home`.
    fn plan(&self, endpoint: &str, model: &str, env: &[(&str, &str)], bound: Duration) -> (bool, String) {
        let before = self.outside();
        // The hub and cache named here, none of the user's.
        let mut cmd = crate::model_names::cleave_with(&self.home(), endpoint);
        let mut child = cmd
            .env("HF_HUB_ETAG_TIMEOUT", "0.5")
            .env("HF_HUB_DOWNLOAD_TIMEOUT", "0.5")
            .envs(env.iter().copied())
            .args(["plan", "-m", model])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > bound {
                let _ = child.kill();
                panic!("cleave plan -m {model} still ran after {bound:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert!(!stderr.contains("panicked"), "{model}: {stderr}");
        assert_eq!(
            self.outside(),
            before,
            "{model} changed files outside the cache: {stderr}"
        );
        assert_eq!(
            std::fs::read_to_string(self.victim().join("precious.json")).unwrap(),
            "{\"keep\": true}"
        );
        (status.success(), stderr)
    }

    /// `plan` must fail within `bound`, saying `says`.
    fn refused(&self, endpoint: &str, model: &str, env: &[(&str, &str)], bound: Duration, says: &str) {
        let (ok, stderr) = self.plan(endpoint, model, env, bound);
        assert!(!ok, "{model} should be refused: {stderr}");
        assert!(stderr.contains(says), "{model}: expected '{says}' in: {stderr}");
    }
}

const QUICK: Duration = Duration::from_secs(20);

#[test]
fn names_the_listing_gives_never_become_paths_outside_the_cache() {
    let ground = Ground::new();
    let victim = ground.victim().display().to_string();
    let escape = "../../../../../victim";
    let gguf = std::fs::read(fixture("llama-gguf").join("llama-gguf-Q8_0.gguf")).unwrap();
    let cases: Vec<(&str, String, Files, &str)> = vec![
        // A GGUF picked by its quant, named up and out of the snapshot.
        (
            "org/gguf:Q8_0",
            COMMIT.into(),
            vec![(format!("{escape}/sub/m-Q8_0.gguf"), gguf.clone())],
            "which is not a path inside the repo",
        ),
        // An absolute name.
        (
            "org/abs:Q8_0",
            COMMIT.into(),
            vec![(format!("{victim}/m-Q8_0.gguf"), gguf)],
            "which is an absolute path",
        ),
        // A diffusers component, and a sentence-transformers pooling file.
        (
            "org/pipe",
            COMMIT.into(),
            vec![
                ("model_index.json".into(), b"{}".to_vec()),
                (format!("vae/{escape}/x.json"), b"{}".to_vec()),
            ],
            "which is not a path inside the repo",
        ),
        (
            "org/pool",
            COMMIT.into(),
            vec![
                ("config.json".into(), b"{}".to_vec()),
                ("model.safetensors".into(), b"{}".to_vec()),
                (format!("1_Pooling/{escape}/config.json"), b"{}".to_vec()),
            ],
            "which is not a path inside the repo",
        ),
        // A commit that would name a folder outside `snapshots/`.
        (
            "org/commit",
            format!("{escape}/sub"),
            vec![("config.json".into(), b"{}".to_vec())],
            "not a commit hash",
        ),
    ];
    for (model, sha, files, says) in cases {
        let body = listing(&sha, &files);
        let hub = Scripted::start(move |path, stream| match is_listing(path) {
            true => respond(stream, 200, &body),
            false => respond(stream, 200, b"{}"),
        });
        ground.refused(&hub.url, model, &[], QUICK, says);
        assert!(
            hub.asked().iter().all(|a| is_listing(&a.path)),
            "{model}: a file was fetched: {:?}",
            hub.asked()
        );
    }

    // A blob name that would leave `blobs/`.
    let body = serde_json::json!({"sha": COMMIT, "siblings": [
        {"rfilename": "config.json", "size": 2, "blobId": format!("{escape}/precious.json")},
        {"rfilename": "model.safetensors", "size": 2, "lfs": {"sha256": "../../../x", "size": 2}},
    ]})
    .to_string();
    let hub = Scripted::start(move |path, stream| match is_listing(path) {
        true => respond(stream, 200, body.as_bytes()),
        false => respond(stream, 200, b"{}"),
    });
    ground.refused(&hub.url, "org/blob", &[], QUICK, "not a hash");
}

#[test]
fn a_stalled_dripping_cut_or_endless_answer_ends_in_bounded_time() {
    let ground = Ground::new();
    let files: Vec<(String, Vec<u8>)> = ["config.json", "model.safetensors"]
        .iter()
        .map(|f| (f.to_string(), vec![b' '; 1000]))
        .collect();
    let good_listing = listing(COMMIT, &files);

    // The listing: no answer, an answer a byte at a time, one cut short.
    let stalled = Scripted::start(|_, _| std::thread::sleep(Duration::from_secs(30)));
    ground.refused(&stalled.url, "org/m", &[], QUICK, "in time");
    let dripping = Scripted::start(|_, stream| {
        head(stream, 200, &[("content-length", "100000".into())]);
        for _ in 0..600 {
            if stream.write_all(b" ").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    ground.refused(&dripping.url, "org/m", &[], QUICK, "in time");
    let cut = Scripted::start(|_, stream| {
        head(stream, 200, &[("content-length", "1000".into())]);
        let _ = stream.write_all(b"{\"sha\": ");
    });
    ground.refused(&cut.url, "org/m", &[], QUICK, "listing of its files");

    // A file: no byte after the headers, a byte every 0.2 s, more bytes
    // than listed, and a connection cut halfway every time.
    let file_hub = |answer: fn(&mut TcpStream)| {
        let body = good_listing.clone();
        Scripted::start(move |path, stream| match is_listing(path) {
            true => respond(stream, 200, &body),
            false => answer(stream),
        })
    };
    let stalled = file_hub(|stream| {
        head(stream, 200, &[("content-length", "1000".into())]);
        std::thread::sleep(Duration::from_secs(30));
    });
    ground.refused(&stalled.url, "org/m", &[], QUICK, "no byte from");
    let dripping = file_hub(|stream| {
        head(stream, 200, &[("content-length", "1000".into())]);
        for _ in 0..1000 {
            if stream.write_all(b" ").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    ground.refused(&dripping.url, "org/m", &[], QUICK, "slower than 16 KiB/s");
    let endless = file_hub(|stream| {
        head(stream, 200, &[]);
        let chunk = vec![b' '; 1 << 16];
        for _ in 0..100_000 {
            if stream.write_all(&chunk).is_err() {
                return;
            }
        }
    });
    ground.refused(&endless.url, "org/m", &[], QUICK, "sends more than the 1000 bytes");
    let blobs = ground.home().join("hub/models--org--m/blobs");
    let largest = std::fs::read_dir(&blobs)
        .unwrap()
        .flatten()
        .map(|e| e.metadata().unwrap().len())
        .max()
        .unwrap_or(0);
    assert!(
        largest <= 1000,
        "an endless body left {largest} bytes in {}",
        blobs.display()
    );
    let always_cut = file_hub(|stream| {
        head(stream, 200, &[("content-length", "1000".into())]);
        let _ = stream.write_all(&[b' '; 10]);
    });
    ground.refused(&always_cut.url, "org/m", &[], QUICK, "broke off after 10 of 1000 bytes");
    let resolves = always_cut
        .asked()
        .iter()
        .filter(|a| a.path.contains("/resolve/"))
        .count();
    assert_eq!(resolves, 3, "{:?}", always_cut.asked());
}

#[test]
fn a_file_whose_bytes_are_not_the_listed_ones_is_not_kept() {
    let ground = Ground::new();
    let files: Vec<(String, Vec<u8>)> = ["config.json", "model.safetensors"]
        .iter()
        .map(|f| (f.to_string(), vec![b'a'; 100]))
        .collect();
    let body = listing(COMMIT, &files);
    // The listed size, other bytes.
    let hub = Scripted::start(move |path, stream| match is_listing(path) {
        true => respond(stream, 200, &body),
        false => respond(stream, 200, &[b'b'; 100]),
    });
    ground.refused(&hub.url, "org/m", &[], QUICK, "its bytes have the git blob id");
    let blobs = ground.home().join("hub/models--org--m/blobs");
    let kept: Vec<_> = std::fs::read_dir(&blobs).unwrap().flatten().map(|e| e.path()).collect();
    assert!(kept.is_empty(), "{kept:?}");
}

#[test]
fn redirects_are_bounded_and_the_token_goes_only_to_the_hub() {
    let ground = Ground::new();
    let token = [("HF_TOKEN", TOKEN)];
    let looping = Scripted::start(|path, stream| {
        let location = path.to_string();
        head(stream, 302, &[("location", location), ("content-length", "0".into())]);
    });
    ground.refused(&looping.url, "org/m", &[], QUICK, "more than 10 redirects");
    assert!(looping.asked().len() <= 11, "{} requests", looping.asked().len());
    let nowhere = Scripted::start(|_, stream| head(stream, 302, &[("content-length", "0".into())]));
    ground.refused(&nowhere.url, "org/m", &[], QUICK, "with no Location");
    let not_modified = Scripted::start(|_, stream| head(stream, 304, &[]));
    ground.refused(&not_modified.url, "org/m", &[], QUICK, "answered 304");

    // The files live on a CDN of another origin; the hub renames the repo
    // (a relative redirect on its own origin, which keeps the token).
    let files = llama_tiny();
    let served = files.clone();
    let cdn = Scripted::start(move |path, stream| match wanted(path, &served) {
        Some(bytes) => respond(stream, 200, bytes),
        None => respond(stream, 404, b""),
    });
    let (body, cdn_url) = (listing(COMMIT, &files), cdn.url.clone());
    let hub = Scripted::start(move |path, stream| {
        if path.starts_with("/api/models/org/old-name/") {
            let location = path.replace("old-name", "llama-tiny");
            head(stream, 307, &[("location", location), ("content-length", "0".into())]);
        } else if is_listing(path) {
            respond(stream, 200, &body);
        } else {
            head(
                stream,
                302,
                &[("location", format!("{cdn_url}{path}")), ("content-length", "0".into())],
            );
        }
    });
    let (ok, stderr) = ground.plan(&hub.url, "org/old-name", &token, Duration::from_secs(120));
    assert!(ok, "{stderr}");
    let bearer = format!("Bearer {TOKEN}");
    assert!(
        hub.asked()
            .iter()
            .all(|a| a.authorization.as_deref() == Some(bearer.as_str())),
        "{:?}",
        hub.asked()
    );
    assert_eq!(cdn.asked().len(), files.len(), "{:?}", cdn.asked());
    assert!(
        cdn.asked().iter().all(|a| a.authorization.is_none()),
        "{:?}",
        cdn.asked()
    );
}

#[test]
fn the_cache_is_never_followed_out_of_itself() {
    let ground = Ground::new();
    let files = llama_tiny();
    let (served, body) = (files.clone(), listing(COMMIT, &files));
    let hub = Scripted::start(move |path, stream| match (is_listing(path), wanted(path, &served)) {
        (true, _) => respond(stream, 200, &body),
        (false, Some(bytes)) => respond(stream, 200, bytes),
        (false, None) => respond(stream, 404, b""),
    });
    // A snapshot whose config.json links, at another size than the
    // listing's, to a file outside the cache: the link goes, not its target.
    let repo = ground.home().join("hub/models--org--llama-tiny");
    let snapshot = repo.join("snapshots").join(COMMIT);
    std::fs::create_dir_all(&snapshot).unwrap();
    std::os::unix::fs::symlink(ground.victim().join("precious.json"), snapshot.join("config.json")).unwrap();
    let (ok, stderr) = ground.plan(&hub.url, "org/llama-tiny", &[], Duration::from_secs(120));
    assert!(ok, "{stderr}");
    assert!(std::fs::read_link(snapshot.join("config.json"))
        .unwrap()
        .starts_with("../../blobs"));

    // A FIFO (or a device) where a ref or the token should be is refused
    // at once, never read.
    let refs_main = repo.join("refs/main");
    std::fs::remove_file(&refs_main).unwrap();
    let status = std::process::Command::new("mkfifo").arg(&refs_main).status().unwrap();
    assert!(status.success());
    ground.refused(&hub.url, "org/llama-tiny", &[], QUICK, "a FIFO, not a regular file");
    std::fs::remove_file(&refs_main).unwrap();
    let token = ground.home().join("token");
    std::os::unix::fs::symlink("/dev/zero", &token).unwrap();
    ground.refused(&hub.url, "org/another", &[], QUICK, "a device, not a regular file");
    std::fs::remove_file(&token).unwrap();
    assert!(std::process::Command::new("mkfifo")
        .arg(&token)
        .status()
        .unwrap()
        .success());
    ground.refused(&hub.url, "org/another", &[], QUICK, "a FIFO, not a regular file");
}
