//! One FLUX.1 double block and one single block at full width (hidden
//! 3072, 24 heads of 128, MLP 12,288, T5 width 4,096) with random bf16
//! weights, over a 1024x1024 image's 4,096 latent tokens and FluxPipeline's
//! 512 text tokens, on one device: seconds per block and the device's peak
//! memory. Each block ends where the transformer reports its output
//! (`forward_traced`, which waits for the device).
//!
//! `cargo bench --bench flux_block` (CLEAVE_BENCH_DEVICE picks the adapter).
//! One pass: at this size a pass takes minutes on a CPU adapter.

#[path = "support/device.rs"]
mod device;

// Only its writer is needed here.
#[allow(dead_code)]
#[path = "support/random_model.rs"]
mod random_model;

use std::path::Path;
use std::time::Instant;

use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_hf::Checkpoint;
use cleave_models::{FluxConfig, FluxInput, FluxTransformer};
use cleave_nn::Placed;
use cleave_shaders::cubecl::prelude::*;

const HEADS: usize = 24;
const HEAD_DIM: usize = 128;
const HIDDEN: usize = HEADS * HEAD_DIM;
const MLP: usize = 4 * HIDDEN;
const T5_WIDTH: usize = 4096;
const POOLED: usize = 768;
const IN_CHANNELS: usize = 64;
const TIME_CHANNELS: usize = 256;
/// A 1024x1024 image: 128x128 latents packed in 2x2 patches.
const LATENT_SIDE: usize = 64;
const TEXT_TOKENS: usize = 512;

/// A linear layer's weight `[out, inp]` and bias.
fn linear(name: &str, out: usize, inp: usize) -> [(String, Vec<usize>); 2] {
    [
        (format!("{name}.weight"), vec![out, inp]),
        (format!("{name}.bias"), vec![out]),
    ]
}

fn head_norms(attn: &str, names: &[&str]) -> Vec<(String, Vec<usize>)> {
    names
        .iter()
        .map(|n| (format!("{attn}.{n}.weight"), vec![HEAD_DIM]))
        .collect()
}

/// diffusers' `FluxTransformer2DModel` tensors with one block of each kind.
fn tensors() -> Vec<(String, Vec<usize>)> {
    let mut list: Vec<(String, Vec<usize>)> = Vec::new();
    let mut add = |name: &str, out: usize, inp: usize| list.extend(linear(name, out, inp));
    add("x_embedder", HIDDEN, IN_CHANNELS);
    add("context_embedder", HIDDEN, T5_WIDTH);
    for embedder in ["timestep_embedder", "guidance_embedder"] {
        add(&format!("time_text_embed.{embedder}.linear_1"), HIDDEN, TIME_CHANNELS);
        add(&format!("time_text_embed.{embedder}.linear_2"), HIDDEN, HIDDEN);
    }
    add("time_text_embed.text_embedder.linear_1", HIDDEN, POOLED);
    add("time_text_embed.text_embedder.linear_2", HIDDEN, HIDDEN);
    let double = "transformer_blocks.0";
    add(&format!("{double}.norm1.linear"), 6 * HIDDEN, HIDDEN);
    add(&format!("{double}.norm1_context.linear"), 6 * HIDDEN, HIDDEN);
    for projection in [
        "to_q",
        "to_k",
        "to_v",
        "to_out.0",
        "add_q_proj",
        "add_k_proj",
        "add_v_proj",
        "to_add_out",
    ] {
        add(&format!("{double}.attn.{projection}"), HIDDEN, HIDDEN);
    }
    for ff in ["ff", "ff_context"] {
        add(&format!("{double}.{ff}.net.0.proj"), MLP, HIDDEN);
        add(&format!("{double}.{ff}.net.2"), HIDDEN, MLP);
    }
    let single = "single_transformer_blocks.0";
    add(&format!("{single}.norm.linear"), 3 * HIDDEN, HIDDEN);
    for projection in ["to_q", "to_k", "to_v"] {
        add(&format!("{single}.attn.{projection}"), HIDDEN, HIDDEN);
    }
    add(&format!("{single}.proj_mlp"), MLP, HIDDEN);
    add(&format!("{single}.proj_out"), HIDDEN, HIDDEN + MLP);
    add("norm_out.linear", 2 * HIDDEN, HIDDEN);
    add("proj_out", IN_CHANNELS, HIDDEN);
    list.extend(head_norms(
        &format!("{double}.attn"),
        &["norm_q", "norm_k", "norm_added_q", "norm_added_k"],
    ));
    list.extend(head_norms(&format!("{single}.attn"), &["norm_q", "norm_k"]));
    list
}

