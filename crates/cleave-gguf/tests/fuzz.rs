//! Thousands of damaged files, from a fixed seed: bits flipped, bytes
//! overwritten, length and count fields set to huge values, cuts and
//! insertions, applied to the start of a real file and to small files made
//! by hand. Each must open or be refused, and whatever opens must give its
//! config, tokenizer and tensors or refuse them: never a panic, and never
//! past a deadline. Some of the damaged files must open, or the damage
//! never gets past the header checks.

mod common;
#[path = "../../../tests/common/deadline.rs"]
mod deadline;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::Duration;

use cleave_gguf::GgufFile;
use common::{fixture_dir, tiny_llama, Gguf, Meta, BF16, F16, F32, Q4_0, Q4_K, Q5_K, Q6_K, Q8_0};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CASES_PER_SEED: usize = 3000;

/// How long one damaged file may take to open and read: milliseconds, so
/// one past this hangs.
const DEADLINE: Duration = Duration::from_secs(30);

/// The hand-written llama with a tensor of every type cleave reads, filled
/// with seeded noise (NaNs and infinities included).
fn every_type(rng: &mut StdRng) -> Gguf {
    let mut noise = |n: usize| (0..n).map(|_| rng.random()).collect::<Vec<u8>>();
    tiny_llama()
        .meta("general.name", Meta::Str("fuzz".into()))
        .meta("test.u64", Meta::U64(7))
        .meta("test.nested", Meta::Nested(vec![vec![1], vec![2, 3]]))
        .tensor("blk.2.attn_norm.weight", &[8], F16, noise(16))
        .tensor("blk.2.ffn_norm.weight", &[8], BF16, noise(16))
        .tensor("blk.2.attn_v.weight", &[32, 2], Q8_0, noise(2 * 34))
        .tensor("blk.2.attn_output.weight", &[32, 2], Q4_0, noise(2 * 18))
        .tensor("blk.2.attn_q.weight", &[256, 4], Q4_K, noise(4 * 144))
        .tensor("blk.2.attn_k.weight", &[256, 2], Q5_K, noise(2 * 176))
        .tensor("blk.2.ffn_up.weight", &[256, 2], Q6_K, noise(2 * 210))
        .tensor("blk.2.attn_q.bias", &[4], F32, noise(16))
}

/// One to three random damages.
fn mutate(rng: &mut StdRng, bytes: &mut Vec<u8>) {
    const HUGE: [u64; 6] = [u64::MAX, 1 << 63, 1 << 60, 1 << 32, u32::MAX as u64, 0];
    for _ in 0..rng.random_range(1..=3) {
        if bytes.is_empty() {
            return;
        }
        let at = rng.random_range(0..bytes.len());
        match rng.random_range(0..7) {
            0 => bytes[at] ^= 1 << rng.random_range(0..8),
            1 => {
                let fill = [0xFF, 0x00, 0x80, 0x7F, rng.random()][rng.random_range(0..5)];
                let end = (at + rng.random_range(1..=8)).min(bytes.len());
                bytes[at..end].fill(fill);
            }
            2 => {
                let value = HUGE[rng.random_range(0..HUGE.len())].to_le_bytes();
                let end = (at + 8).min(bytes.len());
                bytes[at..end].copy_from_slice(&value[..end - at]);
            }
            3 => {
                // A type id, known or not, where a u32 field may be.
                let value = rng.random_range(0u32..=40).to_le_bytes();
                let end = (at + 4).min(bytes.len());
                bytes[at..end].copy_from_slice(&value[..end - at]);
            }
            4 => bytes.truncate(at),
            5 => {
                let insert: Vec<u8> = (0..rng.random_range(1..=16)).map(|_| rng.random()).collect();
                bytes.splice(at..at, insert);
            }
            _ => {
                let end = (at + rng.random_range(1..=16)).min(bytes.len());
                bytes.drain(at..end);
            }
        }
    }
}

/// Opens the file and, if it opens, asks it for everything a loader would.
/// Returns whether it opened.
fn exercise(path: &Path) -> bool {
    let Ok(file) = GgufFile::open(path) else {
        return false;
    };
    let _ = file.hf_config();
    if let Ok(tokenizer) = file.tokenizer() {
        let _ = tokenizer.encode("ab abc");
    }
    for name in file.hf_names() {
        if let Ok(tensor) = file.hf_tensor(&name) {
            let _ = tensor.row(0);
            let _ = tensor.dequantize();
        }
    }
    true
}

#[test]
fn damaged_files_open_or_are_refused_without_panicking() {
    let mut rng = StdRng::seed_from_u64(0x6767_7566);
    let f16 = std::fs::read(fixture_dir().join("llama-gguf-F16.gguf")).unwrap();
    // Its metadata (about 12 KiB) opens on its own once its tensors are
    // not counted; a damaged count brings their infos back into play.
    let mut metadata = f16[..16 << 10].to_vec();
    metadata[8..16].copy_from_slice(&0u64.to_le_bytes());
    let seeds = [
        ("the F16 fixture's metadata, its tensors uncounted", metadata),
        ("the hand-written llama", tiny_llama().bytes()),
        ("a tensor of every type", every_type(&mut rng).bytes()),
    ];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("damaged.gguf");
    let worker = deadline::Worker::new(move |bytes: Vec<u8>| {
        std::fs::write(&path, &bytes).unwrap();
        catch_unwind(AssertUnwindSafe(|| exercise(&path))).ok()
    });
    let start = std::time::Instant::now();
    for (seed_name, seed) in &seeds {
        let mut opened = 0;
        for case in 0..CASES_PER_SEED {
            let mut bytes = seed.clone();
            mutate(&mut rng, &mut bytes);
            let keep = |why: &str| {
                let kept = std::env::temp_dir().join(format!("cleave-gguf-fuzz-{case}.gguf"));
                std::fs::write(&kept, &bytes).unwrap();
                panic!(
                    "{seed_name}, case {case}: {why}; the file is kept at {}",
                    kept.display()
                );
            };
            match worker.run(bytes.clone(), DEADLINE) {
                Ok(Some(true)) => opened += 1,
                Ok(Some(false)) => {}
                Ok(None) => keep("panicked"),
                Err(why) => keep(&why),
            }
        }
        eprintln!("{seed_name}: {opened} of {CASES_PER_SEED} damaged files opened");
        assert!(
            opened > 0,
            "{seed_name}: no damaged file opened, so none reached the config, tokenizer and tensors"
        );
    }
    let elapsed = start.elapsed();
    eprintln!("{} files in {elapsed:.1?}", seeds.len() * CASES_PER_SEED);
    assert!(elapsed.as_secs() < 30, "took {elapsed:?}");
}
