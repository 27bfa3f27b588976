//! What the tests share: where the fixtures are, and a small GGUF writer
//! for files made by hand.
#![allow(dead_code)] // each test file uses its own part of this

use std::path::{Path, PathBuf};

/// The shared fixtures and models: CLEAVE_SHARED, else `shared/` beside the
/// repository (this crate is two levels down in it).
pub fn shared_dir() -> PathBuf {
    std::env::var_os("CLEAVE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
}

pub fn fixture_dir() -> PathBuf {
    shared_dir().join("fixtures/llama-gguf")
}

pub fn demo_gguf_dir() -> PathBuf {
    shared_dir().join("models/fortune-llama-3m-gguf")
}

pub fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// Every GGUF file in `dir`, sorted.
pub fn gguf_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no GGUF files in {}", dir.display());
    files
}

/// A metadata value to write.
#[derive(Clone, Debug)]
pub enum Meta {
    U32(u32),
    I32(i32),
    U64(u64),
    F32(f32),
    Bool(bool),
    Str(String),
    Strs(Vec<String>),
    F32s(Vec<f32>),
    I32s(Vec<i32>),
    Bools(Vec<bool>),
    /// An array of arrays of u8.
    Nested(Vec<Vec<u8>>),
}

/// A GGUF version 3 file under construction: metadata pairs and tensors,
/// written in order, data aligned to 32 bytes.
#[derive(Clone, Debug, Default)]
pub struct Gguf {
    pub meta: Vec<(String, Meta)>,
    /// (name, ne, ggml type id, bytes)
    pub tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

pub const ALIGNMENT: usize = 32;

impl Gguf {
    pub fn meta(mut self, key: &str, value: Meta) -> Self {
        self.meta.push((key.into(), value));
        self
    }

    pub fn tensor(mut self, name: &str, ne: &[u64], type_id: u32, data: Vec<u8>) -> Self {
        self.tensors.push((name.into(), ne.to_vec(), type_id, data));
        self
    }

    pub fn without_meta(mut self, key: &str) -> Self {
        self.meta.retain(|(k, _)| k != key);
        self
    }

    pub fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.meta.len() as u64).to_le_bytes());
        for (key, value) in &self.meta {
            string(&mut out, key);
            value.write(&mut out);
        }
        let mut offset = 0usize;
        for (name, ne, ty, data) in &self.tensors {
            string(&mut out, name);
            out.extend((ne.len() as u32).to_le_bytes());
            for d in ne {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.to_le_bytes());
            out.extend((offset as u64).to_le_bytes());
            offset += data.len().div_ceil(ALIGNMENT) * ALIGNMENT;
        }
        for (_, _, _, data) in &self.tensors {
            pad(&mut out);
            out.extend(data);
        }
        out
    }

    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, self.bytes()).unwrap();
        path
    }
}

fn pad(out: &mut Vec<u8>) {
    out.resize(out.len().div_ceil(ALIGNMENT) * ALIGNMENT, 0);
}

