//! LoRA: llama-tiny with the PEFT adapter in ../shared/fixtures/llama-tiny-lora
//! reproduces what transformers + peft computed (logits within 1e-3, the
//! greedy ids exactly up to any near tie), merged at load or applied at run
//! time, in every split mode.

mod common;

use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_hf::{LoraAdapter, LoraMode};
use cleave_models::ModelDir;
use cleave_nn::{Logits, Placed};
use cleave_plan::SplitMode;
use cleave_shaders::cubecl::prelude::*;
use common::{fixture, longest_case, reference, test_options, Case};

const CONTEXT: usize = 96;

struct Check<'a> {
    model: &'a ModelDir,
    adapter: &'a LoraAdapter,
    group: &'a DeviceGroup,
    split: SplitMode,
    lora: LoraMode,
    cases: &'a [Case],
}

impl RuntimeTask for Check<'_> {
    type Output = ();

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) {
        let what = format!("{:?} LoRA in {} split", self.lora, self.split);
        let inventory = self.model.inventory(CONTEXT);
        let members = cleave_nn::plan_members(self.group);
        let plan = cleave_plan::plan(&inventory, &members, None, &test_options(self.split)).unwrap();
        let devices = Placed::group(clients, self.group);
        let adapters = std::slice::from_ref(self.adapter);
        let llama = self
            .model
            .load_with_lora(devices, plan, adapters, self.lora, &mut |_| {})
            .unwrap();
        for case in self.cases {
            let mut ctx = llama.new_context(CONTEXT).unwrap();
            let logits = llama.forward(&mut ctx, &case.input_ids, Logits::All).unwrap();
            let against = format!("{what}, {:?}: logits against peft", case.prompt);
            common::max_diff(&logits, &case.logits.concat(), &against, 1e-3);

            let mut ctx = llama.new_context(CONTEXT).unwrap();
            let last = llama.forward(&mut ctx, &case.input_ids, Logits::Last).unwrap();
            let steps = case.greedy_new_ids.len();
            let ids = common::greedy(llama.as_ref(), &mut ctx, last, steps, self.model.tokenizer.eos_ids());
            common::assert_greedy_ids(&ids, case, &what);
        }
    }
}

fn check(split: SplitMode, devices: usize) {
    let model = ModelDir::open(&fixture("llama-tiny")).unwrap();
    let adapter = LoraAdapter::open(&fixture("llama-tiny-lora"), 1.0).unwrap();
    // The first prompt and the longest (62 tokens: the most prefill rows
    // and rope positions).
    let cases = [
        reference(&fixture("llama-tiny-lora")).cases.remove(0),
        longest_case(reference(&fixture("llama-tiny-lora"))),
    ];
    let group = common::logical_group(devices);
    for lora in [LoraMode::Direct, LoraMode::Runtime, LoraMode::Auto] {
        group.run(Check {
            model: &model,
            adapter: &adapter,
            group: &group,
            split,
            lora,
            cases: &cases,
        });
    }
}

#[test]
fn lora_on_one_device() {
    check(SplitMode::Layer, 1);
}

#[test]
fn lora_in_layer_split() {
    check(SplitMode::Layer, 2);
}

#[test]
fn lora_in_row_split() {
    check(SplitMode::Row, 2);
}

#[test]
fn lora_in_tensor_split() {
    check(SplitMode::Tensor, 2);
}

#[test]
fn lora_on_streamed_blocks() {
    let model = fixture("llama-tiny");
    let adapter = fixture("llama-tiny-lora");
    let case = longest_case(reference(&adapter));
    let n = case.greedy_new_ids.len().to_string();
    let out = common::cleave()
        .args([
            "run",
            "-m",
            model.to_str().unwrap(),
            "-p",
            &case.prompt,
            "--temp",
            "0",
            "--ignore-eos",
        ])
        .args([
            "-n",
            &n,
            "--format",
            "json",
            "--lora",
            adapter.to_str().unwrap(),
            "--residency",
            "disk",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<u32> = serde_json::from_value(v["new_ids"].clone()).unwrap();
    common::assert_greedy_ids(&ids, &case, "--residency disk");
}

#[test]
fn lora_from_the_command_line_with_a_scale() {
    let model = fixture("llama-tiny");
    let adapter = fixture("llama-tiny-lora");
    let case = longest_case(reference(&adapter));
    let ids: Vec<String> = case.input_ids.iter().map(u32::to_string).collect();
    let logits = |lora: &str| {
        let out = common::cleave()
            .args([
                "logits",
                "-m",
                model.to_str().unwrap(),
                "--ids",
                &ids.join(","),
                "--lora",
                lora,
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        serde_json::from_value::<Vec<Vec<f32>>>(v["logits"].clone())
            .unwrap()
            .concat()
    };
    let with = logits(adapter.to_str().unwrap());
    common::max_diff(&with, &case.logits.concat(), "--lora: logits against peft", 1e-3);
    // Scale 0 is the base model: llama-tiny's own reference.
    let base = longest_case(reference(&model));
    assert_eq!(base.input_ids, case.input_ids);
    let zero = logits(&format!("{}:0", adapter.display()));
    common::max_diff(
        &zero,
        &base.logits.concat(),
        "--lora DIR:0: logits against the base model",
        1e-3,
    );
}

#[test]
fn bad_adapters_are_named() {
    let model = fixture("llama-tiny");
    let dir = tempfile::TempDir::new().unwrap();
    let run = |lora: &str| {
        let out = common::cleave()
            .args([
                "run",
                "-m",
                model.to_str().unwrap(),
                "-p",
                "x",
                "-n",
                "1",
                "--lora",
                lora,
            ])
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = run("/no/such/adapter");
    assert!(stderr.contains("/no/such/adapter"), "{stderr}");
    std::fs::write(
        dir.path().join("adapter_config.json"),
        r#"{"peft_type": "LORA", "r": 4, "use_dora": true}"#,
    )
    .unwrap();
    let stderr = run(dir.path().to_str().unwrap());
    assert!(
        stderr.contains("use_dora") && stderr.contains("not supported"),
        "{stderr}"
    );
}
