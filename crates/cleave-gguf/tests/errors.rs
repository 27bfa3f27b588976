//! Damaged and unsupported files, written by hand: each is refused with a
//! message that names the file and what is wrong with it.

mod common;

use cleave_gguf::{Array, GgufError, GgufFile, Value};
use common::{s, string, tiny_llama, tiny_model, Gguf, Meta, F32, Q4_0, Q8_0};

/// Writes `bytes` as a file and opens it.
fn open(bytes: &[u8]) -> (tempfile::TempDir, Result<GgufFile, GgufError>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    std::fs::write(&path, bytes).unwrap();
    let file = GgufFile::open(&path);
    (dir, file)
}

/// The message of the error opening `bytes` gives; it names the file.
fn open_error(bytes: &[u8]) -> String {
    match open(bytes) {
        (_, Ok(_)) => panic!("the file opened"),
        (_, Err(e)) => {
            let message = e.to_string();
            assert!(message.contains("model.gguf"), "{message}");
            message
        }
    }
}

fn assert_contains(message: &str, expected: &str) {
    assert!(message.contains(expected), "{message:?} does not say {expected:?}");
}

/// A header with no tensors and the given metadata pairs, written raw.
fn header(pairs: &[u8], n_pairs: u64) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(0u64.to_le_bytes());
    out.extend(n_pairs.to_le_bytes());
    out.extend(pairs);
    out
}

#[test]
fn the_hand_written_model_opens() {
    let (_dir, file) = open(&tiny_llama().bytes());
    let file = file.unwrap();
    assert_eq!(file.tensors().len(), 2 + 2 * 9);
    assert_eq!(file.hf_config().unwrap()["num_hidden_layers"], 2);
    let tokenizer = file.tokenizer().unwrap();
    assert_eq!(tokenizer.encode("ab ab").unwrap(), [0, 30, 31]);
}

#[test]
fn a_file_cut_anywhere_is_refused_as_past_its_end() {
    let bytes = tiny_llama().bytes();
    for cut in (1..bytes.len()).step_by(7) {
        let message = open_error(&bytes[..cut]);
        assert_contains(&message, "past the end of the file");
    }
    assert_contains(
        &open_error(&bytes[..2]),
        "the header runs past the end of the file (needs 4 bytes, 2 left)",
    );
    let last = "blk.1.ffn_down.weight";
    assert_contains(
        &open_error(&bytes[..bytes.len() - 1]),
        &format!("tensor '{last}': its 512 bytes"),
    );
    // Cut inside a value: the message says which.
    let key = "tokenizer.ggml.tokens";
    let tokens = (0..100).map(|i| format!("token{i}")).collect();
    let bytes = Gguf::default().meta(key, Meta::Strs(tokens)).bytes();
    for cut in [bytes.len() / 2, bytes.len() - 3] {
        let message = open_error(&bytes[..cut]);
        assert_contains(&message, &format!("the value of metadata key '{key}'"));
        assert_contains(&message, "past the end of the file");
    }
}

#[test]
fn an_empty_file_is_refused() {
    assert!(open(&[]).1.is_err());
}

#[test]
fn another_format_is_refused_showing_its_first_bytes() {
    let mut bytes = tiny_llama().bytes();
    bytes[..4].copy_from_slice(b"GGML");
    let message = open_error(&bytes);
    assert_contains(&message, "not a GGUF file: it starts with [47, 47, 4d, 4c]");
}

#[test]
fn versions_1_and_2_are_refused_by_number() {
    for version in [1u32, 2, 4] {
        let mut bytes = tiny_llama().bytes();
        bytes[4..8].copy_from_slice(&version.to_le_bytes());
        assert_contains(
            &open_error(&bytes),
            &format!("GGUF version {version} is not supported (cleave reads version 3)"),
        );
    }
}

#[test]
fn a_tensor_past_the_end_of_the_file_is_refused_by_name() {
    // 64 F32 values promised after the first tensor, 16 bytes stored.
    let gguf = Gguf::default()
        .tensor("output_norm.weight", &[256], F32, vec![0; 1024])
        .tensor("blk.0.attn_q.weight", &[64], F32, vec![0; 16]);
    let message = open_error(&gguf.bytes());
    assert_contains(&message, "tensor 'blk.0.attn_q.weight': its 256 bytes at offset 1024");
    assert_contains(&message, "lie past the end of the file");
    // A size past the file's own is refused before its offset is looked at.
    let gguf = Gguf::default().tensor("output.weight", &[1 << 20], F32, vec![0; 16]);
    assert_contains(
        &open_error(&gguf.bytes()),
        "tensor 'output.weight': its size (F32, ne = [1048576]) is larger than the file",
    );
}

