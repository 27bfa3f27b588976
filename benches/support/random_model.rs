//! Random-weight models written to a directory for the benchmarks that
//! need one larger than the fixtures: a config.json and bf16 weights
//! uniform in ±0.05 from a fixed seed, and for language models the demo
//! model's tokenizer.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use rand::{Rng, SeedableRng};

/// A Llama-family block's norms and attention projections (`block`:
/// `model.layers.N`), hidden `h`, KV width `kv`; the MLP is the caller's.
pub fn attention_tensors(block: &str, h: usize, kv: usize) -> Vec<(String, Vec<usize>)> {
    vec![
        (format!("{block}.input_layernorm.weight"), vec![h]),
        (format!("{block}.self_attn.q_proj.weight"), vec![h, h]),
        (format!("{block}.self_attn.k_proj.weight"), vec![kv, h]),
        (format!("{block}.self_attn.v_proj.weight"), vec![kv, h]),
        (format!("{block}.self_attn.o_proj.weight"), vec![h, h]),
        (format!("{block}.post_attention_layernorm.weight"), vec![h]),
    ]
}

/// Copies the demo model's tokenizer to `dir`, for the models that read
/// text. It is read from the source tree, so a bench binary carried to
/// another machine runs only the models that need none.
pub fn copy_demo_tokenizer(dir: &Path) -> std::io::Result<()> {
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/fortune-llama-3m");
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(demo.join(file), dir.join(file))?;
    }
    Ok(())
}

/// Writes `config` and `tensors` (name, shape) to `dir`, one tensor at a
/// time, so that writing takes no more memory than the largest tensor.
pub fn write(dir: &Path, config: &serde_json::Value, tensors: &[(String, Vec<usize>)]) -> std::io::Result<()> {
    std::fs::write(dir.join("config.json"), config.to_string())?;
    let mut header = serde_json::Map::new();
    let mut offset = 0;
    for (name, shape) in tensors {
        let bytes = shape.iter().product::<usize>() * 2;
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut header = serde_json::Value::Object(header).to_string().into_bytes();
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut out = BufWriter::new(File::create(dir.join("model.safetensors"))?);
    out.write_all(&(header.len() as u64).to_le_bytes())?;
    out.write_all(&header)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for (_, shape) in tensors {
        let values: Vec<u8> = (0..shape.iter().product::<usize>())
            .flat_map(|_| half::bf16::from_f32(rng.random_range(-0.05..0.05)).to_le_bytes())
            .collect();
        out.write_all(&values)?;
    }
    out.flush()
}
