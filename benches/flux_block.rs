//! FLUX.1 transformer blocks at full width (hidden 3072, 24 heads of 128,
//! MLP 12,288, T5 width 4,096) with random bf16 weights, over a 1024x1024
//! image's 4,096 latent tokens and FluxPipeline's 512 text tokens, on one
//! device: one double block and one single block unless
//! CLEAVE_BENCH_FLUX_BLOCKS says `DOUBLE,SINGLE` (FLUX.1-dev has 19,38).
//!
//! The first pass reports the seconds of the first double and the first
//! single block, each ending where the transformer reports its output
//! (`forward_traced`, which reads it back), and the device's peak memory.
//! It compiles every kernel, so on a GPU its block times are mostly
//! compilation. With CLEAVE_BENCH_PASSES=N (default 1: at this size a
//! pass takes minutes on a CPU adapter), N-1 more passes of the whole
//! transformer follow, untraced, and their median is reported too: the
//! figure to hold against diffusers (scripts/gpu/flux_peer.py times the
//! same blocks there).
//!
//! `cargo bench --bench flux_block` (CLEAVE_BENCH_DEVICE picks the adapter).

#[path = "support/device.rs"]
mod device;

// Only its writer is needed here.
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

/// diffusers' `FluxTransformer2DModel` tensors with `double` and `single`
/// blocks.
fn tensors(double: usize, single: usize) -> Vec<(String, Vec<usize>)> {
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
    for block in (0..double).map(|i| format!("transformer_blocks.{i}")) {
        add(&format!("{block}.norm1.linear"), 6 * HIDDEN, HIDDEN);
        add(&format!("{block}.norm1_context.linear"), 6 * HIDDEN, HIDDEN);
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
            add(&format!("{block}.attn.{projection}"), HIDDEN, HIDDEN);
        }
        for ff in ["ff", "ff_context"] {
            add(&format!("{block}.{ff}.net.0.proj"), MLP, HIDDEN);
            add(&format!("{block}.{ff}.net.2"), HIDDEN, MLP);
        }
    }
    for block in (0..single).map(|i| format!("single_transformer_blocks.{i}")) {
        add(&format!("{block}.norm.linear"), 3 * HIDDEN, HIDDEN);
        for projection in ["to_q", "to_k", "to_v"] {
            add(&format!("{block}.attn.{projection}"), HIDDEN, HIDDEN);
        }
        add(&format!("{block}.proj_mlp"), MLP, HIDDEN);
        add(&format!("{block}.proj_out"), HIDDEN, HIDDEN + MLP);
    }
    add("norm_out.linear", 2 * HIDDEN, HIDDEN);
    add("proj_out", IN_CHANNELS, HIDDEN);
    for i in 0..double {
        list.extend(head_norms(
            &format!("transformer_blocks.{i}.attn"),
            &["norm_q", "norm_k", "norm_added_q", "norm_added_k"],
        ));
    }
    for i in 0..single {
        list.extend(head_norms(
            &format!("single_transformer_blocks.{i}.attn"),
            &["norm_q", "norm_k"],
        ));
    }
    list
}

fn config(double: usize, single: usize) -> serde_json::Value {
    serde_json::json!({
        "_class_name": "FluxTransformer2DModel", "attention_head_dim": HEAD_DIM,
        "axes_dims_rope": [16, 56, 56], "guidance_embeds": true, "in_channels": IN_CHANNELS,
        "joint_attention_dim": T5_WIDTH, "num_attention_heads": HEADS, "num_layers": double,
        "num_single_layers": single, "out_channels": null, "patch_size": 1,
        "pooled_projection_dim": POOLED
    })
}

/// Deterministic values in [-1, 1).
fn values(len: usize, salt: usize) -> Vec<f32> {
    (0..len).map(|i| ((i * 37 + salt) % 101) as f32 / 50.5 - 1.0).collect()
}

/// What the passes measured.
struct Measured {
    /// The first pass's first double and first single block.
    double_seconds: f64,
    single_seconds: f64,
    weight_bytes: u64,
    peak_reserved_bytes: u64,
    /// The median of the untraced passes after the first, if any.
    pass_seconds: Option<f64>,
}

/// The transformer loaded on one device, run `passes` times.
struct Bench<'a> {
    dir: &'a Path,
    group: &'a DeviceGroup,
    passes: usize,
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
        let last_double = format!("double{}.img", config.double_layers - 1);
        let pass_seconds = (self.passes > 1).then(|| {
            let seconds = (1..self.passes)
                .map(|_| {
                    let start = Instant::now();
                    transformer.forward(&input).expect("forward");
                    start.elapsed().as_secs_f64()
                })
                .collect();
            timing::median(seconds)
        });
        Measured {
            double_seconds: (at("double0.img") - at("rope_sin")).as_secs_f64(),
            single_seconds: (at("single0.img") - at(&last_double)).as_secs_f64(),
            weight_bytes,
            peak_reserved_bytes,
            pass_seconds,
        }
    }
}

/// A count from the environment variable `name`, else `default`.
fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |v| {
        v.parse().unwrap_or_else(|_| panic!("{name}: a count, not {v:?}"))
    })
}

/// The blocks to run: `DOUBLE,SINGLE` from CLEAVE_BENCH_FLUX_BLOCKS, each
/// at least one (the first pass times the first of each).
fn blocks() -> (usize, usize) {
    let Ok(v) = std::env::var("CLEAVE_BENCH_FLUX_BLOCKS") else {
        return (1, 1);
    };
    let counts: Result<Vec<usize>, _> = v.split(',').map(|n| n.trim().parse()).collect();
    match counts.as_deref() {
        Ok(&[double, single]) if double > 0 && single > 0 => (double, single),
        _ => panic!("CLEAVE_BENCH_FLUX_BLOCKS: DOUBLE,SINGLE, each at least 1, not {v:?}"),
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

fn main() {
    let (double, single) = blocks();
    let passes = env_count("CLEAVE_BENCH_PASSES", 1).max(1);
    let dir = tempfile::TempDir::new().expect("a temporary directory");
    random_model::write(dir.path(), &config(double, single), &tensors(double, single)).expect("writing the model");
    let device = device::bench_device();
    println!(
        "FLUX.1 transformer at full width (hidden {HIDDEN}, {HEADS} heads), {double} double + {single} single \
         blocks, {} image + {TEXT_TOKENS} text tokens, random bf16 weights, on {device}; {passes} pass(es)",
        LATENT_SIDE * LATENT_SIDE
    );
    let group = device::open_alone(&device);
    let m = group.run(Bench {
        dir: dir.path(),
        group: &group,
        passes,
    });
    let pass = m.pass_seconds.map_or("-".to_string(), |s| format!("{:.1} ms", s * 1e3));
    println!(
        "| double block, first pass | single block, first pass | weights on the device | peak device memory | \
         transformer pass, median of later |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: |");
    println!(
        "| {:.3} s | {:.3} s | {:.2} GiB | {:.2} GiB | {pass} |",
        m.double_seconds,
        m.single_seconds,
        gib(m.weight_bytes),
        gib(m.peak_reserved_bytes)
    );
}