#[test]
fn unknown_and_unsupported_tensor_types_are_refused_by_name() {
    let with_type = |id: u32| {
        Gguf::default()
            .tensor("output.weight", &[256], id, vec![0; 1024])
            .bytes()
    };
    assert_contains(
        &open_error(&with_type(16)),
        "tensor 'output.weight' has ggml type IQ2_XXS (id 16), which cleave cannot read",
    );
    assert_contains(
        &open_error(&with_type(99)),
        "tensor 'output.weight' has unknown ggml type id 99",
    );
}

#[test]
fn a_string_longer_than_the_file_is_refused_before_it_is_allocated() {
    let mut pair = Vec::new();
    string(&mut pair, "general.name");
    pair.extend(8u32.to_le_bytes());
    pair.extend((1u64 << 60).to_le_bytes());
    let message = open_error(&header(&pair, 1));
    assert_contains(
        &message,
        "the value of metadata key 'general.name' runs past the end of the file (needs 1152921504606846976 bytes, 0 left)",
    );
}

#[test]
fn counts_larger_than_the_file_are_refused_before_anything_is_allocated() {
    let mut pair = Vec::new();
    string(&mut pair, "tokenizer.ggml.tokens");
    pair.extend(9u32.to_le_bytes());
    pair.extend(8u32.to_le_bytes());
    pair.extend((1u64 << 40).to_le_bytes());
    assert_contains(
        &open_error(&header(&pair, 1)),
        "1099511627776 array elements of at least 8 bytes each run past the end of the file (0 bytes left)",
    );
    assert_contains(
        &open_error(&header(&[], u64::MAX)),
        "18446744073709551615 metadata pairs of at least 13 bytes each run past the end of the file",
    );
}

#[test]
fn arrays_nest_but_not_without_bound() {
    let gguf = Gguf::default().meta("test.nested", Meta::Nested(vec![vec![1, 2], vec![3]]));
    let (_dir, file) = open(&gguf.bytes());
    let expected = Value::Array(Array::Array(vec![Array::U8(vec![1, 2]), Array::U8(vec![3])]));
    assert_eq!(file.unwrap().metadata().get("test.nested"), Some(&expected));

    let mut pair = Vec::new();
    string(&mut pair, "test.deep");
    pair.extend(9u32.to_le_bytes());
    for _ in 0..20 {
        pair.extend(9u32.to_le_bytes());
        pair.extend(1u64.to_le_bytes());
    }
    assert_contains(&open_error(&header(&pair, 1)), "arrays nested more than 8 deep");
}

#[test]
fn a_key_twice_and_an_unknown_value_type_are_refused() {
    let twice = Gguf::default()
        .meta("general.name", s("a"))
        .meta("general.name", s("b"));
    assert_contains(
        &open_error(&twice.bytes()),
        "the value of metadata key 'general.name': the key appears twice",
    );
    let mut pair = Vec::new();
    string(&mut pair, "general.name");
    pair.extend(13u32.to_le_bytes());
    pair.extend([0; 8]);
    assert_contains(&open_error(&header(&pair, 1)), "unknown metadata value type 13");
}

#[test]
fn alignment_must_be_a_power_of_two() {
    let gguf = Gguf::default().meta("general.alignment", Meta::U32(24));
    assert_contains(
        &open_error(&gguf.bytes()),
        "metadata key 'general.alignment': 24 is not a power of two",
    );
}

#[test]
fn tensor_shapes_must_be_whole_blocks_without_empty_dimensions() {
    let partial = Gguf::default().tensor("output.weight", &[16, 2], Q4_0, vec![0; 36]);
    assert_contains(
        &open_error(&partial.bytes()),
        "tensor 'output.weight': its rows of 16 values are not whole Q4_0 blocks of 32",
    );
    let empty = Gguf::default().tensor("output.weight", &[4, 0], F32, vec![]);
    assert_contains(&open_error(&empty.bytes()), "tensor 'output.weight': a dimension is 0");
    let huge = Gguf::default().tensor("output.weight", &[1 << 32, 1 << 32], F32, vec![]);
    assert_contains(&open_error(&huge.bytes()), "is larger than the file");
}

