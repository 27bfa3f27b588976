//! The dequantization twins against gguf-py (llama.cpp's own Python
//! package) on every tensor of every fixture file and on seeded random
//! blocks of every type, and llama.cpp's q/k row permutation undone as
//! transformers undoes it.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use cleave_gguf::{dequantize, GgufFile, HfTensor, WeightType};
use common::{demo_gguf_dir, fixture_dir, gguf_files, read_json, tiny_model};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

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
            let [hf] = &file.hf_names_of(name)[..] else {
                panic!("{what}: not one transformers tensor")
            };
            let tensor = file.hf_tensor(hf).unwrap();
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
                let ours = file.dequantize_tensor(hf).unwrap();
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

/// Blocks of `ty`, every byte random except the fields that hold a block's
/// scales and high bits, which `set_patterns` walks through every value.
/// The 32-value types, Q2_K, Q3_K, IQ4_XS and the 16-bit floats take one
/// block per f16 bit pattern (MXFP4 its 256 scale bytes 256 times over);
/// Q4_K, Q5_K and Q6_K 64 × 64 blocks, one per pair of a sub-block's 6-bit
/// scale and min.
fn random_blocks(ty: WeightType, rng: &mut StdRng) -> Vec<u8> {
    let count = match ty {
        WeightType::Q4_K | WeightType::Q5_K | WeightType::Q6_K => 64 * 64,
        _ => 1 << 16,
    };
    let mut bytes = vec![0u8; count * ty.block_bytes()];
    rng.fill(&mut bytes[..]);
    for (b, block) in bytes.chunks_exact_mut(ty.block_bytes()).enumerate() {
        set_patterns(ty, b, block);
    }
    bytes
}

/// Block `b`'s scales and high bits, chosen so that over the blocks each
/// field takes every value it can hold: an f16 scale all 65,536 bit
/// patterns (zeros, subnormals, infinities and NaNs among them), a
/// k-quant sub-block every (scale, min) pair, every byte of high bits and
/// of Q6_K's signed scales all 256 values.
fn set_patterns(ty: WeightType, b: usize, block: &mut [u8]) {
    // Each byte `k` of a field runs through all 256 values over 256
    // blocks, from its own starting point.
    let cycling = |k: usize| (b + 37 * k) as u8;
    match ty {
        // Random bit patterns: every class of f32 value is likely among 65,536.
        WeightType::F32 => {}
        WeightType::F16 | WeightType::BF16 => block.copy_from_slice(&(b as u16).to_le_bytes()),
        // d (and Q4_1's and Q5_1's m, and Q5's fifth bits, random).
        WeightType::Q8_0
        | WeightType::Q4_0
        | WeightType::Q4_1
        | WeightType::Q5_0
        | WeightType::Q5_1
        | WeightType::IQ4_NL => block[..2].copy_from_slice(&(b as u16).to_le_bytes()),
        // Its e8m0 scale byte.
        WeightType::MXFP4 => block[0] = b as u8,
        // d, and every byte of the scales (Q2_K's 4-bit scales and mins,
        // Q3_K's packed 6-bit scales and high bits, IQ4_XS's scale bits).
        WeightType::Q2_K => {
            block[80..82].copy_from_slice(&(b as u16).to_le_bytes());
            block[..16].iter_mut().enumerate().for_each(|(k, q)| *q = cycling(k));
        }
        WeightType::Q3_K => {
            block[108..110].copy_from_slice(&(b as u16).to_le_bytes());
            block[..32].iter_mut().enumerate().for_each(|(k, q)| *q = cycling(k));
            block[96..108].iter_mut().enumerate().for_each(|(k, q)| *q = cycling(k));
        }
        WeightType::IQ4_XS => {
            block[..2].copy_from_slice(&(b as u16).to_le_bytes());
            block[2..8].iter_mut().enumerate().for_each(|(k, q)| *q = cycling(k));
        }
        WeightType::Q4_K | WeightType::Q5_K => {
            let scales = std::array::from_fn(|j| ((b + 9 * j) % 64) as u8);
            let mins = std::array::from_fn(|j| ((b / 64 + 5 * j) % 64) as u8);
            block[4..16].copy_from_slice(&pack_scales_and_mins(scales, mins));
            if ty == WeightType::Q5_K {
                // qh: each value's fifth bit.
                block[16..48].iter_mut().enumerate().for_each(|(k, q)| *q = cycling(k));
            }
        }
        WeightType::Q6_K => {
            // qh (each value's two high bits), then the 16 signed scales.
            block[128..208]
                .iter_mut()
                .enumerate()
                .for_each(|(k, q)| *q = cycling(k));
        }
    }
}

