//! The `cleave` binary end to end: what a user types, what they get back.

mod common;

use std::path::Path;

use common::{cleave, fixture, reference, shared_model};
use serde_json::Value;

fn run_ok(args: &[&str]) -> String {
    let out = cleave().args(args).output().expect("run cleave");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cleave {args:?} failed: {stderr}");
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}

fn json_of(args: &[&str]) -> Value {
    let stdout = run_ok(args);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("cleave {args:?}: not JSON ({e}): {stdout}"))
}

/// `cleave run --temp 0 --format json` reproduces transformers' greedy ids.
fn greedy_matches_reference(dir: &Path) {
    let reference = reference(dir);
    let case = &reference.cases[0];
    let n = case.greedy_new_ids.len().to_string();
    let dir = dir.to_str().unwrap();
    let out = json_of(&[
        "run",
        "-m",
        dir,
        "-p",
        &case.prompt,
        "--temp",
        "0",
        "-n",
        &n,
        "--ignore-eos",
        "--format",
        "json",
    ]);
    let ids = |v: &Value| -> Vec<u32> { serde_json::from_value(v.clone()).unwrap() };
    assert_eq!(ids(&out["prompt_ids"]), case.input_ids);
    assert_eq!(ids(&out["new_ids"]), case.greedy_new_ids);
    assert_eq!(out["text"], case.greedy_text.as_str());
    for key in ["load_ms", "prompt_tokens_per_second", "generation_tokens_per_second"] {
        assert!(out["timings"][key].is_number(), "timings.{key} missing: {out}");
    }
}

#[test]
fn run_greedy_json_matches_transformers() {
    greedy_matches_reference(&fixture("qwen2-tiny"));
    greedy_matches_reference(&shared_model("fortune-llama-3m"));
}

#[test]
fn logits_command_matches_transformers() {
    let dir = fixture("llama-tiny-bf16");
    let reference = reference(&dir);
    let case = &reference.cases[0];
    let ids: Vec<String> = case.input_ids.iter().map(u32::to_string).collect();
    let out = json_of(&["logits", "-m", dir.to_str().unwrap(), "--ids", &ids.join(",")]);
    let rows: Vec<Vec<f32>> = serde_json::from_value(out["logits"].clone()).unwrap();
    assert_eq!(rows.len(), case.logits.len());
    for (got, want) in rows.iter().zip(&case.logits) {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= 1e-3, "logit {g} vs transformers {w}");
        }
    }
}

#[test]
fn demo_model_is_the_default_and_streams_text() {
    let out = cleave()
        .args(["run", "-p", "The best way to", "--temp", "0", "-n", "12"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.trim().len() > 10, "expected generated text, got {text:?}");
    let stats = String::from_utf8_lossy(&out.stderr);
    for part in ["load", "prompt 5 tokens", "tok/s", "generated"] {
        assert!(stats.contains(part), "stats line lacks {part:?}: {stats}");
    }
}

#[test]
fn same_seed_same_text() {
    let args = [
        "run", "-p", "Q: Why", "--temp", "0.9", "-s", "1234", "-n", "20", "--format", "json",
    ];
    assert_eq!(json_of(&args)["new_ids"], json_of(&args)["new_ids"]);
}

#[test]
fn devices_lists_the_test_adapter() {
    let out = json_of(&["devices", "--format", "json"]);
    let devices = out["devices"].as_array().expect("devices array");
    assert!(!devices.is_empty(), "no devices: {out}");
    for d in devices {
        assert!(d["name"].as_str().is_some_and(|n| n.ends_with(char::is_numeric)), "{d}");
        assert!(d["backend"].is_string() && d["adapter"].is_string(), "{d}");
    }
    let text = run_ok(&["devices"]);
    assert!(text.contains(devices[0]["name"].as_str().unwrap()));
}

#[test]
fn help_lists_the_commands() {
    let help = run_ok(&["--help"]);
    insta::assert_snapshot!(help);
}