fn config() -> serde_json::Value {
    serde_json::json!({
        "_class_name": "FluxTransformer2DModel", "attention_head_dim": HEAD_DIM,
        "axes_dims_rope": [16, 56, 56], "guidance_embeds": true, "in_channels": IN_CHANNELS,
        "joint_attention_dim": T5_WIDTH, "num_attention_heads": HEADS, "num_layers": 1,
        "num_single_layers": 1, "out_channels": null, "patch_size": 1,
        "pooled_projection_dim": POOLED
    })
}

/// Deterministic values in [-1, 1).
fn values(len: usize, salt: usize) -> Vec<f32> {
    (0..len).map(|i| ((i * 37 + salt) % 101) as f32 / 50.5 - 1.0).collect()
}

/// What one pass measured.
struct Measured {
    double_seconds: f64,
    single_seconds: f64,
    weight_bytes: u64,
    peak_reserved_bytes: u64,
}

/// The transformer loaded on one device, run once.
struct Bench<'a> {
    dir: &'a Path,
    group: &'a DeviceGroup,
}

impl RuntimeTask for Bench<'_> {
    type Output = Measured;

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Measured {
        let config = FluxConfig::from_file(&self.dir.join("config.json")).expect("the written config");
        let checkpoint = Checkpoint::open(self.dir).expect("the written weights");
        let tokens = LATENT_SIDE * LATENT_SIDE + TEXT_TOKENS;
        let inventory = config.inventory(&checkpoint, tokens);
        let members = cleave_nn::plan_members(self.group);
        let plan = cleave_plan::plan(&inventory, &members, None, &Default::default()).expect("plan");
        let client = clients[0].clone();
        let usage = || client.memory_usage().expect("the device's memory usage");
        let transformer = FluxTransformer::load(
            Placed::group(clients, self.group),
            plan,
            &config,
            &checkpoint,
            &mut |_| {},
        )
        .expect("load");
        let weight_bytes = usage().bytes_in_use;

        let img_ids: Vec<[f32; 3]> = (0..LATENT_SIDE * LATENT_SIDE)
            .map(|i| [0.0, (i / LATENT_SIDE) as f32, (i % LATENT_SIDE) as f32])
            .collect();
        let txt_ids = vec![[0.0; 3]; TEXT_TOKENS];
        let (img, txt, pooled) = (
            values(img_ids.len() * IN_CHANNELS, 1),
            values(TEXT_TOKENS * T5_WIDTH, 2),
            values(POOLED, 3),
        );
        let input = FluxInput {
            img: &img,
            img_ids: &img_ids,
            txt: &txt,
            txt_ids: &txt_ids,
            pooled: &pooled,
            timestep: 1.0,
            guidance: Some(3.5),
        };
        // The block's start is the last intermediate before it (the rope
        // table, reported once the conditioning vector is on the host), its
        // end the report of its image tokens. The pool's reservation only
        // grows, so its size after a block is the peak within it.
        let mut marks: Vec<(String, Instant)> = Vec::new();
        let mut peak_reserved_bytes = 0;
        transformer
            .forward_traced(&input, &mut |name, _| {
                peak_reserved_bytes = peak_reserved_bytes.max(usage().bytes_reserved);
                marks.push((name.to_string(), Instant::now()));
            })
            .expect("forward");
        let at = |name: &str| {
            marks
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| *t)
                .unwrap_or_else(|| panic!("no {name} in the trace"))
        };
        Measured {
            double_seconds: (at("double0.img") - at("rope_sin")).as_secs_f64(),
            single_seconds: (at("single0.img") - at("double0.img")).as_secs_f64(),
            weight_bytes,
            peak_reserved_bytes,
        }
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

fn main() {
    let dir = tempfile::TempDir::new().expect("a temporary directory");
    random_model::write(dir.path(), &config(), &tensors()).expect("writing the model");
    let device = device::bench_device();
    println!(
        "FLUX.1 blocks at full width (hidden {HIDDEN}, {HEADS} heads), {} image + {TEXT_TOKENS} text tokens, \
         random bf16 weights, on {device}; one pass",
        LATENT_SIDE * LATENT_SIDE
    );
    let group = device::open_alone(&device);
    let m = group.run(Bench {
        dir: dir.path(),
        group: &group,
    });
    println!("| double block | single block | weights on the device | peak device memory |");
    println!("| ---: | ---: | ---: | ---: |");
    println!(
        "| {:.1} s | {:.1} s | {:.2} GiB | {:.2} GiB |",
        m.double_seconds,
        m.single_seconds,
        gib(m.weight_bytes),
        gib(m.peak_reserved_bytes)
    );
}