#[test]
fn a_vector_in_blocks_is_refused_by_name_type_and_shape() {
    // A norm of 64 values as two Q8_0 or Q4_0 blocks: ggml can store it,
    // nothing that reads a norm takes it; a matrix of the same blocks opens.
    for (ty, name, block_bytes) in [(Q8_0, "Q8_0", 34), (Q4_0, "Q4_0", 18)] {
        let vector = Gguf::default().tensor("blk.0.attn_norm.weight", &[64], ty, vec![0; 2 * block_bytes]);
        assert_contains(
            &open_error(&vector.bytes()),
            &format!("tensor 'blk.0.attn_norm.weight': a vector (ne = [64]) stored as {name} blocks"),
        );
        let matrix = Gguf::default().tensor("blk.0.attn_v.weight", &[32, 2], ty, vec![0; 2 * block_bytes]);
        assert!(open(&matrix.bytes()).1.is_ok(), "{name}");
    }
}

#[test]
fn tensors_whose_bytes_overlap_are_refused_by_name() {
    let gguf = Gguf::default().tensor("output.weight", &[8], F32, vec![0; 32]).tensor(
        "token_embd.weight",
        &[8],
        F32,
        vec![0; 32],
    );
    let mut bytes = gguf.bytes();
    // The second tensor's info: its name, n_dims (u32), one dimension
    // (u64), its type (u32), then its offset (u64), set to the first's.
    let name = b"token_embd.weight";
    let after_name = bytes.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    let offset_at = after_name + 4 + 8 + 4;
    bytes[offset_at..offset_at + 8].copy_from_slice(&0u64.to_le_bytes());
    let message = open_error(&bytes);
    assert_contains(&message, "tensor 'token_embd.weight': its bytes");
    assert_contains(&message, "overlap those of tensor 'output.weight'");
}

#[test]
fn a_non_finite_or_non_positive_epsilon_or_rope_base_is_named() {
    for (key, value) in [
        ("llama.attention.layer_norm_rms_epsilon", f32::NAN),
        ("llama.attention.layer_norm_rms_epsilon", 0.0),
        ("llama.rope.freq_base", f32::INFINITY),
        ("llama.rope.freq_base", -1.0),
        ("llama.rope.scale_linear", f32::NAN),
    ] {
        let gguf = tiny_llama().without_meta(key).meta(key, Meta::F32(value));
        assert_contains(
            &config_error(gguf),
            &format!("metadata key '{key}': {value} is not a positive finite number"),
        );
    }
}

/// Opens `gguf` (which must open) and returns `hf_config`'s error message.
fn config_error(gguf: Gguf) -> String {
    let (_dir, file) = open(&gguf.bytes());
    file.unwrap().hf_config().unwrap_err().to_string()
}

#[test]
fn a_missing_hyperparameter_is_named() {
    let message = config_error(tiny_llama().without_meta("llama.block_count"));
    assert_contains(&message, "model.gguf: missing metadata key 'llama.block_count'");
}

#[test]
fn a_hyperparameter_of_the_wrong_type_is_named() {
    let gguf = tiny_llama()
        .without_meta("llama.block_count")
        .meta("llama.block_count", s("two"));
    assert_contains(
        &config_error(gguf),
        "metadata key 'llama.block_count' holds a string, expected a non-negative integer",
    );
}

#[test]
fn other_architectures_and_rope_scalings_are_refused_by_name() {
    let gemma = tiny_llama()
        .without_meta("general.architecture")
        .meta("general.architecture", s("gemma"));
    assert_contains(
        &config_error(gemma),
        "architecture 'gemma' is not supported (supported: llama, qwen2, qwen3, qwen3moe, phi3, gemma2, gemma3, gemma4, gpt-oss, qwen35, qwen35moe)",
    );
    let dynamic = tiny_llama().meta("llama.rope.scaling.type", s("dynamic"));
    assert_contains(
        &config_error(dynamic),
        "metadata key 'llama.rope.scaling.type': rope scaling 'dynamic' is not supported",
    );
    // YaRN is read, and needs its factor.
    let yarn = tiny_llama().meta("llama.rope.scaling.type", s("yarn"));
    assert_contains(&config_error(yarn), "llama.rope.scaling.factor");
    let matrix_of_factors = tiny_llama().tensor("rope_freqs.weight", &[2, 2], F32, vec![0; 16]);
    assert_contains(
        &config_error(matrix_of_factors),
        "tensor 'rope_freqs.weight': rope factors are a vector",
    );
}

