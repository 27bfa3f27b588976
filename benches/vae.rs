//! FLUX.1's VAE decoder at 256×256 and 512×512 output, on flux-tiny's
//! widths scaled up four times (channels 32, 64, 96 and 128 where the
//! fixture has 8 to 32; 16 latent channels, 4 norm groups, three resnets an
//! up block, attention in the mid block) with random bf16 weights, on one
//! device: seconds per decode. Most of its work is the 3×3 convolutions.
//!
//! `cargo bench --bench vae` (CLEAVE_BENCH_DEVICE picks the adapter). Each
//! figure is the median of several decodes after a warm-up.

#[path = "support/device.rs"]
mod device;

// Only its writer and the timing's median are needed here.
#[allow(dead_code)]
#[path = "support/random_model.rs"]
mod random_model;
#[allow(dead_code)]
#[path = "support/timing.rs"]
mod timing;

use std::path::Path;
use std::time::Instant;

use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_hf::Checkpoint;
use cleave_models::{VaeConfig, VaeDecoder};
use cleave_nn::Placed;
use cleave_shaders::cubecl::prelude::*;

const CHANNELS: [usize; 4] = [32, 64, 96, 128];
const LATENT: usize = 16;
const RESNETS: usize = 3;
const SIDES: [usize; 2] = [256, 512];
const RUNS: usize = 3;

/// A GroupNorm's, or a conv's (`[out, inp, k, k]`), weight and bias.
fn norm(name: &str, c: usize) -> [(String, Vec<usize>); 2] {
    [(format!("{name}.weight"), vec![c]), (format!("{name}.bias"), vec![c])]
}

fn conv(name: &str, inp: usize, out: usize, k: usize) -> [(String, Vec<usize>); 2] {
    [
        (format!("{name}.weight"), vec![out, inp, k, k]),
        (format!("{name}.bias"), vec![out]),
    ]
}

fn resnet(name: &str, inp: usize, out: usize) -> Vec<(String, Vec<usize>)> {
    let mut list: Vec<_> = [
        norm(&format!("{name}.norm1"), inp),
        conv(&format!("{name}.conv1"), inp, out, 3),
        norm(&format!("{name}.norm2"), out),
        conv(&format!("{name}.conv2"), out, out, 3),
    ]
    .into_iter()
    .flatten()
    .collect();
    if inp != out {
        list.extend(conv(&format!("{name}.conv_shortcut"), inp, out, 1));
    }
    list
}

/// diffusers' `AutoencoderKL` decoder tensors for CHANNELS.
fn tensors() -> Vec<(String, Vec<usize>)> {
    let top = CHANNELS[CHANNELS.len() - 1];
    let mut list: Vec<_> = conv("decoder.conv_in", LATENT, top, 3).into();
    let mid = "decoder.mid_block";
    list.extend(resnet(&format!("{mid}.resnets.0"), top, top));
    list.extend(norm(&format!("{mid}.attentions.0.group_norm"), top));
    for projection in ["to_q", "to_k", "to_v", "to_out.0"] {
        let name = format!("{mid}.attentions.0.{projection}");
        list.extend([
            (format!("{name}.weight"), vec![top, top]),
            (format!("{name}.bias"), vec![top]),
        ]);
    }
    list.extend(resnet(&format!("{mid}.resnets.1"), top, top));
    let reversed: Vec<usize> = CHANNELS.iter().rev().copied().collect();
    for (i, &out) in reversed.iter().enumerate() {
        let inp = reversed[i.saturating_sub(1)];
        let block = format!("decoder.up_blocks.{i}");
        for r in 0..RESNETS {
            list.extend(resnet(
                &format!("{block}.resnets.{r}"),
                if r == 0 { inp } else { out },
                out,
            ));
        }
        if i + 1 < reversed.len() {
            list.extend(conv(&format!("{block}.upsamplers.0.conv"), out, out, 3));
        }
    }
    list.extend(norm("decoder.conv_norm_out", CHANNELS[0]));
    list.extend(conv("decoder.conv_out", CHANNELS[0], 3, 3));
    list
}

fn config() -> serde_json::Value {
    serde_json::json!({
        "_class_name": "AutoencoderKL", "block_out_channels": CHANNELS, "latent_channels": LATENT,
        "layers_per_block": RESNETS - 1, "norm_num_groups": 4, "out_channels": 3, "in_channels": 3,
        "mid_block_add_attention": true, "use_post_quant_conv": false, "use_quant_conv": false,
        "scaling_factor": 0.3611, "shift_factor": 0.1159
    })
}

/// The decoder loaded once on one device, decoding each of SIDES: the
/// median seconds of each.
struct Bench<'a> {
    dir: &'a Path,
    group: &'a DeviceGroup,
}

impl RuntimeTask for Bench<'_> {
    type Output = Vec<f64>;

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Vec<f64> {
        let config = VaeConfig::from_file(&self.dir.join("config.json")).expect("the written config");
        let checkpoint = Checkpoint::open(self.dir).expect("the written weights");
        let largest = SIDES[SIDES.len() - 1];
        let inventory = config.inventory(&checkpoint, largest, largest);
        let members = cleave_nn::plan_members(self.group);
        let plan = cleave_plan::plan(&inventory, &members, None, &Default::default()).expect("plan");
        let vae = VaeDecoder::load(
            Placed::group(clients, self.group),
            plan,
            &config,
            &checkpoint,
            &mut |_| {},
        )
        .expect("load");
        let scale = 1 << config.upsamplings();
        SIDES
            .iter()
            .map(|&side| {
                let latent = side / scale;
                let latents: Vec<f32> = (0..LATENT * latent * latent)
                    .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
                    .collect();
                // The first decode compiles the kernels.
                vae.decode(&latents, latent, latent).expect("decode");
                let seconds = (0..RUNS)
                    .map(|_| {
                        let start = Instant::now();
                        vae.decode(&latents, latent, latent).expect("decode");
                        start.elapsed().as_secs_f64()
                    })
                    .collect();
                timing::median(seconds)
            })
            .collect()
    }
}

fn main() {
    let dir = tempfile::TempDir::new().expect("a temporary directory");
    random_model::write(dir.path(), &config(), &tensors()).expect("writing the model");
    let device = device::bench_device();
    println!(
        "VAE decoder, channels {CHANNELS:?}, {LATENT} latent channels, {RESNETS} resnets an up block, \
         random bf16 weights, on {device}; median of {RUNS} decodes"
    );
    let group = device::open_alone(&device);
    let seconds = group.run(Bench {
        dir: dir.path(),
        group: &group,
    });
    println!("| output | seconds per decode |");
    println!("| --- | ---: |");
    for (side, seconds) in SIDES.iter().zip(seconds) {
        println!("| {side}x{side} | {seconds:.2} |");
    }
}
