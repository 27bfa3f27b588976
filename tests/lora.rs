//! LoRA: llama-tiny with the PEFT adapter in ../shared/fixtures/llama-tiny-lora
//! reproduces what transformers + peft computed (logits within
//! `LOGIT_TOLERANCE`, the greedy ids exactly up to any near tie), merged at load or applied at run
//! time, in every split mode; and on the newer families (Qwen3, Gemma 3,
//! Phi-3 with its fused projections, the mixtures of experts) the same
//! as the update merged on the host.

use crate::common;

use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_hf::{LoraAdapter, LoraMode};
use cleave_models::{Architecture, ModelDir};
use cleave_nn::{Logits, Placed};
use cleave_plan::SplitMode;
use cleave_shaders::cubecl::prelude::*;
use common::{fixture, longest_case, reference, test_options, Case};

const CONTEXT: usize = 96;

/// Logits against transformers + peft's f32 (the adapter merged, applied
/// at run time or from the command line, on one device or split): the
/// worst difference measured on lavapipe is 3.0e-5 (applied at load in
/// row split); the bound is golden's, with room for other backends'
/// summation orders.
const LOGIT_TOLERANCE: f32 = 1e-4;

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
        let mut worst = 0.0f32;
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
            worst = worst.max(common::max_diff(
                &logits,
                &case.logits.concat(),
                &against,
                LOGIT_TOLERANCE,
            ));

            let mut ctx = llama.new_context(CONTEXT).unwrap();
            let last = llama.forward(&mut ctx, &case.input_ids, Logits::Last).unwrap();
            let steps = case.greedy_new_ids.len();
            let ids = common::greedy(llama.as_ref(), &mut ctx, last, steps, self.model.tokenizer.eos_ids());
            common::assert_greedy_ids(&ids, case, &what);
        }
        eprintln!("{what}: worst logit difference {worst:e}");
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
    let what = "--lora: logits against peft";
    let worst = common::max_diff(&with, &case.logits.concat(), what, LOGIT_TOLERANCE);
    eprintln!("{what}: worst difference {worst:e}");
    // Scale 0 is the base model: llama-tiny's own reference.
    let base = longest_case(reference(&model));
    assert_eq!(base.input_ids, case.input_ids);
    let zero = logits(&format!("{}:0", adapter.display()));
    let what = "--lora DIR:0: logits against the base model";
    let worst = common::max_diff(&zero, &base.logits.concat(), what, LOGIT_TOLERANCE);
    eprintln!("{what}: worst difference {worst:e}");
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

/// Every prompt position's logits of `model` with `adapters` applied in
/// `mode`, on one device.
struct PromptLogits<'a> {
    model: &'a ModelDir,
    adapters: &'a [LoraAdapter],
    mode: LoraMode,
    group: &'a DeviceGroup,
    prompt: &'a [u32],
}

impl RuntimeTask for PromptLogits<'_> {
    type Output = Vec<f32>;

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Vec<f32> {
        let inventory = self.model.inventory(CONTEXT);
        let members = cleave_nn::plan_members(self.group);
        let plan = cleave_plan::plan(&inventory, &members, None, &test_options(SplitMode::Layer)).unwrap();
        let devices = Placed::group(clients, self.group);
        let llama = self
            .model
            .load_with_lora(devices, plan, self.adapters, self.mode, &mut |_| {})
            .unwrap();
        let mut ctx = llama.new_context(CONTEXT).unwrap();
        llama.forward(&mut ctx, self.prompt, Logits::All).unwrap()
    }
}

