//! The GGUF files llama.cpp made of the test model (shared/fixtures/llama-gguf)
//! and of the demo model (shared/models/fortune-llama-3m-gguf): each opens,
//! gives the config transformers has for its model, and tokenizes each
//! reference prompt to transformers' ids.

mod common;

use cleave_gguf::{GgufFile, WeightType};
use common::{demo_gguf_dir, fixture_dir, gguf_files, read_json, shared_dir};
use serde_json::Value;

/// The config.json fields cleave's llama family reads, compared as values
/// (floats to f32 precision: GGUF stores them as f32).
fn assert_config_matches(path: &std::path::Path, ours: &Value, reference: &Value) {
    let fields = [
        "architectures",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
        "hidden_act",
    ];
    for field in fields {
        assert_eq!(ours[field], reference[field], "{}: {field}", path.display());
    }
    let close = |field: &str, a: &Value, b: &Value| {
        let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
        assert!(
            (a - b).abs() <= b.abs() * 1e-6,
            "{}: {field}: {a} != {b}",
            path.display()
        );
    };
    close("rms_norm_eps", &ours["rms_norm_eps"], &reference["rms_norm_eps"]);
    let (rope, reference_rope) = (&ours["rope_parameters"], &reference["rope_parameters"]);
    close("rope_theta", &rope["rope_theta"], &reference_rope["rope_theta"]);
    assert_eq!(rope["rope_type"], reference_rope["rope_type"], "{}", path.display());
}

#[test]
fn every_fixture_file_opens_with_every_tensor_under_a_transformers_name() {
    for dir in [fixture_dir(), demo_gguf_dir()] {
        for path in gguf_files(&dir) {
            let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(file.version(), 3);
            assert!(!file.tensors().is_empty(), "{}", path.display());
            for info in file.tensors() {
                let [hf] = &file.hf_names_of(&info.name)[..] else {
                    panic!("{}: not one transformers name for {}", path.display(), info.name)
                };
                let tensor = file.hf_tensor(hf).unwrap();
                let reversed: Vec<usize> = info.dims.iter().rev().copied().collect();
                assert_eq!(tensor.shape, reversed, "{hf}");
                assert_eq!(tensor.data.len(), info.bytes, "{hf}");
            }
        }
    }
}

#[test]
fn each_quantized_fixture_holds_the_types_its_name_says() {
    for path in gguf_files(&fixture_dir()) {
        let file = GgufFile::open(&path).unwrap();
        let types: std::collections::BTreeSet<&str> = file.tensors().iter().map(|t| t.ty.name()).collect();
        let stem = path.file_stem().unwrap().to_str().unwrap();
        let label = stem.rsplit('-').next().unwrap();
        // The _M mixes keep norms in F32 and give some matrices Q6_K.
        let expected_main = match label {
            "Q4_K_M" => WeightType::Q4_K,
            "Q5_K_M" => WeightType::Q5_K,
            other => [
                WeightType::F16,
                WeightType::BF16,
                WeightType::Q8_0,
                WeightType::Q4_0,
                WeightType::Q6_K,
            ]
            .into_iter()
            .find(|t| t.name() == other)
            .unwrap_or_else(|| panic!("unexpected fixture {stem}")),
        };
        assert!(types.contains(expected_main.name()), "{stem}: {types:?}");
    }
}

#[test]
fn the_config_of_each_fixture_file_is_transformers_config() {
    let reference = read_json(&fixture_dir().join("reference.json"));
    for path in gguf_files(&fixture_dir()) {
        let config = GgufFile::open(&path).unwrap().hf_config().unwrap();
        assert_config_matches(&path, &config, &reference["config"]);
    }
    let demo_config = read_json(&shared_dir().join("models/fortune-llama-3m/config.json"));
    for path in gguf_files(&demo_gguf_dir()) {
        let config = GgufFile::open(&path).unwrap().hf_config().unwrap();
        assert_config_matches(&path, &config, &demo_config);
    }
}

#[test]
fn the_tokenizer_in_each_fixture_gives_transformers_ids_for_each_prompt() {
    let reference = read_json(&fixture_dir().join("reference.json"));
    for (name, entry) in reference["files"].as_object().unwrap() {
        let path = fixture_dir().join(name);
        let tokenizer = GgufFile::open(&path).unwrap().tokenizer().unwrap();
        let cases = entry["cases"].as_array().unwrap();
        assert!(!cases.is_empty());
        for case in cases {
            let ids: Vec<u32> = serde_json::from_value(case["input_ids"].clone()).unwrap();
            let prompt = case["prompt"].as_str().unwrap();
            assert_eq!(tokenizer.encode(prompt).unwrap(), ids, "{name}: {prompt:?}");
        }
    }
}

#[test]
fn the_demo_model_tokenizer_gives_transformers_ids_for_each_prompt() {
    let reference = read_json(&shared_dir().join("models/fortune-llama-3m/reference.json"));
    let cases = reference["cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    for path in gguf_files(&demo_gguf_dir()) {
        let tokenizer = GgufFile::open(&path).unwrap().tokenizer().unwrap();
        for case in cases {
            let ids: Vec<u32> = serde_json::from_value(case["input_ids"].clone()).unwrap();
            let prompt = case["prompt"].as_str().unwrap();
            assert_eq!(tokenizer.encode(prompt).unwrap(), ids, "{}: {prompt:?}", path.display());
        }
    }
}

#[test]
fn the_fixture_tokenizer_carries_its_chat_template_and_stop_ids() {
    let reference = read_json(&fixture_dir().join("reference.json"));
    let path = fixture_dir().join("llama-gguf-F16.gguf");
    let tokenizer = GgufFile::open(&path).unwrap().tokenizer().unwrap();
    let eos = reference["config"]["eos_token_id"].as_u64().unwrap() as u32;
    let bos = reference["config"]["bos_token_id"].as_u64().unwrap() as u32;
    assert!(tokenizer.is_eos(eos));
    assert_eq!(tokenizer.bos_id(), Some(bos));
    let config = read_json(&fixture_dir().join("tokenizer_config.json"));
    assert_eq!(tokenizer.chat_template(), config["chat_template"].as_str());
}
