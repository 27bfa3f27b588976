//! `POST /v1/images/generations` in the shape of OpenAI's Images API:
//! `prompt`, `n`, `size`, `response_format` (`b64_json` only), `quality`
//! (the default only), answered with the PNGs `cleave image` writes;
//! `seed`, `num_inference_steps`, `guidance_scale` and
//! `max_sequence_length` as extensions, defaulting as diffusers'
//! `FluxPipeline` does.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use cleave_engine::ImageSettings;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::oneshot;

use crate::api::{parse, ApiError};
use crate::dispatch;
use crate::images::{ImageJob, Images};
use crate::routes::{body, fresh_seed, refusal};
use crate::{AppState, ImageService};

/// A request to `/v1/images/generations`. Fields OpenAI defines that do
/// not change a PNG (`user`, ...) are accepted and ignored; those that
/// would and that cleave cannot honour are refused by name.
#[derive(Debug, Default, Deserialize)]
pub struct ImageRequest {
    /// Must name the served pipeline when given.
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub n: Option<usize>,
    /// `"WxH"`, or `"auto"` for the pipeline's default.
    pub size: Option<String>,
    pub response_format: Option<String>,
    pub output_format: Option<String>,
    /// `"auto"` or `"standard"` (OpenAI's defaults) only.
    pub quality: Option<String>,
    /// DALL·E 3's `"vivid"` or `"natural"`: refused, cleave has no styles.
    pub style: Option<String>,
    pub seed: Option<u64>,
    pub num_inference_steps: Option<usize>,
    pub guidance_scale: Option<f64>,
    pub max_sequence_length: Option<usize>,
}

/// Images one request may ask for, as OpenAI's API allows for most models.
const MAX_IMAGES: usize = 4;

/// The settings of a request's first image, and how many images it wants.
fn check(service: &ImageService, request: ImageRequest) -> Result<(ImageSettings, usize), ApiError> {
    let invalid = |message: String, field: &str| ApiError::invalid(message, Some(field.into()));
    let prompt = request
        .prompt
        .ok_or_else(|| invalid("'prompt' is required".into(), "prompt"))?;
    ImageSettings::check_prompt(&prompt).map_err(|why| invalid(why, "prompt"))?;
    let n = request.n.unwrap_or(1);
    if !(1..=MAX_IMAGES).contains(&n) {
        return Err(invalid(format!("n is {n}: ask for 1 to {MAX_IMAGES} images"), "n"));
    }
    match request.response_format.as_deref() {
        None | Some("b64_json") => {}
        Some("url") => {
            return Err(invalid(
                "cleave serves images as b64_json only: it keeps no files to link to".into(),
                "response_format",
            ))
        }
        Some(other) => {
            return Err(invalid(
                format!("response_format '{other}' is not one of b64_json, url"),
                "response_format",
            ))
        }
    }
    if let Some(format) = request.output_format.as_deref().filter(|f| *f != "png") {
        return Err(invalid(
            format!("output_format '{format}': cleave writes PNG only"),
            "output_format",
        ));
    }
    match request.quality.as_deref() {
        None | Some("auto" | "standard") => {}
        Some(other) => {
            return Err(invalid(
                format!(
                    "quality '{other}': cleave draws at one quality, the default (auto or standard); \
                     num_inference_steps sets how many denoising steps it takes"
                ),
                "quality",
            ))
        }
    }
    if let Some(style) = request.style.as_deref() {
        return Err(invalid(
            format!(
                "style '{style}': cleave's pipelines have no styles; leave it out and describe the style in the prompt"
            ),
            "style",
        ));
    }
    let (width, height) = size(service, request.size.as_deref())?;
    let steps = request.num_inference_steps.unwrap_or(ImageSettings::DEFAULT_STEPS);
    if !(1..=ImageSettings::MAX_STEPS).contains(&steps) {
        return Err(invalid(
            format!(
                "num_inference_steps is {steps}: it must be 1 to {}",
                ImageSettings::MAX_STEPS
            ),
            "num_inference_steps",
        ));
    }
    let guidance = request.guidance_scale.unwrap_or(ImageSettings::DEFAULT_GUIDANCE);
    // The pipeline takes it as an f32: 1e39 is finite only as an f64.
    if !((guidance as f32).is_finite() && guidance >= 0.0) {
        return Err(invalid(
            format!(
                "guidance_scale {} is not a number of at least 0 that a 32-bit float holds",
                crate::budget::as_sent(guidance)
            ),
            "guidance_scale",
        ));
    }
    let max_t5 = ImageSettings::MAX_T5_TOKENS;
    let max_sequence_length = request.max_sequence_length.unwrap_or(max_t5);
    if !(1..=max_t5).contains(&max_sequence_length) {
        return Err(invalid(
            format!("max_sequence_length is {max_sequence_length}: FLUX's T5 takes 1 to {max_t5} tokens"),
            "max_sequence_length",
        ));
    }
    let settings = ImageSettings {
        prompt,
        height,
        width,
        steps,
        guidance,
        max_sequence_length,
        seed: request.seed.unwrap_or_else(fresh_seed),
    };
    Ok((settings, n))
}

/// `(width, height)` from `"WxH"`: sides that are multiples of the
/// pipeline's latent patch (16 pixels for FLUX.1) and within the size the
/// server was planned for.
fn size(service: &ImageService, size: Option<&str>) -> Result<(usize, usize), ApiError> {
    let (max_width, max_height) = service.max_size;
    let text = match size {
        None | Some("auto") => {
            let side = ImageSettings::DEFAULT_SIDE;
            return Ok((side.min(max_width), side.min(max_height)));
        }
        Some(text) => text,
    };
    let unit = service.dir.latents.pixels_per_patch();
    let side = |s: &str| s.trim().parse::<usize>().ok().filter(|&v| v > 0 && v % unit == 0);
    let sides = text.split_once('x').and_then(|(w, h)| Some((side(w)?, side(h)?)));
    let Some((width, height)) = sides else {
        return Err(ApiError::invalid(
            format!("size '{text}' is not WIDTHxHEIGHT with both sides positive multiples of {unit} (e.g. 1024x1024)"),
            Some("size".into()),
        ));
    };
    if width > max_width || height > max_height {
        return Err(ApiError::invalid(
            format!("size {text} is larger than this server's {max_width}x{max_height} (--max-image-size)"),
            Some("size".into()),
        ));
    }
    Ok((width, height))
}

/// Checks the request, queues it on the least-loaded replica and answers
/// with its PNGs once all are drawn. A client that goes away drops the
/// answer's receiver, which stops the job at its next step.
pub async fn generations(
    state: Arc<AppState>,
    body_bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let service = state.images()?;
    let request: ImageRequest = parse(&body(&state, body_bytes)?)?;
    state.check_model(request.model.as_deref())?;
    let (settings, n) = check(service, request)?;
    let (reply, answer) = oneshot::channel();
    let replica = service
        .dispatcher
        .submit(ImageJob {
            request: Images { settings, n },
            reply,
        })
        .map_err(refusal)?;
    let pngs = dispatch::answer(answer, &replica, "an image").await?;
    let data: Vec<_> = pngs
        .iter()
        .map(|png| json!({"b64_json": base64::engine::general_purpose::STANDARD.encode(png)}))
        .collect();
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    Ok(Json(json!({"created": created, "data": data})).into_response())
}
