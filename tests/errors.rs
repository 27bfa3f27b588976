//! Bad input gets a clear error naming the problem, never a panic.

use crate::common;

use std::fs;
use std::path::Path;

use common::{cleave, copy_of, edit_json, fixture, shared_model};

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
        &["/no/such/model", "no file or directory", "not a Hugging Face repo name"],
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

/// A tokenizer that would encode prompts other than as the model was
/// trained is refused: a BOS to add that it has no token for, or no
/// tokens at all.
#[test]
fn a_tokenizer_that_cannot_encode_as_configured_is_refused() {
    let dir = copy_of("llama-tiny");
    edit_json(&dir.path().join("tokenizer_config.json"), |c| {
        c["bos_token"] = "<|nope|>".into()
    });
    assert_mentions(
        &run_on(dir.path()),
        &["tokenizer_config.json", "bos_token", "'<|nope|>' is not a token"],
    );
    let dir = copy_of("llama-tiny");
    edit_json(&dir.path().join("tokenizer.json"), |t| {
        t["model"]["vocab"] = serde_json::json!({});
        t["model"]["merges"] = serde_json::json!([]);
        t["added_tokens"] = serde_json::json!([]);
    });
    assert_mentions(&run_on(dir.path()), &["tokenizer.json", "no tokens"]);
}

