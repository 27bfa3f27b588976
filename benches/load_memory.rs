//! Peak host memory while loading a model larger than 100 MB.
//!
//! `cargo bench --bench load_memory` writes a random-weight Llama (bf16,
//! about 150 MB, same family as the demo model) to a temporary directory,
//! tensor by tensor, then loads it onto the best device and reports the
//! peak resident set size of the process during the load, next to what the
//! device's buffers take and what its memory pool reserved for them (on a
//! software adapter such as lavapipe, device memory is this process's
//! memory too) and the largest tensor.

#[path = "support/random_model.rs"]
mod random_model;

use std::path::Path;

use cleave_device::RuntimeTask;
use cleave_models::ModelDir;
use cleave_nn::Placed;
use cleave_plan::{format_bytes, PlanOptions};
use cleave_shaders::cubecl::prelude::*;

const HIDDEN: usize = 768;
const INTERMEDIATE: usize = 2048;
const LAYERS: usize = 8;
const HEADS: usize = 12;
const KV_HEADS: usize = 4;
const VOCAB: usize = 32_000;

fn tensors() -> Vec<(String, Vec<usize>)> {
    let (h, i, kv) = (HIDDEN, INTERMEDIATE, KV_HEADS * HIDDEN / HEADS);
    let mut list = vec![("model.embed_tokens.weight".to_string(), vec![VOCAB, h])];
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}");
        list.extend(random_model::attention_tensors(&p, h, kv));
        list.extend([
            (format!("{p}.mlp.gate_proj.weight"), vec![i, h]),
            (format!("{p}.mlp.up_proj.weight"), vec![i, h]),
            (format!("{p}.mlp.down_proj.weight"), vec![h, i]),
        ]);
    }
    list.push(("model.norm.weight".into(), vec![h]));
    list.push(("lm_head.weight".into(), vec![VOCAB, h]));
    list
}

fn write_model(dir: &Path) -> std::io::Result<()> {
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "vocab_size": VOCAB, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 512,
        "tie_word_embeddings": false, "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 1
    });
    random_model::write(dir, &config, &tensors())?;
    random_model::copy_demo_tokenizer(dir)
}

/// The process's peak resident set size so far (VmHWM), in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Resets the peak to the current resident set size (Linux 4.0+).
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

struct Load<'a> {
    model: &'a ModelDir,
    group: &'a cleave_device::DeviceGroup,
}

impl RuntimeTask for Load<'_> {
    /// (peak RSS growth during the load, device bytes in use after it,
    /// device bytes its memory pool reserved)
    type Output = (u64, u64, u64);

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> (u64, u64, u64) {
        let inventory = self.model.inventory(512);
        let plan = cleave_plan::plan(
            &inventory,
            &cleave_nn::plan_members(self.group),
            None,
            &PlanOptions::default(),
        )
        .unwrap();
        let client = clients[0].clone();
        let usage = || {
            client
                .memory_usage()
                .map(|u| (u.bytes_in_use, u.bytes_reserved))
                .unwrap_or((0, 0))
        };
        let before = usage();
        reset_peak_rss();
        let start = peak_rss();
        let llama = self
            .model
            .load(Placed::group(clients, self.group), plan, &mut |_| {})
            .unwrap();
        let _ = cleave_shaders::cubecl::future::block_on(client.sync());
        let grown = peak_rss().saturating_sub(start);
        let after = usage();
        drop(llama);
        (grown, after.0 - before.0, after.1 - before.1)
    }
}

fn main() {
    let dir = tempfile::TempDir::new().expect("a temporary directory");
    write_model(dir.path()).expect("writing the model");
    let model = ModelDir::open(dir.path()).expect("the written model");
    let file = std::fs::metadata(dir.path().join("model.safetensors"))
        .map(|m| m.len())
        .unwrap_or(0);
    let largest = tensors()
        .iter()
        .map(|(_, s)| s.iter().product::<usize>() * 2)
        .max()
        .unwrap_or(0) as u64;
    let group = cleave_device::open_default().expect("a device");
    let (grown, in_use, reserved) = group.run(Load {
        model: &model,
        group: &group,
    });
    println!("model file (bf16): {}", format_bytes(file));
    println!("largest tensor (bf16): {}", format_bytes(largest));
    println!("weights on the device: {}", format_bytes(in_use));
    println!("device memory pool reserved: {}", format_bytes(reserved));
    println!("peak RSS growth while loading: {}", format_bytes(grown));
    println!(
        "peak RSS growth beyond the weights: {}",
        format_bytes(grown.saturating_sub(in_use))
    );
}
