//! Where a mixture's experts live, measured on a random-weight Mixtral
//! whose experts are most of its bytes (8 experts of hidden 512 and
//! intermediate 1024 in bf16, top-2, 8 layers: 192 MiB of experts, 8 MiB
//! of the rest): decode tokens/s and bytes uploaded per token with
//! (a) every expert beside its block on one device, (b) experts split over
//! 2 and 3 logical devices, (c) every block streamed whole from the mapped
//! file, as layer split does when memory is short, (d) expert split on one device
//! with a cache of 1, 2 and 4 experts per block, with the cache's hit rate.
//!
//! `cargo bench --bench experts` (CLEAVE_BENCH_DEVICE picks the adapter).
//! Each figure is the median of several runs after a warm-up. Random
//! weights route tokens about evenly, so consecutive tokens share fewer
//! experts than a trained model's do: the hit rates are a floor.

// Only the device's name is needed here.
#[allow(dead_code)]
#[path = "support/device.rs"]
mod device;

#[path = "support/random_model.rs"]
mod random_model;
// Only its median is needed here.
#[allow(dead_code)]
#[path = "support/timing.rs"]
mod timing;

use std::time::Instant;

use cleave_device::{open_group, DeviceGroup, MemberSpec, RuntimeTask};
use cleave_models::ModelDir;
use cleave_nn::{CausalModel, Logits, Placed, UploadStats};
use cleave_plan::{format_bytes, PlanOptions, Residency, SplitMode, Streaming};
use cleave_shaders::cubecl::prelude::*;

const HIDDEN: usize = 512;
const INTERMEDIATE: usize = 1024;
const LAYERS: usize = 8;
const HEADS: usize = 8;
const KV_HEADS: usize = 2;
const EXPERTS: usize = 8;
const TOP_K: usize = 2;
const VOCAB: usize = 2048;

const RUNS: usize = 3;
const PROMPT: usize = 32;
const DECODE_TOKENS: usize = 32;
const CONTEXT: usize = PROMPT + DECODE_TOKENS;

fn tensors() -> Vec<(String, Vec<usize>)> {
    let (h, i, kv) = (HIDDEN, INTERMEDIATE, KV_HEADS * HIDDEN / HEADS);
    let mut list = vec![("model.embed_tokens.weight".to_string(), vec![VOCAB, h])];
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}");
        list.extend(random_model::attention_tensors(&p, h, kv));
        list.push((format!("{p}.block_sparse_moe.gate.weight"), vec![EXPERTS, h]));
        for e in 0..EXPERTS {
            let p = format!("{p}.block_sparse_moe.experts.{e}");
            list.extend([
                (format!("{p}.w1.weight"), vec![i, h]),
                (format!("{p}.w3.weight"), vec![i, h]),
                (format!("{p}.w2.weight"), vec![h, i]),
            ]);
        }
    }
    list.push(("model.norm.weight".into(), vec![h]));
    list.push(("lm_head.weight".into(), vec![VOCAB, h]));
    list
}

fn config() -> serde_json::Value {
    serde_json::json!({
        "architectures": ["MixtralForCausalLM"], "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "num_local_experts": EXPERTS, "num_experts_per_tok": TOP_K,
        "vocab_size": VOCAB, "rms_norm_eps": 1e-5, "rope_theta": 1e6, "max_position_embeddings": 512,
        "tie_word_embeddings": false, "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 1
    })
}

/// One placement of the model, decoded.
struct Bench<'a> {
    model: &'a ModelDir,
    group: &'a DeviceGroup,
    options: PlanOptions,
}

/// (decode tok/s, what the decode steps uploaded, per token)
impl RuntimeTask for Bench<'_> {
    type Output = (f64, UploadStats);

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Self::Output {
        let inventory = self.model.inventory(CONTEXT);
        let members = cleave_nn::plan_members(self.group);
        let plan = cleave_plan::plan(&inventory, &members, None, &self.options).expect("plan");
        let llama = self
            .model
            .load(Placed::group(clients, self.group), plan, &mut |_| {})
            .expect("load");
        let prompt: Vec<u32> = (0..PROMPT as u32).map(|i| (i * 7 + 3) % VOCAB as u32).collect();
        decode(llama.as_ref(), &prompt[..4]);
        let runs: Vec<(f64, UploadStats)> = (0..RUNS).map(|_| decode(llama.as_ref(), &prompt)).collect();
        let tokens_per_second = timing::median(runs.iter().map(|r| r.0).collect());
        (tokens_per_second, runs[RUNS / 2].1)
    }
}

