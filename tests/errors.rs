//! Bad input gets a clear error naming the problem, never a panic.

mod common;

use std::fs;
use std::path::Path;

use common::{cleave, copy_of, edit_json, fixture};

/// Runs cleave, expects failure, and returns stderr.
fn fails(args: &[&str]) -> String {
    let out = cleave().args(args).output().expect("run cleave");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "cleave {args:?} should fail; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "cleave {args:?} panicked: {stderr}");
    stderr
}

#[track_caller]
fn assert_mentions(stderr: &str, parts: &[&str]) {
    for part in parts {
        assert!(stderr.contains(part), "error should mention {part:?}: {stderr}");
    }
}

fn run_on(dir: &Path) -> String {
    fails(&["run", "-m", dir.to_str().unwrap(), "-p", "hello", "-n", "2"])
}

#[test]
fn missing_model_directory() {
    assert_mentions(
        &fails(&["run", "-m", "/no/such/model", "-p", "x"]),
        &["/no/such/model", "not a model directory"],
    );
}

#[test]
fn missing_config_field() {
    let dir = copy_of("llama-tiny");
    edit_json(&dir.path().join("config.json"), |c| {
        c.as_object_mut().unwrap().remove("hidden_size");
    });
    assert_mentions(&run_on(dir.path()), &["config.json", "hidden_size", "missing"]);
}

#[test]
fn corrupt_config_json() {
    let dir = copy_of("llama-tiny");
    fs::write(dir.path().join("config.json"), "{ \"architectures\": [").unwrap();
    assert_mentions(&run_on(dir.path()), &["config.json", "invalid JSON"]);
}

#[test]
fn unsupported_architecture() {
    let dir = copy_of("llama-tiny");
    edit_json(&dir.path().join("config.json"), |c| {
        c["architectures"] = serde_json::json!(["GPT2LMHeadModel"])
    });
    assert_mentions(
        &run_on(dir.path()),
        &["GPT2LMHeadModel", "LlamaForCausalLM", "Qwen2ForCausalLM"],
    );
}

#[test]
fn unsupported_rope_type() {
    let dir = copy_of("llama-tiny");
    edit_json(&dir.path().join("config.json"), |c| {
        c["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 4.0})
    });
    assert_mentions(&run_on(dir.path()), &["rope_scaling", "yarn"]);
}

#[test]
fn truncated_safetensors() {
    let dir = copy_of("llama-tiny");
    let weights = dir.path().join("model.safetensors");
    let bytes = fs::read(&weights).unwrap();
    fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    assert_mentions(&run_on(dir.path()), &["model.safetensors", "truncated"]);
}

#[test]
fn garbage_safetensors() {
    let dir = copy_of("llama-tiny");
    fs::write(dir.path().join("model.safetensors"), b"not a safetensors file at all").unwrap();
    assert_mentions(
        &run_on(dir.path()),
        &["model.safetensors", "not a valid safetensors file"],
    );
}

#[test]
fn no_weights() {
    let dir = copy_of("llama-tiny");
    fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    assert_mentions(&run_on(dir.path()), &["no weights found", "model.safetensors"]);
}

#[test]
fn tensor_missing_from_checkpoint() {
    let dir = copy_of("llama-tiny-sharded");
    edit_json(&dir.path().join("model.safetensors.index.json"), |i| {
        i["weight_map"]
            .as_object_mut()
            .unwrap()
            .remove("model.layers.2.mlp.up_proj.weight");
    });
    assert_mentions(&run_on(dir.path()), &["model.layers.2.mlp.up_proj.weight", "missing"]);
}

#[test]
fn shard_file_missing() {
    let dir = copy_of("llama-tiny-sharded");
    fs::remove_file(dir.path().join("model-00004-of-00010.safetensors")).unwrap();
    assert_mentions(&run_on(dir.path()), &["model-00004-of-00010.safetensors"]);
}

#[test]
fn tensor_with_wrong_shape() {
    let dir = copy_of("llama-tiny");
    edit_json(&dir.path().join("config.json"), |c| {
        c["intermediate_size"] = serde_json::json!(100)
    });
    assert_mentions(&run_on(dir.path()), &["mlp", "shape", "[176, 64]", "[100, 64]"]);
}

#[test]
fn prompt_longer_than_context() {
    let model = fixture("llama-tiny");
    let stderr = fails(&[
        "run",
        "-m",
        model.to_str().unwrap(),
        "-c",
        "4",
        "-p",
        "a prompt of more than four tokens",
    ]);
    assert_mentions(&stderr, &["prompt is", "context holds 4", "--ctx-size"]);
}

#[test]
fn token_id_outside_vocabulary() {
    let model = fixture("llama-tiny");
    assert_mentions(
        &fails(&["logits", "-m", model.to_str().unwrap(), "--ids", "0,5,512"]),
        &["512", "vocabulary"],
    );
}

#[test]
fn unknown_device() {
    let stderr = fails(&["run", "--backend", "cuda7", "-p", "x"]);
    assert_mentions(&stderr, &["no device named 'cuda7'", "devices on this machine"]);
}

#[test]
fn untied_head_missing_from_the_checkpoint() {
    // qwen2-tiny ties its head; declared untied, lm_head.weight is missing.
    let dir = copy_of("qwen2-tiny");
    edit_json(&dir.path().join("config.json"), |c| {
        c["tie_word_embeddings"] = serde_json::json!(false)
    });
    assert_mentions(&run_on(dir.path()), &["lm_head.weight", "missing"]);
}