/// Valid JSON with a value of the wrong kind names the field, in
/// config.json and in the files beside it.
#[test]
fn a_config_value_of_the_wrong_kind_names_its_field() {
    let edits: [(&str, &str, serde_json::Value); 3] = [
        ("config.json", "num_hidden_layers", serde_json::json!("4")),
        ("config.json", "eos_token_id", serde_json::json!("x")),
        ("generation_config.json", "eos_token_id", serde_json::json!([1, "x"])),
    ];
    for (file, field, value) in edits {
        let dir = copy_of("llama-tiny");
        edit_json(&dir.path().join(file), |c| c[field] = value.clone());
        let stderr = run_on(dir.path());
        assert_mentions(&stderr, &[file, &format!("field '{field}'")]);
        assert!(!stderr.contains("invalid JSON"), "{stderr}");
    }
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

/// A FLUX pipeline given to a language model's command says which command
/// runs it.
#[test]
fn a_pipeline_given_for_a_language_model_names_its_command() {
    let flux = fixture("flux-tiny");
    assert_mentions(
        &fails(&["run", "-m", flux.to_str().unwrap(), "-p", "x"]),
        &["flux-tiny", "model_index.json", "`cleave image`"],
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

/// What a family cleave runs may still ask for and cleave does not do, or
/// gives in a shape it cannot take: each refused with the config field
/// named, before anything is loaded.
#[test]
fn unsupported_family_variants_name_the_field() {
    let edits: [(&str, &str, serde_json::Value, &[&str]); 6] = [
        (
            "phi3-tiny",
            "rope_parameters",
            serde_json::json!({"rope_type": "longrope", "rope_theta": 10000.0,
                "short_factor": [1.0], "long_factor": [1.0], "partial_rotary_factor": 0.5}),
            &[
                "rope_parameters",
                "'short_factor' must hold 4 positive numbers",
                "got 1 values",
            ],
        ),
        (
            "gemma3-tiny",
            "layer_types",
            serde_json::json!([
                "sliding_attention",
                "chunked_attention",
                "sliding_attention",
                "full_attention"
            ]),
            &["layer_types", "chunked_attention"],
        ),
        (
            "gemma3-tiny",
            "hidden_activation",
            serde_json::json!("relu"),
            &["hidden_activation", "relu"],
        ),
        (
            "qwen3-moe-tiny",
            "decoder_sparse_step",
            serde_json::json!(2),
            &["decoder_sparse_step"],
        ),
        (
            "mixtral-tiny",
            "num_experts_per_tok",
            serde_json::json!(5),
            &["num_experts_per_tok", "4 experts"],
        ),
        // More experts than the checkpoint holds: the missing one is named,
        // without a name made for each of the billion.
        (
            "mixtral-tiny",
            "num_local_experts",
            serde_json::json!(1_000_000_000),
            &["block_sparse_moe.experts.999999999"],
        ),
    ];
    for (fixture_name, field, value, parts) in edits {
        let dir = copy_of(fixture_name);
        edit_json(&dir.path().join("config.json"), |c| c[field] = value.clone());
        let started = std::time::Instant::now();
        assert_mentions(&run_on(dir.path()), parts);
        assert!(
            started.elapsed().as_secs() < 30,
            "{field}: took {:?}",
            started.elapsed()
        );
    }
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
fn a_tensor_whose_shape_does_not_fit_its_bytes_is_named() {
    let dir = copy_of("llama-tiny");
    let weights = dir.path().join("model.safetensors");
    let mut bytes = fs::read(&weights).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + header_len].to_vec()).unwrap();
    // One dimension of the final norm's shape, changed in place: the
    // header keeps its length, the shape no longer matches the offsets.
    let entry = header.find("\"model.norm.weight\"").unwrap();
    let shape = entry + header[entry..].find("\"shape\":[64]").unwrap() + "\"shape\":[".len();
    bytes[8 + shape..8 + shape + 2].copy_from_slice(b"63");
    fs::write(&weights, bytes).unwrap();
    assert_mentions(
        &run_on(dir.path()),
        &[
            "model.safetensors",
            "tensor 'model.norm.weight': shape [63] of F32 is 252 bytes",
            "give it 256 bytes",
        ],
    );
}

#[test]
fn a_config_that_names_no_class_says_so() {
    let dir = copy_of("llama-tiny");
    edit_json(&dir.path().join("config.json"), |c| {
        c.as_object_mut().unwrap().remove("architectures");
    });
    assert_mentions(
        &run_on(dir.path()),
        &[
            "config.json",
            "'architectures'",
            "names no model class",
            "LlamaForCausalLM",
        ],
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

/// A shard index that puts a tensor in a shard without it names the
/// shard, not only the tensor.
#[test]
fn a_tensor_the_index_puts_in_the_wrong_shard_names_the_shard() {
    let dir = copy_of("llama-tiny-sharded");
    edit_json(&dir.path().join("model.safetensors.index.json"), |index| {
        index["weight_map"]["lm_head.weight"] = "model-00010-of-00010.safetensors".into()
    });
    assert_mentions(
        &run_on(dir.path()),
        &[
            "model-00010-of-00010.safetensors",
            "puts tensor 'lm_head.weight' in this shard",
        ],
    );
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
    let stderr = fails(&["run", "--backend", "vulkan7", "-p", "x"]);
    assert_mentions(&stderr, &["no device named 'vulkan7'", "devices on this machine"]);
}

/// A CUDA device named to a build without CUDA, alone or beside a device
/// of another runtime, is refused by name before anything loads.
#[cfg(not(feature = "cuda"))]
#[test]
fn a_cuda_device_in_a_build_without_cuda() {
    let device = common::test_device_name();
    for spec in ["cuda0".to_string(), format!("{device}&cuda0")] {
        assert_mentions(
            &fails(&["run", "--backend", &spec, "-p", "x"]),
            &["cuda0", "built without CUDA", "--features cuda"],
        );
    }
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

/// Runs cleave with its stdout read by `reader` (a shell pipeline), and
/// returns the exit status and stderr.
fn piped(args: &[&str], reader: &str) -> (bool, String) {
    let cleave = env!("CARGO_BIN_EXE_cleave");
    let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
    // `exit ${PIPESTATUS[0]}`: cleave's own status, not the reader's.
    let script = format!("'{cleave}' {} {reader}; exit ${{PIPESTATUS[0]}}", quoted.join(" "));
    let mut command = std::process::Command::new("bash");
    command.args(["-c", &script]);
    if let Ok(device) = std::env::var("CLEAVE_TEST_DEVICE") {
        command.env("CLEAVE_BACKEND", device);
    }
    let out = command.output().expect("run bash");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "cleave {args:?} panicked: {stderr}");
    (out.status.success(), stderr)
}

#[test]
fn a_closed_stdout_ends_quietly_and_a_full_one_is_an_error_naming_stdout() {
    let tiny = fixture("llama-tiny");
    let tiny = tiny.to_str().unwrap();
    let commands: [&[&str]; 4] = [
        &["run", "-m", tiny, "-p", "hello", "-n", "40", "--ignore-eos"],
        &["run", "-m", tiny, "-p", "hello", "-n", "4", "--format", "json"],
        &["logits", "-m", tiny, "--ids", "1,2,3"],
        &["plan", "-m", tiny],
    ];
    for args in commands {
        let (ok, stderr) = piped(args, "| head -c 3 >/dev/null");
        assert!(ok, "cleave {args:?} | head: {stderr}");
        let (ok, stderr) = piped(args, ">/dev/full");
        assert!(!ok, "cleave {args:?} >/dev/full succeeded");
        assert_mentions(&stderr, &["writing to stdout"]);
    }
}

#[test]
fn a_non_finite_weight_is_named_at_load() {
    let dir = copy_of("llama-tiny");
    let weights = dir.path().join("model.safetensors");
    let mut bytes = fs::read(&weights).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    assert_eq!(header["model.norm.weight"]["dtype"], "F32");
    let start = 8 + header_len + header["model.norm.weight"]["data_offsets"][0].as_u64().unwrap() as usize;
    bytes[start + 12..start + 16].copy_from_slice(&f32::NAN.to_le_bytes());
    fs::write(&weights, bytes).unwrap();
    assert_mentions(&run_on(dir.path()), &["model.norm.weight", "non-finite", "element 3"]);
}

/// A norm stored in blocks (ggml can store one; nothing that reads a norm
/// takes it) is refused by name when the file is opened: by `plan` as by
/// the commands that load it.
#[test]
fn a_vector_in_blocks_is_refused_by_plan_and_run() {
    let source = shared_model("fortune-llama-3m-gguf").join("fortune-llama-3m-F16.gguf");
    let mut bytes = fs::read(source).unwrap();
    // The norm's tensor info: its name, n_dims (u32), its one dimension
    // (u64), then its type (u32): F32 (0) made Q8_0 (8), whose 192 values
    // take fewer bytes than the F32 ones the file holds.
    let name = b"blk.0.attn_norm.weight";
    let ty = bytes.windows(name.len()).position(|w| w == name).unwrap() + name.len() + 4 + 8;
    assert_eq!(bytes[ty..ty + 4], 0u32.to_le_bytes());
    bytes[ty..ty + 4].copy_from_slice(&8u32.to_le_bytes());
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("m.gguf");
    fs::write(&gguf, bytes).unwrap();
    let gguf = gguf.to_str().unwrap();
    for args in [&["plan", "-m", gguf][..], &["run", "-m", gguf, "-p", "hi", "-n", "1"]] {
        assert_mentions(
            &fails(args),
            &[
                "m.gguf",
                "blk.0.attn_norm.weight",
                "a vector (ne = [192]) stored as Q8_0 blocks",
            ],
        );
    }
}

#[test]
fn flags_out_of_range_are_refused_naming_the_flag() {
    let cases: [(&[&str], &str); 13] = [
        (&["run", "-p", "x", "--temp", "nan"], "--temp"),
        (&["serve", "--api-key", "", "--port", "0"], "--api-key"),
        (&["serve", "--alias", " ", "--port", "0"], "--alias"),
        (&["serve", "--max-body", "0", "--port", "0"], "--max-body"),
        (&["run", "-p", "x", "--draft-max", "0"], "--draft-max"),
        (&["run", "-p", "x", "--draft-max", "17"], "--draft-max"),
        (&["run", "-p", "x", "--temp", "-1"], "--temp"),
        (&["run", "-p", "x", "--top-p", "2"], "--top-p"),
        (&["run", "-p", "x", "--tensor-split", "inf,1"], "--tensor-split"),
        (&["image", "-m", "x", "-p", "x", "-H", "1000000"], "--height"),
        (&["image", "-m", "x", "-p", "x", "--steps", "5000"], "--steps"),
        (&["image", "-m", "x", "-p", "x", "--guidance", "nan"], "--guidance"),
        (
            &["image", "-m", "x", "-p", "x", "--max-sequence-length", "0"],
            "--max-sequence-length",
        ),
    ];
    for (args, flag) in cases {
        assert_mentions(&fails(args), &[flag]);
    }
    let lora = fixture("llama-tiny-lora");
    let spec = format!("{}:nan", lora.display());
    assert_mentions(
        &fails(&["run", "-p", "x", "--lora", &spec]),
        &["--lora", "'nan' is not a finite scale"],
    );
}

/// Values finite as f64 but not as the f32 they are used as, and negative
/// counts: each refused naming the flag and the value.
#[test]
fn flags_are_judged_as_the_type_they_are_used_as() {
    let cases: [(&[&str], &[&str]); 9] = [
        (
            &["run", "-p", "x", "--temp", "1e39"],
            &["--temp", "1e39 is past the largest 32-bit float"],
        ),
        (
            &["run", "-p", "x", "--top-p", "1e-50"],
            &["--top-p", "1e-50 must be in (0, 1]: it is 0 as the 32-bit float"],
        ),
        (
            &["image", "-m", "x", "-p", "x", "--guidance", "1e39"],
            &["--guidance", "1e39 is past the largest 32-bit float"],
        ),
        (
            &["run", "-p", "x", "-n", "-1"],
            &["--n-predict", "-1 is negative: give a whole number, 0 or more"],
        ),
        (&["run", "-p", "x", "--top-k", "-1"], &["--top-k", "-1 is negative"]),
        (&["run", "-p", "x", "-c", "-5"], &["--ctx-size", "-5 is negative"]),
        (
            &["image", "-m", "x", "-p", "x", "--steps", "-3"],
            &["--steps", "-3 is negative: give a whole number from 0 to"],
        ),
        (&["serve", "--port", "70000"], &["--port", "70000 is too large"]),
        (
            &["run", "-p", "x", "--tensor-split", "-1,1"],
            &["--tensor-split", "-1 must be a finite number of at least 0"],
        ),
    ];
    for (args, parts) in cases {
        assert_mentions(&fails(args), parts);
    }
}

/// A draft model of another tokenizer is refused before anything loads,
/// naming the flag and what differs.
#[test]
fn a_draft_model_of_another_vocabulary_is_refused() {
    let (tiny, other) = (fixture("llama-tiny"), shared_model("fortune-llama-3m"));
    let stderr = fails(&[
        "run",
        "-m",
        tiny.to_str().unwrap(),
        "-p",
        "x",
        "--draft-model",
        other.to_str().unwrap(),
    ]);
    assert_mentions(&stderr, &["--draft-model", "vocabulary", "tokenizer"]);
    let stderr = fails(&[
        "run",
        "-m",
        tiny.to_str().unwrap(),
        "-p",
        "x",
        "--draft-model",
        "/no/such/draft",
    ]);
    assert_mentions(&stderr, &["--draft-model", "/no/such/draft"]);
    let stderr = fails(&["run", "-p", "x", "--draft-model", "x", "--prompt-lookup"]);
    assert_mentions(&stderr, &["--draft-model", "--prompt-lookup"]);
}

type AdapterTensors<'a> = Vec<(String, safetensors::tensor::TensorView<'a>)>;

/// Stderr of `cleave run` and of `cleave plan` (which loads nothing) on
/// llama-tiny with its PEFT adapter's tensors edited by `edit`: both must
/// fail.
fn run_with_edited_adapter(edit: impl FnOnce(&mut AdapterTensors)) -> [String; 2] {
    let adapter = copy_of("llama-tiny-lora");
    let path = adapter.path().join("adapter_model.safetensors");
    let bytes = fs::read(&path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors = file.tensors();
    let a = "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight";
    assert!(tensors.iter().any(|(name, _)| name == a), "the fixture updates {a}");
    edit(&mut tensors);
    fs::write(&path, safetensors::serialize(tensors, None).unwrap()).unwrap();
    let tiny = fixture("llama-tiny");
    let lora = ["-m", tiny.to_str().unwrap(), "--lora", adapter.path().to_str().unwrap()];
    [
        fails(&[&["run", "-p", "x"][..], &lora].concat()),
        fails(&[&["plan"][..], &lora].concat()),
    ]
}

#[test]
fn a_lora_adapter_for_another_model_is_refused() {
    // The same updates, addressed to GPT-2's layer names.
    let refusals = run_with_edited_adapter(|tensors| {
        for (name, _) in tensors.iter_mut() {
            *name = name.replace("model.layers", "transformer.h");
        }
    });
    for stderr in refusals {
        assert_mentions(&stderr, &["LoRA adapter", "transformer.h.", "another model"]);
    }
}

/// An adapter that would be applied only in part, or not as made, is
/// refused, naming the tensor at fault: a factor without its other, an
/// update of a layer the model lacks, a tensor that is no LoRA factor
/// (PEFT's `modules_to_save`), a factor of another layer's shape.
#[test]
fn a_lora_adapter_applied_in_part_is_refused() {
    type Edit = fn(&mut AdapterTensors);
    let edits: [(Edit, &[&str]); 4] = [
        (
            |t| t.retain(|(name, _)| !name.ends_with("layers.0.mlp.down_proj.lora_A.weight")),
            &["layers.0.mlp.down_proj.lora_B.weight' has no lora_A"],
        ),
        (
            |t| {
                for (name, _) in t.iter_mut() {
                    *name = name.replace("layers.0.mlp.down_proj", "layers.99.mlp.down_proj");
                }
            },
            &[
                "'model.layers.99.mlp.down_proj' names no layer of this model",
                "1 of its 16",
            ],
        ),
        (
            |t| {
                let view = t[0].1.clone();
                t.push(("base_model.model.lm_head.weight".into(), view));
            },
            &["'base_model.model.lm_head.weight', which is not a LoRA factor"],
        ),
        (
            // down_proj's A takes the intermediate size, q_proj's the hidden.
            |t| {
                let q = t
                    .iter()
                    .position(|(n, _)| n.ends_with("layers.0.self_attn.q_proj.lora_A.weight"));
                let down = t
                    .iter()
                    .position(|(n, _)| n.ends_with("layers.0.mlp.down_proj.lora_A.weight"));
                let view = t[q.unwrap()].1.clone();
                t[down.unwrap()].1 = view;
            },
            &["layers.0.mlp.down_proj.lora_A.weight", "shape"],
        ),
    ];
    for (edit, parts) in edits {
        for stderr in run_with_edited_adapter(edit) {
            assert_mentions(&stderr, &["LoRA adapter"]);
            assert_mentions(&stderr, parts);
        }
    }
}

/// A checkpoint whose last block lacks one of the tensors its config
/// declares is refused by name before planning: `cleave plan`, which
/// loads nothing, says so too.
#[test]
fn a_block_tensor_missing_from_the_checkpoint_fails_before_planning() {
    let dir = copy_of("llama-tiny");
    let config: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(dir.path().join("config.json")).unwrap()).unwrap();
    let last = config["num_hidden_layers"].as_u64().unwrap() - 1;
    let missing = format!("model.layers.{last}.mlp.down_proj.weight");
    let path = dir.path().join("model.safetensors");
    let bytes = fs::read(&path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, safetensors::tensor::TensorView)> = file
        .tensors()
        .into_iter()
        .filter(|(name, _)| *name != missing)
        .collect();
    fs::write(&path, safetensors::serialize(kept, None).unwrap()).unwrap();
    assert_mentions(&fails(&["plan", "-m", dir.path().to_str().unwrap()]), &[&missing]);
    assert_mentions(&run_on(dir.path()), &[&missing]);
}

/// Rewrites `dir`'s model.safetensors with the tensor `name` replaced by
/// `bytes` of `dtype` and `shape`.
fn replace_tensor(dir: &Path, name: &str, (dtype, shape): (safetensors::Dtype, &[usize]), bytes: &[u8]) {
    let path = dir.join("model.safetensors");
    let stored = fs::read(&path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&stored).unwrap();
    let tensors: Vec<(String, safetensors::tensor::TensorView)> = file
        .tensors()
        .into_iter()
        .map(|(stored, view)| match stored == name {
            true => (
                stored,
                safetensors::tensor::TensorView::new(dtype, shape.to_vec(), bytes).unwrap(),
            ),
            false => (stored, view),
        })
        .collect();
    fs::write(&path, safetensors::serialize(tensors, None).unwrap()).unwrap();
}

/// gpt-oss's own tensors and switches, refused by name before anything
/// loads: a sink tensor of the wrong length, a config promising more
/// experts than a block's stack holds, MXFP4 blocks and scales that
/// disagree, a SwiGLU limit the kernels do not hold.
#[test]
fn gpt_oss_sinks_experts_and_swiglu_are_checked_before_loading() {
    let plan = |dir: &Path| fails(&["plan", "-m", dir.to_str().unwrap()]);
    let dir = copy_of("gpt-oss-tiny");
    let sinks = "model.layers.3.self_attn.sinks";
    replace_tensor(dir.path(), sinks, (safetensors::Dtype::F32, &[3]), &[0; 12]);
    assert_mentions(&plan(dir.path()), &[sinks, "[3]", "[4]"]);

    let dir = copy_of("gpt-oss-tiny");
    edit_json(&dir.path().join("config.json"), |c| {
        c["num_local_experts"] = serde_json::json!(5)
    });
    assert_mentions(
        &plan(dir.path()),
        &[
            "model.layers.3.mlp.experts.4.gate_proj.weight",
            "mlp.experts.gate_up_proj",
            "no entry 4",
        ],
    );

    // Scales of one group a row where the blocks hold two.
    let dir = copy_of("gpt-oss-mxfp4-tiny");
    let scales = "model.layers.3.mlp.experts.gate_up_proj_scales";
    replace_tensor(dir.path(), scales, (safetensors::Dtype::U8, &[4, 128, 1]), &[127; 512]);
    assert_mentions(
        &plan(dir.path()),
        &[
            "MXFP4",
            "mlp.experts.gate_up_proj_blocks",
            scales,
            "[4, 128, 1]",
            "disagree",
        ],
    );

    let dir = copy_of("gpt-oss-tiny");
    edit_json(&dir.path().join("config.json"), |c| {
        c["swiglu_limit"] = serde_json::json!(8.0)
    });
    assert_mentions(&plan(dir.path()), &["swiglu_limit", "8"]);
}

/// Gemma 4's own fields and tensors, refused by name before anything
/// loads: KV sharing that names no earlier layer of its type, full layers
/// whose heads differ, a per-layer input table of the wrong width.
#[test]
fn gemma4_kv_sharing_heads_and_per_layer_inputs_are_checked_before_loading() {
    let plan = |dir: &Path| fails(&["plan", "-m", dir.to_str().unwrap()]);
    // Layer 5, the first full layer, would read an earlier full one's cache.
    let dir = copy_of("gemma4-tiny");
    edit_json(&dir.path().join("config.json"), |c| {
        c["num_kv_shared_layers"] = serde_json::json!(3)
    });
    assert_mentions(
        &plan(dir.path()),
        &[
            "num_kv_shared_layers",
            "layer 5",
            "full_attention",
            "the first 5 layers have none",
        ],
    );

    let dir = copy_of("gemma4-tiny");
    edit_json(&dir.path().join("config.json"), |c| {
        c["per_layer_config"]["7"]["head_dim"] = serde_json::json!(256)
    });
    assert_mentions(&plan(dir.path()), &["per_layer_config", "layer 7", "differ"]);

    let dir = copy_of("gemma4-tiny");
    let table = "model.embed_tokens_per_layer.weight";
    replace_tensor(
        dir.path(),
        table,
        (safetensors::Dtype::F32, &[512, 64]),
        &[0; 512 * 64 * 4],
    );
    assert_mentions(&plan(dir.path()), &[table, "[512, 64]", "[512, 128]"]);
}

#[test]
fn config_sizes_past_the_checkpoint_fail_before_planning() {
    let edits: [(&str, serde_json::Value, &[&str]); 5] = [
        (
            "num_hidden_layers",
            serde_json::json!(1_000_000_000u64),
            &["model.layers.999999999", "missing"],
        ),
        (
            "vocab_size",
            serde_json::json!(1u64 << 62),
            &["model.embed_tokens.weight", "shape"],
        ),
        ("rms_norm_eps", serde_json::json!(-1.0), &["rms_norm_eps", "positive"]),
        (
            "max_position_embeddings",
            serde_json::json!(0),
            &["max_position_embeddings", "positive"],
        ),
        (
            "max_position_embeddings",
            serde_json::json!(1u64 << 40),
            &["max_position_embeddings", "past"],
        ),
    ];
    for (field, value, parts) in edits {
        let dir = copy_of("llama-tiny");
        edit_json(&dir.path().join("config.json"), |c| c[field] = value.clone());
        let started = std::time::Instant::now();
        assert_mentions(&run_on(dir.path()), parts);
        assert_mentions(&fails(&["plan", "-m", dir.path().to_str().unwrap()]), parts);
        // Refused from the files alone, not after allocating what they promise.
        assert!(
            started.elapsed().as_secs() < 30,
            "{field}: took {:?}",
            started.elapsed()
        );
    }
    let dir = copy_of("llama-tiny");
    edit_json(&dir.path().join("config.json"), |c| {
        c["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 0.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 128})
    });
    assert_mentions(&run_on(dir.path()), &["rope_scaling", "low_freq_factor"]);
}

#[test]
fn a_context_past_the_trained_positions_is_refused() {
    // llama-tiny was trained for 256 positions.
    let tiny = fixture("llama-tiny");
    let tiny = tiny.to_str().unwrap();
    assert_mentions(
        &fails(&["run", "-m", tiny, "-p", "x", "-c", "100000"]),
        &["-c/--ctx-size 100000", "256 positions"],
    );
    let ids: Vec<String> = (0..300).map(|i| (i % 100).to_string()).collect();
    assert_mentions(
        &fails(&["logits", "-m", tiny, "--ids", &ids.join(",")]),
        &["--ids holds 300 ids", "256 positions"],
    );
}

/// `-c` smaller than what a command must hold is refused, as `run`
/// refuses a longer prompt, rather than raised in silence.
#[test]
fn a_context_smaller_than_the_work_is_refused() {
    let tiny = fixture("llama-tiny");
    let tiny = tiny.to_str().unwrap();
    assert_mentions(
        &fails(&["logits", "-m", tiny, "--ids", "0,1,2,3,4", "-c", "2"]),
        &["--ids holds 5 ids", "-c/--ctx-size holds 2"],
    );
    assert_mentions(
        &fails(&["bench", "-m", tiny, "-p", "64", "-n", "8", "-c", "16"]),
        &["need 64 positions", "-c/--ctx-size holds 16"],
    );
}

#[test]
fn weight_files_are_regular_files_inside_the_model_directory() {
    // A shard index naming a path out of the directory.
    let dir = copy_of("llama-tiny-sharded");
    edit_json(&dir.path().join("model.safetensors.index.json"), |index| {
        let map = index["weight_map"].as_object_mut().unwrap();
        let first = map.keys().next().unwrap().clone();
        map[&first] = serde_json::json!("../../../../etc/passwd");
    });
    assert_mentions(&run_on(dir.path()), &["../../../../etc/passwd", "not a file name"]);

    // A directory or a FIFO where the weights should be.
    for make in ["dir", "fifo"] {
        let dir = copy_of("llama-tiny");
        let weights = dir.path().join("model.safetensors");
        fs::remove_file(&weights).unwrap();
        if make == "dir" {
            fs::create_dir(&weights).unwrap();
        } else {
            let made = std::process::Command::new("mkfifo").arg(&weights).status().unwrap();
            assert!(made.success());
        }
        assert_mentions(&run_on(dir.path()), &["model.safetensors", "not a regular file"]);
    }
}

/// A FIFO at `path`, in place of the file there.
#[cfg(unix)]
fn fifo_at(path: &Path) {
    let _ = fs::remove_file(path);
    let made = std::process::Command::new("mkfifo").arg(path).status().unwrap();
    assert!(made.success(), "mkfifo {}", path.display());
}

/// A writable copy of `from` and everything under it.
fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_tree(&path, &target);
        } else {
            fs::copy(&path, &target).unwrap();
        }
    }
}

/// Opening a FIFO blocks until a writer comes, so a loader that opened one
/// would hang: each file a loader reads is refused, by name, when it is not
/// a regular file.
#[cfg(unix)]
#[test]
fn every_loader_refuses_a_fifo_in_place_of_its_file() {
    let refused = |args: &[&str], file: &str| {
        let stderr = fails_within(args, &[], std::time::Duration::from_secs(60));
        assert_mentions(&stderr, &[file, "not a regular file"]);
    };

    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("m.gguf");
    fifo_at(&gguf);
    let gguf = gguf.to_str().unwrap();
    refused(&["run", "-m", gguf, "-p", "hi"], "m.gguf");
    refused(&["plan", "-m", gguf], "m.gguf");

    for name in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        let dir = copy_of("llama-tiny");
        fifo_at(&dir.path().join(name));
        refused(
            &["run", "-m", dir.path().to_str().unwrap(), "-p", "hi", "-n", "1"],
            name,
        );
    }

    let tiny = fixture("llama-tiny");
    for name in ["adapter_config.json", "adapter_model.safetensors"] {
        let adapter = copy_of("llama-tiny-lora");
        fifo_at(&adapter.path().join(name));
        let lora = adapter.path().to_str().unwrap();
        refused(&["run", "-m", tiny.to_str().unwrap(), "-p", "hi", "--lora", lora], name);
    }

    for (part, command) in [
        ("scheduler/scheduler_config.json", "plan"),
        ("tokenizer/tokenizer.json", "plan"),
        ("transformer/config.json", "plan"),
        ("tokenizer_2/tokenizer.json", "image"),
    ] {
        let pipeline = tempfile::tempdir().unwrap();
        copy_tree(&fixture("flux-tiny"), pipeline.path());
        fifo_at(&pipeline.path().join(part));
        let model = pipeline.path().to_str().unwrap();
        let output = pipeline.path().join("out.png");
        let args: Vec<&str> = match command {
            "plan" => vec!["plan", "-m", model],
            _ => vec![
                "image",
                "-m",
                model,
                "-p",
                "x",
                "-H",
                "16",
                "-W",
                "16",
                "--steps",
                "1",
                "-o",
                output.to_str().unwrap(),
            ],
        };
        refused(&args, part);
    }
}