#[test]
fn llama3_rope_factors_divide_each_frequency_at_every_position() {
    let factors = [1.0f32, 4.0].iter().flat_map(|f| f.to_le_bytes()).collect();
    let gguf = tiny_llama().tensor("rope_freqs.weight", &[2], F32, factors);
    let (_dir, file) = open(&gguf.bytes());
    let rope = &file.unwrap().hf_config().unwrap()["rope_parameters"];
    assert_eq!(rope["rope_type"], "longrope");
    assert_eq!(rope["short_factor"], serde_json::json!([1.0, 4.0]));
    assert_eq!(rope["long_factor"], rope["short_factor"]);
    assert_eq!(rope["attention_factor"], 1.0);
}

#[test]
fn linear_rope_scaling_gives_its_factor() {
    let gguf = tiny_llama()
        .meta("llama.rope.scaling.type", s("linear"))
        .meta("llama.rope.scaling.factor", Meta::F32(4.0));
    let (_dir, file) = open(&gguf.bytes());
    let rope = &file.unwrap().hf_config().unwrap()["rope_parameters"];
    assert_eq!(rope["rope_type"], "linear");
    assert_eq!(rope["factor"], 4.0);
}

#[test]
fn an_unknown_pre_tokenizer_is_refused_by_name() {
    let gguf = tiny_llama()
        .without_meta("tokenizer.ggml.pre")
        .meta("tokenizer.ggml.pre", s("deepseek-llm"));
    let (_dir, file) = open(&gguf.bytes());
    let message = file.unwrap().tokenizer().err().unwrap().to_string();
    assert_contains(
        &message,
        "metadata key 'tokenizer.ggml.pre': pre-tokenizer 'deepseek-llm' is not supported",
    );
}

#[test]
fn a_stack_of_experts_must_have_three_dimensions() {
    let f32s = |n: usize| vec![0u8; 4 * n];
    let flat = tiny_model("qwen3moe")
        .meta("qwen3moe.expert_count", Meta::U32(2))
        .tensor("blk.0.ffn_gate_exps.weight", &[8, 16], F32, f32s(8 * 16));
    assert_contains(
        &open_error(&flat.bytes()),
        "tensor 'blk.0.ffn_gate_exps.weight': a stack of experts needs three dimensions (two for biases), not [8, 16]",
    );
    let stacked = tiny_model("qwen3moe")
        .meta("qwen3moe.expert_count", Meta::U32(2))
        .tensor("blk.0.ffn_gate_exps.weight", &[8, 16, 2], F32, f32s(8 * 16 * 2));
    let (_dir, file) = open(&stacked.bytes());
    let file = file.unwrap();
    assert_eq!(
        file.hf_names_of("blk.0.ffn_gate_exps.weight"),
        [
            "model.layers.0.mlp.experts.0.gate_proj.weight",
            "model.layers.0.mlp.experts.1.gate_proj.weight"
        ]
    );
    let second = file.hf_tensor("model.layers.0.mlp.experts.1.gate_proj.weight").unwrap();
    assert_eq!(second.shape, [16, 8]);
    assert_eq!(second.data.len(), 8 * 16 * 4);
}

/// A Gemma file's layer pattern is a list of its blocks, so their count is
/// bounded by the file's tensors before the list is made.
#[test]
fn a_gemma_block_count_past_the_files_tensors_is_refused() {
    let huge = tiny_model("gemma2")
        .without_meta("gemma2.block_count")
        .meta("gemma2.block_count", Meta::U64(1 << 60));
    assert_contains(
        &config_error(huge),
        "metadata key 'gemma2.block_count': 1152921504606846976 blocks, but the file holds",
    );
}

