//! The kernels of one decode step of the demo model (hidden 192, 6 query
//! and 2 key/value heads of 32, MLP 512, vocabulary 2048), each alone:
//! microseconds per launch, in whichever form the device takes. The f32
//! decode products of a block and the output head, the norm, and attention
//! of one query row over contexts of several lengths; then one product of
//! a 1024 x 1024 weight stored in each weight type; last, a token picked
//! from a row of logits (the demo model's vocabulary and Qwen's): greedy on
//! the device, sampled on the device (top-k 40, penalties), and sampled on
//! the host from the logits read back, which is what `samples_on_device`
//! chooses between.
//!
//! `cargo bench --bench decode_kernels` (CLEAVE_BENCH_DEVICE picks the
//! adapter). Each figure is the median of 5 batches of 200 launches, each
//! batch waited for with a device sync, after 20 launches that compile.

#[path = "support/device.rs"]
mod device;

#[allow(dead_code)]
#[path = "support/timing.rs"]
mod timing;

use std::time::Instant;

use cleave_device::RuntimeTask;
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{
    pick_tokens, sample_on_host, Activation, AttentionShape, Banned, Epilogue, History, KeyRanges, Output, Penalties,
    Picked, SampleRules, SamplerConfig, Tensor, Weight, WeightType,
};

const HIDDEN: usize = 192;
const MLP: usize = 512;
const VOCAB: usize = 2048;
const HEADS: usize = 6;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 32;
const CONTEXTS: [usize; 3] = [100, 300, 2000];
const BATCHES: usize = 5;
const LAUNCHES: usize = 200;
/// Rows and columns of the weight each type's product is timed over: whole
/// blocks of every type.
const TYPED: usize = 1024;
/// Vocabularies a token is picked from: the demo model's and Qwen's.
const PICK_VOCABULARIES: [usize; 2] = [VOCAB, 151_936];

/// Values in [-0.5, 0.5), the same every run.
fn values(len: usize) -> Vec<f32> {
    (0..len).map(|i| (i * 7919 % 1000) as f32 / 1000.0 - 0.5).collect()
}