/// The 12 bytes of a Q4_K or Q5_K block that hold its eight 6-bit scales
/// and mins, packed as llama.cpp's `quantize_row_q4_K_ref` packs them:
/// sub-blocks 0-3 in the low 6 bits of bytes 0-7, sub-blocks 4-7 with their
/// low 4 bits in bytes 8-11 and their high 2 bits in the top of bytes 0-7.
fn pack_scales_and_mins(scales: [u8; 8], mins: [u8; 8]) -> [u8; 12] {
    let mut packed = [0u8; 12];
    for (j, (&scale, &min)) in scales.iter().zip(&mins).enumerate() {
        if j < 4 {
            packed[j] = scale;
            packed[j + 4] = min;
        } else {
            packed[j + 4] = (scale & 0x0F) | ((min & 0x0F) << 4);
            packed[j - 4] |= (scale >> 4) << 6;
            packed[j] |= (min >> 4) << 6;
        }
    }
    packed
}

/// The same f32 bits, value for value, except that a NaN need only be a
/// NaN: gguf-py widens a signalling f16 or bf16 NaN as it is, where the
/// half crate (as F16C, ggml's own conversion on x86) sets its quiet bit.
fn assert_same_bits(ours: &[f32], theirs: &[f32], what: &str) {
    assert_eq!(ours.len(), theirs.len(), "{what}: lengths");
    let differing: Vec<(usize, f32, f32)> = ours
        .iter()
        .zip(theirs)
        .enumerate()
        .filter(|(_, (a, b))| a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan()))
        .map(|(i, (&a, &b))| (i, a, b))
        .collect();
    assert!(
        differing.is_empty(),
        "{what}: {} of {} values differ from gguf-py's bits, the first (index, ours, gguf-py's): {:?}",
        differing.len(),
        ours.len(),
        &differing[..differing.len().min(8)]
    );
}

#[test]
fn seeded_random_blocks_of_every_type_dequantize_bit_for_bit_as_gguf_py_does() {
    let Some(python) = gguf_python() else { return };
    let mut rng = StdRng::seed_from_u64(0x6767_7566);
    let dir = tempfile::tempdir().unwrap();
    let blocks: Vec<(WeightType, Vec<u8>)> = WeightType::ALL
        .iter()
        .map(|&ty| (ty, random_blocks(ty, &mut rng)))
        .collect();
    for (ty, bytes) in &blocks {
        std::fs::write(dir.path().join(format!("{}.blocks", ty.name())), bytes).unwrap();
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dequantize_blocks.py");
    let status = Command::new(&python)
        .arg(&script)
        .arg(dir.path())
        .args(WeightType::ALL.map(WeightType::name))
        .status()
        .unwrap_or_else(|e| panic!("{}: {e}", python.display()));
    assert!(status.success(), "{} failed", script.display());
    for (ty, bytes) in &blocks {
        let values = bytes.len() / ty.block_bytes() * ty.block_len();
        let mut ours = vec![0.0; values];
        dequantize(*ty, bytes, &mut ours).unwrap();
        let theirs = read_f32s(&dir.path().join(format!("{}.f32", ty.name())));
        let nans = ours.iter().filter(|v| v.is_nan()).count();
        let quieted = ours
            .iter()
            .zip(&theirs)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        eprintln!(
            "{}: {values} values, {nans} NaN ({quieted} with other payload bits)",
            ty.name()
        );
        assert_same_bits(&ours, &theirs, ty.name());
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