/// An adapter is for a language model: a pipeline's plan that left it
/// out would plan another model than the one asked for.
#[test]
fn a_lora_adapter_for_a_pipeline_is_refused_by_plan() {
    let flux = fixture("flux-tiny");
    let adapter = fixture("llama-tiny-lora");
    let stderr = fails(&[
        "plan",
        "-m",
        flux.to_str().unwrap(),
        "--lora",
        adapter.to_str().unwrap(),
    ]);
    assert_mentions(&stderr, &["--lora", "language models", "FLUX pipeline"]);
}

#[test]
fn a_missing_lora_adapter_is_named_as_one() {
    let tiny = fixture("llama-tiny");
    let stderr = fails(&[
        "run",
        "-m",
        tiny.to_str().unwrap(),
        "-p",
        "x",
        "--lora",
        "/no/such/adapter",
    ]);
    assert_mentions(&stderr, &["/no/such/adapter", "not a LoRA adapter directory"]);
}

/// Runs cleave with `env` set, expects it to fail within two minutes (a
/// hang fails the test), and returns stderr.
fn fails_with_env(args: &[&str], env: &[(&str, &str)]) -> String {
    fails_within(args, env, std::time::Duration::from_secs(120))
}

/// Runs cleave with `env` set, expects it to fail within `limit` (a hang
/// fails the test), and returns stderr.
fn fails_within(args: &[&str], env: &[(&str, &str)], limit: std::time::Duration) -> String {
    use std::time::Instant;
    let mut child = cleave()
        .args(args)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run cleave");
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut text).unwrap();
        text
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("cleave {args:?} hung with {env:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let stderr = reader.join().unwrap();
    assert!(
        !status.success(),
        "cleave {args:?} should fail with {env:?}; stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "cleave {args:?} panicked: {stderr}");
    stderr
}

#[test]
fn a_device_that_fails_mid_run_ends_the_run_with_its_error() {
    let device = common::test_device_name();
    let pair = format!("{device}&{device}");
    let run = ["run", "-p", "The best way to", "-n", "8", "--ignore-eos"];
    let cases: [(&[&str], &str, &str); 5] = [
        (&[], "launch=7", "launch failed (injected fault)"),
        (&[], "alloc=3", "allocation failed (injected fault)"),
        (
            &["--backend", &pair],
            "device=1,launch=4",
            "launch failed (injected fault)",
        ),
        // The second device of row and tensor split runs every block's
        // slice, though the block's home is the first.
        (
            &["--backend", &pair, "--split-mode", "row", "--row-split-min", "16"],
            "device=1,launch=2",
            "launch failed (injected fault)",
        ),
        (
            &["--backend", &pair, "--split-mode", "tensor"],
            "device=1,launch=2",
            "launch failed (injected fault)",
        ),
    ];
    for (extra, fault, says) in cases {
        let args: Vec<&str> = run.iter().chain(extra).copied().collect();
        let stderr = fails_with_env(&args, &[("CLEAVE_INJECT_FAULT", fault)]);
        assert_mentions(&stderr, &[says]);
    }
    let out = tempfile::tempdir().unwrap();
    let png = out.path().join("x.png");
    let image = image_args(&png);
    let image: Vec<&str> = image.iter().map(String::as_str).chain(["--steps", "1"]).collect();
    let image = fails_with_env(&image, &[("CLEAVE_INJECT_FAULT", "launch=1")]);
    assert_mentions(&image, &["launch failed (injected fault)"]);
    let stderr = fails_with_env(&run, &[("CLEAVE_INJECT_FAULT", "launch")]);
    assert_mentions(&stderr, &["CLEAVE_INJECT_FAULT='launch'", "expected key=value pairs"]);
}

/// `cleave image` on the flux-tiny pipeline, 16x16, writing `png`.
fn image_args(png: &Path) -> Vec<String> {
    let flux = fixture("flux-tiny");
    [
        "image",
        "-m",
        flux.to_str().unwrap(),
        "-p",
        "a fox",
        "-H",
        "16",
        "-W",
        "16",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(["-o".to_string(), png.to_str().unwrap().to_string()])
    .collect()
}

#[test]
fn an_image_that_overflows_or_cannot_be_written_is_an_error() {
    let out = tempfile::tempdir().unwrap();
    let png = out.path().join("x.png");
    let args = image_args(&png);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // A guidance finite as an f32 but large enough that the latents
    // overflow: named, where it used to give a black PNG and success.
    let stderr = fails(&[&args[..], &["--steps", "1", "--guidance", "1e38"]].concat());
    assert_mentions(
        &stderr,
        &["the latent tensor after step 1 of 1 holds a non-finite value"],
    );
    assert!(!png.exists(), "a PNG was written");

    let full: Vec<&str> = args[..args.len() - 1]
        .iter()
        .copied()
        .chain(["/dev/full", "--steps", "1"])
        .collect();
    let stderr = fails(&full);
    assert_mentions(&stderr, &["cannot write /dev/full"]);
    assert_eq!(stderr.matches("No space left on device").count(), 1, "{stderr}");

    let long = "x".repeat(65 << 10);
    let stderr = fails(&["image", "-m", "x", "-p", &long]);
    assert_mentions(&stderr, &["--prompt", "the prompt is 66560 bytes", "64 KiB"]);
}

#[test]
fn an_unwritable_image_path_fails_before_any_work() {
    let cases = [
        ("/proc/cleave-test.png", "cannot write /proc/cleave-test.png"),
        ("/tmp", "cannot write /tmp: it is a directory"),
        ("/no/such/folder/x.png", "/no/such/folder is not a directory"),
    ];
    for (output, says) in cases {
        // The pipeline does not exist: the output is checked first.
        let stderr = fails(&["image", "-m", "/no/such/pipeline", "-p", "x", "-o", output]);
        assert_mentions(&stderr, &[says]);
        assert!(!stderr.contains("/no/such/pipeline"), "{stderr}");
    }
}

#[test]
fn main_gpu_is_checked_in_every_split_mode() {
    let device = common::test_device_name();
    let pair = format!("{device}&{device}");
    let run = |extra: &[&str]| fails(&[&["run", "-p", "x", "-n", "1", "--backend", &pair][..], extra].concat());
    assert_mentions(
        &run(&["--main-gpu", "5"]),
        &["--main-gpu 5 is not a member of a group of 2"],
    );
    assert_mentions(
        &run(&["--main-gpu", "5", "--split-mode", "row"]),
        &["--main-gpu 5 is not a member of a group of 2"],
    );
    assert_mentions(
        &run(&["--main-gpu", "1"]),
        &["--main-gpu is for --split-mode row, tensor and expert"],
    );
}

/// Expert split's flags with those they do not go with: each refusal
/// names both.
#[test]
fn expert_flags_that_do_not_go_together_are_named() {
    let moe = fixture("qwen3-moe-tiny");
    let plan = |extra: &[&str]| fails(&[&["plan", "-m", moe.to_str().unwrap()][..], extra].concat());
    assert_mentions(
        &plan(&["--expert-cache", "0"]),
        &["--expert-cache", "at least 1 expert"],
    );
    assert_mentions(
        &plan(&["--expert-cache", "2", "--split-mode", "row"]),
        &["--expert-cache is for expert split, not row split"],
    );
    assert_mentions(
        &plan(&["--expert-cache", "2", "--residency", "device"]),
        &["--expert-cache", "--residency device"],
    );
    assert_mentions(
        &plan(&["--split-mode", "expert", "--stream-layers", "1"]),
        &["--stream-layers", "expert split"],
    );
    // A dense model has no experts to split: layer split, and stderr says why.
    let out = cleave().args(["plan", "--split-mode", "expert"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_mentions(
        &stderr,
        &["cannot be split in expert mode: its blocks have no experts; using layer split"],
    );
}

/// A checkpoint that shrinks while blocks stream from it is an error
/// naming it, not a SIGBUS.
#[cfg(unix)]
#[test]
fn a_checkpoint_truncated_while_streaming_is_named() {
    use std::io::Read;
    let dir = common::copy_dir(&common::shared_model("fortune-llama-3m"));
    let weights = dir.path().join("model.safetensors");
    let mut child = cleave()
        .args(["run", "-m", dir.path().to_str().unwrap(), "-p", "The best way to"])
        .args(["-n", "400", "--ignore-eos", "--residency", "disk"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Generation has begun: blocks are streaming from the file.
    let mut first = [0u8; 1];
    child.stdout.as_mut().unwrap().read_exact(&mut first).unwrap();
    let len = fs::metadata(&weights).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&weights)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{:?}: {stderr}", out.status);
    assert_mentions(&stderr, &["model.safetensors", "shrank"]);
}

#[test]
fn bench_refuses_what_it_cannot_measure() {
    assert_mentions(
        &fails(&["bench", "-p", "0", "-n", "0"]),
        &["-p/--n-prompt", "-n/--n-gen", "nothing to measure"],
    );
    // The demo model knows 512 positions.
    assert_mentions(
        &fails(&["bench", "-p", "600"]),
        &["600 positions", "512", "lower -p/--n-prompt"],
    );
    assert_mentions(
        &fails(&["bench", "-n", "18446744073709551615"]),
        &["positions", "lower -p/--n-prompt or -n/--n-gen"],
    );
    assert_mentions(&fails(&["bench", "-r", "0"]), &["--repetitions", "0"]);
}

/// A grammar file that is missing, too big, not JSON or not GBNF is named,
/// and a grammar beside speculation is refused before anything loads.
#[test]
fn bad_grammar_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let run = |flag: &str, file: &Path| fails(&["run", "-p", "hi", "-n", "4", flag, file.to_str().unwrap()]);
    let missing = dir.path().join("missing.json");
    assert_mentions(&run("--json-schema", &missing), &["--json-schema", "missing.json"]);
    let not_json = dir.path().join("schema.json");
    fs::write(&not_json, "{type: object").unwrap();
    assert_mentions(&run("--json-schema", &not_json), &["schema.json", "not JSON"]);
    let huge = dir.path().join("huge.gbnf");
    fs::write(&huge, vec![b'#'; (1 << 20) + 1]).unwrap();
    assert_mentions(&run("--grammar", &huge), &["huge.gbnf", "at most"]);
    let not_gbnf = dir.path().join("bad.gbnf");
    fs::write(&not_gbnf, "root ::= answer\n").unwrap();
    assert_mentions(
        &run("--grammar", &not_gbnf),
        &["compiling the grammar", "rule 'answer'"],
    );
    let unsupported = dir.path().join("if.json");
    fs::write(&unsupported, r#"{"if": {"type": "string"}, "then": {"maxLength": 2}}"#).unwrap();
    assert_mentions(&run("--json-schema", &unsupported), &["Unimplemented keys", "\"if\""]);
    let err = fails(&[
        "run",
        "-p",
        "hi",
        "--prompt-lookup",
        "--grammar",
        not_gbnf.to_str().unwrap(),
    ]);
    assert_mentions(&err, &["--grammar", "--prompt-lookup"]);
}