pub fn string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl Meta {
    fn write(&self, out: &mut Vec<u8>) {
        let array = |out: &mut Vec<u8>, ty: u32, n: usize| {
            out.extend(9u32.to_le_bytes());
            out.extend(ty.to_le_bytes());
            out.extend((n as u64).to_le_bytes());
        };
        match self {
            Meta::U32(v) => {
                out.extend(4u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Meta::I32(v) => {
                out.extend(5u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Meta::U64(v) => {
                out.extend(10u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Meta::F32(v) => {
                out.extend(6u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Meta::Bool(v) => {
                out.extend(7u32.to_le_bytes());
                out.push(u8::from(*v));
            }
            Meta::Str(s) => {
                out.extend(8u32.to_le_bytes());
                string(out, s);
            }
            Meta::Strs(v) => {
                array(out, 8, v.len());
                for s in v {
                    string(out, s);
                }
            }
            Meta::F32s(v) => {
                array(out, 6, v.len());
                for x in v {
                    out.extend(x.to_le_bytes());
                }
            }
            Meta::I32s(v) => {
                array(out, 5, v.len());
                for x in v {
                    out.extend(x.to_le_bytes());
                }
            }
            Meta::Bools(v) => {
                array(out, 7, v.len());
                out.extend(v.iter().map(|&b| u8::from(b)));
            }
            Meta::Nested(v) => {
                array(out, 9, v.len());
                for inner in v {
                    out.extend(0u32.to_le_bytes());
                    out.extend((inner.len() as u64).to_le_bytes());
                    out.extend(inner);
                }
            }
        }
    }
}

pub fn s(text: &str) -> Meta {
    Meta::Str(text.into())
}

/// ggml type ids the tests write.
pub const F32: u32 = 0;
pub const F16: u32 = 1;
pub const Q4_0: u32 = 2;
pub const Q8_0: u32 = 8;
pub const Q4_K: u32 = 12;
pub const Q5_K: u32 = 13;
pub const Q6_K: u32 = 14;
pub const BF16: u32 = 30;

/// A tiny llama model: see `tiny_model`.
pub fn tiny_llama() -> Gguf {
    tiny_model("llama")
}

/// A tiny model of architecture `arch` (its metadata keys; llama tensor names): 2 layers, hidden 8, 2 heads of 4, 1 KV head,
/// intermediate 16, a byte-level vocabulary of the letters, a space and two
/// control tokens, F32 weights counting up from 0.
pub fn tiny_model(arch: &str) -> Gguf {
    let key = |name: &str| format!("{arch}.{name}");
    let (hidden, inter, kv, vocab) = (8u64, 16u64, 4u64, 32u64);
    let mut tokens: Vec<String> = vec!["<s>".into(), "</s>".into(), "Ġ".into()];
    tokens.extend(('a'..='z').map(String::from));
    tokens.extend(["Ġa", "ab", "Ġab"].map(String::from));
    assert_eq!(tokens.len() as u64, vocab);
    let mut types = vec![1; tokens.len()];
    types[0] = 3;
    types[1] = 3;
    let merges: Vec<String> = ["Ġ a", "a b", "Ġa b"].map(String::from).to_vec();
    let f32s = |n: u64| (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect::<Vec<u8>>();
    let mut gguf = Gguf::default()
        .meta("general.architecture", s(arch))
        .meta("general.alignment", Meta::U32(ALIGNMENT as u32))
        .meta(&key("block_count"), Meta::U32(2))
        .meta(&key("context_length"), Meta::U32(64))
        .meta(&key("embedding_length"), Meta::U32(hidden as u32))
        .meta(&key("feed_forward_length"), Meta::U32(inter as u32))
        .meta(&key("attention.head_count"), Meta::U32(2))
        .meta(&key("attention.head_count_kv"), Meta::U32(1))
        .meta(&key("attention.layer_norm_rms_epsilon"), Meta::F32(1e-5))
        .meta(&key("rope.freq_base"), Meta::F32(10000.0))
        .meta("tokenizer.ggml.model", s("gpt2"))
        .meta("tokenizer.ggml.pre", s("gpt-2"))
        .meta("tokenizer.ggml.tokens", Meta::Strs(tokens))
        .meta("tokenizer.ggml.token_type", Meta::I32s(types))
        .meta("tokenizer.ggml.merges", Meta::Strs(merges))
        .meta("tokenizer.ggml.bos_token_id", Meta::U32(0))
        .meta("tokenizer.ggml.eos_token_id", Meta::U32(1))
        .meta("tokenizer.ggml.add_bos_token", Meta::Bool(true))
        .tensor("token_embd.weight", &[hidden, vocab], F32, f32s(hidden * vocab))
        .tensor("output_norm.weight", &[hidden], F32, f32s(hidden));
    for layer in 0..2 {
        let blk = |name: &str| format!("blk.{layer}.{name}.weight");
        gguf = gguf
            .tensor(&blk("attn_norm"), &[hidden], F32, f32s(hidden))
            .tensor(&blk("attn_q"), &[hidden, hidden], F32, f32s(hidden * hidden))
            .tensor(&blk("attn_k"), &[hidden, kv], F32, f32s(hidden * kv))
            .tensor(&blk("attn_v"), &[hidden, kv], F32, f32s(hidden * kv))
            .tensor(&blk("attn_output"), &[hidden, hidden], F32, f32s(hidden * hidden))
            .tensor(&blk("ffn_norm"), &[hidden], F32, f32s(hidden))
            .tensor(&blk("ffn_gate"), &[hidden, inter], F32, f32s(hidden * inter))
            .tensor(&blk("ffn_up"), &[hidden, inter], F32, f32s(hidden * inter))
            .tensor(&blk("ffn_down"), &[inter, hidden], F32, f32s(hidden * inter));
    }
    gguf
}
