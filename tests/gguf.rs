//! GGUF files (llama.cpp's converter and quantizer) against what
//! transformers computes when it loads the same file itself
//! (`gguf_file=`, dequantized by gguf-py, q/k permutation undone): every
//! llama-gguf file's prompt ids, every position's logits and its greedy
//! ids, on one device and split by layers, rows and tensors over two and
//! three logical devices. The demo model's F16 file gives the greedy ids of
//! the f32 model's reference, as llama.cpp's does.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_models::ModelDir;
use cleave_plan::SplitMode;
use cleave_shaders::cubecl::prelude::*;
use common::{fixture, Case};
use serde::Deserialize;

/// transformers' f32 arithmetic on the same dequantized weights: the
/// worst difference is printed per file; 1e-3 is the bound the
/// comparison promises.
const LOGIT_TOLERANCE: f32 = 1e-3;

#[derive(Deserialize)]
struct GgufReference {
    files: BTreeMap<String, GgufFileReference>,
}

#[derive(Deserialize)]
struct GgufFileReference {
    cases: Vec<Case>,
}

fn references() -> BTreeMap<String, GgufFileReference> {
    let path = fixture("llama-gguf").join("reference.json");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_json::from_str::<GgufReference>(&text).unwrap().files
}

/// Checks `cases` on `model` loaded onto `group` in `mode`.
struct Check<'a> {
    model: &'a ModelDir,
    group: &'a DeviceGroup,
    mode: SplitMode,
    cases: &'a [Case],
}

impl RuntimeTask for Check<'_> {
    type Output = f32;

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> f32 {
        let llama = common::load_split(clients, self.group, self.model, 256, None, self.mode).expect("load");
        let mut worst = 0.0f32;
        for case in self.cases {
            worst = worst.max(common::check_logits(llama.as_ref(), case, LOGIT_TOLERANCE));
            common::check_greedy(llama.as_ref(), &self.model.tokenizer, case);
        }
        worst
    }
}

fn open(file: &Path) -> ModelDir {
    ModelDir::open(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

#[test]
fn every_llama_gguf_file_gives_its_reference_on_one_device() {
    let group = common::test_device();
    for (name, reference) in references() {
        let model = open(&fixture("llama-gguf").join(&name));
        for case in &reference.cases {
            assert_eq!(
                model.tokenizer.encode(&case.prompt).unwrap(),
                case.input_ids,
                "{name}: {:?}",
                case.prompt
            );
        }
        let worst = group.run(Check {
            model: &model,
            group: &group,
            mode: SplitMode::Layer,
            cases: &reference.cases,
        });
        eprintln!("{name}: worst logit difference {worst:e}");
    }
}

#[test]
fn every_llama_gguf_file_gives_its_reference_split_over_two_and_three_devices() {
    for devices in [2, 3] {
        let group = common::logical_group(devices);
        for (name, reference) in references() {
            let model = open(&fixture("llama-gguf").join(&name));
            let longest = reference.cases.into_iter().max_by_key(|c| c.input_ids.len()).unwrap();
            for mode in [SplitMode::Layer, SplitMode::Row, SplitMode::Tensor] {
                let worst = group.run(Check {
                    model: &model,
                    group: &group,
                    mode,
                    cases: std::slice::from_ref(&longest),
                });
                eprintln!("{name}, {mode:?} split over {devices}: worst logit difference {worst:e}");
            }
        }
    }
}

#[test]
fn the_demo_models_f16_file_decodes_the_references_greedy_ids() {
    let model = open(&common::shared_model("fortune-llama-3m-gguf").join("fortune-llama-3m-F16.gguf"));
    let reference = common::reference(&common::shared_model("fortune-llama-3m"));
    let group = common::test_device();
    struct Greedy<'a>(&'a ModelDir, &'a DeviceGroup, &'a [Case]);
    impl RuntimeTask for Greedy<'_> {
        type Output = ();
        fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) {
            let llama = common::load_split(clients, self.1, self.0, 256, None, SplitMode::Layer).expect("load");
            for case in self.2 {
                assert_eq!(self.0.tokenizer.encode(&case.prompt).unwrap(), case.input_ids);
                common::check_greedy(llama.as_ref(), &self.0.tokenizer, case);
            }
        }
    }
    group.run(Greedy(&model, &group, &reference.cases));
}

#[test]
fn a_directory_holding_one_gguf_file_opens_it_and_several_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let source = common::shared_model("fortune-llama-3m-gguf");
    std::fs::copy(source.join("fortune-llama-3m-Q8_0.gguf"), dir.path().join("model.gguf")).unwrap();
    let model = open(dir.path());
    assert_eq!(
        model.config.layers,
        open(&source.join("fortune-llama-3m-Q8_0.gguf")).config.layers
    );
    let err = ModelDir::open(&source).err().expect("three GGUF files").to_string();
    assert!(
        err.contains("holds 3 GGUF files") && err.contains("fortune-llama-3m-Q4_0.gguf"),
        "{err}"
    );
}
