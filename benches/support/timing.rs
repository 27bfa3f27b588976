//! Prefill and decode throughput of a loaded causal model, as the
//! generation benchmarks measure it: every kernel compiled first, then the
//! median of several runs.

use std::path::PathBuf;
use std::time::Instant;

use cleave_nn::{CausalModel, Logits};
use cleave_shaders::cubecl::prelude::*;

/// The model the generation benches run: the directory
/// `CLEAVE_BENCH_MODEL` names, else the built-in demo model.
pub fn bench_model_dir() -> PathBuf {
    std::env::var_os("CLEAVE_BENCH_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/fortune-llama-3m"))
}

pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// `(prefill tok/s, decode tok/s)`: a `prompt_len`-token prompt, then
/// `decode_tokens` greedy tokens one at a time, median of `runs`.
pub fn throughput<R: Runtime>(
    llama: &dyn CausalModel<R>,
    prompt_len: usize,
    decode_tokens: usize,
    runs: usize,
) -> (f64, f64) {
    let context = prompt_len + decode_tokens;
    let vocab = llama.vocab_size() as u32;
    let prompt: Vec<u32> = (0..prompt_len as u32).map(|i| (i * 7 + 3) % vocab).collect();
    // Compile every kernel on every device before timing, at the prompt's
    // own length: cubek compiles its matmuls for each product shape.
    let mut warm = llama.new_context(context).unwrap();
    llama.forward(&mut warm, &prompt, Logits::Last).expect("warm-up");
    llama.forward(&mut warm, &[1], Logits::Last).expect("warm-up");
    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    for _ in 0..runs {
        let mut ctx = llama.new_context(context).unwrap();
        let start = Instant::now();
        let mut logits = llama.forward(&mut ctx, &prompt, Logits::Last).expect("prefill");
        prefill.push(prompt_len as f64 / start.elapsed().as_secs_f64());
        let start = Instant::now();
        for _ in 0..decode_tokens {
            let next = cleave_shaders::argmax_on_host(&logits).expect("a token: the logits hold no NaN");
            logits = llama.forward(&mut ctx, &[next], Logits::Last).expect("decode");
        }
        decode.push(decode_tokens as f64 / start.elapsed().as_secs_f64());
    }
    (median(prefill), median(decode))
}