#[test]
fn gemma_norms_are_read_without_the_one_llama_cpp_adds() {
    let (_dir, file) = open(&tiny_model("gemma3").bytes());
    let file = file.unwrap();
    // tiny_model's norms count up from 0: stored 1 + w, w counts from −1.
    let norm = file.dequantize_tensor("model.layers.0.input_layernorm.weight").unwrap();
    assert_eq!(norm[..3], [-1.0, 0.0, 1.0]);
    let config = file.hf_config().unwrap();
    assert_eq!(config["model_type"], "gemma3_text");
    // No sliding window in the file: every layer attends to every key.
    assert_eq!(
        config["layer_types"],
        serde_json::json!(["full_attention", "full_attention"])
    );
}

/// A tensor count one past the file's tensors reads the padding after the
/// last tensor info as one more: the error says what that most likely
/// means, not only that a tensor has no name.
#[test]
fn a_tensor_count_past_the_tensor_infos_is_named_as_such() {
    let mut bytes = tiny_llama().bytes();
    let count = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
    bytes[8..16].copy_from_slice(&(count + 1).to_le_bytes());
    let message = open_error(&bytes);
    assert_contains(&message, &format!("tensor info {count} of {}", count + 1));
    assert_contains(&message, "does the header count more tensors than the file has?");
}

/// A tiny Gemma 4 file: 2 layers, sliding then full; the sliding layer's
/// heads of 4 with 1 KV head, the full layer's of 8 with 2 (per-layer KV
/// head counts), its rope turning a quarter of each head.
fn tiny_gemma4() -> Gguf {
    let factors = [1.0f32, 1e30, 1e30, 1e30]
        .iter()
        .flat_map(|f| f.to_le_bytes())
        .collect();
    tiny_model("gemma4")
        .without_meta("gemma4.attention.head_count_kv")
        .meta("gemma4.attention.head_count_kv", Meta::I32s(vec![1, 2]))
        .meta("gemma4.attention.key_length", Meta::U32(8))
        .meta("gemma4.attention.key_length_swa", Meta::U32(4))
        .meta("gemma4.attention.sliding_window", Meta::U32(8))
        .meta(
            "gemma4.attention.sliding_window_pattern",
            Meta::Bools(vec![true, false]),
        )
        .meta("gemma4.rope.freq_base_swa", Meta::F32(100.0))
        .tensor("rope_freqs.weight", &[4], F32, factors)
}

#[test]
fn gemma4_gives_its_full_layers_heads_and_proportional_rope() {
    let (_dir, file) = open(&tiny_gemma4().bytes());
    let config = file.unwrap().hf_config().unwrap();
    assert_eq!(config["model_type"], "gemma4_text");
    assert_eq!(
        (config["head_dim"].as_u64(), config["num_key_value_heads"].as_u64()),
        (Some(4), Some(1))
    );
    assert_eq!(
        config["per_layer_config"],
        serde_json::json!({"1": {"head_dim": 8, "num_key_value_heads": 2}})
    );
    let rope = &config["rope_parameters"];
    assert_eq!(rope["full_attention"]["partial_rotary_factor"], 0.25);
    assert_eq!(rope["full_attention"]["rope_theta"], 10000.0);
    assert_eq!(rope["sliding_attention"]["rope_theta"], 100.0);
    // Keys and values both stored: not Gemma 4's keys-as-values.
    assert_eq!(config["attention_k_eq_v"], false);
}

#[test]
fn gemma4_rope_factors_other_than_a_proportional_ropes_are_refused() {
    let ramp = [1.0f32, 2.0, 1e30, 1e30].iter().flat_map(|f| f.to_le_bytes()).collect();
    let mut gguf = tiny_gemma4();
    gguf.tensors.retain(|t| t.0 != "rope_freqs.weight");
    assert_contains(
        &config_error(gguf.clone().tensor("rope_freqs.weight", &[4], F32, ramp)),
        "tensor 'rope_freqs.weight': the full layers' 4 factors for heads of 8 are not 1s then 1e30s",
    );
    let short = [1.0f32, 1e30].iter().flat_map(|f| f.to_le_bytes()).collect();
    assert_contains(
        &config_error(gguf.tensor("rope_freqs.weight", &[2], F32, short)),
        "the full layers' 2 factors for heads of 8",
    );
}

