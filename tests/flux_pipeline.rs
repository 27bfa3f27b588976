//! The whole FLUX.1 pipeline against what diffusers computed for
//! ../shared/fixtures/flux-tiny: from the prompt and the seed alone, the
//! latents after every step and the decoded image, on one device and with
//! the diffusion transformer split across two and three logical devices;
//! and `cleave image` writing the PNG diffusers wrote.

use crate::common;

use std::ops::ControlFlow;

use cleave_device::DeviceGroup;
use cleave_engine::{generate_image, FluxPlacement, ImageProgress, ImageSettings};
use cleave_models::{FluxDir, FLUX_MODULES};
use cleave_plan::{plan_layers, Streaming};
use common::{fixture, test_device_name, FluxReference};

/// The README's bound for latents; the image is allowed 1e-4.
const LATENT_TOLERANCE: f32 = 1e-5;
const IMAGE_TOLERANCE: f32 = 1e-4;

/// The fixture's call: 32×32, 4 steps, guidance 3.5, T5 cut at 32 tokens,
/// seed 42 + prompt index.
fn settings(index: usize) -> ImageSettings {
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("flux-tiny").join("reference.json")).unwrap()).unwrap();
    ImageSettings {
        prompt: reference["prompts"][index]["prompt"].as_str().unwrap().to_string(),
        height: 32,
        width: 32,
        steps: 4,
        guidance: 3.5,
        max_sequence_length: 32,
        seed: 42 + index as u64,
    }
}

/// Generates both prompts' images with each module on its own group,
/// placed through its own runtime task (as on groups of different
/// runtimes), the modules' outputs crossing between them through the host.
fn generate_both(dir: &FluxDir, groups: &[DeviceGroup]) {
    let reference = FluxReference::open();
    for index in 0..2 {
        let settings = settings(index);
        let plans = groups
            .iter()
            .zip(FLUX_MODULES)
            .map(|(group, module)| {
                let size = (settings.height, settings.width);
                let inventory = dir.inventory(module, size, settings.max_sequence_length).unwrap();
                plan_layers(&inventory, &cleave_nn::plan_members(group), None, Streaming::default()).unwrap()
            })
            .collect();
        let placement = FluxPlacement::open(groups, plans).unwrap();
        let mut steps = 0;
        let (image, _) = generate_image(dir, placement, &settings, &mut |progress| {
            if let ImageProgress::Step {
                index: step, latents, ..
            } = progress
            {
                let want = reference.f32s(&format!("p{index}.latents.step{step}"));
                common::max_diff(
                    latents,
                    &want,
                    &format!("p{index} latents after step {step}"),
                    LATENT_TOLERANCE,
                );
                steps += 1;
            }
            ControlFlow::Continue(())
        })
        .expect("generate");
        assert_eq!(steps, settings.steps);
        let want = reference.f32s(&format!("p{index}.vae_decoded"));
        common::max_diff(&image, &want, &format!("p{index} decoded image"), IMAGE_TOLERANCE);
    }
}

/// Runs the pipeline with the diffusion transformer on `diffusion_devices`
/// logical devices and every other module on one.
fn run(diffusion_devices: usize) {
    let dir = FluxDir::open(&fixture("flux-tiny")).unwrap();
    let groups: Vec<DeviceGroup> = FLUX_MODULES
        .iter()
        .map(|&module| common::logical_group(if module == "diffusion" { diffusion_devices } else { 1 }))
        .collect();
    generate_both(&dir, &groups);
}

#[test]
fn pipeline_matches_diffusers_on_one_device() {
    run(1);
}

#[test]
fn pipeline_matches_diffusers_with_the_transformer_split() {
    run(2);
    run(3);
}

/// `cleave image` writes the PNG diffusers wrote (pixels within one level
/// of 255, where a value within 1e-4 sits on a rounding edge) with the
/// generation parameters in its text chunk; the same seed gives the same
/// file.
#[test]
fn cleave_image_writes_the_diffusers_png() {
    let settings = settings(0);
    let split = [
        "--backend".to_string(),
        format!("diffusion={0}&{0}", test_device_name()),
    ];
    let split: Vec<&str> = split.iter().map(String::as_str).collect();
    let first = common::flux_tiny_png(&settings.prompt, 42, &split);
    assert_eq!(
        first,
        common::flux_tiny_png(&settings.prompt, 42, &split),
        "the same seed and settings give the same file"
    );
    let worst = common::diffusers_pixel_diff(&first, 0);
    assert!(worst <= 1, "pixels differ from diffusers' PNG by {worst}");
    let (_, text) = common::decode_png(&first);
    assert!(text.starts_with(&settings.prompt), "{text}");
    assert!(
        text.contains("Steps: 4") && text.contains("Seed: 42") && text.contains("Size: 32x32"),
        "{text}"
    );
}

/// `--precision` reaches the pipeline: `cleave image` names each device's
/// precision once, and flux-tiny's f32 weights are multiplied exactly at
/// either precision, so both give the same PNG.
#[test]
fn cleave_image_says_its_precision() {
    let settings = settings(0);
    let device = test_device_name();
    let run = |precision: &str| common::flux_tiny_image(&settings.prompt, 42, &["--precision", precision]);
    let (exact, said_exact) = run("exact");
    let (fast, said_fast) = run("fast");
    for (said, precision) in [(&said_exact, "exact"), (&said_fast, "fast")] {
        let line = format!("{device}: prefill products {precision}");
        assert_eq!(said.matches(&line).count(), 1, "{said}");
    }
    assert_eq!(exact, fast, "f32 weights give the same image at either precision");
}

/// Bad requests fail before any work, naming the problem.
#[test]
fn bad_image_requests_say_what_is_wrong() {
    let dir = fixture("flux-tiny");
    let dir = dir.to_str().unwrap();
    let demo = common::shared_model("fortune-llama-3m");
    let cases: [(Vec<&str>, &str); 5] = [
        (
            vec!["-m", demo.to_str().unwrap()],
            "not a pipeline directory (expected model_index.json",
        ),
        (vec!["-m", dir, "--steps", "0"], "--steps must be at least 1"),
        (vec!["-m", dir, "-H", "8", "-W", "8"], "must be at least 16 pixels"),
        (
            vec!["-m", dir, "-o", "/nonexistent/dir/x.png"],
            "/nonexistent/dir is not a directory",
        ),
        (
            vec!["-m", dir, "--backend", "unet=vulkan0"],
            "does not have (it has: te, te2, diffusion, vae)",
        ),
    ];
    for (args, says) in cases {
        let out = common::cleave()
            .arg("image")
            .args(&args)
            .args(["-p", "x"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

/// `cleave plan` places each of a pipeline's modules on the group
/// `--backend` gives it.
#[test]
fn cleave_plan_places_every_module() {
    let dir = fixture("flux-tiny");
    let device = test_device_name();
    let out = common::cleave()
        .args(["plan", "-m", dir.to_str().unwrap(), "--format", "json"])
        .args(["--backend", &format!("diffusion={device}&{device},vae={device}")])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let plans: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let modules: Vec<&str> = plans
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["module"].as_str().unwrap())
        .collect();
    assert_eq!(modules, FLUX_MODULES);
    let diffusion = &plans[2]["devices"];
    assert_eq!(diffusion.as_array().unwrap().len(), 2);
    // The double and single blocks (2 + 3) are the units of the split.
    assert_eq!(
        (&diffusion[0]["blocks"][0], &diffusion[1]["blocks"][1]),
        (&0.into(), &5.into())
    );
}
