//! FLUX.1's VAE decoder (diffusers' `AutoencoderKL.decode`) against
//! ../shared/fixtures/flux-tiny: each prompt's `vae_input` (the final
//! latents, unscaled) decoded to `vae_decoded` within 1e-4, on one device
//! and split by blocks across two logical devices of the same adapter.

use crate::common;

use std::path::Path;

use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_models::{VaeConfig, VaeDecoder};
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::Precision;
use common::{fixture, load_flux_module};

const TOLERANCE: f32 = 1e-4;

/// `p{prompt}.{name}` of `reference.safetensors`, with its shape.
fn reference(prompt: usize, name: &str) -> (Vec<usize>, Vec<f32>) {
    common::FluxReference::open().tensor(&format!("p{prompt}.{name}"))
}

/// The largest absolute difference, checked against the tolerance.
#[track_caller]
fn max_diff(got: &[f32], want: &[f32], what: &str) -> f32 {
    common::max_diff(got, want, what, TOLERANCE)
}

/// Both prompts' latents `[16, h, w]` through the decoder: the images, and
/// the blocks each device ran.
struct Decode<'a> {
    dir: &'a Path,
    group: &'a DeviceGroup,
    latents: &'a [(Vec<f32>, usize, usize)],
    /// What every product is formed at (`None`: the device's default).
    precision: Option<Precision>,
}

impl RuntimeTask for Decode<'_> {
    type Output = (Vec<Vec<f32>>, Vec<std::ops::Range<usize>>);

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Self::Output {
        let (_, h, w) = self.latents[0];
        // Each device holds the weights its plan gives it, give or take the
        // pool's rounding of each buffer (`conv_out.bias`, 3 floats, takes
        // 32 bytes on lavapipe; every other tensor is a multiple of that).
        let (vae, blocks) = load_flux_module(
            clients,
            self.group,
            self.dir,
            VaeConfig::from_file,
            |config, checkpoint| config.inventory(checkpoint, 8 * h, 8 * w),
            |devices, plan, config, checkpoint| VaeDecoder::load(devices, plan, config, checkpoint, &mut |_| {}),
            255,
        );
        let err = vae.decode(&[0.0; 15], 4, 4).unwrap_err().to_string();
        assert!(err.contains("16 channels of 4x4"), "{err}");
        let decode = |(latents, h, w): &(Vec<f32>, usize, usize)| match self.precision {
            Some(precision) => cleave_shaders::with_precision(precision, || vae.decode(latents, *h, *w)),
            None => vae.decode(latents, *h, *w),
        };
        let images = self.latents.iter().map(|latents| decode(latents).unwrap()).collect();
        (images, blocks)
    }
}

fn decode_on(devices: usize) -> Vec<Vec<f32>> {
    let latents: Vec<(Vec<f32>, usize, usize)> = (0..2)
        .map(|p| {
            let (shape, values) = reference(p, "vae_input");
            assert_eq!(shape[..2], [1, 16]);
            (values, shape[2], shape[3])
        })
        .collect();
    let dir = fixture("flux-tiny").join("vae");
    let group = common::logical_group(devices);
    let (images, blocks) = group.run(Decode {
        dir: &dir,
        group: &group,
        latents: &latents,
        precision: None,
    });
    assert_eq!(
        blocks.iter().map(|b| b.len()).sum::<usize>(),
        5,
        "mid block + 4 up blocks"
    );
    if devices == 2 {
        assert!(
            blocks.iter().all(|b| !b.is_empty()),
            "both devices run blocks: {blocks:?}"
        );
        eprintln!("VAE blocks per device: {blocks:?}");
    }
    for (p, image) in images.iter().enumerate() {
        let (shape, want) = reference(p, "vae_decoded");
        assert_eq!(shape, [1, 3, 32, 32]);
        let worst = max_diff(image, &want, &format!("p{p} vae_decoded on {devices} device(s)"));
        eprintln!("p{p} VAE decode on {devices} device(s): max |diff| {worst:e}");
    }
    images
}

#[test]
fn vae_decoder_matches_diffusers_on_one_device() {
    decode_on(1);
}

#[test]
fn vae_decoder_split_across_two_devices_matches_diffusers() {
    let split = decode_on(2);
    let single = decode_on(1);
    for (split, single) in split.iter().zip(&single) {
        max_diff(split, single, "vae_decoded, split vs one device");
    }
}

