//! Token ids of both prompts against the ids FluxPipeline fed its text encoders.

mod common;

use cleave_diffusion::prompt::{clip_pooled_index, PromptTokenizer};

fn max_sequence_length() -> usize {
    common::reference_json()["pipeline_call"]["max_sequence_length"]
        .as_u64()
        .expect("max_sequence_length") as usize
}

#[test]
fn clip_ids_match_reference() {
    let tokenizer = PromptTokenizer::clip(&common::fixture_dir().join("tokenizer")).expect("clip tokenizer");
    assert_eq!(tokenizer.max_length(), 77);
    for p in 0..2 {
        let expected = common::tensor(&format!("p{p}.clip_input_ids"));
        assert_eq!(expected.shape, [1, 77]);
        assert_eq!(
            tokenizer.encode(&common::prompt(p)).expect("encode"),
            expected.i64s(),
            "p{p}"
        );
    }
}

#[test]
fn t5_ids_match_reference_including_truncation() {
    let tokenizer =
        PromptTokenizer::t5(&common::fixture_dir().join("tokenizer_2"), max_sequence_length()).expect("t5 tokenizer");
    let reference = common::reference_json();
    for p in 0..2 {
        let expected = common::tensor(&format!("p{p}.t5_input_ids"));
        assert_eq!(expected.shape, [1, max_sequence_length()]);
        assert_eq!(
            tokenizer.encode(&common::prompt(p)).expect("encode"),
            expected.i64s(),
            "p{p}"
        );
    }
    // p1 is the prompt that overflows: its ids must end in EOS, not in a cut-off word.
    assert_eq!(reference["prompts"][1]["t5_truncated"], true);
}

#[test]
fn clip_pooled_index_is_first_eos() {
    let tokenizer = PromptTokenizer::clip(&common::fixture_dir().join("tokenizer")).expect("clip tokenizer");
    let reference = common::reference_json();
    let eos_token_id = reference["components"]["text_encoder"]["eos_token_id"]
        .as_i64()
        .expect("eos_token_id");
    for p in 0..2 {
        let unpadded = reference["prompts"][p]["clip_ids_unpadded"]
            .as_array()
            .expect("unpadded ids")
            .len();
        let ids = tokenizer.encode(&common::prompt(p)).expect("encode");
        let index = clip_pooled_index(&ids, eos_token_id);
        assert_eq!(index, unpadded - 1, "p{p}");
        // The fixture's pooled output is the last hidden state at exactly this position.
        let hidden = common::tensor(&format!("p{p}.clip_last_hidden_state"));
        let width = hidden.shape[2];
        let pooled = common::tensor(&format!("p{p}.clip_pooled")).f32s();
        assert_eq!(hidden.f32s()[index * width..(index + 1) * width], pooled[..], "p{p}");
    }
}
