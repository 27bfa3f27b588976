//! Access to the diffusers reference fixture `shared/fixtures/flux-tiny`, which every test compares
//! against. Nothing here computes an expectation: it only reads the fixture's stored numbers.
#![allow(dead_code)] // each test binary uses a different subset of these helpers

use std::path::PathBuf;

use safetensors::{Dtype, SafeTensors};

/// The fixture folder: `$CLEAVE_SHARED/fixtures/flux-tiny` when set, else `shared/fixtures/flux-tiny`
/// beside the project.
pub fn fixture_dir() -> PathBuf {
    let shared = std::env::var_os("CLEAVE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    shared.join("fixtures/flux-tiny")
}

/// `reference.json`, parsed.
pub fn reference_json() -> serde_json::Value {
    let text = std::fs::read_to_string(fixture_dir().join("reference.json")).expect("read reference.json");
    serde_json::from_str(&text).expect("parse reference.json")
}

/// The prompt of `p{index}` as stored in `reference.json`.
pub fn prompt(index: usize) -> String {
    reference_json()["prompts"][index]["prompt"]
        .as_str()
        .expect("prompt is a string")
        .to_owned()
}

/// A tensor of `reference.safetensors`: its shape and raw little-endian bytes.
pub struct Tensor {
    pub shape: Vec<usize>,
    pub dtype: Dtype,
    pub bytes: Vec<u8>,
}

impl Tensor {
    pub fn f32s(&self) -> Vec<f32> {
        assert_eq!(self.dtype, Dtype::F32);
        self.bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    pub fn i64s(&self) -> Vec<i64> {
        assert_eq!(self.dtype, Dtype::I64);
        self.bytes
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    pub fn u8s(&self) -> Vec<u8> {
        assert_eq!(self.dtype, Dtype::U8);
        self.bytes.clone()
    }
}

/// Reads one tensor of `reference.safetensors` by its full key (`p0.sigmas`, ...).
pub fn tensor(key: &str) -> Tensor {
    let bytes = std::fs::read(fixture_dir().join("reference.safetensors")).expect("read reference.safetensors");
    let file = SafeTensors::deserialize(&bytes).expect("parse reference.safetensors");
    let view = file.tensor(key).unwrap_or_else(|e| panic!("{key}: {e}"));
    Tensor {
        shape: view.shape().to_vec(),
        dtype: view.dtype(),
        bytes: view.data().to_vec(),
    }
}

/// Largest absolute difference between two equally long slices: NaN when any difference is NaN,
/// so that `diff <= tolerance` fails on it.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, |worst, d| {
        if worst.is_nan() || d.is_nan() {
            f32::NAN
        } else {
            worst.max(d)
        }
    })
}
