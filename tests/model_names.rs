//! `-m` takes names as well as paths: a Hugging Face repo, from the local
//! cache or downloaded into it from a hub (here a local server laid out as
//! the hub is), and an ollama model from its store (here a fixture store).
//! Nothing reaches the internet.

use crate::common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use common::fixture;

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const TOKEN: &str = "hf_test_token";

/// One file of a served repo: its bytes, and the etag (for a large file,
/// its LFS sha256) that names its blob.
struct HubFile {
    bytes: Vec<u8>,
    etag: String,
    lfs: bool,
}

#[derive(Default)]
struct HubState {
    repos: BTreeMap<String, BTreeMap<String, HubFile>>,
    /// Repos answered only with `Authorization: Bearer TOKEN`.
    private: Vec<String>,
    /// Every request, as `PATH RANGE`.
    log: Vec<String>,
    /// Files whose next full download is cut off halfway.
    cut_once: Vec<String>,
}

/// A hub on 127.0.0.1: the listing `api/models/ORG/NAME/revision/REV` and
/// `ORG/NAME/resolve/REV/FILE` with range requests, one connection at a
/// time, each closed after its answer.
struct Hub {
    url: String,
    state: Arc<Mutex<HubState>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Hub {
    fn start(state: HubState) -> Hub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(state));
        let stop = Arc::new(AtomicBool::new(false));
        let (shared, stopped) = (state.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(stream) = stream {
                    let _ = answer(stream, &shared);
                }
            }
        });
        Hub {
            url,
            state,
            stop,
            thread: Some(thread),
        }
    }

    fn log(&self) -> Vec<String> {
        self.state.lock().unwrap().log.clone()
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so that it sees `stop` and closes the port.
        let _ = TcpStream::connect(self.url.trim_start_matches("http://"));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn answer(mut stream: TcpStream, state: &Mutex<HubState>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    let mut headers = BTreeMap::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
        }
    }
    let path = request.split_whitespace().nth(1).unwrap_or("/").to_string();
    let range = headers.get("range").cloned();
    let mut state = state.lock().unwrap();
    state.log.push(format!("{path} {}", range.as_deref().unwrap_or("-")));
    let path = path.split('?').next().unwrap_or_default();
    let parts: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
    let (repo, listing) = match parts.as_slice() {
        ["api", "models", org, rest @ ..] => (format!("{org}/{}", rest.first().unwrap_or(&"")), true),
        [org, name, "resolve", _rev, _file] => (format!("{org}/{name}"), false),
        _ => return respond(&mut stream, 404, &[], b"not found"),
    };
    let Some(files) = state.repos.get(&repo) else {
        return respond(
            &mut stream,
            404,
            &[("x-error-code", "RepoNotFound")],
            b"Repository not found",
        );
    };
    let authorized = headers.get("authorization") == Some(&format!("Bearer {TOKEN}"));
    if state.private.contains(&repo) && !authorized {
        return respond(
            &mut stream,
            401,
            &[("x-error-code", "RepoNotFound")],
            b"Invalid credentials",
        );
    }
    if listing {
        let siblings: Vec<serde_json::Value> = files
            .iter()
            .map(|(name, file)| {
                let size = file.bytes.len();
                match file.lfs {
                    true => serde_json::json!({"rfilename": name, "size": size, "blobId": "b".repeat(40),
                                               "lfs": {"sha256": file.etag, "size": size}}),
                    false => serde_json::json!({"rfilename": name, "size": size, "blobId": file.etag}),
                }
            })
            .collect();
        let body = serde_json::json!({"id": repo, "sha": COMMIT, "siblings": siblings}).to_string();
        return respond(
            &mut stream,
            200,
            &[("content-type", "application/json")],
            body.as_bytes(),
        );
    }
    let file_name = parts[4];
    let Some(file) = files.get(file_name) else {
        return respond(
            &mut stream,
            404,
            &[("x-error-code", "EntryNotFound")],
            b"Entry not found",
        );
    };
    let total = file.bytes.len();
    let (start, end) = match range.as_deref().and_then(|r| r.strip_prefix("bytes=")) {
        Some(r) => {
            let (a, b) = r.split_once('-').unwrap_or((r, ""));
            let start: usize = a.parse().unwrap_or(0);
            let end: usize = b.parse().map_or(total.saturating_sub(1), |e: usize| e.min(total - 1));
            (start, end)
        }
        None => (0, total - 1),
    };
    let body = if start >= total || end < start {
        Vec::new()
    } else {
        file.bytes[start..=end].to_vec()
    };
    let etag = format!("\"{}\"", file.etag);
    let content_range = format!("bytes {start}-{end}/{total}");
    let headers = [
        ("x-repo-commit", COMMIT),
        ("etag", etag.as_str()),
        ("content-range", content_range.as_str()),
    ];
    let cut = body.len() > 1 && state.cut_once.iter().any(|f| f == file_name);
    if cut {
        state.cut_once.retain(|f| f != file_name);
        drop(state);
        // The whole length promised, half of it sent, the connection closed.
        write_head(&mut stream, 206, &headers, body.len())?;
        stream.write_all(&body[..body.len() / 2])?;
        return stream.flush();
    }
    drop(state);
    respond(&mut stream, 206, &headers, &body)
}

