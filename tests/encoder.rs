//! all-MiniLM-L6-v2, a real BERT sentence encoder, against
//! ../shared/fixtures/minilm-reference.json (transformers and
//! sentence-transformers): token ids exact, last hidden states within 1e-4,
//! embeddings and cosine similarities within 1e-5; on one device and split
//! across two logical devices; packed batches equal single sentences.

use crate::common;

use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_models::{Bert, EncoderDir};
use cleave_nn::Placed;
use cleave_shaders::cubecl::prelude::*;
use common::{minilm_dir, shared_dir, test_device_name};
use serde::Deserialize;

#[derive(Deserialize)]
struct Reference {
    cases: Vec<Case>,
    cosine_similarity: Vec<Vec<f32>>,
}

#[derive(Deserialize)]
struct Case {
    sentence: String,
    input_ids: Vec<u32>,
    embedding: Vec<f32>,
    last_hidden_state: Vec<Vec<f32>>,
}

fn reference() -> Reference {
    let path = shared_dir().join("fixtures/minilm-reference.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

#[track_caller]
fn assert_within(got: &[f32], want: &[f32], tolerance: f32, what: &str) {
    common::max_diff(got, want, what, tolerance);
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b))
}

/// (hidden states of the batch, hidden states one sentence at a time)
struct Encode<'a> {
    model: &'a EncoderDir,
    group: &'a DeviceGroup,
    ids: &'a [Vec<u32>],
}

impl RuntimeTask for Encode<'_> {
    type Output = (Vec<Vec<f32>>, Vec<Vec<f32>>);

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Self::Output {
        let plan = cleave_plan::plan(
            &self.model.inventory(),
            &cleave_nn::plan_members(self.group),
            None,
            &Default::default(),
        )
        .unwrap();
        let devices = Placed::group(clients, self.group);
        let bert = Bert::load(devices, plan, &self.model.config, &self.model.checkpoint, &mut |_| {}).unwrap();
        let batched = bert.forward(self.ids).unwrap();
        let single = self
            .ids
            .iter()
            .map(|ids| bert.forward(std::slice::from_ref(ids)).unwrap().remove(0))
            .collect();
        (batched, single)
    }
}

fn golden_on(devices: usize) {
    let reference = reference();
    let model = EncoderDir::open(&minilm_dir()).unwrap();
    let ids: Vec<Vec<u32>> = reference
        .cases
        .iter()
        .map(|c| model.tokenizer.encode(&c.sentence).unwrap())
        .collect();
    for (case, ids) in reference.cases.iter().zip(&ids) {
        assert_eq!(ids, &case.input_ids, "token ids of {:?}", case.sentence);
    }
    let group = common::logical_group(devices);
    let (batched, single) = group.run(Encode {
        model: &model,
        group: &group,
        ids: &ids,
    });
    let hidden = model.config.hidden_size;
    let embeddings: Vec<Vec<f32>> = batched.iter().map(|s| model.pooling.pool(s, hidden)).collect();
    for (i, case) in reference.cases.iter().enumerate() {
        let want: Vec<f32> = case.last_hidden_state.concat();
        assert_within(
            &batched[i],
            &want,
            1e-4,
            &format!("last_hidden_state of {:?}", case.sentence),
        );
        assert_within(
            &single[i],
            &batched[i],
            1e-6,
            &format!("{:?} alone vs in a batch", case.sentence),
        );
        assert_within(
            &embeddings[i],
            &case.embedding,
            1e-5,
            &format!("embedding of {:?}", case.sentence),
        );
        let cosines: Vec<f32> = embeddings.iter().map(|e| cosine(&embeddings[i], e)).collect();
        assert_within(&cosines, &reference.cosine_similarity[i], 1e-5, "cosine similarities");
    }
}

#[test]
fn minilm_matches_sentence_transformers_on_one_device() {
    golden_on(1);
}

#[test]
fn minilm_matches_sentence_transformers_split_across_two_devices() {
    golden_on(2);
}

#[test]
fn embed_command_prints_the_reference_similarity_matrix() {
    let reference = reference();
    let device = test_device_name();
    let dir = minilm_dir();
    let mut cmd = common::cleave();
    cmd.args(["embed", "-m", dir.to_str().unwrap(), "--similarity", "--format", "json"]);
    cmd.args(["--backend", &format!("te={device}&{device}")]);
    cmd.args(reference.cases.iter().map(|c| c.sentence.as_str()));
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let matrix: Vec<Vec<f32>> = serde_json::from_value(json["similarity"].clone()).unwrap();
    for (row, want) in matrix.iter().zip(&reference.cosine_similarity) {
        assert_within(row, want, 1e-5, "similarity matrix");
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("te: ") && stderr.contains("blocks 0..3") && stderr.contains("blocks 3..6"),
        "{stderr}"
    );
}

#[test]
fn plan_shows_the_encoder_module() {
    let device = test_device_name();
    let dir = minilm_dir();
    let out = common::cleave()
        .args([
            "plan",
            "-m",
            dir.to_str().unwrap(),
            "--backend",
            &format!("te={device}&{device}"),
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["module"], "te");
    assert_eq!(plan["devices"][0]["blocks"], serde_json::json!([0, 3]));
    assert_eq!(plan["devices"][1]["blocks"], serde_json::json!([3, 6]));
}

/// `cleave embed` with no texts embeds stdin's lines: sentence-transformers'
/// embeddings of the reference sentences, one per line.
#[test]
fn embed_reads_stdin_and_prints_json_embeddings() {
    use std::io::Write;
    let reference = reference();
    let dir = minilm_dir();
    let mut child = common::cleave()
        .args(["embed", "-m", dir.to_str().unwrap(), "--format", "json"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines: String = reference.cases.iter().map(|c| format!("{}\n", c.sentence)).collect();
    child.stdin.take().unwrap().write_all(lines.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows: Vec<Vec<f32>> = serde_json::from_value(json["embeddings"].clone()).unwrap();
    assert_eq!(rows.len(), reference.cases.len());
    for (row, case) in rows.iter().zip(&reference.cases) {
        assert_within(
            row,
            &case.embedding,
            1e-5,
            &format!("embedding of {:?} read from stdin", case.sentence),
        );
    }
}

#[test]
fn llm_commands_refuse_an_encoder_and_module_names_are_checked() {
    let dir = minilm_dir();
    let out = common::cleave()
        .args(["run", "-m", dir.to_str().unwrap(), "-p", "x"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("BertModel") && stderr.contains("cleave embed"),
        "{stderr}"
    );
    let out = common::cleave()
        .args([
            "embed",
            "-m",
            dir.to_str().unwrap(),
            "--backend",
            "llm=vulkan0",
            "hello",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("does not have (it has: te)"),
        "{stderr}"
    );
}

#[test]
fn encoder_falls_back_to_layer_split_and_says_so() {
    let device = test_device_name();
    let dir = minilm_dir();
    let out = common::cleave()
        .args([
            "embed",
            "-m",
            dir.to_str().unwrap(),
            "--backend",
            &format!("te={device}&{device}"),
        ])
        .args(["--split-mode", "tensor", "--format", "json", "hello"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("te cannot be split in tensor mode: ") && stderr.contains("; using layer split"),
        "{stderr}"
    );
}
