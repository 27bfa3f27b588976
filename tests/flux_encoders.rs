//! FLUX.1's two text encoders (CLIPTextModel, T5EncoderModel) against
//! diffusers/transformers in ../shared/fixtures/flux-tiny: from the ids the
//! pipeline fed them, the last hidden states and CLIP's pooled vector
//! within 1e-5, on one device and split by layers across two logical
//! devices of the same adapter.

use crate::common;

use std::path::Path;

use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_diffusion::prompt::PromptTokenizer;
use cleave_models::{clip_pooled_index, Clip, ClipConfig, T5Config, T5Encoder};
use cleave_shaders::cubecl::prelude::*;
use common::{fixture, load_flux_module, logical_group, max_diff, FluxReference};

const TOLERANCE: f32 = 1e-5;

/// Both prompts through CLIP: (last hidden state, pooled) per prompt, and
/// the blocks each device ran.
struct RunClip<'a> {
    dir: &'a Path,
    group: &'a DeviceGroup,
    ids: &'a [Vec<u32>],
}

impl RuntimeTask for RunClip<'_> {
    type Output = (Vec<(Vec<f32>, Vec<f32>)>, Vec<std::ops::Range<usize>>);

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Self::Output {
        let (clip, blocks) = load_flux_module(
            clients,
            self.group,
            self.dir,
            ClipConfig::from_file,
            |config, checkpoint| config.inventory(checkpoint),
            |devices, plan, config, checkpoint| Clip::load(devices, plan, config, checkpoint, &mut |_| {}),
            0,
        );
        let outputs = self
            .ids
            .iter()
            .map(|ids| {
                let out = clip.forward(ids).unwrap();
                (out.last_hidden_state, out.pooled)
            })
            .collect();
        (outputs, blocks)
    }
}

/// Both prompts through T5: the last hidden state per prompt, and the
/// blocks each device ran.
struct RunT5<'a> {
    dir: &'a Path,
    group: &'a DeviceGroup,
    ids: &'a [Vec<u32>],
}

impl RuntimeTask for RunT5<'_> {
    type Output = (Vec<Vec<f32>>, Vec<std::ops::Range<usize>>);

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Self::Output {
        let tokens = self.ids.iter().map(Vec::len).max().unwrap();
        let (t5, blocks) = load_flux_module(
            clients,
            self.group,
            self.dir,
            T5Config::from_file,
            |config, checkpoint| config.inventory(checkpoint, tokens),
            |devices, plan, config, checkpoint| T5Encoder::load(devices, plan, config, checkpoint, &mut |_| {}),
            0,
        );
        let outputs = self.ids.iter().map(|ids| t5.forward(ids).unwrap()).collect();
        (outputs, blocks)
    }
}

fn clip_on(devices: usize) -> Vec<(Vec<f32>, Vec<f32>)> {
    let reference = FluxReference::open();
    let ids: Vec<Vec<u32>> = (0..2).map(|p| reference.ids(&format!("p{p}.clip_input_ids"))).collect();
    let dir = fixture("flux-tiny").join("text_encoder");
    let group = logical_group(devices);
    let (outputs, blocks) = group.run(RunClip {
        dir: &dir,
        group: &group,
        ids: &ids,
    });
    if devices == 2 {
        assert_eq!(blocks, [0..1, 1..2], "one CLIP layer per device");
    }
    for (p, (last, pooled)) in outputs.iter().enumerate() {
        let worst_last = max_diff(
            last,
            &reference.f32s(&format!("p{p}.clip_last_hidden_state")),
            &format!("p{p} CLIP last_hidden_state on {devices} device(s)"),
            TOLERANCE,
        );
        let worst_pooled = max_diff(
            pooled,
            &reference.f32s(&format!("p{p}.clip_pooled")),
            &format!("p{p} CLIP pooled on {devices} device(s)"),
            TOLERANCE,
        );
        eprintln!(
            "p{p} CLIP on {devices} device(s): last_hidden_state max |diff| {worst_last:e}, pooled {worst_pooled:e}"
        );
    }
    outputs
}