/// Widths per layer: Gemma 4's KV-shared layers' double-wide MLP is said
/// as transformers says it (and refused by the config check, by that
/// name); other widths per layer, and any per-layer KV heads outside
/// Gemma 4, are refused by key.
#[test]
fn per_layer_widths_and_heads_are_read_only_where_the_family_has_them() {
    let widths = |w: Vec<i32>| {
        tiny_gemma4()
            .without_meta("gemma4.feed_forward_length")
            .meta("gemma4.feed_forward_length", Meta::I32s(w))
            .meta("gemma4.attention.shared_kv_layers", Meta::U32(1))
    };
    let (_dir, file) = open(&widths(vec![16, 32]).bytes());
    let config = file.unwrap().hf_config().unwrap();
    assert_eq!(
        (
            config["use_double_wide_mlp"].as_bool(),
            config["intermediate_size"].as_u64()
        ),
        (Some(true), Some(16))
    );
    assert_contains(
        &config_error(widths(vec![16, 24])),
        "metadata key 'gemma4.feed_forward_length': layers of other widths",
    );
    assert_contains(
        &config_error(widths(vec![16, 16, 16])),
        "metadata key 'gemma4.feed_forward_length': 3 values for 2 layers",
    );
    let llama = tiny_llama()
        .without_meta("llama.attention.head_count_kv")
        .meta("llama.attention.head_count_kv", Meta::I32s(vec![1, 2]));
    assert_contains(
        &config_error(llama),
        "metadata key 'llama.attention.head_count_kv': layers that differ are not supported",
    );
}

/// A tiny Qwen3.5 file of 2 layers and one multi-token prediction head
/// (3 blocks): a Gated DeltaNet layer of 2 key and 4 value heads, then a
/// full one.
fn tiny_qwen35() -> Gguf {
    tiny_model("qwen35")
        .without_meta("qwen35.block_count")
        .meta("qwen35.block_count", Meta::U32(3))
        .meta("qwen35.nextn_predict_layers", Meta::U32(1))
        .meta(
            "qwen35.attention.recurrent_layers",
            Meta::Bools(vec![true, false, false]),
        )
        .meta("qwen35.ssm.conv_kernel", Meta::U32(4))
        .meta("qwen35.ssm.state_size", Meta::U32(8))
        .meta("qwen35.ssm.group_count", Meta::U32(2))
        .meta("qwen35.ssm.time_step_rank", Meta::U32(4))
        .meta("qwen35.ssm.inner_size", Meta::U32(24))
        .meta("qwen35.rope.dimension_count", Meta::U32(2))
}

#[test]
fn qwen35_gives_its_linear_layers_and_leaves_the_prediction_heads_out() {
    let (_dir, file) = open(&tiny_qwen35().bytes());
    let config = file.unwrap().hf_config().unwrap();
    assert_eq!(config["model_type"], "qwen3_5_text");
    assert_eq!(config["num_hidden_layers"], 2);
    assert_eq!(
        config["layer_types"],
        serde_json::json!(["linear_attention", "full_attention"])
    );
    let linear = [
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
    ];
    assert_eq!(linear.map(|f| config[f].as_u64().unwrap()), [2, 4, 8, 6]);
    assert_eq!(config["partial_rotary_factor"], 0.5);
}

#[test]
fn qwen35_value_heads_and_layer_flags_that_do_not_fit_are_named() {
    let uneven = tiny_qwen35()
        .without_meta("qwen35.ssm.inner_size")
        .meta("qwen35.ssm.inner_size", Meta::U32(10));
    assert_contains(
        &config_error(uneven),
        "metadata key 'qwen35.ssm.inner_size': 10 values do not split into 4 value heads",
    );
    let short = tiny_qwen35()
        .without_meta("qwen35.attention.recurrent_layers")
        .meta("qwen35.attention.recurrent_layers", Meta::Bools(vec![true]));
    assert_contains(
        &config_error(short),
        "metadata key 'qwen35.attention.recurrent_layers': is not a flag for each of the 2 layers",
    );
    let all_heads = tiny_qwen35()
        .without_meta("qwen35.nextn_predict_layers")
        .meta("qwen35.nextn_predict_layers", Meta::U32(3));
    assert_contains(&config_error(all_heads), "3 of the 3 blocks leaves no layers");
}