/// The layers a random adapter updates in `model`: every block's query
/// and value projections and its MLP's down projection (every expert's, in
/// a mixture); in Phi-3, the fused `qkv_proj` and `gate_up_proj` PEFT
/// targets there, and `down_proj`; in Qwen3.5, `q_proj` (each head's query
/// and gate rows) and a Gated DeltaNet's `in_proj_qkv` and `out_proj`.
fn family_targets(model: &ModelDir) -> Vec<(String, usize, usize)> {
    let c = &model.config;
    let (h, q, kv, i) = (
        c.hidden_size,
        c.heads * c.head_dim,
        c.kv_heads * c.head_dim,
        c.intermediate_size,
    );
    let mut layers = Vec::new();
    for layer in 0..c.layers {
        let block = |name: &str| format!("model.layers.{layer}.{name}");
        if let Some(linear) = c.linear_attention.filter(|_| c.is_linear(layer)) {
            let values = linear.heads.value_heads * linear.heads.value_dim;
            layers.push((block("linear_attn.in_proj_qkv"), linear.heads.qkv_width(), h));
            layers.push((block("linear_attn.out_proj"), h, values));
        } else if c.attention_output_gate {
            layers.push((block("self_attn.q_proj"), 2 * q, h));
            layers.push((block("self_attn.v_proj"), kv, h));
        } else if c.architecture == Architecture::Phi3 {
            layers.push((block("self_attn.qkv_proj"), q + 2 * kv, h));
            layers.push((block("mlp.gate_up_proj"), 2 * i, h));
        } else {
            // As the model declares them: Gemma 4's full layers have heads
            // of their own size, its last layers no k and v.
            let t = c.attention_tensors(layer);
            let v = t.kv.as_ref().map(|[_, v]| v);
            for m in std::iter::once(&t.q).chain(v) {
                layers.push((block(&m.name), m.rows, m.cols));
            }
        }
        // gpt-oss's and Gemma 4's experts are stored as one stack a block,
        // no layer of which PEFT targets; Gemma 4's MLP beside them is.
        let stacked = matches!(c.architecture, Architecture::GptOss | Architecture::Gemma4) && c.experts.is_some();
        let mlps = match stacked {
            true => c
                .experts_beside_mlp
                .then(|| c.dense_mlp_tensors(layer))
                .into_iter()
                .collect(),
            false => c.mlps(layer),
        };
        for down in mlps.iter().map(|m| &m.down) {
            layers.push((block(&down.name), down.rows, down.cols));
        }
    }
    layers
}

/// A family with no PEFT reference (a `NAME-lora` fixture beside its
/// own, as llama-tiny-lora) has each adapter checked against its own
/// merge, done on the host as PEFT's `merge_and_unload` does
/// (`W + scale · B·A`), loaded as a plain model: merged at load and
/// applied at run time alike, the fused projections of Phi-3 included
/// (each part takes its rows of the fused update).
#[test]
fn lora_on_every_family_equals_the_merged_weights() {
    let group = common::test_device();
    let families = common::decoders::one_per_family();
    let unreferenced = families
        .iter()
        .map(|d| d.name)
        .filter(|name| !fixture(&format!("{name}-lora")).is_dir());
    for name in unreferenced {
        let model = ModelDir::open(&fixture(name)).unwrap();
        let random = common::RandomAdapter::new(&family_targets(&model), 5);
        let adapter = model.open_adapter(random.dir.path(), 1.0).unwrap();
        let merged_dir = random.merged_into(&fixture(name));
        let merged = ModelDir::open(merged_dir.path()).unwrap();
        let case = reference(&model.path).cases.remove(0);
        let logits = |model: &ModelDir, adapters: &[LoraAdapter], mode: LoraMode| {
            group.run(PromptLogits {
                model,
                adapters,
                mode,
                group: &group,
                prompt: &case.input_ids,
            })
        };
        let want = logits(&merged, &[], LoraMode::Auto);
        let base = case.logits.concat();
        let moved = want.iter().zip(&base).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(moved > 1e-2, "{name}: the adapter moves the logits by only {moved}");
        for mode in [LoraMode::Direct, LoraMode::Runtime] {
            let got = logits(&model, std::slice::from_ref(&adapter), mode);
            common::max_diff(
                &got,
                &want,
                &format!("{name}: {mode:?} LoRA against the merged weights"),
                1e-4,
            );
        }
    }
}

/// An adapter of Phi-3's fused projections opened without the model
/// (`LoraAdapter::open`) would leave q/k/v and gate/up unchanged: it is
/// refused by name instead.
#[test]
fn a_fused_update_not_split_for_the_model_is_refused() {
    let model = ModelDir::open(&fixture("phi3-tiny")).unwrap();
    let random = common::RandomAdapter::new(&family_targets(&model), 5);
    let adapter = LoraAdapter::open(random.dir.path(), 1.0).unwrap();
    let err = adapter.check_targets(&model.checkpoint).unwrap_err().to_string();
    assert!(
        err.contains("it updates the fused layer") && err.contains("ModelDir::open_adapter"),
        "{err}"
    );
}
