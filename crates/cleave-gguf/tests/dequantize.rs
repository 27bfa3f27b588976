//! The dequantization twins against gguf-py (llama.cpp's own Python
//! package) on every tensor of every fixture file, and llama.cpp's q/k row
//! permutation undone as transformers undoes it.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use cleave_gguf::{dequantize, hf_name, GgufFile, HfTensor};
use common::{demo_gguf_dir, fixture_dir, gguf_files, read_json, tiny_model};

/// A Python with the `gguf` package: CLEAVE_GGUF_PYTHON. Without it the
/// comparison is skipped with a note, except under CI, where it fails.
fn gguf_python() -> Option<PathBuf> {
    if let Some(python) = std::env::var_os("CLEAVE_GGUF_PYTHON") {
        return Some(python.into());
    }
    let how = "set CLEAVE_GGUF_PYTHON to a python with the gguf package, e.g.\n  \
               python3 -m venv ~/.cache/cleave/gguf-venv && ~/.cache/cleave/gguf-venv/bin/pip install gguf\n  \
               export CLEAVE_GGUF_PYTHON=~/.cache/cleave/gguf-venv/bin/python";
    assert!(std::env::var_os("CI").is_none(), "CI must compare with gguf-py: {how}");
    eprintln!("skipping the comparison with gguf-py: {how}");
    None
}