/// `rows` rows of `cols` values stored as `ty` stores them, the same every
/// run: quants are a fixed pattern of bytes, and every f16 or bf16 (the
/// values of F16 and BF16, each block's scales) is a normal number, so
/// that no subnormal slows the arithmetic.
fn stored(ty: WeightType, rows: usize, cols: usize) -> Vec<u8> {
    let halves = |wide: &dyn Fn(f32) -> [u8; 2]| values(rows * cols).into_iter().flat_map(|v| wide(v + 1.0)).collect();
    let scales: &[usize] = match ty {
        WeightType::F32 => return values(rows * cols).iter().flat_map(|v| v.to_le_bytes()).collect(),
        WeightType::F16 => return halves(&|v| half::f16::from_f32(v).to_le_bytes()),
        WeightType::BF16 => return halves(&|v| half::bf16::from_f32(v).to_le_bytes()),
        // MXFP4's power-of-two scale is a byte of the pattern.
        other => other.traits().scale_offsets,
    };
    let len = rows * ty.row_bytes(cols).expect("whole blocks");
    let mut bytes: Vec<u8> = (0..len).map(|i| (i * 7919 % 251) as u8).collect();
    for block in bytes.chunks_exact_mut(ty.block_bytes()) {
        for &at in scales {
            block[at..at + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        }
    }
    bytes
}

struct Bench;

impl RuntimeTask for Bench {
    type Output = Vec<(String, f64)>;

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Self::Output {
        let client = &clients[0];
        let sync = || cleave_shaders::cubecl::future::block_on(client.sync()).expect("a device sync");
        let time = |launch: &dyn Fn()| {
            for _ in 0..20 {
                launch();
            }
            sync();
            let batches = (0..BATCHES)
                .map(|_| {
                    let start = Instant::now();
                    for _ in 0..LAUNCHES {
                        launch();
                    }
                    sync();
                    start.elapsed().as_secs_f64() * 1e6 / LAUNCHES as f64
                })
                .collect();
            timing::median(batches)
        };
        let tensor = |shape: &[usize]| Tensor::from_f32(client, &values(shape.iter().product()), shape);
        let weight = |rows: usize, cols: usize| Weight::from_tensor(tensor(&[rows, cols]));
        let (x, x_mlp) = (tensor(&[1, HIDDEN]), tensor(&[1, MLP]));
        let kv = KV_HEADS * HEAD_DIM;
        let (qkv, o) = (
            weight((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN),
            weight(HIDDEN, HIDDEN),
        );
        let (gate, up, down) = (weight(MLP, HIDDEN), weight(MLP, HIDDEN), weight(HIDDEN, MLP));
        let head = weight(VOCAB, HIDDEN);
        let gated = Epilogue::new(Output::Gated {
            up: &up,
            activation: Activation::Silu,
        });
        let products: [(&str, &Tensor, &Weight, Epilogue); 5] = [
            ("q/k/v product (320 x 192)", &x, &qkv, Epilogue::default()),
            ("o product + residual (192 x 192)", &x, &o, Epilogue::accumulate()),
            ("gate/up product + SiLU (2 x 512 x 192)", &x, &gate, gated),
            (
                "down product + residual (192 x 512)",
                &x_mlp,
                &down,
                Epilogue::accumulate(),
            ),
            ("output head (2048 x 192)", &x, &head, Epilogue::default()),
        ];
        let mut rows = Vec::new();
        for (name, x, w, epilogue) in products {
            let out = tensor(&[1, w.rows]);
            let us = time(&|| cleave_shaders::matmul_weight_into(client, x, w, &out, 0, epilogue).expect("matmul"));
            rows.push((name.to_string(), us));
        }
        let norm = tensor(&[HIDDEN]);
        let us = time(&|| {
            cleave_shaders::rms_norm(client, &x, &norm, 1e-5).expect("rms_norm");
        });
        rows.push(("rms_norm (192)".to_string(), us));
        let q = tensor(&[1, HEADS * HEAD_DIM]);
        for keys in CONTEXTS {
            let cache = tensor(&[keys, kv]);
            let ranges = KeyRanges::new(client, &[(0, keys as u32)]);
            let shape = AttentionShape::new(HEADS, KV_HEADS, HEAD_DIM);
            let us = time(&|| {
                cleave_shaders::attention(client, &q, &cache, &cache, shape, &ranges, None).expect("attention");
            });
            rows.push((format!("attention, one row over {keys} keys"), us));
        }
        let x = tensor(&[1, TYPED]);
        let out = tensor(&[1, TYPED]);
        for ty in WeightType::ALL {
            let w = Weight::upload(client, &stored(ty, TYPED, TYPED), ty, TYPED, TYPED).expect("a weight");
            let us = time(&|| {
                cleave_shaders::matmul_weight_into(client, &x, &w, &out, 0, Epilogue::default()).expect("matmul")
            });
            rows.push((format!("product ({TYPED} x {TYPED}), {ty} weight"), us));
        }
        for vocab in PICK_VOCABULARIES {
            rows.extend(pick_rows(client, &time, vocab));
        }
        rows
    }
}

/// One token picked from a row of `vocab` logits, µs: greedy and sampled
/// on the device, and sampled on the host from the logits read back.
fn pick_rows<R: Runtime>(
    client: &ComputeClient<R>,
    time: &dyn Fn(&dyn Fn()) -> f64,
    vocab: usize,
) -> Vec<(String, f64)> {
    let row = values(vocab);
    let logits = Tensor::from_f32(client, &row, &[1, vocab]);
    let config = SamplerConfig {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        seed: 1,
        penalties: Penalties {
            repeat: 1.1,
            ..Penalties::default()
        },
    };
    let window: Vec<u32> = (0..64).collect();
    let banned = Banned::new(client, &[&[]]);
    let picked = Picked::new(client, 1);
    let rules = SampleRules::new(client, &[(config, 0)]).expect("rules");
    let history = History::new(client, &[(config.penalties, &window)]).expect("a window");
    let greedy = time(&|| {
        pick_tokens(client, &logits, &banned, None, (None, None), &picked).expect("argmax");
        picked.read(client).expect("the pick");
    });
    let on_device = time(&|| {
        pick_tokens(client, &logits, &banned, None, (Some(&rules), Some(&history)), &picked).expect("sample");
        picked.read(client).expect("the pick");
    });
    let on_host = time(&|| {
        let row = logits.to_vec(client).expect("the logits");
        sample_on_host(&row, &config, 0, &window).expect("a token");
    });
    [
        ("greedy on the device", greedy),
        ("sampled on the device", on_device),
        ("sampled on the host", on_host),
    ]
    .into_iter()
    .map(|(how, us)| (format!("pick of {vocab} logits, {how}, read back"), us))
    .collect()
}

fn main() {
    let device = device::bench_device();
    println!("The demo model's decode kernels on {device}; microseconds per launch, median of {BATCHES} batches");
    let group = device::open_alone(&device);
    println!("| kernel | µs per launch |");
    println!("| --- | ---: |");
    for (name, us) in group.run(Bench) {
        println!("| {name} | {us:.1} |");
    }
}