/// A VAE with a `post_quant_conv` (as in SD, not FLUX.1): the flux-tiny
/// decoder behind a 1×1 conv that permutes the channels, doubles them and
/// adds a bias, fed latents that it turns back into `vae_input`, decodes
/// to the same image.
#[test]
fn post_quant_conv_runs_before_the_decoder() {
    let fixture_dir = fixture("flux-tiny").join("vae");
    let dir = tempfile::tempdir().unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture_dir.join("config.json")).unwrap()).unwrap();
    config["use_post_quant_conv"] = true.into();
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();

    let latent = 16;
    let from = |o: usize| (o * 5 + 3) % latent; // output channel o reads input channel from(o)
    let mut weight = vec![0.0f32; latent * latent];
    for o in 0..latent {
        weight[o * latent + from(o)] = 2.0;
    }
    let bias: Vec<f32> = (0..latent).map(|o| 0.1 * o as f32 - 0.5).collect();
    let bytes = std::fs::read(fixture_dir.join("diffusion_pytorch_model.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let le = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (weight, bias) = (le(&weight), le(&bias));
    let mut tensors: Vec<(String, safetensors::tensor::TensorView)> = file.tensors();
    let f32 = safetensors::Dtype::F32;
    tensors.push((
        "post_quant_conv.weight".into(),
        safetensors::tensor::TensorView::new(f32, vec![latent, latent, 1, 1], &weight).unwrap(),
    ));
    tensors.push((
        "post_quant_conv.bias".into(),
        safetensors::tensor::TensorView::new(f32, vec![latent], &bias).unwrap(),
    ));
    safetensors::serialize_to_file(tensors, None, &dir.path().join("diffusion_pytorch_model.safetensors")).unwrap();

    let (shape, want) = reference(0, "vae_input");
    let (h, w) = (shape[2], shape[3]);
    let mut latents = vec![0.0; want.len()];
    for o in 0..latent {
        let b = 0.1 * o as f32 - 0.5;
        for i in 0..h * w {
            latents[from(o) * h * w + i] = (want[o * h * w + i] - b) / 2.0;
        }
    }
    let group = common::logical_group(1);
    let (images, _) = group.run(Decode {
        dir: dir.path(),
        group: &group,
        latents: &[(latents, h, w)],
        precision: None,
    });
    let worst = max_diff(
        &images[0],
        &reference(0, "vae_decoded").1,
        "decoded through post_quant_conv",
    );
    eprintln!("p0 VAE decode through post_quant_conv: max |diff| {worst:e}");
}

/// A bf16 VAE against diffusers' f32 decode of the f32 weights it was
/// rounded from: the largest differences measured on lavapipe are 6.0e-2
/// at `fast` and 3.8e-2 at `exact` (the weights' rounding alone); twice
/// the first. The images' values lie within ±2.3.
const BF16_TOLERANCE: f32 = 0.12;

/// The fixture's VAE with every tensor rounded to bf16 (as diffusers saves
/// it with `torch_dtype=torch.bfloat16`), decoded at `fast` (convolutions,
/// the attention's projections and its two products take bf16 inputs: on
/// the matrix units where the device has them, emulated here in CI) and at
/// `exact`: both
/// near diffusers' f32 images, and not the same (the rounding is there).
#[test]
fn a_bf16_vae_at_fast_stays_near_the_reference() {
    let dir = common::bf16_copy(&fixture("flux-tiny").join("vae"));
    let latents: Vec<(Vec<f32>, usize, usize)> = (0..2)
        .map(|p| {
            let (shape, values) = reference(p, "vae_input");
            (values, shape[2], shape[3])
        })
        .collect();
    let group = common::logical_group(1);
    let decode = |precision| {
        let task = Decode {
            dir: dir.path(),
            group: &group,
            latents: &latents,
            precision: Some(precision),
        };
        group.run(task).0
    };
    let (fast, exact) = (decode(Precision::Fast), decode(Precision::Exact));
    for p in 0..2 {
        let want = reference(p, "vae_decoded").1;
        let what = |precision: &str| format!("p{p} vae_decoded of bf16 weights at {precision}");
        let worst_fast = common::max_diff(&fast[p], &want, &what("fast"), BF16_TOLERANCE);
        let worst_exact = common::max_diff(&exact[p], &want, &what("exact"), BF16_TOLERANCE);
        eprintln!("p{p} bf16 VAE decode: max |diff| {worst_fast:e} at fast, {worst_exact:e} at exact");
        assert!(fast[p] != exact[p], "{}: the same as at exact", what("fast"));
    }
}

#[test]
fn vae_config_scaling_is_read_from_the_config() {
    let config = VaeConfig::from_file(&fixture("flux-tiny").join("vae/config.json")).unwrap();
    assert_eq!(
        (config.latent_channels, config.scaling_factor, config.shift_factor),
        (16, 0.3611, 0.1159)
    );
    assert_eq!(config.upsamplings(), 3);
}

#[test]
fn unsupported_vae_configs_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    let check = |json: &str, field: &str, reason: &str| {
        std::fs::write(&path, json).unwrap();
        let err = VaeConfig::from_file(&path).unwrap_err().to_string();
        assert!(err.contains(field) && err.contains(reason), "{err}");
    };
    check(
        r#"{"block_out_channels": [8], "layers_per_block": 1, "norm_num_groups": 4}"#,
        "latent_channels",
        "missing",
    );
    check(
        r#"{"latent_channels": 16, "block_out_channels": [8, 12], "layers_per_block": 1, "norm_num_groups": 8}"#,
        "norm_num_groups",
        "12",
    );
    check(
        r#"{"latent_channels": 16, "block_out_channels": [8], "layers_per_block": 1, "norm_num_groups": 4, "act_fn": "gelu"}"#,
        "act_fn",
        "gelu",
    );
}