fn read_f32s(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Largest |a − b|; NaNs must sit at the same places.
fn max_abs_diff(ours: &[f32], theirs: &[f32], what: &str) -> f32 {
    assert_eq!(ours.len(), theirs.len(), "{what}: lengths");
    ours.iter().zip(theirs).fold(0.0f32, |worst, (&a, &b)| {
        assert_eq!(a.is_nan(), b.is_nan(), "{what}: NaN at one side only");
        if a.is_nan() {
            worst
        } else {
            worst.max((a - b).abs())
        }
    })
}

fn all_fixture_files() -> Vec<PathBuf> {
    [gguf_files(&fixture_dir()), gguf_files(&demo_gguf_dir())].concat()
}

#[test]
fn every_tensor_dequantizes_exactly_as_gguf_py_does() {
    let Some(python) = gguf_python() else { return };
    let files = all_fixture_files();
    let out = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dequantize_reference.py");
    let status = Command::new(&python)
        .arg(&script)
        .arg(out.path())
        .args(&files)
        .status()
        .unwrap_or_else(|e| panic!("{}: {e}", python.display()));
    assert!(status.success(), "{} failed", script.display());

    // Per ggml type: (tensors, values, largest difference).
    let mut by_type: BTreeMap<String, (usize, usize, f32)> = BTreeMap::new();
    let mut unpermuted = 0;
    let index = read_json(&out.path().join("index.json"));
    for (i, entry) in index.as_array().unwrap().iter().enumerate() {
        let path = Path::new(entry["path"].as_str().unwrap());
        let file = GgufFile::open(path).unwrap();
        let tensors = entry["tensors"].as_array().unwrap();
        assert_eq!(tensors.len(), file.tensors().len(), "{}", path.display());
        for (j, t) in tensors.iter().enumerate() {
            let name = t["name"].as_str().unwrap();
            let what = format!("{}: {name}", path.display());
            let info = file.tensor(name).unwrap();
            assert_eq!(info.ty.name(), t["type"].as_str().unwrap(), "{what}");
            let hf = hf_name(name).unwrap();
            let tensor = file.hf_tensor(&hf).unwrap();
            let shape: Vec<usize> = serde_json::from_value(t["shape"].clone()).unwrap();
            assert_eq!(tensor.shape, shape, "{what}");

            let mut ours = vec![0.0; info.elements()];
            dequantize(info.ty, file.tensor_data(name).unwrap(), &mut ours).unwrap();
            let theirs = read_f32s(&out.path().join(format!("{i}/{j}.f32")));
            let diff = max_abs_diff(&ours, &theirs, &what);
            let entry = by_type.entry(info.ty.name().into()).or_default();
            *entry = (entry.0 + 1, entry.1 + ours.len(), entry.2.max(diff));

            if t["hf_order"].as_bool().unwrap() {
                let transformers = read_f32s(&out.path().join(format!("{i}/{j}.hf.f32")));
                let ours = file.dequantize_tensor(&hf).unwrap();
                assert_eq!(max_abs_diff(&ours, &transformers, &what), 0.0, "{what}: unpermuted");
                unpermuted += 1;
            }
        }
    }
    eprintln!("largest |ours − gguf-py| by type (tensors, values): {by_type:?}");
    eprintln!("{unpermuted} q/k projections unpermuted as transformers does");
    assert!(unpermuted > 0);
    for (ty, (_, _, diff)) in &by_type {
        assert_eq!(*diff, 0.0, "{ty} differs from gguf-py by up to {diff}");
    }
}

/// llama.cpp's converter's `permute` (`LlamaModel.permute`), as numpy does
/// it: rows viewed as `[heads, 2, rows/heads/2]`, the last two axes swapped.
fn converter_permute(values: &[f32], rows: usize, heads: usize) -> Vec<f32> {
    let row_len = values.len() / rows;
    let half = rows / heads / 2;
    let mut out = Vec::with_capacity(values.len());
    for h in 0..heads {
        for j in 0..half {
            for t in 0..2 {
                let row = (h * 2 + t) * half + j;
                out.extend_from_slice(&values[row * row_len..(row + 1) * row_len]);
            }
        }
    }
    out
}

/// Dequantizes `tensor` one transformers row at a time from `row`, as a
/// caller gathering quantized rows would.
fn gathered_rows(tensor: &HfTensor) -> Vec<f32> {
    let row_len = tensor.row_len();
    let mut out = vec![0.0; tensor.rows() * row_len];
    for (r, values) in out.chunks_exact_mut(row_len).enumerate() {
        dequantize(tensor.ty(), tensor.row(r).unwrap(), values).unwrap();
    }
    out
}

#[test]
fn unpermuted_projections_permute_back_to_the_stored_rows_and_gather_row_by_row() {
    for path in all_fixture_files() {
        let file = GgufFile::open(&path).unwrap();
        let config = file.hf_config().unwrap();
        let heads = config["num_attention_heads"].as_u64().unwrap() as usize;
        let kv_heads = config["num_key_value_heads"].as_u64().unwrap() as usize;
        let layers = config["num_hidden_layers"].as_u64().unwrap();
        for layer in 0..layers {
            for (proj, heads) in [("q_proj", heads), ("k_proj", kv_heads)] {
                let hf = format!("model.layers.{layer}.self_attn.{proj}.weight");
                let tensor = file.hf_tensor(&hf).unwrap();
                let info = tensor.info;
                let mut stored = vec![0.0; info.elements()];
                dequantize(info.ty, tensor.data, &mut stored).unwrap();
                let unpermuted = file.dequantize_tensor(&hf).unwrap();
                assert_ne!(unpermuted, stored, "{}: {hf} is permuted", path.display());
                assert_eq!(
                    converter_permute(&unpermuted, tensor.rows(), heads),
                    stored,
                    "{}: {hf}",
                    path.display()
                );
                assert_eq!(gathered_rows(&tensor), unpermuted, "{}: {hf}", path.display());
            }
            // Every other matrix is stored in transformers' order.
            let hf = format!("model.layers.{layer}.mlp.down_proj.weight");
            let tensor = file.hf_tensor(&hf).unwrap();
            assert_eq!(gathered_rows(&tensor), file.dequantize_tensor(&hf).unwrap());
        }
    }
}

#[test]
fn only_llama_architecture_files_have_their_projections_permuted() {
    let dir = tempfile::tempdir().unwrap();
    for (arch, class, permuted) in [
        ("llama", "LlamaForCausalLM", true),
        ("qwen2", "Qwen2ForCausalLM", false),
    ] {
        let path = tiny_model(arch).write(dir.path(), &format!("{arch}.gguf"));
        let file = GgufFile::open(&path).unwrap();
        assert_eq!(file.hf_config().unwrap()["architectures"][0], class);
        for proj in ["q_proj", "k_proj"] {
            let hf = format!("model.layers.0.self_attn.{proj}.weight");
            let tensor = file.hf_tensor(&hf).unwrap();
            let mut stored = vec![0.0; tensor.info.elements()];
            dequantize(tensor.ty(), tensor.data, &mut stored).unwrap();
            assert_eq!(file.dequantize_tensor(&hf).unwrap() != stored, permuted, "{arch}: {hf}");
        }
    }
}
