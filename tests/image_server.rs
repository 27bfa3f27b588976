//! `cleave serve` on a FLUX pipeline (../shared/fixtures/flux-tiny): the
//! official openai client gets exactly the PNG `cleave image` writes, two
//! groups draw two images at once, a busy server answers 503, bad requests
//! name their field, and a client that goes away frees its replica.

use crate::common;

use std::io::Write;
use std::thread;
use std::time::{Duration, Instant};

use base64::Engine;
use common::{fixture, metric, post, run_openai_script, test_device_name, wait_until, Server};
use serde_json::{json, Value};

const PROMPT: &str = "A painting of a squirrel eating a burger";

fn flux_tiny() -> String {
    fixture("flux-tiny").to_str().unwrap().to_string()
}

/// flux-tiny's fixture call (32×32, T5 cut at 32 tokens) with `steps`.
fn request(seed: u64, steps: usize) -> Value {
    json!({
        "prompt": PROMPT,
        "size": "32x32",
        "seed": seed,
        "num_inference_steps": steps,
        "max_sequence_length": 32,
    })
}

/// The PNGs of a 200 answer.
fn pngs(answer: &Value) -> Vec<Vec<u8>> {
    answer["data"]
        .as_array()
        .unwrap_or_else(|| panic!("no data: {answer}"))
        .iter()
        .map(|image| {
            let b64 = image["b64_json"].as_str().unwrap();
            base64::engine::general_purpose::STANDARD.decode(b64).unwrap()
        })
        .collect()
}

#[test]
fn the_openai_client_gets_the_png_cleave_image_writes() {
    let server = Server::start(&["-m", &flux_tiny()]);
    let out = tempfile::TempDir::new().unwrap();
    run_openai_script(
        "openai_images.py",
        &[&server.base, PROMPT, out.path().to_str().unwrap()],
    );
    let read = |name: &str| std::fs::read(out.path().join(name)).unwrap();
    let served = read("seed42.png");
    assert!(
        served == common::flux_tiny_png(PROMPT, 42, &[]),
        "the served PNG differs from cleave image's"
    );
    let worst = common::diffusers_pixel_diff(&served, 0);
    assert!(worst <= 1, "pixels differ from diffusers' PNG by {worst}");
    // The images of one request take consecutive seeds.
    assert!(read("n0.png") == served, "n=2's first image is seed 42's");
    assert!(
        read("n1.png") == common::flux_tiny_png(PROMPT, 43, &[]),
        "n=2's second image is seed 43's"
    );
    // The default plan leaves the tiny pipeline's modules loaded.
    assert_eq!(metric(&server, "cleave_pipeline_modules_loaded{group=\"0\"}"), 1);
    assert_eq!(metric(&server, "cleave_images_total{group=\"0\"}"), 3);
}