fn write_head(stream: &mut TcpStream, status: u16, headers: &[(&str, &str)], length: usize) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {status} X\r\ncontent-length: {length}\r\nconnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())
}

fn respond(stream: &mut TcpStream, status: u16, headers: &[(&str, &str)], body: &[u8]) -> std::io::Result<()> {
    write_head(stream, status, headers, body.len())?;
    stream.write_all(body)?;
    stream.flush()
}

/// A repo of fixture files, each under its file name: JSON files as
/// small git files, the rest as LFS files, each named by its hash.
fn repo_of(files: &[PathBuf]) -> BTreeMap<String, HubFile> {
    let named: Vec<(String, PathBuf)> = files
        .iter()
        .map(|path| (path.file_name().unwrap().to_string_lossy().into_owned(), path.clone()))
        .collect();
    repo_of_named(&named)
}

fn repo_of_named(files: &[(String, PathBuf)]) -> BTreeMap<String, HubFile> {
    files
        .iter()
        .map(|(name, path)| {
            let name = name.clone();
            let lfs = !name.ends_with(".json");
            let bytes = std::fs::read(path).unwrap();
            let etag = if lfs {
                common::sha256_hex(&bytes)
            } else {
                common::git_blob_id(&bytes)
            };
            (name, HubFile { bytes, etag, lfs })
        })
        .collect()
}

fn llama_tiny_files() -> Vec<PathBuf> {
    [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    .iter()
    .map(|f| fixture("llama-tiny").join(f))
    .collect()
}

fn gguf(quant: &str) -> PathBuf {
    fixture("llama-gguf").join(format!("llama-gguf-{quant}.gguf"))
}

/// Every file under `dir`, by its path relative to `dir`.
fn files_under(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            files.extend(files_under(&path).into_iter().map(|(n, p)| (format!("{name}/{n}"), p)));
        } else {
            files.push((name, path));
        }
    }
    files
}

/// A hub serving `org/llama-tiny`, `org/tiny-GGUF` (two quants), the
/// private `org/private` and the pipeline `org/flux-tiny`.
fn hub() -> Hub {
    let mut state = HubState::default();
    state.repos.insert(
        "org/flux-tiny".into(),
        repo_of_named(&files_under(&fixture("flux-tiny"))),
    );
    state
        .repos
        .insert("org/llama-tiny".into(), repo_of(&llama_tiny_files()));
    state.repos.insert("org/private".into(), repo_of(&llama_tiny_files()));
    state.private.push("org/private".into());
    state
        .repos
        .insert("org/tiny-GGUF".into(), repo_of(&[gguf("Q8_0"), gguf("Q4_K_M")]));
    Hub::start(state)
}

/// cleave with `HF_HOME` in `home`, the hub at `endpoint`, and none of
/// the user's hub, token, ollama or proxy settings.
pub fn cleave_with(home: &Path, endpoint: &str) -> std::process::Command {
    let mut cmd = common::cleave();
    for var in [
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_TOKEN",
        "HF_HUB_OFFLINE",
        "OLLAMA_MODELS",
        "http_proxy",
        "HTTP_PROXY",
        "https_proxy",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("HF_HOME", home).env("HF_ENDPOINT", endpoint);
    cmd
}

const PROMPT: &str = "Once upon a time";

/// stdout of a greedy 4-token run of `model`, and stderr.
fn greedy(cmd: std::process::Command, model: &str) -> (String, String) {
    four_tokens(cmd, model, &["--temp", "0"])
}

/// stdout and stderr of a 4-token run of `model` with `flags`, which must
/// succeed.
fn four_tokens(mut cmd: std::process::Command, model: &str, flags: &[&str]) -> (String, String) {
    let out = cmd
        .args(["run", "-m", model, "-p", PROMPT, "-n", "4", "--ignore-eos"])
        .args(flags)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "cleave run -m {model} failed: {stderr}");
    (stdout, stderr)
}