/// Prefills `prompt`, then decodes DECODE_TOKENS greedy tokens: their
/// tokens/s and what they uploaded per token.
fn decode<R: Runtime>(llama: &dyn CausalModel<R>, prompt: &[u32]) -> (f64, UploadStats) {
    let mut ctx = llama.new_context(CONTEXT).unwrap();
    let mut logits = llama.forward(&mut ctx, prompt, Logits::Last).expect("prefill");
    let before = llama.upload_stats();
    let start = Instant::now();
    for _ in 0..DECODE_TOKENS {
        let next = cleave_shaders::argmax_on_host(&logits).expect("a token");
        logits = llama.forward(&mut ctx, &[next], Logits::Last).expect("decode");
    }
    let seconds = start.elapsed().as_secs_f64();
    let mut step = llama.upload_stats().since(&before);
    step.uploaded_bytes /= DECODE_TOKENS as u64;
    (DECODE_TOKENS as f64 / seconds, step)
}

fn options(mode: SplitMode, residency: Residency, expert_cache: Option<usize>) -> PlanOptions {
    PlanOptions {
        mode,
        streaming: Streaming {
            residency,
            stream_blocks: None,
            expert_cache,
        },
        ..PlanOptions::default()
    }
}

fn main() {
    let dir = tempfile::TempDir::new().expect("a temporary directory");
    random_model::write(dir.path(), &config(), &tensors()).expect("writing the model");
    random_model::copy_demo_tokenizer(dir.path()).expect("copying the tokenizer");
    let model = ModelDir::open(dir.path()).expect("the written model");
    let device = device::bench_device();
    println!(
        "random Mixtral ({EXPERTS} experts, top-{TOP_K}, hidden {HIDDEN}, intermediate {INTERMEDIATE}, \
         {LAYERS} layers, bf16) on {device}, prompt {PROMPT} tokens, decode {DECODE_TOKENS} tokens"
    );
    println!("| placement | devices | decode tok/s | uploaded per token | expert cache hit rate |");
    println!("| --- | --- | ---: | ---: | ---: |");
    let rows = [
        (
            "(a) experts beside their block",
            1,
            options(SplitMode::Layer, Residency::Auto, None),
        ),
        ("(b) expert split", 2, options(SplitMode::Expert, Residency::Auto, None)),
        ("(b) expert split", 3, options(SplitMode::Expert, Residency::Auto, None)),
        (
            "(c) every block streamed",
            1,
            options(SplitMode::Layer, Residency::Disk, None),
        ),
        (
            "(d) expert cache of 1",
            1,
            options(SplitMode::Expert, Residency::Auto, Some(1)),
        ),
        (
            "(d) expert cache of 2",
            1,
            options(SplitMode::Expert, Residency::Auto, Some(2)),
        ),
        (
            "(d) expert cache of 4",
            1,
            options(SplitMode::Expert, Residency::Auto, Some(4)),
        ),
    ];
    for (what, devices, options) in rows {
        let specs = vec![
            MemberSpec {
                device: device.clone(),
                cap: None,
            };
            devices
        ];
        let group = open_group(&specs).expect("open devices");
        let (tokens_per_second, uploads) = group.run(Bench {
            model: &model,
            group: &group,
            options,
        });
        let hit_rate = uploads
            .expert_hit_rate()
            .map_or("-".to_string(), |rate| format!("{:.0}%", rate * 100.0));
        println!(
            "| {what} | {devices} | {tokens_per_second:.1} | {} | {hit_rate} |",
            format_bytes(uploads.uploaded_bytes)
        );
    }
}