/// Modules loaded on use draw the same image as modules kept loaded, and
/// two groups draw two images at the same time.
#[test]
fn two_groups_draw_two_images_at_once() {
    let device = test_device_name();
    let groups = format!("{device};diffusion={device}&{device}");
    let server = Server::start(&["-m", &flux_tiny(), "--groups", &groups, "--pipeline-modules", "on-use"]);
    assert_eq!(metric(&server, "cleave_pipeline_modules_loaded{group=\"1\"}"), 0);
    let both_busy = std::sync::atomic::AtomicBool::new(false);
    let answers: Vec<Value> = thread::scope(|scope| {
        let requests: Vec<_> = [(42, 4), (7, 60)]
            .into_iter()
            .map(|(seed, steps)| {
                let server = &server;
                scope.spawn(move || post(server, "/v1/images/generations", &request(seed, steps)))
            })
            .collect();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(60) && !requests.iter().all(|r| r.is_finished()) {
            let busy = |group: &str| metric(&server, &format!("cleave_images_in_progress{{group=\"{group}\"}}"));
            if busy("0") == 1 && busy("1") == 1 {
                both_busy.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            thread::sleep(Duration::from_millis(10));
        }
        requests
            .into_iter()
            .map(|r| {
                let (status, _, answer) = r.join().unwrap();
                assert_eq!(status, 200, "{answer}");
                answer
            })
            .collect()
    });
    assert!(
        both_busy.load(std::sync::atomic::Ordering::Relaxed),
        "the two groups never drew at the same time"
    );
    assert!(
        pngs(&answers[0])[0] == common::flux_tiny_png(PROMPT, 42, &[]),
        "an image from modules loaded on use differs from cleave image's"
    );
}

/// Opens a raw connection and sends `body` to /v1/images/generations,
/// without reading the answer.
fn send_raw(server: &Server, body: &Value) -> std::net::TcpStream {
    let address = server.base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    let body = body.to_string();
    write!(
        stream,
        "POST /v1/images/generations HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    stream
}

/// With its one group drawing and no queue, the server answers 503 with
/// Retry-After; when the drawing client goes away, its image stops at the
/// next step and the next request is served.
#[test]
fn a_busy_server_answers_503_and_a_disconnect_frees_the_replica() {
    let server = Server::start(&["-m", &flux_tiny(), "--queue", "0", "--max-image-size", "64x64"]);
    let long = send_raw(&server, &request(1, 1000));
    let step = || metric(&server, "cleave_image_step{group=\"0\"}");
    wait_until("the long image to start denoising", || step() > 0);
    let (status, retry, answer) = post(&server, "/v1/images/generations", &request(42, 4));
    assert_eq!(status, 503, "{answer}");
    assert_eq!(retry.as_deref(), Some("1"));
    drop(long);
    wait_until("the replica to be free", || {
        metric(&server, "cleave_images_in_progress{group=\"0\"}") == 0
    });
    let (status, _, answer) = post(&server, "/v1/images/generations", &request(42, 4));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        metric(&server, "cleave_images_total{group=\"0\"}"),
        1,
        "the cancelled image is not counted"
    );
}

#[test]
fn bad_image_requests_name_their_field() {
    let server = Server::start(&["-m", &flux_tiny(), "--max-image-size", "64x64"]);
    let with = |field: &str, value: Value| {
        let mut body = request(42, 4);
        body[field] = value;
        body
    };
    let cases = [
        (with("size", json!("33x32")), "size"),
        (with("size", json!("32")), "size"),
        (with("size", json!("128x128")), "size"),
        (with("n", json!(0)), "n"),
        (with("n", json!(5)), "n"),
        (with("n", json!(-1)), "n"),
        (with("response_format", json!("url")), "response_format"),
        (with("output_format", json!("jpeg")), "output_format"),
        (with("quality", json!("hd")), "quality"),
        (with("quality", json!("high")), "quality"),
        (with("quality", json!(1)), "quality"),
        (with("style", json!("vivid")), "style"),
        (with("style", json!("natural")), "style"),
        (with("num_inference_steps", json!(0)), "num_inference_steps"),
        (with("guidance_scale", json!(-1.0)), "guidance_scale"),
        // Finite as f64, infinite as the f32 the pipeline takes.
        (with("guidance_scale", json!(1e39)), "guidance_scale"),
        (with("max_sequence_length", json!(513)), "max_sequence_length"),
        (json!({"size": "32x32"}), "prompt"),
        (with("prompt", json!("x".repeat(65 << 10))), "prompt"),
    ];
    for (body, field) in cases {
        let started = std::time::Instant::now();
        let (status, _, answer) = post(&server, "/v1/images/generations", &body);
        assert_eq!(status, 400, "{field}: {answer}");
        assert_eq!(answer["error"]["param"], field, "{field}: {answer}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{field}: {:?}",
            started.elapsed()
        );
    }
    let (status, _, answer) = post(&server, "/v1/images/generations", &with("model", json!("dall-e-3")));
    assert_eq!(
        (status, &answer["error"]["code"]),
        (404, &json!("model_not_found")),
        "{answer}"
    );
    // A guidance so large that the latents overflow: named, not a black PNG.
    let (status, _, answer) = post(&server, "/v1/images/generations", &with("guidance_scale", json!(1e38)));
    assert_eq!(status, 400, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("holds a non-finite value"), "{message}");
    let (status, _, answer) = post(&server, "/v1/chat/completions", &json!({"messages": []}));
    assert_eq!(status, 404, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/v1/images/generations"),
        "{answer}"
    );
    // The server still draws after all that, at the qualities that mean
    // the default too.
    for quality in ["standard", "auto"] {
        let mut body = request(42, 1);
        body["quality"] = json!(quality);
        let (status, _, answer) = post(&server, "/v1/images/generations", &body);
        assert_eq!(status, 200, "{quality}: {answer}");
    }
}

/// A language model's server answers the image route with a 404 that
/// names what it serves.
#[test]
fn a_text_server_names_its_routes_on_the_image_route() {
    let demo = common::shared_model("fortune-llama-3m");
    let server = Server::start(&["-m", demo.to_str().unwrap()]);
    let (status, _, answer) = post(&server, "/v1/images/generations", &request(42, 4));
    assert_eq!(status, 404, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("/v1/completions") && message.contains("not images"),
        "{message}"
    );
}