/// stderr of a run of `model` that must fail.
fn refused(mut cmd: std::process::Command, model: &str) -> String {
    let out = cmd
        .args(["run", "-m", model, "-p", PROMPT, "-n", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "cleave run -m {model} should fail; stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

fn by_path(model: &Path) -> String {
    greedy(common::cleave(), model.to_str().unwrap()).0
}

fn blobs(home: &Path, repo: &str) -> PathBuf {
    home.join("hub")
        .join(format!("models--{}", repo.replace('/', "--")))
        .join("blobs")
}

#[test]
fn a_repo_name_downloads_into_the_hub_cache_and_then_runs_offline() {
    let home = tempfile::tempdir().unwrap();
    let hub = hub();
    let (text, _) = greedy(cleave_with(home.path(), &hub.url), "org/llama-tiny");
    assert_eq!(text, by_path(&fixture("llama-tiny")));

    let repo = home.path().join("hub/models--org--llama-tiny");
    assert_eq!(std::fs::read_to_string(repo.join("refs/main")).unwrap(), COMMIT);
    let snapshot = repo.join("snapshots").join(COMMIT);
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        let link = std::fs::read_link(snapshot.join(file)).unwrap();
        assert!(link.starts_with("../../blobs"), "{file} -> {}", link.display());
    }
    // Each file fetched once, from its first byte.
    let mut fetched: Vec<String> = hub
        .log()
        .iter()
        .filter(|l| l.contains("/resolve/") && l.ends_with("bytes=0-"))
        .map(|l| l.split(' ').next().unwrap().rsplit('/').next().unwrap().to_string())
        .collect();
    fetched.sort();
    let want = [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ];
    assert_eq!(fetched, want, "{:?}", hub.log());

    // The hub gone, the cache is enough, by flag or by HF_HUB_OFFLINE.
    let url = hub.url.clone();
    drop(hub);
    let offline = four_tokens(
        cleave_with(home.path(), &url),
        "org/llama-tiny",
        &["--temp", "0", "--offline"],
    );
    assert_eq!(offline.0, text);
    // The cache named by HF_HUB_CACHE, a revision given as its commit.
    let elsewhere = tempfile::tempdir().unwrap();
    let out = cleave_with(elsewhere.path(), &url)
        .env("HF_HUB_CACHE", home.path().join("hub"))
        .args(["plan", "--offline", "-m", &format!("org/llama-tiny@{COMMIT}")])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut env_offline = cleave_with(home.path(), &url);
    env_offline.env("HF_HUB_OFFLINE", "1");
    let stderr = refused(env_offline, "org/other-model");
    assert!(
        stderr.contains("org/other-model") && stderr.contains("--offline"),
        "{stderr}"
    );
}

#[test]
fn a_gguf_repo_runs_the_quant_its_name_asks_for() {
    let home = tempfile::tempdir().unwrap();
    let hub = hub();
    let (text, _) = greedy(cleave_with(home.path(), &hub.url), "org/tiny-GGUF:q8_0");
    assert_eq!(text, by_path(&gguf("Q8_0")));
    assert!(!hub.log().iter().any(|l| l.contains("Q4_K_M")), "{:?}", hub.log());

    let stderr = refused(cleave_with(home.path(), &hub.url), "org/tiny-GGUF");
    assert!(
        stderr.contains("org/tiny-GGUF:QUANT") && stderr.contains("llama-gguf-Q4_K_M.gguf"),
        "{stderr}"
    );
    let stderr = refused(cleave_with(home.path(), &hub.url), "org/tiny-GGUF:Q2_K");
    assert!(stderr.contains("no .gguf file's name holds 'Q2_K'"), "{stderr}");
}

#[test]
fn a_pipeline_repo_downloads_its_components_and_nothing_else() {
    let home = tempfile::tempdir().unwrap();
    let hub = hub();
    let out = cleave_with(home.path(), &hub.url)
        .args(["plan", "-m", "org/flux-tiny"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let snapshot = home.path().join("hub/models--org--flux-tiny/snapshots").join(COMMIT);
    let mut got: Vec<String> = files_under(&snapshot).into_iter().map(|(name, _)| name).collect();
    got.sort();
    let mut want: Vec<String> = files_under(&fixture("flux-tiny"))
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| name.contains('/') || name == "model_index.json")
        .collect();
    want.sort();
    // The fixture's reference images and tensors at the root are not the pipeline's.
    assert_eq!(got, want);
}

#[test]
fn a_partial_download_is_resumed_never_loaded() {
    let home = tempfile::tempdir().unwrap();
    let hub = hub();
    let weights = std::fs::read(fixture("llama-tiny").join("model.safetensors")).unwrap();
    let etag = hub.state.lock().unwrap().repos["org/llama-tiny"]["model.safetensors"]
        .etag
        .clone();

    // What huggingface_hub left of an interrupted download: not in the
    // snapshot, so --offline does not take it for the model.
    let blobs = blobs(home.path(), "org/llama-tiny");
    std::fs::create_dir_all(&blobs).unwrap();
    let half = weights.len() / 2;
    std::fs::write(blobs.join(format!("{etag}.incomplete")), &weights[..half]).unwrap();
    let mut offline = cleave_with(home.path(), &hub.url);
    offline.env("HF_HUB_OFFLINE", "1");
    let stderr = refused(offline, "org/llama-tiny");
    assert!(stderr.contains("is not complete in the Hugging Face cache"), "{stderr}");

    // Online, the download goes on from where it stopped.
    let (text, _) = greedy(cleave_with(home.path(), &hub.url), "org/llama-tiny");
    assert_eq!(text, by_path(&fixture("llama-tiny")));
    let resumed = format!("/org/llama-tiny/resolve/{COMMIT}/model.safetensors bytes={half}-");
    assert!(hub.log().contains(&resumed), "{:?}", hub.log());
    assert_eq!(std::fs::read(blobs.join(&etag)).unwrap(), weights);
}

#[test]
fn a_cut_connection_is_resumed_and_a_part_longer_than_the_file_replaced() {
    let home = tempfile::tempdir().unwrap();
    let hub = hub();
    let weights = std::fs::read(fixture("llama-tiny").join("model.safetensors")).unwrap();
    let etag = hub.state.lock().unwrap().repos["org/llama-tiny"]["tokenizer.json"]
        .etag
        .clone();
    hub.state.lock().unwrap().cut_once.push("model.safetensors".into());
    // Not a prefix of the file it stands for: it must not be resumed.
    let blobs = blobs(home.path(), "org/llama-tiny");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(blobs.join(format!("{etag}.incomplete")), vec![b'x'; 1 << 20]).unwrap();

    let (text, _) = greedy(cleave_with(home.path(), &hub.url), "org/llama-tiny");
    assert_eq!(text, by_path(&fixture("llama-tiny")));
    let snapshot = home.path().join("hub/models--org--llama-tiny/snapshots").join(COMMIT);
    assert_eq!(std::fs::read(snapshot.join("model.safetensors")).unwrap(), weights);
    let retried = format!(
        "/org/llama-tiny/resolve/{COMMIT}/model.safetensors bytes={}-",
        weights.len() / 2
    );
    assert!(hub.log().contains(&retried), "{:?}", hub.log());
}

#[test]
fn a_missing_repo_a_private_repo_and_no_hub_are_named_errors() {
    let home = tempfile::tempdir().unwrap();
    let hub = hub();
    let stderr = refused(cleave_with(home.path(), &hub.url), "org/nothing-here");
    assert!(
        stderr.contains("org/nothing-here@main: no such repository or revision"),
        "{stderr}"
    );

    let stderr = refused(cleave_with(home.path(), &hub.url), "org/private");
    assert!(stderr.contains("org/private needs a token: set HF_TOKEN"), "{stderr}");
    // With the token, the listing is answered (the model is then planned).
    let out = cleave_with(home.path(), &hub.url)
        .env("HF_TOKEN", TOKEN)
        .args(["plan", "-m", "org/private"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let url = hub.url.clone();
    drop(hub);
    let stderr = refused(cleave_with(home.path(), &url), "org/llama-tiny");
    assert!(stderr.contains(&format!("cannot reach the hub at {url}")), "{stderr}");

    let stderr = refused(cleave_with(home.path(), &url), "no-such-dir/a/b");
    assert!(
        stderr.contains("no file or directory no-such-dir/a/b") && stderr.contains("not a Hugging Face repo name"),
        "{stderr}"
    );
}

const DIGEST_MODEL: &str = "1111111111111111111111111111111111111111111111111111111111111111";
const DIGEST_PARAMS: &str = "2222222222222222222222222222222222222222222222222222222222222222";
const DIGEST_TEMPLATE: &str = "3333333333333333333333333333333333333333333333333333333333333333";

/// An ollama store holding `tiny:latest`: llama-gguf's Q8_0 file, a
/// template and parameters (greedy sampling, no repeat penalty, and one
/// cleave has no flag for); the model layer's size as
/// the manifest gives it is `size_offset` off.
fn ollama_store(size_offset: i64) -> tempfile::TempDir {
    let store = tempfile::tempdir().unwrap();
    let blobs = store.path().join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let model = blobs.join(format!("sha256-{DIGEST_MODEL}"));
    std::fs::copy(gguf("Q8_0"), &model).unwrap();
    let params = br#"{"temperature": 0, "stop": ["<|eot_id|>"], "repeat_penalty": 1, "mirostat": 2}"#;
    std::fs::write(blobs.join(format!("sha256-{DIGEST_PARAMS}")), params).unwrap();
    let template = b"{{ .Prompt }}";
    std::fs::write(blobs.join(format!("sha256-{DIGEST_TEMPLATE}")), template).unwrap();
    let size = std::fs::metadata(&model).unwrap().len() as i64 + size_offset;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                   "digest": format!("sha256:{DIGEST_TEMPLATE}"), "size": template.len()},
        "layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": format!("sha256:{DIGEST_MODEL}"), "size": size},
            {"mediaType": "application/vnd.ollama.image.template", "digest": format!("sha256:{DIGEST_TEMPLATE}"),
             "size": template.len()},
            {"mediaType": "application/vnd.ollama.image.params", "digest": format!("sha256:{DIGEST_PARAMS}"),
             "size": params.len()},
        ]
    });
    let dir = store.path().join("manifests/registry.ollama.ai/library/tiny");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("latest"), manifest.to_string()).unwrap();
    store
}