fn t5_on(devices: usize) -> Vec<Vec<f32>> {
    let reference = FluxReference::open();
    let ids: Vec<Vec<u32>> = (0..2).map(|p| reference.ids(&format!("p{p}.t5_input_ids"))).collect();
    let dir = fixture("flux-tiny").join("text_encoder_2");
    let group = logical_group(devices);
    let (outputs, blocks) = group.run(RunT5 {
        dir: &dir,
        group: &group,
        ids: &ids,
    });
    if devices == 2 {
        assert_eq!(blocks, [0..1, 1..2], "one T5 block per device");
    }
    for (p, last) in outputs.iter().enumerate() {
        let worst = max_diff(
            last,
            &reference.f32s(&format!("p{p}.t5_last_hidden_state")),
            &format!("p{p} T5 last_hidden_state on {devices} device(s)"),
            TOLERANCE,
        );
        eprintln!("p{p} T5 on {devices} device(s): last_hidden_state max |diff| {worst:e}");
    }
    outputs
}

#[test]
fn clip_matches_transformers_on_one_device() {
    clip_on(1);
}

#[test]
fn clip_split_across_two_devices_matches_one_device() {
    let split = clip_on(2);
    let single = clip_on(1);
    for ((split_last, split_pooled), (last, pooled)) in split.iter().zip(&single) {
        max_diff(
            split_last,
            last,
            "CLIP last_hidden_state, split vs one device",
            TOLERANCE,
        );
        max_diff(split_pooled, pooled, "CLIP pooled, split vs one device", TOLERANCE);
    }
}

#[test]
fn t5_matches_transformers_on_one_device() {
    t5_on(1);
}

#[test]
fn t5_split_across_two_devices_matches_one_device() {
    let split = t5_on(2);
    let single = t5_on(1);
    for (split_last, last) in split.iter().zip(&single) {
        max_diff(split_last, last, "T5 last_hidden_state, split vs one device", TOLERANCE);
    }
}

#[test]
fn unsupported_encoder_configs_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let clip = dir.path().join("clip.json");
    std::fs::write(
        &clip,
        r#"{"hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 64,
            "vocab_size": 10, "max_position_embeddings": 77, "hidden_act": "relu"}"#,
    )
    .unwrap();
    let err = ClipConfig::from_file(&clip).unwrap_err().to_string();
    assert!(err.contains("hidden_act") && err.contains("relu"), "{err}");
    std::fs::write(&clip, r#"{"hidden_size": 32}"#).unwrap();
    let err = ClipConfig::from_file(&clip).unwrap_err().to_string();
    assert!(err.contains("num_attention_heads") && err.contains("missing"), "{err}");

    let t5 = dir.path().join("t5.json");
    std::fs::write(
        &t5,
        r#"{"d_model": 48, "d_kv": 8, "d_ff": 96, "num_heads": 6, "num_layers": 2, "vocab_size": 10,
            "feed_forward_proj": "relu"}"#,
    )
    .unwrap();
    let err = T5Config::from_file(&t5).unwrap_err().to_string();
    assert!(err.contains("feed_forward_proj") && err.contains("relu"), "{err}");
    std::fs::write(&t5, r#"{"d_model": 48, "feed_forward_proj": "gated-gelu"}"#).unwrap();
    let err = T5Config::from_file(&t5).unwrap_err().to_string();
    assert!(err.contains("d_kv") && err.contains("missing"), "{err}");
}

#[test]
fn clip_pooled_index_is_first_eos() {
    let dir = fixture("flux-tiny");
    let tokenizer = PromptTokenizer::clip(&dir.join("tokenizer")).expect("clip tokenizer");
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let eos_token_id = reference["components"]["text_encoder"]["eos_token_id"]
        .as_i64()
        .expect("eos_token_id");
    let tensors = FluxReference::open();
    for p in 0..2 {
        let unpadded = reference["prompts"][p]["clip_ids_unpadded"]
            .as_array()
            .expect("unpadded ids")
            .len();
        let prompt = reference["prompts"][p]["prompt"].as_str().expect("prompt");
        let ids = tokenizer.encode(prompt).expect("encode");
        let index = clip_pooled_index(&ids, eos_token_id);
        assert_eq!(index, unpadded - 1, "p{p}");
        // The fixture's pooled output is the last hidden state at exactly this position.
        let (shape, hidden) = tensors.tensor(&format!("p{p}.clip_last_hidden_state"));
        let width = shape[2];
        let pooled = tensors.f32s(&format!("p{p}.clip_pooled"));
        assert_eq!(hidden[index * width..(index + 1) * width], pooled[..], "p{p}");
    }
}