fn cleave_in(store: &Path) -> std::process::Command {
    let mut cmd = common::cleave();
    cmd.env("OLLAMA_MODELS", store);
    cmd
}

#[test]
fn an_ollama_model_runs_its_gguf_blob_with_its_parameters() {
    let store = ollama_store(0);
    let want = by_path(&gguf("Q8_0"));
    assert_eq!(greedy(cleave_in(store.path()), "ollama:tiny").0, want);
    // No --temp: the model's parameters make it greedy.
    let (stdout, stderr) = four_tokens(cleave_in(store.path()), "ollama:tiny:latest", &[]);
    assert_eq!(stdout, want);
    assert!(
        stderr.contains("ollama parameters taken: temperature 0, repeat_penalty 1"),
        "{stderr}"
    );
    assert!(
        stderr.contains("not used") && stderr.contains("stop, mirostat"),
        "{stderr}"
    );

    let out = cleave_in(store.path())
        .args(["plan", "-m", "ollama:tiny"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("Go chat template is not used"), "{stdout}");
}

#[test]
fn an_ollama_blob_of_the_wrong_size_a_missing_model_and_an_unknown_tag_are_named() {
    let store = ollama_store(1);
    let stderr = refused(cleave_in(store.path()), "ollama:tiny");
    assert!(
        stderr.contains(&format!("sha256-{DIGEST_MODEL}")) && stderr.contains("bytes, but"),
        "{stderr}"
    );

    let store = ollama_store(0);
    let stderr = refused(cleave_in(store.path()), "ollama:absent");
    assert!(stderr.contains("ollama model absent:latest: no manifest"), "{stderr}");
    let stderr = refused(cleave_in(store.path()), "ollama:tiny:q9");
    assert!(
        stderr.contains("has no tag 'q9'") && stderr.contains("(it has: latest)"),
        "{stderr}"
    );

    // A model layer that is not GGUF.
    let blob = store.path().join(format!("blobs/sha256-{DIGEST_MODEL}"));
    let size = std::fs::metadata(&blob).unwrap().len() as usize;
    std::fs::remove_file(&blob).unwrap();
    std::fs::write(&blob, vec![0u8; size]).unwrap();
    let stderr = refused(cleave_in(store.path()), "ollama:tiny");
    assert!(stderr.contains("not a GGUF file"), "{stderr}");
}
